"""The runtime's public face: everything outside `pw_kernel.runtime` imports from here.

The modules beside this file are the implementation and private by convention
(as JAX keeps `jax._src` behind `jax.*`): magics, widgets, tests and
benchmarks import only the names below. This is also the one place that looks
up the process's controller and hands it to what needs it (programs, compiled
functions, pipelines, remote islands), so nothing below imports upwards.

A run's life, in one place (`lifecycle.py`)::

    queued ──start──> running ──finish──> done
       │                 ├──step_failed──> failed
       ├─input_failed────┼──────────────> failed
       ├──cancel─────────┴──cancel──────> cancelled
       └──shutdown (queued or running)──> failed

`Lifecycle` holds every run's state, cursor, value slots and memory
reservation, and the runnable queue. Each event (submitted, start, dispatched,
completed, step_failed, cancel, shutdown) is a function in
`lifecycle.TRANSITIONS`, keyed by (state, event), that updates that state and
*returns effects* (resolve these futures, fail them, emit this run event,
wake the dispatcher). It takes no lock and calls neither JAX nor futures. The
`Controller` holds the lock, calls one transition at a time and applies the
effects in `Controller._apply`; the `Dispatcher` only executes steps and
reports what happened. `transition_edges()` lists the table for drawing.

Example::

    from pw_kernel.runtime import controller, compiled, program, FINAL
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from .compiled import CompiledFunction, has_collectives
from .config import DEFAULT_CPU_DEVICES, Config, backends_started, configure_cpu_devices, device_flags_ignored
from .controller import Controller, RunSummary, Status, controller, init, shutdown
from .devices import Island, VirtualSlice, remote_device_id
from .errors import (
    AdmissionError,
    ArgumentError,
    CancelledError,
    ControlFlowError,
    ControllerShutdownError,
    FusedModeError,
    GraphvizError,
    HostCallbackError,
    InputFailedError,
    InvalidTransition,
    IslandLostError,
    NodeError,
    PathwaysError,
    PipelineError,
    SliceError,
    SliceReleasedError,
    SpecError,
    TimeoutError,
    TracingError,
    short_error,
)
from .events import EventLog, NodeEvent, RunEvent, TraceRow, busy_by_device, busy_time, chrome_trace
from .futures import Future, get
from .graph import Edge, Node, ProgramGraph, Value, describe_sharding
from .lifecycle import (
    FINAL,
    TRANSITIONS,
    Emit,
    Finish,
    Lifecycle,
    OutputCell,
    Reject,
    Resolve,
    RunRecord,
    RunState,
    Wake,
    Work,
    transition_edges,
)
from .pipeline import Pipeline, PipelineState
from .pipeline import pipeline as _pipeline
from .pipeline_stats import PipelineStats, SliceStats
from .plan import Plan, Step, plan_for, shard_bytes
from .program import Program
from .remote import start_ray_islands
from .run import Run
from .scheduler import FIFO, FairShare, Policy, Priority
from .schedules import SCHEDULES, Replay, Schedule, replay, schedule_ops, theory_bubble


def compiled(
    fn: Callable | None = None,
    *,
    slice: VirtualSlice | str | None = None,  # noqa: A002 - the public keyword is `slice`
    in_specs: Any = None,
    out_specs: Any = None,
    name: str | None = None,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Sequence[str] | None = None,
    **jit_options: Any,
):
    """Compile ``fn`` for a slice: `jax.jit` with NamedShardings on the slice's mesh.

    ``in_specs`` / ``out_specs`` are PartitionSpecs (a pytree prefix of the
    arguments / results, as for `jax.jit`). None (the default) leaves it to JAX,
    as `jax.jit` without ``in_shardings`` / ``out_shardings`` does: an argument
    on the slice keeps its sharding (one from elsewhere gets the same spec on the
    slice, or is replicated), an output gets the sharding XLA propagates.
    Usable as a decorator: ``@pw.compiled(slice=s, in_specs=P("d"))``.
    ``static_argnums`` / ``static_argnames`` are `jax.jit`'s: those arguments are
    Python values baked into the trace (``in_specs`` then cover the others).

    Example::

        a = pw.compiled(lambda x: x * 2, slice=s)
        fut = a(jnp.array([1.0, 2.0]))     # a one-node program; returns a Future
    """
    if jit_options:
        donate = [k for k in jit_options if k.startswith("donate")]
        raise ArgumentError(
            f"`pw.compiled` got {', '.join(map(repr, jit_options))}, which it does not take"
            + (
                ": it does not donate buffers yet (a donated value may still be read by another node or "
                "a future of the dataflow). Leave it out: memory use is that of jax.jit without donation."
                if donate
                else ". It takes slice, in_specs, out_specs, name, static_argnums and static_argnames."
            )
        )
    if isinstance(slice, str):
        slice = controller().resources.get(slice)
    if slice is None:
        raise ArgumentError(
            "`pw.compiled` needs `slice=`: the virtual slice the function runs on, e.g. "
            "`s = pw.slice(2)` then `pw.compiled(fn, slice=s)`."
        )

    def wrap(f: Callable) -> CompiledFunction:
        cf = CompiledFunction(
            f, slice=slice, in_specs=in_specs, out_specs=out_specs, name=name,
            static_argnums=static_argnums, static_argnames=static_argnames,
        )
        return cf.bind(Program(cf, name=cf.name, slice=cf.slice, controller=controller))

    return wrap if fn is None else wrap(fn)


def program(
    fn: Callable | None = None,
    *,
    name: str | None = None,
    slice: VirtualSlice | None = None,  # noqa: A002
    mode: str | None = None,
    tenant: str = "default",
):
    """Decorate a function as a dataflow program: traced once per signature, submitted on call.

    Arrays and futures among the arguments are traced; other leaves are
    constants (part of the trace-cache key). ``mode`` is 'auto' (default),
    'fused' or 'chained'. Calls return futures at once.

    Example::

        @pw.program
        def f(v):
            x = a(v)
            return b(x), a(c(x))
    """

    def wrap(f: Callable) -> Program:
        return Program(f, name=name, slice=slice, mode=mode, tenant=tenant, controller=controller)

    return wrap if fn is None else wrap(fn)


@functools.wraps(_pipeline)
def pipeline(stages: Sequence[Callable], slices: Sequence[VirtualSlice], microbatches: int, *args, **kwargs) -> Pipeline:
    return _pipeline(stages, slices, microbatches, *args, controller=controller, **kwargs)


def add_ray_islands(
    address: str | None = None,
    *,
    count: int | None = None,
    devices_per_island: int | None = None,
    platform: str = "cpu",
    env: dict[str, str] | None = None,
) -> list[Island]:
    """Make Ray actors the controller's remote islands; returns the new islands.

    With ``count``, start that many actors (e.g. on one machine, for testing);
    otherwise one per alive Ray node. On CPU each actor simulates
    ``devices_per_island`` devices. Slices go there with ``pw.slice(n, island=i)``.

    Example::

        ray.init(address="auto")            # or let this call start a local Ray
        islands = pw.add_ray_islands(count=2, devices_per_island=4)
        s = pw.slice(4, island=islands[0].id)
    """
    remotes = start_ray_islands(
        address, count=count, devices_per_island=devices_per_island, platform=platform, env=env
    )
    return controller().add_remote_islands(remotes)


__all__ = [
    "AdmissionError",
    "ArgumentError",
    "CancelledError",
    "CompiledFunction",
    "Config",
    "ControlFlowError",
    "Controller",
    "ControllerShutdownError",
    "DEFAULT_CPU_DEVICES",
    "backends_started",
    "device_flags_ignored",
    "has_collectives",
    "Edge",
    "Emit",
    "EventLog",
    "FIFO",
    "FINAL",
    "FairShare",
    "Finish",
    "Future",
    "FusedModeError",
    "GraphvizError",
    "HostCallbackError",
    "InputFailedError",
    "InvalidTransition",
    "Island",
    "IslandLostError",
    "Lifecycle",
    "Node",
    "NodeError",
    "NodeEvent",
    "OutputCell",
    "PathwaysError",
    "Pipeline",
    "PipelineError",
    "PipelineState",
    "PipelineStats",
    "Plan",
    "Policy",
    "Priority",
    "Program",
    "ProgramGraph",
    "Reject",
    "Replay",
    "Resolve",
    "Run",
    "RunSummary",
    "RunEvent",
    "RunRecord",
    "RunState",
    "SCHEDULES",
    "Schedule",
    "SliceStats",
    "SliceError",
    "SliceReleasedError",
    "SpecError",
    "Status",
    "Step",
    "TRANSITIONS",
    "TimeoutError",
    "TraceRow",
    "TracingError",
    "Value",
    "VirtualSlice",
    "Wake",
    "Work",
    "add_ray_islands",
    "busy_by_device",
    "busy_time",
    "chrome_trace",
    "compiled",
    "configure_cpu_devices",
    "controller",
    "describe_sharding",
    "get",
    "init",
    "transition_edges",
    "pipeline",
    "plan_for",
    "program",
    "remote_device_id",
    "replay",
    "schedule_ops",
    "shard_bytes",
    "short_error",
    "shutdown",
    "theory_bubble",
]

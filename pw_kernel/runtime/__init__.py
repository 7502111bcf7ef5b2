"""The Pathways core: the runtime's public face, re-exports only; imports only jax and numpy.

Everything outside `pw_kernel.runtime` (the training layer, the notebook
front, the views, benchmarks) imports from here, as JAX's public modules sit
over ``jax._src``. What lives where:

* ``core/``: the run lifecycle (one transition table, records and effects), plans, scheduling policies.
* ``trace/``: compiled functions, program tracing with JAX's own tracer, the program graph (data).
* ``exec/``: the controller (its lock, and the one place effects are applied), the dispatcher,
  completion (the watcher thread and a waiting caller), Ctrl-C deferral, the event log.
* ``remote/``: Ray islands: the actor that owns a host's devices, and the controller's client of it.
* ``devices.py`` (islands, resource manager, slices), ``program.py``, ``run.py``, ``futures.py``
  (the handles users hold), ``donation.py`` (donated inputs and who still reads them),
  ``api.py`` (the entry calls), ``config.py``, ``errors.py``.

Example::

    from pw_kernel.runtime import controller, compiled, program
    print(controller().status())
"""

from __future__ import annotations

from .api import add_ray_islands, compiled, devices, islands, program, slice  # noqa: A004
from .config import DEFAULT_CPU_DEVICES, Config, backends_started, configure_cpu_devices
from .core.lifecycle import transition_edges
from .core.records import FINAL
from .core.scheduler import FIFO, FairShare, Policy, Priority
from .devices import Island, VirtualSlice
from .donation import hold
from .errors import (
    AdmissionError,
    ArgumentError,
    CancelledError,
    ControlFlowError,
    ControllerShutdownError,
    FusedModeError,
    HostCallbackError,
    InputFailedError,
    IslandLostError,
    NodeError,
    PathwaysError,
    SliceError,
    SliceReleasedError,
    SpecError,
    TimeoutError,  # noqa: A004
    TracingError,
    short_error,
)
from .exec.controller import Controller, Status, controller, init, shutdown
from .exec.events import EventLog, NodeEvent, RunEvent, TraceRow, busy_time, chrome_trace
from .futures import Future, get
from .program import Program
from .remote.client import RemoteArray
from .run import Run
from .trace.compiled import CompiledFunction
from .trace.graph import Edge, Node, ProgramGraph, Value, describe_sharding, nbytes_of
from .trace.tracing import context_mesh_hint

__all__ = [
    # errors
    "AdmissionError",
    "ArgumentError",
    "CancelledError",
    "ControlFlowError",
    "ControllerShutdownError",
    "FusedModeError",
    "HostCallbackError",
    "InputFailedError",
    "IslandLostError",
    "NodeError",
    "PathwaysError",
    "SliceError",
    "SliceReleasedError",
    "SpecError",
    "TimeoutError",
    "TracingError",
    # devices, slices, islands
    "Config",
    "Island",
    "RemoteArray",
    "VirtualSlice",
    "add_ray_islands",
    "configure_cpu_devices",
    "devices",
    "islands",
    "slice",
    # programs and their graphs
    "CompiledFunction",
    "Edge",
    "Node",
    "Program",
    "ProgramGraph",
    "Value",
    "compiled",
    "program",
    # the controller, runs, futures, events
    "Controller",
    "EventLog",
    "FIFO",
    "FairShare",
    "Future",
    "NodeEvent",
    "Policy",
    "Priority",
    "Run",
    "RunEvent",
    "Status",
    "controller",
    "get",
    "init",
    "shutdown",
    # for the layers above (training, notebook front, views): what they read and how they say it
    "DEFAULT_CPU_DEVICES",
    "FINAL",
    "TraceRow",
    "backends_started",
    "busy_time",
    "chrome_trace",
    "context_mesh_hint",
    "describe_sharding",
    "hold",
    "nbytes_of",
    "short_error",
    "transition_edges",
]

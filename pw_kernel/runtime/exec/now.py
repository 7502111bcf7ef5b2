"""A lone node run at once, with no run, on a controller that has nothing else to order it against.

What the Pathways service does with a client's call of one compiled function
while its pool is idle: the node's order among other work (fair share,
priorities, run-ahead, admission) is the scheduler's whole job, and with no
run live there is none to decide. So the node is called on the thread that
received it and waited for there (only a node known to take well under a
millisecond: `NOW_MAX_NS`), the caller answers with its outputs, and the node
is reported to the event log like any other (its `NodeEvent` has no run:
``run_id`` None), which is what the service's device-time shares and pool view
read. Anything else, or anything that raises, goes the usual way
(`Controller.call`), which reports errors: nothing was done here then.

A client's call through an idle service thus crosses one lifecycle, its own
controller's, instead of two (see docs/architecture.md, "Where a run lives").

Example::

    if not ctrl.idle or call_now(ctrl, graph, [x], "alice", "alice-7", "chained", reply) != RAN:
        ctrl.call(graph, [x], tenant="alice")
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from .events import NodeEvent

if TYPE_CHECKING:
    from ..trace.graph import ProgramGraph
    from .plan import Step

#: What `call_now` did: ran the node; or not now (a run is live, the node not yet measured or compiling, the
#: slower than `NOW_MAX_NS` so far, the call raised: ask again next time); or never, for this graph (not one
#: lone step on arrays, host callbacks, a remote island, donation, more memory than runs may reserve).
RAN, LATER, NEVER = "ran", "later", "never"

#: A node whose measured device time (its executable's running mean) is above this is not waited for on the
#: receiving thread: it goes the usual way, so that thread (the service's socket) is never held long.
NOW_MAX_NS = 1_000_000


def call_now(ctrl: Any, graph: ProgramGraph, inputs: list, tenant: str, name: str, mode: str,
             answer: Callable[[list, int, int], None]) -> str:
    """Call ``graph``'s one node on ``inputs`` (arrays) now, ``ctrl`` (a `Controller`) being idle (its caller asked
    `Controller.idle` before it traced ``graph``: `Program.call_now`): `RAN` once ``answer`` has had its outputs
    and (start, end) on the ``perf_counter_ns`` clock; else `LATER` or `NEVER` (nothing was done: the usual
    way decides, and reports what the call raised, if it did).
    """
    found = lone_step(ctrl, graph, mode)
    if found is None:
        return NEVER
    st, feed = found
    return run_now(ctrl, st, [inputs[k] for k in feed], tenant, name, answer)


def lone_step(ctrl: Any, graph: ProgramGraph, mode: str) -> tuple[Step, list[int]] | None:
    """The one step ``graph`` runs on ``ctrl`` and which of its inputs are the step's arguments, if it may ever be
    called at once (`run_now`); else None: not one step on arrays, host callbacks, a remote island, donation,
    more memory than runs may reserve. It depends on the graph only: a caller may keep it for the graph's calls.
    """
    if graph.donated_inputs:  # (what pw still reads decides what may be donated: the usual way)
        return None
    plan = ctrl.plan(graph, mode)
    feed = plan.lone_args
    if feed is None or len(plan.steps) != 1:
        return None
    st = plan.steps[0]
    if st.host_callbacks or st.remote:
        return None
    capacity = ctrl.lifecycle.capacity
    if capacity and any(need > capacity.get(d, need) for d, need in plan.peak_bytes.items()):
        return None  # (the usual way says why: `AdmissionError`)
    return st, feed


def run_now(ctrl: Any, st: Step, args: list, tenant: str, name: str,
            answer: Callable[[list, int, int], None]) -> str:
    """Call ``st`` (a `lone_step`) on ``args`` now, ``ctrl`` being idle: `RAN` once ``answer`` has had its outputs
    and (start, end); else `LATER` (not measured quick yet, compiling, or the call raised: nothing was done)."""
    exe = st.exe
    if exe.compile_first or exe.compiling or exe.measured < 2 or exe.cost > NOW_MAX_NS:
        return LATER  # (a time measured on a loaded machine comes down as the usual way measures it again)
    clock = time.perf_counter_ns
    start = clock()
    try:
        outs = st.call(*args)
        for out in outs:  # (an asynchronous failure raises here: the usual way reports it)
            out.block_until_ready()  # (the method: `jax.block_until_ready` walks its argument as a tree, in Python)
    except Exception:
        return LATER
    end = clock()
    answer(outs, start, end)
    epoch = ctrl.events.epoch
    ev = NodeEvent(0, None, name, tenant, st.name, st.kind, st.devices, st.island, st.src_island, start - epoch,
                   st.nbytes, st.shapes)
    ev.end = end - epoch
    ctrl.events.emit_node(ev)
    return RAN


def ready_array(x: Any) -> jax.Array | None:
    """``x`` as an array of this process if it is one now (a finished future's value included), else None."""
    if isinstance(x, jax.Array):
        return x
    value = getattr(x, "value", None)
    return value if isinstance(value, jax.Array) and x.done() else None

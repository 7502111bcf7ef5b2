"""A client's burst of nodes, run on the service's devices: at once on an idle pool, else one run a node.

Where a run lives: the client's controller owns the run a user made (its
trace, plan, futures, cancel, run-ahead, timeline). A lone quick node that
finds the pool idle (no run of the service's controller live) is called at
once, with no run (`at_once`, `runtime/exec/now.py`): there is nothing to order
it against. Otherwise the service's controller is the pool's scheduler, and
each node a client sends is one short run of it, of the client's tenant
(`pw.FairShare` orders every client's nodes by weight in the per-island
queues; a cancel names the client's run id; admission and the event log are
the controller's own). A node's run is its executable's program
called on the client's buffers: traced once per executable and input layout
(`Program`'s own signature cache, bounded), never per burst, whose shape
depends on timing.

Replies: a burst is answered once all its nodes are done, by whichever comes
first of the client's waiter thread (which completes runs in order, on its own
thread: the quickest for a stream) and the last output's done-callback (a run
that overtook the one waited for). A lone node computed inside the call is
answered at once (``on_computed``), before the controller's bookkeeping.

Example::

    submit(client, [("k1", [3], [4])], (12, 0), reply)   # later: reply(RunReply(...))
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import jax
from jax import Array

from ..runtime import ArgumentError, Future, PathwaysError
from ..runtime.extend import ErrorEnvelope, from_wire, inline_picks, nbytes_of, ready_array, run_now, to_wire
from .callbacks import expected as expected_output
from .clients import Client
from .protocol import RunReply

log = logging.getLogger("pw_kernel.service")


def small_values(handles: list, outs: list, value: Callable = lambda x: x, picks: list | None = None) -> dict:
    """``{handle: value}`` of a few of ``outs`` (arrays or finished futures): the small ones a reply carries
    (`inline_picks`, or ``picks`` if the caller kept them), as `to_wire` packs them; ``value`` gives an output's
    array (None: a value on another island of the service, a Ray node's, which stays there until asked for)."""
    small = {}
    for k in picks if picks is not None else inline_picks([nbytes_of(x.shape, x.dtype) for x in outs]):
        v = value(outs[k])
        if v is not None:
            small[handles[k]] = to_wire(v)
    return small


def _here(f):
    """A finished output's value if it lives in this process or came small with its island's reply, else None
    (no bytes move from another island for it; nor for one the client's next node has donated already)."""
    r = f.remote_array()
    if r is None:
        try:
            return f.result()
        except ArgumentError:  # (donated since it was computed: the burst after it reused its buffer, and the
            return None        # client, which sent that burst, no longer reads it)
    value = r.inline()
    return None if value is None else from_wire(value)


def buffer(c: Client, handle: int):
    """The value behind one of ``c``'s handles (a jax.Array, or a Future of the service's controller)."""
    value = c.buffers.get(handle)
    if value is None:
        raise PathwaysError(f"no buffer {handle} for this client (freed, or another client's)")
    return value


def _failure(f) -> ErrorEnvelope | None:
    if f.cancelled():
        return ErrorEnvelope("CancelledError", "cancelled")
    error = f.exception()
    return None if error is None else ErrorEnvelope.of(error)


def submit(c: Client, ops: list, client_run: tuple | None, reply: Callable, name: str | None = None) -> list:
    """Run ``ops`` [(key, in handles, out handles)] as runs of ``c``'s tenant; `reply` (a `RunReply`) when all end.

    ``client_run``: the client's (run id, priority) the burst belongs to: the priority orders it among the
    client's own runs (fair share orders the clients), a cancel names the id. ``name``: the runs' (the
    request's stimulus id: a run's story and the request's meet there). Returns the runs made.
    """
    said = expected_output(c.shipped, ops)  # (the runs of its nodes that call the host)
    lone = len(ops) == 1 and not said
    rid, priority = client_run if client_run else (None, 0)
    start = time.perf_counter_ns()
    handles = [h for o in ops for h in o[2]]
    answered: list = []

    def computed(values: list) -> None:
        # A lone node computed inside the call: answered now, before the controller reports it done.
        _answer_lone(c, reply, handles, values, start, time.perf_counter_ns())
        answered.append(True)

    runs, per_op = [], []
    made: dict[int, object] = {}  # handle -> this burst's output future (a later node of the burst reads it)
    for key, in_ids, out_ids in ops:
        if key in c.load_errors:
            raise PathwaysError(f"the service could not load node executable {key}: {c.load_errors[key]}")
        exe = c.executables[key]
        args = [made[h] if h in made else buffer(c, h) for h in in_ids]
        run, tree = exe.program.call_run(
            *args, name=name, tenant=c.tenant, weight=c.weight, priority=int(priority), mode="chained",
            on_computed=computed if lone else None,
        )
        for k in run.graph.donated_inputs:  # (what it was given: its bytes are its outputs' now, counted there)
            c.buffers.held.donated(in_ids[k])
        outs = jax.tree.leaves(tree)
        runs.append(run)
        per_op.append(outs)
        made.update(zip(out_ids, outs))
    c.runs += len(runs)
    c.buffers.update(made)
    if answered:
        return runs
    for i, _, one in said:
        one.outs = per_op[i]
    outs = [f for fs in per_op for f in fs]
    for run in runs:
        c.live.add(run)
    if rid is not None:
        c.by_run.setdefault(rid, set()).update(runs)

    def finished() -> None:
        for run in runs:
            c.live.discard(run)
        if rid is not None:
            mine = c.by_run.get(rid)
            if mine is not None:
                mine.difference_update(runs)
                if not mine:
                    del c.by_run[rid]
        if c.gone:
            return
        end = time.perf_counter_ns()
        failure = None
        for i, fs in enumerate(per_op):
            bad = next((e for e in map(_failure, fs) if e is not None), None)
            if bad is not None:
                failure = (i, bad)
                break
        told = {}  # op index -> what its host callbacks wrote: [(stream, text), ...]
        for i, sink, one in said:
            sink.finished(one)
            if one.pieces:
                told[i] = one.pieces
            raised = one.failure()
            if raised is not None and (failure is None or i < failure[0]):
                failure = (i, ErrorEnvelope("ServiceError", raised))
        small = small_values(handles, outs, _here) if failure is None else {}
        c.nodes += len(ops) if failure is None else failure[0]
        reply(RunReply([(start, end)] * len(ops), failure, small, told))

    if all(f.done() for f in outs):  # computed inside the call: no thread hop to reply
        finished()
        return runs
    once = threading.Lock()

    def answer() -> None:
        if once.acquire(blocking=False):
            try:
                finished()
            except Exception as e:  # (a bug of ours: the client hears it, rather than waits for ever)
                log.exception("pw_kernel service: answering run %s of client %r failed", rid, c.tenant)
                reply(error=e)

    when_done(per_op, answer, c.count_lock)
    c.waiter().put((outs, answer))
    return runs


def at_once(c: Client, op: tuple, reply: Callable, name: str | None) -> bool:
    """A lone node (no host callbacks) while the pool is idle: called at once, no run of the service's controller
    (`exec/now.py`), answered as soon as it computed; False if it goes the usual way, `submit` (nothing was done).
    A node that never can (a step that donates its state, say) is not asked again."""
    key, in_ids, out_ids = op
    exe = c.executables.get(key)
    if exe is None or key in c.never_now or key in c.load_errors:
        return False
    args = [x if isinstance(x, Array) else ready_array(x) for x in map(c.buffers.get, in_ids)]
    if any(a is None for a in args):  # (a buffer still computing, freed, or on one of the service's Ray islands)
        return False

    kept = c.now_steps.get(key)
    picks = None if kept is None else kept[3]
    sizes: list = []

    def answer(outs: list, start: int, end: int) -> None:
        if picks is None:
            sizes.extend(nbytes_of(x.shape, x.dtype) for x in outs)
        _answer_lone(c, reply, out_ids, outs, start, end, inline_picks(sizes) if picks is None else picks)
        # (after the reply, which does not need them: the client's next request, which may, is read by this
        # thread, or by the worker, which waits for the lock this one holds)
        c.buffers.update(zip(out_ids, outs))

    if kept is not None:  # (no trace: see below)
        ctrl, st, feed, _ = kept
        return ctrl.idle and run_now(ctrl, st, [args[k] for k in feed], c.tenant, name or key, answer) == "ran"
    did = exe.program.call_now(*args, tenant=c.tenant, name=name or key, mode="chained", answer=answer)
    if did == "never":
        c.never_now.add(key)
    elif did == "ran" and key in c.out_bytes:
        # A loaded key is one exported function, whose arguments always have its shapes and layouts: every
        # call of it traces alike, so its step is kept, with which of its outputs a reply carries. (A
        # reshard's key names its target only: not kept.)
        c.now_steps[key] = (*exe.program.lone_step(*args, mode="chained"), inline_picks(sizes))
    return did == "ran"


def _answer_lone(c: Client, reply: Callable, handles: list, outs: list, start: int, end: int,
                 picks: list | None = None) -> None:
    """A lone node computed as it was called (at once, or inside its run's call): answered with its small values
    (``picks``: which, if the caller knows)."""
    c.nodes += 1
    reply(RunReply([(start, end)], None, small_values(handles, outs, picks=picks), {}))


def when_done(per_run: list[list], then: Callable, lock) -> None:
    """Call ``then`` once every run's outputs (``per_run``: a list of futures per run) are set, from the thread
    that sets the last: one done-callback a run, on its last output not yet set. A run's outputs are set
    together, in order, so that is usually the only one (a callback on each would make each future a
    Condition: a state's hundreds)."""
    left = [len(per_run)]

    def run_done() -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            then()

    for fs in per_run:
        _watch(fs, run_done)


def _watch(fs: list, done: Callable[[], None]) -> None:
    """Call ``done`` once every future of ``fs`` is set: now, or from a done-callback on the last one not set.

    A module function, not a closure that calls itself: such a closure is a reference cycle, which
    held each burst's futures (and the Python objects of their arrays) until a full collection, and
    the service's process freezes what survives one (`clients.Heap`)."""
    pending = next((f for f in reversed(fs) if not f.done()), None)
    if pending is None:
        done()
    else:
        pending.add_done_callback(lambda _f: _watch(fs, done))


def value_of(x):
    """A buffer's value, waited for if it is a Future still computing."""
    return x.result() if isinstance(x, Future) else x

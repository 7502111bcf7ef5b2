"""Parallel asynchronous dispatch: the dispatcher calls steps' executables and reports what it sent.

Shapes are static, so node k+1 can be dispatched as soon as node k has been
*dispatched*: JAX arrays are futures themselves, and XLA orders the work on
each device. The dispatcher waits when an island has ``max_inflight`` nodes
outstanding, or a step's devices have ``Config.run_ahead_s`` of estimated work
queued (`runahead.py`: what bounds how long a cancel or a higher priority
waits). It hands what it sent to `Completion`, which waits for it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, NamedTuple

import jax

from ..core.records import FINAL, Work
from ..errors import ArgumentError
from ..trace.compiled import has_collectives
from .completion import BATCH, Batch, Completion, Item, probe_of
from .events import EventLog, NodeEvent
from .interrupts import interrupts_deferred
from .port import Port

if TYPE_CHECKING:
    from ..core.records import RunRecord
    from ..remote.client import Bursts
    from ..core.runahead import RunAhead
    from .plan import Step

# A submitting thread dispatches this many steps itself, or for one flush interval if that is more,
# before the dispatcher thread takes over: a run of tiny nodes dispatched whole inline is completed
# by its caller with no hand-off between threads, and the call still returns within ~1 ms.
_INLINE_STEPS = 64
_NONE_SENT = (0, 0, 0)  # an island with nothing sent yet in this burst: [steps, with collectives, with callbacks]
_FLUSH_NS = 1_000_000  # or sooner: no node waits more than 1 ms to be watched (the timeline's resolution)


class Failed(NamedTuple):
    """`Dispatcher.call_one`'s answer when a lone run's only step raised in its call (`Port.failed`)."""

    step: Step | None  # None: a bug of ours
    error: BaseException


def _compile_key(st) -> tuple | None:
    """What makes two steps' executables one: the function and the kind of each argument (None: not known ahead)."""
    vals = st.in_values
    if not vals or any(v.sharding is None for v in vals):
        return None
    return (st.call, *((v.shape, v.dtype, v.sharding) for v in vals))


def _lower_and_compile(call, args, log) -> tuple[int, int, object]:
    """(start, end, the compiled executable or None if it failed) of compiling ``call`` for ``args``."""
    start = log.now()
    try:
        compiled = call.lower(*args).compile()
    except Exception:
        compiled = None
    return start, log.now(), compiled


class Dispatcher:
    """Executes steps and reports what happened; decides nothing about runs (the lifecycle does).

    Owns the dispatcher thread: it asks the lifecycle for work through the
    `Port`, runs up to a quantum of steps without the lock, reports them
    dispatched and hands them to `Completion`. A submitting thread may dispatch
    a lone run itself (`dispatch_inline`).
    """

    def __init__(
        self, port: Port, completion: Completion, log: EventLog, gate: RunAhead, bursts: Bursts,
        compile_threads: int | None = None,
    ):
        self.port = port
        self.lock = port.lock  # the controller's: plain `with self.lock` where nobody waits (cheaper than cond)
        self.cond = threading.Condition(port.lock)
        self.completion = completion
        completion.bury = self._bury
        self.log = log
        self.gate = gate  # the run-ahead bound: at most ~run_ahead_s of estimated work queued per device
        self.bursts = bursts  # remote islands with ops buffered in the current burst
        #: the idents of the controller's own threads, which never dispatch inline (set once they run)
        self.thread_ids: frozenset[int] = frozenset()
        self.seq = 0
        self._stopping = False
        self.busy = False  # a thread (this one's dispatcher, or a submitter inline) is dispatching
        self._idle = True
        self._went_idle = threading.Condition(port.lock)  # a submitter waits on it (`wait_idle`)
        self._idle_waiters = 0
        # Watched batches whose buffers the dispatcher frees between bursts: freeing device
        # buffers on the watcher thread while the dispatcher dispatches slows dispatch ~2x.
        self.graveyard: list = []
        self.thread = threading.Thread(target=port.keep_going, args=("dispatcher", self._dispatch_loop),
                                       name="pw-dispatcher", daemon=True)
        threads = compile_threads
        if threads is not None and (type(threads) is not int or threads < 1):
            raise ArgumentError(
                f"`pw.Config(compile_threads=...)` must be a positive int (1: compile one executable at a "
                f"time) or None (the CPU count, at most 4); got {threads!r}."
            )
        self.compile_threads = threads if threads is not None else max(1, min(4, os.cpu_count() or 1))
        self._compilers: concurrent.futures.ThreadPoolExecutor | None = None  # made at the first compile of several

    def start(self) -> None:
        self.thread.start()

    def wake(self) -> None:
        """Tell the dispatcher something changed (caller holds the controller lock)."""
        self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        if self._compilers is not None:
            self._compilers.shutdown(wait=False, cancel_futures=True)

    def _bury(self, batches: list) -> None:
        """Completed batches whose buffers this thread frees between its bursts (lock held); with no run in flight, none."""
        # Freeing device buffers on the watcher thread while we dispatch slows dispatch ~2x; with
        # no run left in flight there is nothing to slow down, and nothing should outlive its run.
        if not self._idle and self.port.queued():
            self.graveyard.extend(batches)
        elif self.graveyard:
            # No run is left in flight: the last one's waiters wake once this thread lets go of the
            # lock. What earlier runs left here is freed first, or a waiter could find their arrays
            # alive while this thread (the dispatcher, going idle) is still freeing them.
            self.graveyard.clear()

    # ------------------------------------------------------------ dispatcher
    def _dispatch_loop(self) -> None:
        port = self.port
        while True:
            with self.cond:
                work = None if self.busy else port.next_work()
                while work is None:
                    if self._stopping:
                        return
                    # A lone long node leaves room before it finishes (`RunAhead.wake_at`): wait for then.
                    gate = self.gate
                    wake_at, gate.wake_at = gate.wake_at, 0
                    if port.credit_wanted and self.completion.claimable() and not wake_at:
                        break  # nothing can go until steps in flight finish: complete them here
                    self._idle = True
                    self.graveyard.clear()
                    if self._idle_waiters:
                        self._went_idle.notify_all()
                    if wake_at:
                        left = wake_at - time.perf_counter_ns()
                        if left > 0:
                            self.cond.wait(left / 1e9)
                    else:
                        self.cond.wait()
                    self._idle = False
                    work = None if self.busy else port.next_work()
                else:
                    self.busy = True
                    dead, self.graveyard = self.graveyard, []
            if work is None:
                # Every runnable run waits for credit that only completions give back (one
                # collective step in flight on the CPU, max_inflight, the run-ahead bound): this
                # thread completes the pending steps itself and dispatches the next at once,
                # instead of waking the watcher and waiting to be woken (two hand-offs per step).
                self.completion.complete_pending()
                continue
            del dead  # free finished nodes' buffers here, between bursts (see _bury)
            self.execute(work)
            if self.completion.computed():
                # What it sent has already run (tiny nodes on the CPU compute inside their call):
                # completed here, between bursts, rather than by the watcher trading the GIL with
                # this thread. Still computing: the watcher's (this thread goes on dispatching).
                self.completion.complete_pending()

    def wait_idle(self, timeout: float) -> None:
        """On a submitting thread (lock held, let go meanwhile): wait at most ``timeout`` s for dispatching to catch up.

        It has caught up when no thread dispatches and no run waits to be dispatched: the caller
        may then dispatch its own run (completions may still go on, on other threads).

        A loop feeding each call the last one's future, faster than the dispatcher thread finishes
        them, would otherwise queue every call behind it for good: each then pays two hand-offs,
        and, on the CPU, XLA's slower way for inputs not yet computed (~2.5x a step dispatched by
        the caller, measured at 30 leaves). Waiting for the dispatcher to catch up once puts the
        calls back on the caller's thread.
        """
        if threading.get_ident() in self.thread_ids:
            return
        deadline = time.monotonic() + timeout
        self._idle_waiters += 1
        try:
            while self.busy or self.port.has_work():  # (what the caller's run would queue behind)
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._went_idle.wait(left)
        finally:
            self._idle_waiters -= 1

    def can_inline(self) -> bool:
        """Whether the submitting thread (lock held) may dispatch here: no thread is dispatching."""
        return not (self.busy or self._stopping or threading.get_ident() in self.thread_ids)

    def dispatch_inline(self, work: Work | None = None) -> bool:
        """On a submitting thread, holding the lock: dispatch ``work`` (or the next work) here if no thread is dispatching.

        Dispatching a small run on the thread that submitted it saves two thread
        hand-offs (the latency of a lone interactive call). The lock is held
        throughout, so no other thread can start dispatching meanwhile: one
        order per island, as gang scheduling needs. Returns False (nothing done)
        when the dispatcher thread is at work or there is nothing to dispatch.
        ``work``: a lone run the lifecycle just started for this thread (`Lifecycle.submit_lone`).
        """
        if work is None:
            if not self.can_inline():
                return False
            if self.port.queued() > 1:
                # Other runs are in flight (a stream of calls, each fed the last one's future): the
                # dispatcher thread then overlaps dispatch with the caller's next submit, which pays
                # more than the hand-off saves. Inline is for the lone interactive call.
                return False
            work = self.port.next_work()
            if work is None:
                return False
        # A Ctrl-C in the middle would leave steps dispatched but unreported: it waits until they are.
        with interrupts_deferred:
            try:
                rec = work.rec
                st = rec.plan.steps[0] if work.inline and rec.total == 1 else None
                sent = None if st is None else self.call_one(rec, st, [rec.slots[i] for i in st.ins])
                if sent is None:
                    self._dispatch(work, inline=True)
                elif type(sent) is Failed:
                    self.port.failed(rec, sent.step, sent.error)
                else:
                    self._hand_over(sent, lone=True)
            except Exception as e:  # a bug of ours: fail the run, keep the controller alive
                self.port.failed(work.rec, None, e)
        if self.port.has_work():
            self.cond.notify()  # what the inline dispatch left is the dispatcher thread's
        return True

    def execute(self, work: Work) -> None:
        """The dispatcher thread: dispatch ``work`` without the lock (``busy`` is ours), then give it back."""
        try:
            self._dispatch(work)
        except BaseException as e:  # a bug of ours: fail the run, keep the controller alive
            with self.lock:
                self.port.failed(work.rec, None, e)
        finally:
            with self.lock:
                self.busy = False
                if self._idle_waiters:
                    self._went_idle.notify_all()

    def _dispatch(self, work: Work, inline: bool = False) -> None:
        """Dispatch up to ``work.quantum`` of its run's next steps; no lock held around JAX calls."""
        port = self.port
        rec, quantum = work.rec, work.quantum
        steps = rec.plan.steps
        slots = rec.slots  # lent to this thread while it holds the run's work
        if slots is None:  # cancelled or failed between pick and here
            return
        clock, epoch = time.perf_counter_ns, self.log.epoch
        self.bursts.run = (rec.id, rec.priority)  # what remote islands are told their nodes belong to
        # Hand work to the watcher in batches: one wake-up per batch instead of per node keeps
        # the two threads from trading the GIL on every tiny node.
        batch: list = []
        flush_at = inline_until = clock() - epoch + _FLUSH_NS
        no_room = port.no_room  # (reads counts without the lock: only completions lower them meanwhile)
        gate = self.gate
        gated = gate.on
        sent_on: dict[int, list[int]] = {}  # island -> [steps, with collectives] sent in this burst, not yet reported
        published: list = []
        k = start = rec.cursor
        n_steps = len(steps)
        cost = 0
        failed = None
        while k < n_steps and k - start < quantum:
            st = steps[k]
            exe = st.exe
            island = st.island
            sent = sent_on.get(island, _NONE_SENT)
            if rec.state in FINAL:
                break
            if inline and (st.host_callbacks or exe.compile_first):
                # A callback could hold the submitting thread until it returns, a compile for
                # seconds: the call must return at once, so these are the dispatcher thread's.
                break
            if exe.compile_first:
                # Compiled on a thread of its own (unless it is already): its steps wait (`Lifecycle.out_of_credit`),
                # other runs, other clients' in a service, go on being dispatched meanwhile.
                # (read in this order: the compile thread clears them in the other)
                if not exe.compiling and exe.compile_first:
                    self._compile_aside(rec, k, [slots[i] for i in st.ins])
                break
            if no_room(st, sent):
                break  # credit comes back as earlier steps finish (the lifecycle decides: `Lifecycle.no_room`)
            ns = gate.take(st) if gated and not st.remote else 0
            if ns < 0:
                break  # its devices have the bound queued: a node finishing wakes this thread
            t = clock() - epoch
            try:
                ins = st.ins
                outs = st.call(slots[ins[0]]) if len(ins) == 1 else st.call(*[slots[i] for i in ins])
            except Exception as e:
                if ns:
                    gate.untake(st, ns)
                failed = (st, e)
                break
            if exe.probe is None and not st.remote:
                exe.probe = probe_of([slots[i] for i in ins], outs)
            if len(outs) == 1:
                slots[st.outs[0]] = outs[0]
            else:
                for i, o in zip(st.outs, outs):
                    slots[i] = o
            for i in st.frees:
                slots[i] = None
            for j, pos in st.publishes:
                published.append((j, outs[pos]))
            self.seq += 1
            if sent is _NONE_SENT:
                sent = sent_on[island] = [0, 0, 0]
            sent[0] += 1
            sent[1] += exe.collectives
            sent[2] += st.host_callbacks
            # Its NodeEvent is made once complete, with all its times (the watcher's thread, off this loop).
            batch.append(Item(rec, st, self.seq, t, outs))
            k += 1
            cost += exe.cost
            if inline and t >= inline_until and k - start >= _INLINE_STEPS:
                break  # the submitting thread's share: the rest is the dispatcher thread's
            if len(batch) >= BATCH or t >= flush_at:
                self._hand_over(_batch(rec, batch, k, sent_on, published, cost))
                batch, sent_on, published, cost = [], {}, [], 0
                flush_at = t + _FLUSH_NS
        if batch or k != rec.cursor:
            # Inline and the run's last steps: the caller completes them when it waits for the outputs.
            self._hand_over(_batch(rec, batch, k, sent_on, published, cost), lone=inline and k >= n_steps)
        elif self.bursts.islands:
            self.bursts.flush()  # a failed first step may have buffered its executable's load
        if failed is not None:
            with self.lock:
                port.failed(rec, *failed)

    def call_one(self, rec: RunRecord, st, args) -> Batch | Failed | None:
        """Call a lone run's only step on its submitting thread (lock held); what it sent, for its report.

        What `_dispatch` does for the commonest interactive call (one compiled function on
        arrays), without its loop's set-up. None (nothing done) where the step needs the
        loop: a first call (compiled first), host callbacks, or its devices' run-ahead bound.
        A step on a remote island is sent here (its request leaves before the run is reported
        started: the reports overlap the island's work). Its credit is not asked again: the
        lifecycle found it in this lock hold. Returns the batch it sent, which the caller
        completes if it computed inside its call (`Completion.complete_computed`), else reports
        dispatched and hands over; or `Failed`, which the caller reports. This returns rather
        than calls back up.
        """
        exe = st.exe
        if exe.compile_first or st.host_callbacks:
            return None
        remote = st.remote
        gate = self.gate
        ns = gate.take(st) if gate.on and not remote else 0
        if ns < 0:
            return None
        if remote:
            self.bursts.run = (rec.id, rec.priority)  # what the island is told its node belongs to
        t = time.perf_counter_ns() - self.log.epoch
        try:
            outs = st.call(*args)
            if remote:
                self.bursts.flush()
        except Exception as e:
            if ns:
                gate.untake(st, ns)
            return Failed(st, e)
        if exe.probe is None and not remote:
            exe.probe = probe_of(args, outs)
        self.seq += 1
        published = [(j, outs[pos]) for j, pos in st.publishes]
        # (charged what it was estimated at: completing it learns its new time)
        return Batch(rec, [Item(rec, st, self.seq, t, outs)], 1, ((st.island, 1, exe.collectives, 0),), published,
                     exe.cost)

    def _compile_aside(self, rec: RunRecord, k: int, args: list) -> None:
        """Compile step ``k``'s executable before its first call, with the run's later ones, on a thread of its own.

        Otherwise XLA compiles inside the first call, and its time (often 100x a
        later call) shows up as that node's device time, or inside a transfer. It
        compiles aside because a compile can take seconds to minutes: done on the
        dispatching thread, it held up every other run's dispatch, on every device
        (and in a service, every other client's calls). Meanwhile the steps of the
        executables it compiles have no credit (`Executable.compiling`; they stay
        ``compile_first`` until it ends, so no dispatch loop calls them): their runs
        wait, and the compile's end wakes the dispatcher. Later calls (of any step
        sharing the executable) hit JAX's cache. A pipeline's first step has tens of
        executables to compile: those of the later steps are compiled from what
        their arguments will be (`Step.in_values`), on `Config.compile_threads`
        threads at once, and steps that call one function on arguments of the same
        kind share its compile.
        """
        steps = rec.plan.steps
        st = steps[k]
        first = _compile_key(st)
        jobs: dict = {first: (st, args, [st])}  # key -> (step, arguments, the steps it compiles)
        ahead = self.compile_threads > 1  # else only the steps that share this one's executable
        for later in steps[k + 1:] if first is not None else ():
            if not later.exe.compile_first or later.exe.compiling or later.host_callbacks:
                continue
            key = _compile_key(later)
            if key is None:
                continue  # host values among its arguments: compiled on its first call's arguments
            job = jobs.get(key)
            if job is not None:
                job[2].append(later)
            elif ahead:
                specs = [jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for v in later.in_values]
                jobs[key] = (later, specs, [later])
        todo = list(jobs.values())
        for _, _, sharing in todo:
            for s in sharing:  # (written here, the dispatching thread, before the thread starts)
                s.exe.compiling = True
        seq = self.seq  # the compile events' numbers, taken here: ``seq`` has one writer
        self.seq += len(todo)
        # Not a daemon: the interpreter's exit waits for it (as for a compile pool's threads). A daemon
        # thread still inside XLA's compiler when the process exits is killed there, in C++ frames, and
        # the process aborts ("terminate called ..."): a script whose last calls compiled a new signature.
        threading.Thread(target=self._compile, args=(rec, todo, seq), name="pw-compile", daemon=False).start()

    def _compile(self, rec: RunRecord, todo: list, seq: int) -> None:
        """The compile thread: compile ``todo`` (`_compile_aside`), a "compile" event each, then let its steps go."""
        port = self.port
        log = self.log
        try:
            # Progress views say so: a first call can compile for minutes.
            names = [job[0].name for job in todo]
            port.compiling(rec, ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else ""))
            if len(todo) == 1:
                results = [_lower_and_compile(todo[0][0].call, todo[0][1], log)]
            else:
                results = list(self._compile_pool().map(lambda job: _lower_and_compile(job[0].call, job[1], log), todo))
            events = []
            for (step, _, sharing), (start, end, compiled) in zip(todo, results):
                if compiled is None:
                    continue  # its call raises it, attributed to the node (a later step: when it comes up)
                collectives = has_collectives(compiled)
                for s in sharing:
                    s.exe.collectives = collectives
                seq += 1
                ev = NodeEvent(
                    seq, rec.id, rec.name, rec.tenant, f"compile {step.name}", "compile", (), step.island, None,
                    start, 0, step.shapes,
                )
                ev.end = end
                events.append(ev)
            if events:
                # On the run before they are emitted: a view reading the run on one sees them.
                span = max(e.end for e in events) - min(e.dispatch for e in events)  # (they overlap)
                port.compiling(rec, rec.compiling, events, span)
                for ev in events:
                    log.emit_node(ev)
            port.compiling(rec, None)  # after its events: the run says what it compiled until they are out
        except Exception:  # a bug of ours, or the controller stopping: its steps go, and compile in their call
            logging.getLogger("pw_kernel").debug("compiling for run %s failed", rec.id, exc_info=True)
        finally:
            with self.cond:
                for _, _, sharing in todo:
                    for s in sharing:  # (a failed compile: its call compiles again, and raises at its node)
                        s.exe.compile_first = False
                        s.exe.compiling = False
                self.cond.notify()  # its steps have credit again

    def _compile_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._compilers is None:
            self._compilers = concurrent.futures.ThreadPoolExecutor(self.compile_threads, "pw-compile")
        return self._compilers

    def _hand_over(self, batch: Batch, lone: bool = False) -> None:
        """Report steps dispatched, then give them to completion (in that order: credit is counted first).

        ``lone``: dispatched inline by the submitting thread, which completes them when it waits,
        or here if they have computed already (it holds the lock until its call returns, so no
        waiter sees the run final while this thread still holds the batch's arrays).
        """
        if self.bursts.islands:
            self.bursts.flush()  # the remote steps among them go to their islands' mailboxes now
        with self.lock:
            if lone and batch.items and self.completion.complete_computed(batch):
                return  # reported as run (`ran`): sent and finished
            self.port.dispatched(batch.rec, batch.cursor, batch.per_island, batch.published, batch.cost)
            if batch.items:
                # What completion reports of them is what was counted here, unless one fails.
                self.completion.add(batch, lone)


def _batch(rec: RunRecord, items: list, cursor: int, sent_on: dict, published: list, cost: int) -> Batch:
    """What a burst sent of ``rec``'s steps, up to ``cursor``, counted per island from ``sent_on``."""
    return Batch(rec, items, cursor, tuple((island, *counts) for island, counts in sent_on.items()), published, cost)

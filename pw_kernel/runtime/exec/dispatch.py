"""Parallel asynchronous dispatch: one dispatcher thread, one completion watcher.

Shapes are static, so node k+1 can be dispatched as soon as node k has been
*dispatched*: JAX arrays are futures themselves, and XLA orders the work on
each device. The dispatcher only waits when an island has ``max_inflight``
nodes outstanding; the watcher blocks on outputs in dispatch order, records
each node's end, releases in-flight credit and resolves futures.
"""

from __future__ import annotations

import collections
import signal
import _signal  # noqa: I001 - see _InterruptsDeferred
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax

from ..trace.compiled import has_collectives
from ..errors import HostCallbackError
from .events import NodeEvent
from ..core.records import FINAL, Work
from ..remote.client import bursting, flush_remote

if TYPE_CHECKING:
    from .controller import Controller
    from ..core.records import RunRecord

_BATCH = 256  # nodes per hand-off to the watcher
_INLINE_STEPS = 64  # steps a submitting thread dispatches itself before the dispatcher thread takes over
_NONE_SENT = (0, 0, 0)  # an island with nothing sent yet in this burst: [steps, with collectives, with callbacks]
_FLUSH_NS = 1_000_000  # or sooner: no node waits more than 1 ms to be watched (the timeline's resolution)
_POLL_S = 0.001  # a watcher with recent work looks for new batches this often (the same resolution)
_POLL_IDLE_S = 1.0  # ... and sleeps until woken after this long without any (a notify costs the caller)


class _InterruptsDeferred:
    """On the main thread, hold a Ctrl-C (SIGINT) back until the block is done, then deliver it.

    Entered a few times per interactive call, so it uses ``_signal`` (the C module under
    ``signal``): ``signal.signal`` converts handlers to and from enums, ~15 µs a swap against
    ~1. Nested blocks keep the outer block's handler.
    """

    __slots__ = ("depth", "previous", "caught")

    def __init__(self):
        self.depth = 0
        self.previous = None
        self.caught: list = []

    def _hold(self, signum, frame) -> None:
        self.caught.append(frame)

    def __enter__(self) -> None:
        if threading.current_thread() is not _MAIN:
            return
        if self.depth:
            self.depth += 1
            return
        try:
            self.previous = _signal.signal(_SIGINT, self._hold)
        except (ValueError, TypeError):  # not installable here: run the block as it is
            return
        self.depth = 1

    def __exit__(self, *exc) -> None:
        if not self.depth or threading.current_thread() is not _MAIN:
            return
        self.depth -= 1
        if self.depth:
            return
        previous, self.previous = self.previous, None
        _signal.signal(_SIGINT, previous)
        if self.caught:
            frame = self.caught[0]
            self.caught.clear()
            if callable(previous):
                previous(_SIGINT, frame)
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt


_MAIN = threading.main_thread()
_SIGINT = int(signal.SIGINT)
#: the main thread's deferral (only the main thread receives signals, so one suffices)
_interrupts_deferred = _InterruptsDeferred()


class Dispatcher:
    """Executes steps and reports what happened; decides nothing about runs (the lifecycle does).

    Owns the two controller threads: the dispatcher asks the controller for
    work, runs up to a quantum of steps without the lock, and reports them
    dispatched; the watcher waits for them in dispatch order, stamps their
    times and reports them completed (or failed).
    """

    def __init__(self, controller: Controller, lock: threading.RLock):
        self.controller = controller
        self.lock = lock  # the controller's: plain `with self.lock` where nobody waits (cheaper than cond)
        self.cond = threading.Condition(lock)
        # Dispatched batches not yet completed, in dispatch order (under the lock). Whoever completes
        # them holds the `completing` token: the watcher thread, or a thread waiting on a future (`help`).
        self._watch = threading.Condition(lock)
        self._pending: collections.deque = collections.deque()
        self._completing = False
        self._watcher_asleep = False  # waiting without a timeout: a new batch must wake it
        self.last_end: dict[int, int] = {}  # device -> end of its last node (the watcher's)
        self.seq = 0
        self._stopping = False
        self.busy = False  # a thread (this one's dispatcher, or a submitter inline) is dispatching
        self._idle = True
        # Watched batches whose buffers the dispatcher frees between bursts: freeing device
        # buffers on the watcher thread while the dispatcher dispatches slows dispatch ~2x.
        self.graveyard: list = []
        self._threads = [
            threading.Thread(target=self._dispatch_loop, name="pw-dispatcher", daemon=True),
            threading.Thread(target=self._watch_loop, name="pw-watcher", daemon=True),
        ]
        for t in self._threads:
            t.start()

    @property
    def threads(self) -> list[threading.Thread]:
        return list(self._threads)

    def wake(self) -> None:
        """Tell the dispatcher something changed (caller holds the controller lock)."""
        self.cond.notify()

    def stop(self, timeout: float | None = 10.0) -> None:
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        with self._watch:
            self._watch.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)

    # ------------------------------------------------------------ dispatcher
    def _dispatch_loop(self) -> None:
        c = self.controller
        while True:
            with self.cond:
                work = None if self.busy else c.next_work()
                while work is None:
                    if self._stopping:
                        return
                    self._idle = True
                    self.graveyard.clear()
                    self.cond.wait()
                    self._idle = False
                    work = None if self.busy else c.next_work()
                self.busy = True
                dead, self.graveyard = self.graveyard, []
            del dead  # free finished nodes' buffers here, between bursts (see _watch_loop)
            self.execute(work)

    def dispatch_inline(self) -> bool:
        """On a submitting thread, holding the lock: dispatch the next work here if no thread is dispatching.

        Dispatching a small run on the thread that submitted it saves two thread
        hand-offs (the latency of a lone interactive call). The lock is held
        throughout, so no other thread can start dispatching meanwhile: one
        order per island, as gang scheduling needs. Returns False (nothing done)
        when the dispatcher thread is at work or there is nothing to dispatch.
        """
        if self.busy or self._stopping or not _INLINE_STEPS or threading.current_thread() in self._threads:
            return False
        if len(self.controller.lifecycle.queue) > 1:
            # Other runs are in flight (a stream of calls, each fed the last one's future): the
            # dispatcher thread then overlaps dispatch with the caller's next submit, which pays
            # more than the hand-off saves. Inline is for the lone interactive call.
            return False
        work = self.controller.next_work()
        if work is None:
            return False
        # A Ctrl-C in the middle would leave steps dispatched but unreported: it waits until they are.
        with _interrupts_deferred:
            try:
                self._dispatch(work.rec, min(work.quantum, _INLINE_STEPS), inline=True)
            except Exception as e:  # a bug of ours: fail the run, keep the controller alive
                self.controller.on_step_failed(work.rec, None, e)
        if self.controller.lifecycle.has_work():
            self.cond.notify()  # what the inline dispatch left is the dispatcher thread's
        return True

    def execute(self, work: Work) -> None:
        """The dispatcher thread: dispatch ``work`` without the lock (``busy`` is ours), then give it back."""
        try:
            self._dispatch(work.rec, work.quantum)
        except BaseException as e:  # a bug of ours: fail the run, keep the controller alive
            with self.lock:
                self.controller.on_step_failed(work.rec, None, e)
        finally:
            with self.lock:
                self.busy = False

    def _dispatch(self, rec: RunRecord, quantum: int, inline: bool = False) -> None:
        """Dispatch up to ``quantum`` of ``rec``'s next steps; no lock held around JAX calls."""
        c = self.controller
        life = c.lifecycle
        steps = rec.plan.steps
        slots = rec.slots
        if slots is None:  # cancelled or failed between pick and here
            return
        log = c.events
        clock, epoch = time.perf_counter_ns, log.epoch
        # Hand work to the watcher in batches: one wake-up per batch instead of per node keeps
        # the two threads from trading the GIL on every tiny node.
        batch: list = []
        flush_at = clock() - epoch + _FLUSH_NS
        inflight = life.inflight  # read without the lock: only completions lower them meanwhile
        coll_inflight, coll_limits = life.collectives_inflight, life.max_collectives
        cb_inflight = life.callbacks_inflight
        limit = life.max_inflight
        sent_on: dict[int, list[int]] = {}  # island -> [steps, with collectives] sent in this burst, not yet reported
        published: list = []
        k = start = rec.cursor
        n_steps = len(steps)
        cost = 0
        failed = None
        while k < n_steps and k - start < quantum:
            st = steps[k]
            island = st.island
            sent = sent_on.get(island, _NONE_SENT)
            if inflight[island] + sent[0] >= limit or rec.state in FINAL:
                break
            if inline and (st.host_callbacks or st.compile_first):
                # A callback could hold the submitting thread until it returns, a compile for
                # seconds: the call must return at once, so these are the dispatcher thread's.
                break
            if st.compile_first:
                if batch:  # let the watcher time what is in flight while this thread compiles
                    self._hand_over(rec, k, sent_on, published, cost, batch)
                    batch, sent_on, published, cost, sent = [], {}, [], 0, _NONE_SENT
                self._compile(rec, st, [slots[i] for i in st.ins])
            if st.collectives and coll_inflight[island] + sent[1] >= coll_limits[island]:
                break  # credit comes back as earlier collective steps finish
            if st.host_callbacks and cb_inflight[island] + sent[2]:
                break  # one at a time: what a guarded callback raised belongs to the one in flight
            t = clock() - epoch
            try:
                ins = st.ins
                outs = st.call(slots[ins[0]]) if len(ins) == 1 else st.call(*[slots[i] for i in ins])
            except Exception as e:
                failed = (st, e)
                break
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
            ev = NodeEvent(
                self.seq, rec.id, rec.name, rec.tenant, st.name, st.kind, st.devices, island, st.src_island, t,
                st.nbytes, st.shapes,
            )
            if sent is _NONE_SENT:
                sent = sent_on[island] = [0, 0, 0]
            sent[0] += 1
            sent[1] += st.collectives
            sent[2] += st.host_callbacks
            batch.append((rec, st, ev, outs))
            k += 1
            cost += st.cost
            if len(batch) >= _BATCH or t >= flush_at:
                self._hand_over(rec, k, sent_on, published, cost, batch)
                batch, sent_on, published, cost = [], {}, [], 0
                flush_at = t + _FLUSH_NS
        if batch or k != rec.cursor:
            self._hand_over(rec, k, sent_on, published, cost, batch)
        elif bursting:
            flush_remote()  # a failed first step may have buffered its executable's load
        if failed is not None:
            with self.lock:
                c.on_step_failed(rec, *failed)

    def _compile(self, rec: RunRecord, st, args: list) -> None:
        """Compile a step's executable before its first call, as a "compile" event on the host lane.

        Otherwise XLA compiles inside the first call, and its time (often 100x a
        later call) shows up as that node's device time, or inside a transfer.
        Later calls (of any step sharing the executable) hit JAX's cache.
        """
        st.compile_first = False
        log = self.controller.events
        t0 = log.now()
        rec.compiling = st.name  # progress views say so: a first call can compile for minutes
        try:
            compiled = st.call.lower(*args).compile()
        except Exception:
            rec.compiling = None
            return  # the call itself will raise it, attributed to the node
        st.collectives = has_collectives(compiled)
        t1 = log.now()
        rec.compile_ns += t1 - t0
        self.seq += 1
        ev = NodeEvent(
            self.seq, rec.id, rec.name, rec.tenant, f"compile {st.name}", "compile", (), st.island, None, t0, 0,
            st.shapes,
        )
        ev.end = t1
        rec.events.append(ev)
        log.emit_node(ev)
        rec.compiling = None  # after its event: a view reading the run on that event sees what compiled

    def _hand_over(self, rec: RunRecord, cursor: int, sent_on: dict, published: list, cost: int, batch: list) -> None:
        """Report steps dispatched, then give them to the watcher (in that order: credit is counted first)."""
        if bursting:
            flush_remote()  # the remote steps among them go to their islands' mailboxes now
        with self.lock:
            per_island = tuple((island, *counts) for island, counts in sent_on.items())
            self.controller.on_dispatched(rec, cursor, per_island, published, cost)
            if batch:
                self._pending.append(batch)
                # A polling watcher finds the batch within _POLL_S; waking it per batch would make it
                # fight the submitting thread for the GIL on every interactive call.
                if self._watcher_asleep or len(batch) >= _BATCH or self.controller.lifecycle.credit_wanted:
                    self._watch.notify()

    # --------------------------------------------------------------- watcher
    def help(self, wait: Callable[[], None] | None = None) -> bool:
        """Complete what is pending on this thread if no other thread is completing (a waiter's shortcut).

        A thread about to wait for a future claims the pending batches first (so
        the watcher thread leaves them alone), runs ``wait`` (its own
        interruptible wait for the value), then completes them itself: no
        hand-off between threads on the way to the result. A Ctrl-C in ``wait``
        gives the batches back to the watcher.
        """
        with self.lock:
            if self._completing or not self._pending:
                return False
            batches = self._take()
        if wait is not None:
            try:
                wait()
            except BaseException:
                with self.lock:
                    self._pending.extendleft(reversed(batches))
                    self._completing = False
                    self._watch.notify()
                raise
        with _interrupts_deferred:  # a Ctrl-C in the middle would leave those nodes unreported
            self._finish(batches)
        return True

    def _take(self) -> list:
        """Claim every pending batch (lock held)."""
        self._completing = True
        batches = list(self._pending)
        self._pending.clear()
        return batches

    def _finish(self, batches: list) -> None:
        """Wait for ``batches`` and time them (no lock), then report them all at once (one lock)."""
        reports: list = []
        for batch in batches:
            try:
                self._complete(batch, reports)
            except BaseException as e:  # a bug of ours: those runs fail, the watcher goes on
                reports += self._segments(batch, {0: e}, stamped=False, first_only=True)
        with self.lock:
            try:
                on_completed = self.controller.on_completed
                for report in reports:
                    on_completed(*report)
            finally:
                if not self._idle:  # the dispatcher frees these between its bursts (see __init__)
                    self.graveyard.extend(batches)
                self._completing = False
                if self._pending:
                    self._watch.notify()

    def _watch_loop(self) -> None:
        quiet_since = None
        while True:
            with self.lock:
                while not self._pending or self._completing:
                    if self._stopping and not self._pending:
                        return
                    if quiet_since is not None and time.monotonic() - quiet_since > _POLL_IDLE_S:
                        # Long quiet: sleep until a batch arrives (the next one wakes us).
                        self._watcher_asleep = True
                        self._watch.wait()
                        self._watcher_asleep = False
                        quiet_since = None
                    else:
                        if quiet_since is None:
                            quiet_since = time.monotonic()
                        self._watch.wait(_POLL_S)
                batches = self._take()
            quiet_since = None
            self._finish(batches)
            batches = None  # drop our references: an idle dispatcher frees nothing for us

    def _complete(self, batch: list, reports: list) -> None:
        """Wait for a batch of nodes in dispatch order, stamp their times, emit their events; add reports.

        All per-node work here holds the GIL that the dispatcher needs, so it is
        kept to a few attribute writes: `is_ready` before blocking (tiny nodes are
        long done and need no GIL release), one error check for the whole batch.
        """
        c = self.controller
        log = c.events
        now = log.now
        last_end = self.last_end
        epoch = log.epoch
        guarded = []  # nodes whose host callbacks may have recorded an exception
        for i, (_, st, ev, outs) in enumerate(batch):
            if st.host_callbacks:
                guarded.append(i)
            for a in outs:
                try:
                    if not a.is_ready():
                        a.block_until_ready()
                except AttributeError:
                    pass  # not a device array (a numpy float0 gradient of an integer input): ready
                except Exception:
                    pass  # found and attributed below
            end = now()
            start = ev.dispatch
            if st.remote:  # ran on a remote island: its own clock, corrected
                try:
                    r_start, r_end = outs[0].timing()
                    start = max(start, r_start - epoch)
                    end = max(start, r_end - epoch)
                except Exception:
                    pass
            for d in st.devices:
                prev = last_end.get(d, 0)
                if prev > start:
                    start = prev
            ev.start = start
            ev.end = end if end > start else start
            st.cost += (ev.end - start - st.cost) >> 2  # running mean of device time, for fair share
            for d in st.devices:
                last_end[d] = ev.end
        failed: dict[int, BaseException] = {}  # batch index -> error of the first failing node of a run
        try:
            jax.block_until_ready([item[3] for item in batch])
        except Exception:  # an asynchronous failure: find the first failing node of each run
            seen: set[int] = set()
            for i, (rec, _, _, outs) in enumerate(batch):
                if rec.id not in seen:
                    try:
                        jax.block_until_ready(outs)
                    except Exception as e:
                        failed[i] = e
                        seen.add(rec.id)
        for i in guarded:
            self._callback_failure(batch, i, failed)
        emit = log.emit_node
        for i, (rec, _, ev, _) in enumerate(batch):
            err = failed.get(i) if failed else None
            if err is not None:
                ev.error = f"{type(err).__name__}: {err}"
            rec.events.append(ev)
            emit(ev)
        reports += self._segments(batch, failed)

    @staticmethod
    def _callback_failure(batch: list, i: int, failed: dict) -> None:
        """Node ``i``'s guarded host callback raised, letting its computation finish: fail the node now
        (unless an earlier node of its run failed first: ``failed`` keeps one failure per run).

        Steps with host callbacks run one at a time per island, so everything the executable's
        callbacks recorded was raised by this node (once per device, perhaps: the first counts).
        """
        rec, st = batch[i][0], batch[i][1]
        errors = getattr(st.call, "callback_errors", None)
        if not errors:
            return
        first = errors[0]
        errors.clear()
        other = next((j for j in failed if batch[j][0] is rec), None)
        if other is not None and other < i:
            return
        failed.pop(other, None)
        failed[i] = HostCallbackError(first)

    @staticmethod
    def _segments(batch: list, failed: dict, stamped: bool = True, first_only: bool = False) -> list:
        """One `on_completed` report per run of consecutive items of one run (a batch is usually one)."""
        out = []
        lo, n = 0, len(batch)
        for hi in range(1, n + 1):
            if hi < n and batch[hi][0] is batch[lo][0]:
                continue
            rec = batch[lo][0]
            per_island: dict[int, list[int]] = {}
            published = []
            failure = None
            for i in range(lo, hi):
                _, st, _, outs = batch[i]
                counts = per_island.get(st.island)
                if counts is None:
                    counts = per_island[st.island] = [0, 0, 0]
                counts[0] += 1
                counts[1] += st.collectives
                counts[2] += st.host_callbacks
                if failure is None:
                    err = failed.get(0 if first_only else i)
                    if err is not None:
                        failure = (st, err)
                    for j, pos in st.publishes:
                        published.append((j, outs[pos]))
            events = [batch[i][2] for i in range(lo, hi)] if stamped else []
            out.append((rec, tuple((i, *counts) for i, counts in per_island.items()), published, failure, events))
            lo = hi
        return out

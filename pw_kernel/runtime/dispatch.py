"""Parallel asynchronous dispatch: one dispatcher thread, one completion watcher.

Shapes are static, so node k+1 can be dispatched as soon as node k has been
*dispatched*: JAX arrays are futures themselves, and XLA orders the work on
each device. The dispatcher only waits when an island has ``max_inflight``
nodes outstanding; the watcher blocks on outputs in dispatch order, records
each node's end, releases in-flight credit and resolves futures.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING

import jax

from .events import NodeEvent
from .lifecycle import FINAL

if TYPE_CHECKING:
    from .controller import Controller
    from .lifecycle import RunRecord

_BATCH = 256  # nodes per hand-off to the watcher
_FLUSH_NS = 1_000_000  # or sooner: no node waits more than 1 ms to be watched (the timeline's resolution)


class Dispatcher:
    """Executes steps and reports what happened; decides nothing about runs (the lifecycle does).

    Owns the two controller threads: the dispatcher asks the controller for
    work, runs up to a quantum of steps without the lock, and reports them
    dispatched; the watcher waits for them in dispatch order, stamps their
    times and reports them completed (or failed).
    """

    def __init__(self, controller: Controller, lock: threading.RLock):
        self.controller = controller
        self.cond = threading.Condition(lock)
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.last_end: dict[int, int] = {}  # device -> end of its last node (the watcher's)
        self.seq = 0
        self._stopping = False
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
        self.queue.put(None)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)

    # ------------------------------------------------------------ dispatcher
    def _dispatch_loop(self) -> None:
        c = self.controller
        while True:
            with self.cond:
                work = c.next_work()
                while work is None:
                    if self._stopping:
                        return
                    self._idle = True
                    self.graveyard.clear()
                    self.cond.wait()
                    self._idle = False
                    work = c.next_work()
                dead, self.graveyard = self.graveyard, []
            del dead  # free finished nodes' buffers here, between bursts (see _watch_loop)
            try:
                self._dispatch(work.rec, work.quantum)
            except BaseException as e:  # a bug of ours: fail the run, keep the controller alive
                with self.cond:
                    c.on_step_failed(work.rec, None, e)

    def _dispatch(self, rec: RunRecord, quantum: int) -> None:
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
        inflight = life.inflight  # read without the lock: only completions lower it meanwhile
        limit = life.max_inflight
        sent_on: dict[int, int] = {}  # island -> steps sent in this burst, not yet reported
        published: list = []
        k = start = rec.cursor
        n_steps = len(steps)
        cost = 0
        failed = None
        while k < n_steps and k - start < quantum:
            st = steps[k]
            island = st.island
            if inflight[island] + sent_on.get(island, 0) >= limit or rec.state in FINAL:
                break
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
            sent_on[island] = sent_on.get(island, 0) + 1
            batch.append((rec, st, ev, outs))
            k += 1
            cost += st.cost
            if len(batch) >= _BATCH or t >= flush_at:
                self._hand_over(rec, k, sent_on, published, cost, batch)
                batch, sent_on, published, cost = [], {}, [], 0
                flush_at = t + _FLUSH_NS
        if batch or k != rec.cursor:
            self._hand_over(rec, k, sent_on, published, cost, batch)
        if failed is not None:
            with self.cond:
                c.on_step_failed(rec, *failed)

    def _hand_over(self, rec: RunRecord, cursor: int, sent_on: dict, published: list, cost: int, batch: list) -> None:
        """Report steps dispatched, then give them to the watcher (in that order: credit is counted first)."""
        with self.cond:
            self.controller.on_dispatched(rec, cursor, tuple(sent_on.items()), published, cost)
        if batch:
            self.queue.put(batch)

    # --------------------------------------------------------------- watcher
    def _watch_loop(self) -> None:
        while True:
            batch = self.queue.get()
            if batch is None:
                return
            try:
                self._complete(batch)
            except BaseException as e:  # a bug of ours: fail those runs, keep watching
                with self.cond:
                    for rec, st, _, _ in batch:
                        self.controller.on_step_failed(rec, st, e)
            if self._idle:
                del batch
            else:
                self.graveyard.append(batch)

    def _complete(self, batch: list) -> None:
        """Wait for a batch of nodes in dispatch order, stamp their times, emit events, report per run.

        All per-node work here holds the GIL that the dispatcher needs, so it is
        kept to a few attribute writes: `is_ready` before blocking (tiny nodes are
        long done and need no GIL release), one error check for the whole batch.
        """
        c = self.controller
        log = c.events
        now = log.now
        last_end = self.last_end
        epoch = log.epoch
        for _, st, ev, outs in batch:
            for a in outs:
                if not a.is_ready():
                    try:
                        a.block_until_ready()
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
        emit = log.emit_node
        # One report per run of consecutive items (a batch is usually one run's steps).
        seg_start = 0
        n = len(batch)
        for i, (rec, st, ev, outs) in enumerate(batch):
            err = failed.get(i) if failed else None
            if err is not None:
                ev.error = f"{type(err).__name__}: {err}"
            rec.events.append(ev)
            emit(ev)
            if i + 1 == n or batch[i + 1][0] is not rec:
                self._report(batch, seg_start, i + 1, failed)
                seg_start = i + 1

    def _report(self, batch: list, lo: int, hi: int, failed: dict[int, BaseException]) -> None:
        rec = batch[lo][0]
        per_island: dict[int, int] = {}
        published = []
        failure = None
        for i in range(lo, hi):
            _, st, _, outs = batch[i]
            per_island[st.island] = per_island.get(st.island, 0) + 1
            if failure is None:
                err = failed.get(i) if failed else None
                if err is not None:
                    failure = (st, err)
                for j, pos in st.publishes:
                    published.append((j, outs[pos]))
        with self.cond:
            self.controller.on_completed(
                rec, tuple(per_island.items()), published, failure, [batch[i][2] for i in range(lo, hi)]
            )

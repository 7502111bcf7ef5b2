"""Parallel asynchronous dispatch: one dispatcher thread, one completion watcher.

Shapes are static, so node k+1 can be dispatched as soon as node k has been
*dispatched*: JAX arrays are futures themselves, and XLA orders the work on
each device. The dispatcher only waits when an island has ``max_inflight``
nodes outstanding; the watcher blocks on outputs in dispatch order, records
each node's end, releases in-flight credit and resolves futures.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from typing import TYPE_CHECKING

import jax

from .events import NodeEvent
from .run import FINAL

if TYPE_CHECKING:
    from .controller import Controller
    from .run import Run

_BATCH = 256  # nodes per hand-off to the watcher
_FLUSH_NS = 1_000_000  # or sooner: no node waits more than 1 ms to be watched (the timeline's resolution)


class Dispatcher:
    """Owns the two controller threads and the per-island in-flight counters."""

    def __init__(self, controller: Controller):
        self.controller = controller
        self.cond = threading.Condition(controller.lock)
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        n = max((i.id for i in controller.islands), default=-1) + 1
        # Single-writer counters: the dispatcher increments `dispatched`, the watcher `completed`.
        self.dispatched = [0] * n
        self.completed = [0] * n
        self.last_end: dict[int, int] = {}
        self.seq = 0
        self._stopping = False
        self._waiting_credit = False
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

    def add_islands(self, n: int) -> None:
        """Grow the per-island counters to ``n`` islands (lock held)."""
        while len(self.dispatched) < n:
            self.dispatched.append(0)
            self.completed.append(0)

    def inflight(self, island: int) -> int:
        return self.dispatched[island] - self.completed[island]

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
        while True:
            with self.cond:
                run = self._pick()
                while run is None:
                    if self._stopping:
                        return
                    self._idle = True
                    self.graveyard.clear()
                    self.cond.wait()
                    self._idle = False
                    run = self._pick()
                dead, self.graveyard = self.graveyard, []
            del dead  # free finished nodes' buffers here, between bursts (see _watch_loop)
            try:
                self._dispatch(run)
            except BaseException as e:  # a bug of ours: fail the run, keep the controller alive
                with self.cond:
                    self.controller._fail(run, None, e)

    def _pick(self) -> Run | None:
        """Among active runs, the policy's choice of those that can dispatch now (lock held)."""
        c = self.controller
        sched = c.scheduler
        limit = c.config.max_inflight
        runnable = []
        self._waiting_credit = False
        # FIFO takes the first runnable run: stop looking there (the queue can be thousands deep).
        first_wins = getattr(sched.policy, "first_runnable_wins", False)
        for run in list(sched.active):
            if run.state in FINAL:
                sched.remove(run)
                continue
            steps = run.plan.steps
            if run._cursor < len(steps):
                island = steps[run._cursor].island
                if self.dispatched[island] - self.completed[island] >= limit:
                    self._waiting_credit = True  # stays queued / paused until the watcher frees credit
                    continue
            if run.state == "queued" and not c._start(run):
                continue
            if run._cursor >= len(steps):
                sched.remove(run)
                if run.nodes_done == run.nodes_total and run.state == "running":
                    run._transition("done")
                continue
            runnable.append(run)
            if first_wins:
                break
        if not runnable:
            return None
        return sched.policy.pick(runnable)

    def _dispatch(self, run: Run) -> None:
        """Dispatch up to the policy's quantum of ``run``'s next steps; no lock held around JAX calls."""
        c = self.controller
        steps = run.plan.steps
        slots = run._slots
        futures = run.futures
        log = c.events
        now = log.now
        clock, epoch = time.perf_counter_ns, log.epoch
        # Hand work to the watcher in batches: one wake-up per batch instead of per node keeps
        # the two threads from trading the GIL on every tiny node.
        batch: list = []
        flush_at = now() + _FLUSH_NS
        dispatched = self.dispatched
        completed = self.completed
        limit = c.config.max_inflight
        quantum = c.scheduler.policy.quantum
        k = run._cursor
        n_steps = len(steps)
        sent = 0
        cost = 0
        if slots is None:  # cancelled or failed between pick and here
            return
        while k < n_steps and sent < quantum:
            st = steps[k]
            island = st.island
            if dispatched[island] - completed[island] >= limit or run.state in FINAL:
                break
            t = clock() - epoch
            try:
                ins = st.ins
                outs = st.call(slots[ins[0]]) if len(ins) == 1 else st.call(*[slots[i] for i in ins])
            except Exception as e:
                with self.cond:
                    c._fail(run, st, e)
                break
            if len(outs) == 1:
                slots[st.outs[0]] = outs[0]
            else:
                for i, o in zip(st.outs, outs):
                    slots[i] = o
            for i in st.frees:
                slots[i] = None
            for j, pos in st.publishes:
                futures[j]._array = outs[pos]
            self.seq += 1
            ev = NodeEvent(
                self.seq, run.id, run.name, run.tenant, st.name, st.kind, st.devices, island, st.src_island, t,
                st.nbytes, st.shapes,
            )
            dispatched[island] += 1
            run.nodes_dispatched += 1
            batch.append((run, st, ev, outs))
            k += 1
            sent += 1
            cost += st.cost
            if len(batch) >= _BATCH or t >= flush_at:
                self.queue.put(batch)
                batch = []
                flush_at = t + _FLUSH_NS
        if batch:
            self.queue.put(batch)
        run._cursor = k
        if sent:
            c.scheduler.policy.charge(run, cost)

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
                    for run, st, _, _ in batch:
                        self.controller._fail(run, st, e)
            if self._idle:
                del batch
            else:
                self.graveyard.append(batch)

    def _complete(self, batch: list) -> None:
        """Wait for a batch of nodes in dispatch order, stamp their times, resolve futures, emit events.

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
            for i, (run, _, _, outs) in enumerate(batch):
                if run.id not in seen:
                    try:
                        jax.block_until_ready(outs)
                    except Exception as e:
                        failed[i] = e
                        seen.add(run.id)
        completed = self.completed
        emit = log.emit_node
        for i, (run, st, ev, outs) in enumerate(batch):
            completed[st.island] += 1
            err = failed.get(i) if failed else None
            run.nodes_done += 1
            run.events.append(ev)
            if err is not None and run.state not in FINAL:
                ev.error = f"{type(err).__name__}: {err}"
                with self.cond:
                    c._fail(run, st, err)
            elif run.nodes_done == run.nodes_total and run._cursor == run.nodes_total and run.state == "running":
                # The last node: the run is done before anyone waiting on its futures wakes up.
                with self.cond:
                    if run.state == "running":
                        run._transition("done")
                        c.scheduler.remove(run)
            elif st.publishes and run.state == "running":
                futures = run.futures
                for j, pos in st.publishes:
                    fut = futures[j]
                    if not fut.done():
                        try:
                            fut.set_result(outs[pos])
                        except concurrent.futures.InvalidStateError:
                            pass  # cancelled meanwhile
            emit(ev)
        if self._waiting_credit:
            with self.cond:
                self.cond.notify()

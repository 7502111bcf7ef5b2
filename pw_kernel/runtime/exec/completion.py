"""Completion: steps the dispatcher sent are waited for in dispatch order, timed, and reported finished.

Two parties complete: the watcher thread, and a caller waiting for a future's
value, which claims the pending batches and completes them on its own thread
(no hand-off on the way to an interactive result). Whoever holds the
``completing`` token waits for the batch's outputs (no lock), stamps each
node's start and end, emits its node event, and reports the batch to the
controller in one locked call. Completion decides nothing about runs: the
lifecycle does, from these reports.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from ..errors import HostCallbackError
from .events import EventLog, IslandOutput, NodeEvent
from .interrupts import interrupts_deferred
from .port import Port

if TYPE_CHECKING:
    from ..core.runahead import RunAhead

BATCH = 256  # nodes per hand-off to the watcher
_POLL_S = 0.001  # a watcher with recent work looks for new batches this often (the timeline's resolution)
# ... and sleeps until woken after this long without any (a notify costs the caller). Short: a training
# loop of 80 ms steps behind the run-ahead bound hands over a batch per step, and a watcher polling in
# between woke ~80 times a step (2.3 ms of CPU and GIL a step on 2 cores, `benchmarks/training_loop.py`).
_POLL_IDLE_S = 0.02
# A lone call's batch is its caller's to complete (`Future.result` does at once); the watcher takes
# it only once it is this old, so an interactive loop wakes the watcher at most this often instead
# of every _POLL_S, and a run nobody waits on still ends (its state and events say so, its nodes'
# ends stamped at most this late) within this time.
_LONE_S = 0.005
_SPIN_NS = 20_000  # a waiter polls `is_ready` at least this long before sleeping: a tiny node is done sooner
_SPIN_MAX_NS = 2_000_000  # ... and up to twice its node's measured time, at most this long
_YIELD_NS = 50_000  # a spinning waiter lets other threads have the GIL this often


def wait_ready(value: Any, done: Callable[[], bool], spin_ns: int = _SPIN_NS) -> None:
    """Until ``value`` is computed (or ``done()``: someone else resolved it): spin, then short sleeps, so Ctrl-C works.

    ``block_until_ready`` would wait in C, where a KeyboardInterrupt cannot reach
    the waiting thread until the device is done. The shortest sleep costs ~60 µs
    here, and each doubles: a node of 100 µs waited on by sleeping was seen up
    to ~100 µs late. So a waiter spins for ``spin_ns`` first (its node's measured
    time, twice over), yielding the GIL every 50 µs.
    """
    wait = getattr(value, "wait", None)
    if wait is not None:
        # A remote island's value: its reply sets an event, so this sleeps on it instead of
        # polling (a poll would take the CPU and the GIL that the threads bringing the reply need).
        while not done():
            try:
                if wait(0.05):  # (in slices: Ctrl-C reaches the waiter)
                    return
            except Exception:
                return  # it failed: the caller raises the run's error
        return
    is_ready = getattr(value, "is_ready", None)
    if is_ready is None:
        return
    clock = time.perf_counter_ns
    now = clock()
    spin_until = now + spin_ns
    yield_at = now + _YIELD_NS
    delay = 1e-5
    while not done():
        try:
            if is_ready():
                return
        except Exception:
            return  # it failed: the run's error, naming the node, is raised by the caller
        now = clock()
        if now < spin_until:
            if now >= yield_at:
                time.sleep(0)  # another thread waiting for the GIL goes now
                yield_at = now + _YIELD_NS
            continue
        time.sleep(delay)
        delay = min(delay * 2, 1e-3)


def _donated(a: Any) -> bool:
    """Whether output ``a`` was donated since (a later run gave it to its computation, which XLA runs after
    this one): there is nothing of it to wait for, and it did not fail."""
    is_deleted = getattr(a, "is_deleted", None)
    return is_deleted is not None and is_deleted()


def _undonated(outs) -> list:
    """The outputs of a node that no later run donated (those are what waiting for it can ask)."""
    return [a for a in outs if not _donated(a)]


def _say(log, rec, st, outs: list) -> None:
    """Emit what a remote node printed or logged on its island as it ran, as `IslandOutput` events."""
    try:
        pieces = outs[0].said() if outs else ()
    except Exception:  # its island was lost: nothing came back
        return
    for stream, text in pieces:
        log.emit_output(IslandOutput(rec.id, st.name, st.island, stream, text))


def probe_of(args, outs) -> int:
    """The position of an output of a local call that its execution computed (not one of ``args`` returned
    as is), or -1. A node's computed outputs come from one execution and are ready together, and once
    they are its inputs (so what it forwarded) were: asking one answers for the node."""
    given = set(map(id, args))
    for k, o in enumerate(outs):
        if id(o) not in given and hasattr(o, "is_ready"):
            return k
    return -1


def _asked(st, outs) -> Any:
    """The outputs of a node whose readiness answers for it: its probe (`Executable.probe`), else all."""
    probe = st.exe.probe
    return outs if probe is None or probe < 0 or st.remote else (outs[probe],)


def _computed(batch: tuple) -> bool:
    """Whether every node of ``batch`` has computed (so completing it will not wait).

    A device runs its nodes in order: of consecutive nodes on the same devices only the last
    is asked.
    """
    items = batch[0]
    last = len(items) - 1
    for i, item in enumerate(items):
        if i < last and items[i + 1][1].devices is item[1].devices:
            continue
        for a in _asked(item[1], item[4]):
            try:
                if not a.is_ready():
                    return False
            except Exception:  # not a device array, a donated one, or failed (`_complete` reports it)
                pass
    return True


def _waiting_for(batch: tuple) -> Callable[[float], Any]:
    """The ``wait`` of the first output of ``batch`` not yet computed (a remote island's values have one)."""
    for item in batch[0]:
        for a in item[4]:
            try:
                if not a.is_ready() and hasattr(a, "wait"):
                    return a.wait
            except Exception:  # (failed, or donated: `_complete` reports it)
                pass
    return time.sleep


class Completion:
    """The batches dispatched and not yet completed, the watcher thread, and a waiting caller's shortcut.

    A batch is ``(items, per_island, published)``: consecutive steps of one run, each item
    ``(rec, step, seq, dispatch time, outputs)``, with what the dispatcher counted of them (the
    credit per island, the outputs they publish), which is what completing them reports unless
    one fails.
    """

    def __init__(self, port: Port, log: EventLog, gate: RunAhead):
        self.port = port
        self.lock = port.lock  # the controller's
        self.log = log
        self.gate = gate  # the run-ahead bound, told each node's measured time (`RunAhead.finished`)
        self._watch = threading.Condition(port.lock)
        self._pending: collections.deque = collections.deque()  # batches in dispatch order (under the lock)
        self._regular = 0  # ... of which the dispatcher thread's: the watcher takes those at once
        self._lone_since = 0  # when the oldest lone batch pending came (time.monotonic_ns)
        self._completing = False  # the token: the watcher thread, or a waiting caller, completes
        self._watcher_asleep = False  # waiting without a timeout: a new batch must wake it
        self._fast_poll = False  # waiting at most _POLL_S: a new batch of the dispatcher's needs no wake-up
        self._stopping = False
        self.last_end: dict[int, int] = {}  # device -> end of its last node
        self.bury: Callable[[list], None] = lambda batches: None  # the dispatcher frees buffers between bursts
        self.thread = threading.Thread(target=self._watch_loop, name="pw-watcher", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self._watch:
            self._stopping = True
            self._watch.notify_all()

    def add(self, batch: tuple, lone: bool = False) -> None:
        """A batch of dispatched steps, in dispatch order (lock held).

        ``lone``: a lone call's, dispatched on its caller's thread, which completes it when it
        waits; the watcher leaves it alone for _LONE_S.
        """
        if lone and not self.port.credit_wanted:
            if not self._pending:
                self._lone_since = time.monotonic_ns()
            self._pending.append(batch)
            if self._watcher_asleep:  # at most once per _POLL_IDLE_S of lone calls
                self._watch.notify()
            return
        self._pending.append(batch)
        self._regular += 1
        # A watcher polling at _POLL_S finds the batch in time; waking it per batch would make it
        # fight the submitting thread for the GIL. One asleep, or polling slowly (lone calls only,
        # lately), is woken.
        if not self._fast_poll or len(batch[0]) >= BATCH or self.port.credit_wanted:
            self._watch.notify()

    def claimable(self) -> bool:
        """Whether steps wait to be completed and no thread is completing them (lock held)."""
        return bool(self._pending) and not self._completing

    def computed(self) -> bool:
        """Whether steps wait to be completed, none is being completed, and all of them have computed."""
        with self.lock:
            pending = self._pending
            return bool(pending) and not self._completing and all(_computed(b) for b in pending)

    def complete_pending(self) -> None:
        """Complete what is pending on this thread, unless another thread is at it (no lock held)."""
        self._help()

    def complete_computed(self, batch: tuple, cursor: int, cost: int) -> bool:
        """Report a batch just dispatched, and complete it if it has computed already (lock held); False if not.

        A tiny node on the CPU has often run by the time its call returns: its dispatching
        thread completes it in the same lock hold, with no hand-off to a waiting caller or the
        watcher, and the call returns a resolved future. The lifecycle hears it as one `ran`
        report (dispatched up to ``cursor``, finished). Only when nothing dispatched earlier
        is pending or being completed, so nodes still complete in dispatch order. False: nothing
        was reported (the dispatcher reports it dispatched and hands it over).
        """
        if self._pending or self._completing or not _computed(batch):
            return False
        reports: list = []
        try:
            self._complete(batch, reports)
        except BaseException as e:  # a bug of ours: the run fails, the controller goes on
            reports += self._segments(batch[0], {0: e}, first_only=True)
        port = self.port
        if len(reports) == 1 and reports[0][3] is None:
            rec, per_island, published, _, events = reports[0]
            port.ran(rec, cursor, per_island, published, cost, events)
            return True
        items, per_island, published = batch  # a node failed: counted sent first, then its failure
        port.dispatched(items[0][0], cursor, per_island, published, cost)
        for report in reports:
            port.completed(*report)
        return True

    def complete_one(self, item: tuple):
        """A lone run's only step, just called on its submitting thread (lock held): its node event, if done.

        The commonest interactive call (one compiled function, computed inside its call) completed
        without the batch loop of `_complete`: timed, learnt from, its event emitted, and returned
        for the caller's one `ran` report. None (nothing done: the caller hands the step over) if it
        is still computing, failed, or steps dispatched earlier are still pending.
        """
        if self._pending or self._completing:
            return None
        rec, st, seq, dispatch, outs = item
        try:
            for a in _asked(st, outs):
                if not a.is_ready():
                    return None
                a.block_until_ready()  # ready: raises only if it failed (`_complete` names the node)
        except Exception:  # failed, or not a device array (a float0 gradient): the batch's way
            return None
        log = self.log
        end = time.perf_counter_ns() - log.epoch
        start = dispatch
        last_end = self.last_end
        devs = st.devices
        for d in devs:  # it started once dispatched and its devices were free (as in `_complete`)
            prev = last_end.get(d, 0)
            if prev > start:
                start = prev
        if end < start:
            end = start
        for d in devs:
            last_end[d] = end
        ev = NodeEvent(
            seq, rec.id, rec.name, rec.tenant, st.name, st.kind, devs, st.island, st.src_island, dispatch,
            st.nbytes, st.shapes,
        )
        ev.start = start
        ev.end = end
        self.gate.finished(st, end - start)
        log.emit_node(ev)
        return ev

    def wait_here(self, value: Any, done: Callable[[], bool]) -> None:
        """A caller waits for ``value`` (an output already dispatched): it completes the pending steps itself.

        A Ctrl-C while waiting comes out of here (the caller cancels the run).
        """
        if not self._help(value, done):  # a Ctrl-C held back in there comes out at its end
            wait_ready(value, done)  # another thread is completing: it resolves the caller's future

    def _help(self, value: Any = None, done: Callable[[], bool] | None = None) -> bool:
        """Complete what is pending on this thread if no other thread is completing (a waiter's shortcut).

        A thread about to wait for a future's ``value`` claims the pending batches
        first (so the watcher thread leaves them alone), waits for it (interruptibly;
        only for a lone node), then completes them itself: no hand-off between
        threads on the way to the result. A Ctrl-C in that wait gives the batches
        back to the watcher.
        """
        with self.lock:
            if self._completing or not self._pending:
                return False
            batches = self._take()
        if value is not None and len(batches) == 1 and len(batches[0][0]) == 1:
            # (Several nodes: each is stamped as it finishes; waiting for the last first would stamp
            # them all at once. A Ctrl-C then waits for them: at most the run-ahead bound.)
            cost = batches[0][0][0][1].exe.cost  # the node's measured time: spin about that long
            try:
                wait_ready(value, done, min(max(_SPIN_NS, 2 * cost), _SPIN_MAX_NS))
            except BaseException:
                with self.lock:
                    self._pending.extendleft(reversed(batches))
                    self._regular += len(batches)  # the watcher's now, at once
                    self._completing = False
                    self._watch.notify()
                raise
        with interrupts_deferred:  # a Ctrl-C in the middle would leave those nodes unreported
            self._finish(batches, done)
        return True

    def _take(self) -> list:
        """Claim every pending batch (lock held)."""
        self._completing = True
        batches = list(self._pending)
        self._pending.clear()
        self._regular = 0
        return batches

    def _finish(self, batches: list, done: Callable[[], bool] | None = None) -> None:
        """Wait for ``batches`` and time them (no lock), then report them all at once (one lock).

        Before waiting on a batch still computing, what is already finished is reported: a call's
        result is not held back by a slow node dispatched after it (the run-ahead bound's promise).
        A waiting caller whose value that resolved (``done``) leaves the rest to the watcher.
        Every reference this thread holds to reported batches' arrays is dropped (or handed to the
        dispatcher's graveyard) before the lock is released: a caller woken by a run that became
        final here, which then takes the lock (`Run.wait`), finds none of its arrays kept alive.
        """
        reports: list = []
        batch = None
        ahead: set[int] = set()  # batches completed before an earlier one (`_overtake`)
        for i, batch in enumerate(batches):
            if i in ahead:
                continue
            if batch[0][0][1].remote and not _computed(batch):  # (local batches finish in order: never asked)
                self._overtake(batches, i, ahead, reports)  # a remote batch: later ones may finish first
            if reports and not _computed(batch):
                if self._report_early(reports, batches, i, done, ahead):
                    return
            try:
                self._complete(batch, reports)
            except BaseException as e:  # a bug of ours: those runs fail, the watcher goes on
                reports += self._segments(batch[0], {0: e}, first_only=True)
        with self.lock:
            try:
                completed = self.port.completed
                for report in reports:
                    completed(*report)
            finally:
                report = batch = None  # the loops' last items too
                reports.clear()
                self.bury(batches)  # the dispatcher frees their buffers between its bursts, if it is busy
                batches.clear()  # the caller's list: it holds nothing from here on
                self._completing = False
                if self._pending:
                    self._watch.notify()

    def _report_early(self, reports: list, batches: list, i: int, done: Callable[[], bool] | None,
                      ahead: set[int] = frozenset()) -> bool:
        """Report what batches before ``i`` (and those in ``ahead``) finished; True if the caller's value is
        resolved and the others from ``i`` on went back to the watcher."""
        rest = [b for k, b in enumerate(batches[i:], i) if k not in ahead]
        with self.lock:
            try:
                completed = self.port.completed
                for report in reports:
                    completed(*report)
            except BaseException:
                self._pending.extendleft(reversed(rest))
                self._completing = False
                raise
            finally:
                report = None
                reports.clear()  # reported: a waiter woken now finds none of their arrays held here
            if done is None or not done():
                return False
            self.bury([b for k, b in enumerate(batches) if k < i or k in ahead])
            self._pending.extendleft(reversed(rest))
            self._completing = False
            self._watch.notify()
            return True

    def _overtake(self, batches: list, i: int, ahead: set[int], reports: list) -> bool:
        """Wait for remote batch ``i``, completing and reporting later batches of other runs that finish first.

        A device runs its nodes in order, so local batches finish in dispatch order; a remote island
        that schedules (the Pathways service: priorities, fair share between its clients) may finish a
        later run's nodes first, and their results must not wait behind this one. Batches handed over
        meanwhile are taken too (appended to ``batches``). False (nothing done) if its outputs cannot be waited on.
        """
        head = batches[i]
        if not any(hasattr(a, "wait") for a in head[0][0][4]):
            return False
        nap = 0.001
        while not _computed(head):
            with self.lock:
                if self._pending:  # (handed over after this thread took its batches)
                    batches.extend(self._pending)
                    self._pending.clear()
                    self._regular = 0
            blocked = {item[0].id for item in head[0]}  # (a run's own batches complete in order)
            for j in range(i + 1, len(batches)):
                if j in ahead:
                    continue
                b = batches[j]
                runs = {item[0].id for item in b[0]}
                if runs & blocked or not _computed(b):
                    blocked |= runs
                    continue
                try:
                    self._complete(b, reports)
                except BaseException as e:  # a bug of ours: those runs fail, the watcher goes on
                    reports += self._segments(b[0], {0: e}, first_only=True)
                ahead.add(j)
            if reports:
                with self.lock:
                    completed = self.port.completed
                    for report in reports:
                        completed(*report)
                    report = None
                    reports.clear()
                nap = 0.001
            # (wakes at once when the reply of an output not yet computed comes - a batch may span several
            # calls to the island, a transfer's and a burst's; otherwise looks again, less often)
            _waiting_for(head)(nap)
            nap = min(2 * nap, 0.016)
        return True

    def _watch_loop(self) -> None:
        quiet_since = None
        recent_regular = False  # the dispatcher thread's batches came lately: poll at _POLL_S
        while True:
            with self.lock:
                while True:
                    if self._stopping and not self._pending:
                        return
                    if self._pending and not self._completing:
                        if self._regular or self.port.credit_wanted:
                            recent_regular = True
                            break
                        # Only lone batches: their callers complete them, unless they wait too long.
                        left = self._lone_since + int(_LONE_S * 1e9) - time.monotonic_ns()
                        if left <= 0:
                            break
                        self._watch.wait(left / 1e9)
                        continue
                    now = time.monotonic()
                    if quiet_since is None:
                        quiet_since = now
                    if now - quiet_since > _POLL_IDLE_S:
                        # Long quiet: sleep until a batch arrives (the next one wakes us).
                        self._watcher_asleep = True
                        self._watch.wait()
                        self._watcher_asleep = False
                        quiet_since, recent_regular = None, False
                    else:
                        self._fast_poll = recent_regular
                        self._watch.wait(_POLL_S if recent_regular else _LONE_S)
                        self._fast_poll = False
                batches = self._take()
            quiet_since = None
            self._finish(batches)  # empties the list

    def _complete(self, batch: tuple, reports: list) -> None:
        """Wait for a batch of nodes in dispatch order, stamp their times, emit their events; add reports.

        All per-node work here holds the GIL that the dispatcher needs, so it is
        kept to a few attribute writes: `block_until_ready` on outputs long done
        is cheap, one error check for the whole batch, each NodeEvent made once
        with all its times, the events emitted together, and the dispatcher's
        counts reported as they are unless a node failed.
        """
        items, per_island, published = batch
        log = self.log
        clock = time.perf_counter_ns
        epoch = log.epoch
        last_end = self.last_end
        finished = self.gate.finished
        events: list[NodeEvent] = []
        guarded = []  # nodes whose host callbacks may have recorded an exception
        raised = False  # an output raised while waited for: the whole batch is checked below
        # Consecutive nodes on the same devices (one tuple per plan): the previous end is theirs.
        prev_devs: tuple | None = None
        prev_end = 0
        for i, (rec, st, seq, dispatch, outs) in enumerate(items):
            if st.host_callbacks:
                guarded.append(i)
            # a later node reuses these outputs' buffers (donation): it waits for this one; we cannot
            for a in () if st.outs_donated else _asked(st, outs):
                try:
                    a.block_until_ready()  # raises an asynchronous failure (is_ready would not)
                except AttributeError:
                    pass  # not a device array (a numpy float0 gradient of an integer input): ready
                except Exception:
                    if not _donated(a):
                        raised = True  # found and attributed below
            end = clock() - epoch
            start = dispatch
            if st.remote:  # ran on a remote island: its own clock, corrected
                try:
                    r_start, r_end = outs[0].timing()
                    start = max(start, r_start - epoch)
                    end = max(start, r_end - epoch)
                except Exception:
                    pass
                if st.host_callbacks:  # shipped as Python: what it printed there came with its reply
                    _say(log, rec, st, outs)
            devs = st.devices
            if devs is prev_devs:
                if prev_end > start:
                    start = prev_end
            else:
                if prev_devs is not None:
                    for d in prev_devs:
                        last_end[d] = prev_end
                for d in devs:
                    prev = last_end.get(d, 0)
                    if prev > start:
                        start = prev
                prev_devs = devs
            if end < start:
                end = start
            prev_end = end
            ev = NodeEvent(
                seq, rec.id, rec.name, rec.tenant, st.name, st.kind, devs, st.island, st.src_island, dispatch,
                st.nbytes, st.shapes,
            )
            ev.start = start
            ev.end = end
            events.append(ev)
            finished(st, end - start)  # node by node: a dispatcher waiting for room goes on before the batch ends
        if prev_devs is not None:
            for d in prev_devs:
                last_end[d] = prev_end
        failed: dict[int, BaseException] = {}  # batch index -> error of the first failing node of a run
        try:
            if raised:
                jax.block_until_ready([_undonated(item[4]) for item in items if not item[1].outs_donated])
        except Exception:  # an asynchronous failure: find the first failing node of each run
            seen: set[int] = set()
            for i, (rec, st, _, _, outs) in enumerate(items):
                if rec.id not in seen and not st.outs_donated:
                    try:
                        jax.block_until_ready(_undonated(outs))
                    except Exception as e:
                        failed[i] = e
                        seen.add(rec.id)
        for i in guarded:
            self._callback_failure(items, i, failed)
        for i, err in failed.items():
            events[i].error = f"{type(err).__name__}: {err}"
        log.emit_nodes(events)  # recorded on their run by the report (the lifecycle's `completed`)
        if failed:
            reports += self._segments(items, failed, events)
        else:
            reports.append((items[0][0], per_island, published, None, events))

    @staticmethod
    def _callback_failure(items: list, i: int, failed: dict) -> None:
        """Node ``i``'s guarded host callback raised, letting its computation finish: fail the node now
        (unless an earlier node of its run failed first: ``failed`` keeps one failure per run).

        Steps with host callbacks run one at a time per island, so everything the executable's
        callbacks recorded was raised by this node (once per device, perhaps: the first counts).
        """
        rec, st = items[i][0], items[i][1]
        errors = getattr(st.call, "callback_errors", None)
        if not errors:
            return
        first = errors[0]
        errors.clear()
        other = next((j for j in failed if items[j][0] is rec), None)
        if other is not None and other < i:
            return
        failed.pop(other, None)
        failed[i] = HostCallbackError(first)

    @staticmethod
    def _segments(items: list, failed: dict, events: list | None = None, first_only: bool = False) -> list:
        """One `on_completed` report per run of consecutive items of one run, counted afresh (a node failed).

        ``events``: the items' node events (None: a bug of ours stopped their stamping; none is recorded).
        """
        out = []
        lo, n = 0, len(items)
        for hi in range(1, n + 1):
            if hi < n and items[hi][0] is items[lo][0]:
                continue
            rec = items[lo][0]
            per_island: dict[int, list[int]] = {}
            published = []
            failure = None
            for i in range(lo, hi):
                _, st, _, _, outs = items[i]
                counts = per_island.get(st.island)
                if counts is None:
                    counts = per_island[st.island] = [0, 0, 0]
                counts[0] += 1
                counts[1] += st.exe.collectives
                counts[2] += st.host_callbacks
                if failure is None:
                    err = failed.get(0 if first_only else i)
                    if err is not None:
                        failure = (st, err)
                    for j, pos in st.publishes:
                        published.append((j, outs[pos]))
            evs = events[lo:hi] if events is not None else []
            out.append((rec, tuple((i, *counts) for i, counts in per_island.items()), published, failure, evs))
            lo = hi
        return out

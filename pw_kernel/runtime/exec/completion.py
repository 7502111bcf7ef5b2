"""Completion: steps the dispatcher sent are waited for in dispatch order, timed, and reported finished.

One function completes nodes, `Completion._complete`: it waits for a batch's outputs (no lock),
finds which failed, stamps each node's start and end, tells the run-ahead gate its device time,
emits its node event (`_stamp`, its helper), then reports the batches to the lifecycle in one lock
hold (`_report`: `completed`, or `ran` for a batch its dispatching thread completes); the lifecycle
decides the rest (futures settled, the run done or failed) and the controller applies it.
Completion decides nothing about runs. The triggers only decide *when*, and *which* batches,
then call it; each first claims what it completes, under the controller's lock:

=============================  ===========================================  =============  ==========================
thread                         when                                         completes      claim (lock held)
=============================  ===========================================  =============  ==========================
the watcher (`_watch_loop`)    a batch other than a lone call's pending,    every pending  `_claim`: the
                               or credit wanted; a lone call's batch once   batch          ``_completing`` token,
                               ``_LONE_S`` old                                             ``_pending`` emptied
a caller waiting on a future   its value's node was sent (on a lone node,   every pending  `_claim`
(`wait_here`)                  it waits for its value first)                batch
a streaming caller             all pending have computed (stream mode:      every pending  `_claim`
(`Controller.call`)            ``inline_wait_s`` > 0)                       batch
the dispatcher thread          after a burst, all pending have computed;    every pending  `_claim`
(`complete_pending`)           or every run waits for credit                batch
a lone call's dispatching      its batch computed inside its call (a        that batch:    the lock, held from its
thread (`complete_computed`)   submitting thread: `Controller._run_lone`,   never          dispatch to its report;
                               `Dispatcher.dispatch_inline`)                pending        nothing pending, no token
=============================  ===========================================  =============  ==========================

Exactly once: a batch is in ``_pending`` (under the lock) until one thread claims it, taking the
token with it; only the token's holder completes (waiting on a remote island's batch, it also takes
those handed over meanwhile: `_overtake`), and it gives back under the lock what it leaves (a
Ctrl-C while waiting, a waiter whose value is resolved, a waiter on a remote lone node's value
when another batch is handed over before it comes). A batch completed on its dispatching
thread is never pending, and is completed only when nothing is pending or claimed, so nodes still
complete in dispatch order. Nothing else stamps a node, emits its event or reports it finished.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..donation import failure_of
from ..errors import HostCallbackError
from .events import EventLog, IslandOutput, NodeEvent
from .interrupts import interrupts_deferred
from .port import Port

if TYPE_CHECKING:
    from ..core.records import RunRecord
    from ..core.runahead import RunAhead
    from .plan import Step

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


class Item(NamedTuple):
    """A node the dispatcher sent: what completing it needs."""

    rec: RunRecord
    step: Step
    seq: int  # its node event's number
    dispatch: int  # when it was sent, ns since the event log's epoch
    outs: Sequence[Any]  # its outputs (device arrays, or a remote island's)


@dataclasses.dataclass(slots=True)
class Batch:
    """Consecutive steps of one run sent together, and what the dispatcher counted of them (`Port.dispatched`).

    Completing them reports these counts as they are, unless a node failed.
    """

    rec: RunRecord
    items: list[Item]
    cursor: int  # the run's next step once they are sent
    per_island: tuple[tuple[int, int, int, int], ...]  # (island, steps, with collectives, with host callbacks)
    published: list[tuple[int, Any]]  # (output index, value) of the run's outputs they make
    cost: int  # their estimated device time, ns (charged to the run's tenant)


@dataclasses.dataclass(slots=True)
class Report:
    """What completing one run's consecutive nodes tells the lifecycle (`Port.completed`)."""

    rec: RunRecord
    per_island: tuple[tuple[int, int, int, int], ...]  # as `Batch.per_island`, of these nodes
    published: list[tuple[int, Any]]
    failure: tuple[Step | None, BaseException] | None  # the first node that failed, with its error
    events: list[NodeEvent]  # their node events, emitted


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
    """The outputs of a node whose readiness answers for it: its probe (`Executable.probe`), a remote
    node's first (one reply answers for all its outputs: they share its call's ticket), else all."""
    if st.remote:
        return outs[:1]
    probe = st.exe.probe
    return outs if probe is None or probe < 0 else (outs[probe],)


def _computed(batch: Batch, clean: bool = False) -> bool:
    """Whether every node of ``batch`` has computed (so completing it will not wait); ``clean``: and none failed.

    A device runs its nodes in order: of consecutive nodes on the same devices only the last
    is asked (walking back, the others have computed once it has). A failed output has computed.
    ``clean`` (`complete_computed`, before it does anything) does `_stamp`'s wait ahead (``waited``).
    """
    later = None  # the devices of the node after this one, found computed
    for _, st, _, _, outs in reversed(batch.items):
        asked = None
        if st.devices is not later:
            later = st.devices
            asked = _asked(st, outs)
            for a in asked:
                try:
                    if not a.is_ready():
                        return False
                except Exception:  # not a device array, a donated one, or failed (`_stamp` reports it)
                    pass
        if clean and not st.outs_donated:
            if failure_of(asked if asked is not None else _asked(st, outs)) is not None:
                return False  # (computed: the wait raises only if it failed)
    return True


def _waiting_for(batch: Batch) -> Callable[[float], Any]:
    """The ``wait`` of the first output of ``batch`` not yet computed (a remote island's values have one)."""
    for item in batch.items:
        for a in item.outs:
            try:
                if not a.is_ready() and hasattr(a, "wait"):
                    return a.wait
            except Exception:  # (failed, or donated: `_stamp` reports it)
                pass
    return time.sleep


class Completion:
    """The batches dispatched and not yet completed, the one function that completes them, and its triggers.

    See the module's docstring: who may complete what, and the claim that makes it once.
    """

    def __init__(self, port: Port, log: EventLog, gate: RunAhead):
        self.port = port
        self.lock = port.lock  # the controller's
        self.log = log
        self.gate = gate  # the run-ahead bound, told each node's measured time (`RunAhead.finished`)
        self._watch = threading.Condition(port.lock)
        self._pending: collections.deque[Batch] = collections.deque()  # in dispatch order (under the lock)
        self._regular = 0  # ... of which the dispatcher thread's: the watcher takes those at once
        self._lone_since = 0  # when the oldest lone batch pending came (time.monotonic_ns)
        self._completing = False  # the token: held by the one thread completing claimed batches
        self._watcher_asleep = False  # waiting without a timeout: a new batch must wake it
        self._fast_poll = False  # waiting at most _POLL_S: a new batch of the dispatcher's needs no wake-up
        self._stopping = False
        self.last_end: dict[int, int] = {}  # device -> end of its last node
        self.bury: Callable[[list], None] = lambda batches: None  # the dispatcher frees buffers between bursts
        self.thread = threading.Thread(target=port.keep_going, args=("watcher", self._watch_loop), name="pw-watcher",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self._watch:
            self._stopping = True
            self._watch.notify_all()

    def add(self, batch: Batch, lone: bool = False) -> None:
        """A batch of dispatched steps, in dispatch order (lock held; reported dispatched, or sent, first).

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
        if not self._fast_poll or len(batch.items) >= BATCH or self.port.credit_wanted:
            self._watch.notify()

    def claimable(self) -> bool:
        """Whether steps wait to be completed and no thread is completing them (lock held)."""
        return bool(self._pending) and not self._completing

    def computed(self) -> bool:
        """Whether steps wait to be completed, none is being completed, and all of them have computed."""
        with self.lock:
            pending = self._pending
            return bool(pending) and not self._completing and all(_computed(b) for b in pending)

    # ------------------------------------------------------------- the triggers: when, and which batches
    def complete_pending(self) -> None:
        """Complete what is pending on this thread, unless another thread is at it (no lock held).

        A streaming caller (`Controller.call`) and the dispatcher thread call this when what is
        pending has computed, or when every run waits for credit only completions give back.
        """
        with self.lock:
            batches = self._claim()
        if batches:
            with interrupts_deferred:  # a Ctrl-C in the middle would leave those nodes unreported
                self._complete(batches)

    def wait_here(self, value: Any, done: Callable[[], bool]) -> None:
        """A caller waits for ``value`` (an output already dispatched): it completes the pending steps itself.

        It claims the pending batches first (so the watcher thread leaves them alone), waits
        for its value (interruptibly; only for a lone node), then completes them: no hand-off
        between threads on the way to the result. A Ctrl-C in that wait gives the batches back
        to the watcher and comes out of here (the caller cancels the run). Another thread
        completing: this one waits for the value, which that thread resolves.
        """
        with self.lock:
            batches = self._claim()
        if not batches:
            wait_ready(value, done)
            return
        if len(batches) == 1 and len(batches[0].items) == 1:
            # (Several nodes: each is stamped as it finishes; waiting for the last first would stamp
            # them all at once. A Ctrl-C then waits for them: at most the run-ahead bound.)
            cost = batches[0].items[0].step.exe.cost  # the node's measured time: spin about that long
            remote = hasattr(value, "wait")
            # (A remote island's value may take long, or never come before its host is declared dead, while
            # another run's batch, sent meanwhile to another island, finishes: holding the token, this thread
            # would hold that one's completion back. It hands both to the watcher then, which completes each as
            # it finishes, and waits on.)
            until = (lambda: done() or bool(self._pending)) if remote else done
            try:
                wait_ready(value, until, min(max(_SPIN_NS, 2 * cost), _SPIN_MAX_NS))
            except BaseException:
                self._hand_over(batches)
                raise
            if remote and not done() and self._pending and not value.is_ready():
                self._hand_over(batches)
                wait_ready(value, done)
                return
        with interrupts_deferred:  # a Ctrl-C in the middle would leave those nodes unreported
            self._complete(batches, done)

    def _hand_over(self, batches: list[Batch]) -> None:
        """Give claimed ``batches`` and the token to the watcher, to complete at once."""
        with self.lock:
            self._give_back(batches)
            self._regular += len(batches)

    def complete_computed(self, batch: Batch, first: Callable[[list], None] | None = None) -> bool:
        """On the thread that just sent ``batch`` (lock held): complete it if it computed inside its call; False if not.

        A tiny node on the CPU has often run by the time its call returns: completed in the same
        lock hold, with no hand-off, the call returns a resolved future. The lifecycle hears one
        `ran` report (from "new" for a lone call not yet started: `Controller._run_lone`), after
        ``first`` hears the outputs. Only when nothing sent earlier is pending or claimed (nodes
        complete in dispatch order) and it did not fail (its completer reports that, later).
        False: nothing was done (the caller reports it dispatched and hands it over).
        """
        if self._pending or self._completing or not _computed(batch, clean=True):
            return False
        self._complete([batch], ran=True, first=first)  # (no token: the lock is held until it is reported)
        return True

    def _claim(self) -> list[Batch]:
        """Claim every pending batch, unless another thread holds the token (lock held): what this thread completes."""
        if self._completing or not self._pending:
            return []
        self._completing = True
        batches = list(self._pending)
        self._pending.clear()
        self._regular = 0
        return batches

    def _give_back(self, rest: list[Batch]) -> None:
        """Return claimed batches not completed to the front of the queue, and the token (lock held)."""
        self._pending.extendleft(reversed(rest))
        self._completing = False
        self._watch.notify()

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
                batches = self._claim()
            quiet_since = None
            self._complete(batches)  # empties the list

    # ------------------------------------------------------------- the one completer
    def _complete(self, batches: list[Batch], done: Callable[[], bool] | None = None, ran: bool = False,
                  first: Callable[[list], None] | None = None) -> None:
        """Complete claimed ``batches``: wait for them and time them (no lock), then report them all at once (one lock).

        The one place a node is completed (see the module's docstring); the caller holds the
        token. Before waiting on a batch still computing, what is already finished is reported:
        a call's result is not held back by a slow node dispatched after it (the run-ahead
        bound's promise). A waiting caller whose value that resolved (``done``) leaves the rest
        to the watcher. ``ran``: ``batches`` is the one batch this thread just sent, computed
        (`complete_computed`, lock held): reported `ran`, ``first`` hearing its outputs before.
        Every reference this thread holds to reported batches' arrays is dropped (or handed to
        the dispatcher's graveyard, itself emptied here once no run is in flight) before the lock is
        released: a caller woken by a run that became final here (`RunLock`) finds none of its arrays
        kept alive.
        """
        reports: list[Report] = []
        if ran:  # one batch, found computed without an error, the lock held: nothing to wait for or claim
            batch = batches[0]
            self._stamp(batch, reports, waited=True)  # (a bug of ours raises: its dispatching thread fails the run)
            self._report(reports, batch, first)
            return
        batch = None
        ahead: set[int] = set()  # batches completed before an earlier one (`_overtake`)
        for i, batch in enumerate(batches):
            if i in ahead:
                continue
            if batch.items[0].step.remote and not _computed(batch):  # (local batches finish in order: never asked)
                self._overtake(batches, i, ahead, reports)  # a remote batch: later ones may finish first
            if reports and not _computed(batch):
                if self._report_early(reports, batches, i, done, ahead):
                    return
            try:
                self._stamp(batch, reports)
            except BaseException as e:  # a bug of ours: those runs fail, the completer goes on
                reports += self._segments(batch.items, {0: e}, first_only=True)
        with self.lock:
            try:
                self._report(reports)
            finally:
                batch = None  # the loop's last item too
                reports.clear()
                self.bury(batches)  # the dispatcher frees their buffers between its bursts, if it is busy
                batches.clear()  # the caller's list: it holds nothing from here on
                self._completing = False
                if self._pending:
                    self._watch.notify()

    def _report(self, reports: list[Report], ran: Batch | None = None, first: Callable[[list], None] | None = None,
                ) -> None:
        """Tell the lifecycle what completed (lock held): the one place completion reports (`_complete`'s).

        ``ran``: the batch the reports are of, just sent by this thread, not reported dispatched:
        one `ran` report if it did not fail, else its `dispatched`, then the failure.
        """
        port = self.port
        if ran is not None:
            if len(reports) == 1 and reports[0].failure is None:
                events = reports[0].events
                if first is not None:
                    first(ran.published)
                port.ran(ran.rec, ran.cursor, ran.per_island, ran.published, ran.cost, events)
                return
            port.dispatched(ran.rec, ran.cursor, ran.per_island, ran.published, ran.cost)
        completed = port.completed
        for r in reports:
            completed(r.rec, r.per_island, r.published, r.failure, r.events)

    def _report_early(self, reports: list[Report], batches: list[Batch], i: int, done: Callable[[], bool] | None,
                      ahead: set[int] = frozenset()) -> bool:
        """Report what batches before ``i`` (and those in ``ahead``) finished; True if the caller's value is
        resolved and the others from ``i`` on went back to the watcher."""
        rest = [b for k, b in enumerate(batches[i:], i) if k not in ahead]
        with self.lock:
            try:
                self._report(reports)
            except BaseException:
                self._give_back(rest)
                raise
            finally:
                reports.clear()  # reported: a waiter woken now finds none of their arrays held here
            if done is None or not done():
                return False
            self.bury([b for k, b in enumerate(batches) if k < i or k in ahead])
            self._give_back(rest)
            return True

    def _overtake(self, batches: list[Batch], i: int, ahead: set[int], reports: list[Report]) -> bool:
        """Wait for remote batch ``i``, completing and reporting later batches of other runs that finish first.

        A device runs its nodes in order, so local batches finish in dispatch order; a remote island
        that schedules (the Pathways service: priorities, fair share between its clients) may finish a
        later run's nodes first, and their results must not wait behind this one. Batches handed over
        meanwhile are claimed too (appended to ``batches``). False (nothing done) if its outputs cannot be waited on.
        """
        head = batches[i]
        if not any(hasattr(a, "wait") for a in head.items[0].outs):
            return False
        nap = 0.001
        while not _computed(head):
            with self.lock:
                if self._pending:  # (handed over after this thread claimed its batches: the token is still ours)
                    batches.extend(self._pending)
                    self._pending.clear()
                    self._regular = 0
            blocked = {item.rec.id for item in head.items}  # (a run's own batches complete in order)
            for j in range(i + 1, len(batches)):
                if j in ahead:
                    continue
                b = batches[j]
                runs = {item.rec.id for item in b.items}
                if runs & blocked or not _computed(b):
                    blocked |= runs
                    continue
                try:
                    self._stamp(b, reports)
                except BaseException as e:  # a bug of ours: those runs fail, the watcher goes on
                    reports += self._segments(b.items, {0: e}, first_only=True)
                ahead.add(j)
            if reports:
                with self.lock:
                    try:
                        self._report(reports)
                    finally:
                        reports.clear()
                nap = 0.001
            # (wakes at once when the reply of an output not yet computed comes - a batch may span several
            # calls to the island, a transfer's and a burst's; otherwise looks again, less often)
            _waiting_for(head)(nap)
            nap = min(2 * nap, 0.016)
        return True

    def _stamp(self, batch: Batch, reports: list[Report], waited: bool = False) -> None:
        """`_complete`'s part for one batch: wait for its nodes in dispatch order, stamp their times, emit their
        events, and add its reports. ``waited``: what it asks of them was found computed without an error.

        All per-node work here holds the GIL that the dispatcher needs, so it is
        kept to a few attribute writes: `block_until_ready` on outputs long done
        is cheap, one error check for the whole batch, each NodeEvent made once
        with all its times, the events emitted together, and the dispatcher's
        counts reported as they are unless a node failed.
        """
        items = batch.items
        log = self.log
        clock = time.perf_counter_ns
        epoch = log.epoch
        last_end = self.last_end
        finished = self.gate.finished
        events: list[NodeEvent] = []
        guarded: list[int] = []  # nodes whose host callbacks may have recorded an exception
        raised = False  # an output raised while waited for: the whole batch is checked below
        # Consecutive nodes on the same devices (one tuple per plan): the previous end is theirs.
        prev_devs: tuple | None = None
        prev_end = 0
        for rec, st, seq, dispatch, outs in items:
            if st.host_callbacks:
                guarded.append(len(events))  # (its index)
            # a later node reuses these outputs' buffers (donation): it waits for this one; we cannot
            # (`block_until_ready` raises an asynchronous failure, `is_ready` would not)
            if not (waited or st.outs_donated) and failure_of(_asked(st, outs)) is not None:
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
        failed = self._failures(items, raised, guarded, events) if raised or guarded else None
        log.emit_nodes(events)  # recorded on their run by the report (the lifecycle's `completed`)
        if failed:
            reports += self._segments(items, failed, events)
        else:
            reports.append(Report(batch.rec, batch.per_island, batch.published, None, events))

    def _failures(self, items: list[Item], raised: bool, guarded: list[int], events: list[NodeEvent]) -> dict:
        """Batch index -> error of the first failing node of each run that failed, which its event now says.

        ``raised``: an output raised when waited for; ``guarded``: nodes whose host callbacks may have
        recorded an exception.
        """
        failed: dict[int, BaseException] = {}
        if raised:  # an asynchronous failure: find the first failing node of each run
            seen: set[int] = set()
            for i, (rec, st, _, _, outs) in enumerate(items):
                if rec.id not in seen and not st.outs_donated:
                    error = failure_of(outs)
                    if error is not None:
                        failed[i] = error
                        seen.add(rec.id)
        for i in guarded:
            self._callback_failure(items, i, failed)
        for i, err in failed.items():
            events[i].error = f"{type(err).__name__}: {err}"
        return failed

    @staticmethod
    def _callback_failure(items: list[Item], i: int, failed: dict) -> None:
        """Node ``i``'s guarded host callback raised, letting its computation finish: fail the node now
        (unless an earlier node of its run failed first: ``failed`` keeps one failure per run).

        Steps with host callbacks run one at a time per island, so everything the executable's
        callbacks recorded was raised by this node (once per device, perhaps: the first counts).
        """
        rec, st = items[i].rec, items[i].step
        errors = getattr(st.call, "callback_errors", None)
        if not errors:
            return
        first = errors[0]
        errors.clear()
        other = next((j for j in failed if items[j].rec is rec), None)
        if other is not None and other < i:
            return
        failed.pop(other, None)
        failed[i] = HostCallbackError(first)

    @staticmethod
    def _segments(items: list[Item], failed: dict, events: list | None = None, first_only: bool = False,
                  ) -> list[Report]:
        """One report per run of consecutive items of one run, counted afresh (a node failed).

        ``events``: the items' node events (None: a bug of ours stopped their stamping; none is recorded).
        """
        out = []
        lo, n = 0, len(items)
        for hi in range(1, n + 1):
            if hi < n and items[hi].rec is items[lo].rec:
                continue
            rec = items[lo].rec
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
            out.append(Report(rec, tuple((i, *counts) for i, counts in per_island.items()), published, failure, evs))
            lo = hi
        return out

"""Run: the public handle of one submission of a program (its state lives in the lifecycle)."""

from __future__ import annotations

import operator
import threading
import time
from itertools import count, repeat
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import jax

from .core.records import FINAL, RunRecord
from .core.story import Story
from .errors import PathwaysError, TimeoutError
from .futures import Future, check_timeout, get

if TYPE_CHECKING:
    from .trace.graph import ProgramGraph


def _from_record(path: str, doc: str) -> property:
    """A `Run` attribute that reads ``path`` of its `RunRecord` (e.g. ``"plan.mode"``)."""
    return property(operator.attrgetter("_rec." + path), doc=doc)
#: Orders the threads that start waiting on runs (rare: one lock for all, none made per call).
_WAITERS = threading.Lock()


class RunLock:
    """The controller's lock: re-entrant, and a run made final under it wakes its waiters once it is let go.

    A thread that reports steps finished holds their arrays until it leaves the lock
    (`Completion._complete` drops them inside it): a waiter woken earlier could find them still
    alive. So `Controller._retire` asks `wake_later`, and the outermost release (or a
    `threading.Condition` wait on it, which releases it wholly) wakes them.

    Example::

        lock = RunLock()
        with lock:
            lock.pending.append(run)  # `run.wake()` once this thread no longer holds the lock
    """

    __slots__ = ("_lock", "acquire", "_is_owned", "_acquire_restore", "pending")

    def __init__(self):
        lock = threading.RLock()
        self._lock = lock
        self.acquire = lock.acquire
        self._is_owned = lock._is_owned  # (what threading.Condition asks of a lock)
        self._acquire_restore = lock._acquire_restore
        #: runs made final under the lock, whose waiters wake once its outermost holder lets go (lock held)
        self.pending: list[Run] = []

    def release(self) -> None:
        self._lock.release()
        if self.pending and not self._is_owned():
            self._wake()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc) -> None:
        self._lock.release()
        if self.pending and not self._is_owned():
            self._wake()

    def _release_save(self):
        state = self._lock._release_save()
        if self.pending:
            self._wake()
        return state

    def _wake(self) -> None:
        runs, self.pending = self.pending, []  # (a holder appending meanwhile appends to one of the two)
        for run in runs:
            run.wake()


class RunLink(NamedTuple):
    """What a `Run` may ask of the controller that made it: one per controller, shared by its runs."""

    cancel: Callable[[Run], bool]  # cancel a run (a transition, under the controller's lock)
    complete_here: Callable[[Any, Callable[[], bool]], None]  # wait for a dispatched value, completing here
    story: Callable[[int], Story]  # the run's transitions, from the lifecycle's log
    keep_outputs: int  # how many finished runs' outputs the controller keeps (for an error message)


class Run:
    """One execution of a program: its state, progress, outputs and node events.

    Example::

        run = pw.controller().runs[-1]
        run.state, run.progress         # ('running', (3, 8))
        run.wait(timeout=10)            # block until final
        run.outputs                     # the futures (same tree the program returned)
    """

    # Slots: the controller remembers thousands of finished runs (Config.keep_runs), and every object
    # a remembered run keeps is walked by each full garbage collection.
    __slots__ = ("_link", "_rec", "graph", "_retired", "error_seen", "_final", "_futures", "__weakref__")

    def __init__(self, link: RunLink, rec: RunRecord, graph: ProgramGraph):
        self._link = link
        self._rec = rec  # (id, name, plan, tenant... are read from it: one is made per call)
        self.graph = graph
        self._retired = False  # final, futures set and event emitted (see `retire`)
        #: Whether the user has read this run's error (``fut.exception()``, or ``fut.result()`` raising
        #: it): the kernel's failure report then has nothing to add.
        self.error_seen = False
        self._final: threading.Event | None = None  # made only if someone waits before that
        # Held while the run is in flight and while the controller keeps it among its most recent
        # (Config.keep_outputs); after that, the futures (and the device buffers they hold) live as
        # long as the user keeps them, and the run remembers none of them (`release_outputs`).
        values = graph.output_values
        futures = list(map(Future, repeat(self, len(values)), count(), values, repeat(rec, len(values))))
        self._futures: list[Future] | None = futures
        if not rec.cells:
            rec.cells = futures  # a future is its output's cell: one object per output

    # ------------------------------------------------------ from the record
    @property
    def record(self) -> RunRecord:
        """What the lifecycle knows of this run (read it; only the lifecycle's transitions change it)."""
        return self._rec

    # (read-only, and read from the record: the lifecycle changes them, nobody else)
    id = _from_record("id", "The run's id: runs are numbered in submission order.")
    name = _from_record("name", "The run's name (the program's, or the one `submit` was given).")
    plan = _from_record("plan", "The `Plan` it runs (its steps: fused or chained).")
    mode = _from_record("plan.mode", "'fused' or 'chained': how its plan runs the program.")
    tenant = _from_record("tenant", "The tenant it runs for (fair share and the timeline group by it).")
    weight = _from_record("weight", "Its tenant's weight under `pw.FairShare`.")
    priority = _from_record("priority", "Its priority under `pw.Priority` (higher first).")
    state = _from_record("state", "'queued', 'running', 'done', 'failed' or 'cancelled'.")
    error = _from_record("error", "The error it failed with (a cancelled run's CancelledError), else None.")
    nodes_total = _from_record("total", "How many steps it has (a fused plan's whole program is one).")
    nodes_dispatched = _from_record("dispatched", "Steps sent to the devices so far.")
    nodes_done = _from_record("done", "Steps finished on the devices so far.")
    submitted_at = _from_record("submitted_at", "`time.time()` when it was submitted.")
    started_at = _from_record("started_at", "`time.time()` when it started (inputs in, memory reserved), else None.")
    finished_at = _from_record("finished_at", "`time.time()` when it became final, else None.")
    events = _from_record("events", "This run's node events, in completion order.")
    waiting_for = _from_record("waiting_for", "Why it is not dispatching: None, 'input', 'memory' or 'credit'.")
    source_map = _from_record("source_map", "Node (or step) name -> where it came from (a cell line, say).")

    @property
    def nodes_on_devices(self) -> int:
        """Nodes dispatched and not finished: after a cancel, what the devices still run (XLA runs what it got)."""
        rec = self._rec
        return rec.dispatched - rec.done

    @property
    def state_text(self) -> str:
        """The state as a person reads it: a cancelled run whose dispatched nodes still run says so.

        Example::

            run.cancel()
            run.state_text      # 'cancelling: 2 nodes on the devices', then 'cancelled'
        """
        return describe_state(self._rec.state, self.nodes_on_devices)

    @property
    def compile_time(self) -> float:
        """Seconds spent compiling this run's executables (non-zero on a program's first call)."""
        return self._rec.compile_ns / 1e9

    @property
    def compiling(self) -> str | None:
        """The step whose executable is being compiled right now (a program's first call), else None.

        Example::

            run = step.submit(x)
            run.compiling        # 'step' while XLA compiles it, None once it runs
        """
        return self._rec.compiling

    # ----------------------------------------------------------------- public
    @property
    def futures(self) -> list[Future]:
        """The output futures, flat (empty once the run is final and no longer among the most recent)."""
        return self._futures if self._futures is not None else []

    @property
    def outputs(self):
        """The output futures in the tree the program returned.

        Raises PathwaysError once the run is final and no longer among the controller's most
        recent (`Config.keep_outputs`): a finished run is then a summary, and its outputs are
        the futures its call returned (as long as they are kept).
        """
        futures = self._futures
        if futures is None:
            raise PathwaysError(
                f"run {self.id} ({self.name!r}): its outputs were released (the controller keeps only the last "
                f"{self._link.keep_outputs} finished runs' outputs). Keep the futures the call returned, "
                f"e.g. `y = step(x)`."
            )
        return self.tree(futures)

    def tree(self, futures: list[Future]):
        """``futures`` (this run's, flat) in the tree the program returned."""
        graph = self.graph
        if graph.one_leaf:  # a function returning one array (most calls): no unflattening
            return futures[0]
        return jax.tree_util.tree_unflatten(graph.out_tree, futures)

    def story(self) -> Story:
        """The run's transitions in order: time, from -> to, the event, its stimulus and thread.

        Example::

            run = f.submit(x); run.wait()
            print(run.story())           # queued -> running (start), ..., running -> done (completed)
            run.story().states()         # ['new', 'queued', 'running', 'done'] (as far as the log keeps)
        """
        story = self._link.story(self._rec.id)
        return Story(story, self._rec.id, self._rec.name)

    @property
    def progress(self) -> tuple[int, int]:
        """(nodes done, nodes total)."""
        return self._rec.done, self._rec.total

    @property
    def elapsed(self) -> float:
        """Seconds since submission (until finish when final)."""
        rec = self._rec
        end = rec.finished_at if rec.finished_at is not None else time.time()
        return end - rec.submitted_at

    @property
    def throughput(self) -> float | None:
        """Nodes finished per second since the run started, compiling left out (None until one has finished).

        Example::

            run.throughput      # 84.2
        """
        running = self._running_s()
        return None if running is None else self._rec.done / running

    @property
    def time_left(self) -> float | None:
        """Seconds until the run is done, estimated: 0.0 once final, None until a node has finished.

        The time its finished nodes took, scaled to the rest by each node's measured device
        time (a run's nodes are seldom alike: a pipeline's backward takes twice its forward),
        by their count where a node has not run yet. Compiling is left out.

        Example::

            run.time_left       # 12.5: about 12 s more
        """
        rec = self._rec
        if rec.state in FINAL:
            return 0.0
        running = self._running_s()
        if running is None or rec.total == 0:
            return None
        steps = rec.plan.steps
        costs = [st.exe.cost if st.exe.measured else 0 for st in steps]
        whole = sum(costs)
        if all(costs) and whole > 0:
            part = sum(costs[: rec.done]) / whole  # (steps finish in about their plan order)
        else:
            part = rec.done / rec.total
        return running * (1.0 - part) / part if part > 0 else None

    def _running_s(self) -> float | None:
        """Seconds this run has run, compiling left out; None before its first node finished."""
        rec = self._rec
        if rec.started_at is None or rec.done == 0:
            return None
        end = rec.finished_at if rec.finished_at is not None else time.time()
        running = end - rec.started_at - rec.compile_ns / 1e9
        return running if running > 0 else None

    def done(self) -> bool:
        return self._rec.state in FINAL

    def wait(self, timeout: float | None = None) -> Run:
        """Block until the run is done, failed or cancelled; Ctrl-C cancels it.

        Returns the run; does not raise the run's error (see `Run.result`).
        """
        timeout = check_timeout(timeout, "Run.wait")
        try:
            if not self._wait_retired(timeout):
                raise TimeoutError(
                    f"`Run.wait(timeout={timeout})`: run {self.id} ({self.name!r}) is still {self.state} "
                    f"({self.nodes_done}/{self.nodes_total} nodes done)."
                )
        except KeyboardInterrupt:
            self.cancel()
            raise
        return self

    def _wait_retired(self, timeout: float | None) -> bool:
        if not self._retired:
            with _WAITERS:  # between waiters; `retire` takes no lock (it is on every call's path)
                if self._final is None:
                    self._final = threading.Event()
            # Set the event, then read the flag: `wake` sets the flag, then reads the event. One of the
            # two sees the other's write, so a waiter never sleeps on an event nobody will set.
            if not self._retired and not self._final.wait(timeout):
                return False
        return True

    def result(self, timeout: float | None = None) -> Any:
        """Wait, then return the outputs as arrays (raising the run's error if it failed)."""
        self.wait(timeout)
        return get(self.outputs)

    def complete_here(self, value: Any, done) -> None:
        """Wait for a dispatched output ``value`` on this thread, completing pending steps here meanwhile."""
        self._link.complete_here(value, done)

    # ------------------------------------------- effects the controller applies (its lock held)
    def resolve(self, outputs) -> None:
        """Set the futures of outputs ``(j, value)``."""
        futures = self._futures
        for j, value in outputs:
            futures[j].set_result(value)

    def reject(self, indices, error: BaseException, cancelled: bool) -> None:
        """Fail (or mark cancelled) the futures of outputs ``indices``."""
        futures = self._futures
        for j in indices:
            fut = futures[j]
            fut.value = None  # (what its node left is no value: a future the user keeps keeps no buffer)
            if cancelled:
                fut._set_cancelled()  # (Future.cancel cancels the run)
            else:
                fut.set_exception(error)

    def release_outputs(self) -> None:
        """The run is no longer among the controller's most recent: let go of its futures (the user's stay)."""
        self._futures = None

    def wake(self) -> None:
        """Wake whoever waits on the run (`RunLock`: once the thread that made it final holds none of its arrays)."""
        self._retired = True  # after its event and its futures: whoever `wait()`s sees it all
        final = self._final
        if final is not None:
            final.set()

    @property
    def retired(self) -> bool:
        """Final, with its futures set and its event emitted."""
        return self._retired

    def cancel(self) -> bool:
        """Cancel: nodes not yet dispatched are dropped, futures raise CancelledError. False if already final."""
        return self._link.cancel(self)

    def __repr__(self) -> str:
        err = f", error={type(self.error).__name__}" if self.error is not None else ""
        return (
            f"<pw.Run {self.id} {self.name!r} {self.state_text} {self.nodes_done}/{self.nodes_total} nodes, "
            f"mode={self.mode}, tenant={self.tenant!r}{err}>"
        )


#: A running run tells its pace once it has run this long (seconds; shorter runs are over before it is read).
PACE_AFTER_S = 1.0


def pace(state: str, throughput: float | None, time_left: float | None, done: int, total: int) -> str:
    """A long running run's pace as a person reads it: '85 nodes/s, ~12 s left'; '' for any other run.

    Example::

        pace("running", 84.6, 12.4, 300, 1350)     # '85 nodes/s, ~12 s left'
    """
    if state != "running" or not throughput or time_left is None or done / throughput < PACE_AFTER_S:
        return ""
    rate = f"{throughput:,.0f}" if throughput >= 10 else f"{throughput:.2g}"
    return f"{rate} nodes/s, ~{duration(time_left)} left"


def duration(seconds: float) -> str:
    """``seconds`` as a person says it: '4.2 s', '12 s', '3 min 20 s', '1 h 5 min'."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        m, s = divmod(int(seconds + 0.5), 60)
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(int(seconds / 60 + 0.5), 60)
    return f"{h} h {m} min" if m else f"{h} h"


def describe_state(state: str, on_devices: int) -> str:
    """``state``, or what a cancelled run still has running: 'cancelling: 2 nodes on the devices'."""
    if on_devices <= 0 or state != "cancelled":
        return state
    return f"cancelling: {on_devices} node{'s' if on_devices != 1 else ''} on the devices"

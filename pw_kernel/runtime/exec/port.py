"""The one way up from execution: what the dispatcher and completion report, and the little they may ask.

The dispatcher and completion execute; the lifecycle decides. Between them is
this port, which the controller makes and hands down: each report (dispatched,
ran, completed, failed, compiling) is one stimulus of
the lifecycle's transition table, handled under the controller's lock, and its
effects are carried out by the controller's one applier. The questions
(`credit_wanted`, `has_work`, `queued`, `no_room`) only read.
Nothing below the controller imports the controller, even for types.

The lock reports are made under is the controller's `RunLock` (`run.py`): a run's
waiters wake only once the thread that made it final has let go of it, and of
every array it held.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..errors import PathwaysError

if TYPE_CHECKING:
    from ..core.lifecycle import Lifecycle
    from ..core.records import RunRecord, Work
    from ..run import RunLock


class Port:
    """What the dispatcher and completion tell the lifecycle, and ask of it (see the module's docstring).

    Reports marked "lock held" are made inside ``with port.lock``; the others take it.

    Example (the controller makes it; execution only calls it)::

        port = Port(lock, lifecycle, controller_apply)
        with port.lock:
            work = port.next_work()
            ...
            port.dispatched(work.rec, cursor, per_island, published, cost)
    """

    def __init__(self, lock: RunLock, lifecycle: Lifecycle, apply: Callable[[list], None]):
        self.lock = lock
        self._life = lifecycle
        self._apply = apply
        #: ``no_room(step, sent)``: whether ``step`` may not join what is in flight plus ``sent`` (this burst's,
        #: unreported) on its island. The lifecycle's own question, read-only, asked once per step of a burst
        #: (the dispatch loop): bound here rather than wrapped, one call less per node.
        self.no_room: Callable[[object, Sequence[int]], bool] = lifecycle.no_room

    # ------------------------------------------------------------- questions
    @property
    def credit_wanted(self) -> bool:
        """Whether the last pick found runs waiting for credit that only completions give back."""
        return self._life.credit_wanted

    def has_work(self) -> bool:
        """Whether some run is queued or has steps left to dispatch."""
        return self._life.has_work()

    def queued(self) -> int:
        """How many runs are not yet final."""
        return len(self._life.queue)

    # --------------------------------------------------------------- reports
    def next_work(self) -> Work | None:
        """What to dispatch next (lock held): the lifecycle picks, starting queued runs that can start."""
        work, effects = self._life.next_work(time.time())
        if effects:
            self._apply(effects)
        return work

    def dispatched(self, rec: RunRecord, cursor: int, per_island, published, cost: int) -> None:
        """``rec``'s steps up to ``cursor`` were sent (lock held)."""
        effects = self._life.handle(rec, "dispatched", time.time(), cursor, per_island, published, cost)
        if effects:
            self._apply(effects)

    def ran(self, rec: RunRecord, cursor: int, per_island, published, cost: int, events) -> None:
        """``rec``'s steps up to ``cursor`` were sent and have finished (lock held): reported at once."""
        effects = self._life.handle(rec, "ran", time.time(), cursor, per_island, published, cost, events)
        if effects:
            self._apply(effects)

    def completed(self, rec: RunRecord, per_island, published, failure, events) -> None:
        """Steps of ``rec`` finished (lock held); ``failure``: the first that raised, with its error."""
        effects = self._life.handle(rec, "completed", time.time(), per_island, published, failure, events)
        if effects:
            self._apply(effects)

    def failed(self, rec: RunRecord, step, exc: BaseException) -> None:
        """A step raised while being dispatched, or execution had a bug (lock held): the run fails."""
        self._apply(self._life.handle(rec, "step_failed", time.time(), step, exc))

    def keep_going(self, thread: str, loop: Callable[[], None]) -> None:
        """Run a controller thread's ``loop`` until it returns (its controller stops). An error of ours inside it (a
        bug) goes to `internal_error`, and the loop starts again: dead, the thread would leave every run, those in
        flight and all later ones, waiting for good, with nothing said."""
        while True:
            try:
                return loop()
            except BaseException as e:
                self.internal_error(thread, e)

    def internal_error(self, thread: str, error: BaseException) -> None:
        """The controller's ``thread`` hit ``error``, a bug of ours (no lock held): it is logged with its traceback,
        and every run not yet final fails with a `PathwaysError` that says so (their waiters raise it), so that the
        thread can go on. What those runs had in flight is lost with them; later runs start afresh."""
        log = logging.getLogger("pw_kernel")
        log.error("pw_kernel: the %s thread hit an error (a bug of pw_kernel's: please report it with this "
                  "traceback); the runs not yet final fail with it and the controller goes on", thread, exc_info=error)
        failure = PathwaysError(
            f"pw_kernel's {thread} thread hit an error, and this run fails with it: {type(error).__name__}: {error}. "
            f"A bug of pw_kernel's (the log has its traceback): please report it. Later runs are unaffected."
        )
        failure.__cause__ = error
        try:
            with self.lock:
                now = time.time()
                for rec in list(self._life.queue.values()):
                    if rec.state in ("queued", "running"):
                        self._apply(self._life.handle(rec, "internal_error", now, failure))
        except BaseException:  # (the lifecycle itself is broken: nothing more can be done here than say so)
            log.exception("pw_kernel: failing the runs after that error failed too")

    def compiling(self, rec: RunRecord, step_name: str | None, events=(), ns: int = 0) -> None:
        """The dispatcher compiles ``step_name`` for ``rec`` (None: done), with its compile events once timed."""
        with self.lock:
            self._apply(self._life.handle(rec, "compiling", time.time(), step_name, events, ns))


__all__ = ["Port"]

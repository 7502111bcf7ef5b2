"""Run: one submission of a program, and the state machine that drives it.

    queued ──> running ──> done
       │          ├──────> failed
       ├──────────┴──────> cancelled
       └─────────────────> failed      (an input future failed before it started)

Transitions are a table keyed by (from, to); every transition goes through
`Run._transition`, which checks the table and, when validation is on, the
invariants in `Run.validate`.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Literal

import jax

from .errors import CancelledError, PathwaysError, TimeoutError
from .events import RunEvent
from .futures import Future, check_timeout

if TYPE_CHECKING:
    from .controller import Controller
    from .graph import ProgramGraph
    from .plan import Plan

State = Literal["queued", "running", "done", "failed", "cancelled"]
FINAL: frozenset[str] = frozenset({"done", "failed", "cancelled"})

#: (from, to) -> name of the method run on entering ``to``.
TRANSITIONS: dict[tuple[str, str], str] = {
    ("queued", "running"): "_on_running",
    ("queued", "cancelled"): "_on_cancelled",
    ("queued", "failed"): "_on_failed",
    ("running", "done"): "_on_done",
    ("running", "failed"): "_on_failed",
    ("running", "cancelled"): "_on_cancelled",
}


class InvalidTransition(AssertionError):
    """An internal bug: a transition not in the table."""


class Run:
    """One execution of a program: its state, progress, outputs and node events.

    Example::

        run = pw.controller().runs[-1]
        run.state, run.progress         # ('running', (3, 8))
        run.wait(timeout=10)            # block until final
        run.outputs                     # the futures (same tree the program returned)
    """

    def __init__(
        self,
        controller: Controller,
        run_id: int,
        name: str,
        graph: ProgramGraph,
        plan: Plan,
        inputs: list[Any],
        tenant: str = "default",
        weight: float = 1.0,
        priority: int = 0,
    ):
        self.controller = controller
        self.id = run_id
        self.name = name
        self.graph = graph
        self.plan = plan
        self.mode = plan.mode
        self.tenant = tenant
        self.weight = weight
        self.priority = priority
        self.state: State = "queued"
        self.error: BaseException | None = None
        self.submitted_at = time.time()
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.nodes_total = len(plan.steps)
        self.nodes_dispatched = 0
        self.nodes_done = 0
        self.events: list = []
        self.source_map: dict[str, Any] = {}  # set by the notebook front: node -> cell line
        self._inputs = inputs  # arrays and futures, one per graph input
        self._slots: list[Any] | None = None
        self._cursor = 0
        self._final = threading.Event()
        self._reserved: dict[int, int] = {}
        #: why a queued run has not started: None, "input" (a future not yet dispatched) or "memory"
        self.waiting_for: str | None = None
        vals = graph.values
        futures = [
            Future(self, j, vals[v].shape, vals[v].dtype, vals[v].sharding, vals[v].slice)
            for j, v in enumerate(graph.outputs)
        ]
        # Strong while the run is in flight; once final, the futures (and the device buffers they
        # hold) live as long as the user keeps them, or the controller keeps the run among its
        # most recent (Config.keep_outputs).
        self._futures: list[Future] | None = futures
        self._weak = [weakref.ref(f) for f in futures]

    # ----------------------------------------------------------------- public
    @property
    def futures(self) -> list[Future]:
        """The output futures, flat; after the run ended, only those still referenced somewhere."""
        if self._futures is not None:
            return self._futures
        alive = [w() for w in self._weak]
        return [f for f in alive if f is not None]

    @property
    def outputs(self):
        """The output futures in the tree the program returned.

        Raises PathwaysError once the run is final and its futures were released (nothing held
        them and the run is no longer among the controller's most recent).
        """
        futures = self._futures
        if futures is None:
            futures = [w() for w in self._weak]
            if any(f is None for f in futures):
                raise PathwaysError(
                    f"run {self.id} ({self.name!r}): its outputs were released because nothing referenced them "
                    f"any more (the controller keeps only the last {self.controller.config.keep_outputs} runs' "
                    f"outputs). Keep the futures the call returned, e.g. `y = step(x)`."
                )
        return jax.tree_util.tree_unflatten(self.graph.out_tree, futures)

    @property
    def progress(self) -> tuple[int, int]:
        """(nodes done, nodes total)."""
        return self.nodes_done, self.nodes_total

    @property
    def elapsed(self) -> float:
        """Seconds since submission (until finish when final)."""
        end = self.finished_at if self.finished_at is not None else time.time()
        return end - self.submitted_at

    def done(self) -> bool:
        return self.state in FINAL

    def wait(self, timeout: float | None = None) -> Run:
        """Block until the run is done, failed or cancelled; Ctrl-C cancels it.

        Returns the run; does not raise the run's error (see `Run.result`).
        """
        timeout = check_timeout(timeout, "Run.wait")
        try:
            if not self._final.wait(timeout):
                raise TimeoutError(
                    f"`Run.wait(timeout={timeout})`: run {self.id} ({self.name!r}) is still {self.state} "
                    f"({self.nodes_done}/{self.nodes_total} nodes done)."
                )
        except KeyboardInterrupt:
            self.cancel()
            raise
        return self

    def result(self, timeout: float | None = None) -> Any:
        """Wait, then return the outputs as arrays (raising the run's error if it failed)."""
        from .futures import get

        self.wait(timeout)
        return get(self.outputs)

    def cancel(self) -> bool:
        """Cancel: nodes not yet dispatched are dropped, futures raise CancelledError. False if already final."""
        return self.controller._cancel(self)

    def validate(self, futures: list[Future] | None = None) -> None:
        """Assert the invariants of the current state (on in tests)."""
        s = self.state
        futures = self.futures if futures is None else futures
        assert 0 <= self.nodes_done <= self.nodes_dispatched <= self.nodes_total, self._dbg()
        if s == "queued":
            assert self.nodes_dispatched == 0 and self.started_at is None, self._dbg()
        if s in FINAL:
            assert self.finished_at is not None, self._dbg()
            assert all(f.done() for f in futures), self._dbg()
        if s == "done":
            assert self.nodes_done == self.nodes_total and self.error is None, self._dbg()
            assert all(f.exception() is None for f in futures), self._dbg()
        if s == "failed":
            assert self.error is not None, self._dbg()
        if s == "cancelled":
            assert all(f.cancelled() or f.exception() is None for f in futures), self._dbg()

    def __repr__(self) -> str:
        err = f", error={type(self.error).__name__}" if self.error is not None else ""
        return (
            f"<pw.Run {self.id} {self.name!r} {self.state} {self.nodes_done}/{self.nodes_total} nodes, "
            f"mode={self.mode}, tenant={self.tenant!r}{err}>"
        )

    # ------------------------------------------------------- state machine
    def _transition(self, to: State, error: BaseException | None = None) -> None:
        """Move to ``to``; the controller's lock is held by the caller."""
        key = (self.state, to)
        handler = TRANSITIONS.get(key)
        if handler is None:
            raise InvalidTransition(f"run {self.id}: no transition {self.state} -> {to}")
        self.state = to
        if self.controller.config.validate:
            futures = self._futures
            getattr(self, handler)(error)
            self.validate(futures)
        else:
            getattr(self, handler)(error)
        log = self.controller.events
        msg = None if error is None else f"{type(error).__name__}: {error}"
        log.emit_run(RunEvent(self.id, self.name, self.tenant, to, log.now(), msg))
        if to in FINAL:
            self._final.set()  # after the event: whoever `wait()`s sees the log complete

    def _on_running(self, _error) -> None:
        self.started_at = time.time()

    def _on_done(self, _error) -> None:
        self.finished_at = time.time()
        slots = self._slots
        for j, fut in enumerate(self.futures):
            if not fut.done():
                fut.set_result(slots[self.plan.output_slots[j]])
        self._release()

    def _on_failed(self, error) -> None:
        self.finished_at = time.time()
        self.error = error
        for fut in self.futures:
            if not fut.done():
                fut.set_exception(error)
        self._release()

    def _on_cancelled(self, _error) -> None:
        self.finished_at = time.time()
        self.error = CancelledError(f"run {self.id} ({self.name!r}) was cancelled.")
        for fut in self.futures:
            if not fut.done():
                concurrent.futures.Future.cancel(fut)  # mark CANCELLED (Future.cancel cancels the run)
                fut.set_running_or_notify_cancel()
        self._release()

    def _release(self) -> None:
        self._slots = None
        self._inputs = []
        self.controller._unreserve(self)
        self.controller._retire(self, self._futures)
        self._futures = None

    def _dbg(self) -> str:
        return repr(self)

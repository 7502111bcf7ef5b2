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
from typing import TYPE_CHECKING, Any, Literal

import jax

from .errors import CancelledError, TimeoutError
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
        self.futures = [
            Future(self, j, vals[v].shape, vals[v].dtype, vals[v].sharding) for j, v in enumerate(graph.outputs)
        ]
        self.outputs = jax.tree_util.tree_unflatten(graph.out_tree, self.futures)

    # ----------------------------------------------------------------- public
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

    def validate(self) -> None:
        """Assert the invariants of the current state (on in tests)."""
        s = self.state
        assert 0 <= self.nodes_done <= self.nodes_dispatched <= self.nodes_total, self._dbg()
        if s == "queued":
            assert self.nodes_dispatched == 0 and self.started_at is None, self._dbg()
        if s in FINAL:
            assert self.finished_at is not None, self._dbg()
            assert all(f.done() for f in self.futures), self._dbg()
        if s == "done":
            assert self.nodes_done == self.nodes_total and self.error is None, self._dbg()
            assert all(f.exception() is None for f in self.futures), self._dbg()
        if s == "failed":
            assert self.error is not None, self._dbg()
        if s == "cancelled":
            assert all(f.cancelled() or f.exception() is None for f in self.futures), self._dbg()

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
        getattr(self, handler)(error)
        if self.controller.config.validate:
            self.validate()
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

    def _dbg(self) -> str:
        return repr(self)

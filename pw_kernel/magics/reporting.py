"""Report runs that failed while the user worked elsewhere: once, after the next cell (`post_run_cell`)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ..runtime import ControllerShutdownError, controller
from ..train import take_failed_saves
from ..widgets import failure_view, message_view

MAX_REPORTS = 5


def current_controller():
    """The process's controller if one exists, without creating one (creating one starts JAX)."""
    return controller(create=False)


class FailureReporter:
    """Scans new and unfinished runs after every cell; shows each failure nobody has seen yet, once.

    A failure counts as seen when the cell raised it (``--block``,
    ``fut.result()``, ``%pathways wait``), the user read it (``fut.exception()``,
    or ``fut.result()`` raising it, even if caught) or the magic marked it reported.
    """

    def __init__(self, shell: Any, condense=str):
        self.shell = shell
        self.condense = condense  # shortens quoted tracebacks in error messages
        self._lock = threading.Lock()
        self._controller: weakref.ReferenceType | None = None
        self._last_id = -1
        self._pending: dict[int, Any] = {}  # run id -> run, submitted but not final at the last scan
        self._reported: set[int] = set()
        self._shown_here: list[Any] = []  # runs whose view the current cell displays
        c = current_controller()
        if c is not None:  # failures from before the extension was loaded are history, not news
            self._adopt(c)
            self._last_id = max((r.id for r in c.runs), default=-1)

    def register(self) -> None:
        self.shell.events.register("post_run_cell", self.post_run_cell)

    def unregister(self) -> None:
        try:
            self.shell.events.unregister("post_run_cell", self.post_run_cell)
        except ValueError:
            pass

    def mark_reported(self, run) -> None:
        with self._lock:
            self._reported.add(run.id)

    def shown_in_cell(self, run) -> None:
        """``run``'s view is displayed by the running cell: if it fails before the cell ends, that view shows it."""
        with self._lock:
            self._shown_here.append(run)

    def _adopt(self, c) -> None:
        self._controller = weakref.ref(c)
        self._last_id = -1
        self._pending = {}
        self._reported = set()

    def collect(self, shown: BaseException | None = None) -> list[Any]:
        """Failed runs not yet reported (and not the error ``shown`` by the cell); marks them reported."""
        c = current_controller()
        if c is None:
            return []
        with self._lock:
            if self._controller is None or self._controller() is not c:
                self._adopt(c)
            new = []
            for r in reversed(c.runs):  # append-only, ids increasing: walk back to the last one seen
                if r.id <= self._last_id:
                    break
                new.append(r)
            if new:
                self._last_id = new[0].id
            for r in reversed(new):
                self._pending[r.id] = r
            failed = []
            for rid, r in list(self._pending.items()):
                if not r.done():
                    continue
                del self._pending[rid]
                if r.state != "failed" or rid in self._reported:
                    continue
                self._reported.add(rid)
                if r.error_seen or isinstance(r.error, ControllerShutdownError) or _same_error(r, shown):
                    continue
                failed.append(r)
            return failed

    def post_run_cell(self, result=None) -> None:
        shown = getattr(result, "error_in_exec", None) if result is not None else None
        with self._lock:
            here, self._shown_here = self._shown_here, []
            self._reported.update(r.id for r in here if r.done())  # failed in its own cell: shown right above
        try:
            failed = self.collect(shown)
            saves = take_failed_saves()  # a checkpoint that failed is reported like a run, once
        except Exception:  # a reporting problem must never break the user's cell
            return
        if not failed and not saves:
            return
        from IPython.display import display as ipy_display

        for text in saves:
            ipy_display(message_view(f"pw_kernel: {text}"))
        for r in failed[:MAX_REPORTS]:
            ipy_display(failure_view(r, self.condense))
        if len(failed) > MAX_REPORTS:
            ids = ", ".join(str(r.id) for r in failed[MAX_REPORTS:])
            ipy_display(message_view(f"pw_kernel: {len(failed) - MAX_REPORTS} more runs failed: {ids}"))


def _same_error(run, shown: BaseException | None) -> bool:
    if shown is None:
        return False
    if shown is run.error:
        return True
    return getattr(shown, "run_id", None) == run.id and type(shown) is type(run.error)

"""Displays that follow a run: the live views of unfinished runs, and the progress of a blocking wait.

Both are refreshed by the one `ticker` every live view uses (the widgets'
too), never by a thread of their own. A blocking wait waits on the run
itself (`Run.wait`, which returns the moment the run is final), in slices
that end when progress is due (after `PROGRESS_AFTER_S`), when the timeout
is up, or after `WAKE_S` at most. Ctrl-C interrupts that wait on the main
thread and cancels the runs waited for.

Example::

    live = LiveDisplays()
    live.watch(run, handle, render)        # refreshed in place until the run is final
    wait_for([run], timeout=None, api="%pathways wait", progress=Progress(in_kernel=True),
             present=lambda err: err)
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..runtime import TimeoutError as WaitTimeoutError
from ..widgets import progress_line, run_view, ticker
from .ctrl_c import ctrl_c_message

#: Blocking waits show progress once they have lasted this long (seconds).
PROGRESS_AFTER_S = 2.0
#: How often that progress is refreshed (seconds).
PROGRESS_EVERY_S = 1.0
#: How often live displays of runs are refreshed in a kernel (seconds).
LIVE_PERIOD_S = 0.25
#: A blocking wait returns to Python at least this often (seconds): CPython raises a Ctrl-C between
#: bytecodes, so one that lands just before the wait blocks is raised when the wait returns.
WAKE_S = 0.5


def in_kernel(shell: Any) -> bool:
    """A Jupyter kernel (displays update in place), not a terminal."""
    return getattr(shell, "kernel", None) is not None


def widgets_here(shell: Any) -> bool:
    """Views are live widgets in a kernel with anywidget installed; elsewhere the text/HTML views stand in."""
    if not in_kernel(shell):
        return False
    try:
        import anywidget  # noqa: F401
    except ImportError:
        return False
    return True


def update_display(handle, obj) -> None:
    """Replace what ``handle`` shows with ``obj``, in place.

    `DisplayHandle.update` hands an object with ``_ipython_display_`` (our widgets) to that method,
    which displays it anew in whatever cell is running now; its mimebundle, sent by display id, updates
    the original display instead.
    """
    if hasattr(obj, "_ipython_display_") and hasattr(obj, "_repr_mimebundle_"):
        bundle = obj._repr_mimebundle_()
        if bundle is not None:
            data, metadata = bundle
            handle.update(data, metadata=metadata, raw=True)
        return
    handle.update(obj)


@dataclasses.dataclass(eq=False)
class _Shown:
    """A display of ``run``: its handle, how to draw it, and the (state, nodes done) it shows."""

    run: Any
    handle: Any
    render: Callable[[], Any]
    key: tuple[str, int]


class LiveDisplays:
    """The displays of unfinished runs, redrawn by the ticker when their state or nodes done change (in a kernel).

    Each display is dropped once it shows its run's final state, or when drawing
    it fails (the front-end went away).
    """

    def __init__(self, period: float = LIVE_PERIOD_S):
        self.period = period
        self._lock = threading.Lock()  # held while drawing: `unwatch` waits for a refresh under way
        self._shown: list[_Shown] = []
        self._due = 0.0
        self._closed = False

    def watch(self, run, handle, render: Callable[[], Any]) -> None:
        """Keep ``handle`` showing ``render()`` of ``run`` until the run is final."""
        with self._lock:
            if self._closed:
                return
            self._shown.append(_Shown(run, handle, render, (run.state, run.nodes_done)))
        ticker.add(self)
        ticker.poke()

    def unwatch(self, run) -> None:
        """Stop refreshing ``run``'s displays; returns once a refresh under way has been sent."""
        with self._lock:
            self._shown = [s for s in self._shown if s.run is not run]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._shown.clear()
        ticker.discard(self)

    def _tick(self, now: float) -> float | None:
        with self._lock:
            if not self._shown:
                return None
            if now < self._due:
                return self._due
            self._due = now + self.period
            for s in list(self._shown):
                final = s.run.done()  # read first: a run final now shows its final state below
                key = (s.run.state, s.run.nodes_done)
                if key != s.key:
                    try:
                        update_display(s.handle, s.render())
                    except Exception:  # the front-end went away: stop refreshing this one
                        self._shown.remove(s)
                        continue
                    s.key = key
                if final:  # its final state is shown: nothing more will change
                    self._shown.remove(s)
            return self._due if self._shown else None


class Progress:
    """Progress of a blocking wait: a refreshed display in a kernel, a rewritten stderr line in a terminal.

    `start` shows it first on the waiting thread (a new display must come from the
    cell's own thread); the ticker refreshes it every `PROGRESS_EVERY_S` until `stop`.
    """

    def __init__(self, in_kernel: bool, handle: tuple[Any, Any] | None = None, condense=str):
        self.in_kernel = in_kernel
        self.condense = condense
        self.handle = handle  # (DisplayHandle, render) of the run's own display, when it has one
        self.own = None  # else a display of the run being waited for, made by `start`
        self.run: Any = None  # the run being waited for
        self.started = False
        self._lock = threading.Lock()  # held while showing: after `stop`, nothing more is shown
        self._stopped = False
        self._due = 0.0
        self._line_open = False

    def start(self, run) -> None:
        """Show progress of ``run`` now, then on the ticker's thread every `PROGRESS_EVERY_S`."""
        with self._lock:
            if self._stopped:
                return
            self.run = run
            self.started = True
            self._show(run)
            self._due = time.monotonic() + PROGRESS_EVERY_S
        ticker.add(self)
        ticker.poke()

    def follow(self, run) -> None:
        """The wait moved on to ``run``."""
        with self._lock:
            self.run = run

    def stop(self) -> None:
        """No more refreshes; a terminal's progress line is ended (idempotent)."""
        with self._lock:
            self._stopped = True
            if self._line_open:
                print(file=sys.stderr, flush=True)
                self._line_open = False
        ticker.discard(self)

    def _tick(self, now: float) -> float | None:
        with self._lock:
            if self._stopped or not self.started:
                return None
            if now >= self._due:
                self._show(self.run)
                self._due = now + PROGRESS_EVERY_S
            return self._due

    def _show(self, run) -> None:
        if not self.in_kernel:
            print("\r" + progress_line(run), end="", file=sys.stderr, flush=True)
            self._line_open = True
            return
        if self.handle is not None:  # the run's own display: refresh it (elapsed time, nodes done)
            handle, render = self.handle
            update_display(handle, render())
            return
        view = run_view(run, condense=self.condense)
        if self.own is None:
            from IPython.display import display as ipy_display

            self.own = ipy_display(view, display_id=True)
        else:
            self.own.update(view)


def wait_for(runs: list[Any], timeout: float | None, api: str, progress: Progress, present) -> None:
    """Block until ``runs`` are final, showing progress after a while; Ctrl-C cancels them.

    Raises `pw.TimeoutError` after ``timeout`` seconds (the runs keep running); ``present``
    readies an error for the notebook (see `Presenter.presentable`).
    """
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    try:
        for run in runs:
            progress.follow(run)
            while not _waited(run, _until(start, deadline, progress)):
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise present(_timeout_error(api, timeout, run, runs))
                if not progress.started and now >= start + PROGRESS_AFTER_S:
                    progress.start(run)
    except KeyboardInterrupt as e:
        progress.stop()
        for r in runs:
            r.cancel()  # Run.wait already cancelled the one it was waiting for
        cancelled = [r for r in runs if r.state == "cancelled"]
        if cancelled:
            print(ctrl_c_message(cancelled), file=sys.stderr)
        raise present(e) from None
    finally:
        progress.stop()


def _until(start: float, deadline: float | None, progress: Progress) -> float:
    """How long to wait on the run before something else is due: progress to show, the deadline, a wake-up."""
    now = time.monotonic()
    due = [now + WAKE_S, *([] if deadline is None else [deadline])]
    if not progress.started:
        due.append(start + PROGRESS_AFTER_S)
    return max(min(due) - now, 0.0)


def _waited(run, timeout: float) -> bool:
    """Wait on ``run`` for up to ``timeout`` seconds (it returns as soon as the run is final); True if it is final."""
    try:
        run.wait(timeout)
    except WaitTimeoutError:
        return False
    return True


def _timeout_error(api: str, timeout: float, run, runs) -> WaitTimeoutError:
    names = ", ".join(repr(r.name) for r in runs if not r.done())
    return WaitTimeoutError(
        f"`{api} --timeout {timeout:g}`: run {run.id} ({run.name!r}) is still {run.state} after {timeout:g} s "
        f"({run.nodes_done}/{run.nodes_total} nodes done). It keeps running ({names}); its outputs are bound "
        f"to futures. Wait with `%pathways wait {run.id}`, or cancel with `%pathways cancel {run.id}`."
    )

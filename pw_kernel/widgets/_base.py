"""What every pw_kernel widget shares: the static HTML in its mimebundle, and one ticker thread.

The ticker is how live widgets stay cheap for the controller: event-stream
callbacks (on controller threads) only append to a buffer and poke the
ticker; the ticker thread pushes buffered changes to the front-end at most
``PERIOD`` apart, also while the kernel sits idle between cells.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import anywidget

from ..runtime import controller
from .esm import STATIC

PERIOD = 0.1  # seconds between two pushes of one widget: at most ~10 redraws a second

_log = logging.getLogger("pw_kernel")


class Ticker:
    """A daemon thread that calls ``client._tick(now)`` for poked clients, at most every `PERIOD`.

    ``_tick`` returns the monotonic time it wants to be called again at (or None).
    ``clock`` and ``sleep`` are the time it throttles by (a test passes a fake one).
    """

    def __init__(
        self,
        period: float = PERIOD,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.period = period
        self._clock = clock
        self._sleep = sleep
        self._clients: weakref.WeakSet[Any] = weakref.WeakSet()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._deadlines: dict[int, float] = {}

    def add(self, client: Any) -> None:
        with self._lock:
            self._clients.add(client)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="pw-widgets", daemon=True)
                self._thread.start()

    def discard(self, client: Any) -> None:
        with self._lock:
            self._clients.discard(client)

    def poke(self) -> None:
        """Ask for a tick soon (cheap: called from controller threads for every event)."""
        if not self._wake.is_set():
            self._wake.set()

    def _loop(self) -> None:
        last = -float("inf")
        while True:
            now = self._clock()
            timeout = None
            if self._deadlines:
                timeout = max(0.0, min(self._deadlines.values()) - now)
            self._wake.wait(timeout)
            wait = last + self.period - self._clock()
            if wait > 0:
                self._sleep(wait)  # the throttle: events keep buffering meanwhile
            self._wake.clear()
            last = now = self._clock()
            with self._lock:
                clients = list(self._clients)
            deadlines: dict[int, float] = {}
            for c in clients:
                try:
                    nxt = c._tick(now)
                except Exception:  # a broken widget must not stop the others
                    _log.exception("pw_kernel: widget %r failed to update; it stops updating", c)
                    self.discard(c)
                    continue
                if nxt is not None:
                    deadlines[id(c)] = nxt
            self._deadlines = deadlines


ticker = Ticker()


def controller_of(run: Any) -> Any:
    """The live controller ``run`` belongs to, or None (it was shut down or replaced, or forgot the run)."""
    c = controller(create=False)
    if c is None:
        return None
    return c if any(r is run for r in reversed(list(c.runs))) else None


class PwWidget(anywidget.AnyWidget):
    """An anywidget whose mimebundle also carries a static text/html picture of its state."""

    _css = STATIC / "widgets.css"
    _unsubscribe: Callable[[], None] | None = None  # set while the widget follows an event log

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._handles: list[Any] = []

    def static_html(self) -> str:
        """The widget's current state as self-contained HTML (no JavaScript)."""
        raise NotImplementedError

    def _unfollow(self) -> None:
        """Stop following the event log and the ticker (idempotent)."""
        unsub, self._unsubscribe = self._unsubscribe, None
        if unsub is not None:
            unsub()
        ticker.discard(self)

    def _repr_mimebundle_(self, **kwargs: Any):
        out = super()._repr_mimebundle_(**kwargs)
        if out is None:
            return None
        data, metadata = out
        return {**data, "text/html": self.static_html()}, metadata

    def _ipython_display_(self) -> None:
        """Display with a display id, so `refresh_static` can update what static viewers see."""
        from IPython.display import display

        bundle = self._repr_mimebundle_() if callable(self._repr_mimebundle_) else None
        if bundle is None:  # closed: only the picture is left
            display({"text/plain": repr(self), "text/html": self.static_html()}, raw=True)
            return
        data, metadata = bundle
        handle = display(data, metadata=metadata, raw=True, display_id=True)
        if handle is not None:
            self._handles.append(handle)

    def refresh_static(self) -> None:
        """Re-publish every display of this widget, so a saved notebook holds the latest static picture."""
        if not self._handles or not callable(self._repr_mimebundle_):
            return
        bundle = self._repr_mimebundle_()
        if bundle is None:
            return
        data, metadata = bundle
        for h in self._handles:
            h.update(data, metadata=metadata, raw=True)

"""The one refresh mechanism of every live view: a daemon thread that calls its subscribers, throttled.

Widgets, the notebook's live run displays and the progress of a blocking
cell all stay current the same way: they subscribe to the `ticker`, and it
calls their ``_tick(now)`` from its one thread

* on events: whoever learns of a change (an event-stream callback on a
  controller thread) only buffers it and calls `Ticker.poke`, which is cheap;
* on a period: ``_tick`` returns the monotonic time it wants to be called
  again at (or None), so a view whose content changes without events (an
  elapsed time) refreshes itself, also while the kernel sits idle between cells.

Ticks come at most `PERIOD` apart, however often the ticker is poked. Needs
neither anywidget nor IPython, so the notebook front uses it without them.

Example::

    class Clock:
        def _tick(self, now):
            print(f"{now:.1f}")
            return now + 1.0              # again in a second

    clock = Clock()                       # held by its owner: the ticker holds subscribers weakly
    ticker.add(clock)
    ticker.poke()                         # first tick soon
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

PERIOD = 0.1  # seconds between two ticks: at most ~10 redraws a second

_log = logging.getLogger("pw_kernel")


class Ticker:
    """A daemon thread that calls ``client._tick(now)`` for its clients when poked or due, at most every `PERIOD`.

    ``_tick`` returns the monotonic time it wants to be called again at (or None);
    every client is called on every tick, so it does nothing until its own time
    comes. Clients are held weakly. ``clock`` and ``sleep`` are the time it
    throttles by (a test passes a fake one).
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
        """Subscribe ``client`` (idempotent); it is first called on the next tick (`poke` for one soon)."""
        with self._lock:
            self._clients.add(client)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="pw-ticker", daemon=True)
                self._thread.start()

    def discard(self, client: Any) -> None:
        """Unsubscribe ``client`` (idempotent); a tick already under way may still call it once."""
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
                except Exception:  # a broken view must not stop the others
                    _log.exception("pw_kernel: live view %r failed to update; it stops updating", c)
                    self.discard(c)
                    continue
                if nxt is not None:
                    deadlines[id(c)] = nxt
            self._deadlines = deadlines


#: The process's one ticker: every live view subscribes here.
ticker = Ticker()

__all__ = ["PERIOD", "Ticker", "ticker"]

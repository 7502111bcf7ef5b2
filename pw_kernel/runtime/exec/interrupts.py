"""Ctrl-C deferral: on the main thread, a KeyboardInterrupt waits until a block of dispatch is reported.

A Ctrl-C that landed between calling a step's executable and reporting it
dispatched would leave work on the devices that the lifecycle does not know
of; the dispatcher and a waiting caller hold it back for those few
microseconds, then deliver it.
"""

from __future__ import annotations

import signal
import _signal  # noqa: I001 - see InterruptsDeferred
import threading


class InterruptsDeferred:
    """On the main thread, hold a Ctrl-C (SIGINT) back until the block is done, then deliver it.

    Entered a few times per interactive call, so it uses ``_signal`` (the C module under
    ``signal``): ``signal.signal`` converts handlers to and from enums, ~15 µs a swap against
    ~1. Nested blocks keep the outer block's handler.
    """

    __slots__ = ("depth", "previous", "caught")

    def __init__(self):
        self.depth = 0
        self.previous = None
        self.caught: list = []

    def _hold(self, signum, frame) -> None:
        self.caught.append(frame)

    def __enter__(self) -> None:
        if threading.current_thread() is not _MAIN:
            return
        if self.depth:
            self.depth += 1
            return
        try:
            self.previous = _signal.signal(_SIGINT, self._hold)
        except (ValueError, TypeError):  # not installable here: run the block as it is
            return
        self.depth = 1

    def __exit__(self, *exc) -> None:
        if not self.depth or threading.current_thread() is not _MAIN:
            return
        self.depth -= 1
        if self.depth:
            return
        previous, self.previous = self.previous, None
        _signal.signal(_SIGINT, previous)
        if self.caught:
            frame = self.caught[0]
            self.caught.clear()
            if callable(previous):
                previous(_SIGINT, frame)
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt


_MAIN = threading.main_thread()
_SIGINT = int(signal.SIGINT)
#: the main thread's deferral (only the main thread receives signals, so one suffices)
interrupts_deferred = InterruptsDeferred()

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

    Entered a few times per interactive call, so it swaps no handler per block: the first block
    installs `_handle` in front of the Python handler it finds (and keeps it there), which holds
    a SIGINT back while ``depth`` says a block is running and passes it on otherwise. Later
    blocks only check that it is still the one installed (``_signal.getsignal``, ~0.1 µs; a swap
    costs several times that, four per call). A handler installed by someone else since is
    wrapped the same way on the next block. Where the handler is not a Python callable
    (SIG_IGN, SIG_DFL), the block swaps as before. Nested blocks count ``depth``.
    """

    __slots__ = ("depth", "previous", "caught", "swapped", "handler")

    def __init__(self):
        self.depth = 0
        self.previous = None  # the handler `_handle` passes a SIGINT on to
        self.caught: list = []
        self.swapped = None  # the handler to put back at the end of a swapping block
        self.handler = self._handle  # the one installed: `getsignal` returns this very object

    def _hold(self, signum, frame) -> None:
        self.caught.append(frame)

    def _handle(self, signum, frame) -> None:
        if self.depth:
            self.caught.append(frame)
        else:
            self.previous(signum, frame)

    def __enter__(self) -> None:
        if get_ident() != _MAIN_ID:
            return
        if self.depth:
            self.depth += 1
            return
        try:
            current = _signal.getsignal(_SIGINT)
            if current is not self.handler:
                if callable(current):
                    self.previous = current
                    _signal.signal(_SIGINT, self.handler)
                else:  # SIG_IGN or SIG_DFL: nothing to pass a SIGINT on to; swap for the block
                    self.swapped = _signal.signal(_SIGINT, self._hold)
        except (ValueError, TypeError):  # not installable here: run the block as it is
            return
        self.depth = 1

    def __exit__(self, *exc) -> None:
        if not self.depth or get_ident() != _MAIN_ID:
            return
        self.depth -= 1
        if self.depth:
            return
        restore = self.swapped
        if restore is not None:
            self.swapped = None
            _signal.signal(_SIGINT, restore)
        if self.caught:
            frame = self.caught[0]
            self.caught.clear()
            deliver = restore if restore is not None else self.previous
            if callable(deliver):
                deliver(_SIGINT, frame)
            elif deliver != signal.SIG_IGN:
                raise KeyboardInterrupt


_MAIN_ID = threading.main_thread().ident
get_ident = threading.get_ident
_SIGINT = int(signal.SIGINT)
#: the main thread's deferral (only the main thread receives signals, so one suffices)
interrupts_deferred = InterruptsDeferred()

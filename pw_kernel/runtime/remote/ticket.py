"""A call a remote island makes of its process: its reply's ref once the call is sent, its result once read.

A `RemoteIsland` buffers the nodes of a burst and sends them as one call; each node's
`RemoteArray` holds the call's ticket and its index in it. The call is sent by the
dispatching thread itself (a direct link, the Pathways service's) or by the island's
mailbox thread (Ray); a thread that reads a value before that waits for it.

Example::

    t = Ticket(island)
    island.send([("call", lambda: island.link.request("get", handle), t)], cheap=True)
    island.link.get(t.wait_ref())
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .actor import MISSING

_TICKETS = threading.Lock()  # (makes a ticket's Event once, for the first thread that must wait for its call)


class Ticket:
    """One actor call that an island's mailbox thread makes: its ref once sent, its result once read."""

    __slots__ = ("_on_sent", "_result", "error", "island", "ref", "run", "sent")

    def __init__(self, island: Any):  # (its `RemoteIsland`)
        self.island = island
        self.run: tuple | None = None  # (run id, priority) of the controller's run it is a burst of
        self.ref = None
        self.error: BaseException | None = None
        # Whether the call was made: a flag, and an Event only for a thread that must wait for it (the
        # commonest sender is the dispatching thread itself, and an Event is a Condition and a lock a call).
        self.sent = False
        self._on_sent: threading.Event | None = None
        self._result: Any = MISSING

    def made(self) -> None:
        """The call was made (``ref`` or ``error`` set): wake a thread waiting for that, if one is."""
        self.sent = True
        woken = self._on_sent  # (read after the flag is set: see `_wait_sent`)
        if woken is not None:
            woken.set()

    def _wait_sent(self, timeout: float | None = None) -> bool:
        if self.sent:
            return True
        with _TICKETS:
            if self._on_sent is None:
                self._on_sent = threading.Event()
            woken = self._on_sent
        # (the flag again, after the Event is there: a sender that set it before reading no Event wakes nobody)
        return self.sent or woken.wait(timeout)

    def answered(self, result: Any) -> None:
        """Mark the call made and answered with ``result`` (for a buffer the island already holds)."""
        self._result = result
        self.made()

    def wait_ref(self):
        self._wait_sent()
        if self.error is not None:
            raise self.error.with_traceback(None)  # (kept for every reader: `errors.at_rest`)
        return self.ref

    def ready(self) -> bool:
        if self._result is not MISSING:
            return True
        if not self.sent:
            return False
        if self.error is not None:
            return True
        return self.island.link.ready(self.ref)

    def wait(self, timeout: float) -> bool:
        """Block until the call is answered (True) or ``timeout`` s pass (False), without polling."""
        deadline = time.monotonic() + timeout
        if not self._wait_sent(timeout):
            return False
        if self._result is not MISSING or self.error is not None:
            return True
        return self.island.link.wait(self.ref, max(0.0, deadline - time.monotonic()))

    def said(self, index: int) -> list:
        """What node ``index`` of the call wrote on the island as it ran: [(stream, text), ...] (a reply
        is (times, failure, said); one without ``said``, the service's or a transfer's, wrote nothing)."""
        reply = self.result()
        return reply[2].get(index, []) if len(reply) > 2 else []

    def result(self) -> Any:
        """What the actor returned (read once, then kept: every output of the call shares it)."""
        if self._result is MISSING:
            link = self.island.link
            try:
                self._result = link.get(self.wait_ref())
            except link.lost_errors() as e:
                raise self.island.lost(e) from None
        return self._result

"""The requests waiting for the service's worker: one queue per client, the clients served in turn.

A client that sends a burst (a few hundred runs queued by a loop) must not
stand in front of another client's next request. ZeroMQ's ROUTER already
reads its peers in turn; a single first-in-first-out queue behind it would
undo that, so the worker takes one request of each client with mail in turn.
A client's own requests keep their order, and a client that is dropped has
its waiting requests discarded: it is gone, and running what it sent would
only queue runs to cancel.
"""

from __future__ import annotations

import threading
from collections import deque


class Inbox:
    """Per-client queues of requests for one worker thread, served round-robin.

    `put` and `drop` are the socket thread's, `get` and `done` the worker's. `idle` says whether a
    client has nothing waiting or in the worker's hands: only then may another thread answer its
    next request itself and keep its order.

    Example::

        box = Inbox()
        box.put(b"a", "a1"); box.put(b"a", "a2"); box.put(b"b", "b1")
        box.get(), box.done()   # (b"a", "a1")
        box.get(), box.done()   # (b"b", "b1"): b's turn comes before a's second request
        box.get(), box.done()   # (b"a", "a2")
    """

    def __init__(self):
        self._mail: dict[bytes, deque] = {}  # a client -> its requests not yet taken (empty only while put to)
        self._turns: deque[bytes] = deque()  # the clients with mail, in the order they are served
        self._lock = threading.Lock()  # (`with` on it in C: a Condition's own `with` is two Python calls)
        self._cond = threading.Condition(self._lock)
        self._in_hand: bytes | None = None  # the client whose request the worker handles now
        self._closed = False

    def put(self, who: bytes, item) -> None:
        """Queue ``item`` behind ``who``'s waiting requests."""
        with self._cond:
            self._mail_of(who).append(item)

    def drop(self, who: bytes, item) -> int:
        """Discard ``who``'s waiting requests and queue ``item`` (the request to drop it); returns how many went."""
        with self._cond:
            mail = self._mail_of(who)
            gone = len(mail)
            mail.clear()
            mail.append(item)
            return gone

    def _mail_of(self, who: bytes) -> deque:
        """``who``'s queue, made (and given its turn, the worker woken) if it had none (lock held)."""
        mail = self._mail.get(who)
        if mail is None:
            mail = self._mail[who] = deque()
            self._turns.append(who)
            self._cond.notify()
        return mail

    def get(self):
        """The next request in turn, as ``(who, item)``, once there is one; None once closed."""
        with self._cond:
            while not self._turns and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            who = self._turns.popleft()
            mail = self._mail[who]
            item = mail.popleft()
            if mail:
                self._turns.append(who)
            else:
                del self._mail[who]
            self._in_hand = who
            return who, item

    def done(self) -> None:
        """The worker has handled the request `get` gave it."""
        with self._cond:
            self._in_hand = None

    def idle(self, who: bytes) -> bool:
        """Whether nothing of ``who``'s waits or is being handled."""
        with self._lock:
            return who not in self._mail and self._in_hand != who

    def waiting(self) -> int:
        """How many requests wait, of all clients."""
        with self._cond:
            return sum(len(m) for m in self._mail.values())

    def close(self) -> None:
        """Wake the worker for the last time: `get` returns None from now on."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

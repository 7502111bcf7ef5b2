"""The client's transport to the service: a `Link` over ZeroMQ, signed typed messages, replies matched by id.

A `RemoteIsland` (the service's devices, as this process's controller sees
them) sends its requests through it (``link.request("run_many", ...)`` goes as
`protocol.RunMany`); `session.connect` sends the service's own requests
(`protocol.Hello`, `protocol.Keep`, ...) with `ServiceLink.call`. Every error
that comes back is raised as the `pw.PathwaysError` subclass it left the
service as (`protocol.Failed` carries an `ErrorEnvelope`).

Example::

    link = ServiceLink(path, info)
    hello = link.hello("alice", 1.0, timeout=10)
    link.call(protocol.Stats(), timeout=30)
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import uuid
from typing import Any

from ..runtime import IslandLostError, ProtocolError
from ..runtime import TimeoutError as PathwaysTimeout
from ..runtime.extend import RemoteIsland
from .protocol import HEARTBEAT_S, ONEWAY, PROTOCOL_VERSION, REQUESTS, Failed, Hello, Ping, Pong, Reply, RunReply
from .wire import NOBLOCK, Hub, Messages, address, recv, send

log = logging.getLogger("pw_kernel.service")

#: No answer to heartbeats for this long: the service is gone (it died, or its host sleeps).
SERVICE_LOST_AFTER_S = 5.0


#: A thread that waits for its reply polls without sleeping for up to twice the link's usual round trip
#: (since the request left), if that is under this: as a local wait spins about its node's time
#: (`exec/completion.py:wait_ready`), since a thread that sleeps wakes late, its core's caches cold (a
#: waited tiny call: 0.59 ms against 0.65, `benchmarks/service.py`). Slower replies: it sleeps in the poll.
SPIN_MAX_S = 0.002


class Ref:
    """One request's reply, once it comes (``done``: a flag, not an Event: the thread that waits for a reply
    reads it itself, and a thread waiting meanwhile is woken by the link's ``_turn``, see `ServiceLink.wait`)."""

    __slots__ = ("done", "error", "sent", "value")

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.sent = 0.0  # when the request left (time.monotonic)


class ServiceLink:
    """A `RemoteIsland`'s transport to the service (a `Link`): signed requests on a DEALER socket, replies by id."""

    #: Sending a request is cheap (serialize, one socket send): a dispatching thread does it itself.
    direct = True
    #: The service drops a cancelled run's nodes that it has queued (`cancel`).
    cancels = True
    #: `pw.profile` traces the service's XLA ops too (`profile_start`, `profile_stop`).
    profiles = True
    #: A node that calls the host goes as its pickled Python (`load_shipped`); its output comes back.
    runs_python = True

    again = (
        "start the service again if it stopped (`python -m pw_kernel serve`), then call `pw.connect()` again "
        "(slices and compiled functions go on there; kept trees come back, `pw.kept(name)`, from the service's "
        "state folder)"
    )

    def __init__(self, path: str, info: dict):
        import zmq

        self.path = path
        self.info = info
        self.ctx = zmq.Context()
        # Three sockets, so that no call waits on another thread:
        # - requests leave on `_out` from the thread that makes them (under `_send_lock`);
        # - replies come back on `_in`, read by whichever thread waits for one (the reader, holding
        #   `_reader`): the caller that waits for its result reads it itself. Threads that wait meanwhile
        #   wait on `_turn`, woken when the reader has read something or leaves (leader and followers);
        # - heartbeats go on the socket thread's own socket, which also sees the service's connection close.
        self._out = self._socket(zmq.DEALER)
        self._in = self._socket(zmq.DEALER)
        self._in.rcvhwm = 0  # (replies wait there until someone waits for one: none may be dropped)
        self._poller = zmq.Poller()
        self._poller.register(self._in, zmq.POLLIN)
        self.reply_id = self._in.identity
        beats = self._socket(zmq.DEALER)
        self.beats_id = beats.identity
        self._send_lock = threading.Lock()
        self._reader = threading.Lock()
        self._turn_lock = threading.Lock()  # (`with` on the lock itself: a Condition's own `with` is Python)
        self._turn = threading.Condition(self._turn_lock)
        self._followers = 0
        self._closing = False
        self._ponged = threading.Event()
        self.messages = Messages(info, f"pw-client-{os.getpid()}")
        self.pending: dict[int, Ref] = {}
        self.inline: dict[int, Any] = {}  # handle -> small value sent with the run that made it
        self._ids = itertools.count(1)
        self.last_pong = time.monotonic()
        self.round_trip_s = SPIN_MAX_S / 4  # the usual request-to-reply time (a moving average of waited replies)
        self.error: IslandLostError | None = None
        self.island: RemoteIsland | None = None
        self.others: list[RemoteIsland] = []  # the service's other islands (Ray nodes'), on this same link
        self.hub = Hub(
            beats, self._on_frames, self._on_tick, HEARTBEAT_S, "pw-client-socket", on_disconnect=self._on_disconnect
        ).start()

    def _socket(self, kind: int):
        sock = self.ctx.socket(kind)
        sock.linger = 0
        sock.identity = uuid.uuid4().hex.encode()
        sock.connect(address(self.info))
        return sock

    # ------------------------------------------------------------ requests
    # ------------------------------------------------------------ what a RemoteIsland asks of its link
    def request(self, method: str, *args) -> Ref:
        """Send the island request ``method(*args)`` (`protocol.REQUESTS`); its reply comes to the `Ref`."""
        if method == "get":  # a small value that came with its run's reply: no request
            value = self.inline.pop(args[0], None)
            if value is not None:
                ref = Ref()
                ref.value = value
                ref.done = True
                return ref
        elif method == "run_many":  # (ops, frees, run): a busy loop's frees ride with its next call
            self.forget(args[1])
        return self.send(REQUESTS[method](*args))

    def request_oneway(self, method: str, *args) -> None:
        if method == "free":
            self.forget(args[0])
        self.send(REQUESTS[method](*args))

    def send(self, body: Any) -> Ref:
        """Send the request ``body`` (a `protocol` record); a oneway one (`protocol.ONEWAY`) is answered at once."""
        ref = Ref()
        if self.error is not None:
            ref.error = self.error
            ref.done = True
            return ref
        rid = next(self._ids)
        oneway = isinstance(body, ONEWAY)
        if not oneway:
            ref.sent = time.monotonic()
            self.pending[rid] = ref
        frames = self.messages.request(rid, body)
        try:
            with self._send_lock:  # (the socket: one thread at a time)
                if self.error is None:
                    send(self._out, frames)
        except BaseException:  # (a Ctrl-C as it sent: the service refuses what left, and no reply will come)
            self.pending.pop(rid, None)
            raise
        if oneway:
            ref.done = True
        return ref

    def call(self, body: Any, timeout: float | None = None) -> Any:
        """Send ``body`` and wait for its reply (raised as the error the service raised, if it failed)."""
        return self.get(self.send(body), timeout)

    def ready(self, ref: Ref) -> bool:
        if not ref.done and self._reader.acquire(blocking=False):
            try:
                while not ref.done and self._poller.poll(0):
                    self._read()
            finally:
                self._leave()
        return ref.done

    def get(self, ref: Ref, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.wait(ref, 0.1):  # (in slices: Ctrl-C reaches a waiting notebook)
            if deadline is not None and time.monotonic() > deadline:
                raise self._timeout(timeout)
        if ref.error is not None:  # (the link's own error, once lost, is every call's: each raise starts afresh)
            raise ref.error.with_traceback(None)
        return ref.value

    def wait(self, ref: Ref, timeout: float) -> bool:
        """Until ``ref`` is answered (True) or ``timeout`` s pass: reading replies if no other thread is."""
        if ref.done:
            return True
        deadline = time.monotonic() + timeout
        turn = self._turn
        while True:
            if self._reader.acquire(blocking=False):
                try:
                    self._read_until(ref, deadline)
                finally:
                    self._leave()
                return ref.done
            with turn:  # another thread reads: it wakes us when it has read something, or leaves
                self._followers += 1
                try:
                    while not ref.done and self._reader.locked():
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return False
                        turn.wait(left)
                finally:
                    self._followers -= 1
            if ref.done:
                return True

    def _read_until(self, ref: Ref, deadline: float) -> None:
        """As the reader: read replies until ``ref``'s comes, ``deadline`` passes, or the link is lost."""
        poll = self._poller.poll
        usual = self.round_trip_s
        if usual < SPIN_MAX_S / 2:  # (a reply that takes longer: waking ~0.1 ms late costs it little)
            spin_until = min(deadline, ref.sent + 2 * usual)
            while not ref.done and time.monotonic() < spin_until:  # (poll(0) lets go of the GIL)
                if poll(0):
                    self._read()
        while not ref.done and self.error is None and not self._closing:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            # (poll in slices: Ctrl-C reaches the reader, and a closing link is seen)
            if poll(max(1, min(int(left * 1000), 50))):
                self._read()
        if ref.done:
            self.round_trip_s = usual + 0.1 * (time.monotonic() - ref.sent - usual)

    def _read(self) -> None:
        """Read and answer one reply that has come (the reader only), and wake the threads waiting for theirs."""
        if self._closing:
            return
        self._on_frames(recv(self._in, NOBLOCK))
        if self._followers:
            with self._turn_lock:
                self._turn.notify_all()

    def _leave(self) -> None:
        """Stop being the reader; a thread waiting for its reply becomes the next."""
        with self._turn_lock:
            self._reader.release()
            if self._followers:
                self._turn.notify_all()

    def take_inline(self, handle: int) -> Any:
        return self.inline.pop(handle, None)

    def _timeout(self, timeout: float) -> PathwaysTimeout:
        return PathwaysTimeout(
            f"no answer from the Pathways service at {address(self.info)} in {timeout:g} s: it is not running "
            f"(start it: `python -m pw_kernel serve`), is busy past that, or its key is not this connection file's"
        )

    def forget(self, handles) -> None:
        """Handles freed: their small values, if they came with a reply and were never read, go too."""
        inline = self.inline
        if inline:
            for h in handles:
                inline.pop(h, None)

    def put(self, value: Any) -> Any:
        return value  # sent inside the request that uses it

    def usable(self) -> bool:
        return self.error is None

    def lost_errors(self) -> tuple[type[BaseException], ...]:
        return (IslandLostError,)

    def where(self, info: dict) -> str:
        if info.get("island"):  # (one of the service's Ray islands)
            return (f"the Pathways service's island {info['island']}: Ray node on {info['host']}, pid {info['pid']} "
                    f"(service pid {info.get('service_pid')})")
        return f"Pathways service on {info['host']}, pid {info['pid']}"

    # ------------------------------------------------------------ what comes back (the reader, or the socket thread)
    def _on_frames(self, frames: list) -> None:
        try:
            _, signed = self.messages.unpack(frames)
        except Exception as e:
            log.warning("pw_kernel client: refused a message that claims to be from the service: %s", str(e)[:200])
            return
        msg = signed.body
        if type(msg) is Pong:
            self.last_pong = time.monotonic()
            self._ponged.set()
            for island_id, why in msg.lost:  # (one of the service's Ray nodes is gone: its island here too)
                for other in self.others:
                    if other.info["island"] == island_id and other.alive:
                        other.lost(IslandLostError(f"the service lost its island {island_id} ({why})"))
            if not msg.known and self.island is not None:
                self.lose(
                    "the service no longer knows this client (it missed heartbeats for a while and was dropped: "
                    "its runs were cancelled and its arrays freed)"
                )
            return
        ref = self.pending.pop(getattr(msg, "id", None), None)
        if ref is None:
            return
        if type(msg) is Reply:
            value = msg.value
            if type(value) is RunReply:  # a run's: its small values are kept for `get`, the rest as an island's
                self.inline.update(value.small)
                value = (value.times, value.failure, value.said)
            ref.value = value
        elif type(msg) is Failed:
            ref.error = msg.error.exception("in the Pathways service: ")
        else:
            ref.error = ProtocolError(f"the service answered with a {type(msg).__name__}, which no request expects")
        ref.done = True

    def _on_disconnect(self) -> None:
        if self.island is not None:  # (connected: a closed connection now is the service going away)
            self.lose(
                f"the service (pid {self.info.get('pid')}, connection file {self.path}) closed its connection: "
                f"it stopped or was killed. Arrays that lived there are gone (kept trees are on its disk)"
            )

    def _on_tick(self) -> None:
        if self.error is not None:
            return
        self.hub.send(self.messages.pack(Ping()))
        quiet = time.monotonic() - self.last_pong
        if quiet > SERVICE_LOST_AFTER_S:
            self.lose(
                f"the service (pid {self.info.get('pid')}, connection file {self.path}) has not answered for "
                f"{quiet:.0f} s: it stopped or was killed. Arrays that lived there are gone (kept trees are on its "
                f"disk)"
            )

    def lose(self, why: str) -> IslandLostError:
        """The service is gone for this client: every waiting call and every later one raises, saying why."""
        if self.error is None:
            self.error = IslandLostError(f"Pathways service lost: {why}")  # (the island adds what to do)
            if self.island is not None:
                self.island.lost(self.error)
            for other in self.others:
                other.lost(self.error)
            for rid in list(self.pending):
                ref = self.pending.pop(rid, None)
                if ref is not None:
                    ref.error = self.error
                    ref.done = True
            with self._turn:
                self._turn.notify_all()
        return self.error

    def hello(self, name: str | None, weight: float, timeout: float, memory: int | None = None) -> dict:
        """Introduce this client: what `describe` says, and the tenant (`pw.TimeoutError` if the service is silent).

        A ping goes first from each socket that hears from the service, answered on that socket: a
        ROUTER knows a peer only once its connection is made, and drops a message to one it does not know.
        """
        self.hub.send(self.messages.pack(Ping()))
        if not self._ponged.wait(timeout):
            raise self._timeout(timeout)
        with self._reader:  # (no other thread uses the link yet: its first message is the pong)
            send(self._in, self.messages.pack(Ping()))
            deadline = time.monotonic() + timeout
            while not self._in.poll(100):  # (in slices: Ctrl-C)
                if time.monotonic() > deadline:
                    raise self._timeout(timeout)
            self._on_frames(recv(self._in))
        hello = Hello(PROTOCOL_VERSION, name, float(weight), os.getpid(), self.reply_id, self.beats_id, memory)
        return self.call(hello, timeout=timeout)

    def close(self) -> None:
        self._closing = True
        self.hub.stop()
        with self._send_lock:
            self._out.close(linger=0)
        if self._reader.acquire(timeout=2.0):  # (a reader leaves within a poll's slice once closing)
            self._in.close(linger=0)
            if not self.hub.thread.is_alive():  # (else its socket is open still: `term` would wait for good)
                self.ctx.term()

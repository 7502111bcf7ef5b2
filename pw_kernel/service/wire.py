"""What crosses between the service and its clients: connection files, signed messages, one socket thread each.

Messages (`Messages`) are signed as Jupyter's are: HMAC-SHA256 under the
connection file's key, each signature accepted once; their content is a
pickle, read only once its signature holds, with big arrays in raw frames.

`Hub` owns one ZeroMQ socket on one thread, because ZeroMQ sockets must not be
shared between threads: any thread hands it frames to send (a queue and a
pipe that wakes the poller), and what arrives is handed to ``on_frames`` on
that thread.
"""

from __future__ import annotations

import functools
import getpass
import hashlib
import hmac
import io
import itertools
import json
import os
import pickle
import queue
import secrets
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .protocol import Reply, Request, RunMany, RunReply

#: The file a service writes and `pw.connect()` reads when given none (in the user's runtime directory).
DEFAULT_NAME = "pw-service.json"


def runtime_dir() -> str:
    """The per-user directory for connection files: Jupyter's runtime directory (where kernels put theirs)."""
    try:
        from jupyter_core.paths import jupyter_runtime_dir

        path = jupyter_runtime_dir()
    except ImportError:  # (jupyter_core comes with jupyter_client; this is for a bare install with pyzmq only)
        base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(os.path.expanduser("~"), ".local", "share")
        path = os.path.join(base, "jupyter", "runtime")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def default_connection_file() -> str:
    return os.path.join(runtime_dir(), DEFAULT_NAME)


def write_connection_file(path: str, info: dict) -> None:
    """Write ``info`` where only this user can read it (0600, as Jupyter writes kernels' files)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f, indent=1)
    os.chmod(tmp, 0o600)  # (the umask may have been looser or stricter than the mode asked)
    os.replace(tmp, path)  # whole or not at all: a client never reads half a file


def read_connection_file(path: str | None, api: str) -> tuple[str, dict]:
    from ..runtime import PathwaysError

    path = os.path.expanduser(path) if path else default_connection_file()
    try:
        with open(path) as f:
            info = json.load(f)
    except FileNotFoundError:
        raise PathwaysError(
            f"`{api}`: no Pathways service connection file at {path}. Start the service first: "
            f"`python -m pw_kernel serve` in a terminal (or `pw_kernel.service.serve(background=True)` in a notebook), "
            f"then call `{api}` again (with the path it prints if it is not the default)."
        ) from None
    except (OSError, ValueError) as e:
        raise PathwaysError(f"`{api}`: cannot read the connection file {path}: {e}.") from None
    missing = {"transport", "ip", "port", "key", "signature_scheme"} - set(info)
    if missing:
        raise PathwaysError(f"`{api}`: {path} is not a pw_kernel service connection file (no {sorted(missing)}).")
    return path, info


def pid_running(pid: int, *, only_mine: bool = False) -> bool:
    """Whether process ``pid`` runs on this host (a zombie does not: it ended); another user's counts unless
    ``only_mine`` (a service's pid in this user's connection file that is now another user's: reused, stale).

    Example::

        pid_running(os.getpid())   # True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return not only_mine
    try:  # (Linux: a process that ended but was not yet waited for still answers signals)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def new_key() -> str:
    return secrets.token_hex(32)


class Signed(NamedTuple):
    """A message read and checked by `Messages.unpack`: the user who signed it, and the message (`protocol`)."""

    user: str
    body: Any


_signed = tuple.__new__  # (a `Signed` made in C: its class's own __new__ is a Python call, one a message)


class Messages:
    """Signed messages: made, and checked before anything in them is read.

    A message is the frames ``[identity, signature + body, buffers...]`` (the identity: the
    peer's, on the service's ROUTER socket only). The
    body is a pickle (protocol 5) of ``(message id, user, message)``, the message one of
    `protocol`'s typed records; the signature
    is HMAC-SHA256 of the body under the connection file's key, as Jupyter signs its
    messages, and a signature seen before is refused (a replay), as Jupyter's `Session`
    refuses it. An array of 64 KiB or more travels out of band, as a raw frame of its
    bytes (not signed, as Jupyter's buffers are not: the body that reads it is).

    Why pickle and not Jupyter's JSON frames: content here is tuples, handles, arrays and
    pw_kernel's own functions (a checkpoint's writer), which JSON must tag and rebuild;
    pickle does it in C, in a quarter of the time (~15 µs a small call's message, packed and
    read, against ~60), in one frame instead of six (and the identity). It is read only once the signature
    holds: only a holder of the user's key can make one, and that user's notebooks already
    send the service their Python to run (a node that calls the host), as ipyparallel's
    clients send pickles to its engines.

    Example::

        m = Messages(info, "pw-client-42")   # (the service's: routed=True)
        frames = m.pack(Request(1, Clock()))
        idents, signed = m.unpack(frames)   # signed.user, signed.body; ValueError if not signed
    """

    #: Signatures remembered to refuse a replay (Jupyter's `Session.digest_history_size`).
    HISTORY = 2**16

    def __init__(self, info: dict, name: str, routed: bool = False):
        scheme = info["signature_scheme"]
        if not scheme.startswith("hmac-"):
            raise ValueError(f"unsupported signature scheme {scheme!r} (the service signs with hmac-sha256)")
        digest = getattr(hashlib, scheme[5:], None)
        if digest is None or digest().digest_size != _SIGNATURE:
            raise ValueError(f"unsupported signature scheme {scheme!r} (the service signs with hmac-sha256)")
        # HMAC (RFC 2104) from its two keyed hashes, as the `hmac` module computes it, kept ready: signing is
        # then six calls in C, where `hmac.HMAC.copy` and its update and digest are five in Python a message
        # (and OpenSSL's one-shot `hmac.digest` looks its digest up by name on every call).
        key = info["key"].encode()
        size = digest().block_size
        if len(key) > size:
            key = digest(key).digest()
        key = key.ljust(size, b"\0")
        self._inner, self._outer = digest(key.translate(_IPAD)), digest(key.translate(_OPAD))
        self._name = name
        self._idents = 1 if routed else 0  # (a ROUTER socket's messages start with their sender's identity)
        self.user = getpass.getuser()
        self._ids = itertools.count()  # (next() on a count is atomic: any thread may pack)
        self._seen: set[bytes] = set()

    def sign(self, body: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(body)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def pack(self, message: Any, ident: bytes | None = None) -> list:
        """Frames of ``message`` (a `protocol` record), signed, to ``ident`` if given (from a ROUTER socket)."""
        return self._frames(message, flat(message), ident)

    def request(self, rid: int, body: Any) -> list:
        """`pack` of ``Request(rid, body)`` (made flat without making the record, where it travels flat)."""
        plain = flat_request(rid, body)
        return self._frames(Request(rid, body) if plain is None else None, plain)

    def reply(self, rid: int, value: Any, ident: bytes) -> list:
        """`pack` of ``Reply(rid, value)`` to ``ident`` (made flat without making the record, where it travels flat)."""
        plain = flat_reply(rid, value)
        return self._frames(Reply(rid, value) if plain is None else None, plain, ident)

    def _frames(self, message: Any, plain: tuple | None, ident: bytes | None = None) -> list:
        out: list = []
        head = f"{self._name}_{next(self._ids)}"
        try:
            if plain is not None:
                body = pickle.dumps((head, self.user, plain), 5)
            else:
                f = io.BytesIO()
                _Pickler(f, protocol=5, buffer_callback=functools.partial(_out_of_band, out)).dump(
                    (head, self.user, message))
                body = f.getvalue()
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise TypeError(f"cannot send this to the Pathways service: {e}") from None
        frames = [self.sign(body) + body] if ident is None else [ident, self.sign(body) + body]
        frames.extend(b.raw() for b in out)
        return frames

    def unpack(self, frames: list) -> tuple[list, Signed]:
        """(identities, the message); ValueError if it is unsigned, forged, replayed or malformed."""
        i = self._idents
        if len(frames) <= i:
            raise ValueError(f"malformed message: {len(frames)} frames")
        signed = frames[i]
        signature, body = signed[:_SIGNATURE], signed[_SIGNATURE:]
        if not body:
            raise ValueError("Unsigned Message")
        if signature in self._seen:
            raise ValueError(f"Duplicate Signature: {signature.hex()}")
        if not hmac.compare_digest(signature, self.sign(body)):
            raise ValueError(f"Invalid Signature: {signature.hex()}")
        seen = self._seen
        seen.add(signature)
        if len(seen) > self.HISTORY:  # (as Session does: forget a tenth, the oldest unknown)
            for _ in range(len(seen) // 10):
                seen.pop()
        buffers = frames[i + 1:]
        if buffers:  # its arrays' frames: each is big (`OUT_OF_BAND`), and the pickle takes every one
            if any(len(b) == 0 for b in buffers):
                raise ValueError("malformed message: cut short by its sender (a Ctrl-C as it sent), and ended")
            left = iter(buffers)
            _, user, message = pickle.loads(body, buffers=left)
            if next(left, None) is not None:
                raise ValueError(f"malformed message: {len(buffers)} frames after its first, more than its arrays")
        else:
            _, user, message = pickle.loads(body)
        if type(message) is tuple:
            message = unflat(message)
        return frames[:i], _signed(Signed, (user, message))


_SIGNATURE = 32  # (bytes of an HMAC-SHA256 digest: the first bytes of a message's signed frame)
_IPAD = bytes(b ^ 0x36 for b in range(256))  # (HMAC's inner and outer pads, as byte translations: `hmac`'s own)
_OPAD = bytes(b ^ 0x5C for b in range(256))

#: Arrays this big or bigger go out of band (a frame of their own, sent without a copy).
OUT_OF_BAND = 65536


class _Pickler(pickle.Pickler):
    """Pickles numpy arrays as their bytes, dtype name and shape: ~4x quicker than numpy's own reduce."""

    def reducer_override(self, obj):
        if type(obj) is not np.ndarray or obj.dtype.hasobject:
            return NotImplemented
        return _array, _parts(obj)


def _out_of_band(out: list, buf: pickle.PickleBuffer) -> bool | None:
    """A buffer the pickle meets (``buffer_callback``): a frame of its own if it is big (None), else in the pickle
    (True; an ndarray subclass's, reduced by numpy, may be any size). So no array's frame is ever empty."""
    if buf.raw().nbytes < OUT_OF_BAND:
        return True
    out.append(buf)
    return None


def _parts(a: np.ndarray) -> tuple:
    """(its bytes, or a buffer to send out of band if it is big; its dtype's name; its shape): `_array`'s arguments."""
    whole = np.ascontiguousarray(a).reshape(-1)
    data = whole.tobytes() if whole.nbytes < OUT_OF_BAND else pickle.PickleBuffer(whole.view(np.uint8))
    kind = a.dtype
    name = _NAMES.get(kind)
    if name is None:
        name = _NAMES[kind] = kind.name  # (a property that takes ~4 µs each time)
    return data, name, a.shape


_NAMES: dict[np.dtype, str] = {}
_DTYPES: dict[str, np.dtype] = {}


def _array(data, dtype: str, shape: tuple) -> np.ndarray:
    kind = _DTYPES.get(dtype)
    if kind is None:
        import jax.numpy as jnp

        kind = _DTYPES[dtype] = jnp.dtype(dtype)  # (bfloat16 and friends: numpy alone does not know their names)
    return np.frombuffer(data, dtype=kind).reshape(shape)


# ------------------------------------------------------------------ a call's two messages, flat
# A call's request (`RunMany`) and its answer (`RunReply`) travel as plain tuples, which pickle writes and
# reads in C: a typed record (its reduce, its frozen __init__) and an array (`_Pickler.reducer_override`) each
# call back into Python, ~6 µs a message in a loop against ~0.6, and on a waited call's way, where that code
# runs cold, each call costs 3-4x its time in a loop (docs/architecture.md, "Where a run lives"). Any other
# message, and one of these that carries what a tuple cannot (a failure, a big or object array, a key), is
# pickled as itself. A flat message is read only once its signature holds, like any other.
_RUN_MANY, _RUN_REPLY = 1, 2


def flat(message: Any) -> tuple | None:
    """``message`` as plain tuples if it is a call's request or its answer (see above), else None."""
    kind = type(message)
    if kind is Request:
        return flat_request(message.id, message.body)
    if kind is Reply:
        return flat_reply(message.id, message.value)
    return None


def flat_request(rid: int, body: Any) -> tuple | None:
    """`flat` of ``Request(rid, body)``."""
    if type(body) is RunMany:
        return _RUN_MANY, rid, body.ops, body.frees, body.run
    return None


def flat_reply(rid: int, value: Any) -> tuple | None:
    """`flat` of ``Reply(rid, value)``."""
    if type(value) is RunReply and value.failure is None:
        small = {}
        for h, a in value.small.items():
            if type(a) is not np.ndarray or a.dtype.hasobject or a.nbytes >= OUT_OF_BAND:
                return None
            small[h] = _parts(a)
        return _RUN_REPLY, rid, value.times, small, value.said
    return None


def unflat(plain: tuple) -> Any:
    """The record `flat` made ``plain`` of."""
    kind = plain[0]
    if kind == _RUN_MANY:
        return Request(plain[1], RunMany(plain[2], plain[3], plain[4]))
    if kind == _RUN_REPLY:
        small = {h: _array(*a) for h, a in plain[3].items()}
        return Reply(plain[1], RunReply(plain[2], None, small, plain[4]))
    raise ValueError(f"malformed message: a flat one of kind {kind!r}")


def send(sock, frames: list) -> None:
    """Send ``frames`` as one message: a frame at a time (`send_multipart`'s checks double a small message's
    cost); big frames (arrays) without a copy.

    A message of several frames that an exception (a Ctrl-C) cuts short is ended with an empty frame before
    the exception goes on: ZeroMQ would otherwise make the socket's next message the rest of this one, and
    the peer would read that message's frames as this one's arrays. The peer refuses the ended one whole
    (`Messages.unpack`: an array's frame is never empty, and every frame after the first is an array's).
    """
    last = len(frames) - 1
    sent = False
    try:
        for i, f in enumerate(frames):
            sock.send(f, _SNDMORE if i < last else 0, copy=len(f) < OUT_OF_BAND)
        sent = True
    finally:
        if not sent and last > 0:
            sock.send(b"", 0)  # (if no frame had left, a message of one empty frame: refused as unsigned)


def recv(sock, flags: int = 0) -> list:
    """The frames of one message (``flags``: NOBLOCK raises `zmq.Again` if none has come)."""
    frames = [sock.recv(flags)]
    while sock.get(_RCVMORE):
        frames.append(sock.recv())
    return frames


# zmq.NOBLOCK, SNDMORE, RCVMORE, EVENTS and POLLIN as plain ints: their enum flags cost a few µs on each use, and
# this module imports zmq only where it runs a socket.
NOBLOCK, _SNDMORE, _RCVMORE, _EVENTS, _POLLIN = 1, 2, 13, 15, 1


def address(info: dict) -> str:
    return f"{info['transport']}://{info['ip']}:{info['port']}"


# ------------------------------------------------------------------ one socket, one thread
class Hub:
    """One ZeroMQ socket driven by one thread: frames to send come from any thread, arrivals go to ``on_frames``.

    ``on_tick`` runs on that thread every ``tick_s`` (heartbeats); ``on_disconnect`` when a peer's
    connection closes (ZeroMQ's socket monitor: a killed process's socket is closed by its kernel at once,
    long before a heartbeat is missed). `stop` ends the thread and closes the socket.
    """

    def __init__(self, socket, on_frames: Callable[[list], None], on_tick: Callable[[], None] | None = None,
                 tick_s: float = 0.5, name: str = "pw-hub", on_disconnect: Callable[[], None] | None = None):
        self.socket = socket
        self.on_frames = on_frames
        self.on_tick = on_tick
        self.on_disconnect = on_disconnect
        self.tick_ms = int(tick_s * 1000)
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._wfd, False)
        self._stopping = False
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._ident: int | None = None  # its thread's (`Thread.ident` is a Python property: asked on every send)

    def start(self) -> Hub:
        self.thread.start()
        self._ident = self.thread.ident
        return self

    def send(self, frames: list) -> bool:
        """Send ``frames`` (a multipart message): on this hub's thread at once (True), from another thread queued
        for it (False)."""
        if threading.get_ident() == self._ident and self._out.empty():
            send(self.socket, frames)
            return True
        self._out.put(frames)
        self._wake()
        return False

    def _wake(self) -> None:
        try:
            os.write(self._wfd, b"x")
        except (BlockingIOError, OSError):  # the pipe is full (the thread will drain it) or closed (stopped)
            pass

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._wake()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    def _loop(self) -> None:
        import time

        import zmq

        sock = self.socket
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._rfd, zmq.POLLIN)
        monitor = None
        if self.on_disconnect is not None:
            monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            poller.register(monitor, zmq.POLLIN)
        next_tick = time.monotonic() + self.tick_ms / 1000
        try:
            while not self._stopping:
                wait = max(0, int((next_tick - time.monotonic()) * 1000))
                events = dict(poller.poll(wait))
                if self._rfd in events:
                    os.read(self._rfd, 65536)
                out = self._out
                while not out.empty():  # (asked, not tried: an exception per turn costs more than the send)
                    send(sock, out.get_nowait())
                if sock in events:
                    while sock.get(_EVENTS) & _POLLIN:  # (asked, not tried, as above)
                        self._guard(self.on_frames, recv(sock, NOBLOCK))
                if monitor is not None and monitor in events:
                    while True:
                        try:
                            monitor.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                    self._guard(self.on_disconnect)
                if self.on_tick is not None and time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + self.tick_ms / 1000
                    self._guard(self.on_tick)
        finally:
            # The pipe stays open: another thread may still wake it, and a closed fd's number is reused.
            if monitor is not None:
                sock.disable_monitor()
                monitor.close(linger=0)
            sock.close(linger=0)

    @staticmethod
    def _guard(fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # a bad message or a bug in a handler must not end the socket's thread
            import logging

            logging.getLogger("pw_kernel.service").exception("error in the service's socket thread")

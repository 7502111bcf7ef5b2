"""What crosses between the service and its clients: connection files, signed messages, one socket thread each.

Messages are Jupyter's (`jupyter_client.session.Session`): a JSON header and
content signed with HMAC-SHA256 under the connection file's key, with raw
frames for bytes (executables, array data). Values in content are plain JSON;
what JSON cannot say (tuples, bytes, numpy arrays) is tagged by `encode` and
rebuilt by `decode`.

`Hub` owns one ZeroMQ socket on one thread, because ZeroMQ sockets must not be
shared between threads: any thread hands it frames to send (a queue and a
pipe that wakes the poller), and what arrives is handed to ``on_frames`` on
that thread.
"""

from __future__ import annotations

import datetime
import getpass
import hmac
import itertools
import json
import os
import queue
import secrets
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

DELIM = b"<IDS|MSG>"  # (Jupyter's: between a message's routing identities and its signature)

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


def new_key() -> str:
    return secrets.token_hex(32)


def session(info: dict, name: str = "pw"):
    """A Jupyter `Session` that signs with the connection file's key (and refuses replays: each signature once)."""
    from jupyter_client.session import Session

    return Session(
        key=info["key"].encode(), signature_scheme=info["signature_scheme"], username=getpass.getuser(),
        packer="json", unpacker="json", session=name,
    )


class Messages:
    """Jupyter's wire format signed by a `Session`, made and checked with no more than this protocol reads.

    The frames are what `Session.serialize` makes (identities, delimiter, HMAC
    signature, header, parent, metadata, content, buffers), signed with
    `Session.sign` under the connection file's key; a message whose signature is
    missing, wrong, or seen before is refused, as `Session.deserialize` refuses it.
    What is left out is what costs most on a small call and this protocol never
    reads: the header's date parsed back into a datetime, message adaptation
    across protocol versions, a new header dict per message. That halves a
    message's cost (~30 µs each way instead of ~65); a call makes four.

    Example::

        m = Messages(info, "pw-client-42")
        frames = m.pack("request", {"id": 1, "method": "clock"})
        idents, msg = m.unpack(frames)   # msg["header"], ["content"], ["buffers"]; ValueError if not signed
    """

    def __init__(self, info: dict, name: str):
        self.session = session(info, name)
        self._ids = itertools.count()  # (next() on a count is atomic: any thread may pack)
        self._head = f'"username": {json.dumps(self.session.username)}, "session": {json.dumps(name)}, "version": "5.3"'
        self._seen = self.session.digest_history

    def pack(self, kind: str, content: dict, bufs: list | tuple = (), ident: bytes | None = None) -> list:
        """Frames of a signed message ``kind`` with JSON ``content`` and raw ``bufs``, to ``ident`` if given."""
        now = datetime.datetime.now(datetime.timezone.utc).isoformat()
        msg_id = f"{self.session.session}_{next(self._ids)}"
        header = f'{{"msg_id": "{msg_id}", "msg_type": "{kind}", "date": "{now}", {self._head}}}'
        parts = [header.encode(), b"{}", b"{}", json.dumps(content).encode()]
        frames = [] if ident is None else [ident]
        frames += [DELIM, self.session.sign(parts), *parts]
        frames.extend(bufs)
        return frames

    def unpack(self, frames: list) -> tuple[list, dict]:
        """(identities, message: header, content, buffers); ValueError if it is unsigned, forged or replayed."""
        idents, parts = self.session.feed_identities(frames)
        if len(parts) < 5:
            raise ValueError(f"malformed message: {len(parts)} parts after the delimiter")
        signature = parts[0]
        if not signature:
            raise ValueError("Unsigned Message")
        if signature in self._seen:
            raise ValueError(f"Duplicate Signature: {signature!r}")
        if not hmac.compare_digest(signature, self.session.sign(parts[1:5])):
            raise ValueError(f"Invalid Signature: {signature!r}")
        seen = self._seen
        seen.add(signature)
        if len(seen) > self.session.digest_history_size:  # (as Session does: forget a tenth, the oldest unknown)
            for _ in range(len(seen) // 10):
                seen.pop()
        return idents, {"header": json.loads(parts[1]), "content": json.loads(parts[4]), "buffers": parts[5:]}


def address(info: dict) -> str:
    return f"{info['transport']}://{info['ip']}:{info['port']}"


# ------------------------------------------------------------------ values in messages
_PLAIN = frozenset({type(None), bool, int, float, str})


def encode(obj: Any, bufs: list) -> Any:
    """``obj`` as JSON content, with bytes and arrays moved to ``bufs`` (raw frames)."""
    kind = type(obj)
    if kind in _PLAIN:
        return obj
    if kind is list:  # (the commonest: lists of handles)
        return [x if type(x) in _PLAIN else encode(x, bufs) for x in obj]
    if isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (bytes, bytearray, memoryview)):
        bufs.append(bytes(obj))
        return {"__b": len(bufs) - 1}
    if isinstance(obj, np.ndarray):
        flat = np.ascontiguousarray(obj).reshape(-1)  # (1-D: ascontiguousarray makes a 0-d array 1-d anyway)
        bufs.append(flat.view(np.uint8).data if flat.size else b"")
        return {"__a": len(bufs) - 1, "dtype": str(obj.dtype), "shape": list(obj.shape)}
    if isinstance(obj, tuple):
        return {"__t": [encode(x, bufs) for x in obj]}
    if isinstance(obj, list):
        return [encode(x, bufs) for x in obj]
    if isinstance(obj, dict):
        return {"__d": [[encode(k, bufs), encode(v, bufs)] for k, v in obj.items()]}
    if callable(obj) and _sendable(obj):  # (pw's own host code beside the service's buffers: by name)
        return {"__f": [obj.__module__, obj.__qualname__]}
    raise TypeError(f"cannot send a {type(obj).__name__} to the Pathways service")


#: Functions travel by reference, and only pw_kernel's own (what runs beside the service's buffers:
#: a checkpoint's writer and reader); a client's own Python does not run in the service this way.
_FUNCTIONS_FROM = "pw_kernel."


def _sendable(fn) -> bool:
    module, name = getattr(fn, "__module__", None) or "", getattr(fn, "__qualname__", "")
    return module.startswith(_FUNCTIONS_FROM) and "<" not in name


def _function(module: str, qualname: str):
    if not module.startswith(_FUNCTIONS_FROM) or "<" in qualname:
        raise ValueError(f"the service runs only pw_kernel's own functions by name; got {module}.{qualname}")
    import importlib

    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def decode(obj: Any, bufs: list) -> Any:
    """What `encode` packed (arrays are copied out of the frames: they outlive the message)."""
    if type(obj) is list:
        return [x if type(x) in _PLAIN else decode(x, bufs) for x in obj]
    if not isinstance(obj, dict):
        return obj
    if "__t" in obj:
        return tuple(decode(x, bufs) for x in obj["__t"])
    if "__b" in obj:
        return bytes(bufs[obj["__b"]])
    if "__a" in obj:
        import jax.numpy as jnp

        dtype = jnp.dtype(obj["dtype"])  # (bfloat16 and friends: numpy alone does not know their names)
        return np.frombuffer(bytes(bufs[obj["__a"]]), dtype=dtype).reshape(obj["shape"])
    if "__d" in obj:
        return {decode(k, bufs): decode(v, bufs) for k, v in obj["__d"]}
    if "__f" in obj:
        return _function(*obj["__f"])
    return obj


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

    def start(self) -> Hub:
        self.thread.start()
        return self

    def send(self, frames: list) -> None:
        """Send ``frames`` (a multipart message): on this hub's thread at once, from another thread queued for it."""
        if threading.get_ident() == self.thread.ident and self._out.empty():
            self.socket.send_multipart(frames, copy=len(frames[-1]) < 65536)
            return
        self._out.put(frames)
        self._wake()

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
                while True:
                    try:
                        frames = self._out.get_nowait()
                    except queue.Empty:
                        break
                    sock.send_multipart(frames, copy=len(frames[-1]) < 65536)
                if sock in events:
                    while True:
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._guard(self.on_frames, frames)
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

"""The client's side: this process's controller drives the service's devices as one remote island.

`connect` adds the service to `pw.controller()` as a remote island whose
transport is a `ServiceLink` (ZeroMQ, signed messages) instead of Ray, and
makes it where `pw.slice` places slices. Tracing, planning, dispatch order,
futures, widgets: all this process's controller, unchanged. What crosses is
what a Ray island gets: each node's executable once (`jax.export`), then
"run key on handles" messages; values stay in the service until `.result()`.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import threading
import time
import uuid
from typing import Any, NamedTuple

import jax

from ..runtime import ArgumentError, Future, IslandLostError, PathwaysError, RemoteArray, controller
from ..runtime.extend import Controller, RemoteIsland, on_controller_replaced
from .wire import NOBLOCK, Hub, Messages, address, read_connection_file, recv, send

log = logging.getLogger("pw_kernel.service")

HEARTBEAT_S = 0.5
#: No answer to heartbeats for this long: the service is gone (it died, or its host sleeps).
SERVICE_LOST_AFTER_S = 5.0


class _Ref:
    """One request's reply, once it comes (what a Ray ``ObjectRef`` is to a Ray island)."""

    __slots__ = ("error", "event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None




class _Method:
    __slots__ = ("link", "name")

    def __init__(self, link: ServiceLink, name: str):
        self.link = link
        self.name = name

    def remote(self, *args) -> _Ref:
        link = self.link
        if self.name == "get":  # a small value that came with its run's reply: no request
            value = link.take_inline(args[0])
            if value is not None:
                ref = _Ref()
                ref.value = value
                ref.event.set()
                return ref
        elif self.name == "free":
            link.forget(args[0])
        elif self.name == "run_many":  # (ops, frees, run): a busy loop's frees ride with its next call
            link.forget(args[1])
        return link.request(self.name, args, oneway=self.name in ("free", "cancel"))


class ServiceActor:
    """Stands where a Ray actor handle stands for a remote island: ``actor.run_many.remote(ops)`` sends a request."""

    def __init__(self, link: ServiceLink):
        self._link = link

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self._link, name)


class ServiceLink:
    """A `RemoteIsland`'s transport to the service: signed requests on a DEALER socket, replies matched by id."""

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
        "(kept trees live as long as the service does)"
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
        self._turn = threading.Condition(threading.Lock())
        self._followers = 0
        self._closing = False
        self._ponged = threading.Event()
        self.messages = Messages(info, f"pw-client-{os.getpid()}")
        self.pending: dict[int, _Ref] = {}
        self.inline: dict[int, Any] = {}  # handle -> small value sent with the run that made it
        self._ids = itertools.count(1)
        self.last_pong = time.monotonic()
        self.error: IslandLostError | None = None
        self.island: RemoteIsland | None = None
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
    def request(self, method: str, args: tuple | list, oneway: bool = False) -> _Ref:
        ref = _Ref()
        if self.error is not None:
            ref.error = self.error
            ref.event.set()
            return ref
        rid = next(self._ids)
        if not oneway:
            self.pending[rid] = ref
        content = {"id": rid, "method": method, "args": args, "oneway": oneway}
        frames = self.messages.pack("request", content)
        with self._send_lock:  # (the socket: one thread at a time)
            if self.error is None:
                send(self._out, frames)
        if oneway:
            ref.event.set()
        return ref

    def call(self, method: str, *args, timeout: float | None = None) -> Any:
        return self.get(self.request(method, args), timeout)

    # ------------------------------------------------------------ what a RemoteIsland asks of its link
    def ready(self, ref: _Ref) -> bool:
        if not ref.event.is_set() and self._reader.acquire(blocking=False):
            try:
                while not ref.event.is_set() and self._poller.poll(0):
                    self._read()
            finally:
                self._leave()
        return ref.event.is_set()

    def get(self, ref: _Ref, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.wait(ref, 0.1):  # (in slices: Ctrl-C reaches a waiting notebook)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no answer from the Pathways service at {address(self.info)} in {timeout} s")
        if ref.error is not None:
            raise ref.error
        return ref.value

    def wait(self, ref: _Ref, timeout: float) -> bool:
        """Until ``ref`` is answered (True) or ``timeout`` s pass: reading replies if no other thread is."""
        if ref.event.is_set():
            return True
        deadline = time.monotonic() + timeout
        turn = self._turn
        while True:
            if self._reader.acquire(blocking=False):
                try:
                    self._read_until(ref, deadline)
                finally:
                    self._leave()
                return ref.event.is_set()
            with turn:  # another thread reads: it wakes us when it has read something, or leaves
                self._followers += 1
                try:
                    while not ref.event.is_set() and self._reader.locked():
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return False
                        turn.wait(left)
                finally:
                    self._followers -= 1
            if ref.event.is_set():
                return True

    def _read_until(self, ref: _Ref, deadline: float) -> None:
        """As the reader: read replies until ``ref``'s comes, ``deadline`` passes, or the link is lost."""
        poll = self._poller.poll
        while not ref.event.is_set() and self.error is None and not self._closing:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            # (poll in slices: Ctrl-C reaches the reader, and a closing link is seen)
            if poll(max(1, min(int(left * 1000), 50))):
                self._read()

    def _read(self) -> None:
        """Read and answer one reply that has come (the reader only), and wake the threads waiting for theirs."""
        if self._closing:
            return
        self._on_frames(recv(self._in, NOBLOCK))
        if self._followers:
            with self._turn:
                self._turn.notify_all()

    def _leave(self) -> None:
        """Stop being the reader; a thread waiting for its reply becomes the next."""
        with self._turn:
            self._reader.release()
            if self._followers:
                self._turn.notify_all()

    def take_inline(self, handle: int) -> Any:
        return self.inline.pop(handle, None)

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

    @staticmethod
    def where(info: dict) -> str:
        return f"Pathways service on {info['host']}, pid {info['pid']}"

    # ------------------------------------------------------------ what comes back (the reader, or the socket thread)
    def _on_frames(self, frames: list) -> None:
        try:
            _, (kind, _, content) = self.messages.unpack(frames)
        except Exception as e:
            log.warning("pw_kernel client: refused a message that claims to be from the service: %s", str(e)[:200])
            return
        if kind == "pong":
            self.last_pong = time.monotonic()
            self._ponged.set()
            if not content.get("known") and self.island is not None:
                self.lose(
                    "the service no longer knows this client (it missed heartbeats for a while and was dropped: "
                    "its runs were cancelled and its arrays freed)"
                )
            return
        ref = self.pending.pop(content.get("id"), None)
        if ref is None:
            return
        if content["ok"]:
            value = content["value"]
            if isinstance(value, tuple) and len(value) in (3, 4):  # a run's (times, failure, small values[, said])
                self.inline.update(value[2])
                value = value[:2] + value[3:]  # (times, failure[, what its nodes' callbacks wrote]), as a Ray actor's
            ref.value = value
        else:
            ref.error = RuntimeError(f"in the Pathways service: {content['error']}")
        ref.event.set()

    def _on_disconnect(self) -> None:
        if self.island is not None:  # (connected: a closed connection now is the service going away)
            self.lose(
                f"the service (pid {self.info.get('pid')}, connection file {self.path}) closed its connection: "
                f"it stopped or was killed. Arrays that lived there, kept ones included, are gone"
            )

    def _on_tick(self) -> None:
        if self.error is not None:
            return
        self.hub.send(self.messages.pack("ping", {}))
        quiet = time.monotonic() - self.last_pong
        if quiet > SERVICE_LOST_AFTER_S:
            self.lose(
                f"the service (pid {self.info.get('pid')}, connection file {self.path}) has not answered for "
                f"{quiet:.0f} s: it stopped or was killed. Arrays that lived there, kept ones included, are gone"
            )

    def lose(self, why: str) -> IslandLostError:
        """The service is gone for this client: every waiting call and every later one raises, saying why."""
        if self.error is None:
            self.error = IslandLostError(f"Pathways service lost: {why}")  # (the island adds what to do)
            if self.island is not None:
                self.island.lost(self.error)
            for rid in list(self.pending):
                ref = self.pending.pop(rid, None)
                if ref is not None:
                    ref.error = self.error
                    ref.event.set()
            with self._turn:
                self._turn.notify_all()
        return self.error

    def hello(self, name: str | None, weight: float, timeout: float) -> dict:
        """Introduce this client (TimeoutError if the service does not answer): what `describe` says, and the tenant.

        A ping goes first from each socket that hears from the service, answered on that socket: a
        ROUTER knows a peer only once its connection is made, and drops a message to one it does not know.
        """
        self.hub.send(self.messages.pack("ping", {}))
        if not self._ponged.wait(timeout):
            raise TimeoutError(f"no answer from the Pathways service at {address(self.info)} in {timeout} s")
        with self._reader:  # (no other thread uses the link yet: its first message is the pong)
            send(self._in, self.messages.pack("ping", {}))
            deadline = time.monotonic() + timeout
            while not self._in.poll(100):  # (in slices: Ctrl-C)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer from the Pathways service at {address(self.info)} in {timeout} s")
            self._on_frames(recv(self._in))
        return self.call("hello", name, float(weight), os.getpid(), self.reply_id, self.beats_id, timeout=timeout)

    def close(self) -> None:
        self._closing = True
        self.hub.stop()
        with self._send_lock:
            self._out.close(linger=0)
        if self._reader.acquire(timeout=2.0):  # (a reader leaves within a poll's slice once closing)
            self._in.close(linger=0)
            self.ctx.term()


class ClientInfo(NamedTuple):
    """One client of the service, as `pw.clients()` lists it."""

    name: str
    weight: float
    device_time_s: float
    runs: int
    nodes: int
    pid: int
    connected_s: float
    you: bool


class Connection:
    """This process's connection to a service: its link, the island it is, the tenant it is there."""

    def __init__(self, link: ServiceLink, remote: RemoteIsland, ctrl: Controller | None, tenant: str, weight: float):
        self.link = link
        self.remote = remote
        self.island = remote.island
        self.controller = ctrl
        self.tenant = tenant
        self.weight = weight
        self._kept_slices: dict[tuple, Any] = {}

    @property
    def alive(self) -> bool:
        return self.link.error is None

    def __repr__(self) -> str:
        state = "" if self.alive else ", lost"
        return (
            f"<pw_kernel client {self.tenant!r} (weight {self.weight:g}) of the service at {self.link.path}: "
            f"island {self.island.id}, {len(self.island.devices)} {self.remote.info['platform']} devices{state}>"
        )


_conn: Connection | None = None
_conn_lock = threading.Lock()


def _connection(api: str) -> Connection:
    c = _conn
    if c is None:
        raise PathwaysError(f"`{api}` needs a connection to a Pathways service: call `pw.connect()` first.")
    if not c.alive:
        raise c.link.error
    return c


def connect(connection_file: str | None = None, *, name: str | None = None, weight: float = 1.0,
            timeout: float = 10.0) -> Connection:
    """Make this process a client of the Pathways service (default: this user's local one).

    From then on `pw.slice(n)` places slices on the service's devices, and
    `pw.compiled` functions and programs on them run there, scheduled with
    every other client's work, this one's share of device time set by
    ``weight``. Values stay in the service until `.result()` asks for them.

    Example::

        import pw_kernel as pw
        pw.connect(name="alice", weight=2)
        s = pw.slice(4, mesh={"data": 4})
        f = pw.compiled(lambda x: x * 2, slice=s)
        f(jnp.ones(8)).result()
    """
    global _conn
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
        raise ArgumentError(f"`pw.connect(weight=...)` must be a positive number (a share of device time); got {weight!r}.")
    if name is not None and (not isinstance(name, str) or not name):
        raise ArgumentError(f"`pw.connect(name=...)` must be a non-empty str or None; got {name!r}.")
    path, info = read_connection_file(connection_file, "pw.connect")
    _check_alive(path, info)
    if info.get("pid") == os.getpid():  # its own controller would wait on the service, which waits on it
        raise PathwaysError(
            f"`pw.connect`: the service in {path} runs in this very process (`serve(background=True)`), whose "
            f"controller it is; a process cannot also be its client. Use the devices here directly (no "
            f"`pw.connect`), and connect from the other notebooks."
        )
    with _conn_lock:
        if _conn is not None:
            _disconnect_locked()
        link = ServiceLink(path, info)
        try:
            hello = link.hello(name, weight, timeout)
            t0 = time.perf_counter_ns()
            remote_now = link.call("clock", timeout=timeout)
            t1 = time.perf_counter_ns()
        except TimeoutError:
            link.close()
            raise PathwaysError(
                f"`pw.connect`: the service in {path} ({address(info)}, pid {info.get('pid')}) did not answer "
                f"in {timeout:g} s. It is not running (a stale connection file: start it with "
                f"`python -m pw_kernel serve`), or its key is not this file's."
            ) from None
        except BaseException:
            link.close()
            raise
        n = len(hello["devices"])
        if len(jax.devices()) < n:
            link.call("bye", timeout=timeout)
            link.close()
            raise PathwaysError(
                f"`pw.connect`: the service has {n} devices; tracing for them needs {n} local stand-in devices, but "
                f"this process has {len(jax.devices())}. Start it with PW_NUM_CPU_DEVICES={n} and JAX_PLATFORMS=cpu "
                f"(a client needs no accelerator)."
            )
        remote = RemoteIsland(ServiceActor(link), hello, (t0 + t1) // 2 - remote_now, link=link)
        link.island = remote
        _conn = Connection(link, remote, None, hello["tenant"], float(weight))
        _attach(_conn, controller())
        _say_goodbye_at_exit()
        on_controller_replaced(_follow)
        return _conn


def _attach(conn: Connection, ctrl: Controller) -> None:
    """Make the service an island of ``ctrl``, where its unplaced slices go."""
    (island,) = ctrl.add_remote_islands([conn.remote])
    ctrl.events.island_names[island.id] = f"island {island.id} (service pid {conn.remote.info['pid']})"
    _route_slices(ctrl, island.id)
    conn.controller, conn.island = ctrl, island
    conn._kept_slices.clear()


def _follow(old: Controller | None, new: Controller) -> None:
    # `pw.init()` after `pw.connect()`: the connection goes on, on the new controller (the old one's
    # slices and arrays are gone with it, as they are after any `pw.init()`).
    c = _conn
    if c is not None and c.alive and c.controller is old:
        _attach(c, new)


_atexit_registered = False


def _say_goodbye_at_exit() -> None:
    # A process that ends while connected frees its share of the service at once, not after heartbeats stop.
    global _atexit_registered
    if not _atexit_registered:
        import atexit

        atexit.register(disconnect)
        _atexit_registered = True


def _check_alive(path: str, info: dict) -> None:
    """A service on this host whose process is gone left a stale file: say so now, not after a timeout."""
    import socket

    pid = info.get("pid")
    if not pid or info.get("ip") not in ("127.0.0.1", "localhost", socket.gethostname()):
        return
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise PathwaysError(
            f"`pw.connect`: the service that wrote {path} (pid {pid}) is no longer running (it was stopped "
            f"or killed without removing its file). Start it again: `python -m pw_kernel serve`, then `pw.connect()`."
        ) from None
    except PermissionError:  # (another user's process: not ours to judge; the handshake will tell)
        pass


def _route_slices(ctrl: Controller, island_id: int | None) -> None:
    """`pw.slice` without ``island=`` goes to the service's island (None: back to this process's devices).

    An instance attribute over `Controller.slice`: the runtime has no setting for where unplaced slices
    go, and this package may not change it (a hook it would want: ``Controller.default_island``).
    """
    if island_id is None:
        ctrl.__dict__.pop("slice", None)
        return

    def slice(n=None, mesh=None, name=None, island=None, axis_types=None):
        if island is None and not isinstance(mesh, jax.sharding.Mesh):
            island = island_id
        return Controller.slice(ctrl, n, mesh=mesh, name=name, island=island, axis_types=axis_types)

    ctrl.slice = slice


def _disconnect_locked() -> bool:
    global _conn
    c, _conn = _conn, None
    if c is None:
        return False
    if c.alive:
        try:
            c.link.call("bye", timeout=2.0)
        except Exception:  # (gone already: nothing to say goodbye to)
            pass
    c.link.lose("this client disconnected (`pw.disconnect()`); slices and arrays of the service are no longer usable")
    if not c.controller.closed:
        _route_slices(c.controller, None)
    c.link.close()
    return True


def disconnect() -> bool:
    """Stop being a client: the service cancels this client's runs and frees its arrays (kept trees stay).

    Returns whether there was a connection. Slices go back to this process's devices.

    Example::

        pw.disconnect()
    """
    with _conn_lock:
        return _disconnect_locked()


def clients() -> list[ClientInfo]:
    """The service's clients: name, weight, device time used (s, compiles left out), runs, nodes run, pid; ``you`` marks this one.

    Example::

        for c in pw.clients():
            print(c.name, c.weight, f"{c.device_time_s:.2f} s", c.runs)
    """
    c = _connection("pw.clients")
    return [ClientInfo(**d) for d in c.link.call("clients", timeout=30)]


def _check_name(api: str, name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"`{api}` needs a non-empty str name; got {name!r}.")


def keep(name: str, tree: Any) -> None:
    """Pin a tree of arrays / futures in the service under ``name``: it outlives this client.

    Any client of the same user gets it back with `pw.kept(name)`, also after this
    kernel restarts. Futures are waited for (their values must exist to be kept).
    Leaves that are Python numbers or strings are kept as they are. Keeping under a
    name again replaces what was there.

    Example::

        state = train_step(state, batch)
        pw.keep("state", state)
        # ... kernel restart ...
        pw.connect(); state = pw.kept("state")
    """
    _check_name("pw.keep", name)
    c = _connection("pw.keep")
    leaves, treedef = jax.tree.flatten(tree)
    sent = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, (bool, int, float, str)):
            sent.append(("c", leaf))
            continue
        x = leaf.remote_array() if isinstance(leaf, Future) else leaf
        if not isinstance(x, RemoteArray) or x.island is not c.remote:
            raise ArgumentError(
                f"`pw.keep({name!r}, tree)`: leaf {i} is a {type(leaf).__name__} that does not live in the service. "
                f"Keep what programs computed there (futures, or arrays from `pw.kept`), and Python numbers or "
                f"strings; to keep a local array, pass it through a `pw.compiled` function on a slice first."
            )
        x.block_until_ready()  # (made by a run that the service has seen: its handle names a buffer there)
        mesh = x.sharding.mesh
        layout = (tuple(mesh.devices.shape), tuple(mesh.axis_names), tuple(range(mesh.devices.size)))
        sent.append(("a", x.handle, tuple(x.shape), str(x.dtype), layout, tuple(x.sharding.spec)))
    c.link.call("keep", name, sent, pickle.dumps(treedef), timeout=60)


def kept(name: str | None = None, *, slice=None) -> Any:
    """A tree kept in the service (`pw.keep`), as handles on the same devices; without a name, the kept names.

    The leaves are `pw.RemoteArray` handles: pass them to programs and compiled
    functions like arrays, or ``np.asarray(x)`` to fetch one. ``slice=`` (a slice of
    the same mesh shape) says which slice they count as placed on, so a program on
    that slice reads them with no transfer.

    Example::

        pw.kept()                     # ['state']
        state = pw.kept("state", slice=s)
    """
    c = _connection("pw.kept")
    if name is None:
        return c.link.call("kept", None, timeout=30)
    _check_name("pw.kept", name)
    found = c.link.call("kept", name, timeout=30)
    if found is None:
        names = c.link.call("kept", None, timeout=30)
        raise ArgumentError(f"`pw.kept({name!r})`: nothing is kept under that name; kept names: {names}.")
    metas, treedef = found
    handles = [c.remote.new_handle() for m in metas if m[0] == "a"]
    c.link.call("adopt", name, handles, timeout=30)
    values = []
    it = iter(handles)
    for m in metas:
        if m[0] == "c":
            values.append(m[1])
            continue
        _, shape, dtype, layout, spec = m
        s = _kept_slice(c, layout, slice)
        values.append(c.remote.existing(next(it), tuple(shape), dtype, s.sharding(*spec), s))
    return jax.tree.unflatten(pickle.loads(treedef), values)


def _kept_slice(c: Connection, layout, given):
    shape, names = tuple(layout[0]), tuple(layout[1])
    if given is not None and tuple(given.mesh.devices.shape) == shape and tuple(given.mesh.axis_names) == names:
        return given
    s = c._kept_slices.get((shape, names))
    if s is None or s.released:
        size = 1
        for k in shape:
            size *= k
        s = c._kept_slices[(shape, names)] = c.controller.slice(
            size, mesh=dict(zip(names, shape)), island=c.island.id
        )
    return s


def unkeep(name: str) -> bool:
    """Forget a kept tree (its buffers are freed once no client holds them); returns whether it existed.

    Example::

        pw.unkeep("state")
    """
    _check_name("pw.unkeep", name)
    return bool(_connection("pw.unkeep").link.call("unkeep", name, timeout=30))


def stats() -> dict:
    """What the service holds for this client and in all (buffers, live arrays, refused messages): for tests."""
    return _connection("pw_kernel.service.stats").link.call("stats", timeout=30)

"""The client's side: `pw.connect()` makes this process a client of the service, as a `Session`.

The session owns its link (`link.ServiceLink`) and the island the service's
devices are in this process's controller (a `RemoteIsland`: tracing,
planning, dispatch order, futures and widgets stay this process's), and makes
that island where `pw.slice` places slices (`Controller.default_island`).
What crosses is what a Ray island gets: each node's executable once
(`jax.export`), then "run key on handles" requests; values stay in the
service until `.result()`.

A session lives as long as its controller does, or until `pw.disconnect()`:
`pw.init()` keeps it (on the new controller), `pw.shutdown()` ends it (the
service frees this client's runs and buffers; `pw.clients()` then says to
connect again).
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from typing import Any, NamedTuple

import jax

from ..runtime import ArgumentError, Future, IslandLostError, PathwaysError, ProtocolError, RemoteArray, controller, put
from ..runtime import TimeoutError as PathwaysTimeout
from ..runtime.extend import Controller, RemoteIsland, on_controller_replaced, remote_slice
from .link import ServiceLink
from .memory import parse_bytes
from .protocol import PROTOCOL_VERSION, Adopt, Bye, Clients, Clock, Islands, Keep, KeptTree, Pool, Stats, Unkeep
from .wire import address, pid_running, read_connection_file

log = logging.getLogger("pw_kernel.service")


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


class Session:
    """This process as a client of a service: its link, the island the service is here, its tenant there.

    Example::

        session = pw.connect(name="alice")
        session.alive, session.tenant      # (True, 'alice')
        session.close()                    # = pw.disconnect()
    """

    def __init__(self, link: ServiceLink, remote: RemoteIsland, ctrl: Controller | None, tenant: str, weight: float,
                 others: list[RemoteIsland] = ()):
        self.link = link
        self.remote = remote  # the service's own devices (its island 0): where slices go by default
        self.others = list(others)  # its other islands: each Ray node's, with `serve --ray`
        self.island = remote.island
        self.controller = ctrl
        self.tenant = tenant
        self.weight = weight
        self._kept_slices: dict[tuple, Any] = {}

    @property
    def alive(self) -> bool:
        return self.link.error is None

    def close(self) -> bool:
        """End this session (`pw.disconnect()` if it is the process's)."""
        with _conn_lock:
            if _conn is self:
                return _disconnect_locked()
        return False

    def __repr__(self) -> str:
        state = "" if self.alive else ", lost"
        return (
            f"<pw_kernel client {self.tenant!r} (weight {self.weight:g}) of the service at {self.link.path}: "
            f"island {self.island.id}, {len(self.island.devices)} {self.remote.info['platform']} devices{state}>"
        )


_conn: Session | None = None
_conn_lock = threading.Lock()


def _connection(api: str) -> Session:
    c = _conn
    if c is None:
        raise PathwaysError(f"`{api}` needs a connection to a Pathways service: call `pw.connect()` first.")
    if not c.alive:  # (kept for every later call: each raise starts a traceback of its own, `errors.at_rest`)
        raise c.link.error.with_traceback(None)
    return c


def connect(connection_file: str | None = None, *, name: str | None = None, weight: float = 1.0,
            memory: int | str | None = None, timeout: float = 10.0) -> Session:
    """Make this process a client of the Pathways service (default: this user's local one).

    From then on `pw.slice(n)` places slices on the service's devices, and
    `pw.compiled` functions and programs on them run there, scheduled with
    every other client's work, this one's share of device time set by
    ``weight``. Values stay in the service until `.result()` asks for them.
    ``memory`` (bytes, or a str such as ``"4GiB"``) caps what this client may
    hold on each of the service's devices: a call that would hold more is
    refused (`pw.AdmissionError`) while other clients go on.

    This process never opens an accelerator: called before anything started
    JAX (the first pw call in a fresh kernel), it makes JAX CPU-only, with as
    many stand-in CPU devices as the service has (slices are traced on them;
    nothing runs there). In a process whose JAX already started on a GPU or
    TPU it refuses, and says how to restart.

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
    memory = parse_bytes(memory, "pw.connect(memory=...)")
    path, info = read_connection_file(connection_file, "pw.connect")
    _check_alive(path, info)
    if info.get("protocol", PROTOCOL_VERSION) != PROTOCOL_VERSION:
        raise ProtocolError(
            f"`pw.connect`: the service in {path} speaks protocol version {info['protocol']} and this client "
            f"{PROTOCOL_VERSION}: they come from different pw_kernel versions. Use one pw_kernel for both: start "
            f"the service with this kernel's Python (`python -m pw_kernel serve`), or connect from a kernel of "
            f"the service's environment."
        )
    stand_ins(int(info.get("stand_ins") or info.get("devices") or 1), info.get("platform", "?"))
    with _conn_lock:
        if _conn is not None:
            _disconnect_locked()
        link = ServiceLink(path, info)
        try:
            hello = link.hello(name, weight, timeout, memory)
            t0 = time.perf_counter_ns()
            remote_now = link.call(Clock(), timeout=timeout)
            t1 = time.perf_counter_ns()
        except PathwaysTimeout:
            link.close()
            raise PathwaysError(
                f"`pw.connect`: the service in {path} ({address(info)}, pid {info.get('pid')}) did not answer "
                f"in {timeout:g} s. It is not running (a stale connection file: start it with "
                f"`python -m pw_kernel serve`), or its key is not this file's."
            ) from None
        except BaseException:
            link.close()
            raise
        rebound = _rebind(link, hello, (t0 + t1) // 2 - remote_now, weight)
        if rebound is not None:  # (the service restarted: this process's island goes on in it)
            return rebound
        offset = (t0 + t1) // 2 - remote_now  # (every island's times come on the service's clock)
        remote = RemoteIsland(link, hello, offset)
        others = [RemoteIsland(link, {**i, "service_pid": hello["pid"]}, offset, shares=remote)
                  for i in hello.get("islands", ())]
        link.island, link.others = remote, others
        _conn = Session(link, remote, None, hello["tenant"], float(weight), others)
        _attach(_conn, controller())
        _say_goodbye_at_exit()
        on_controller_replaced(_follow)
        return _conn


def stand_ins(n: int, platform: str) -> None:
    """Make this process's JAX CPU-only with ``n`` stand-in devices, before it starts: a client never opens an
    accelerator (JAX would take 75% of a GPU's memory in each notebook, the memory the service is there to share).

    Slices on the service are traced on the stand-ins; nothing runs on them. Where JAX already started, it
    must be on the CPU with at least ``n`` devices; else `pw.PathwaysError` says how to restart.
    """
    from ..runtime.extend import backends_started

    if not backends_started():
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", n)
        return
    devices = jax.devices()
    if devices[0].platform != "cpu":
        raise PathwaysError(
            f"`pw.connect`: JAX in this process already started on {len(devices)} {devices[0].platform} device(s), "
            f"so this notebook holds accelerator memory the service ({n} {platform} devices) is there to share. "
            f"Restart the kernel and call `pw.connect()` before any JAX computation (it makes this process "
            f"CPU-only), or start Jupyter with JAX_PLATFORMS=cpu."
        )
    if len(devices) < n:
        raise PathwaysError(
            f"`pw.connect`: the service has {n} devices; tracing for them needs {n} stand-in CPU devices here, but "
            f"JAX already started in this process with {len(devices)}. Restart the kernel and call `pw.connect()` "
            f"before any JAX computation (it sets the count), or start it with PW_NUM_CPU_DEVICES={n}."
        )


def _attach(conn: Session, ctrl: Controller) -> None:
    """Make the service an island of ``ctrl``, where its unplaced slices go."""
    island, *others = ctrl.add_remote_islands([conn.remote, *conn.others])
    ctrl.events.island_names[island.id] = f"island {island.id} (service pid {conn.remote.info['pid']})"
    _name(ctrl, others)
    ctrl.islands_from = lambda: _more_islands(conn)
    ctrl.default_island = island.id
    conn.controller, conn.island = ctrl, island
    conn._kept_slices.clear()


def _name(ctrl: Controller, islands) -> None:
    for i in islands:
        info = i.remote.info
        ctrl.events.island_names[i.id] = (
            f"island {i.id} (service pid {info['service_pid']}, its island {info['island']}: Ray on {info['host']})"
        )


def _more_islands(conn: Session) -> list:
    """The service's islands this client does not have yet (a Ray node that joined or came back), added here."""
    have = {r.info["island"] for r in conn.others if r.alive}
    new = [RemoteIsland(conn.link, {**i, "service_pid": conn.remote.info["pid"]}, conn.remote.offset_ns,
                        shares=conn.remote)
           for i in conn.link.call(Islands(), timeout=30) if i["island"] not in have]
    if not new:
        return []
    conn.others += new
    conn.link.others = [*conn.link.others, *new]
    added = conn.controller.add_remote_islands(new)
    _name(conn.controller, added)
    return added


def _follow(old: Controller | None, new: Controller | None) -> None:
    # `pw.init()` after `pw.connect()`: the connection goes on, on the new controller (the old one's
    # slices and arrays are gone with it, as they are after any `pw.init()`). `pw.shutdown()` (new is
    # None): the connection ends with the controller it served.
    c = _conn
    if c is None or c.controller is not old:
        return
    if new is None or not c.alive:
        c.close()
    else:
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
    if not pid_running(pid):  # (another user's process runs: not ours to judge; the handshake will tell)
        raise PathwaysError(
            f"`pw.connect`: the service that wrote {path} (pid {pid}) is no longer running (it was stopped "
            f"or killed without removing its file). Start it again: `python -m pw_kernel serve`, then `pw.connect()`."
        )


def _disconnect_locked() -> bool:
    global _conn, _lost
    c, _conn = _conn, None
    if c is None:
        return False
    _lost = None if c.alive else c  # (its service went away: the next `connect` may rebind its island)
    if c.alive:
        try:
            c.link.call(Bye(), timeout=2.0)
        except Exception:  # (gone already: nothing to say goodbye to)
            pass
    c.link.lose("this client disconnected (`pw.disconnect()`); slices and arrays of the service are no longer usable")
    if c.controller.default_island == c.island.id:
        c.controller.default_island = None
    c.controller.islands_from = None
    c.link.close()
    return True


#: The session whose service went away, while `connect` may still rebind its island to the next service.
_lost: Session | None = None


def _rebind(link: ServiceLink, hello: dict, offset_ns: int, weight: float) -> Session | None:
    """After the service restarted: the session that lost it goes on there, its island the same, or None.

    Its slices stay valid and its compiled functions send their executables again on first use
    (`RemoteIsland.rebind`); arrays made before say they are gone and what to re-run. Only for the same
    connection file, a new service process and the same controller; a service of another device count or
    platform raises, and the next `pw.connect()` connects afresh.
    """
    global _conn, _lost
    old, _lost = _lost, None
    if old is None or old.link.path != link.path or hello["pid"] == old.remote.info["pid"]:
        return None
    ctrl = old.controller
    if ctrl is not controller() or not any(i is old.island for i in ctrl.islands):
        return None
    was, now = old.remote.info, hello
    if len(now["devices"]) != len(was["devices"]) or now["platform"] != was["platform"]:
        link.call(Bye(), timeout=10)
        link.close()
        raise PathwaysError(
            f"`pw.connect`: the service restarted with {len(now['devices'])} {now['platform']} devices (pid "
            f"{now['pid']}), where the one before had {len(was['devices'])} {was['platform']} (pid {was['pid']}): "
            f"this notebook's slices and compiled functions on island {old.island.id} cannot come back. Call "
            f"`pw.connect()` again (it connects afresh), then `pw.init()` and re-run the cells that make them."
        )
    names = link.call(KeptTree(None), timeout=30)
    again = (
        "Re-run the cell that made it; trees kept with `pw.keep` are back in the new service: get them with "
        f"`pw.kept(name)` (kept now: {names})."
    )
    old.remote.rebind(link, hello, offset_ns, again)
    old.link, old.tenant, old.weight = link, hello["tenant"], float(weight)
    ctrl.events.island_names[old.island.id] = f"island {old.island.id} (service pid {hello['pid']})"
    ctrl.default_island = old.island.id
    _conn = old
    return old


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
    return [ClientInfo(**d) for d in c.link.call(Clients(), timeout=30)]


def pool(*, window_s: float = 30.0, every_s: float = 1.0):
    """A live view of the whole pool: a lane per service device with every client's nodes, shares, queues, memory.

    Bars are coloured by client (the legend gives name and weight); below them each
    client's share of the pool's device time per second, runs queued and bytes held.
    Every client's work is shown, named: all clients of a service are the same user
    (the connection file is theirs alone; every message is signed with its key).
    The view follows the latest ``window_s`` seconds of activity and asks the
    service again every ``every_s`` seconds while it is displayed.

    Example::

        pw.connect(name="eval")
        pw.pool()          # why did my step wait? the trainer's bars on the same devices say
    """
    if not (isinstance(window_s, (int, float)) and window_s > 0 and isinstance(every_s, (int, float)) and every_s > 0):
        raise ArgumentError(
            f"`pw.pool(window_s=..., every_s=...)` take positive seconds; got window_s={window_s!r}, every_s={every_s!r}."
        )
    c = _connection("pw.pool")
    from ..widgets.pool import PoolWidget

    return PoolWidget(lambda since_ns: c.link.call(Pool(int(since_ns)), timeout=30), window_s=window_s, every_s=every_s)


def pool_data(since_ns: int = 0) -> dict:
    """What the pool did lately, as the plain dict `pw.pool()` draws (`pool.pool_data` says its keys).

    Example::

        d = pool_data()
        {c["name"]: c["memory_bytes"] for c in d["clients"]}
    """
    return _connection("pw_kernel.service.pool_data").link.call(Pool(int(since_ns)), timeout=30)


def _check_name(api: str, name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"`{api}` needs a non-empty str name; got {name!r}.")


def keep(name: str, tree: Any) -> None:
    """Pin a tree of arrays / futures in the service under ``name``: it outlives this client.

    Any client of the same user gets it back with `pw.kept(name)`, also after this
    kernel restarts. Futures are waited for (their values must exist to be kept).
    Leaves that are Python numbers or strings are kept as they are. Keeping under a
    name again replaces what was there. The service writes the tree to its state
    folder before this returns (`pw_kernel.service.store`), so it survives the
    service being killed and started again too; that costs a copy of its arrays
    to the service's host memory and a write of their bytes, plus orbax's
    fixed cost (tens of milliseconds), while the service answers no other
    notebook's request.

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
        if isinstance(x, jax.Array) and remote_slice(c.controller.resources, x.sharding) is not None:
            x = put(x, x.sharding, c.controller.resources)  # placed on a service slice with `jax.device_put`
        if not isinstance(x, RemoteArray) or x.island.primary is not c.remote:  # (any of the service's islands)
            raise ArgumentError(
                f"`pw.keep({name!r}, tree)`: leaf {i} is a {type(leaf).__name__} that does not live in the service. "
                f"Keep what programs computed there (futures, arrays from `pw.kept` or `pw.put`), and Python "
                f"numbers or strings; to keep a local array, place it first: `pw.put(x, s.sharding(...))` with `s` "
                f"a slice of the service."
            )
        if x.generation != x.island.generation:
            raise x.island.stale(x, f"`pw.keep({name!r}, tree)`, leaf {i}")
        x.block_until_ready()  # (made by a run that the service has seen: its handle names a buffer there)
        mesh = x.sharding.mesh
        where = x.island.info.get("island", 0)  # (which of the service's islands: a Ray node's, or its own)
        layout = (tuple(mesh.devices.shape), tuple(mesh.axis_names), tuple(range(mesh.devices.size)))
        layout += (where,) if where else ()
        sent.append(("a", x.handle, tuple(x.shape), str(x.dtype), layout, tuple(x.sharding.spec)))
    c.link.call(Keep(name, sent, pickle.dumps(treedef)), timeout=60)


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
        return c.link.call(KeptTree(None), timeout=30)
    _check_name("pw.kept", name)
    found = c.link.call(KeptTree(name), timeout=30)
    if found is None:
        names = c.link.call(KeptTree(None), timeout=30)
        raise ArgumentError(f"`pw.kept({name!r})`: nothing is kept under that name; kept names: {names}.")
    metas, treedef = found
    handles = [c.remote.new_handle() for m in metas if m[0] == "a"]
    c.link.call(Adopt(name, handles), timeout=30)
    values = []
    it = iter(handles)
    for m in metas:
        if m[0] == "c":
            values.append(m[1])
            continue
        _, shape, dtype, layout, spec = m
        r = _kept_island(c, layout)
        s = _kept_slice(c, layout, slice, r)
        values.append(r.existing(next(it), tuple(shape), dtype, s.sharding(*spec), s))
    return jax.tree.unflatten(pickle.loads(treedef), values)


def _kept_island(c: Session, layout) -> RemoteIsland:
    """This client's island for the service island a kept array lives on; `pw.IslandLostError` if it is gone."""
    where = layout[3] if len(layout) > 3 else 0
    for r in (c.remote, *c.others):
        if r.info.get("island", 0) == where and r.alive:
            return r
    raise IslandLostError(
        f"`pw.kept`: this tree lives on the service's island {where} (a Ray node's), which is gone or not yet "
        f"this client's: `pw.add_ray_islands()` adds the islands the service has now."
    )


def _kept_slice(c: Session, layout, given, r: RemoteIsland):
    shape, names = tuple(layout[0]), tuple(layout[1])
    if (given is not None and given.island is r.island and tuple(given.mesh.devices.shape) == shape
            and tuple(given.mesh.axis_names) == names):
        return given
    s = c._kept_slices.get((shape, names, r.island.id))
    if s is None or s.released:
        size = 1
        for k in shape:
            size *= k
        s = c._kept_slices[(shape, names, r.island.id)] = c.controller.slice(
            size, mesh=dict(zip(names, shape)), island=r.island.id
        )
    return s


def unkeep(name: str) -> bool:
    """Forget a kept tree (its buffers are freed once no client holds them); returns whether it existed.

    Example::

        pw.unkeep("state")
    """
    _check_name("pw.unkeep", name)
    return bool(_connection("pw.unkeep").link.call(Unkeep(name), timeout=30))


def stats() -> dict:
    """What the service holds for this client and in all (buffers, live arrays, refused messages): for tests."""
    return _connection("pw_kernel.service.stats").link.call(Stats(), timeout=30)

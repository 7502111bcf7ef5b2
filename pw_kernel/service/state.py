"""The service's state, apart from its I/O: the clients, their buffers and runs, kept trees, slices, stories.

`ServiceState` is what `handlers.Handlers` read and change; `server.Service`
owns the sockets, the inbox and the heartbeats, and calls in with messages
already read and checked. One thread at a time holds it (the worker, or the
socket thread for a quick request: `server.Service` takes its lock).

Every client is one `Client` record (its sockets' identities included),
found by the identity of the socket it sends on, of the one its heartbeats
come from, or by its tenant name: `Registry` keeps the three indexes together.
A request's story (`RequestStory`) follows it from arrival to its reply, with
the runs it made, as a run's story does in the controller.

Example::

    state = ServiceState(ctrl, devices)
    c = state.hello(ident, "alice", Hello(PROTOCOL_VERSION, "alice", 2.0, pid, reply_to, beats))
    state.story.of("alice-7")          # [StoryRow(...received...), ..., StoryRow(...replied...)]
"""

from __future__ import annotations

import collections
import gc
import logging
import os
import socket as _socket
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

from ..runtime import IslandLostError, ProtocolError
from .clients import Client, Kept, retire
from .pool import PoolRecord
from .memory import Buffers
from .protocol import PROTOCOL_VERSION, Hello

log = logging.getLogger("pw_kernel.service")

#: Rows of request stories kept (a ring: the oldest go first).
STORY_ROWS = 20_000


class StoryRow(NamedTuple):
    """One step of a request's way through the service."""

    stimulus: str  # "<tenant>-<request id>"
    request: str  # its message's class
    event: str  # "received", "runs <ids>", "deferred", "replied", "failed: ..."
    t_ns: int


class RequestStory:
    """Each request's way through the service, from its arrival to its reply (a bounded ring of rows).

    Example::

        story.add("alice-7", "RunMany", "received")
        story.of("alice-7")
    """

    def __init__(self, rows: int = STORY_ROWS) -> None:
        self.rows: collections.deque[StoryRow] = collections.deque(maxlen=rows)

    def add(self, stimulus: str, request: str, event: str, t_ns: int = 0) -> None:
        """One row; ``t_ns``: when it happened, if not now (``perf_counter_ns``)."""
        self.rows.append(StoryRow(stimulus, request, event, t_ns or time.perf_counter_ns()))

    def of(self, stimulus: str) -> list[StoryRow]:
        """The rows of one request, in order (for a person or a test: it reads the whole ring)."""
        return [r for r in list(self.rows) if r.stimulus == stimulus]


class Registry:
    """The connected clients, by the identity of each of their sockets and by tenant name (kept together)."""

    def __init__(self) -> None:
        self.by_ident: dict[bytes, Client] = {}  # the socket a client sends requests on
        self.by_beat: dict[bytes, Client] = {}  # the socket its heartbeats come from
        self.by_tenant: dict[str, Client] = {}

    def add(self, c: Client) -> None:
        self.by_ident[c.ident] = c
        self.by_beat[c.beats_from] = c
        self.by_tenant[c.tenant] = c

    def remove(self, ident: bytes) -> Client | None:
        c = self.by_ident.pop(ident, None)
        if c is not None:
            self.by_beat.pop(c.beats_from, None)
            self.by_tenant.pop(c.tenant, None)
        return c

    def get(self, ident: bytes) -> Client | None:
        return self.by_ident.get(ident)

    def __iter__(self):
        return iter(list(self.by_ident.values()))

    def __len__(self) -> int:
        return len(self.by_ident)


class ServiceState:
    """What the service holds: its controller and devices, the clients, kept trees, slices, request stories."""

    def __init__(self, ctrl, devices, collect: Callable[[], Any] = gc.collect, retiring=None) -> None:
        self.ctrl = ctrl
        self.devices = devices
        self.clients = Registry()
        self.kept: dict[tuple[str, str], Kept] = {}
        self.slices: dict[tuple, Any] = {}
        self.story = RequestStory()
        self.pool_record = PoolRecord(ctrl.events.epoch)  # what the pool did lately (`pool.py`)
        self.refused = 0
        self.profiling: tuple | None = None  # (tenant, trace folder, anchor) of a client's open `pw.profile()`
        self._collect = collect
        self._retiring = retiring  # where a dropped client's leftovers are retired (a pool's submit)
        self.store = None  # the kept trees on disk (`store.KeptStore`), when the service has a state folder

    def describe(self) -> dict:
        """What a client is told at `Hello`: this host's devices (the service's island 0), and its other islands
        (each Ray node's, with ``serve --ray``): ``islands`` [{island, host, pid, platform, devices, device_kind}]."""
        d = self.devices
        return {
            "host": _socket.gethostname(), "pid": os.getpid(), "platform": d[0].platform,
            "export": jax.export.default_export_platform(),  # what a client exports its nodes for ('cuda', not 'gpu')
            "devices": [x.id for x in d], "device_kind": d[0].device_kind, "islands": self.remote_islands(),
        }

    def remote_islands(self) -> list[dict]:
        """The service's islands in other processes (a Ray node's actor each), alive ones, as clients see them."""
        return [
            {"island": i.id, "host": i.remote.info["host"], "pid": i.remote.info["pid"], "platform": i.platform,
             "export": i.remote.info.get("export"),
             "devices": list(i.remote.info["devices"]), "device_kind": i.remote.info.get("device_kind", ""),
             "node_id": i.remote.info.get("node_id"), "node_ip": i.remote.info.get("node_ip")}
            for i in self.ctrl.islands if i.remote is not None and i.remote.alive
        ]

    def lost_islands(self) -> tuple:
        """(island id, why) of each of the service's islands that is gone: every heartbeat's answer says so."""
        return tuple(
            (i.id, f"{i.remote.link.where(i.remote.info)}: {i.remote.error}")
            for i in self.ctrl.islands if i.remote is not None and not i.remote.alive
        )

    def island(self, island_id: int):
        """The service's island ``island_id``; `pw.IslandLostError` naming its host if it is gone."""
        for i in self.ctrl.islands:
            if i.id == island_id:
                if i.remote is not None and not i.remote.alive:
                    raise IslandLostError(
                        f"the service's island {island_id} ({i.remote.link.where(i.remote.info)}) is gone: "
                        f"{i.remote.error}. Place slices on the islands `pw.islands()` lists as alive."
                    )
                return i
        raise IslandLostError(f"the service has no island {island_id} (it lists {[i.id for i in self.ctrl.islands]})")

    def slice(self, layout) -> Any:
        """The service slice for a client's layout (mesh shape, axis names, device positions, island), made once."""
        key = (tuple(layout[0]), tuple(layout[1]), tuple(layout[2]), layout[3] if len(layout) > 3 else 0)
        s = self.slices.get(key)
        if s is None or s.released:
            shape, names, pos, where = key
            devices = self.devices if where == 0 else self.island(where).devices
            grid = np.array([devices[i] for i in pos], dtype=object).reshape(shape)
            s = self.slices[key] = self.ctrl.slice(mesh=Mesh(grid, names), island=where if where else None)
        return s

    # ------------------------------------------------------------ clients coming and going
    def hello(self, ident: bytes, user: str, msg: Hello) -> Client:
        """A client introduces itself: refused if it speaks another protocol version; else registered."""
        if not isinstance(msg, Hello) or msg.version != PROTOCOL_VERSION:
            theirs = getattr(msg, "version", "unknown")
            raise ProtocolError(
                f"`pw.connect`: this service speaks protocol version {PROTOCOL_VERSION} and the client "
                f"{theirs}: they come from different pw_kernel versions. Use one pw_kernel for both: start the "
                f"service with the client's Python (`python -m pw_kernel serve` in the notebook's environment), "
                f"or connect from a kernel of the service's environment."
            )
        if ident in self.clients.by_ident:  # the same client again (reconnected): its old state goes
            self.drop(ident, "reconnected")
        name = msg.name or f"client-{msg.pid}"
        tenant, k = name, 2
        while tenant in self.clients.by_tenant:
            tenant, k = f"{name}-{k}", k + 1
        c = Client(ident, name, tenant, float(msg.weight), user, msg.pid, bytes(msg.reply_to), bytes(msg.beats_from))
        c.memory = msg.memory
        self.clients.add(c)
        log.info("pw_kernel service: client %r (pid %s, weight %g) connected", tenant, msg.pid, msg.weight)
        return c

    def drop(self, ident: bytes, why: str) -> None:
        """A client is gone: forget it, free what it alone held (kept trees stay), cancel its runs.

        Cancelling a few hundred queued runs takes tens of milliseconds of the controller's time: that,
        freeing its buffers and the collection after are done by a pool thread (``retiring``), so other
        clients' requests queued behind this drop are not held up by it.
        """
        c = self.clients.remove(ident)
        if c is None:
            return
        c.gone = True  # (its runs, cancelled, are answered to nobody)
        c.stop_waiting()
        # What it held leaves with the retiring task: freeing a few hundred buffers (some still being
        # computed) took ~15 ms, and starting a thread for it ~7 ms, of this thread's time.
        held = (sorted(c.live, key=lambda r: r.id), c.buffers, c.executables)  # (the next to run first)
        c.buffers, c.executables, c.shipped, c.by_run, c.live = Buffers(), {}, {}, {}, set()
        said = f"client {c.tenant!r} dropped ({why}): {{}} runs cancelled, {len(held[1])} buffers freed"
        if self._retiring is None:
            retire(held, self._collect, said)
        else:
            self._retiring(retire, held, self._collect, said)
        del held

    def drop_all(self, why: str) -> None:
        for c in self.clients:
            self.drop(c.ident, why)

    def on_node_time(self, tenant: str, ns: int) -> None:
        """Device time of one of ``tenant``'s nodes (the controller's event)."""
        c = self.clients.by_tenant.get(tenant)
        if c is not None:
            c.device_ns += ns

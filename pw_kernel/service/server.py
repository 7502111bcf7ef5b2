"""The service process's I/O: its socket, inbox, worker and heartbeats; the state and handlers are apart.

One `Service` per connection file. Its socket thread (`Hub`) checks every
message's signature (a bad one is refused, counted and logged, never
answered) and answers heartbeats; requests go to one worker thread, each
client's in its order and the clients in turn (`Inbox`), or are answered on
the socket thread itself when quick and nothing of that client waits
(`_QUICK`: two thread hand-offs are most of a small call's latency). Either
way the request meets `handlers.Handlers` holding the state's lock, and its
answer leaves as a `protocol.Reply` or `protocol.Failed` through a `Replier`
(the one place replies are made, and each request's story written).

The service runs its own `Controller` (not the process's `pw.controller()`),
each client a `FairShare` tenant of its weight: so a process may host a
service and be a client of it too (a test, a notebook that serves).

Example::

    svc = Service()          # writes the connection file
    svc.story("alice-7")     # how request 7 of client alice went
    svc.stop()               # removes it
"""

from __future__ import annotations

import concurrent.futures
import gc
import getpass
import logging
import os
import threading
import time
from typing import Any

from ..runtime import Config, FairShare, NodeEvent, PathwaysError
from ..runtime.extend import Controller, ErrorEnvelope, configure_cpu_devices, ray_islands
from .clients import DEAD_AFTER_S, Heap
from .handlers import LATER, Handlers
from .inbox import Inbox
from .protocol import (
    HEARTBEAT_S,
    ONEWAY,
    PROTOCOL_VERSION,
    Cancel,
    Clock,
    Failed,
    Free,
    Get,
    GetMany,
    Hello,
    Ping,
    Pong,
    Request,
    RunMany,
)
from .dashboard import Dashboard
from .pool import pool_data
from .ray_nodes import RayNodes
from .state import ServiceState, StoryRow
from .store import KeptStore
from .wire import (
    Hub,
    Messages,
    default_connection_file,
    new_key,
    pid_running,
    read_connection_file,
    send,
    write_connection_file,
)

log = logging.getLogger("pw_kernel.service")

#: Requests the socket thread answers itself when nothing of the client's is queued (well under a millisecond;
#: loads, puts of big values, keeps and drops go to the worker, so heartbeats are never held up long).
_QUICK = (RunMany, Free, Get, GetMany, Clock, Cancel)

#: The service's controller: outputs are the clients' to keep (their handles), none of its own; the threads
#: that submit answer messages and never wait for room; its logs are short.
SERVICE_CONFIG = dict(keep_outputs=0, max_pending_runs=None, max_pending_outputs=None, inline_wait_s=0,
                      max_events=20_000, story_length=20_000)

_yield = getattr(os, "sched_yield", lambda: None)  # (Unix; elsewhere nothing)


class Replier:
    """How one request is answered: a `Reply` or a `Failed` to the client's reply socket, and its story written."""

    __slots__ = ("arrived", "id", "request", "service", "stimulus", "to")

    def __init__(self, service: Service, to: bytes, rid: int, stimulus: str, request: str):
        self.service = service
        self.to = to
        self.id = rid
        self.stimulus = stimulus
        self.request = request
        # Its "received" row is written with its next one (at its arrival time): for a call answered at once,
        # after the reply has gone, which does not wait for it.
        self.arrived = time.perf_counter_ns()

    def __call__(self, value: Any = None, error: BaseException | None = None) -> None:
        svc = self.service
        said = "replied"
        if error is None:
            try:
                frames = svc.messages.reply(self.id, value, self.to)
            except TypeError as e:  # (a value that cannot cross: the client hears why)
                error = e
        if error is not None:
            frames = svc.messages.pack(Failed(self.id, ErrorEnvelope.of(error)), self.to)
            said = f"failed: {type(error).__name__}"
        if svc.hub.send(frames):
            # Sent by the socket thread, which answered the request itself (a call at once on an idle pool): the
            # reply leaves on ZeroMQ's I/O thread, which the send just woke, and where the busy threads outnumber
            # the cores (a client spinning for its reply, this one) that thread would wait for this one's
            # bookkeeping below; this core is offered to it first (a waited call: ~30 µs less on 2 cores). A
            # reply from another thread (a run's, on a busy pool) is the socket thread's to send: no yield there
            # (yielding on every run's reply cost the weighted clients' shares ~0.15 of their 2:1 on 2 cores).
            _yield()
        self.story(said)  # (after the send: the client waits for that, not for this)

    def story(self, event: str) -> None:
        self.received()
        self.service.state.story.add(self.stimulus, self.request, event)

    def received(self) -> None:
        """Write its "received" row, if not yet written (by the first of the threads that write its story)."""
        arrived, self.arrived = self.arrived, 0
        if arrived:
            self.service.state.story.add(self.stimulus, self.request, "received", arrived)


class Service:
    """The Pathways service: owns this process's devices and runs a controller for its clients.

    Example::

        svc = Service()          # writes the connection file
        ...
        svc.stop()               # removes it
    """

    def __init__(self, connection_file: str | None = None, *, ip: str = "127.0.0.1", owns_process: bool = False,
                 state_dir: str | bool | None = None, dashboard: int | None = None, ray: str | None = None,
                 ray_devices: int | None = None):
        import zmq

        configure_cpu_devices()
        self.ctrl = Controller(Config(**SERVICE_CONFIG))
        self.ctrl.set_policy(FairShare())
        self.devices = list(self.ctrl.devices)
        self.ray_nodes: RayNodes | None = None  # with `ray`: the nodes watched (lost, added back: `ray_nodes.py`)
        if ray is not None:  # each Ray node's devices an island of this controller, as `pw.add_ray_islands` makes
            self.ctrl.add_remote_islands(ray_islands(None if ray == "local" else ray, devices_per_island=ray_devices))
            self.ray_nodes = RayNodes(self.ctrl, ray_devices).start()
        self.path = os.path.abspath(os.path.expanduser(connection_file or default_connection_file()))
        self._check_not_running(self.path)
        self.ctx = zmq.Context()
        sock = self.ctx.socket(zmq.ROUTER)
        sock.linger = 0
        sock.router_mandatory = False  # a reply to a client gone in between is dropped, not an error
        port = sock.bind_to_random_port(f"tcp://{ip}")
        self.info = {
            "transport": "tcp", "ip": ip, "port": port, "key": new_key(), "signature_scheme": "hmac-sha256",
            "pid": os.getpid(), "user": getpass.getuser(), "devices": len(self.devices),
            "platform": self.devices[0].platform, "kind": "pw_kernel service", "protocol": PROTOCOL_VERSION,
            # (a client lays out slices of every island on as many local stand-in devices as the largest has)
            "stand_ins": max([len(self.devices)] + [len(i.devices) for i in self.ctrl.islands]),
        }
        self.messages = Messages(self.info, "pw-service", routed=True)
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="pw-service-fetch")
        # The process is the service's alone: its collector's full passes skip what lives long (see `Heap`).
        self.heap = Heap() if owns_process else None
        collect = self.heap.collect_soon if self.heap is not None else gc.collect
        self.state = ServiceState(self.ctrl, self.devices, collect, self._pool.submit)
        # Kept trees live on disk too (`store.py`): the ones a killed service kept come back before anyone connects.
        if state_dir is None:
            state_dir = os.path.splitext(self.path)[0] + "-state"
        self.state_dir = os.path.abspath(os.path.expanduser(state_dir)) if state_dir else None
        self.state.store = KeptStore.open(self.state_dir, self.devices)
        if self.state.store is not None:
            self.state.kept.update(self.state.store.restore())
        self.handlers = Handlers(self.state, self._pool)
        self._inbox = Inbox()
        # The state is the holder's of `_lock`: the worker's, or the socket thread's for a quick request
        # of a client with nothing queued (`Inbox.idle`).
        self._lock = threading.Lock()
        self._unsubscribe = self.ctrl.events.subscribe(self._on_event)
        self._suspect_until = 0.0  # after a connection closed: its clients' sockets are probed until then
        self.hub = Hub(
            sock, self._on_frames, self._on_tick, HEARTBEAT_S, "pw-service-socket", on_disconnect=self._on_disconnect
        )
        self._worker = threading.Thread(target=self._work, name="pw-service-worker", daemon=True)
        self.stopped = threading.Event()
        self.hub.start()
        self._worker.start()
        write_connection_file(self.path, self.info)
        log.info("pw_kernel service: %d %s devices, connection file %s", len(self.devices), self.info["platform"],
                 self.path)
        self.dashboard: Dashboard | None = None  # the pool as a web page on 127.0.0.1 (`dashboard.py`), if asked
        if dashboard is not None:
            try:
                self.dashboard = Dashboard(self.pool_data, dashboard)
            except PathwaysError:
                self.stop()
                raise

    @staticmethod
    def _check_not_running(path: str) -> None:
        try:
            _, info = read_connection_file(path, "pw.serve")
        except PathwaysError:
            return
        pid = info.get("pid")
        if not pid or pid == os.getpid() or not pid_running(pid, only_mine=True):  # (a stale file)
            return
        raise PathwaysError(
            f"`pw.serve`: a service (pid {pid}) already runs with connection file {path}. Connect to it "
            f"(`pw.connect()`), stop it first, or serve with another file (`--connection-file PATH`)."
        )

    def pool_data(self, since_ns: int = 0) -> dict:
        """What the pool did lately (`pool.pool_data`), read in this process: what the dashboard serves.

        Example::

            svc.pool_data()["clients"]       # [{"name": "trainer", "share": 0.6, ...}, ...]
        """
        return pool_data(self.state.pool_record, self.state.clients, self.devices, since_ns)

    def story(self, stimulus: str) -> list[StoryRow]:
        """How one request went: ``stimulus`` is ``"<client's tenant>-<request id>"``.

        Example::

            for row in svc.story("alice-7"):
                print(row.event)        # received, runs 41, replied
        """
        return self.state.story.of(stimulus)

    # ------------------------------------------------------------ the socket thread
    def _on_frames(self, frames: list) -> None:
        try:
            idents, signed = self.messages.unpack(frames)
        except Exception as e:  # no key, a wrong key, a replay, garbage: refused, and said where
            self._refuse(frames, e)
            return
        ident, msg = idents[0], signed.body
        if type(msg) is Ping:  # (a client's heartbeat; or from its reply socket, once, at `hello`)
            c = self.state.clients.by_beat.get(ident)
            if c is not None:
                c.last_seen = time.monotonic()
            self.hub.send(self.messages.pack(Pong(c is not None, self.state.lost_islands()), ident))
            return
        if type(msg) is not Request:
            self._refuse(frames, ValueError(f"not a request: {type(msg).__name__}"))
            return
        # A quick request of a client with nothing queued is handled here, not handed to the worker.
        if isinstance(msg.body, _QUICK) and self._inbox.idle(ident) and self._lock.acquire(False):
            try:
                self._handle(ident, signed)
            finally:
                self._lock.release()
            return
        self._inbox.put(ident, signed)

    def _refuse(self, frames: list, why: Exception) -> None:
        self.state.refused += 1
        who = frames[0][:16] if frames else b"?"
        log.warning("pw_kernel service: refused a message from %r: %s", who, str(why)[:200])

    def _dropping(self, c, why: str) -> None:
        """Have the worker drop ``c`` next in its turn; what it sent and is not yet handled is discarded."""
        c.dropping = True
        gone = self._inbox.drop(c.ident, why)
        if gone:
            log.info("pw_kernel service: %d requests of client %r discarded (%s)", gone, c.tenant, why)

    def _on_disconnect(self) -> None:
        """Some connection closed (the monitor does not say whose): the clients whose socket is gone are dropped now.

        ZeroMQ forgets a peer's identity when its connection closes, and a message to an identity it
        does not know fails at once with ROUTER_MANDATORY: each client's receiving socket gets a pong
        so, and those that fail are gone (their process exited or was killed; a clean `bye` came first
        otherwise). ZeroMQ may still be tearing the closed pipe down as the monitor reports it: the probe
        is made again at each heartbeat tick meanwhile, for three heartbeats. A client that is only silent is
        not dropped for it before `DEAD_AFTER_S`: on a loaded host a live client's heartbeat can be late by
        more than three beats, and another peer's disconnect must not make that a reason to drop it.
        """
        self._suspect_until = time.monotonic() + 3 * HEARTBEAT_S
        self._probe()

    def _probe(self) -> None:
        """Drop the clients whose receiving socket ZeroMQ no longer knows (their connection closed)."""
        import zmq

        sock = self.hub.socket  # (this is its thread)
        sock.getsockopt(zmq.EVENTS)  # (ZeroMQ handles the closed pipes it was told of: their identities go)
        sock.router_mandatory = True
        try:
            for c in self.state.clients:
                if c.dropping:
                    continue
                try:
                    send(sock, self.messages.pack(Pong(True), c.reply_to))
                except zmq.ZMQError as e:
                    if e.errno != zmq.EHOSTUNREACH:
                        raise
                    self._dropping(c, "its connection closed: the process exited or was killed")
        finally:
            sock.router_mandatory = False

    def _on_tick(self) -> None:
        if self.heap is not None:
            self.heap.tick()
        now = time.monotonic()
        if self._suspect_until:
            self._probe()  # (a connection closed lately: the pipe ZeroMQ had not torn down yet is gone now)
            if now >= self._suspect_until:
                self._suspect_until = 0.0
        for c in self.state.clients:
            if not c.dropping and now - c.last_seen > DEAD_AFTER_S:
                self._dropping(c, "its heartbeats stopped: the process died or hangs")

    def _on_event(self, ev) -> None:
        if isinstance(ev, NodeEvent) and ev.kind != "compile":  # (device time is running time)
            self.state.on_node_time(ev.tenant, max(0, ev.end - ev.start))
            self.state.pool_record.on_node(ev)  # (a few appends: the pool's view, `pool.py`)

    # ------------------------------------------------------------ the worker thread
    def _work(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            with self._lock:
                try:
                    self._handle(*item)
                finally:
                    self._inbox.done()

    def _handle(self, ident: bytes, signed: Any) -> None:
        """Answer one request (or drop a client: ``signed`` is then why); holds ``_lock``."""
        state = self.state
        if isinstance(signed, str):
            state.drop(ident, signed)
            return
        request, body = signed.body, signed.body.body
        c = state.clients.get(ident)
        hello = type(body) is Hello
        to = c.reply_to if c is not None else bytes(body.reply_to) if hello else ident
        name = type(body).__name__
        reply = Replier(self, to, request.id, f"{c.tenant if c is not None else '?'}-{request.id}", name)
        try:
            if hello:
                c = state.hello(ident, signed.user, body)
                reply.stimulus = f"{c.tenant}-{request.id}"
                value = {**state.describe(), "tenant": c.tenant}
            elif c is None:
                raise PathwaysError(
                    "this service does not know the client (it was dropped after missing heartbeats, or the "
                    "service restarted): call `pw.connect()` again."
                )
            else:
                value = self.handlers.handle(c, body, reply)
        except Exception as e:
            log.debug("pw_kernel service: %s failed", name, exc_info=True)
            if not isinstance(body, ONEWAY):
                reply(error=e)
            reply.received()
            return
        if value is not LATER and not isinstance(body, ONEWAY):
            reply(value)
        reply.received()  # (a oneway request's only row; a deferred reply's first)

    # ------------------------------------------------------------ stopping
    def stop(self) -> None:
        """Stop serving: clients' runs are cancelled, the connection file removed."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        if self.ray_nodes is not None:
            self.ray_nodes.stop()
        if self.dashboard is not None:
            self.dashboard.stop()
        self._inbox.close()
        self._worker.join(5)
        with self._lock:
            clients = list(self.state.clients)
            self.state.drop_all("the service stops")
        self.hub.stop()
        self._unsubscribe()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for island in self.ctrl.islands:  # (its Ray nodes' islands: nothing more is sent to them, frees included)
            if island.remote is not None:
                island.remote.alive = False
        if self.heap is not None:
            self.heap.close()
        try:
            _, info = read_connection_file(self.path, "pw.serve")
            if info.get("key") == self.info["key"]:  # ours, not a newer service's
                os.remove(self.path)
        except (PathwaysError, OSError):
            pass
        if self.hub.thread.is_alive():  # (its socket is still open: `term` would wait for it for good)
            log.warning("pw_kernel service: the socket thread did not stop within 5 s; its ZeroMQ context is left open")
        else:
            self.ctx.term()
        self.ctrl.shutdown(timeout=5)
        for c in clients:  # (every run is final now: each waiting thread ends at once)
            c.join_waiting(5)
        log.info("pw_kernel service stopped")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the service stops (returns whether it did)."""
        return self.stopped.wait(timeout)

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self.stopped.is_set() else f"{len(self.state.clients)} clients"
        return f"Service({len(self.devices)} {self.info['platform']} devices, {self.path}, {state})"

"""The service process's side: the controller that owns this host's devices, and its clients' state.

One `Service` per process. Its socket thread (`Hub`) checks every
message's signature (a bad one is refused, counted and logged, never
answered) and answers heartbeats; everything else goes to one worker thread
that owns the clients' state (each client's requests in their order, the
clients in turn: `Inbox`). Nodes run as runs of this process's
`pw.controller()`, each client a `FairShare` tenant of its weight: the
controller's per-island queues order every client's work in one order.
Replies that wait for device work (a run, a value fetched) are sent from the
thread where that finishes.

The methods a client calls are the remote island's (`describe`, `clock`,
`load`, `load_shipped`, `run_many`, `put`, `reshard`, `get`, `free`, `stats`:
what a Ray island actor answers, `pw_kernel.runtime.remote.actor`) plus the
service's own (`hello`, `bye`, `keep`, `kept`, `adopt`, `clients`). A node
that calls the host runs its Python here, its output routed to its run
(`callbacks`).
"""

from __future__ import annotations

import concurrent.futures
import gc
import getpass
import logging
import os
import socket as _socket
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..runtime import FairShare, Future, NodeEvent, PathwaysError, compiled, controller, init, program
from ..runtime.extend import executions, from_wire, start_trace, to_wire
from .callbacks import expected as expected_output
from .callbacks import load as load_calling_host
from .clients import DEAD_AFTER_S, Client, Heap, Kept, retire
from .inbox import Inbox
from .wire import (
    Hub, Message, Messages, default_connection_file, new_key, read_connection_file, send, small_values,
    write_connection_file,
)

log = logging.getLogger("pw_kernel.service")

#: Clients ping this often; one not heard from for DEAD_AFTER_S is gone (its runs cancelled, buffers freed).
HEARTBEAT_S = 0.5


_LATER = object()  # a handler's answer: "I reply myself, when the work is done"

#: Requests the socket thread answers itself when nothing is queued (they take well under a millisecond;
#: loads, puts of big values, keeps and drops go to the worker, so heartbeats are never held up long).
_QUICK = frozenset({"run_many", "free", "get", "clock", "cancel"})

MAX_BURST_PROGRAMS = 256  # burst programs kept per client (the shapes depend on timing: past it, traced anew)

class Service:
    """The Pathways service: owns this process's devices and runs its controller for the clients.

    Example::

        svc = Service()          # writes the connection file
        ...
        svc.stop()               # removes it
    """

    def __init__(self, connection_file: str | None = None, *, ip: str = "127.0.0.1", owns_process: bool = False):
        import zmq

        # Outputs are the clients' to keep (their handles); the controller keeps none of its own.
        self.ctrl = controller() if controller(create=False) else init(  # (submitters never wait; short logs)
            keep_outputs=0, max_pending_runs=None, max_pending_outputs=None, inline_wait_s=0, max_events=20_000,
            story_length=20_000)
        self.ctrl.set_policy(FairShare())
        self.devices = jax.devices()
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
            "platform": self.devices[0].platform, "kind": "pw_kernel service",
        }
        self.messages = Messages(self.info, "pw-service", routed=True)
        self.clients: dict[bytes, Client] = {}  # by the identity of the socket a client sends on ...
        self._reply_to: dict[bytes, bytes] = {}  # ... -> that of the socket it receives replies on
        self._beats_from: dict[bytes, bytes] = {}  # ... -> that of the socket its heartbeats come from
        self._by_beat: dict[bytes, Client] = {}
        self._by_tenant: dict[str, Client] = {}
        self.kept: dict[tuple[str, str], Kept] = {}
        self._slices: dict[tuple, Any] = {}
        self.refused = 0
        self._inbox = Inbox()
        # The clients' state is the holder's of `_state`: the worker's, or the socket thread's for a quick
        # request of a client with nothing queued (`Inbox.idle`).
        self._state = threading.Lock()
        self._profiling: tuple | None = None  # (tenant, trace folder, anchor) of a client's open `pw.profile()`
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="pw-service-fetch")
        self._unsubscribe = self.ctrl.events.subscribe(self._on_event)
        self._suspect_until = 0.0  # after a connection closed: clients silent past then are gone
        self._suspect_from = 0.0
        self.hub = Hub(
            sock, self._on_frames, self._on_tick, HEARTBEAT_S, "pw-service-socket", on_disconnect=self._on_disconnect
        )
        self._worker = threading.Thread(target=self._work, name="pw-service-worker", daemon=True)
        self.stopped = threading.Event()
        # The process is the service's alone: its collector's full passes skip what lives long (see `Heap`).
        self.heap = Heap() if owns_process else None
        self.hub.start()
        self._worker.start()
        write_connection_file(self.path, self.info)
        log.info("pw_kernel service: %d %s devices, connection file %s", len(self.devices), self.info["platform"],
                 self.path)

    @staticmethod
    def _check_not_running(path: str) -> None:
        try:
            _, info = read_connection_file(path, "pw.serve")
        except PathwaysError:
            return
        pid = info.get("pid")
        try:
            if pid and pid != os.getpid():
                os.kill(pid, 0)
            else:
                return
        except OSError:  # (a stale file of a service that died)
            return
        raise PathwaysError(
            f"`pw.serve`: a service (pid {pid}) already runs with connection file {path}. Connect to it "
            f"(`pw.connect()`), stop it first, or serve with another file (`--connection-file PATH`)."
        )

    # ------------------------------------------------------------ the socket thread
    def _on_frames(self, frames: list) -> None:
        try:
            idents, msg = self.messages.unpack(frames)
        except Exception as e:  # no key, a wrong key, a replay, garbage: refused, and said where
            self.refused += 1
            who = frames[0][:16] if frames else b"?"
            log.warning("pw_kernel service: refused a message from %r: %s", who, str(e)[:200])
            return
        ident = idents[0]
        if msg.kind == "ping":  # (a client's heartbeat; or from its reply socket, once, at `hello`)
            c = self._by_beat.get(ident)
            if c is not None:
                c.last_seen = time.monotonic()
            self._send(ident, "pong", {"known": c is not None})
            return
        # A quick request of a client with nothing queued is handled here, not handed to the worker:
        # two thread hand-offs (there and back) are most of a small call's latency.
        if msg.content.get("method") in _QUICK and self._inbox.idle(ident) and self._state.acquire(False):
            try:
                self._handle(ident, msg)
            finally:
                self._state.release()
            return
        self._inbox.put(ident, msg)

    def _dropping(self, c: Client, why: str) -> None:
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
        otherwise). Whoever else stays silent for three heartbeats from now is dropped then.
        """
        import zmq

        self._suspect_until = time.monotonic() + 3 * HEARTBEAT_S
        self._suspect_from = time.monotonic()
        sock = self.hub.socket  # (this is its thread)
        sock.getsockopt(zmq.EVENTS)  # (ZeroMQ handles the closed pipes it was told of: their identities go)
        sock.router_mandatory = True
        try:
            for c in list(self.clients.values()):
                if c.dropping:
                    continue
                try:
                    send(sock, self.messages.pack("pong", {"known": True}, self._reply_to.get(c.ident)))
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
        suspect = self._suspect_until and now >= self._suspect_until
        for c in list(self.clients.values()):
            silent = now - c.last_seen
            if not c.dropping and (silent > DEAD_AFTER_S or (suspect and c.last_seen < self._suspect_from)):
                self._dropping(c, "its heartbeats stopped: the process died or hangs")
        if suspect:
            self._suspect_until = 0.0

    def _send(self, ident: bytes, kind: str, content: dict) -> None:
        self.hub.send(self.messages.pack(kind, content, ident))

    def _reply(self, ident: bytes, rid: int, value: Any = None, error: str | None = None) -> None:
        try:
            frames = self.messages.pack("reply", {"id": rid, "ok": error is None, "value": value, "error": error}, ident)
        except TypeError as e:  # (a value that cannot cross: the client hears why)
            frames = self.messages.pack("reply", {"id": rid, "ok": False, "value": None, "error": str(e)}, ident)
        self.hub.send(frames)

    def _on_event(self, ev) -> None:
        if isinstance(ev, NodeEvent) and ev.kind != "compile":  # (device time is running time)
            c = self._by_tenant.get(ev.tenant)
            if c is not None:
                c.device_ns += max(0, ev.end - ev.start)

    # ------------------------------------------------------------ the worker thread
    def _work(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            with self._state:
                try:
                    self._handle(*item)
                finally:
                    self._inbox.done()

    def _handle(self, ident: bytes, msg: Message | str) -> None:
        """Answer one request (or drop a client: ``msg`` says why); holds ``_state``, on the worker or the socket thread."""
        if isinstance(msg, str):
            self._drop(ident, msg)
            return
        content = msg.content
        rid = content.get("id")
        # A client sends on one socket and receives on another (`ServiceLink`): answers go to the second
        # (looked up now: a `bye` forgets it before its answer is sent; a `hello` tells it).
        to = self._reply_to.get(ident, ident)
        try:
            method = content["method"]
            args = content.get("args", ())
            c = self.clients.get(ident)
            if method == "hello":
                value = self._hello(ident, msg.user, *args)
            elif c is None:
                raise PathwaysError(
                    "this service does not know the client (it was dropped after missing heartbeats, or the "
                    "service restarted): call `pw.connect()` again."
                )
            else:
                handler = getattr(self, f"_m_{method}", None)
                if handler is None:
                    raise PathwaysError(f"the service has no method {method!r}")
                # (bound now: a deferred reply runs after this loop has moved on to other clients' messages)
                value = handler(c, lambda v=None, e=None, _r=rid: self._reply(to, _r, v, e), *args)
        except Exception as e:
            log.debug("pw_kernel service: %s failed", content.get("method"), exc_info=True)
            if not content.get("oneway"):
                self._reply(self._reply_to.get(ident, to), rid, error=f"{type(e).__name__}: {e}")
            return
        if value is not _LATER and not content.get("oneway"):
            self._reply(self._reply_to.get(ident, to), rid, value)

    def _hello(self, ident: bytes, user: str, name: str | None, weight: float, pid: int, reply_to=None,
               beats_from=None) -> dict:
        if ident in self.clients:  # the same client again (reconnected): its old state goes
            self._drop(ident, "reconnected")
        reply_to = ident if reply_to is None else bytes(reply_to)
        beats_from = reply_to if beats_from is None else bytes(beats_from)
        name = name or f"client-{pid}"
        tenant, k = name, 2
        while tenant in self._by_tenant:
            tenant, k = f"{name}-{k}", k + 1
        c = Client(ident, name, tenant, float(weight), user, pid)
        self.clients[ident] = c
        self._reply_to[ident] = reply_to
        self._beats_from[ident] = beats_from
        self._by_beat[beats_from] = c
        self._by_tenant[tenant] = c
        log.info("pw_kernel service: client %r (pid %s, weight %g) connected", tenant, pid, weight)
        return {**self._describe(), "tenant": tenant}

    def _drop(self, ident: bytes, why: str) -> None:
        """A client is gone: forget it, free what it alone held (kept trees stay), cancel its runs.

        Cancelling a few hundred queued runs takes tens of milliseconds of the controller's time: that,
        freeing its buffers and the collection after are done by a pool thread, so other clients' requests
        queued behind this drop are not held up by it.
        """
        c = self.clients.pop(ident, None)
        if c is None:
            return
        self._reply_to.pop(ident, None)
        self._by_beat.pop(self._beats_from.pop(ident, ident), None)
        self._by_tenant.pop(c.tenant, None)
        c.gone = True  # (its runs, cancelled, are answered to nobody)
        c.stop_waiting()
        # What it held leaves with the retiring task: freeing a few hundred buffers (some still being
        # computed) took ~15 ms, and starting a thread for it ~7 ms, of this thread's time.
        held = (sorted(c.live, key=lambda r: r.id), c.buffers, c.programs, c.executables)  # (the next to run first)
        c.buffers, c.programs, c.executables, c.shipped, c.by_run, c.live = {}, {}, {}, {}, {}, set()
        collect = self.heap.collect_soon if self.heap is not None else gc.collect
        said = f"client {c.tenant!r} dropped ({why}): {{}} runs cancelled, {len(held[1])} buffers freed"
        self._pool.submit(retire, held, collect, said)
        del held

    # -------------------------------------------------- the remote island's methods
    def _m_describe(self, c: Client, reply) -> dict:
        return self._describe()

    def _describe(self) -> dict:
        d = self.devices
        return {
            "host": _socket.gethostname(), "pid": os.getpid(), "platform": d[0].platform,
            "devices": [x.id for x in d], "device_kind": d[0].device_kind,
        }

    def _m_clock(self, c: Client, reply) -> int:
        return time.perf_counter_ns()

    def _slice(self, layout) -> Any:
        """The service slice for a client's layout (mesh shape, axis names, device positions), made once."""
        key = (tuple(layout[0]), tuple(layout[1]), tuple(layout[2]))
        s = self._slices.get(key)
        if s is None or s.released:
            shape, names, pos = key
            grid = np.array([self.devices[i] for i in pos], dtype=object).reshape(shape)
            s = self._slices[key] = self.ctrl.slice(mesh=Mesh(grid, names))
        return s

    def _m_load(self, c: Client, reply, key: str, blob: bytes, layout, in_specs, out_specs) -> None:
        self._loading(c, key, lambda: self._load(c, key, blob, layout, in_specs, out_specs))

    def _m_load_shipped(self, c: Client, reply, key: str, blob: bytes, layout, in_specs, out_specs) -> None:
        """A node that calls the host, as its pickled evaluator: its Python runs here (see `callbacks`)."""

        def load() -> None:
            evaluate, sink = load_calling_host(blob)
            ins = tuple(PartitionSpec(*sp) for sp in in_specs)
            outs = tuple(PartitionSpec(*sp) for sp in out_specs)
            c.executables[key] = compiled(evaluate, slice=self._slice(layout), in_specs=ins, out_specs=outs,
                                          name=f"{c.tenant}:{key}")
            c.shipped[key] = sink

        self._loading(c, key, load)

    @staticmethod
    def _loading(c: Client, key: str, load: Callable[[], None]) -> None:
        """Run ``load``; what it raised is kept for the node's runs (nobody waits for a load's answer: they say it)."""
        try:
            load()
        except Exception as e:  # (a module this process lacks, for a shipped node: a callback only the client has)
            c.load_errors[key] = f"{type(e).__name__}: {e}"
            raise

    def _load(self, c: Client, key: str, blob: bytes, layout, in_specs, out_specs) -> None:
        exported = jax.export.deserialize(bytearray(blob))
        s = self._slice(layout)
        ins = tuple(PartitionSpec(*sp) for sp in in_specs)
        outs = jax.tree.unflatten(exported.out_tree, [PartitionSpec(*sp) for sp in out_specs])
        c.executables[key] = compiled(exported.call, slice=s, in_specs=ins, out_specs=outs, name=f"{c.tenant}:{key}")

    def _m_run_many(self, c: Client, reply, ops, frees=(), run=None) -> object:
        try:
            return self._submit(c, reply, [(key, list(i), list(o)) for key, i, o in ops], run)
        finally:
            self._m_free(c, reply, frees)

    def _m_reshard(self, c: Client, reply, src: int, handle: int, layout, spec) -> object:
        key = f"reshard{layout!r}{spec!r}"
        if key not in c.executables:
            c.executables[key] = compiled(
                lambda x: x, slice=self._slice(layout), out_specs=PartitionSpec(*spec), name="reshard"
            )
        return self._submit(c, reply, [(key, [src], [handle])])

    def _m_put(self, c: Client, reply, handle: int, value, layout, spec) -> tuple:
        start = time.perf_counter_ns()
        sharding = NamedSharding(self._slice(layout).mesh, PartitionSpec(*spec))
        c.buffers[handle] = jax.device_put(from_wire(value), sharding)
        return [(start, time.perf_counter_ns())], None

    @staticmethod
    def _buffer(c: Client, handle: int) -> Any:
        value = c.buffers.get(handle)
        if value is None:
            raise PathwaysError(f"no buffer {handle} for this client (freed, or another client's)")
        return value

    def _m_get(self, c: Client, reply, handle: int) -> object:
        value = self._buffer(c, handle)

        def fetch():
            try:
                reply(to_wire(value.result() if isinstance(value, Future) else value))
            except Exception as e:
                reply(None, f"{type(e).__name__}: {e}")

        self._pool.submit(fetch)
        return _LATER

    def _m_profile_start(self, c: Client, reply) -> None:
        """`pw.profile` in a client: JAX's profiler traces this process until `profile_stop` (one at a time)."""
        import tempfile

        if self._profiling is not None:
            raise PathwaysError(
                f"client {self._profiling[0]!r} is profiling the service; JAX traces one window at a time in a "
                f"process. Profile again when its `pw.profile()` block has ended."
            )
        logdir = tempfile.mkdtemp(prefix="pw_service_profile_")
        self._profiling = (c.tenant, logdir, start_trace(logdir))

    def _m_profile_stop(self, c: Client, reply) -> list:
        """Stop the trace; XLA's executions in it, on this process's clock (the client moves them onto its own)."""
        import shutil

        if self._profiling is None or self._profiling[0] != c.tenant:
            raise PathwaysError("no `pw.profile()` of this client is open in the service")
        _, logdir, anchor = self._profiling
        self._profiling = None
        jax.profiler.stop_trace()
        try:
            return [[dev, hlo, run, [list(op) for op in ops]] for dev, hlo, run, ops in executions(logdir, anchor)]
        finally:
            shutil.rmtree(logdir, ignore_errors=True)

    def _m_cancel(self, c: Client, reply, run_ids) -> None:
        """The client cancelled these runs of its own: cancel what of them is queued or running here."""
        for rid in run_ids:
            for run in list(c.by_run.pop(rid, ())):
                run.cancel()

    def _m_free(self, c: Client, reply, handles) -> None:
        for h in handles:
            c.buffers.pop(h, None)

    def _m_colocated(self, c: Client, reply, fn, in_ids, out_ids, out_layouts, args) -> tuple:
        """Host code beside this client's buffers (a checkpoint's shards written and read here), as a Ray
        island's actor runs it: ``fn(arrays, out_shardings, *args)``; (times, failure) as a run's."""
        start = time.perf_counter_ns()
        try:
            arrays = [v.result() if isinstance(v, Future) else v for v in (self._buffer(c, h) for h in in_ids)]
            shardings = [NamedSharding(self._slice(layout).mesh, PartitionSpec(*spec)) for layout, spec in out_layouts]
            outs = list(fn(arrays, shardings, *args) or ())
            if len(outs) != len(out_ids):
                raise ValueError(f"{fn.__name__} returned {len(outs)} arrays for {len(out_ids)} outputs")
            jax.block_until_ready(outs)
        except Exception as e:
            return [], (0, f"{type(e).__name__}: {e}")
        for h, o in zip(out_ids, outs):
            c.buffers[h] = o
        return [(start, time.perf_counter_ns())] * max(1, len(out_ids)), None

    def _m_stats(self, c: Client, reply) -> dict:
        live = jax.live_arrays()
        return {
            "buffers": len(c.buffers), "executables": len(c.executables), "clients": len(self.clients),
            "all_buffers": sum(len(x.buffers) for x in self.clients.values()), "refused": self.refused,
            "live_arrays": len(live), "live_bytes": int(sum(a.nbytes for a in live)), "kept": len(self.kept),
            "live_runs": sum(len(x.live) for x in self.clients.values()), "status": str(self.ctrl.status()),
            "compiling": sum(1 for r in list(self.ctrl.runs) if r.compiling),
            "slices": sorted([d.id for d in sl.devices] for sl in self._slices.values()),
        }

    # -------------------------------------------------- runs
    def _submit(self, c: Client, reply: Callable, ops: list, client_run: tuple | None = None) -> object:
        """Run a burst of a client's nodes as one run of its tenant; reply (times, failure) when it finishes.

        ``client_run``: (id, priority) of the client's run the burst belongs to. The priority orders it
        among the client's own runs here (fair share orders the clients); a cancel names the id.
        """
        prog, inputs = self._burst(c, ops)
        said = expected_output(c.shipped, ops)  # (the runs of its nodes that call the host)
        start = time.perf_counter_ns()
        rid, priority = client_run if client_run else (None, 0)
        handles = [h for o in ops for h in o[2]]
        answered = []

        def computed(values: list) -> None:
            # It ran whole inside the call (a lone node, nothing queued): answered now, before the controller
            # reports it done, so the client has it while this process does the bookkeeping.
            c.nodes += len(ops)
            reply(([(start, time.perf_counter_ns())] * len(ops), None, small_values(handles, values)))
            answered.append(True)

        # Chained: the client planned the nodes (a fused step of its arrives as one); fusing a burst again here
        # would compile an executable per burst and leave nowhere for a cancel or a priority to act.
        run, outs = prog.call_run(
            *inputs, tenant=c.tenant, weight=c.weight, priority=int(priority), mode="chained",
            on_computed=None if said else computed,
        )
        c.runs += 1
        c.buffers.update(zip(handles, outs))
        per_op, k = [], 0
        for o in ops:
            per_op.append(outs[k:k + len(o[2])])
            k += len(o[2])
        if answered:
            return _LATER
        for i, _, one in said:
            one.outs = per_op[i]
        c.live.add(run)
        if rid is not None:
            c.by_run.setdefault(rid, set()).add(run)

        def finished() -> None:
            c.live.discard(run)
            if rid is not None:
                mine = c.by_run.get(rid)
                if mine is not None:
                    mine.discard(run)
                    if not mine:
                        del c.by_run[rid]
            if c.gone:
                return
            end = time.perf_counter_ns()
            failure = None
            for i, fs in enumerate(per_op):
                bad = next((f for f in fs if f.cancelled() or f.exception() is not None), None)
                if bad is not None:
                    err = "cancelled" if bad.cancelled() else f"{type(bad.exception()).__name__}: {bad.exception()}"
                    failure = (i, err)
                    break
            told = {}  # op index -> what its host callbacks wrote: [(stream, text), ...]
            for i, sink, one in said:
                sink.finished(one)
                if one.pieces:
                    told[i] = one.pieces
                raised = one.failure()
                if raised is not None and (failure is None or i < failure[0]):
                    failure = (i, raised)
            inline = small_values(handles, [f.result() for f in outs]) if failure is None else {}
            c.nodes += len(ops) if failure is None else failure[0]
            times = [(start, end)] * len(ops)
            reply((times, failure, inline, told) if told else (times, failure, inline))

        if all(f.done() for f in outs):  # computed inside the call (a lone node): no thread hop to reply
            finished()
            return _LATER
        # Whichever comes first answers: the client's waiter thread (it completes the runs it waits for
        # itself, in order: the quickest for a stream of calls), or the last output's done-callback (a
        # run that overtook the one waited for, by priority or fair share, is answered when it ends).
        once = threading.Lock()
        left = [len(outs)]

        def answer() -> None:
            if once.acquire(blocking=False):
                finished()

        def one_done(_f) -> None:
            with c.count_lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                answer()

        for f in outs:
            f.add_done_callback(one_done)
        c.waiter().put((outs, answer))
        return _LATER

    def _burst(self, c: Client, ops: list) -> tuple:
        """The program that runs a burst of this shape (made once per shape) and its inputs, from the buffers."""
        shape: list = []
        inputs: list = []
        where: dict[int, tuple] = {}  # handle -> ("e", input index) or ("o", op, output)
        for i, (key, in_ids, out_ids) in enumerate(ops):
            if key in c.load_errors:
                raise PathwaysError(f"the service could not load node executable {key}: {c.load_errors[key]}")
            refs = []
            for h in in_ids:
                ref = where.get(h)
                if ref is None:
                    inputs.append(self._buffer(c, h))
                    ref = where[h] = ("e", len(inputs) - 1)
                refs.append(ref)
            shape.append((key, tuple(refs), len(out_ids)))
            for k, h in enumerate(out_ids):
                where[h] = ("o", i, k)
        shape_key = tuple(shape)
        prog = c.programs.get(shape_key)
        if prog is None:
            if len(c.programs) >= MAX_BURST_PROGRAMS:  # bounded: burst shapes depend on timing
                c.programs.clear()
            prog = c.programs[shape_key] = self._program(c, shape_key)
        return prog, inputs

    def _program(self, c: Client, shape: tuple):
        executables = c.executables

        def burst(*inputs):
            made: list[list] = []
            flat: list = []
            for key, refs, _ in shape:
                args = [inputs[r[1]] if r[0] == "e" else made[r[1]][r[2]] for r in refs]
                outs = jax.tree.leaves(executables[key](*args))
                made.append(outs)
                flat.extend(outs)
            return flat

        return program(burst, name=c.name)

    # -------------------------------------------------- the service's own methods
    def _m_bye(self, c: Client, reply) -> None:
        self._drop(c.ident, "disconnected")

    def _m_clients(self, c: Client, reply) -> list:
        return [
            {
                "name": x.tenant, "weight": x.weight, "device_time_s": x.device_ns / 1e9, "runs": x.runs,
                "nodes": x.nodes,
                "pid": x.pid, "connected_s": time.time() - x.since, "you": x is c,
            }
            for x in self.clients.values()
        ]

    def _m_keep(self, c: Client, reply, name: str, leaves: list, treedef: bytes) -> None:
        kept = []
        for leaf in leaves:
            if leaf[0] == "c":
                kept.append(("c", leaf[1]))
            else:
                _, h, shape, dtype, layout, spec = leaf
                if h not in c.buffers:
                    raise PathwaysError(f"`pw.keep({name!r}, ...)`: buffer {h} is not this client's")
                kept.append(("a", c.buffers[h], shape, dtype, layout, spec))
        self.kept[(c.user, name)] = Kept(kept, treedef, c.tenant)

    def _m_kept(self, c: Client, reply, name: str | None):
        if name is None:
            return sorted(n for (u, n) in self.kept if u == c.user)
        k = self.kept.get((c.user, name))
        if k is None:
            return None
        return [l if l[0] == "c" else ("a", *l[2:]) for l in k.leaves], k.treedef

    def _m_adopt(self, c: Client, reply, name: str, handles: list) -> None:
        k = self.kept[(c.user, name)]
        arrays = [l[1] for l in k.leaves if l[0] == "a"]
        for h, v in zip(handles, arrays):
            c.buffers[h] = v

    def _m_unkeep(self, c: Client, reply, name: str) -> bool:
        return self.kept.pop((c.user, name), None) is not None

    # ------------------------------------------------------------ stopping
    def stop(self) -> None:
        """Stop serving: clients' runs are cancelled, the connection file removed."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        self._inbox.close()
        self._worker.join(5)
        with self._state:
            for ident in list(self.clients):
                self._drop(ident, "the service stops")
        self.hub.stop()
        self._unsubscribe()
        self._pool.shutdown(wait=False)
        if self.heap is not None:
            self.heap.close()
        try:
            _, info = read_connection_file(self.path, "pw.serve")
            if info.get("key") == self.info["key"]:  # ours, not a newer service's
                os.remove(self.path)
        except (PathwaysError, OSError):
            pass
        self.ctx.term()
        log.info("pw_kernel service stopped")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the service stops (returns whether it did)."""
        return self.stopped.wait(timeout)

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self.stopped.is_set() else f"{len(self.clients)} clients"
        return f"Service({len(self.devices)} {self.info['platform']} devices, {self.path}, {state})"

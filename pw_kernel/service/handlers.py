"""What the service does with each request: one handler per message type, on `state.ServiceState`.

A handler takes the client and the message (a `protocol` record) and returns
the reply's value, or `LATER` when the work it started replies itself when
done (a run, a value fetched) through ``reply(value)`` / ``reply(error=e)``.
It raises to refuse: the I/O layer sends the error back in its envelope,
where it is raised as the class it was here. Handlers touch no socket.

Example::

    h = Handlers(state, pool)
    value = h.handle(client, Stats(), reply)     # a dict; or LATER
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from ..runtime import ArgumentError, Future, PathwaysError, RemoteArray
from ..runtime.extend import Compiled, ErrorEnvelope, executions, from_wire, start_trace, to_wire
from .callbacks import load as load_calling_host
from .clients import Client, Kept
from .memory import out_bytes, shard_bytes
from .protocol import (
    PROTOCOL_VERSION,
    Adopt,
    Bye,
    Cancel,
    Clients,
    Clock,
    Colocated,
    Free,
    Get,
    GetMany,
    Islands,
    Keep,
    KeptTree,
    Load,
    LoadShipped,
    Pool,
    ProfileStart,
    ProfileStop,
    Put,
    Reshard,
    RunMany,
    Stats,
    Unkeep,
)
from .pool import pool_data
from .runs import at_once, buffer, submit, value_of
from .state import ServiceState

LATER = object()  # a handler's answer: "the work I started replies when it is done"


class Handlers:
    """The service's request handlers, by message type (`handle` dispatches)."""

    def __init__(self, state: ServiceState, fetch_pool) -> None:
        self.state = state
        self._fetch = fetch_pool  # threads that wait for a value to read (`Get`), off the request's thread
        self._table: dict[type, Callable] = {
            Clock: self.clock, Load: self.load, LoadShipped: self.load_shipped, RunMany: self.run_many,
            Put: self.put, Reshard: self.reshard, Get: self.get, GetMany: self.get_many, Colocated: self.colocated,
            Free: self.free, Cancel: self.cancel, Stats: self.stats, ProfileStart: self.profile_start,
            ProfileStop: self.profile_stop, Bye: self.bye, Clients: self.clients, Keep: self.keep,
            KeptTree: self.kept, Adopt: self.adopt, Unkeep: self.unkeep, Islands: self.islands, Pool: self.pool,
        }

    def handle(self, c: Client, msg: Any, reply: Callable) -> Any:
        handler = self._table.get(type(msg))
        if handler is None:
            raise PathwaysError(f"the service has no request {type(msg).__name__!r} (protocol {PROTOCOL_VERSION})")
        return handler(c, msg, reply)

    # ------------------------------------------------------------ a remote island's requests
    def clock(self, c: Client, msg: Clock, reply) -> int:
        return time.perf_counter_ns()

    def _compiled(self, c: Client, key: str, fn, layout, in_specs, out_specs, donate=()) -> Compiled:
        return Compiled(
            fn, controller=lambda: self.state.ctrl, slice=self.state.slice(layout), in_specs=in_specs,
            out_specs=out_specs, name=f"{c.tenant}:{key}", donate_argnums=tuple(donate) or None,
        )

    def load(self, c: Client, msg: Load, reply) -> None:
        def load() -> None:
            exported = jax.export.deserialize(bytearray(msg.blob))
            ins = tuple(PartitionSpec(*sp) for sp in msg.in_specs)
            outs = jax.tree.unflatten(exported.out_tree, [PartitionSpec(*sp) for sp in msg.out_specs])
            c.executables[msg.key] = self._compiled(c, msg.key, exported.call, msg.layout, ins, outs, msg.donate)
            c.now_steps.pop(msg.key, None)  # (a step kept for the key's earlier executable, if it was loaded again)
            mesh = self.state.slice(msg.layout).mesh  # (its outputs' bytes per device: a memory share's check)
            c.out_bytes[msg.key] = out_bytes(exported, [NamedSharding(mesh, PartitionSpec(*sp)) for sp in msg.out_specs])

        self._loading(c, msg.key, load)

    def load_shipped(self, c: Client, msg: LoadShipped, reply) -> None:
        """A node that calls the host, as its pickled evaluator: its Python runs here (see `callbacks`)."""

        def load() -> None:
            evaluate, sink = load_calling_host(msg.blob)
            ins = tuple(PartitionSpec(*sp) for sp in msg.in_specs)
            outs = tuple(PartitionSpec(*sp) for sp in msg.out_specs)
            c.executables[msg.key] = self._compiled(c, msg.key, evaluate, msg.layout, ins, outs)
            c.shipped[msg.key] = sink

        self._loading(c, msg.key, load)

    @staticmethod
    def _loading(c: Client, key: str, load: Callable[[], None]) -> None:
        """Run ``load``; what it raised is kept for the node's runs (nobody waits for a load's answer: they say it)."""
        try:
            load()
        except Exception as e:  # (a module this process lacks, for a shipped node: a callback only the client has)
            c.load_errors[key] = f"{type(e).__name__}: {e}"
            raise

    def run_many(self, c: Client, msg: RunMany, reply) -> object:
        # The frees are handles the client dropped before this burst (its nodes hold their own inputs alive).
        frees = msg.frees
        if c.memory is not None:
            _drop(c, frees)  # first: a memory share's check counts without them
            frees = ()
            need: dict[int, int] = {}
            for key, _, _ in msg.ops:
                for d, n in c.out_bytes.get(key, {}).items():
                    need[d] = need.get(d, 0) + n
            c.buffers.held.admit(c.tenant, c.memory, need)
        try:
            return self._runs(c, msg.ops, msg.run, reply)
        finally:
            _drop(c, frees)  # (after: a node on an idle pool has its answer sent by now, which needs none of this)

    def _runs(self, c: Client, ops: list, run, reply) -> object:
        if len(ops) == 1 and ops[0][0] not in c.shipped and at_once(c, ops[0], reply, reply.stimulus):
            reply.story("ran at once (the pool was idle)")
            return LATER
        runs = submit(c, ops, run, reply, reply.stimulus)  # (the runs carry the request's stimulus as their name)
        reply.story(f"runs {','.join(str(r.id) for r in runs)}")
        return LATER

    def reshard(self, c: Client, msg: Reshard, reply) -> object:
        key = f"reshard{msg.layout!r}{msg.spec!r}"
        if key not in c.executables:
            c.executables[key] = self._compiled(c, "reshard", lambda x: x, msg.layout, None, PartitionSpec(*msg.spec))
        return self._runs(c, [(key, [msg.src], [msg.handle])], None, reply)

    def put(self, c: Client, msg: Put, reply) -> tuple:
        start = time.perf_counter_ns()
        sharding = NamedSharding(self.state.slice(msg.layout).mesh, PartitionSpec(*msg.spec))
        value = from_wire(msg.value)
        c.puts += 1
        if c.memory is not None:
            c.buffers.held.admit(c.tenant, c.memory, shard_bytes(sharding, value.shape, value.dtype))
        c.buffers[msg.handle] = jax.device_put(value, sharding)
        return [(start, time.perf_counter_ns())], None

    def get(self, c: Client, msg: Get, reply) -> object:
        value = buffer(c, msg.handle)

        def fetch():
            try:
                reply(to_wire(value_of(value)))
            except Exception as e:
                reply(error=e)

        self._fetch.submit(fetch)
        return LATER

    def get_many(self, c: Client, msg: GetMany, reply) -> object:
        values = [c.buffers.get(h) for h in msg.handles]

        def fetch():
            out = []
            for v in values:
                try:
                    out.append(None if v is None else to_wire(value_of(v)))
                except Exception:  # (failed or cancelled: the client's own read of it raises that)
                    out.append(None)
            reply(out)

        self._fetch.submit(fetch)
        return LATER

    def colocated(self, c: Client, msg: Colocated, reply) -> tuple:
        """Host code beside this client's buffers (a checkpoint's shards written and read here), as a Ray
        island's actor runs it (`IslandActor.colocated`): ``fn(arrays, out_shardings, *args)``; (times, failure)."""
        start = time.perf_counter_ns()
        try:
            values = [buffer(c, h) for h in msg.in_ids]
            host = self._ray_island_of(values, msg)
            if host is not None:  # a Ray node's arrays: its own process reads or writes them (its shards, its host)
                outs = host[0].colocated(msg.fn, host[1], host[2], args=tuple(msg.args), slice_=host[3])
                c.buffers.update(zip(msg.out_ids, outs))
                return [(start, time.perf_counter_ns())] * max(1, len(msg.out_ids)), None
            arrays = [value_of(v) for v in values]
            meshes = [(self.state.slice(lay).mesh, spec) for lay, spec in msg.out_layouts]
            shardings = [NamedSharding(mesh, PartitionSpec(*spec)) for mesh, spec in meshes]
            outs = list(msg.fn(arrays, shardings, *msg.args) or ())
            if len(outs) != len(msg.out_ids):
                raise ValueError(f"{msg.fn.__name__} returned {len(outs)} arrays for {len(msg.out_ids)} outputs")
            jax.block_until_ready(outs)
        except Exception as e:
            return [], (0, ErrorEnvelope.of(e))
        c.buffers.update(zip(msg.out_ids, outs))
        return [(start, time.perf_counter_ns())] * max(1, len(msg.out_ids)), None

    def _ray_island_of(self, values: list, msg: Colocated):
        """(island, input arrays, outputs, their slice) when the inputs and outputs of a `Colocated` all live on
        one of the service's Ray nodes' islands, else None (the service's own process runs it)."""
        islands = {lay[3] if len(lay) > 3 else 0 for lay, _ in msg.out_layouts}
        if len(islands) > 1 or 0 in islands or len(msg.out_avals) != len(msg.out_ids):
            return None
        arrays = [v.remote_array() if isinstance(v, Future) else v for v in values]
        homes = {a.island for a in arrays if isinstance(a, RemoteArray)}
        homes |= {self.state.island(i).remote for i in islands}
        if len(homes) != 1 or not all(isinstance(a, RemoteArray) for a in arrays):
            return None
        slices = [self.state.slice(lay) for lay, _ in msg.out_layouts]
        outputs = [jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=NamedSharding(s.mesh, PartitionSpec(*spec)))
                   for (shape, dtype), s, (_, spec) in zip(msg.out_avals, slices, msg.out_layouts)]
        return homes.pop(), arrays, outputs, (slices[0] if slices else None)

    def free(self, c: Client, msg: Free, reply) -> None:
        _drop(c, msg.handles)

    def cancel(self, c: Client, msg: Cancel, reply) -> None:
        """The client cancelled these runs of its own: cancel what of them is queued or running here."""
        for rid in msg.run_ids:
            for run in list(c.by_run.pop(rid, ())):
                run.cancel()

    def stats(self, c: Client, msg: Stats, reply) -> dict:
        st = self.state
        live = jax.live_arrays()
        return {
            "buffers": len(c.buffers), "executables": len(c.executables), "clients": len(st.clients),
            "all_buffers": sum(len(x.buffers) for x in st.clients), "refused": st.refused, "puts": c.puts,
            "held_bytes": dict(c.buffers.held.per_device),
            "live_arrays": len(live), "live_bytes": int(sum(a.nbytes for a in live)), "kept": len(st.kept),
            "live_runs": sum(len(x.live) for x in st.clients), "status": str(st.ctrl.status()),
            "compiling": sum(1 for r in list(st.ctrl.runs) if r.compiling),
            "slices": sorted([d.id for d in sl.devices] for sl in st.slices.values()),
            "story_rows": len(st.story.rows),
        }

    def profile_start(self, c: Client, msg: ProfileStart, reply) -> None:
        """`pw.profile` in a client: JAX's profiler traces this process until `profile_stop` (one at a time)."""
        st = self.state
        if st.profiling is not None:
            raise PathwaysError(
                f"client {st.profiling[0]!r} is profiling the service; JAX traces one window at a time in a "
                f"process. Profile again when its `pw.profile()` block has ended."
            )
        logdir = tempfile.mkdtemp(prefix="pw_service_profile_")
        st.profiling = (c.tenant, logdir, start_trace(logdir))

    def profile_stop(self, c: Client, msg: ProfileStop, reply) -> list:
        """Stop the trace; XLA's executions in it, on this process's clock (the client moves them onto its own)."""
        st = self.state
        if st.profiling is None or st.profiling[0] != c.tenant:
            raise PathwaysError("no `pw.profile()` of this client is open in the service")
        _, logdir, anchor = st.profiling
        st.profiling = None
        jax.profiler.stop_trace()
        try:
            return [[dev, hlo, run, [list(op) for op in ops]] for dev, hlo, run, ops in executions(logdir, anchor)]
        finally:
            shutil.rmtree(logdir, ignore_errors=True)

    # ------------------------------------------------------------ the service's own requests
    def bye(self, c: Client, msg: Bye, reply) -> None:
        self.state.drop(c.ident, "disconnected")

    def clients(self, c: Client, msg: Clients, reply) -> list:
        return [
            {
                "name": x.tenant, "weight": x.weight, "device_time_s": x.device_ns / 1e9, "runs": x.runs,
                "nodes": x.nodes, "pid": x.pid, "connected_s": time.time() - x.since, "you": x is c,
            }
            for x in self.state.clients
        ]

    def pool(self, c: Client, msg: Pool, reply) -> dict:
        """What the pool did lately: every client's nodes, named (they are all this user's: `pool.py`)."""
        st = self.state
        return pool_data(st.pool_record, st.clients, st.devices, int(msg.since_ns), you=c)

    def islands(self, c: Client, msg: Islands, reply) -> list:
        return self.state.remote_islands()

    def keep(self, c: Client, msg: Keep, reply) -> None:
        kept = []
        for leaf in msg.leaves:
            if leaf[0] == "c":
                kept.append(("c", leaf[1]))
            else:
                _, h, shape, dtype, layout, spec = leaf
                if h not in c.buffers:
                    raise PathwaysError(f"`pw.keep({msg.name!r}, ...)`: buffer {h} is not this client's")
                kept.append(("a", c.buffers[h], shape, dtype, layout, spec))
        k = Kept(kept, msg.treedef, c.tenant)
        old = self.state.kept.get((c.user, msg.name))
        self.state.kept[(c.user, msg.name)] = k
        if old is not None:
            old.release()
        store = self.state.store
        if store is not None:  # (written before the reply: a keep that returned survives the service's death)
            try:
                store.save(c.user, msg.name, k)
            except Exception as e:
                raise PathwaysError(
                    f"`pw.keep({msg.name!r}, ...)`: kept in the service, but not written to {store.directory} "
                    f"({type(e).__name__}: {e}): it will not survive a restart of the service. Free disk space "
                    f"there, or keep fewer or smaller arrays, and keep it again."
                ) from e

    def kept(self, c: Client, msg: KeptTree, reply):
        kept = self.state.kept
        if msg.name is None:
            return sorted(n for (u, n) in kept if u == c.user)
        k = kept.get((c.user, msg.name))
        if k is None:
            return None
        return [leaf if leaf[0] == "c" else ("a", *leaf[2:]) for leaf in k.leaves], k.treedef

    def adopt(self, c: Client, msg: Adopt, reply) -> None:
        k = self.state.kept.get((c.user, msg.name))
        if k is None:
            raise ArgumentError(f"`pw.kept({msg.name!r})`: nothing is kept under that name (unkept meanwhile?).")
        arrays = [leaf[1] for leaf in k.leaves if leaf[0] == "a"]
        c.buffers.update(zip(msg.handles, arrays))

    def unkeep(self, c: Client, msg: Unkeep, reply) -> bool:
        gone = self.state.kept.pop((c.user, msg.name), None)
        if gone is not None:
            gone.release()
        store = self.state.store
        return (store is not None and store.remove(c.user, msg.name)) or gone is not None


def _drop(c: Client, handles) -> None:
    """Forget ``c``'s buffers of ``handles`` (their bytes no longer count; an array goes with its last handle)."""
    pop = c.buffers.pop
    for h in handles:
        pop(h, None)

"""The side of a remote island that runs inside its Ray actor: its devices, buffers and executables.

This module is what Ray ships to the island's process: it imports only jax and
numpy, and nothing of the controller. The controller talks to it through
`client.py` (the actor's methods are its whole protocol: describe, clock, load,
load_shipped, run_many, put, reshard, get, get_many, colocated, free, stats).
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

MISSING = object()  # a sentinel: no such buffer
#: How `get` says that it holds no buffer for a handle (the node that makes it failed or did not run, or it
#: was freed): a reply, not a raised error, as `from_wire` reads it.
NOT_HELD = "not_held"


#: A node's outputs up to this size come back with its call's reply (`RemoteArray.fetch` then asks nothing) ...
INLINE_BYTES = 1024
#: ... at most this many of a node's, the smallest: a loss or a metric read right after its step costs no
#: second round trip, and a step whose state has hundreds of small leaves (biases, an optimizer's counts)
#: does not copy them all to the host and over the wire every step.
INLINE_COUNT = 8


def inline_picks(sizes: list[int]) -> list[int]:
    """Which values (their indices, in order) go with a reply, by their sizes in bytes: of those of at most
    INLINE_BYTES, the INLINE_COUNT smallest (the first of equal ones)."""
    small = [i for i, n in enumerate(sizes) if n <= INLINE_BYTES]
    if len(small) > INLINE_COUNT:
        small = sorted(sorted(small, key=sizes.__getitem__)[:INLINE_COUNT])
    return small


def to_wire(x) -> Any:
    """A value as bytes can carry it between processes: a numpy array, or for a typed
    PRNG key (which numpy cannot hold) its implementation's name and its key data."""
    kind = x.dtype
    extended = _EXTENDED.get(kind)
    if extended is None:
        extended = _EXTENDED[kind] = jax.dtypes.issubdtype(kind, jax.dtypes.extended)
    if extended:
        return ("prng_key", str(jax.random.key_impl(x)), np.asarray(jax.random.key_data(x)))
    return np.asarray(x)


_EXTENDED: dict = {}  # dtype -> whether numpy cannot hold it (asked once: `issubdtype` takes ~5 µs)


def from_wire(value) -> Any:
    """The value `to_wire` packed: numpy as it came, a key wrapped again around its key data."""
    if isinstance(value, tuple):
        if value[0] == "prng_key":
            return jax.random.wrap_key_data(value[2], impl=value[1])
        if value[0] == NOT_HELD:
            raise RuntimeError(_not_held(value[1]))
    return value


def _not_held(handle: int) -> str:
    return (f"value {handle} is not on its island: the node that makes it failed or did not run (its run's error "
            f"says why), or it was freed")


def spec_tuple(sharding) -> tuple:
    return tuple(sharding.spec) if isinstance(sharding, NamedSharding) else ()


class IslandActor:
    """Runs in the island's own process: owns its JAX devices and the buffers behind handles."""

    def __init__(self) -> None:
        import jax as _jax

        self.jax = _jax
        self.devices = _jax.devices()
        self.buffers: dict[int, Any] = {}
        self.executables: dict[str, Any] = {}
        self.shipped: dict[str, Any] = {}  # nodes that call the host, shipped as Python (`shipped.py`)
        self.output = None  # what catches a shipped node's prints and logs (`node_output.py`), made at its load
        self.freed: set[int] = set()  # handles freed before the node making them ran
        self.unmade: set[int] = set()  # outputs of nodes that failed or did not run, until their frees come
        self.calls = 0  # run_many calls, for tests and benchmarks

    def describe(self) -> dict:
        import socket

        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "platform": self.devices[0].platform,
            "export": self.jax.export.default_export_platform(),  # what a client exports its nodes for
            "devices": [d.id for d in self.devices],
            "device_kind": self.devices[0].device_kind,
        }

    def clock(self) -> int:
        return time.perf_counter_ns()

    def _sharding(self, mesh_shape, axis_names, device_idx, spec):
        from jax.sharding import Mesh

        devs = np.array([self.devices[i] for i in device_idx], dtype=object).reshape(mesh_shape)
        return NamedSharding(Mesh(devs, tuple(axis_names)), PartitionSpec(*spec))

    def load(self, key: str, blob: bytes, layout: tuple, in_specs: list, out_specs: list, donate: list = ()) -> None:
        """A node's executable, as `jax.export` serialized it; ``donate``: the inputs whose buffers it reuses
        (a step's state: one copy of it on the devices, not two)."""
        exported = self.jax.export.deserialize(blob)
        in_sh = tuple(self._sharding(*layout, s) for s in in_specs)
        out_sh = tuple(self._sharding(*layout, s) for s in out_specs)
        self.executables[key] = self.jax.jit(exported.call, in_shardings=in_sh, out_shardings=out_sh,
                                             donate_argnums=tuple(donate))

    def load_shipped(self, key: str, blob: bytes, layout: tuple, in_specs: list, out_specs: list,
                     donate: list = ()) -> None:
        """Load a node that calls the host: its function pickled (`shipped.ship`), not a jax.export artifact."""
        from .node_output import NodeOutput
        from .shipped import ShippedNode

        if self.output is None:
            self.output = NodeOutput()
            self.output.install()
        in_sh = tuple(self._sharding(*layout, s) for s in in_specs)
        out_sh = tuple(self._sharding(*layout, s) for s in out_specs)
        self.shipped[key] = ShippedNode(blob, in_sh, out_sh)

    def run_many(self, ops: list, frees: list[int] = (), run: tuple | None = None) -> tuple:
        """Run consecutive nodes of one dispatch burst, in order: one actor call for all of them.

        Returns each node's (start, end) on this process's clock; (index, message) of
        the node that raised (the nodes after it are not run), or None; and, by node
        index, what shipped nodes wrote while they ran ({index: [(stream, text), ...]},
        empty if none did). ``frees``: handles to free once they have run (they ride
        along: one call fewer); ``run``: the controller's (run id, priority), which an
        actor runs in its mailbox's order anyway.
        """
        self.calls += 1
        times: list = []
        said: dict[int, list] = {}
        small: dict[int, Any] = {}  # a few small outputs (`inline_picks`), by handle: a loss read needs no second call
        try:
            for key, in_ids, out_ids in ops:
                start = time.perf_counter_ns()
                raised = None
                try:
                    args = [self.buffers[i] for i in in_ids]
                    shipped = self.shipped.get(key)
                    if shipped is None:
                        outs = self.executables[key](*args)
                        self.jax.block_until_ready(outs)  # the actor's mailbox is the island's ordered queue
                    else:
                        outs, pieces, raised = shipped.run(args, self.output)
                        if pieces:
                            said[len(times)] = pieces
                except Exception as e:
                    raised = f"{type(e).__name__}: {e}"
                if raised is not None:
                    self._unmade(h for _, _, out_ids in ops[len(times):] for h in out_ids)
                    return times, (len(times), raised), said
                for i, o in zip(out_ids, outs):
                    self._store(i, o)
                for k in inline_picks([o.size * o.dtype.itemsize for o in outs]):
                    small[out_ids[k]] = to_wire(outs[k])
                times.append((start, time.perf_counter_ns()))
            return times, None, said, small
        finally:
            self.free(frees)

    def _unmade(self, handles) -> None:
        """These outputs will never be made (their node failed, or one before it in its call): their frees, when
        they come, find nothing, and must not be kept in `freed` for a value that never arrives."""
        for h in handles:
            if h in self.freed:
                self.freed.discard(h)
            else:
                self.unmade.add(h)

    def _store(self, handle: int, value) -> None:
        if handle in self.freed:  # freed before it was made (its last reference died first)
            self.freed.discard(handle)
        else:
            self.buffers[handle] = value

    def put(self, handle: int, value, layout: tuple, spec: tuple) -> tuple[list, tuple | None]:
        start = time.perf_counter_ns()
        if isinstance(value, tuple) and value[0] == NOT_HELD:  # (moved from an island whose node failed)
            self._unmade([handle])
            return [], (0, _not_held(value[1]))
        value = from_wire(value)
        self._store(handle, self.jax.device_put(value, self._sharding(*layout, spec)).block_until_ready())
        return [(start, time.perf_counter_ns())], None

    def reshard(self, src: int, handle: int, layout: tuple, spec: tuple) -> tuple[list, None]:
        start = time.perf_counter_ns()
        out = self.jax.device_put(self.buffers[src], self._sharding(*layout, spec)).block_until_ready()
        self._store(handle, out)
        return [(start, time.perf_counter_ns())], None

    def colocated(self, fn, in_ids: list[int], out_ids: list[int], out_layouts: list, args: tuple,
                  out_avals: list = ()) -> tuple[list, tuple | None]:
        """Run host code here, beside the island's buffers: ``fn(arrays, out_shardings, *args)`` returns the new arrays.

        What the controller ships is the function and its small arguments; the arrays it
        reads and makes stay in this process (how a checkpoint's shards are written and read
        by the island that holds them). Returns, like ``run_many``, one (start, end) per
        output, and (0, message) if ``fn`` raised.
        """
        start = time.perf_counter_ns()
        try:
            shardings = [self._sharding(*layout, spec) for layout, spec in out_layouts]
            outs = list(fn([self.buffers[i] for i in in_ids], shardings, *args) or ())
            if len(outs) != len(out_ids):
                raise ValueError(f"{getattr(fn, '__name__', fn)} returned {len(outs)} arrays for {len(out_ids)} outputs")
            self.jax.block_until_ready(outs)
        except Exception as e:
            self._unmade(out_ids)
            return [], (0, f"{type(e).__name__}: {e}")
        for i, o in zip(out_ids, outs):
            self._store(i, o)
        end = time.perf_counter_ns()
        return [(start, end)] * max(1, len(out_ids)), None

    def get(self, handle: int):
        """A buffer's value as `to_wire` packs it, or that it holds none. Said, not raised: a transfer's read
        whose reader died meanwhile is never read, and Ray prints an error nobody read as unhandled."""
        value = self.buffers.get(handle, MISSING)
        return (NOT_HELD, handle) if value is MISSING else to_wire(value)

    def get_many(self, handles: list[int]) -> list:
        """Several values in one reply (`pw.get` of a tree); None for a handle it no longer holds."""
        return [to_wire(self.buffers[h]) if h in self.buffers else None for h in handles]

    def free(self, handles: list[int]) -> None:
        for h in handles:
            if self.buffers.pop(h, MISSING) is MISSING:
                if h in self.unmade:
                    self.unmade.discard(h)
                else:
                    self.freed.add(h)

    def stats(self) -> dict:
        return {
            "buffers": len(self.buffers), "executables": len(self.executables) + len(self.shipped), "run_calls": self.calls,
            "waiting_frees": len(self.freed) + len(self.unmade),
        }

"""Program signatures: which leaves of a call are traced, and the key a program caches its graphs under."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, Sharding

from ..devices import ResourceManager, VirtualSlice
from ..errors import TracerArgument, TracingError
from ..futures import Future
from ..remote.client import RemoteArray


def is_traced_leaf(x: Any) -> bool:
    """Arrays and futures are traced program inputs; every other leaf is a constant."""
    return isinstance(x, (Future, jax.Array, np.ndarray, np.generic, RemoteArray))


def abstract_leaf(x: Any) -> jax.ShapeDtypeStruct:
    if isinstance(x, (Future, jax.Array, RemoteArray)):
        return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype, sharding=x.sharding)
    x = np.asarray(x)
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def signature(args: tuple, kwargs: dict) -> tuple[Any, list[Any], tuple, int]:
    """Flatten (args, kwargs); return (treedef, leaves, hashable cache key, how many leaves are constants).

    A future is keyed by the graph `Value` it was made from (shape, dtype, sharding and slice;
    hashed by identity): a training loop passing a step's outputs to the next asks nothing of them.
    Raises `TracerArgument` for a JAX tracer among the leaves (a compiled function called inside
    `jax.jit` is then a jitted function: its caller looks for that this way, without a walk of its own).
    """
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    key = []
    add = key.append
    consts = 0
    for i, leaf in enumerate(leaves):
        t = type(leaf)
        if t is Future:
            add(leaf._spec)
        elif t is RemoteArray:
            add(("A", tuple(leaf.shape), leaf.dtype, leaf.sharding, id(leaf.slice) if leaf.slice else None))
        elif isinstance(leaf, jax.Array):  # the hot path of every call: no ShapeDtypeStruct
            if isinstance(leaf, jax.core.Tracer):
                raise TracerArgument(
                    f"`pw.program`: argument leaf {i} is a JAX tracer ({leaf}): a program was called inside a "
                    f"JAX transformation (`jax.jit`, `jax.grad`, ...). Call it outside, or call the "
                    f"`pw.compiled` functions it uses directly: inside a transformation they act as `jax.jit`."
                )
            add(("A", leaf.shape, leaf.dtype, leaf.sharding))
        elif isinstance(leaf, (np.ndarray, np.generic)):
            add(("A", np.shape(leaf), leaf.dtype, None))
        else:
            try:
                hash(leaf)
            except TypeError:
                raise TracingError(
                    f"`pw.program`: argument leaf {i} is a {type(leaf).__name__}, which is neither an array "
                    f"(traced) nor hashable (a constant baked into the trace). Pass it as a jax/numpy array, "
                    f"or as a hashable value such as a tuple."
                ) from None
            add(("S", t, leaf))
            consts += 1
    return treedef, leaves, (treedef, tuple(key)), consts


def placed_signature(key: tuple, leaves: list[Any], resources: ResourceManager) -> tuple:
    """``signature``'s key with every device array keyed by the slice a trace puts it on.

    A future knows its slice; a `jax.Array` is on the slice whose devices and mesh its sharding
    has (as `home_slice` finds it). An array and a future of the same shape, dtype,
    sharding and slice trace to the same graph: a cell run first on arrays, then again on the
    futures it returned, reuses its trace.
    """
    treedef, parts = key
    out = []
    for part, leaf in zip(parts, leaves):
        if isinstance(leaf, (Future, RemoteArray, jax.Array)) and (type(part) is not tuple or part[0] == "A"):
            home = getattr(leaf, "slice", None) if not isinstance(leaf, jax.Array) else None
            if home is None and leaf.sharding is not None:
                home = home_slice(resources, leaf.sharding)
            part = ("A", tuple(leaf.shape), leaf.dtype, leaf.sharding, id(home) if home is not None else None)
        out.append(part)
    return (treedef, tuple(out))


def home_slice(resources: ResourceManager, sharding: Sharding) -> VirtualSlice | None:
    """The local slice with exactly the devices of ``sharding`` (the one with its mesh first), if any."""
    devs = sharding.device_set
    best = None
    for s in resources.slices:
        if s.island.remote is not None:  # its devices are stand-ins: a local array is never there
            continue
        if set(s.devices) == devs:
            if isinstance(sharding, NamedSharding) and sharding.mesh == s.mesh:
                return s
            best = best or s
    return best

"""`pw.put`: place an array where a sharding says, once, also when that is a remote island.

`jax.device_put(x, s.sharding("data"))` on a slice of a remote island (the
Pathways service, a Ray island) puts ``x`` on this process's stand-in devices
for those: JAX cannot know they stand in for another process's. Passing such an
array to a program on the slice sends it there on its first use and, since a
`jax.Array` never changes, never again while it lives (`RemoteIsland.placed`).
`pw.put` sends the bytes at once instead and keeps none here: the array lives
only on the island (a dataset bigger than this process's memory, a value to
`pw.keep`). On this process's own devices it is `jax.device_put`.

Example::

    s = pw.slice(4, mesh={"data": 4})          # on the service
    X = pw.put(np.load("train.npy"), s.sharding("data"))   # sent once, lives there
    for step in range(1000):
        state, loss = train_step(state, X[...])          # no transfer of X
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from ..errors import ArgumentError
from .actor import spec_tuple, to_wire
from .client import RemoteArray, RemoteIsland, _layout


def remote_slice(resources, sharding) -> Any | None:
    """The slice of a remote island whose stand-in mesh ``sharding`` is on, or None (a local sharding)."""
    if not isinstance(sharding, NamedSharding):
        return None
    for s in resources.slices:
        if s.island.remote is not None and s.mesh == sharding.mesh and not s.released:
            return s
    return None


def put(x: Any, sharding: Any, resources=None) -> Any:
    """``x`` placed on ``sharding``: on a remote island's slice, sent there now (a `pw.RemoteArray` living
    there, no bytes kept here); on this process's devices, `jax.device_put`.

    Example::

        X = pw.put(dataset, s.sharding("data"))   # s: a slice of the Pathways service
    """
    if resources is None:
        from ..api import controller

        resources = controller().resources
    if not isinstance(sharding, jax.sharding.Sharding):
        raise ArgumentError(
            f"`pw.put(x, sharding)` takes a jax Sharding (e.g. `s.sharding('data')` of a slice); got "
            f"{type(sharding).__name__}: {sharding!r}."
        )
    s = remote_slice(resources, sharding)
    if s is None:
        return jax.device_put(x, sharding)
    if isinstance(x, RemoteArray):
        raise ArgumentError(
            f"`pw.put(x, sharding)`: x is already a {x!r}; pass it to a program on the slice (it is resharded "
            f"there), or `np.asarray(x)` first to bring it here."
        )
    isl: RemoteIsland = s.island.remote
    isl.check("pw.put")
    value = x if isinstance(x, (np.ndarray, jax.Array)) else np.asarray(x)
    handle = isl.new_handle()
    link = isl.link
    try:
        link.get(link.request("put", handle, link.put(to_wire(value)), _layout(sharding, isl), spec_tuple(sharding)))
    except link.lost_errors() as e:
        raise isl.lost(e) from None
    return isl.existing(handle, value.shape, value.dtype, sharding, s)

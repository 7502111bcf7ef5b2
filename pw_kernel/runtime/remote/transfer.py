"""A transfer node that touches a remote island: to it, from it, between two, or within one.

To an island from this process, the bytes go once per local `jax.Array` while it
lives (`RemoteIsland.placed`: a jax.Array never changes). Between two islands of one
Pathways service, the service moves them itself (a `reshard` there, island to island:
Ray's object store between two Ray nodes), never through this process.
"""

from __future__ import annotations

import weakref

import jax

from .actor import spec_tuple, to_wire
from .client import RemoteArray, RemoteIsland, _layout


class RemoteTransfer:
    """`Step.call` for a transfer that touches a remote island (to, from, or between two)."""

    def __init__(self, src: RemoteIsland | None, dst: RemoteIsland | None, want, value):
        self.src = src
        self.dst = dst
        self.want = want
        self.value = value
        self.lands_remote = dst is not None

    def __call__(self, x):
        want, v = self.want, self.value
        if self.dst is None:  # remote -> here: the bytes come to this process now (the dispatcher waits)
            return [jax.device_put(x.fetch(), want)]
        dst = self.dst
        dst.check("transfer")
        if isinstance(x, RemoteArray) and x.generation != x.island.generation:
            raise x.island.stale(x, "Moving it to another slice")
        handle = dst.new_handle()
        layout, spec = _layout(want, dst), spec_tuple(want)
        if isinstance(x, RemoteArray) and (x.island is dst or x.island.primary is dst.primary):
            # A reshard inside the island, or between two islands of one service, which moves the bytes itself
            # (Ray's object store between two Ray nodes): ordered after what makes x, by their one mailbox.
            ticket = dst.call(lambda: dst.link.request("reshard", x.handle, handle, layout, spec))
        elif isinstance(x, RemoteArray):  # island to island: actor to actor through the object store
            src = x.island
            payload = src.call(lambda: src.link.request("get", x.handle))  # in the source's order
            ticket = dst.call(lambda: dst.link.request("put", handle, payload.wait_ref(), layout, spec))
        else:  # from this process: waiting for the value and serialising it is the mailbox's, not ours
            copy = dst.placed.get(id(x)) if isinstance(x, jax.Array) else None
            if copy is not None and copy[0]() is x and (layout, spec) in copy[1]:
                return [copy[1][(layout, spec)]]  # (sent before: it lives there still)
            ticket = dst.call(lambda: dst.link.request("put", handle, dst.link.put(to_wire(x)), layout, spec))
            out = RemoteArray(dst, handle, v.shape, v.dtype, want, ticket)
            if isinstance(x, jax.Array):
                _remember(dst, x, (layout, spec), out)
            return [out]
        return [RemoteArray(dst, handle, v.shape, v.dtype, want, ticket)]


def _remember(isl: RemoteIsland, x: jax.Array, where: tuple, copy: RemoteArray) -> None:
    """Keep ``copy`` (``x`` sent to ``isl``) for as long as ``x`` lives: its next run sends nothing."""
    key = id(x)
    entry = isl.placed.get(key)
    if entry is None or entry[0]() is not x:
        placed = isl.placed
        entry = placed[key] = (weakref.ref(x, lambda _, key=key: placed.pop(key, None)), {})
    entry[1][where] = copy

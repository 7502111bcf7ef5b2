"""A checkpoint's shards written and read by the remote island that holds them, never through the controller.

A save puts the leaves that live on a Ray island in an orbax item of their own
(``island_0``, ``island_1``, ... one per island in the save), a flat pytree
``{"leaf_00003": array, ...}`` that the island's actor writes with orbax's
`StandardCheckpointHandler` into the step's temporary directory; orbax's
manager then finalizes the step as usual, so the step is whole or absent. A
restore onto a remote slice has that island's actor read its leaves from
whichever item holds them (orbax reads only the wanted ones: the others are
``ocp.PLACEHOLDER``). The step directory must be a path every island can
reach (one machine, or a shared file system as on a cluster).

Plain orbax opens these items like any other:
``mngr.restore(step, args=ocp.args.Composite(island_0=ocp.args.StandardRestore()))``.

The functions named ``*_on_island`` run inside the actor's process (shipped by
`RemoteIsland.colocated`, pickled by reference): they import orbax there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from ..runtime import RemoteArray
from .tree import path_key

ITEM_PREFIX = "island_"
#: In each island's item: the host and pid of the process that wrote it.
WRITTEN_BY = "written_by.json"


def leaf_name(k: int) -> str:
    """The name of a remote leaf inside its island's item (orbax keys: short and path-safe)."""
    return f"leaf_{k:05d}"


# --------------------------------------------------------------- inside the island's process
def write_on_island(arrays: list, out_shardings: list, names: list[str], directory: str) -> list:
    """Write ``{name: array}`` as an orbax pytree item in ``directory`` (this island's own shards)."""
    import orbax.checkpoint as ocp
    from etils import epath

    import json
    import os
    import socket

    handler = ocp.StandardCheckpointHandler()
    path = epath.Path(directory)
    handler.save(path, args=ocp.args.StandardSave(dict(zip(names, arrays, strict=True))))
    handler.finalize(path)
    handler.close()
    # Which process wrote these shards (the island's own, on its host): a checkpoint says where each part came from.
    (path / WRITTEN_BY).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    return []


def read_on_island(arrays: list, out_shardings: list, directory: str, wanted: list[tuple[str, str]]) -> list:
    """Read the leaves ``wanted`` ((key, dtype) each) of the orbax item in ``directory`` onto this
    island's devices as ``out_shardings`` say, in order; orbax skips the rest of the item."""
    return read_item(directory, [(key, sh, jax.numpy.dtype(dt)) for (key, dt), sh in zip(wanted, out_shardings)])


def read_item(directory: str, wanted: list[tuple[str, Any, Any]], metadata: Any = None) -> list:
    """The leaves ``wanted`` ((key, sharding or None for numpy, dtype) each) of an orbax pytree item, in order.

    The other leaves of the item are not read (``ocp.PLACEHOLDER``). ``metadata``: the item's
    metadata tree when the caller has it already (reading it again costs a file read).
    """
    import orbax.checkpoint as ocp
    from etils import epath

    path = epath.Path(directory)
    if metadata is None:
        metadata = ocp.PyTreeCheckpointHandler().metadata(path)
        metadata = getattr(metadata, "tree", metadata)
    wants = {key: (sharding, dtype) for key, sharding, dtype in wanted}
    partial = False

    def target(p, m):
        nonlocal partial
        key = path_key(p)
        if key not in wants:
            partial = True
            return ocp.PLACEHOLDER
        sharding, dtype = wants[key]
        dtype = m.dtype if dtype is None else dtype
        if sharding is None:
            return np.zeros(tuple(m.shape), dtype) if getattr(m, "shape", None) is not None else m
        return jax.ShapeDtypeStruct(tuple(m.shape), dtype, sharding=sharding)

    tree = jax.tree_util.tree_map_with_path(target, metadata)
    if partial:  # only the standard handler's general form takes placeholders
        handler = ocp.PyTreeCheckpointHandler()
        restore_args = ocp.checkpoint_utils.construct_restore_args(tree)
        restored = handler.restore(path, args=ocp.args.PyTreeRestore(item=tree, restore_args=restore_args))
    else:  # the whole item: exactly what plain orbax's StandardRestore does
        handler = ocp.StandardCheckpointHandler()
        restored = handler.restore(path, args=ocp.args.StandardRestore(tree))
    handler.close()
    got = {path_key(p): v for p, v in jax.tree_util.tree_flatten_with_path(restored)[0]}
    return [got[key] for key, _, _ in wanted]


# --------------------------------------------------------------- the controller's side
def remote_leaf(x: Any) -> RemoteArray | None:
    """The RemoteArray behind a saved leaf when it lives on a remote island (waiting for it), else None."""
    if isinstance(x, RemoteArray):
        return x
    remote_array = getattr(x, "remote_array", None)
    return remote_array() if callable(remote_array) else None


def islands_items(leaves: dict[str, RemoteArray]) -> dict[str, tuple[Any, dict[str, str], list[RemoteArray]]]:
    """Group remote leaves by island: item name -> (island, {leaf key: name in the item}, arrays in name order)."""
    by_island: dict[int, list[tuple[str, RemoteArray]]] = {}
    for key, ra in leaves.items():
        by_island.setdefault(id(ra.island), []).append((key, ra))
    items = {}
    for j, group in enumerate(by_island.values()):
        names = {key: leaf_name(k) for k, (key, _) in enumerate(group)}
        items[f"{ITEM_PREFIX}{j}"] = (group[0][1].island, names, [ra for _, ra in group])
    return items


def handler_types():
    """orbax's handler and args for an island's item (made on first use: orbax is the `train` extra)."""
    global _TYPES
    if _TYPES is None:
        import orbax.checkpoint as ocp

        class IslandItemHandler(ocp.CheckpointHandler):
            """Saves an island's item by asking the island's actor to write it into the step's directory."""

            def save(self, directory, args: IslandSave) -> None:  # orbax's temporary item directory
                island = args.arrays[0].island
                island.colocated(write_on_island, args.arrays, args=(args.names, str(directory)))

            def restore(self, directory, args: Any = None) -> Any:
                return ocp.StandardCheckpointHandler().restore(directory)

            def metadata(self, directory) -> Any:
                return ocp.StandardCheckpointHandler().metadata(directory)

        @ocp.args.register_with_handler(IslandItemHandler, for_save=True)
        @dataclasses.dataclass
        class IslandSave(ocp.args.CheckpointArgs):
            arrays: list
            names: list

        @ocp.args.register_with_handler(IslandItemHandler, for_restore=True)
        @dataclasses.dataclass
        class IslandRestore(ocp.args.CheckpointArgs):
            """Reading an island's item here (pw reads it with `read_item`; plain orbax with StandardRestore)."""

        _TYPES = (IslandItemHandler, IslandSave)
    return _TYPES


_TYPES = None


def read_onto_island(slice_: Any, directory: str, wanted: list[tuple[str, jax.ShapeDtypeStruct]]) -> list[RemoteArray]:
    """Have ``slice_``'s island read ``wanted`` ((key, abstract with a sharding of ``slice_``) each) from an item."""
    specs = [(key, jax.numpy.dtype(a.dtype).name) for key, a in wanted]
    island = slice_.island.remote
    out = island.colocated(read_on_island, (), [a for _, a in wanted], args=(directory, specs), slice_=slice_)
    if out:
        out[0].block_until_ready()  # a restore is not on the hot path: say now if the island could not read
    return out


__all__ = ["ITEM_PREFIX", "handler_types", "islands_items", "read_item", "read_onto_island", "remote_leaf"]

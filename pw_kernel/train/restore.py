"""Reading checkpoints back: each leaf placed where its target says, pipeline states onto any slice layout.

Orbax reads every array straight onto the devices its `jax.ShapeDtypeStruct`
names (each device reads its own shards), so restoring onto other slices,
another mesh shape or other ``param_specs`` is a matter of the target. A leaf
whose target is a slice on a remote island is read by that island's actor
(`OnIsland`; see `island_io`) and comes back as a `pw.RemoteArray` there. A
pipeline's target comes from the pipeline itself (`abstract_state`): its
stages' slices and specs, the optimizer state's structure from
`jax.eval_shape` of the optimizer's init over the whole model, each of its
leaves where the parameter it mirrors lives (`optimizer.py`). Nothing is placed
to find that out; a `Pipeline` in a target stands for that state, so a pipeline
restores through `CheckpointManager.restore` as a data-parallel run does. A
number comes back as the Python or numpy scalar its target (or its save) was.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from ..runtime import Future, RemoteArray, VirtualSlice
from .errors import CheckpointError
from .state import PipelineState
from .targets import is_pipeline
from .tree import canonical, decode_iterator_state, flat, is_iterator_with_state, is_leaf, path_key, rebuild


@dataclasses.dataclass(frozen=True, eq=False)
class OnIsland:
    """A restore destination on a remote island's slice: that island's actor reads the leaf."""

    abstract: jax.ShapeDtypeStruct  # shape, dtype, and a sharding of the slice's (stand-in) mesh
    slice: VirtualSlice

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.abstract.shape)

    @property
    def dtype(self) -> Any:
        return self.abstract.dtype


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A restore destination for a Python or numpy scalar: read on the host as saved, returned as ``kind``."""

    kind: type  # int, float, bool, complex, or a numpy scalar type
    shape: tuple = ()
    dtype: Any = None  # read with the saved dtype; ``kind`` converts it


SCALARS = (bool, int, float, complex, np.generic)


def _scalar_kind(m: Any) -> type | None:
    """The Python type of a leaf orbax saved as a Python scalar (its ScalarMetadata), else None."""
    if type(m).__name__ != "ScalarMetadata":
        return None
    kind = np.dtype(m.dtype).kind
    return {"b": bool, "i": int, "u": int, "f": float, "c": complex}.get(kind)


def on_slice(slice_: VirtualSlice | None, abstract: Any) -> Any:
    """``abstract`` as a destination on ``slice_``: an `OnIsland` when the slice is on a remote island."""
    if slice_ is not None and slice_.remote and isinstance(abstract, jax.ShapeDtypeStruct):
        return OnIsland(abstract, slice_)
    return abstract


def _abstract_of(x: Any) -> Any:
    """Where a target leaf says a value goes."""
    if isinstance(x, (Future, jax.Array, RemoteArray)):
        sds = jax.ShapeDtypeStruct(tuple(x.shape), x.dtype, sharding=x.sharding)
        return on_slice(getattr(x, "slice", None), sds)
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, np.ndarray):
        return np.zeros(x.shape, x.dtype)
    if isinstance(x, SCALARS):
        return Scalar(type(x))
    return x


def _host(saved: Any, data: dict, prefix: str = "") -> Any:
    """Host targets for a saved tree (what a restore without a target gives): numpy arrays, and
    scalars as the Python or numpy scalars they were saved as."""
    numpy_scalars = set(data.get("numpy_scalars", ()))

    def one(path, m):
        kind = _scalar_kind(m)
        if kind is not None:
            return Scalar(kind)
        shape = getattr(m, "shape", None)
        if shape is None:
            return m
        key = prefix + path_key(path)
        return Scalar(np.dtype(m.dtype).type) if key in numpy_scalars and shape == () else np.zeros(shape, m.dtype)

    return jax.tree_util.tree_map_with_path(one, saved)


def check_shapes(saved: Any, abstract: Any, where: str) -> None:
    """Raise CheckpointError naming the first leaf whose saved shape or dtype differs from the expected one."""
    got = dict(flat(saved))
    # Parameters first: an optimizer state differs because its parameter does.
    for key, want in sorted(flat(abstract), key=lambda kv: "opt_state" in kv[0]):
        have = got.get(key)
        if have is None or not hasattr(want, "shape"):
            continue
        if tuple(have.shape) != tuple(want.shape):
            raise CheckpointError(
                f"`{where}`: the leaf {key} was saved with shape {tuple(have.shape)}, but {tuple(want.shape)} is "
                f"expected here. Restore into a model of the saved sizes, or give a target that matches."
            )
    missing = [k for k, w in flat(abstract) if hasattr(w, "shape") and k not in got]
    if missing:
        raise CheckpointError(
            f"`{where}`: the checkpoint has no leaf {missing[0]} (it has {sorted(got)[:8]}...). "
            f"Was it saved from another model or optimizer?"
        )


def read(mngr: Any, step: int, data: dict, abstract: Any) -> Any:
    """``abstract`` (a tree of destinations) with each leaf read from ``step``."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    values = mngr.read_leaves(step, data, [(path_key(p), d) for p, d in leaves])
    values = [d.kind(v) if isinstance(d, Scalar) else v for (_, d), v in zip(leaves, values, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, values)


def restore_tree(mngr: Any, step: int, saved: Any, data: dict, target: Any) -> Any:
    """`CheckpointManager.restore`: read ``step`` placed as ``target`` says (numpy without one)."""
    kinds = data.get("containers", {})
    if target is None:
        return rebuild(read(mngr, step, data, _host(saved, data)), kinds)
    api = f"CheckpointManager.restore(step={step})"
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target, is_leaf=is_leaf)
    abstract, after = [], []
    for path, leaf in leaves:
        key = jax.tree_util.keystr(path)
        if is_pipeline(leaf):  # the pipeline places its own state: its stages' slices and specs
            like = pipeline_destinations(leaf, _pipeline_state_at(saved, data, key, leaf, api), step, api)
            abstract.append(canonical(like))
            after.append(("pipeline", like))
        elif isinstance(leaf, PipelineState):
            abstract.append(canonical(jax.tree_util.tree_map(_abstract_of, leaf)))
            after.append(("pipeline", leaf))
        elif is_iterator_with_state(leaf):
            states = data.get("iterators", {})
            if key not in states:
                raise CheckpointError(f"`CheckpointManager.restore(step={step})`: no data iterator was saved at {key}.")
            leaf.set_state(decode_iterator_state(states[key]))
            abstract.append(None)
            after.append(("iterator", leaf))
        elif leaf is None:  # no place given: what was saved there comes back as without a target
            abstract.append(_host(_at(saved, key), data, path_key(path)))
            after.append(("host", path_key(path)))
        else:
            abstract.append(jax.tree_util.tree_map(_abstract_of, leaf))
            after.append(("leaf", None))
    tree = jax.tree_util.tree_unflatten(treedef, abstract)
    check_shapes(saved, tree, f"CheckpointManager.restore(step={step})")
    restored_leaves = treedef.flatten_up_to(read(mngr, step, data, tree))
    out = []
    for (path, _), (kind, leaf), value in zip(leaves, after, restored_leaves, strict=True):
        if kind == "pipeline":
            out.append(_copies_like(mngr, step, data, path_key(path), value, leaf))
        elif kind == "iterator":
            out.append(leaf)
        elif kind == "host":
            out.append(rebuild(value, kinds, leaf))
        else:
            out.append(value)
    return jax.tree_util.tree_unflatten(treedef, out)


def _copies_like(mngr: Any, step: int, data: dict, key: str, value: dict, like: PipelineState) -> PipelineState:
    """A layout-free pipeline state made a `PipelineState` again, each shared copy placed where ``like``'s is.

    The first copy is the one read with the rest. Another copy is a device-to-device copy
    of it when both are local; otherwise it is read from the checkpoint onto its own slice
    (a remote island's actor reads it there).
    """
    shared = {}
    for n, copies in like.shared.items():
        first = value["shared"][n]
        placed = [first]
        for c in copies[1:]:
            dest = jax.tree_util.tree_map(_abstract_of, c)
            leaves, treedef = jax.tree_util.tree_flatten_with_path(dest)
            local = all(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(first))
            if local and not any(isinstance(d, OnIsland) for _, d in leaves):
                placed.append(jax.tree_util.tree_map(lambda v, d: jax.device_put(v, d.sharding), first, dest))
            else:
                prefix = f"{key}['shared'][{n!r}]"
                vals = mngr.read_leaves(step, data, [(prefix + path_key(p), d) for p, d in leaves])
                placed.append(jax.tree_util.tree_unflatten(treedef, vals))
        shared[n] = tuple(placed)
    return PipelineState(list(value["params"]), shared, value["opt_state"])


# ------------------------------------------------------------------ pipelines
def abstract_pipeline_state(pipe: Any, placement: Any, params: Any, shared: Any = None) -> PipelineState:
    """``pipe``'s state for params of these shapes, as ShapeDtypeStructs on its slices: nothing is placed."""
    placement.check_len(params)
    state = placement.abstract(params, shared)
    opt = placement.optimizer
    if opt is not None:  # the whole model's optimizer state, each leaf where its parameter lives
        state.opt_state = opt.layout(opt.whole(state.params, placement.owned(state))).state
    return state


def _pipeline_state_at(saved: Any, data: dict, key: str, pipe: Any, api: str) -> Any:
    """The saved pipeline state at ``key`` (a target's path), or CheckpointError saying where they are."""
    where = data.get("pipeline_states", [])
    if key not in where:
        raise CheckpointError(
            f"`{api}`: the target at {key} is the pipeline {pipe.name!r}, but no pipeline state was saved there; "
            f"pipeline states are at {where}. Put the pipeline where its state was saved."
        )
    return _at(saved, key)


def pipeline_destinations(pipe: Any, node: Any, step: int, api: str) -> PipelineState:
    """Where ``pipe`` puts the saved pipeline state ``node`` (its metadata): a `PipelineState` of
    destinations on its stages' slices. Raises CheckpointError unless the stages and optimizer match."""
    placement = pipe._placement  # the pipeline's own layout
    V = len(pipe.stages)
    if len(node["params"]) != V:
        raise CheckpointError(
            f"`{api}`: step {step} saved {len(node['params'])} stages' params, but the pipeline {pipe.name!r} "
            f"has {V} stages. Restore into a pipeline of the same stages (on any slices)."
        )
    if (node.get("opt_state") is None) != (pipe.optimizer is None):
        had = "no optimizer state" if node.get("opt_state") is None else "an optimizer state"
        raise CheckpointError(f"`{api}`: step {step} saved {had}; this pipeline's optimizer is {pipe.optimizer!r}.")
    return _on_stage_slices(pipe, placement, abstract_pipeline_state(pipe, placement, node["params"], node["shared"]))


def restore_pipeline(pipe: Any, mngr: Any, step: int | None, key: str | None) -> PipelineState:
    """`Pipeline.restore`: the pipeline state saved at ``step``, on ``pipe``'s own slices."""
    api = f"{pipe.name}.restore"
    step = mngr.finished_step(step, api)
    saved, data = mngr.metadata(step)
    where = data.get("pipeline_states", [])
    if key is None:
        if len(where) != 1:
            raise CheckpointError(
                f"`{api}`: step {step} holds {len(where)} pipeline states ({where}); say which with key=."
            )
        key = where[0]
    elif key not in where:
        raise CheckpointError(f"`{api}(key={key!r})`: step {step} holds pipeline states at {where}.")
    node = _at(saved, key)
    abstract = pipeline_destinations(pipe, node, step, api)
    target = canonical(abstract)
    check_shapes(node, target, api)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)  # only this state's leaves are read
    values = mngr.read_leaves(step, data, [(key + path_key(p), d) for p, d in leaves])
    state = _copies_like(mngr, step, data, key, jax.tree_util.tree_unflatten(treedef, values), abstract)
    return state


def _on_stage_slices(pipe: Any, placement: Any, state: PipelineState) -> PipelineState:
    """``state``'s leaves as destinations on their stages' slices (`OnIsland` where a slice is remote)."""
    stages = pipe.stages

    def at(j: int, tree: Any) -> Any:
        return jax.tree_util.tree_map(lambda a: on_slice(stages[j].slice, a), tree)

    params = [at(j, p) for j, p in enumerate(state.params)]
    shared = {
        n: tuple(at(u, c) for u, c in zip(placement.shared_users[n], copies)) for n, copies in state.shared.items()
    }
    # The optimizer's state is the whole model's; a remote slice takes no optimizer, so it is all local.
    return PipelineState(params, shared, state.opt_state)


def _path_keys(key: str) -> list[str]:
    import re

    return [a or b for a, b in re.findall(r"\['([^']*)'\]|\[(\d+)\]", key)]


def _at(tree: Any, key: str) -> Any:
    for k in _path_keys(key):
        tree = tree[int(k)] if isinstance(tree, (list, tuple)) else tree[k]
    return tree


def replace_at(tree: Any, key: str, value: Any) -> Any:
    """``tree`` with the node at ``key`` (as `path_key` spells it) replaced by ``value``."""
    return _replaced(tree, _path_keys(key), value)


def _replaced(tree: Any, keys: list[str], value: Any) -> Any:
    """``tree`` with the node at ``keys`` replaced by ``value`` (containers copied along the path)."""
    if not keys:
        return value
    k, rest = keys[0], keys[1:]
    if isinstance(tree, (list, tuple)):
        items = list(tree)
        items[int(k)] = _replaced(items[int(k)], rest, value)
        return type(tree)(items) if isinstance(tree, tuple) else items
    return {**tree, k: _replaced(tree[k], rest, value)}


__all__ = ["abstract_pipeline_state", "pipeline_destinations", "restore_pipeline", "restore_tree"]

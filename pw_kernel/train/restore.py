"""Reading checkpoints back: each leaf placed where its target says, pipeline states onto any slice layout.

Orbax reads every array straight onto the devices its `jax.ShapeDtypeStruct`
names (each device reads its own shards), so restoring onto other slices,
another mesh shape or other ``param_specs`` is a matter of the target. A
pipeline's target comes from the pipeline itself (`abstract_state`): its
stages' slices and specs, the optimizer state's structure from
`jax.eval_shape` of the optimizer's init over the whole model, each of its
leaves where the parameter it mirrors lives (`optimizer.py`). Nothing is placed
to find that out.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ..runtime import Future
from .tree import canonical, decode_iterator_state, is_iterator_with_state, is_leaf
from .errors import CheckpointError
from .state import PipelineState


def _abstract_of(x: Any) -> Any:
    """Where a target leaf says a value goes."""
    if isinstance(x, (Future, jax.Array)):
        return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype, sharding=x.sharding)
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, np.ndarray):
        return np.zeros(x.shape, x.dtype)
    return x


def _host(saved: Any) -> Any:
    """Numpy targets for a saved tree (what a restore without a target gives)."""

    def one(m):
        shape = getattr(m, "shape", None)
        return np.zeros(shape, m.dtype) if shape is not None else m

    return jax.tree_util.tree_map(one, saved)


def check_shapes(saved: Any, abstract: Any, where: str) -> None:
    """Raise CheckpointError naming the first leaf whose saved shape or dtype differs from the expected one."""
    got = dict(_flat(saved))
    # Parameters first: an optimizer state differs because its parameter does.
    for key, want in sorted(_flat(abstract), key=lambda kv: "opt_state" in kv[0]):
        have = got.get(key)
        if have is None or not hasattr(want, "shape"):
            continue
        if tuple(have.shape) != tuple(want.shape):
            raise CheckpointError(
                f"`{where}`: the leaf {key} was saved with shape {tuple(have.shape)}, but {tuple(want.shape)} is "
                f"expected here. Restore into a model of the saved sizes, or give a target that matches."
            )
    missing = [k for k, w in _flat(abstract) if hasattr(w, "shape") and k not in got]
    if missing:
        raise CheckpointError(
            f"`{where}`: the checkpoint has no leaf {missing[0]} (it has {sorted(got)[:8]}...). "
            f"Was it saved from another model or optimizer?"
        )


def _flat(tree: Any) -> list[tuple[str, Any]]:
    """(path, leaf) with paths spelled alike whether a level is a dict, a list or a named tuple (orbax
    reads a named tuple's fields back as a dict's keys)."""
    return [("".join(f"[{_key(k)!r}]" for k in p), v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _key(k: Any) -> Any:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return getattr(k, attr)
    return str(k)


def restore_tree(mngr: Any, step: int, saved: Any, data: dict, target: Any) -> Any:
    """`CheckpointManager.restore`: read ``step`` placed as ``target`` says (numpy without one)."""
    if target is None:
        return mngr.read(step, _host(saved))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target, is_leaf=is_leaf)
    abstract, after = [], []
    for path, leaf in leaves:
        key = jax.tree_util.keystr(path)
        if isinstance(leaf, PipelineState):
            abstract.append(canonical(jax.tree_util.tree_map(_abstract_of, leaf)))
            after.append(("pipeline", leaf))
        elif is_iterator_with_state(leaf):
            states = data.get("iterators", {})
            if key not in states:
                raise CheckpointError(f"`CheckpointManager.restore(step={step})`: no data iterator was saved at {key}.")
            leaf.set_state(decode_iterator_state(states[key]))
            abstract.append(None)
            after.append(("iterator", leaf))
        elif leaf is None:  # no place given: what was saved there comes back as numpy
            abstract.append(_host(_at(saved, key)))
            after.append(("leaf", None))
        else:
            abstract.append(jax.tree_util.tree_map(_abstract_of, leaf))
            after.append(("leaf", None))
    tree = jax.tree_util.tree_unflatten(treedef, abstract)
    check_shapes(saved, tree, f"CheckpointManager.restore(step={step})")
    restored_leaves = treedef.flatten_up_to(mngr.read(step, tree))
    out = []
    for (kind, leaf), value in zip(after, restored_leaves, strict=True):
        if kind == "pipeline":
            out.append(_copies_like(value, leaf))
        elif kind == "iterator":
            out.append(leaf)
        else:
            out.append(value)
    return jax.tree_util.tree_unflatten(treedef, out)


def _copies_like(value: dict, like: PipelineState) -> PipelineState:
    """A layout-free pipeline state made a `PipelineState` again, shared copies placed as ``like``'s."""
    shared = {
        n: tuple(jax.device_put(value["shared"][n], c.sharding) for c in copies) for n, copies in like.shared.items()
    }
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


def restore_pipeline(pipe: Any, placement: Any, mngr: Any, step: int | None, key: str | None) -> PipelineState:
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
    V = len(pipe.stages)
    if len(node["params"]) != V:
        raise CheckpointError(
            f"`{api}`: step {step} saved {len(node['params'])} stages' params, but this pipeline has {V} stages. "
            f"Restore into a pipeline of the same stages (on any slices)."
        )
    if (node.get("opt_state") is None) != (pipe.optimizer is None):
        had = "no optimizer state" if node.get("opt_state") is None else "an optimizer state"
        raise CheckpointError(f"`{api}`: step {step} saved {had}; this pipeline's optimizer is {pipe.optimizer!r}.")
    abstract = abstract_pipeline_state(pipe, placement, node["params"], node["shared"])
    target = canonical(abstract)
    check_shapes(node, target, api)
    full = _replace_at(_host(saved), key, target)
    value = _at(mngr.read(step, full), key)
    return _copies_like(value, abstract)


def _path_keys(key: str) -> list[str]:
    import re

    return [a or b for a, b in re.findall(r"\['([^']*)'\]|\[(\d+)\]", key)]


def _at(tree: Any, key: str) -> Any:
    for k in _path_keys(key):
        tree = tree[int(k)] if isinstance(tree, (list, tuple)) else tree[k]
    return tree


def _replace_at(tree: Any, key: str, value: Any) -> Any:
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


__all__ = ["abstract_pipeline_state", "restore_pipeline", "restore_tree"]

"""What a checkpoint holds, apart from how it is written or read: its leaves and a pipeline state's layout-free form.

Shared by the saving side (`checkpoint.py`) and the reading side (`restore.py`).
"""

from __future__ import annotations

import base64
import collections.abc
import sys
from typing import Any

import jax

from ..runtime import Future, RemoteArray
from .state import PipelineState


def is_iterator_with_state(x: Any) -> bool:
    """A data iterator whose position can be saved and restored (grain's have get_state/set_state)."""
    return callable(getattr(x, "get_state", None)) and callable(getattr(x, "set_state", None))


def is_leaf(x: Any) -> bool:
    """Where flattening a saved tree stops: futures, pipeline states, iterators, None."""
    # Any iterator is a leaf: a generator is not a container of what it will yield.
    return (
        x is None
        or isinstance(x, (Future, RemoteArray, PipelineState, collections.abc.Iterator))
        or is_iterator_with_state(x)
    )


def canonical(state: PipelineState) -> dict:
    """A pipeline state without its layout: per-stage params, one copy of each shared param, the optimizer state."""
    return {
        "params": list(state.params),
        "shared": {n: copies[0] for n, copies in state.shared.items()},
        "opt_state": state.opt_state,
    }


def path_key(path: tuple) -> str:
    """A leaf's path spelled alike whether a level is a dict, a list or a named tuple (orbax reads a
    named tuple's fields back as a dict's keys, a tuple as a list): ``['params'][0]['w']``."""
    return "".join(f"[{_key(k)!r}]" for k in path)


def _key(k: Any) -> Any:
    if isinstance(k, jax.tree_util.DictKey) and isinstance(k.key, int):
        return str(k.key)  # (orbax writes a dict's keys as strings: a flax `nnx.List`'s 0 comes back as '0')
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return getattr(k, attr)
    return str(k)


def flat(tree: Any, is_leaf: Any = None) -> list[tuple[str, Any]]:
    """(path_key, leaf) of each leaf of ``tree``."""
    return [(path_key(p), v) for p, v in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]]


def containers(tree: Any) -> dict[str, str]:
    """Where ``tree`` has tuples and named tuples (an optax state), which orbax writes as lists and dicts:
    path_key -> ``"tuple"`` or ``"module:QualName"``, for `rebuild` to give them back without a target."""
    out: dict[str, str] = {}

    def walk(x: Any, key: str) -> None:
        if is_leaf(x):
            return
        if type(x) is tuple:
            out[key] = "tuple"
        elif isinstance(x, tuple) and hasattr(type(x), "_fields"):
            out[key] = f"{type(x).__module__}:{type(x).__qualname__}"
        children = jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)[0]
        if children and children[0][0] == ():  # an array or a number: no children
            return
        for p, child in children:
            walk(child, key + path_key(p))

    walk(tree, "")
    return out


def rebuild(tree: Any, kinds: dict[str, str], prefix: str = "") -> Any:
    """``tree`` as orbax read it (dicts and lists) with the tuples and named tuples `containers` recorded
    made again. A named tuple whose module is not imported in this process stays a dict of its fields."""
    if not kinds:
        return tree

    def one(x: Any, key: str) -> Any:
        if isinstance(x, dict):
            x = {k: one(v, f"{key}[{k!r}]") for k, v in x.items()}
        elif isinstance(x, list):
            x = [one(v, f"{key}[{i}]") for i, v in enumerate(x)]
        kind = kinds.get(key)
        if kind == "tuple" and (isinstance(x, list) or x is None):  # orbax writes an empty tuple as None
            return tuple(x or ())
        cls = _named_tuple(kind) if kind else None
        if cls is None:
            return x
        if isinstance(x, dict) and set(x) == set(cls._fields):
            return cls(**x)
        if x is None and not cls._fields:  # orbax writes an empty named tuple (optax's EmptyState) as None
            return cls()
        return x

    return one(tree, prefix)


def _named_tuple(kind: str) -> type | None:
    """The named tuple class ``"module:QualName"`` names, if its module is imported here (nothing is imported)."""
    module, _, qualname = kind.partition(":")
    obj: Any = sys.modules.get(module)
    for part in qualname.split(".") if obj is not None else ():
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields") else None


def encode_iterator_state(st: Any) -> Any:
    """An iterator's state as JSON can hold it (grain's DataLoader gives bytes)."""
    if isinstance(st, bytes):
        return {"__bytes__": base64.b64encode(st).decode()}
    return st


def decode_iterator_state(st: Any) -> Any:
    """What `encode_iterator_state` wrote, as the iterator's ``set_state`` takes it."""
    if isinstance(st, dict) and set(st) == {"__bytes__"}:
        return base64.b64decode(st["__bytes__"])
    return st


__all__ = [
    "canonical", "containers", "decode_iterator_state", "encode_iterator_state", "flat", "is_iterator_with_state",
    "is_leaf", "path_key", "rebuild",
]

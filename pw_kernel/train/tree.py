"""What a checkpoint holds, apart from how it is written or read: its leaves and a pipeline state's layout-free form.

Shared by the saving side (`checkpoint.py`) and the reading side (`restore.py`).
"""

from __future__ import annotations

import base64
import collections.abc
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
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return getattr(k, attr)
    return str(k)


def flat(tree: Any, is_leaf: Any = None) -> list[tuple[str, Any]]:
    """(path_key, leaf) of each leaf of ``tree``."""
    return [(path_key(p), v) for p, v in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]]


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


__all__ = ["canonical", "decode_iterator_state", "encode_iterator_state", "flat", "is_iterator_with_state", "is_leaf", "path_key"]

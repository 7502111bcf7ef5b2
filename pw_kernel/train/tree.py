"""What a checkpoint holds, apart from how it is written or read: its leaves and a pipeline state's layout-free form.

Shared by the saving side (`checkpoint.py`) and the reading side (`restore.py`).
"""

from __future__ import annotations

import base64
import collections.abc
from typing import Any

from ..runtime import Future
from .state import PipelineState


def is_iterator_with_state(x: Any) -> bool:
    """A data iterator whose position can be saved and restored (grain's have get_state/set_state)."""
    return callable(getattr(x, "get_state", None)) and callable(getattr(x, "set_state", None))


def is_leaf(x: Any) -> bool:
    """Where flattening a saved tree stops: futures, pipeline states, iterators, None."""
    # Any iterator is a leaf: a generator is not a container of what it will yield.
    return x is None or isinstance(x, (Future, PipelineState, collections.abc.Iterator)) or is_iterator_with_state(x)


def canonical(state: PipelineState) -> dict:
    """A pipeline state without its layout: per-stage params, one copy of each shared param, the optimizer state."""
    return {
        "params": list(state.params),
        "shared": {n: copies[0] for n, copies in state.shared.items()},
        "opt_state": state.opt_state,
    }


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


__all__ = ["canonical", "decode_iterator_state", "encode_iterator_state", "is_iterator_with_state", "is_leaf"]

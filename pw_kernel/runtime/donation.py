"""Donated buffers: which program inputs were given up, and which ones pw itself still has to read.

`pw.compiled(donate_argnums=...)` lets a node's outputs reuse its arguments'
buffers, as `jax.jit` does. Inside a program the tracer knows every reader and
refuses a donation that a later node or the program's caller would read. An
*input* of a run (an array, or another run's future) has readers the trace
cannot see; this module keeps what the controller knows of them:

- the runs that read it and have not finished, and values held for a reader
  that has not read them yet (`hold`: a checkpoint being written): while any is
  active, a run that would donate the input does not (it is traced with that
  input kept, which costs what no donation costs: a copy);
- which inputs a run did donate: a later run, `Future.result` or `pw.get` that
  reads one raises, naming the run it went to, instead of finding a deleted
  buffer (or, worse, depending on timing).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import jax

from .errors import ArgumentError

_lock = threading.Lock()
# id(value) -> (weak reference to the value, readers): each reader says whether it is still to read.
# Finished readers are dropped when the list doubles since it was last pruned: a loop of 3,000 calls
# reading one array without waiting notes 3,000 readers in linear time (pruning on every note was
# quadratic: 245 µs per call at the 3,000th).
_readers: dict[int, tuple[Any, list[Callable[[], bool]], list[int]]] = {}
_PRUNE_AT = 8  # readers of one value kept before the first pruning
_donated: dict[int, tuple[Any, str]] = {}  # id(value) -> (weak reference to it, where it went)


def _key(x: Any) -> int:
    return id(x)


def _entry(table: dict, x: Any) -> Any:
    hit = table.get(id(x))
    if hit is None or hit[0]() is not x:  # a value since collected whose id was reused
        return None
    return hit[1]


def _prune(table: dict) -> None:
    if len(table) > 4096:
        for k in [k for k, entry in table.items() if entry[0]() is None]:
            del table[k]


def _weak(x: Any) -> Any:
    try:
        return weakref.ref(x)
    except TypeError:  # numpy scalars and the like: copied into every run, never donated
        return None


def read_later(x: Any, active: Callable[[], bool]) -> None:
    """Note that ``x`` (an array or future) will be read while ``active()`` is true."""
    if _weak(x) is None:
        return
    with _lock:
        hit = _readers.get(id(x))
        if hit is None or hit[0]() is not x:
            _prune(_readers)
            hit = _readers[id(x)] = (weakref.ref(x), [], [_PRUNE_AT])
        readers, prune_at = hit[1], hit[2]
        readers.append(active)
        if len(readers) >= prune_at[0]:
            readers[:] = [r for r in readers if r()]
            prune_at[0] = max(_PRUNE_AT, 2 * len(readers))


def still_read(x: Any) -> bool:
    """Whether a reader pw knows of has yet to read ``x``."""
    with _lock:
        readers = _entry(_readers, x)
        return bool(readers) and any(r() for r in readers)


def mark_donated(x: Any, where: str) -> None:
    """Record that ``x``'s buffer went to ``where`` (a run and node)."""
    ref = _weak(x)
    if ref is None:
        return
    with _lock:
        _prune(_donated)
        _donated[id(x)] = (ref, where)


def donated_to(x: Any) -> str | None:
    """Where ``x`` was donated, or None."""
    if not _donated:  # the common case: nothing was ever donated
        return None
    with _lock:
        return _entry(_donated, x)


def donated_to_any() -> bool:
    """Whether any value was ever donated (if not, nothing needs `check_not_donated`)."""
    return bool(_donated)


def check_not_donated(x: Any, api: str, what: str | Callable[[], str]) -> None:
    """Raise ArgumentError if ``x`` was donated: its buffer now holds another run's outputs.

    ``what`` names ``x`` (or ``what()`` does, called only then: every call's inputs pass here).
    """
    where = donated_to(x)
    if where is not None:
        if callable(what):
            what = what()
        raise ArgumentError(
            f"`{api}`: {what} was donated to {where}, whose outputs now use its buffer. Use the values that "
            f"run returned; to keep this one readable, do not donate it: leave it out of `donate_argnums` (a "
            f"pipeline: `pw.pipeline(..., donate=False)`)."
        )


class Hold:
    """Values kept from donation until released: what a checkpoint still has to write.

    Example::

        h = hold(tree_of_futures)     # a run submitted now that would donate them does not
        ...                           # read them
        h.release()
    """

    def __init__(self, tree: Any):
        self.active = True
        for leaf in jax.tree_util.tree_leaves(tree):
            if hasattr(leaf, "shape") and hasattr(leaf, "dtype") and not isinstance(leaf, jax.ShapeDtypeStruct):
                read_later(leaf, lambda: self.active)

    def release(self) -> None:
        self.active = False


def hold(tree: Any) -> Hold:
    """Keep every array and future of ``tree`` from being donated until ``.release()``; see `Hold`."""
    return Hold(tree)


__all__ = ["Hold", "check_not_donated", "donated_to", "donated_to_any", "hold", "mark_donated", "read_later", "still_read"]

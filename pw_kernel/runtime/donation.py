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
# Who still has to read what, one record per reader (not per value): reader token -> [its inputs, the
# ids of their keys once asked]. A reader is a run not yet final (the controller adds its inputs when
# it submits it and takes them away when it retires it) or a `Hold`. Adding and removing a reader is
# O(1), whatever its leaves; only a run that would donate looks, and then at the live readers alone:
# the table's size is bounded by them, never by the session's age. (A future is its output's cell:
# what a run's inputs hold.)
_readers: dict[Any, list] = {}
# id(value) -> (weak reference to it, where it went). Entries whose values were collected are
# dropped when the table has doubled since the last sweep: amortised O(1) per donation.
_donated: dict[int, tuple[Any, str]] = {}
_SWEEP_AT = 4096
_sweep_at = [_SWEEP_AT]


def _entry(table: dict, x: Any) -> Any:
    hit = table.get(id(x))
    if hit is None or hit[0]() is not x:  # a value since collected whose id was reused
        return None
    return hit[1]


def _sweep(table: dict) -> None:
    if len(table) >= _sweep_at[0]:
        for k in [k for k, entry in table.items() if entry[0]() is None]:
            del table[k]
        _sweep_at[0] = max(_SWEEP_AT, 2 * len(table))


def _weak(x: Any) -> Any:
    try:
        return weakref.ref(x)
    except TypeError:  # numpy scalars and the like: copied into every run, never donated
        return None


def reading(token: Any, values: list[Any]) -> None:
    """Note that ``token`` (a run id, a `Hold`) has yet to read ``values`` (arrays, futures or output cells)."""
    with _lock:
        _readers[token] = [values, None]


def done_reading(token: Any) -> None:
    """``token`` has read what it had to (or never will)."""
    with _lock:
        _readers.pop(token, None)


def readers() -> int:
    """How many readers are noted (bounded by the runs not yet final and the holds not released)."""
    return len(_readers)


def still_read_among(values: list[Any]) -> set[int]:
    """The positions in ``values`` of those a reader pw knows of (a run not yet final, a `Hold`) has yet to read.

    O(readers x values), in C: the ids of each reader's values are made into a set once, at its
    first question.
    """
    if not _readers:
        return set()
    want = {id(x): i for i, x in enumerate(values)}
    hit: set[int] = set()
    with _lock:
        for entry in _readers.values():
            ids = entry[1]
            if ids is None:
                ids = entry[1] = set(map(id, entry[0]))
            for k in ids.intersection(want):
                hit.add(want[k])
    return hit


def mark_all_donated(given: list[tuple[Any, str]]) -> None:
    """Record each ``(x, where)``: a run's donated inputs at once (a state of hundreds: one lock, one sweep)."""
    refs = [(id(x), ref, where) for x, where in given if (ref := _weak(x)) is not None]
    with _lock:
        _sweep(_donated)
        for k, ref, where in refs:
            _donated[k] = (ref, where)


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


#: What XLA raises on a wait for a buffer that a later computation is taking (its donation under way).
_TAKEN = "deleted or donated"


def _donated_since(a: Any, error: BaseException | None = None) -> bool:
    """Whether a node's output ``a`` was donated since (a later run gave it to its computation, which XLA runs
    after this one): there is nothing of it to wait for, and it did not fail. ``error``: what waiting for it raised.

    Example (completion, waiting for a node's outputs)::

        try:
            out.block_until_ready()
        except Exception as e:
            failed = not _donated_since(out, e)

    While the dispatcher thread hands the buffer to the later computation, a wait for it already raises
    (``BlockHostUntilReady() called on deleted or donated buffer``) and ``is_deleted`` is still False:
    asked in that window, ``is_deleted`` alone took the donation for this node's failure (a chained
    loop with a donated state failed at a random step, one in thousands).
    """
    if error is not None and _TAKEN in str(error):
        return True
    is_deleted = getattr(a, "is_deleted", None)
    return is_deleted is not None and is_deleted()


def failure_of(outs) -> BaseException | None:
    """What waiting for a node's outputs raises if its computation failed; None once they computed (an output a
    later node has donated counts as computed)."""
    for a in outs:
        try:
            a.block_until_ready()
        except AttributeError:
            pass  # not a device array (a numpy float0 gradient of an integer input): ready
        except Exception as e:
            if not _donated_since(a, e):
                return e
    return None


class Hold:
    """Values kept from donation until released: what a checkpoint still has to write.

    Example::

        h = hold(tree_of_futures)     # a run submitted now that would donate them does not
        ...                           # read them
        h.release()
    """

    def __init__(self, tree: Any):
        self.active = True
        values = [
            leaf for leaf in jax.tree_util.tree_leaves(tree)
            if hasattr(leaf, "shape") and hasattr(leaf, "dtype") and not isinstance(leaf, jax.ShapeDtypeStruct)
        ]
        reading(self, values)

    def release(self) -> None:
        self.active = False
        done_reading(self)


def hold(tree: Any) -> Hold:
    """Keep every array and future of ``tree`` from being donated until ``.release()``; see `Hold`."""
    return Hold(tree)


__all__ = [
    "Hold", "check_not_donated", "done_reading", "donated_to", "donated_to_any", "failure_of", "hold",
    "mark_all_donated", "readers", "reading", "still_read_among",
]

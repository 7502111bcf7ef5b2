"""The garbage collector's young-generation threshold, raised while a controller runs (`Config.gc_threshold`).

A step on a state of hundreds of leaves makes a future and a Python array object for each, which live
a step or a few (run-ahead, `Config.keep_outputs`). At Python's default threshold (700 net new container
objects) a young collection comes several times a step and finds them alive: they are promoted, and
the old generation fills until a full collection walks everything the process holds (JAX's state, the
user's model: ~150,000 objects, 65-90 ms here) every hundred steps or so. On a chained step of 400
leaves of (16,) on one CPU device that was ~1.4 ms of a 3.4 ms step; with the threshold at 2,000 the
same loop made no full collection and took 2.0 ms (benchmarks/HISTORY.md, 2026-12-01). `jax.jit`'s
loop does not pay it: its step frees as many arrays as it makes, so its count stays flat.

The threshold is process-wide, so a controller only raises it (never lowers one the process chose)
and puts back what it found when it shuts down, unless something else changed it meanwhile.

Example::

    undo = raise_young_threshold(2000)   # gc.get_threshold()[0] is now at least 2000
    undo()                               # as it was (if still ours)
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

_lock = threading.Lock()
_holders = 0  # live controllers that raised it (a service and its in-process client: two)
_found: tuple[int, ...] = ()  # the process's thresholds before the first of them
_set: tuple[int, ...] = ()  # what they set


def raise_young_threshold(threshold: int | None) -> Callable[[], None]:
    """Raise the young generation's threshold to ``threshold`` if it is lower; return what puts it back.

    None, or a threshold the process already has at least as high (its own choice): nothing is changed,
    and the undo does nothing. Several controllers at once share one raise; the last to go puts back
    what the first found, unless something else changed the thresholds meanwhile (theirs stays).
    """
    global _holders, _found, _set
    if threshold is None:
        return _nothing
    with _lock:
        if not _holders:
            current = gc.get_threshold()
            if current[0] >= threshold or current[0] == 0:  # (0: the process turned automatic collection off)
                return _nothing
            _found, _set = current, (threshold, *current[1:])
            gc.set_threshold(*_set)
        _holders += 1
    done = []

    def undo() -> None:
        global _holders
        with _lock:
            if done:
                return
            done.append(True)
            _holders -= 1
            if not _holders and gc.get_threshold() == _set:
                gc.set_threshold(*_found)

    return undo


def _nothing() -> None:
    pass

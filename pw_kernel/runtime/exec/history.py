"""The runs a controller remembers: every run in flight, and a bounded window of the latest finished ones."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, overload

if TYPE_CHECKING:
    from ..run import Run


class RunHistory(Sequence):
    """`pw.controller().runs`: the runs in submission order, a ring over the finished ones.

    A run is added when submitted and stays while in flight, however many are queued; once
    final it is among the latest ``keep_runs`` finished runs (and their node events within
    ``keep_events``) until newer ones push it out, oldest finished first. Adding, finishing
    and forgetting a run are O(1): nothing here walks the history, whatever its length.
    ``runs[-1]`` (the latest run) is O(1) too; other indices walk from the nearer end.

    Example::

        runs = pw.controller().runs
        runs[-1].state, len(runs), [r.id for r in runs[-3:]]
        runs.get(12)              # run 12, or None once forgotten
    """

    def __init__(self, keep_runs: int, keep_events: int):
        self.keep_runs = keep_runs
        self.keep_events = keep_events
        self._by_id: dict[int, Run] = {}  # submission order (ids increase)
        self._finished: collections.deque[tuple[int, int]] = collections.deque()  # (id, its events), retire order
        self._events = 0  # node events of the finished runs kept

    def add(self, run: Run) -> None:
        """A run was submitted (its id larger than any before)."""
        self._by_id[run.id] = run

    def finished(self, run: Run) -> None:
        """``run`` became final: keep it among the latest finished, forgetting the oldest beyond the budgets."""
        n = len(run.record.events)
        self._finished.append((run.id, n))
        self._events += n
        by_id, finished = self._by_id, self._finished
        while len(finished) > 1 and (len(finished) > self.keep_runs or self._events > self.keep_events):
            old, events = finished.popleft()  # (the newest stays, whatever its events)
            by_id.pop(old, None)
            self._events -= events

    def get(self, run_id: int) -> Run | None:
        """The run with this id, or None (never submitted here, or forgotten)."""
        return self._by_id.get(run_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Run]:
        return iter(list(self._by_id.values()))  # (a snapshot: runs are added while one iterates)

    def __reversed__(self) -> Iterator[Run]:
        return iter(list(reversed(self._by_id.values())))

    @overload
    def __getitem__(self, i: int) -> Run: ...

    @overload
    def __getitem__(self, i: slice) -> list[Run]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(self._by_id.values())[i]
        n = len(self._by_id)
        if not -n <= i < n:
            raise IndexError(f"run index {i} out of range: {n} runs are kept")
        if i < 0:
            return next(itertools.islice(reversed(self._by_id.values()), -i - 1, None))
        return next(itertools.islice(iter(self._by_id.values()), i, None))

    def __eq__(self, other) -> bool:  # (compares as the list of its runs: `runs == []`)
        if isinstance(other, (RunHistory, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        ids = list(self._by_id)
        shown = ", ".join(map(str, ids[-5:]))
        more = f"{len(ids) - 5} earlier, " if len(ids) > 5 else ""
        return f"<pw runs: {len(ids)} kept ({more}{shown}); finished ones kept: at most {self.keep_runs}>"


__all__ = ["RunHistory"]

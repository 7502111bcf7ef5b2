"""A run's story: the lifecycle's bounded log of transitions, each with the stimulus that caused it.

As dask.distributed's scheduler keeps ``transition_log`` and answers
``story(key)``, the lifecycle appends one row per transition: when, which run,
from which state to which, the event, the stimulus (the report or call that
started the cascade: ``completed-17`` is the 17th stimulus, a completion
report, and every transition it recommended carries it too) and the thread
that brought it. Rows are plain tuples (a run makes a few; the log keeps the
last ``Config.story_length``); `Story` is what a reader gets for one run.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import NamedTuple


class Transition(NamedTuple):
    """One change of a run: at ``time``, ``start`` -> ``finish`` on ``event``, caused by ``stimulus`` on ``thread``."""

    time: float  # time.time()
    run: int
    start: str
    finish: str
    event: str
    stimulus: str  # "<kind>-<n>": the n-th stimulus the lifecycle handled, a report or a call of that kind
    thread: str


#: A row as the log keeps it: (time, run id, start, finish, event, stimulus kind, stimulus number, the Thread).
Row = tuple


def transition(row: Row) -> Transition:
    """The `Transition` a kept row stands for (its thread is kept as the `threading.Thread`, named here)."""
    t, run, start, finish, event, kind, n, thread = row
    return Transition(t, run, start, finish, event, f"{kind}-{n}", getattr(thread, "name", str(thread)))


class Story(tuple):
    """A run's transitions in order (a tuple of `Transition`); prints as a table.

    Example::

        run = f.submit(x); run.wait()
        print(run.story())
        #   13:02:07.123456  new      -> done      ran        ran-41        MainThread
        [t.finish for t in run.story()]       # ['done']
    """

    def __new__(cls, transitions: Iterable[Transition], run_id: int = -1, name: str = ""):
        story = super().__new__(cls, transitions)
        story.run_id = run_id
        story.name = name
        return story

    def states(self) -> list[str]:
        """The states the run went through, in order (its first state included)."""
        return [self[0].start, *(t.finish for t in self)] if self else []

    def rows(self) -> list[tuple[str, str, str, str, str, str]]:
        """(time, from, to, event, stimulus, thread) as text, one per transition (what views draw)."""
        out = []
        for t in self:
            clock = datetime.datetime.fromtimestamp(t.time).strftime("%H:%M:%S.%f")
            out.append((clock, t.start, t.finish, t.event, t.stimulus, t.thread))
        return out

    def __str__(self) -> str:
        head = f"story of run {self.run_id} ({self.name!r}): {len(self)} transitions"
        if not self:
            return head + " (none kept: the run is older than the lifecycle's log)"
        rows = [("time", "from", "to", "event", "stimulus", "thread"), *self.rows()]
        widths = [max(len(r[k]) for r in rows) for k in range(6)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        return "\n".join([head, *("  " + line for line in lines)])

    def __repr__(self) -> str:
        return f"<pw.Story run {self.run_id} ({self.name!r}): {' -> '.join(self.states())}>"


__all__ = ["Row", "Story", "Transition", "transition"]

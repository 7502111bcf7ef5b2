"""Scheduling: which run's next node the dispatcher sends to its island next.

The dispatcher is one thread, so every island receives its computations in
one consistent order (the paper's gang scheduling): programs whose collectives
cover overlapping devices can never be enqueued in different orders on
different devices, and so cannot deadlock. A policy only decides *which* run
goes next among those that can make progress.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .run import Run


class Policy(Protocol):
    """Chooses among runnable runs; ``quantum`` is how many nodes a pick may dispatch in a row."""

    name: str
    quantum: int

    def pick(self, runnable: Sequence[Run]) -> Run: ...

    def charge(self, run: Run, nodes: int) -> None: ...


class FIFO:
    """Oldest submitted run first; a run that cannot progress (blocked input, full island) is passed over.

    Example::

        pw.controller().scheduler.policy = pw.FIFO()
    """

    name = "fifo"
    quantum = 1 << 30  # run until blocked: FIFO never interleaves runnable runs

    def pick(self, runnable: Sequence[Run]) -> Run:
        return runnable[0]

    def charge(self, run: Run, nodes: int) -> None:
        pass

    def __repr__(self) -> str:
        return "FIFO()"


class Scheduler:
    """Active runs in submission order, plus the policy that picks among them."""

    def __init__(self, policy: Policy | None = None):
        self.policy: Policy = policy or FIFO()
        self.active: list[Run] = []

    def add(self, run: Run) -> None:
        self.active.append(run)

    def remove(self, run: Run) -> None:
        try:
            self.active.remove(run)
        except ValueError:
            pass

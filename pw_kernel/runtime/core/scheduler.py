"""Scheduling: which run's next node the dispatcher sends to its island next.

The dispatcher is one thread, so every island receives its computations in
one consistent order (the paper's gang scheduling): programs whose collectives
cover overlapping devices can never be enqueued in different orders on
different devices, and so cannot deadlock. A policy only decides *which* run
goes next among those that can make progress, and how many of its nodes.

Policies (switchable at run time with `Controller.set_policy`):
- `FIFO`: oldest run first, run to completion unless blocked.
- `FairShare`: weighted fair share of device time between tenants, node by node.
- `Priority`: highest priority first (FIFO within a level), preempting at node granularity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from ..errors import ArgumentError


class Schedulable(Protocol):
    """What a policy reads of a run (the lifecycle's `RunRecord` has these)."""

    id: int
    tenant: str
    weight: float
    priority: int


R = TypeVar("R", bound=Schedulable)


@runtime_checkable
class Policy(Protocol):
    """Chooses among runnable runs.

    ``quantum``: how many nodes one pick may dispatch in a row.

    A policy may also say how its choice decomposes, so that a pick looks at a
    few runs however deep the queue (`ReadyIndex`): ``group(run)`` and
    ``rank(run)`` such that the run it picks among any runnable runs is always
    the least-ranked runnable run of some group. Without them the lifecycle
    hands it every runnable run, in submission order.
    """

    name: str
    quantum: int

    def pick(self, runnable: Sequence[R]) -> R: ...

    def charge(self, run: Schedulable, cost_ns: int) -> None: ...


class FIFO:
    """Oldest submitted run first; a run that cannot progress (blocked input, full island) is passed over.

    Example::

        pw.controller().set_policy(pw.FIFO())
    """

    name = "fifo"
    quantum = 1 << 30  # run until blocked: FIFO never interleaves runnable runs

    def pick(self, runnable: Sequence[R]) -> R:
        return runnable[0]

    @staticmethod
    def group(run: Schedulable) -> None:
        return None  # one group: the oldest runnable run is its head

    @staticmethod
    def rank(run: Schedulable) -> int:
        return run.id

    def charge(self, run: Schedulable, cost_ns: int) -> None:
        pass

    def __repr__(self) -> str:
        return "FIFO()"


class FairShare:
    """Weighted fair share of device time between tenants, interleaved node by node.

    Each tenant accrues virtual time = device time of its dispatched nodes /
    its weight (a node's device time is the running mean of its measured
    durations); the tenant with the least virtual time goes next. A tenant
    that joins, or comes back after sitting out more than `RETURN_AFTER`
    picks, starts no lower than the least virtual time of the tenants that
    stayed, so idling earns no credit (a notebook back from a pause does not
    starve the others with the share it did not use; a client a moment late
    with its next node is not idle). Level tenants go in turn, the one picked
    longest ago first: one that comes back goes before the next node of a
    tenant that kept its queue full (its call waits only for the work already
    on the devices, the run-ahead bound, not also for that node). Weights
    come from ``weights`` or from the ``weight=`` of a tenant's runs. Within
    a tenant, a run of higher ``priority=`` goes before its older ones (the
    Pathways service: a notebook's urgent call passes its own queued work,
    not other clients').

    Example::

        pw.controller().set_policy(pw.FairShare({"A": 1, "B": 2, "C": 4, "D": 8}))
        step.submit(x, tenant="B")
    """

    name = "fair"
    quantum = 1

    def __init__(self, weights: Mapping[str, float] | None = None):
        self.weights: dict[str, float] = {}
        for tenant, w in (weights or {}).items():
            self.set_weight(tenant, w)
        self.vtime: dict[str, float] = {}
        self._picks = 0
        self._seen: dict[str, int] = {}  # tenant -> the pick it was last runnable at
        self._chosen: dict[str, int] = {}  # tenant -> the pick it was last chosen at (level tenants take turns)

    #: Picks a tenant may sit out and keep its place (a backlogged tenant waiting a moment for credit,
    #: the run-ahead bound or its input, is not idle); sitting out longer, it comes back at the floor.
    RETURN_AFTER = 64

    def set_weight(self, tenant: str, weight: float) -> None:
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ArgumentError(f"`FairShare` weight of tenant {tenant!r} must be a positive number; got {weight!r}.")
        self.weights[tenant] = float(weight)

    def weight(self, run: Schedulable) -> float:
        return self.weights.get(run.tenant, run.weight)

    def pick(self, runnable: Sequence[R]) -> R:
        vtime = self.vtime
        seen = self._seen
        if len(vtime) > 4 * len(runnable) + 64:  # forget tenants long gone
            live = {r.tenant for r in runnable}
            self.vtime = vtime = {t: v for t, v in vtime.items() if t in live}
            self._seen = seen = {t: n for t, n in seen.items() if t in live}
            self._chosen = {t: n for t, n in self._chosen.items() if t in live}
        chosen = self._chosen
        picks = self._picks = self._picks + 1
        back = picks - self.RETURN_AFTER  # seen after this pick: stayed; before it (or never): joins now
        # Those that stayed count even when not runnable at this very pick (between two of their runs): a
        # tenant that comes back at such a moment must not set the floor with its own stale time.
        floor = min((vtime[t] for t, n in seen.items() if n >= back and t in vtime), default=None)
        if floor is None:  # nobody stayed: the least of those here
            floor = min((vtime[r.tenant] for r in runnable if r.tenant in vtime), default=0.0)
        for r in runnable:
            seen[r.tenant] = picks
        best = None
        best_key = None
        for r in runnable:
            v = vtime.get(r.tenant)
            if v is None or v < floor:
                v = vtime[r.tenant] = floor
            # (a tenant's heads of several credit classes: its most urgent first)
            key = (v, -r.priority, chosen.get(r.tenant, -1), r.id)
            if best_key is None or key < best_key:
                best, best_key = r, key
        chosen[best.tenant] = picks
        return best

    def charge(self, run: Schedulable, cost_ns: int) -> None:
        self.vtime[run.tenant] = self.vtime.get(run.tenant, 0.0) + cost_ns / self.weight(run)

    @staticmethod
    def group(run: Schedulable) -> str:
        return run.tenant  # the pick takes a tenant's most urgent runnable run, the oldest of those

    @staticmethod
    def rank(run: Schedulable) -> tuple[int, int]:
        return (-run.priority, run.id)  # (priorities order a tenant's own runs; weights share between tenants)

    def __repr__(self) -> str:
        return f"FairShare({self.weights})"


class Priority:
    """Highest ``priority=`` first (FIFO among equals); a new urgent run preempts at the next node.

    Example::

        pw.controller().set_policy(pw.Priority())
        step.submit(x, priority=10)
    """

    name = "priority"
    quantum = 1

    def pick(self, runnable: Sequence[R]) -> R:
        return min(runnable, key=lambda r: (-r.priority, r.id))

    @staticmethod
    def group(run: Schedulable) -> None:
        return None

    @staticmethod
    def rank(run: Schedulable) -> tuple[int, int]:
        return (-run.priority, run.id)

    def charge(self, run: Schedulable, cost_ns: int) -> None:
        pass

    def __repr__(self) -> str:
        return "Priority()"

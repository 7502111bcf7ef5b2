"""The ready index: runs that have steps to dispatch, by what their next step needs, in the policy's order.

The pick (`Lifecycle.next_work`) must cost the same with 24 runs queued as with 2,400:
on a fast asynchronous device the run-ahead bound is reached nearly always, and a
pick that looked at every queued run to find that none may go would spend its
time on the queue, not the devices. So runs are indexed by their next step's
*credit class* (the island, executable, host callbacks: every step of a class
gets the same answer from the credit check), and within a class by the policy's
*group* (the tenant, for fair share) in the policy's *rank* order (submission,
or priority then submission). A pick asks each class once, and looks at the head
of each of its groups only: its cost grows with the distinct next steps and
tenants, never with the depth of the queue.

A queued run that cannot start is parked off the index: on the producer whose
output it waits for (woken when that run publishes or ends), or on memory
(woken when a run gives memory back). Heap entries are removed lazily: an entry
is current while its run's version in ``version`` is the entry's. The pick pops the
void ones it meets at the heads; the others (a run that went without a pick: a call
dispatched on its caller's thread) are swept once they outnumber the live ones by
`VOID_SLACK` plus twice: amortised O(1) a run, and the heaps stay bounded by the runs
queued, never by the session's age.

Example (the lifecycle does this under the controller's lock)::

    ready = ReadyIndex(FIFO())
    ready.add(rec)                  # queued, or its cursor moved to a new step
    for cls in ready.classes():     # ask each class's credit once ...
        head = ready.head(cls, g)   # ... and look at its groups' heads
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Any

from .records import RunRecord


#: Void heap entries allowed beyond twice the live ones before they are swept.
VOID_SLACK = 64


def credit_class(step: Any) -> tuple:
    """What decides whether ``step`` has credit: its island, executable (its devices and estimate), the island
    it reads from, whether it is remote or calls the host."""
    return (step.island, id(step.exe), step.src_island, step.remote, step.host_callbacks)


class _Class:
    """The runs whose next step is of one credit class: a heap per policy group."""

    __slots__ = ("step", "groups")

    def __init__(self, step: Any):
        self.step = step  # any of its steps: the credit check asks about this one (None: runs with no steps)
        self.groups: dict[Any, list] = {}


class ReadyIndex:
    """Dispatchable runs indexed by credit class and policy group; queued runs that cannot start parked."""

    def __init__(self, policy: Any):
        self._versions = itertools.count(1)
        self.version: dict[int, int] = {}  # run id -> the version of its current heap entry
        self.by_class: dict[tuple, _Class] = {}
        self.on_producer: dict[int, dict[int, RunRecord]] = {}  # producer run id -> runs parked on its outputs
        self.parked_on: dict[int, int] = {}  # run id -> the producer it is parked on
        self.on_memory: dict[int, RunRecord] = {}
        self.void = 0  # heap entries whose run left the index or was indexed again (not yet popped)
        self.set_policy(policy)

    def set_policy(self, policy: Any) -> None:
        """Order by ``policy``: its ``group(run)`` and ``rank(run)`` if it has them; otherwise every run is its
        own group (the pick then sees every runnable run, as a policy without them needs)."""
        self._group = getattr(policy, "group", None) or (lambda r: r.id)
        self._rank = getattr(policy, "rank", None) or (lambda r: r.id)
        runs = self.runs()
        self.version.clear()
        self.by_class.clear()
        self.void = 0
        for rec in runs:
            self.add(rec)

    def runs(self) -> list[RunRecord]:
        """Every run in the index (not those parked), each once."""
        seen: dict[int, RunRecord] = {}
        version = self.version
        for cls in self.by_class.values():
            for heap in cls.groups.values():
                for _, rid, ver, rec in heap:
                    if version.get(rid) == ver:
                        seen[rid] = rec
        return list(seen.values())

    # ---------------------------------------------------------------- membership
    def add(self, rec: RunRecord) -> None:
        """Index ``rec`` under its next step (again, if its cursor moved): its earlier entry is void."""
        steps = rec.plan.steps
        step = steps[rec.cursor] if rec.cursor < len(steps) else None  # None: a run with nothing to dispatch
        key = credit_class(step) if step is not None else ()
        cls = self.by_class.get(key)
        if cls is None:
            cls = self.by_class[key] = _Class(step)
        if rec.id in self.version:
            self.void += 1  # (its earlier entry)
        ver = self.version[rec.id] = next(self._versions)
        group = self._group(rec)
        heap = cls.groups.get(group)
        if heap is None:
            heap = cls.groups[group] = []
        heapq.heappush(heap, (self._rank(rec), rec.id, ver, rec))

    def remove(self, rec: RunRecord) -> None:
        """``rec`` leaves the index (it dispatched everything, or ended); parked, it leaves that too."""
        self._unindex(rec)
        self.on_memory.pop(rec.id, None)
        producer = self.parked_on.pop(rec.id, None)
        if producer is not None:
            parked = self.on_producer.get(producer)
            if parked is not None:
                parked.pop(rec.id, None)
                if not parked:
                    del self.on_producer[producer]

    def park_on_producer(self, rec: RunRecord, producer: RunRecord) -> None:
        """``rec`` waits for an output of ``producer``: off the index until that run publishes or ends."""
        self._unindex(rec)
        self.on_producer.setdefault(producer.id, {})[rec.id] = rec
        self.parked_on[rec.id] = producer.id

    def park_on_memory(self, rec: RunRecord) -> None:
        """``rec`` waits for memory: off the index until a run gives some back."""
        self._unindex(rec)
        self.on_memory[rec.id] = rec

    def _unindex(self, rec: RunRecord) -> None:
        """Void ``rec``'s entry; sweep the heaps once the void entries outnumber the live ones by far."""
        if self.version.pop(rec.id, None) is not None:
            self.void += 1
            if self.void > 2 * len(self.version) + VOID_SLACK:
                self._sweep()

    def _sweep(self) -> None:
        """Keep only the current entries (each heap filtered, then heapified): O(entries), once per as many voids."""
        version = self.version
        for key, cls in list(self.by_class.items()):
            for group, heap in list(cls.groups.items()):
                live = [e for e in heap if version.get(e[1]) == e[2]]
                if live:
                    heapq.heapify(live)
                    cls.groups[group] = live
                else:
                    del cls.groups[group]
            if not cls.groups:
                del self.by_class[key]
        self.void = 0

    def entries(self) -> int:
        """Heap entries, void ones included (bounded: see the module's notes)."""
        return sum(len(heap) for cls in self.by_class.values() for heap in cls.groups.values())

    def producer_moved(self, producer: RunRecord) -> None:
        """``producer`` published outputs, started or ended: the runs parked on it are looked at again."""
        parked = self.on_producer.pop(producer.id, None)
        if parked:
            for rec in parked.values():
                del self.parked_on[rec.id]
                self.add(rec)

    def memory_freed(self) -> None:
        """A run gave memory back: the runs parked on memory are looked at again."""
        if self.on_memory:
            parked, self.on_memory = self.on_memory, {}
            for rec in parked.values():
                self.add(rec)

    @property
    def parked(self) -> bool:
        """Whether some queued run waits for an input or for memory."""
        return bool(self.on_memory) or bool(self.on_producer)

    # ---------------------------------------------------------------- the pick
    def classes(self) -> Iterator[_Class]:
        """Each credit class with runs (empty ones are dropped as they are met).

        Over a snapshot: what the caller does to a head may index runs anew (a failed run's
        parked readers), under a class not seen yet.
        """
        for key, cls in list(self.by_class.items()):
            if self._trim(cls):
                yield cls
            elif self.by_class.get(key) is cls:
                del self.by_class[key]

    def heads(self, cls: _Class) -> Iterator[RunRecord]:
        """The current head of each group of ``cls`` (the caller may park or start it, then asks again)."""
        version = self.version
        for group in list(cls.groups):
            heap = cls.groups.get(group)
            while heap:
                _, rid, ver, rec = heap[0]
                if version.get(rid) != ver:
                    heapq.heappop(heap)
                    self.void -= 1
                    continue
                yield rec
                # What the caller did to the head may have swept the heaps (`_sweep`: this group's is a new
                # list, or gone): go on with what the index holds now, never with the list it replaced.
                heap = cls.groups.get(group)
                if heap and heap[0][3] is rec and version.get(rid) == ver:
                    break  # still the head (picked or waiting): the next group
            if heap is not None and not heap:  # (the group's list as the index holds it now: read after each yield)
                del cls.groups[group]

    def _trim(self, cls: _Class) -> bool:
        """Drop void entries from the tops of ``cls``'s heaps; whether any run is left in it."""
        version = self.version
        for group, heap in list(cls.groups.items()):
            while heap and version.get(heap[0][1]) != heap[0][2]:
                heapq.heappop(heap)
                self.void -= 1
            if not heap:
                del cls.groups[group]
        return bool(cls.groups)

    def __len__(self) -> int:
        return len(self.version)

    def __contains__(self, rec: RunRecord) -> bool:
        """Whether ``rec`` is indexed or parked (what the validation checks of every dispatchable run)."""
        return rec.id in self.version or rec.id in self.on_memory or rec.id in self.parked_on


__all__ = ["ReadyIndex", "credit_class"]

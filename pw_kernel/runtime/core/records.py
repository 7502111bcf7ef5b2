"""What the lifecycle knows of a run, and what it asks others to do: records, output cells, effects.

A `RunRecord` is read freely and changed only by the lifecycle's transitions.
Effects are small frozen values the transitions return and the controller
applies, in one place (`Controller._apply`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from ..exec.plan import Plan

#: What a record holds where it holds nothing: one shared, read-only mapping (a run makes and keeps
#: no empty containers of its own; a finished run is what the controller remembers 10,000 of).
NOTHING: Mapping[Any, Any] = MappingProxyType({})

#: "new" only inside the controller's lock, between a record's making and its first transition.
RunState = Literal["new", "queued", "running", "done", "failed", "cancelled"]
FINAL: frozenset[str] = frozenset({"done", "failed", "cancelled"})
WaitingFor = Literal["input", "memory", "credit"]


class OutputCell:
    """One program output: the value once its step was dispatched, and the run that makes it.

    A later run that reads this output holds the cell: it can start as soon as ``value``
    is set (dispatched, not finished), and it fails if the producer failed. The runtime's
    futures are their own cells (`pw.Future` subclasses this: one object per output, not
    two); a record made without futures (the lifecycle's tests) makes plain ones.
    """

    __slots__ = ("producer", "index", "value")

    def __init__(self, producer: RunRecord, index: int):
        self.producer = producer
        self.index = index
        self.value: Any = None


class RunRecord:
    """What the lifecycle knows of one run. Read freely; changed only by transitions.

    ``slots`` are the run's value slots: made at start and lent to the dispatcher,
    whose thread alone writes them (the one holding the run's `Work`) and the
    lifecycle never reads; the record lets go of them when the run becomes final
    (a thread still dispatching it keeps its own reference until its burst ends).
    """

    __slots__ = (
        "id",
        "name",
        "program",
        "plan",
        "tenant",
        "weight",
        "priority",
        "inputs",
        "source_map",
        "on_error",
        "state",
        "error",
        "cursor",
        "dispatched",
        "done",
        "total",
        "slots",
        "reserved",
        "waiting_for",
        "cells",
        "resolved",
        "upstream",
        "downstream",
        "held",
        "events",
        "compile_ns",
        "compiling",
        "submitted_at",
        "started_at",
        "finished_at",
    )

    def __init__(
        self,
        run_id: int,
        name: str,
        program: str,
        plan: Plan,
        inputs: Sequence[Any],
        tenant: str = "default",
        weight: float = 1.0,
        priority: int = 0,
        source_map: dict[str, str] | None = None,
        now: float = 0.0,
        on_error: Callable[[BaseException], Any] | None = None,
        cells: list[OutputCell] | None = None,
    ):
        self.id = run_id
        self.name = name
        self.program = program  # the graph's name, for error messages
        self.plan = plan
        self.tenant = tenant
        self.weight = weight
        self.priority = priority
        self.inputs: list[Any] = list(inputs)  # arrays, or OutputCells of other runs
        self.source_map: Mapping[str, str] = dict(source_map) if source_map else NOTHING
        #: called with the run's error when it fails, before any future raises it (the notebook front makes
        #: the error show the user's cell lines); part of applying the failing transition's effects
        self.on_error = on_error
        self.state: RunState = "new"
        self.error: BaseException | None = None
        self.cursor = 0  # index of the next step to dispatch
        self.dispatched = 0
        self.done = 0
        self.total = len(plan.steps)
        self.slots: list[Any] | None = None
        self.reserved: Mapping[int, int] = NOTHING  # the plan's peak bytes while running (never written)
        self.waiting_for: WaitingFor | None = None
        # (given: the run's futures, made by its `Run` right after this record, with it as their producer)
        self.cells = cells if cells is not None else [OutputCell(self, j) for j in range(len(plan.output_slots))]
        self.resolved = bytearray(len(plan.output_slots))  # 1 once output j is resolved (no object the GC walks)
        # Runs whose outputs this one read before they were done (it started on dispatched values),
        # and the reverse. A run is done only once its upstream are: a producer that fails late
        # (a guarded host callback) fails its readers too, and their outputs are never resolved.
        # Both are replaced, not appended to, when they grow (rare): most runs never read an unfinished one.
        self.upstream: Sequence[OutputCell] = ()  # the cells read, one per producer
        self.downstream: Sequence[RunRecord] = ()
        self.held: Mapping[int, Any] = NOTHING  # outputs finished while upstream runs were not done yet
        self.events: list[Any] = []  # NodeEvents of finished steps, appended by the watcher
        self.compile_ns = 0  # time the dispatcher spent compiling this run's executables (first calls)
        self.compiling: str | None = None  # the step whose executable the dispatcher is compiling now
        self.submitted_at = now
        self.started_at: float | None = None
        self.finished_at: float | None = None

    def __repr__(self) -> str:
        return (
            f"RunRecord({self.id}, {self.name!r}, {self.state}, cursor={self.cursor}, "
            f"dispatched={self.dispatched}, done={self.done}/{self.total})"
        )


# ------------------------------------------------------------------- effects
# Effects are named tuples: a run makes about six of them, and a tuple is made several times
# faster than a frozen dataclass (whose __init__ goes through object.__setattr__ per field).
class Emit(NamedTuple):
    """Emit a run event: ``rec`` entered ``state`` (a tuple: each of these states, in order, at once)."""

    rec: RunRecord
    state: str | tuple[str, ...]
    error: BaseException | None = None


class Resolve(NamedTuple):
    """Set the futures of these outputs ``(j, value)`` of ``rec``."""

    rec: RunRecord
    outputs: tuple[tuple[int, Any], ...]


class Reject(NamedTuple):
    """Fail (or, with ``cancelled``, cancel) the futures of outputs ``indices`` of ``rec``."""

    rec: RunRecord
    indices: tuple[int, ...]
    error: BaseException
    cancelled: bool = False


class Finish(NamedTuple):
    """``rec`` is final: wake whoever waits on the run, retire it."""

    rec: RunRecord


class Wake(NamedTuple):
    """Something a waiting dispatcher may act on changed (a run, credit or memory)."""


Effect = Emit | Resolve | Reject | Finish | Wake
WAKE = Wake()


class Work(NamedTuple):
    """What the dispatcher may do next: up to ``quantum`` steps of ``rec`` from its cursor."""

    rec: RunRecord
    quantum: int
    inline: bool = False  # dispatched by the submitting thread (which must never block on a step)


__all__ = ["FINAL", "NOTHING", "WAKE", "Effect", "Emit", "Finish", "OutputCell", "Reject", "Resolve", "RunRecord", "RunState", "Wake", "WaitingFor", "Work"]

"""The pick: which run's next step the dispatcher sends next, at a cost that does not grow with the queue.

`Lifecycle.next_work` asks here. Each credit class of next steps in the ready
index (`ready.py`) is asked for credit once; a class without it wakes nobody
but says why its heads wait; in a class with credit, each policy group's head
is looked at: a queued head that cannot start is parked (on the producer it
waits for, or on memory) and the next one looked at, one that failed is
failed. The policy picks among the heads; a queued run starts when picked.
All of it through `Lifecycle.handle`, as one stimulus ("pick").

Example::

    work, effects = life.next_work(now)    # -> pick(life, now)
"""

from __future__ import annotations

from typing import Any

from .records import OutputCell, RunRecord, Work

Lifecycle = Any  # the `Lifecycle` asking (which imports this module: named here, not imported)


def pick(life: Lifecycle, now: float) -> tuple[Work | None, list]:
    """The policy's choice among runs that can dispatch now (`Lifecycle.next_work`); a queued run it picks starts.

    Each credit class of next steps is asked once, and only its groups' heads are looked at
    (`ReadyIndex`): the cost does not grow with the queue. A queued head that cannot start is
    parked (on the producer it waits for, or on memory) and the next one looked at.
    """
    effects: list = []
    stimulus: list = []  # the pick's one stimulus, begun at its first transition
    while True:
        runnable = _runnable(life, now, effects, stimulus)
        life.blocked = life.ready.parked
        if not runnable:
            return None, effects
        runnable.sort(key=_submitted)  # the order a policy without ranks sees (FIFO takes the first)
        rec = life.policy.pick(runnable)
        if rec.state == "queued":
            effects += life.handle(rec, "start", now, stimulus=_begun(life, stimulus))
            if rec.state != "running" or rec.cursor >= len(rec.plan.steps):
                continue  # finished at start (nothing to dispatch): pick again
        elif rec.waiting_for is not None:
            effects += life.handle(rec, "wait", now, None, stimulus=_begun(life, stimulus))
        return Work(rec, life.policy.quantum), effects


def _runnable(life: Lifecycle, now: float, effects: list, stimulus: list) -> list[RunRecord]:
    """The heads that may dispatch now (`next_work`); transitions for those that wait go to ``effects``."""
    runnable: list[RunRecord] = []
    life.credit_wanted = False
    ready = life.ready
    for cls in ready.classes():
        if cls.step is not None and life.out_of_credit(cls.step):
            life.credit_wanted = True
            for rec in ready.heads(cls):  # those next in line say why they wait
                if rec.waiting_for != "credit":
                    effects += life.handle(rec, "wait", now, "credit", stimulus=_begun(life, stimulus))
            continue
        for rec in ready.heads(cls):
            if rec.state == "queued":
                blocked = life.blocker(rec)
                if blocked is not None:
                    if blocked == "failed":
                        effects += life.handle(rec, "input_failed", now, stimulus=_begun(life, stimulus))
                        continue
                    if rec.waiting_for != blocked:
                        effects += life.handle(rec, "wait", now, blocked, stimulus=_begun(life, stimulus))
                    if blocked == "memory":
                        ready.park_on_memory(rec)
                    else:
                        ready.park_on_producer(rec, _awaited(rec))
                    continue
            runnable.append(rec)
    return runnable


def _submitted(rec: RunRecord) -> int:
    return rec.id


def _begun(life: Lifecycle, stimulus: list) -> tuple[str, int, Any]:
    """A pick's one stimulus (kept in ``stimulus``), begun at its first transition."""
    if not stimulus:
        stimulus.append(life.begin("pick"))
    return stimulus[0]


def _awaited(rec: RunRecord) -> RunRecord:
    """The run whose output queued ``rec`` waits for (its `Lifecycle.blocker` said 'input')."""
    return next(x.producer for x in rec.inputs if isinstance(x, OutputCell) and x.value is None)


__all__ = ["pick"]

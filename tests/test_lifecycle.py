"""The run lifecycle, the policies and the plans as pure functions: no threads, no dispatch.

Each test drives `Lifecycle` the way the controller does (one event at a time)
and reads the effects it returns; validation checks the invariants after every
transition.
"""

from __future__ import annotations

import types

import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw
from pw_kernel.runtime import FIFO, FairShare, InputFailedError, NodeError, Priority
from pw_kernel.runtime.core.lifecycle import Lifecycle
from pw_kernel.runtime.exec.plan import Plan, Step, plan_for
from pw_kernel.runtime.core.records import Emit, Finish, Reject, Resolve, RunRecord, Wake

#: A node event as completion reports it (validation checks its times).
EVENT = types.SimpleNamespace(dispatch=0, start=1, end=2, devices=(0,))


def make_plan(n_steps: int, *, island: int = 0, peak: dict[int, int] | None = None, n_inputs: int = 0) -> Plan:
    """A chain of ``n_steps`` steps over slots 0..n (slot 0 the input), publishing the last slot.

    One step on one input is a plan its caller may run whole at submit (`Plan.lone_args`).
    """
    steps = [
        Step(
            name=f"s{k}", kind="compute", call=None, ins=(k,), outs=(k + 1,), frees=(),
            publishes=((0, 0),) if k == n_steps - 1 else (),
            island=island, src_island=None, devices=(0,), nbytes=4, shapes="", node=None,
        )
        for k in range(n_steps)
    ]
    return Plan(
        mode="chained", steps=steps, n_slots=n_steps + 1, input_slots=tuple(range(n_inputs)), const_slots={},
        output_slots=(n_steps,), output_step=(n_steps - 1,), peak_bytes=dict(peak or {}),
        lone_args=(0,) if n_steps == 1 and n_inputs == 1 else None,
    )


def record(run_id: int, plan: Plan, inputs=(), **kw) -> RunRecord:
    return RunRecord(run_id, f"r{run_id}", "prog", plan, list(inputs), **kw)


def kinds(effects) -> list[str]:
    return [type(e).__name__ for e in effects]


def dispatch_all(life: Lifecycle, rec: RunRecord, values=("y",)) -> None:
    """What the dispatcher does with Work: run the steps, report them dispatched."""
    n = rec.total - rec.cursor
    published = [(0, values[0])] if n else []
    life.handle(rec, "dispatched", 1.0, rec.total, ((0, n, 0, 0),), published)


def test_a_run_goes_queued_running_done_and_resolves_each_output_once():
    life = Lifecycle(max_inflight=8, n_islands=1, validate=True)
    rec = record(0, make_plan(3))
    assert kinds(life.submit(rec)) == ["Emit", "Wake"] and rec.state == "queued"
    work, effects = life.next_work(1.0)
    assert work.rec is rec and rec.state == "running" and kinds(effects) == ["Emit"]
    dispatch_all(life, rec)
    assert life.inflight == [3] and rec.cells[0].value == "y"  # later runs may read it now
    assert life.next_work(1.0) == (None, [])  # everything dispatched: nothing to do until completions
    effects = life.handle(rec, "completed", 2.0, ((0, 2, 0, 0),), [], None)
    assert effects == [] and rec.state == "running"
    effects = life.handle(rec, "completed", 3.0, ((0, 1, 0, 0),), [(0, "y")], None)
    # The run event first, then the futures, then waiters: whoever wakes on an output sees it done.
    assert kinds(effects) == ["Emit", "Resolve", "Finish"]
    assert effects[0].state == "done" and effects[1].outputs == ((0, "y"),)
    assert rec.state == "done" and rec.finished_at == 3.0 and life.inflight == [0] and not life.queue


def test_a_lone_run_is_submitted_and_started_in_one_step_as_the_table_would():
    # What a lone interactive call does: one transition instead of `submit` then `next_work`,
    # with the same states, events and work; compared here with the step-by-step way.
    fused, stepwise = (Lifecycle(max_inflight=8, n_islands=1, validate=True) for _ in range(2))
    a, b = record(0, make_plan(2), now=1.0), record(0, make_plan(2), now=1.0)
    work, effects = fused.submit_lone(a, 1.0)
    step_effects = stepwise.submit(b)
    step_work, more = stepwise.next_work(1.0)
    assert kinds(effects) == ["Emit", "Emit"] and kinds(step_effects + more) == ["Emit", "Wake", "Emit"]
    assert [e.state for e in effects] == ["queued", "running"]
    assert work.rec is a and step_work.rec is b and work.quantum == step_work.quantum and work.inline
    for x, y in ((a, b), (fused, stepwise)):
        fields = [k for k in vars(y) if not k.startswith("_")] if hasattr(y, "__dict__") else RunRecord.__slots__
        same = {k for k in fields if k not in ("plan", "cells", "queue", "dispatchable", "policy", "log", "ready")}
        assert {k: getattr(x, k) for k in same} == {k: getattr(y, k) for k in same}
    assert list(fused.queue) == list(stepwise.queue) == [0] and list(fused.dispatchable) == [0]
    assert [r.id for r in fused.ready.runs()] == [r.id for r in stepwise.ready.runs()] == [0]
    dispatch_all(fused, a)
    assert kinds(fused.handle(a, "completed", 2.0, ((0, 2, 0, 0),), [(0, "y")], None)) == ["Emit", "Resolve", "Finish"]
    assert a.state == "done" and not fused.queue


def test_ran_is_dispatched_then_completed_in_one_transition():
    # A lone step that computed inside its call is reported once: the same record, effects and counts
    # as the dispatched report followed by the completed one.
    fused, stepwise = (Lifecycle(max_inflight=8, n_islands=1, validate=True) for _ in range(2))
    a, b = record(0, make_plan(1), now=1.0), record(0, make_plan(1), now=1.0)
    fused.submit_lone(a, 1.0)
    stepwise.submit_lone(b, 1.0)
    effects = fused.handle(a, "ran", 2.0, 1, ((0, 1, 0, 0),), [(0, "y")], 0, [EVENT])
    step_effects = stepwise.handle(b, "dispatched", 2.0, 1, ((0, 1, 0, 0),), [(0, "y")])
    step_effects += stepwise.handle(b, "completed", 2.0, ((0, 1, 0, 0),), [(0, "y")], None, [EVENT])
    assert kinds(effects) == kinds(step_effects) == ["Emit", "Resolve", "Finish"]
    assert effects[1].outputs == step_effects[1].outputs == ((0, "y"),)
    same = [k for k in RunRecord.__slots__ if k not in ("plan", "cells")]
    assert {k: getattr(a, k) for k in same} == {k: getattr(b, k) for k in same}
    assert (fused.inflight, fused.dispatched, fused.completed) == (stepwise.inflight, stepwise.dispatched,
                                                                   stepwise.completed) == ([0], [1], [1])
    assert a.state == "done" and a.events == [EVENT] and not fused.queue


def test_a_lone_call_sent_whole_and_still_computing_is_queued_running_and_dispatched_in_one_transition():
    # A lone one-step call whose step its caller sent and which is still computing (a remote island's
    # answer on its way): `sent` from "new". The same record, queue and counts as `start`, then
    # `dispatched`; its two run events are one effect. It completes the usual way.
    fused, stepwise = (Lifecycle(max_inflight=8, n_islands=1, validate=True) for _ in range(2))
    a, b = (record(0, make_plan(1, n_inputs=1), inputs=["x"], now=1.0) for _ in range(2))
    effects = fused.handle(a, "sent", 2.0, 1, ((0, 1, 0, 0),), [(0, "y")], 0)
    step_effects = stepwise.handle(b, "start", 1.0)
    step_effects += stepwise.handle(b, "dispatched", 2.0, 1, ((0, 1, 0, 0),), [(0, "y")], 0)
    assert kinds(effects) == ["Emit"] and effects[0].state == ("queued", "running")
    assert [e.state for e in step_effects] == ["queued", "running"]
    same = [k for k in RunRecord.__slots__ if k not in ("plan", "cells")]
    assert {k: getattr(a, k) for k in same} == {k: getattr(b, k) for k in same}
    assert a.state == "running" and a.started_at == 1.0 and a.cells[0].value == b.cells[0].value == "y"
    assert (fused.inflight, fused.dispatched, fused.reserved, list(fused.queue)) == (
        stepwise.inflight, stepwise.dispatched, stepwise.reserved, list(stepwise.queue)) == ([1], [1], a.reserved, [0])
    effects = fused.handle(a, "completed", 3.0, ((0, 1, 0, 0),), [(0, "y")], None, [EVENT])
    assert kinds(effects) == ["Emit", "Resolve", "Finish"] and a.state == "done" and fused.inflight == [0]
    assert not fused.queue and not fused.reserved.get(0)


def test_a_lone_call_run_whole_at_submit_is_queued_running_and_done_in_one_transition():
    # A lone one-step call its caller ran before reporting anything: `ran` from "queued". The same
    # record, events, outputs and counts as starting it, then reporting `ran` from "running".
    fused, stepwise = (Lifecycle(max_inflight=8, n_islands=1, validate=True) for _ in range(2))
    a, b = (record(0, make_plan(1, n_inputs=1), inputs=["x"], now=1.0) for _ in range(2))
    assert fused.lone_args(a) == ["x"] and a.state == "new" and not fused.queue  # asking changes nothing
    cell, step_cell = a.cells[0], b.cells[0]  # what its future holds, for runs that read it later
    effects = fused.handle(a, "ran", 2.0, 1, ((0, 1, 0, 0),), [(0, "y")], 0, [EVENT])
    _, step_effects = stepwise.submit_lone(b, 1.0)
    step_effects += stepwise.handle(b, "ran", 2.0, 1, ((0, 1, 0, 0),), [(0, "y")], 0, [EVENT])
    # Its three run events entered at once are one effect: one timestamp, one append.
    assert kinds(effects) == ["Emit", "Resolve", "Finish"] and effects[0].state == ("queued", "running", "done")
    assert kinds(step_effects) == ["Emit", "Emit", "Emit", "Resolve", "Finish"]
    assert [e.state for e in step_effects[:3]] == ["queued", "running", "done"]
    assert effects[1].outputs == step_effects[3].outputs == ((0, "y"),)
    same = [k for k in RunRecord.__slots__ if k not in ("plan", "cells")]
    assert {k: getattr(a, k) for k in same} == {k: getattr(b, k) for k in same}
    assert (fused.inflight, fused.dispatched, fused.completed, fused.reserved) == (
        stepwise.inflight, stepwise.dispatched, stepwise.completed, stepwise.reserved) == ([0], [1], [1], {})
    assert cell.value == step_cell.value == "y"
    assert effects[1].rec is a and a.started_at == 1.0 and a.finished_at == 2.0 and not fused.queue


def test_only_a_lone_one_step_call_on_ready_inputs_is_run_whole_at_submit():
    life = Lifecycle(max_inflight=1, n_islands=1, capacity={0: 100}, validate=True)
    assert life.lone_args(record(0, make_plan(2, n_inputs=1), inputs=["x"])) is None  # two steps
    assert life.lone_args(record(0, make_plan(1, n_inputs=1, peak={0: 200}), inputs=["x"])) is None  # no memory
    producer = record(1, make_plan(1))
    life.submit_lone(producer, 0.0)
    reader = record(2, make_plan(1, n_inputs=1), inputs=[producer.cells[0]])
    assert life.lone_args(reader) is None  # not alone, and its input's run is not done
    life.handle(producer, "dispatched", 1.0, 1, ((0, 1, 0, 0),), [(0, "x")])
    assert life.lone_args(record(3, make_plan(1, n_inputs=1), inputs=["x"])) is None  # not alone, no credit
    life.handle(producer, "completed", 2.0, ((0, 1, 0, 0),), [(0, "x")], None)
    assert producer.state == "done" and life.lone_args(reader) == ["x"]  # a finished run's output is an array
    assert reader.state == "new" and not life.queue


def test_a_lone_run_that_cannot_start_is_only_queued():
    # Not alone, out of memory or waiting for an input: the step-by-step way, the dispatcher is woken.
    life = Lifecycle(max_inflight=8, n_islands=1, capacity={0: 100}, validate=True)
    big = record(0, make_plan(1, peak={0: 200}))
    work, effects = life.submit_lone(big, 1.0)
    assert work is None and kinds(effects) == ["Emit", "Wake"] and big.state == "queued"
    other = record(1, make_plan(1))
    work, effects = life.submit_lone(other, 1.0)  # the queue is not empty: queued behind
    assert work is None and other.state == "queued" and list(life.queue) == [0, 1]


def test_a_reader_waits_for_its_input_to_be_dispatched_then_starts():
    life = Lifecycle(max_inflight=8, n_islands=1, validate=True)
    producer = record(0, make_plan(2))
    life.submit(producer)
    reader = record(1, make_plan(1, n_inputs=1), inputs=[producer.cells[0]])
    life.submit(reader)
    life.policy = Priority()
    reader.priority = 5  # the reader is preferred, but cannot start: its input is not dispatched
    work, _ = life.next_work(0.0)
    assert work.rec is producer and reader.waiting_for == "input" and reader.state == "queued"
    dispatch_all(life, producer, values=("x",))
    work, effects = life.next_work(0.0)
    assert work.rec is reader and reader.state == "running" and reader.slots[0] == "x"


def test_a_failed_producer_fails_its_queued_readers():
    life = Lifecycle(max_inflight=8, n_islands=1, validate=True)
    producer = record(0, make_plan(1))
    life.submit(producer)
    life.next_work(0.0)
    reader = record(1, make_plan(1, n_inputs=1), inputs=[producer.cells[0]])  # what a future of it holds
    life.submit(reader)
    life.policy = FairShare()  # looks at every run, so the reader is tried too
    work, _ = life.next_work(0.0)
    assert work.rec is producer and reader.waiting_for == "input" and life.blocked
    effects = life.handle(producer, "cancel", 1.0)
    # A run waits on this one: its end wakes the dispatcher (and only then does an end wake it).
    assert kinds(effects) == ["Emit", "Reject", "Finish", "Wake"] and effects[1].cancelled
    work, effects = life.next_work(2.0)
    assert work is None and reader.state == "failed"
    reject = next(e for e in effects if isinstance(e, Reject))
    assert isinstance(reject.error, InputFailedError) and not reject.cancelled
    assert "reads output 0 of run 0 ('r0'), which was cancelled" in str(reject.error)


def started_reader(life: Lifecycle) -> tuple[RunRecord, RunRecord]:
    """A producer whose output was dispatched, and a reader that started on it and finished its steps."""
    producer = record(0, make_plan(2))
    life.submit(producer)
    life.next_work(0.0)
    dispatch_all(life, producer, values=("x",))
    reader = record(1, make_plan(1, n_inputs=1), inputs=[producer.cells[0]])
    life.submit(reader)
    work, _ = life.next_work(0.0)
    assert work.rec is reader and reader.state == "running"
    dispatch_all(life, reader, values=("z",))
    assert life.handle(reader, "completed", 1.0, ((0, 1, 0, 0),), [(0, "z")], None) == []
    return producer, reader


def test_a_reader_is_done_only_once_the_run_it_read_from_is():
    life = Lifecycle(max_inflight=8, n_islands=1, validate=True)
    producer, reader = started_reader(life)
    # Every step of the reader finished, but what it read may still turn out to be a failure.
    assert reader.state == "running" and not any(reader.resolved)
    effects = life.handle(producer, "completed", 2.0, ((0, 2, 0, 0),), [(0, "x")], None)
    assert [e.rec.id for e in effects if isinstance(e, Emit)] == [0, 1] and reader.state == "done"
    assert next(e for e in effects if isinstance(e, Resolve) and e.rec is reader).outputs == ((0, "z"),)


def test_a_producer_that_fails_late_fails_the_readers_that_started_on_it():
    life = Lifecycle(max_inflight=8, n_islands=1, validate=True)
    producer, reader = started_reader(life)
    # A guarded host callback raised in the producer's last step: the value the reader read is zeros.
    failure = (producer.plan.steps[1], ValueError("non-finite"))
    effects = life.handle(producer, "completed", 2.0, ((0, 2, 0, 0),), [], failure)
    assert producer.state == "failed" and reader.state == "failed"
    reject = next(e for e in effects if isinstance(e, Reject) and e.rec is reader)
    assert isinstance(reject.error, InputFailedError) and "reads output 0 of run 0 ('r0'), which failed" in str(
        reject.error
    )
    assert not any(isinstance(e, Resolve) for e in effects) and not life.queue


def test_memory_admission_queues_a_run_until_another_gives_its_reservation_back():
    life = Lifecycle(max_inflight=8, n_islands=1, capacity={0: 100}, validate=True)
    a, b = record(0, make_plan(1, peak={0: 60})), record(1, make_plan(1, peak={0: 60}))
    life.submit(a)
    life.submit(b)
    life.policy = FairShare()  # looks at every tenant's head, so b is tried too
    work, _ = life.next_work(0.0)
    assert work.rec is a and life.reserved == {0: 60}  # a run starts (reserves) when it is picked
    work, _ = life.next_work(0.0)
    assert work.rec is a and b.waiting_for == "memory" and b in life.ready and not life.ready.runs() == [b]
    dispatch_all(life, a)
    effects = life.handle(a, "completed", 1.0, ((0, 1, 0, 0),), [(0, "y")], None)
    assert isinstance(effects[-1], Wake) and life.reserved == {0: 0}  # memory given back wakes the dispatcher
    work, _ = life.next_work(1.0)
    assert work.rec is b and life.reserved == {0: 60}


def test_in_flight_credit_bounds_what_one_island_has_queued():
    life = Lifecycle(max_inflight=2, n_islands=1, validate=True)
    rec = record(0, make_plan(5))
    life.submit(rec)
    work, _ = life.next_work(0.0)
    life.handle(rec, "dispatched", 0.0, 2, ((0, 2, 0, 0),), [])
    assert life.next_work(0.0) == (None, []) and rec.waiting_for == "credit" and life.credit_wanted
    effects = life.handle(rec, "completed", 1.0, ((0, 1, 0, 0),), [], None)
    assert isinstance(effects[0], Wake)  # a completion frees credit someone waits for
    work, _ = life.next_work(1.0)
    assert work.rec is rec


def test_a_cancelled_run_drains_the_steps_it_had_in_flight():
    life = Lifecycle(max_inflight=8, n_islands=1, validate=True)
    rec = record(0, make_plan(4))
    life.submit(rec)
    life.next_work(0.0)
    life.handle(rec, "dispatched", 0.0, 2, ((0, 2, 0, 0),), [])
    effects = life.handle(rec, "cancel", 1.0)
    assert rec.state == "cancelled" and kinds(effects) == ["Emit", "Reject", "Finish"]  # nobody waits on it
    assert life.inflight == [2]  # the device still runs them
    # The dispatcher was mid-burst: it reports one more step, then both complete.
    life.handle(rec, "dispatched", 1.0, 3, ((0, 1, 0, 0),), [(0, "late")])
    assert rec.cells == () and life.inflight == [3]  # nothing published for a final run
    assert life.handle(rec, "completed", 2.0, ((0, 3, 0, 0),), [], None) == []
    assert life.inflight == [0] and rec.state == "cancelled"


def test_a_failing_step_fails_its_run_with_an_error_naming_the_node_and_its_line():
    life = Lifecycle(max_inflight=8, n_islands=1, validate=True)
    rec = record(0, make_plan(3), source_map={"s1": "Cell In[4], line 2"})
    life.submit(rec)
    life.next_work(0.0)
    dispatch_all(life, rec)
    step = rec.plan.steps[1]
    effects = life.handle(rec, "completed", 1.0, ((0, 3, 0, 0),), [], (step, ZeroDivisionError("boom")))
    reject = next(e for e in effects if isinstance(e, Reject))
    assert isinstance(reject.error, NodeError) and reject.error.node == "s1"
    assert "node 's1' of program 'prog' (run 0, 'r0') failed: ZeroDivisionError: boom\n  at Cell In[4], line 2" in str(
        reject.error
    )
    assert rec.state == "failed" and life.inflight == [0] and not life.queue


def test_shutdown_fails_queued_and_running_runs():
    life = Lifecycle(max_inflight=8, n_islands=1, validate=True)
    a, b = record(0, make_plan(2)), record(1, make_plan(2))
    life.submit(a)
    life.submit(b)
    life.next_work(0.0)
    for rec in (a, b):
        effects = life.handle(rec, "shutdown", 1.0)
        assert isinstance(effects[1], Reject)
    assert "was still running" in str(a.error) and "was still queued" in str(b.error)
    assert not life.queue


def test_a_run_with_nothing_to_dispatch_is_done_at_start():
    life = Lifecycle(max_inflight=8, n_islands=1, validate=True)
    plan = Plan(
        mode="chained", steps=[], n_slots=1, input_slots=(0,), const_slots={}, output_slots=(0,), output_step=(-1,)
    )
    rec = record(0, plan, inputs=["x"])
    life.submit(rec)
    work, effects = life.next_work(0.0)
    assert work is None and rec.state == "done"
    assert kinds(effects) == ["Emit", "Emit", "Resolve", "Finish"]
    assert [e.state for e in effects if isinstance(e, Emit)] == ["running", "done"]
    assert next(e for e in effects if isinstance(e, Resolve)).outputs == ((0, "x"),)
    assert isinstance(effects[-1], Finish)


# ------------------------------------------------------------------ policies
def test_fifo_takes_the_oldest_runnable_run():
    runs = [record(i, make_plan(1)) for i in range(3)]
    assert FIFO().pick(runs[1:]) is runs[1] and FIFO.rank(runs[2]) > FIFO.rank(runs[1])


def test_fair_share_splits_picks_by_weight():
    policy = FairShare({"A": 1, "B": 2, "C": 4})
    runs = [record(i, make_plan(1), tenant=t) for i, t in enumerate("ABC")]
    picks = {"A": 0, "B": 0, "C": 0}
    for _ in range(700):
        r = policy.pick(runs)
        picks[r.tenant] += 1
        policy.charge(r, 1000)  # every node costs the same device time
    assert picks == {"A": 100, "B": 200, "C": 400}


def test_fair_share_gives_a_returning_tenant_no_credit_for_idling():
    policy = FairShare()
    a, b = record(0, make_plan(1), tenant="A"), record(1, make_plan(1), tenant="B")
    for _ in range(50):
        policy.charge(policy.pick([a]), 1000)  # A alone for 50 nodes
    later = []
    for _ in range(10):
        r = policy.pick([a, b])
        later.append(r.tenant)
        policy.charge(r, 1000)
    # B starts from A's virtual time: they alternate, no 50-node burst of B; level, B (picked longest ago) first
    assert later == ["B", "A"] * 5


def test_fair_share_takes_a_tenant_that_comes_back_before_the_next_node_of_one_that_kept_its_queue_full():
    # A notebook's call while another keeps the device busy: it waits for the work already dispatched (the
    # run-ahead bound), not also for the busy one's next node; and level tenants take turns, not oldest run first.
    policy = FairShare()
    a = [record(i, make_plan(1), tenant="A") for i in range(3)]
    for _ in range(200):
        policy.charge(policy.pick(a), 1000)
    b = record(99, make_plan(1), tenant="B")
    assert policy.pick([*a, b]) is b
    policy.charge(b, 1000)
    c, d = record(100, make_plan(1), tenant="C"), record(101, make_plan(1), tenant="D")
    order = []
    for _ in range(8):
        r = policy.pick([a[0], c, d])
        order.append(r.tenant)
        policy.charge(r, 1000)
    assert order[:2] in (["C", "D"], ["D", "C"]) and order[2] == "A", order  # the newcomers, then A, in turn
    assert sorted(order[:6]) == ["A", "A", "C", "C", "D", "D"], order


def test_fair_share_gives_a_tenant_back_from_a_pause_no_credit_for_it():
    # A notebook that trained, paused while another trained alone, then came back: it starts level with
    # the one that stayed, not with the share it did not use (which would starve the other for a while).
    policy = FairShare()
    a, b = record(0, make_plan(1), tenant="A"), record(1, make_plan(1), tenant="B")
    for _ in range(10):
        policy.charge(policy.pick([a, b]), 1000)  # both, alternating
    for _ in range(3 * FairShare.RETURN_AFTER):
        policy.charge(policy.pick([a]), 1000)  # B pauses: A alone for a while
    later = []
    for _ in range(10):
        r = policy.pick([a, b])
        later.append(r.tenant)
        policy.charge(r, 1000)
    assert later.count("B") <= 6, later  # alternating again, not ten of B in a row
    # a tenant waiting a moment (fewer than RETURN_AFTER picks: its client's next node not sent yet) keeps
    # its place: it gets back what it missed
    for _ in range(FairShare.RETURN_AFTER // 2):
        policy.charge(policy.pick([a]), 1000)
    caught_up = []
    for _ in range(10):
        r = policy.pick([a, b])
        caught_up.append(r.tenant)
        policy.charge(r, 1000)
    assert caught_up == ["B"] * 10, caught_up


def test_fair_share_floors_a_returning_tenant_even_when_the_one_that_stayed_is_between_runs():
    # The service's clients send one run after another: at the pick where B comes back, A (which kept
    # running) may have no run ready for a moment. B must still start level with A, not from its old time.
    policy = FairShare()
    a, b = record(0, make_plan(1), tenant="A"), record(1, make_plan(1), tenant="B")
    for _ in range(10):
        policy.charge(policy.pick([a, b]), 1000)
    for _ in range(3 * FairShare.RETURN_AFTER):
        policy.charge(policy.pick([a]), 1000)  # B away
    policy.charge(policy.pick([b]), 1000)  # B back while A is between two runs
    later = []
    for _ in range(10):
        r = policy.pick([a, b])
        later.append(r.tenant)
        policy.charge(r, 1000)
    assert later.count("B") <= 6, later  # alternating, not the 3 * RETURN_AFTER nodes B sat out


def test_priority_serves_the_highest_first_and_fifo_among_equals():
    runs = [record(i, make_plan(1), priority=p) for i, p in enumerate([0, 5, 5, 1])]
    assert Priority().pick(runs) is runs[1]
    assert Priority().pick([runs[0], runs[3]]) is runs[3]


# --------------------------------------------------------------------- plans
def test_a_chained_plan_frees_each_value_after_its_last_reader_and_estimates_peak_memory(ctl):
    s = pw.slice(2, mesh={"d": 2}, name="s")
    a = pw.compiled(lambda x: x * 2, slice=s, name="a")
    b = pw.compiled(lambda x: x + 1, slice=s, name="b")
    c = pw.compiled(lambda x, y: x - y, slice=s, name="c")

    @pw.program
    def f(v):
        x = a(v)
        y = b(x)
        return c(x, y)

    graph = f.trace(jnp.zeros(1024, jnp.float32))
    plan = plan_for(graph, "chained")
    names = [st.name for st in plan.steps]
    assert names[-3:] == ["a", "b", "c"]
    slot_of = {st.name: st.outs[0] for st in plan.steps}
    freed_at = {slot: st.name for st in plan.steps for slot in st.frees}
    assert freed_at[slot_of["a"]] == "c" and freed_at[slot_of["b"]] == "c"  # x is read by b and c
    assert slot_of["c"] not in freed_at  # the output lives on
    kib4 = 1024 * 4  # f32[1024] replicated on both devices: 4 KiB each
    # live at the peak: the moved input (until a reads it), then x and y while c makes its output
    assert plan.peak_bytes == {d.id: 3 * kib4 for d in s.devices}
    assert plan_for(graph, "chained") is plan  # cached per graph and mode
    fused = plan_for(graph, "fused")
    assert len(fused.steps) == len(plan.steps) - 2 and fused.steps[-1].name == "f[fused]"
    np.testing.assert_allclose(np.asarray(f(jnp.ones(1024, jnp.float32)).result(timeout=30)), -1.0)


def test_an_unknown_mode_is_refused():
    with pytest.raises(pw.ArgumentError, match="`mode` must be 'auto', 'fused' or 'chained'; got 'eager'"):
        plan_for(None, "eager")


def test_a_failure_spreads_through_10000_chained_runs_in_flight_without_recursion():
    """Each run started on the previous one's dispatched output; the first fails late; every reader fails with it.

    The lifecycle cascades through a work list, so the depth of the chain is a loop's length, not a stack's.
    """
    n = 10_000
    life = Lifecycle(max_inflight=4 * n, n_islands=1, validate=False)
    first, plan = make_plan(1), make_plan(1, n_inputs=1)
    recs = [record(0, first)]
    life.submit(recs[0])
    for k in range(1, n):
        recs.append(record(k, plan, inputs=[recs[-1].cells[0]]))
        life.submit(recs[-1])
    started = 0
    for rec in recs:  # start each run and dispatch its one step: every reader starts on a dispatched value
        life.handle(rec, "start", 0.0)
        life.handle(rec, "dispatched", 0.0, 1, ((0, 1, 0, 0),), [(0, f"v{rec.id}")])
        started += 1
    assert started == n and all(r.state == "running" for r in recs)
    for r in recs[1:]:  # the readers finish their own step first: each waits only for its producer
        assert life.handle(r, "completed", 1.0, ((0, 1, 0, 0),), [(0, "y")], None) == []
    failure = (plan.steps[0], RuntimeError("late host callback error"))
    effects = life.handle(recs[0], "completed", 2.0, ((0, 1, 0, 0),), [], failure)
    assert [r.state for r in recs] == ["failed"] * n
    last = str(recs[-1].error)
    assert isinstance(recs[-1].error, InputFailedError) and "run 9998" in last
    assert "late host callback error" in last and len(last) < 1000  # the first failure, not 9,999 nested messages
    assert kinds(effects).count("Finish") == n and not life.queue
    life.check()


# ------------------------------------------------------------------ the pick at depth
class CountingGate:
    """A run-ahead gate that is full, counting how often it is asked."""

    def __init__(self):
        self.asked = 0

    def full(self, step, inflight):
        self.asked += 1
        return True


@pytest.mark.parametrize("policy", [FIFO, FairShare, Priority])
def test_a_pick_asks_credit_once_per_kind_of_next_step_however_deep_the_queue(policy):
    # A deep backlog of one program behind a reached run-ahead bound: the pick asks once and
    # looks at each tenant's next run only, with 10 runs queued as with 1,000.
    looked = {}
    for depth in (10, 1000):
        gate = CountingGate()
        life = Lifecycle(max_inflight=1 << 20, n_islands=1, policy=policy(), gate=gate, validate=True)
        plan = make_plan(4)
        runs = [record(i, plan, tenant=f"T{i % 4}") for i in range(depth)]
        for rec in runs:
            life.submit(rec)
        work, _ = life.next_work(0.0)  # nothing may go; the runs next in line say why they wait
        assert work is None and life.credit_wanted
        gate.asked = 0
        work, effects = life.next_work(0.0)
        assert work is None and effects == []
        looked[depth] = (gate.asked, sum(r.waiting_for == "credit" for r in runs))
    assert looked[10] == looked[1000] == (1, 1 if policy is not FairShare else 4)


def test_a_queued_reader_is_parked_on_its_producer_until_that_run_publishes():
    life = Lifecycle(max_inflight=8, n_islands=1, validate=True)
    producer = record(0, make_plan(2))
    life.submit(producer)
    reader = record(1, make_plan(1, n_inputs=1), inputs=[producer.cells[0]])
    life.submit(reader)
    work, _ = life.next_work(0.0)
    assert work.rec is producer and reader.waiting_for == "input" and reader in life.ready
    assert [r.id for r in life.ready.runs()] == [0]  # parked: no pick looks at it
    dispatch_all(life, producer)  # publishes its output: the reader may start on it
    work, _ = life.next_work(1.0)
    assert work.rec is reader and reader.state == "running"


def test_a_policy_without_ranks_sees_every_runnable_run_in_submission_order():
    class Newest:  # a user's policy: the newest runnable run first
        name, quantum = "newest", 1

        def pick(self, runnable):
            assert [r.id for r in runnable] == sorted(r.id for r in runnable)
            return runnable[-1]

        def charge(self, run, cost_ns):
            pass

    life = Lifecycle(max_inflight=8, n_islands=1, policy=Newest(), validate=True)
    plan = make_plan(1)
    for i in range(5):
        life.submit(record(i, plan))
    work, _ = life.next_work(0.0)
    assert work.rec.id == 4


def test_a_failed_input_fails_a_chain_of_parked_readers_in_one_pick():
    # c reads a, which reads b; both wait parked. b is cancelled: the next pick fails a, and c,
    # woken by a's end in the middle of the pick, fails too (the index changes while it is read).
    life = Lifecycle(max_inflight=8, n_islands=1, validate=True)
    b = record(0, make_plan(2))
    a = record(1, make_plan(1, n_inputs=1), inputs=[b.cells[0]])
    c = record(2, make_plan(1, n_inputs=1), inputs=[a.cells[0]])
    for rec in (b, a, c):
        life.submit(rec)
    work, _ = life.next_work(0.0)
    assert work.rec is b and a.waiting_for == c.waiting_for == "input"
    life.next_work(0.5)  # a pick that finds a's and c's kinds of step empty (dropped)
    life.handle(b, "cancel", 1.0)
    for _ in range(3):
        work, _ = life.next_work(2.0)
    assert work is None and (a.state, c.state) == ("failed", "failed") and not life.queue

"""A run tells its story: every transition in order, with the stimulus that caused it and its thread.

`run.story()` reads the lifecycle's bounded transition log (as dask's scheduler answers
`story(key)`); validation mode checks that each logged transition is one the table has and
starts where the run's last one ended, so a state written outside the table is caught.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw
from pw_kernel.runtime.core.lifecycle import Lifecycle
from test_execution import one_slot  # noqa: F401 - the gated one-slot controller, shared
from test_lifecycle import make_plan, record


def chain_holds(story) -> None:
    """Each transition starts where the one before it ended, from the record's first state."""
    assert story, "no transitions kept"
    assert story[0].start == "new"
    for before, after in zip(story, story[1:]):
        assert after.start == before.finish, (before, after)
        assert after.time >= before.time
    for t in story:
        kind, _, number = t.stimulus.rpartition("-")
        assert kind and number.isdigit(), t.stimulus


def test_a_lone_calls_story_is_new_then_done_on_the_calling_thread(ctl):
    s = pw.slice(1, name="s")
    f = pw.compiled(lambda x: x * 2, slice=s, name="f")
    x = jax.device_put(jnp.ones(4), s.sharding())
    f(x).result()  # the first call compiles on the dispatcher thread
    y = f(x)
    np.testing.assert_array_equal(np.asarray(y.result()), [2.0] * 4)
    story = y.run.story()
    chain_holds(story)
    assert story.states()[-1] == "done" and story.run_id == y.run.id and story.name == "f"
    # Run whole at submit on this thread (computed inside its call), or sent (or started) and completed later.
    assert story[0].thread == threading.current_thread().name
    assert [t.event for t in story] == ["ran"] or story[0].event in ("sent", "start")
    assert f"run {y.run.id} ('f')" in str(story) and "new" in str(story)


def test_a_chained_programs_story_shows_each_report_and_who_sent_it(ctl):
    s = pw.slice(2, name="s")
    inc = pw.compiled(lambda x: x + 1, slice=s, name="inc")

    @pw.program(mode="chained")
    def five(x):
        for _ in range(5):
            x = inc(x)
        return x

    run = five.submit(jnp.zeros(4))
    np.testing.assert_array_equal(np.asarray(run.outputs.result()), [5.0] * 4)
    story = run.story()
    chain_holds(story)
    states = story.states()
    assert states[0] == "new" and "running" in states and states[-1] == "done"
    events = [t.event for t in story]
    assert "compiling" in events  # its first call compiled `inc`, on a thread of its own
    assert any(e in ("dispatched", "ran") for e in events) and events[-1] in ("completed", "ran")
    compiling = [t for t in story if t.event == "compiling"]
    assert {t.thread for t in compiling} == {"pw-compile"}  # (the dispatcher went on meanwhile)
    # Every report is its own stimulus: numbered in the order the lifecycle handled them.
    numbers = [int(t.stimulus.rpartition("-")[2]) for t in story]
    assert numbers == sorted(numbers)
    # The controller answers for a run id too, and the lifecycle's log is where both read.
    assert pw.controller().story(run.id) == story


def test_a_cancelled_runs_story_ends_in_cancelled_by_the_cancel_call(one_slot):
    hold, inc, x, started, gate = one_slot
    run = pw.program(lambda v: inc(hold(v)), name="slow").submit(x, mode="chained")
    assert started.wait(30)
    assert run.cancel()
    gate.set()
    run.wait(30)
    inc(x).result(timeout=60)  # the island's one slot: free once `hold` has finished and been reported
    story = run.story()
    chain_holds(story)
    cancel = next(t for t in story if t.finish == "cancelled")
    assert (cancel.start, cancel.event, cancel.thread) == ("running", "cancel", threading.current_thread().name)
    assert cancel.stimulus.startswith("cancel-")
    # What the devices still ran after the cancel is reported, and moves the run nowhere.
    after = story[story.index(cancel) + 1:]
    assert all(t.start == t.finish == "cancelled" for t in after)
    assert {t.event for t in after} <= {"dispatched", "completed"} and after[-1].event == "completed"


def test_a_failed_runs_story_and_its_readers_share_the_failures_stimulus(ctl):
    s = pw.slice(1, name="s")
    gate = threading.Event()

    def fail_later(x):
        gate.wait(30)
        raise ValueError("sensor offline")

    bad = pw.compiled(lambda x: jax.pure_callback(fail_later, jax.ShapeDtypeStruct(x.shape, x.dtype), x),
                      slice=s, name="bad")
    inc = pw.compiled(lambda x: x + 1, slice=s, name="inc")
    x = jax.device_put(jnp.zeros(2), s.sharding())
    inc(x).result()
    producer = pw.program(lambda v: bad(v), name="bad").submit(x)
    reader = pw.program(lambda v: inc(v), name="reader").submit(producer.outputs)
    gate.set()
    with pytest.raises(pw.NodeError, match="sensor offline"):
        producer.outputs.result(timeout=60)
    with pytest.raises(pw.InputFailedError):
        reader.outputs.result(timeout=60)
    failed = next(t for t in producer.story() if t.finish == "failed")
    assert failed.event == "completed" and failed.thread in ("pw-watcher", "pw-dispatcher", "MainThread")
    chain_holds(producer.story())
    chain_holds(reader.story())
    reader_failed = next(t for t in reader.story() if t.finish == "failed")
    if reader_failed.event == "upstream_failed":  # it had started on the producer's dispatched value
        assert reader_failed.stimulus == failed.stimulus  # one stimulus, two runs: the cascade
    else:
        assert reader_failed.event == "input_failed" and reader_failed.stimulus.startswith("pick-")


def test_validation_catches_a_state_written_outside_the_table():
    life = Lifecycle(max_inflight=8, n_islands=1, validate=True)
    rec = record(0, make_plan(1))
    life.submit(rec)
    rec.state = "running"  # a write the table never made (the kind the story exists to expose)
    with pytest.raises(AssertionError, match="its last transition ended in 'queued'"):
        life.handle(rec, "cancel", 1.0)


def test_the_log_is_bounded_and_a_forgotten_runs_story_says_so():
    life = Lifecycle(max_inflight=8, n_islands=1, story_length=4)
    recs = [record(i, make_plan(1)) for i in range(6)]
    for r in recs:
        life.submit(r)
    assert len(life.log) == 4
    assert len(life.story(5)) == 1 and len(life.story(0)) == 0
    assert "none kept" in str(life.story(0))

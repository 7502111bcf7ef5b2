"""The runtime's contracts: the run lifecycle's table, controller shutdown, and imports."""

from __future__ import annotations

import ast
import pathlib
import re
import threading

import jax
import jax.numpy as jnp
import pytest

import pw_kernel as pw
from pw_kernel.runtime.extend import FINAL, transition_edges
from pw_kernel.runtime.core.lifecycle import TRANSITIONS
from pw_kernel.runtime.errors import InvalidTransition
from fresh_python import run_python


def test_transition_table_is_the_documented_state_machine():
    assert set(TRANSITIONS) == {
        # a record is "new" only inside the lock that made it: it joins the queue, or (alone in an empty
        # queue) is started at once, or was run whole by its caller at submit (started, dispatched and
        # completed at once), or sent whole by its caller at submit and still computing (started and dispatched)
        ("new", "submit"),
        ("new", "start"),
        ("new", "ran"),
        ("new", "sent"),
        ("queued", "start"),
        ("queued", "input_failed"),
        # what it waits for before it can dispatch (credit, memory, an input), or None once picked
        ("queued", "wait"),
        ("running", "wait"),
        # the dispatcher compiles its executables (a first call); a run may end meanwhile
        ("running", "compiling"),
        ("failed", "compiling"),
        ("cancelled", "compiling"),
        ("queued", "cancel"),
        ("queued", "shutdown"),
        ("running", "dispatched"),
        ("running", "completed"),
        ("running", "step_failed"),
        # a lone call's step that computed inside its call: dispatched and completed, reported at once
        ("running", "ran"),
        # a run it read from before that run was done ends: this one may finish, or fails with it
        ("running", "upstream_done"),
        ("running", "upstream_failed"),
        ("running", "cancel"),
        ("running", "shutdown"),
        # a thread of the controller's own hit an error (a bug): the runs not yet final fail, none waits for good
        ("queued", "internal_error"),
        ("running", "internal_error"),
        # steps already in flight when a run ended still report in; nothing else reaches a final run
        ("failed", "dispatched"),
        ("failed", "completed"),
        ("failed", "step_failed"),
        ("cancelled", "dispatched"),
        ("cancelled", "completed"),
        ("cancelled", "step_failed"),
        # a cascade may recommend two of these for one reader (two of its producers ended): the first decides
        ("failed", "upstream_done"),
        ("failed", "upstream_failed"),
        ("cancelled", "upstream_done"),
        ("cancelled", "upstream_failed"),
    }
    assert not any(state == "done" for state, _ in TRANSITIONS)  # done is final: no event reaches it
    edges = set(transition_edges())
    assert ("queued", "start", "running") in edges and ("running", "completed", "done") in edges
    assert {b for a, _, b in edges if a != b} == {"queued", "running", "failed", "cancelled", "done"}
    assert not any(to == "new" for _, _, to in edges)  # nothing leads back to new
    assert all(a == b for a, _, b in edges if a in FINAL)  # late reports never move a final run


def test_an_invalid_event_is_refused_and_validation_is_on(ctl):
    assert ctl.config.validate and ctl.lifecycle.validate
    s = pw.slice(1)
    run = pw.program(lambda x: x + 1, slice=s, name="p").submit(jnp.ones(2))
    run.wait(30)
    assert run.state == "done"
    with ctl.lock, pytest.raises(InvalidTransition, match="no transition for event 'start' in state 'done'"):
        ctl.lifecycle.handle(run.record, "start", 0.0)
    ctl.lifecycle.check()


def test_status_lists_islands_slices_and_runs(ctl2):
    s = pw.slice(2, name="left")
    pw.program(lambda x: x * 2, slice=s, name="double").submit(jnp.ones(2)).wait(30)
    st = pw.controller().status()
    assert [i.id for i in st.islands] == [0, 1] and [x.name for x in st.slices] == ["left"]
    assert st.counts() == {"done": 1}
    text = str(st)
    assert "VirtualSlice('left'" in text and "double" in text and "policy fifo" in text


def test_shutdown_fails_running_and_queued_runs_and_joins_threads():
    c = pw.init(pw.Config(validate=True))
    threads = c.threads
    assert [t.name for t in threads] == ["pw-dispatcher", "pw-watcher"] and all(t.is_alive() for t in threads)
    s = pw.slice(1)
    started, gate = threading.Event(), threading.Event()

    def hold(x):
        started.set()
        gate.wait(30)
        return x

    slow = pw.compiled(lambda x: jax.pure_callback(hold, jax.ShapeDtypeStruct(x.shape, x.dtype), x), slice=s)
    fut = slow(jnp.ones(2))
    queued = pw.program(lambda x: x + 1, slice=s, name="later")(fut)  # reads `fut`: cannot start before it
    assert started.wait(30)  # the gate holds the first run on its device now
    # Shutdown must not wait for the device: it fails both runs, then joins the threads once the gate opens.
    threading.Thread(target=lambda: (c.shutdown(), gate.set()), name="shutdown").start()
    fut.run.wait(30)
    gate.set()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    for f in (fut, queued):
        assert isinstance(f.exception(timeout=30), pw.ControllerShutdownError)
    assert fut.run.state == "failed" and "was still running" in str(fut.run.error)
    assert "was still queued" in str(queued.run.error)
    with pytest.raises(pw.ControllerShutdownError, match="this controller was shut down"):
        c.slice(1)
    assert pw.controller() is not c  # a fresh one on demand


def test_runtime_imports_only_jax_and_numpy():
    code = (
        "import sys, pw_kernel as pw\n"
        "heavy = [m for m in ('IPython', 'ipywidgets', 'ipykernel', 'graphviz', 'anywidget', 'traitlets', 'jupyter_client')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print(len(pw.devices()))\n"
    )
    assert run_python(code).strip() == "8"  # the embedded default: 8 simulated CPU devices


def test_finished_runs_keep_outputs_only_while_recent_and_the_callers_futures_stay_good():
    # an old run is a summary: it holds nothing per output (a training step's state has hundreds),
    # while the futures its call returned live as long as the caller keeps them
    import gc

    import numpy as np

    pw.init(pw.Config(keep_outputs=2, validate=True))
    try:
        s = pw.slice(1)
        f = pw.compiled(lambda x: x + 1, slice=s, name="f")
        kept = f(jnp.zeros(2))
        for _ in range(4):
            f(jnp.zeros(2)).result(timeout=30)  # results dropped at once
        pw.controller().wait_all(timeout=30)
        gc.collect()
        runs = pw.controller().runs
        np.testing.assert_array_equal(np.asarray(runs[-1].outputs.result()), [1.0, 1.0])  # among the last 2
        assert runs[-2].futures and not runs[-3].futures
        for old in (runs[0], runs[1]):
            with pytest.raises(pw.PathwaysError, match=re.escape("its outputs were released (the controller keeps "
                                                                 "only the last 2 finished runs' outputs)")):
                old.outputs
        np.testing.assert_array_equal(np.asarray(kept.result()), [1.0, 1.0])  # the caller's future
    finally:
        pw.shutdown()


ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_readme_picture_of_the_lifecycle_is_drawn_from_the_table():
    from pw_kernel.widgets.lifecycle import lifecycle_dot

    drawn = (ROOT / "docs" / "lifecycle.dot").read_text()
    assert drawn == lifecycle_dot(), "the table changed: run `python -m pw_kernel.widgets.lifecycle docs`"
    svg = (ROOT / "docs" / "lifecycle.svg").read_text()
    assert "<svg" in svg and all(f">{state}<" in svg for state in ("queued", "running", "done", "failed", "cancelled"))
    assert "](lifecycle.svg)" in (ROOT / "docs" / "architecture.md").read_text()  # the architecture doc shows it
    assert "](docs/architecture.md)" in (ROOT / "README.md").read_text()  # ... and the README links there

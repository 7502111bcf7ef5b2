"""Faults: nodes that raise, devices out of memory, Ctrl-C while blocking, shutdown with runs in flight.

The failing run reports its cause with the node; every other run finishes with correct results; no
future stays pending; the controller's threads are joined. (Cell lines in failure reports and a kernel
restart are tested through real kernels in test_kernel.py and test_magics.py.)
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw
from test_execution import one_slot  # noqa: F401 - the gated one-slot controller, shared


def on_host(fn):
    return lambda x: jax.pure_callback(fn, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def ctrl_c_once_main_is_in(function: str, after: threading.Event | None = None) -> threading.Thread:
    """A person pressing Ctrl-C once the main thread runs ``function`` (and ``after`` is set).

    Pressing on a timer or an event alone can land before the main thread has entered the
    waiting call, outside its `pytest.raises`, which ends the whole test session.
    """
    main = threading.main_thread().ident

    def press():
        if after is not None:
            after.wait(30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            frame = sys._current_frames().get(main)
            while frame is not None and frame.f_code.co_name != function:
                frame = frame.f_back
            if frame is not None:
                break
            time.sleep(0.002)
        signal.pthread_kill(main, signal.SIGINT)

    presser = threading.Thread(target=press, daemon=True)
    presser.start()
    return presser


def raise_value_error(x):
    raise ValueError("calibration table missing")


def test_a_node_raising_at_run_time_fails_only_its_run(ctl):
    s, t = pw.slice(1, name="s"), pw.slice(2, name="t")
    bad = pw.compiled(on_host(raise_value_error), slice=s, name="calibrate")
    inc = pw.compiled(lambda x: x + 1, slice=t, name="inc")

    @pw.program
    def job(x, fail):
        y = inc(x)
        if fail:  # a constant: decided at trace time
            y = bad(y)
        return inc(y)

    futs = [job(jnp.full(2, float(i)), i % 3 == 0) for i in range(9)]
    for i, fut in enumerate(futs):
        if i % 3 == 0:
            with pytest.raises(pw.NodeError, match="node 'calibrate' of program 'job'") as info:
                fut.result(timeout=60)
            assert "calibration table missing" in str(info.value) and info.value.node == "calibrate"
            assert "y = bad(y)" in str(info.value) or "test_faults.py" in str(info.value)
        else:
            np.testing.assert_array_equal(np.asarray(fut.result(timeout=60)), [i + 2.0] * 2)
    assert all(f.done() for f in futs)


def test_a_device_out_of_memory_fails_the_run_and_nothing_else(ctl):
    s = pw.slice(1, name="s")
    huge = pw.compiled(lambda x: jnp.zeros((1 << 40,), jnp.float32) + x.sum(), slice=s, name="huge")  # 4 TiB
    ok = pw.compiled(lambda x: x * 2, slice=s, name="ok")
    before = ok(jnp.ones(2))
    boom = huge(jnp.ones(2))
    after = ok(jnp.ones(2))
    with pytest.raises(pw.NodeError, match="RESOURCE_EXHAUSTED") as info:
        boom.result(timeout=60)
    assert info.value.node == "huge"
    for f in (before, after):
        np.testing.assert_array_equal(np.asarray(f.result(timeout=60)), [2.0, 2.0])


def test_ctrl_c_while_blocking_cancels_the_run(one_slot):
    hold, inc, x, started, gate = one_slot

    @pw.program
    def slow(x):
        return inc(inc(hold(x)))

    other = pw.program(lambda v: inc(v), name="other")
    fut = slow.submit(x, mode="chained").outputs

    presser = ctrl_c_once_main_is_in("result", after=started)
    with pytest.raises(KeyboardInterrupt):
        fut.result(timeout=60)  # a person presses Ctrl-C while this waits, `hold` on the device
    presser.join()
    gate.set()
    assert fut.run.wait(30).state == "cancelled" and fut.cancelled()
    # `other` needs the island's one in-flight slot, so `hold` has finished (and reported) by the time it has run.
    np.testing.assert_array_equal(np.asarray(other(x).result(timeout=60)), [1.0, 1.0])
    # `hold` held that slot until after the cancel, so neither `inc` was dispatched: both were dropped.
    assert (fut.run.nodes_dispatched, fut.run.nodes_total) == (1, 3)


def test_ctrl_c_while_a_lone_call_waits_for_its_value_cancels_it_and_the_controller_goes_on(one_slot):
    hold, inc, x, started, gate = one_slot
    fut = hold(x)  # a lone call; `.result()` without a timeout waits on the value itself

    presser = ctrl_c_once_main_is_in("result", after=started)
    with pytest.raises(KeyboardInterrupt):
        fut.result()  # Ctrl-C while this thread has claimed the node to complete it itself
    presser.join()
    assert fut.cancelled() and fut.run.state == "cancelled"
    gate.set()
    # The claimed node went back to the watcher: it is reported, and the island's one slot is free again.
    np.testing.assert_array_equal(np.asarray(inc(x).result()), [1.0, 1.0])
    assert fut.run.wait(30).nodes_done == fut.run.nodes_dispatched == 1


def test_ctrl_c_while_completing_a_lone_call_on_the_waiting_thread(ctl):
    # A lone call is dispatched on the calling thread, and `.result()` claims its node to complete it
    # there: a Ctrl-C while the device computes must hand the node back, not lose it.
    s = pw.slice(1, name="s")
    grind = pw.compiled(lambda x: jax.lax.fori_loop(0, 400, lambda i, a: jnp.tanh(a @ a), x), slice=s, name="grind")
    inc = pw.compiled(lambda v: v + 1, slice=s, name="inc")
    x = jax.device_put(jnp.full((512, 512), 1e-3), s.sharding())
    grind(x).result()  # compile first: the next call is all device time
    reported = threading.Event()  # set when the watcher reports the next call's node
    stop = pw.controller().events.subscribe(lambda e: reported.set() if getattr(e, "node", None) == "grind" else None)
    # Ctrl-C while `.result()` waits for the device (seconds) on this thread. The presser starts
    # first: starting a thread between the call and `.result()` would let the watcher take the node.
    presser = ctrl_c_once_main_is_in("wait_ready")
    fut = grind(x)
    with pytest.raises(KeyboardInterrupt):
        fut.result()
    presser.join()
    assert fut.run.nodes_dispatched == 1  # (pressed once the node was on the device)
    assert fut.cancelled() and fut.run.state == "cancelled"
    # The node went back to the watcher, which reports it once the device is done (a lost node
    # would never be reported, and would hold its island's in-flight credit for ever).
    assert reported.wait(60)
    stop()
    # A later call on the same slice completes after that report is booked (completion is in order).
    np.testing.assert_array_equal(np.asarray(inc(jnp.zeros(2)).result()), [1.0, 1.0])
    assert fut.run.nodes_done == fut.run.nodes_dispatched == 1
    assert set(pw.controller().status().inflight.values()) == {0}


def test_shutdown_fails_the_running_and_the_queued_runs_then_joins_the_threads(one_slot):
    hold, inc, x, started, gate = one_slot
    c = pw.controller()
    running = hold(x)
    assert started.wait(30)  # `hold` is on the device: its run is running
    queued = [inc(x) for _ in range(5)]  # the island's one in-flight slot is taken: these wait
    assert running.run.state == "running" and [f.run.state for f in queued] == ["queued"] * 5
    # The device work ends only once shutdown has failed its run: shutdown must not wait for the device first.
    running.add_done_callback(lambda _: gate.set())
    c.shutdown()
    assert [t.name for t in c.threads] == ["pw-dispatcher", "pw-watcher"]
    assert not any(t.is_alive() for t in c.threads)
    assert all(f.done() for f in [running, *queued])  # nothing left pending
    assert running.run.state == "failed" and isinstance(running.exception(), pw.ControllerShutdownError)
    assert f"run {running.run.id} ('hold') was still running when the controller shut down" in str(running.exception())
    for f in queued:
        assert f.run.state == "failed" and isinstance(f.exception(), pw.ControllerShutdownError)
        assert "was still queued when the controller shut down" in str(f.exception())



def test_a_call_whose_run_fails_while_being_submitted_still_returns_its_futures():
    # With no outputs kept for finished runs, a run that fails inside `f(x)` (here: its input was
    # deleted, and the transfer raises as it is dispatched) must still hand its futures to the caller.
    pw.init(pw.Config(keep_outputs=0, validate=True))
    try:
        f = pw.compiled(lambda x: x * 2, slice=pw.slice(2), name="double")
        x = jnp.ones(4)
        x.delete()
        y = f(x)
        err = y.exception(timeout=30)
        assert isinstance(err, pw.NodeError) and "Array has been deleted" in str(err), repr(err)
    finally:
        pw.shutdown()


@pytest.mark.parametrize("thread", ["dispatcher", "watcher"])
def test_a_bug_in_a_controller_thread_fails_its_runs_saying_so_and_the_controller_goes_on(ctl, monkeypatch, caplog,
                                                                                         thread):
    """A controller thread that died of an error of ours left every run waiting for good, with nothing said (a
    benchmark's client hung that way): now the runs not yet final fail, naming it, and the thread goes on."""
    import logging

    from pw_kernel.runtime.exec.port import Port

    cls, method = Port, "next_work" if thread == "dispatcher" else "completed"
    real, hit = getattr(cls, method), []

    def buggy(self, *args, **kwargs):  # once, on that thread, while a run is live: a bug of ours
        if threading.current_thread().name == f"pw-{thread}" and self.queued() and not hit:
            hit.append(1)
            raise RuntimeError("a bug of ours")
        return real(self, *args, **kwargs)

    # (dispatched by the dispatcher thread: a first call; completed by the watcher: a node still computing)
    f = pw.compiled(on_host(lambda x: x + 1) if thread == "dispatcher" else lambda x: jnp.tanh(x @ x) * 0 + 1,
                    slice=pw.slice(1))
    x = jnp.zeros((4,) if thread == "dispatcher" else (1024, 1024))
    if thread == "watcher":
        f(x).result(timeout=60)  # (compiled first: then its call returns at once, its node still computing)
    monkeypatch.setattr(cls, method, buggy)
    with caplog.at_level(logging.ERROR, logger="pw_kernel"):
        out, settled = f(x), threading.Event()
        out.add_done_callback(lambda _: settled.set())
        assert settled.wait(60)  # (not `result`: its caller would complete the node itself, not the watcher)
        said = f"pw_kernel's {thread} thread hit an error.*RuntimeError: a bug"
        with pytest.raises(pw.PathwaysError, match=said) as info:
            out.result(timeout=60)
    # Kept with its run, the bug's traceback is text (its frames would hold that thread's arrays): it says where.
    bug = info.value.__cause__ or info.value
    assert bug.__traceback__ is None and "in buggy" in "\n".join(bug.__notes__), bug
    assert hit and f"the {thread} thread hit an error" in caplog.text and "a bug of ours" in caplog.text
    assert ctl.dispatcher.thread.is_alive() and ctl.completion.thread.is_alive()
    assert (np.asarray(f(x).result(timeout=60)) == 1.0).all()  # the controller goes on


def test_a_failed_runs_error_keeps_none_of_its_arrays_and_does_not_grow_however_often_it_is_raised(ctl):
    """A failed run's error is kept with the run for as long as the controller keeps it: its traceback held the
    frames that found the failure, and they the arrays of that step; each `.result()` added its own frames."""
    import gc

    s = pw.slice(1, name="s")
    widen = pw.compiled(lambda x: jnp.stack([x, x + 1]), slice=s, name="widen")  # a (2, 4097) step between
    check = pw.compiled(lambda y: on_host(raise_value_error)(y).sum(0), slice=s, name="calibrate")

    @pw.program(mode="chained")
    def step(x):
        return check(widen(x))

    run = step.submit(jnp.zeros(4097))
    lengths = []
    for _ in range(20):
        with pytest.raises(pw.NodeError, match="calibration table missing") as info:
            run.result(timeout=60)
        lengths.append(len(list(traceback_entries(info.value.__traceback__))))
    del info
    gc.collect()
    assert len(set(lengths)) == 1, lengths  # each raise starts a traceback of its own
    assert not [a for a in jax.live_arrays() if a.shape == (2, 4097)]  # the step between is gone
    assert run.outputs.value is None and run.outputs.dispatched is False  # what the failed step left, too
    cause = run.error.__cause__
    assert cause.__traceback__ is None and cause.original.__traceback__ is None


def traceback_entries(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def test_a_kept_errors_note_says_where_it_was_raised_in_a_bounded_number_of_frames():
    from pw_kernel.runtime.errors import KEPT_FRAMES, at_rest

    def deep(n):
        if n == 0:
            raise ValueError("at the bottom")
        return deep(n - 1)

    try:
        deep(200)
    except ValueError as e:
        err = e
    assert at_rest(err) is err and err.__traceback__ is None
    (note,) = err.__notes__
    assert note.startswith("Traceback where it was raised") and 'raise ValueError("at the bottom")' in note
    assert note.count('File "') <= KEPT_FRAMES and len(note) < 200 * KEPT_FRAMES
    at_rest(err)  # kept again (a chain's root, read by the next run): nothing added
    assert len(err.__notes__) == 1

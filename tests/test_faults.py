"""Faults: nodes that raise, devices out of memory, Ctrl-C while blocking, shutdown with runs in flight.

The failing run reports its cause with the node; every other run finishes with correct results; no
future stays pending; the controller's threads are joined. (Cell lines in failure reports and a kernel
restart are tested through real kernels in test_kernel.py and test_magics.py.)
"""

from __future__ import annotations

import signal
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw


def on_host(fn):
    return lambda x: jax.pure_callback(fn, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


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


def test_ctrl_c_while_blocking_cancels_the_run(ctl):
    s = pw.slice(1, name="s")
    started, gate = threading.Event(), threading.Event()

    def hold(x):
        started.set()
        gate.wait(30)
        return x

    held = pw.compiled(on_host(hold), slice=s, name="held")
    inc = pw.compiled(lambda x: x + 1, slice=s, name="inc")

    @pw.program
    def slow(x):
        return inc(inc(held(x)))

    x = jax.device_put(jnp.zeros(2), s.sharding())
    other = pw.program(lambda v: inc(v), name="other")
    fut = slow.submit(x, mode="chained").outputs

    main = threading.main_thread().ident
    timer = threading.Thread(target=lambda: (started.wait(30), signal.pthread_kill(main, signal.SIGINT)))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        fut.result(timeout=60)  # a person presses Ctrl-C while this waits
    timer.join()
    gate.set()
    assert fut.run.wait(30).state == "cancelled" and fut.cancelled()
    assert fut.run.nodes_dispatched < fut.run.nodes_total  # the nodes not yet dispatched were dropped
    np.testing.assert_array_equal(np.asarray(other(x).result(timeout=60)), [1.0, 1.0])


def test_shutdown_with_runs_in_flight_leaves_nothing_pending_and_joins_threads():
    before = {t.ident for t in threading.enumerate()}
    c = pw.init(pw.Config(validate=True))
    s = pw.slice(1, name="s")
    gate = threading.Event()
    held = pw.compiled(on_host(lambda x: (gate.wait(30), x)[1]), slice=s, name="held")
    inc = pw.compiled(lambda x: x + 1, slice=s, name="inc")
    futs = [held(jnp.ones(2))] + [inc(jnp.ones(2)) for _ in range(5)]
    threading.Timer(0.1, gate.set).start()
    c.shutdown()
    for f in futs:
        assert f.done()  # done, failed with ControllerShutdownError, or cancelled: never pending
        if not f.cancelled() and f.exception() is not None:
            assert isinstance(f.exception(), pw.ControllerShutdownError)
    leftover = [t for t in threading.enumerate() if t.ident not in before and t.name.startswith("pw-")]
    assert leftover == []
    assert all(not t.is_alive() for t in c.threads)
    pw.shutdown()

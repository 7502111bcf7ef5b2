"""pw.Future: the concurrent.futures / asyncio contract, with shape, dtype and sharding up front."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pw_kernel as pw


@pytest.fixture
def gated(ctl):
    """A compiled function that holds until the test opens the gate."""
    s = pw.slice(2, mesh={"data": 2}, name="s")
    gate = threading.Event()

    def hold(x):
        gate.wait(30)
        return x

    slow = pw.compiled(
        lambda x: jax.pure_callback(hold, jax.ShapeDtypeStruct(x.shape, x.dtype), x) * 2,
        slice=s,
        in_specs=P(),
        out_specs=P("data"),
        name="slow",
    )
    yield slow, gate
    gate.set()


def test_shape_dtype_and_sharding_known_at_submit(gated):
    slow, gate = gated
    fut = slow(jnp.ones((4, 3)))
    assert fut.shape == (4, 3) and fut.dtype == np.float32 and fut.ndim == 2 and fut.size == 12
    assert fut.sharding.spec == P("data") and not fut.done()
    text = repr(fut)
    assert "float32[4,3]" in text and "P('data')" in text and "'slow'" in text
    assert "state=" in text and ("pending" in text or "dispatched" in text)
    gate.set()
    assert fut.result(timeout=60).sharding == fut.sharding
    assert fut.done() and fut.exception() is None and "state=done" in repr(fut)


def test_timeouts(gated):
    slow, gate = gated
    fut = slow(jnp.ones(2))
    with pytest.raises(pw.TimeoutError, match=re.escape("not ready after 0.0 s")):
        fut.result(timeout=0)
    with pytest.raises(pw.ArgumentError, match=re.escape("`Future.result(timeout=-1)`: a timeout cannot be negative")):
        fut.result(timeout=-1)
    with pytest.raises(pw.ArgumentError, match=re.escape("must be a number of seconds or None; got 'soon'")):
        fut.result(timeout="soon")
    with pytest.raises(pw.TimeoutError):
        fut.run.wait(timeout=0.01)
    with pytest.raises(pw.TimeoutError, match=re.escape("`pw.get(timeout=0.2)`: ")) as info:
        pw.get({"y": fut}, timeout=0.2)
    assert "not ready after 0.2 s" in str(info.value)  # the user's timeout, not what was left of it
    assert isinstance(pw.TimeoutError("x"), concurrent.futures.TimeoutError)
    gate.set()
    assert fut.result(timeout=60) is not None


def test_done_callbacks_and_concurrent_futures_wait(gated):
    slow, gate = gated
    futs = [slow(jnp.full(2, float(i))) for i in range(3)]
    seen = []
    futs[0].add_done_callback(lambda f: seen.append(f))
    done, not_done = concurrent.futures.wait(futs, timeout=0)
    assert not done and len(not_done) == 3
    gate.set()
    done, not_done = concurrent.futures.wait(futs, timeout=60)
    assert len(done) == 3 and not not_done
    assert seen == [futs[0]]
    assert [float(np.asarray(f.result())[0]) for f in futs] == [0.0, 2.0, 4.0]
    assert list(concurrent.futures.as_completed(futs, timeout=5))


def test_await_in_asyncio(gated):
    slow, gate = gated
    fut = slow(jnp.ones(2))

    async def main():
        asyncio.get_running_loop().call_later(0.05, gate.set)
        return await fut

    out = asyncio.run(main())
    np.testing.assert_array_equal(np.asarray(out), [2.0, 2.0])


def test_cancel_via_future_and_futures_of_cancelled_runs(gated):
    slow, gate = gated

    @pw.program
    def two(x):
        y = slow(x)
        return y, y + 1

    a, b = two(jnp.ones(2))
    assert a.cancel() is True  # cancels the run; both outputs are cancelled
    assert a.cancelled() and b.cancelled() and a.run.state == "cancelled"
    with pytest.raises(pw.CancelledError, match=re.escape(f"output 1 of run {a.run.id} ('two') was cancelled")):
        b.result()
    assert isinstance(pw.CancelledError("x"), concurrent.futures.CancelledError)
    gate.set()


def test_get_blocks_on_a_tree(ctl):
    s = pw.slice(2, name="s")
    f = pw.compiled(lambda x: {"double": x * 2, "neg": -x}, slice=s, name="f")
    out = pw.get({"a": f(jnp.ones(2)), "b": 3, "c": [f(jnp.zeros(2))["neg"]]})
    np.testing.assert_array_equal(np.asarray(out["a"]["double"]), [2.0, 2.0])
    assert out["b"] == 3 and isinstance(out["c"][0], jax.Array)


def test_numpy_reads_a_future(ctl):
    s = pw.slice(1, name="s")
    f = pw.compiled(lambda x: x + 1, slice=s, name="f")
    fut = f(jnp.arange(3.0))
    np.testing.assert_array_equal(np.asarray(fut), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(np.asarray(fut.result() + 1), [2.0, 3.0, 4.0])


def test_float_and_int_read_a_scalar_future_as_a_jax_array_reads(ctl):
    s = pw.slice(1, name="s")
    mean = pw.compiled(lambda x: (x.mean(), x.size), slice=s, name="mean")
    loss, n = mean(jnp.arange(4.0))
    assert float(loss) == 1.5 and int(n) == 4 and f"{float(loss):.2f}" == "1.50"  # (each waits, as `np.asarray`)
    pair = pw.compiled(lambda x: x, slice=s, name="pair")(jnp.ones(2))
    with pytest.raises(TypeError, match="Only scalar arrays can be converted"):  # jax.Array's own error
        float(pair)


def test_program_outputs_keep_their_tree(ctl):
    s = pw.slice(1, name="s")
    f = pw.compiled(lambda x: x + 1, slice=s, name="f")

    @pw.program
    def p(x):
        return {"y": f(x), "pair": (x, 3.0)}

    out = p(jnp.zeros(2))
    assert set(out) == {"y", "pair"} and all(isinstance(v, pw.Future) for v in (out["y"], *out["pair"]))
    got = pw.get(out)
    np.testing.assert_array_equal(np.asarray(got["pair"][0]), [0.0, 0.0])  # an input passed through
    assert float(got["pair"][1]) == 3.0  # a constant output


def test_arithmetic_on_a_future_says_how_to_get_the_array(ctl):
    s = pw.slice(2, name="s")
    double = pw.compiled(lambda x: x * 2, slice=s, name="double")
    y = double(jnp.ones(2))
    hint = "a future is not an array outside a program. Use `fut.result()` or `pw.get(fut)`"
    for attempt in (lambda: y * 2, lambda: 1 + y, lambda: y @ y, lambda: -y):
        with pytest.raises(TypeError, match=re.escape(hint)):
            attempt()
    with pytest.raises(TypeError, match=re.escape("indexing on a pw.Future (output 0 of run")):
        y[0]
    np.testing.assert_array_equal(np.asarray(y.result() * 2), [4.0, 4.0])  # what the message suggests works


def test_shape_readers_take_a_future_and_numpy_reads_it_as_its_array(ctl):
    s = pw.slice(2, mesh={"d": 2}, name="s")
    double = pw.compiled(lambda x: x * 2, slice=s, in_specs=P("d"), out_specs=P("d"), name="double")
    y = double(jnp.arange(4.0))
    out = jax.eval_shape(lambda v: v.sum(), y)  # like a ShapeDtypeStruct: shape and dtype, no waiting
    assert out.shape == () and out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(y), [0.0, 2.0, 4.0, 6.0])  # waits
    np.testing.assert_array_equal(jnp.sin(y.result()), jnp.sin(jnp.arange(4.0) * 2))


def test_reading_a_failed_runs_error_keeps_nothing_of_the_reader_alive():
    # The controller keeps every run with its error, and raising that error attaches the frames it passed
    # through to it. Those of `Future.result` must not keep the future, and so its input's buffer, alive: a
    # service that cancels a dead client's runs would otherwise never get their memory back.
    import gc
    import weakref

    pw.init(pw.Config(keep_outputs=0))
    try:
        s = pw.slice(1, name="s")
        good = pw.compiled(lambda x: x * 2.0, slice=s, name="good")
        gate = threading.Event()
        slow = pw.compiled(
            lambda x: jax.pure_callback(lambda v: (gate.wait(30), v)[1], jax.ShapeDtypeStruct(x.shape, x.dtype), x),
            slice=s, name="slow",
        )

        def read():
            kept = good(jnp.ones((256, 256)))
            kept.result()
            first = slow(kept)
            reader = good(first)  # fails once `first` is cancelled: its input's run was
            first.cancel()
            gate.set()
            for _ in range(2):  # (the second raise replaces the first's frames)
                with pytest.raises(pw.InputFailedError):
                    reader.result()
            refs = weakref.ref(kept), weakref.ref(reader)
            del kept, first, reader
            return refs

        kept, reader = read()
        gc.collect()
        assert reader() is None and kept() is None
    finally:
        pw.shutdown()


def test_a_done_callback_that_refers_to_its_future_does_not_keep_its_buffer_for_the_collector():
    # A callback is a closure over the run's outputs (the Pathways service answers a run from one): kept
    # after it ran, it would hold its future, and the device buffer, in a cycle that only a full garbage
    # collection frees. In the service that was every run: ~6,700 futures with their arrays per 2 s.
    import gc
    import weakref

    pw.init(pw.Config(keep_outputs=0))
    gc.disable()  # (only reference counts free what is dropped here)
    try:
        f = pw.compiled(lambda x: x * 2.0, slice=pw.slice(1, name="s"), name="double")(jnp.ones((256, 256)))
        seen = []
        f.add_done_callback(lambda _, me=f: seen.append(me.shape))  # refers to f: a cycle while it is kept
        run = f.run
        f.result()
        assert seen == [(256, 256)]
        run.wait()  # retired: the run lets go of its outputs (keep_outputs=0) just after they resolve
        gone = weakref.ref(f)
        del f
        assert gone() is None
    finally:
        gc.enable()
        pw.shutdown()

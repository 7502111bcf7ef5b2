"""Bad input: one clear error per mistake (names the API, shows what was received, says what to do),
and the controller keeps working afterwards. Magics' mistakes are UsageErrors."""

from __future__ import annotations

import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pw_kernel as pw


@pytest.fixture
def env(ctl):
    """Two slices and a few compiled functions; after the test, the controller must still run programs."""
    s = pw.slice(2, mesh={"data": 2}, name="s")
    t = pw.slice(2, mesh={"data": 2}, name="t")
    e = {
        "s": s,
        "t": t,
        "double": pw.compiled(lambda x: x * 2, slice=s, name="double"),
        "matmul": pw.compiled(lambda x, w: x @ w, slice=s, name="matmul"),
        "on_t": pw.compiled(lambda x: x + 1, slice=t, name="on_t"),
    }
    yield e
    canary = pw.compiled(lambda x: x - 1, slice=pw.slice(1), name="canary")
    np.testing.assert_array_equal(np.asarray(canary(jnp.ones(2)).result(timeout=60)), [0.0, 0.0])


def raises(exc, message):
    return pytest.raises(exc, match=re.escape(message))


# --------------------------------------------------------------- slices
def test_slice_larger_than_the_devices(env):
    with raises(pw.SliceError, "`pw.slice(9)`: no island has 9 devices (island sizes: [8]") as err:
        pw.slice(9)
    # more simulated devices need a new process; larger islands cannot help
    assert "python -m pw_kernel install --user --devices 9" in str(err.value)
    assert "PW_NUM_CPU_DEVICES=9" in str(err.value) and "Config(islands" not in str(err.value)
    assert "several slices may share them" in str(err.value)
    # the traceback ends at the call the user made, not in the resource manager
    assert err.traceback[-1].name == "slice" and err.traceback[-1].path.name == "api.py"


def test_slice_larger_than_an_island_but_not_than_the_devices(ctl):
    pw.init(pw.Config(islands=[[0, 1, 2, 3], [4, 5, 6, 7]]))
    with raises(pw.SliceError, "no island has 6 devices (island sizes: [4, 4]") as err:
        pw.slice(6)
    assert "pw.init(pw.Config(islands=...))" in str(err.value)


def test_mesh_that_does_not_multiply_to_n(env):
    with raises(pw.SliceError, "`pw.slice(4, mesh={'a': 3})`: the mesh has 3 devices, not 4"):
        pw.slice(4, mesh={"a": 3})


def test_unknown_island(env):
    with raises(pw.SliceError, "`pw.slice(island=5)`: no such island; the islands are [0]"):
        pw.slice(2, island=5)


def test_non_positive_slice(env):
    with raises(pw.SliceError, "needs a positive int number of devices; got -2"):
        pw.slice(-2)


def test_taken_slice_name(env):
    with raises(pw.SliceError, "`pw.slice(name='s')`: a live slice already has that name"):
        pw.slice(2, name="s")


def test_bad_island_configuration(env):
    with raises(pw.SliceError, "`pw.Config(islands=3)` splits each platform's devices into 3 equal islands"):
        pw.init(islands=3)


def test_compiled_function_on_a_released_slice(env):
    s = pw.slice(1, name="gone")
    f = pw.compiled(lambda x: x, slice=s, name="f")
    s.release()
    with raises(pw.SliceReleasedError, "`pw.compiled 'f'`: slice 'gone' was released. Ask for a new one"):
        f(jnp.ones(2))
    with raises(pw.SliceReleasedError, "`pw.compiled`: slice 'gone' was released"):
        pw.compiled(lambda x: x, slice=s)


# ------------------------------------------------------------- compiled
def test_unknown_mesh_axis_in_a_partition_spec(env):
    with raises(pw.SpecError, "`pw.compiled(in_specs=...)`: PartitionSpec P('model',) names mesh axis 'model', but slice 's' has axes ('data',)"):
        pw.compiled(lambda x: x, slice=env["s"], in_specs=P("model"))


def test_spec_that_is_not_a_partition_spec(env):
    with raises(pw.SpecError, "`pw.compiled(in_specs=...)` expects PartitionSpecs (or None to leave it to JAX); got 'data'"):
        pw.compiled(lambda x: x, slice=env["s"], in_specs=("data",))


def test_compiled_without_a_slice(env):
    with raises(pw.ArgumentError, "`pw.compiled` needs `slice=`"):
        pw.compiled(lambda x: x)


def test_compiled_with_something_not_callable(env):
    with raises(pw.ArgumentError, "`pw.compiled` needs a callable; got 3 of type int"):
        pw.compiled(3, slice=env["s"])


def test_compiled_with_a_slice_that_is_not_one(env):
    with raises(pw.ArgumentError, "`pw.compiled(slice=...)` needs a VirtualSlice from `pw.slice(n, ...)`; got 4"):
        pw.compiled(lambda x: x, slice=4)


def test_compiled_with_an_unknown_slice_name(env):
    with raises(pw.SliceError, "No live slice named 'nope'"):
        pw.compiled(lambda x: x, slice="nope")


# -------------------------------------------------------------- tracing
def test_mismatched_shapes_between_nodes(env):
    @pw.program
    def p(x):
        return env["matmul"](env["double"](x), jnp.ones((3, 3)))

    with raises(pw.TracingError, "`pw.program` 'p' could not be traced: TypeError: dot_general requires contracting dimensions"):
        p(jnp.ones((2, 4)))


def test_mismatched_dtypes_between_nodes(env):
    @pw.program
    def p(x, n):
        return jax.lax.add(env["double"](x), n)

    with raises(pw.TracingError, "could not be traced: TypeError: lax.add requires arguments to have the same dtypes"):
        p(jnp.ones(2, jnp.float32), jnp.ones(2, jnp.int32))


def test_shape_that_does_not_divide_over_the_mesh(env):
    f = pw.compiled(lambda x: x, slice=env["s"], in_specs=P("data"), name="split")
    with raises(pw.SpecError, "a value does not fit the PartitionSpec it is given"):
        f(jnp.ones(3))


def test_function_jax_cannot_trace(env):
    @pw.program
    def p(x):
        return env["double"](x) * float(x[0])

    with raises(pw.TracingError, "needs a concrete value where it only has a traced one"):
        p(jnp.ones(2))


def test_data_dependent_control_flow(env):
    @pw.program
    def p(x):
        y = env["double"](x)
        while y.sum() < 10:
            y = env["double"](y)
        return y

    with raises(pw.ControlFlowError, "Python control flow depends on a value computed on devices"):
        p(jnp.ones(2))


def test_non_array_output(env):
    @pw.program(slice=env["s"])
    def p(x):
        return {"status": "ok"}

    with raises(pw.TracingError, "A program must return arrays (or pytrees of arrays)"):
        p(jnp.ones(2))


def test_unhashable_constant_argument(env):
    @pw.program(slice=env["s"])
    def p(x, options):
        return x

    with raises(pw.TracingError, "argument leaf 1 is a set, which is neither an array"):
        p(jnp.ones(2), {"fast"})


def test_fused_mode_over_several_slices(env):
    @pw.program
    def p(x):
        return env["on_t"](env["double"](x))

    with raises(pw.FusedModeError, "`mode='fused'`: program 'p' cannot run as one executable because its nodes run on 2 slices"):
        p.submit(jnp.ones(2), mode="fused")


def test_unknown_mode(env):
    with raises(pw.ArgumentError, "`mode` must be 'auto', 'fused' or 'chained'; got 'turbo'"):
        pw.program(lambda x: env["double"](x)).submit(jnp.ones(2), mode="turbo")


# -------------------------------------------------------------- futures
def failing_callback(x):
    raise ValueError("bad sensor")


def test_future_of_a_failed_run_as_input(env):
    bad = pw.compiled(
        lambda x: jax.pure_callback(failing_callback, jax.ShapeDtypeStruct(x.shape, x.dtype), x),
        slice=pw.slice(1),
        name="bad",
    )
    failed = bad(jnp.ones(2))
    with pytest.raises(pw.NodeError):
        failed.result(timeout=60)
    with raises(pw.InputFailedError, f"reads output 0 of run {failed.run.id} ('bad'), which failed"):
        env["double"](failed).result(timeout=60)


def test_future_of_a_cancelled_run_as_input(env):
    gate = threading.Event()
    held = pw.compiled(
        lambda x: jax.pure_callback(lambda a: (gate.wait(30), a)[1], jax.ShapeDtypeStruct(x.shape, x.dtype), x),
        slice=pw.slice(1),
        name="held",
    )
    first = held(jnp.ones(2))
    second = pw.compiled(lambda x: x, slice=pw.slice(1), name="after")(jnp.ones(2))
    cancelled = pw.program(lambda x: x * 3, slice=env["t"], name="cancel_me")(second)
    cancelled.cancel()
    gate.set()
    first.result(timeout=60)
    with raises(pw.InputFailedError, f"reads output 0 of run {cancelled.run.id} ('cancel_me'), which was cancelled"):
        env["on_t"](cancelled).result(timeout=60)


def test_zero_timeout_polls_and_negative_timeout_is_refused(env):
    fut = env["double"](jnp.ones(2))
    fut.run.wait(60)
    assert fut.result(timeout=0) is not None  # done: 0 just checks
    with raises(pw.ArgumentError, "`Future.result(timeout=-0.5)`: a timeout cannot be negative"):
        fut.result(timeout=-0.5)
    with raises(pw.ArgumentError, "`pw.get(timeout=-1)`: a timeout cannot be negative"):
        pw.get(fut, timeout=-1)
    with raises(pw.ArgumentError, "`Run.wait(timeout=-3)`: a timeout cannot be negative"):
        fut.run.wait(timeout=-3)


# ------------------------------------------------- scheduling, pipelines
def test_bad_policy_and_weights(env):
    with raises(pw.ArgumentError, "`Controller.set_policy` needs a policy such as pw.FIFO()"):
        pw.controller().set_policy(None)
    with raises(pw.ArgumentError, "`FairShare` weight of tenant 'A' must be a positive number; got -1"):
        pw.FairShare({"A": -1})


def test_run_that_can_never_fit_in_memory(env):
    pw.init(device_memory=1 << 20)
    s = pw.slice(1)
    f = pw.compiled(lambda x: x * 2, slice=s, name="f")
    with raises(pw.AdmissionError, "the run needs about 4.0 MiB on device 0, but runs may reserve at most 1.0 MiB there"):
        f(jax.device_put(jnp.ones(1 << 20), s.sharding()))


def test_pipeline_with_fewer_microbatches_than_stages(env):
    with raises(pw.PipelineError, "needs at least as many microbatches as stages (M >= S), got M=1 for S=2"):
        pw.pipeline([lambda p, x: x] * 2, slices=[env["s"], env["t"]], microbatches=1, schedule="zero_bubble")


def test_pipeline_stage_shapes_that_do_not_chain(env):
    pipe = pw.pipeline([lambda p, x: x[:, :2], lambda p, x: x @ p], slices=[env["s"], env["t"]], microbatches=2)
    params = pipe.place([jnp.zeros(()), jnp.ones((4, 4))])
    with raises(pw.PipelineError, "stage 0 outputs float32[2, 2], which stage 1 cannot take"):
        pipe.grads(params, jnp.ones((4, 4)), jnp.ones((4, 4)))


def test_pipeline_params_not_on_their_slices(env):
    pipe = pw.pipeline([lambda p, x: x * p] * 2, slices=[env["s"], env["t"]], microbatches=2)
    with raises(pw.PipelineError, "params of stage 0 live on the host, but stage 0 runs on slice 's'"):
        pipe.grads([np.float32(1), np.float32(1)], jnp.ones((4, 2)), jnp.ones((4, 2)))


# ------------------------------------------------------------ lifecycle
def test_using_a_controller_after_shutdown(env):
    c = pw.controller()
    c.shutdown()
    with raises(pw.ControllerShutdownError, "`pw.slice`: this controller was shut down. `pw.controller()` returns a fresh one"):
        c.slice(1)


def test_program_traced_for_a_replaced_controller(env):
    f = env["double"]
    pw.init()
    with raises(pw.SliceReleasedError, "slice 's' was released"):
        f(jnp.ones(2))

"""Running programs: MPMD over several slices, futures across runs, failures, cancellation, modes."""

from __future__ import annotations

import re
import textwrap
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pw_kernel as pw

from fresh_python import run_python


def mlp_weights(width=32, depth=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(width, width)).astype(np.float32) / np.sqrt(width) for _ in range(depth)]


def reference(x, ws):
    for i, w in enumerate(ws):
        x = np.tanh(x @ w)
        if i % 2 == 0:
            x = x * 0.5 + 1.0
    return x, (x * x).mean()


@pytest.fixture
def mpmd(ctl2):
    """An MPMD program over 4 slices in 2 islands: a layer per slice, glue between, transfers."""
    slices = [
        pw.slice(2, mesh={"data": 2}, name="s0", island=0),
        pw.slice(2, mesh={"model": 2}, name="s1", island=0),
        pw.slice(2, mesh={"data": 2}, name="s2", island=1),
        pw.slice(2, mesh={"data": 1, "model": 2}, name="s3", island=1),
    ]
    specs = [
        (P("data"), None, P("data")),
        (None, P(None, "model"), P(None, "model")),
        (P("data"), None, P("data")),
        (P("data"), P(None, "model"), P("data", "model")),
    ]
    layers = [
        pw.compiled(lambda x, w: jnp.tanh(x @ w), slice=s, in_specs=(i, w), out_specs=o, name=f"layer{k}")
        for k, (s, (i, w, o)) in enumerate(zip(slices, specs))
    ]
    ws = mlp_weights()
    placed = [jax.device_put(w, s.sharding(*(spec[1] or P()))) for w, s, spec in zip(ws, slices, specs)]

    @pw.program
    def model(x, *ws):
        for i, (layer, w) in enumerate(zip(layers, ws)):
            x = layer(x, w)
            if i % 2 == 0:
                x = x * 0.5 + 1.0  # glue on the layer's slice
        return x, jnp.mean(x * x)

    return model, ws, placed


def test_mpmd_program_over_four_slices(mpmd):
    model, ws, placed = mpmd
    x = np.random.default_rng(1).normal(size=(8, 32)).astype(np.float32)
    g = model.trace(x, *placed)
    kinds = g.kinds()
    assert kinds["compute"] == 4 and kinds["glue"] == 3 and kinds["transfer"] >= 4
    assert {s.name for s in g.slices} == {"s0", "s1", "s2", "s3"}
    assert sum(n.cross_island for n in g.nodes) == 1  # s1 (island 0) -> s2 (island 1)
    y, loss = pw.get(model(x, *placed))
    ry, rloss = reference(x, ws)
    np.testing.assert_allclose(np.asarray(y), ry, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(loss), rloss, rtol=1e-5)
    assert y.sharding.spec == P("data", "model")


def test_fused_equals_chained(ctl):
    s = pw.slice(4, mesh={"data": 4}, name="s")
    f = pw.compiled(lambda x: jnp.sin(x) * 3, slice=s, in_specs=P("data"), out_specs=P("data"), name="f")
    g = pw.compiled(lambda x: x.sum(), slice=s, in_specs=P("data"), name="g")

    @pw.program
    def p(x):
        y = f(x) + 1
        return y, g(y * y)

    x = jax.device_put(jnp.arange(16.0), s.sharding("data"))
    fused_run = p.submit(x, mode="fused")
    chained_run = p.submit(x, mode="chained")
    assert fused_run.mode == "fused" and fused_run.nodes_total == 1
    assert chained_run.mode == "chained" and chained_run.nodes_total == 3  # f, glue[add,mul], g
    for a, b in zip(fused_run.result(), chained_run.result()):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.sharding == b.sharding
    assert p.submit(x).mode == "fused"  # auto picks fused on one slice


def test_auto_runs_a_training_loop_in_segments_alike_rather_than_compiling_every_step(ctl):
    # fused, 100 calls of one step are 100 inlined copies for XLA to compile (about a minute for
    # an optimizer step); auto cuts the loop into equal segments of about FUSE_SMALL_EQNS
    # equations, which compile once between them (as a jax.jit loop compiles its step once)
    s = pw.slice(4, mesh={"data": 4}, name="s")

    def sgd(w, x):
        g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
        return w - 0.1 * g

    step = pw.compiled(sgd, slice=s, in_specs=(P(), P("data")), name="step")

    @pw.program
    def train(w, x):
        for _ in range(40):
            w = step(w, x)
        return w

    @pw.program
    def once(w, x):
        return step(w, x) * 2

    w, x = jnp.eye(8) / 2, jnp.ones((16, 8))
    run = train.submit(w, x).wait()
    steps = [e for e in run.events if e.kind != "compile"]
    assert run.mode == "fused" and 2 <= len(steps) < 40  # 40 step nodes in a few segments
    assert len([e for e in run.events if e.kind == "compile"]) == 1  # alike: one compile
    ref = w
    for _ in range(40):
        ref = jax.jit(sgd)(ref, x)
    np.testing.assert_allclose(np.asarray(run.result()), np.asarray(ref), rtol=1e-6)
    assert once.submit(w, x).mode == "fused"  # a small program still runs as one executable


def deep(x):
    """A function XLA takes a while to compile (hundreds of ops), as a real model's first step does."""
    for i in range(300):
        x = jnp.sin(x) * 1.001 + i
    return x


def test_a_run_says_which_step_it_is_compiling(ctl):
    from pw_kernel import widgets

    c = pw.controller()
    seen = []  # what a progress view reads of the run when its compile event arrives

    def on_event(ev):
        if getattr(ev, "kind", None) == "compile":
            run = c.run(ev.run_id)
            seen.append((ev.node, run.compiling, widgets.progress_line(run)))

    unsubscribe = c.events.subscribe(on_event)
    # declared out_specs: the dispatcher compiles it before its first call (else tracing compiles it)
    f = pw.compiled(deep, slice=pw.slice(2, name="s"), out_specs=P(), name="deep")
    run = pw.program(lambda x: f(x), name="first_call").submit(jnp.ones(4)).wait()
    unsubscribe()
    (node, compiling, line), = seen
    assert node == "compile deep" and compiling == "deep"
    assert re.search(r"nodes, [\d.]+ s, compiling 'deep'$", line), line
    assert run.compiling is None and run.compile_time > 0
    assert "compiling" not in widgets.progress_line(run)


def test_a_first_call_compiling_does_not_hold_up_other_runs(ctl):
    # A model's first step compiles for a while; meanwhile a function already compiled, on another
    # slice, is called again and again (another notebook of a service, an eval loop): each call is
    # dispatched and done while that compile still runs, rather than queued behind it.
    c = pw.controller()
    step = pw.compiled(lambda x: deep(x) * 2.0 + 3.0, slice=pw.slice(1, name="model"), out_specs=P(), name="step")
    inc = pw.compiled(lambda x: x + 1.0, slice=pw.slice(1, name="eval"), name="inc")
    y = inc(jnp.zeros(4))
    y.result()
    first = pw.program(lambda x: step(x), name="first_call").submit(jnp.ones(4))
    deadline = time.monotonic() + 60  # (not a speed bound: a test that hangs should say so)
    while first.compiling is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert first.compiling == "step"
    calls = [inc(y) for _ in range(3)]
    for z in calls:
        z.result()
    (compile_end,) = [e.end for e in first.wait().events if e.kind == "compile"]
    ends = [e.end for e in c.events.nodes if e.node == "inc"][-3:]
    assert len(ends) == 3 and max(ends) < compile_end, (ends, compile_end)
    np.testing.assert_allclose(first.outputs.result(), np.asarray(deep(jnp.ones(4))) * 2 + 3, rtol=1e-5)
    np.testing.assert_allclose(calls[-1].result(), np.full(4, 2.0))


def test_a_run_cancelled_while_it_compiles_ends_at_once_and_the_next_call_uses_that_compile(ctl):
    # Ctrl-C during a model's long first compile: the run is cancelled now, not once XLA is done,
    # and the next call of the same step runs (its executable's steps get their credit back).
    step = pw.compiled(lambda x: deep(x) + 1.0, slice=pw.slice(1, name="model"), out_specs=P(), name="step")
    prog = pw.program(lambda x: step(x), name="first_call")
    first = prog.submit(jnp.ones(4))
    deadline = time.monotonic() + 60  # (a hang guard)
    while first.compiling is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert first.cancel() and first.wait(60).state == "cancelled"
    again = prog.submit(jnp.ones(4)).wait(120)
    assert again.state == "done"
    np.testing.assert_allclose(again.outputs.result(), np.asarray(deep(jnp.ones(4))) + 1, rtol=1e-5)


def test_compile_threads_must_be_a_positive_count():
    for bad in (0, -2, 1.5, "4"):
        with pytest.raises(pw.ArgumentError, match=r"compile_threads=\.\.\.\)` must be a positive int .*got " + re.escape(repr(bad))):
            pw.init(pw.Config(compile_threads=bad))
    assert pw.init(pw.Config(compile_threads=3)).dispatcher.compile_threads == 3
    pw.shutdown()


_XLA_COMPILES: list[float] | None = None


def xla_compiles() -> list[float]:
    """Every XLA compile from now on (JAX reports each one's duration), in a list."""
    global _XLA_COMPILES
    if _XLA_COMPILES is None:
        _XLA_COMPILES = []
        jax.monitoring.register_event_duration_secs_listener(
            lambda name, secs, **_: _XLA_COMPILES.append(secs) if name == "/jax/core/compile/backend_compile_duration" else None
        )
    return _XLA_COMPILES


@pytest.mark.parametrize("threads", [1, 2])
def test_a_first_run_compiles_each_executable_once_ahead_of_its_call(threads):
    # Three functions, one of them called twice on the same kind of argument: three compiles, each
    # its own event, before the steps run (several at once with threads), none again inside a call.
    # (`+ threads`: each parametrization computes something new, which no earlier test compiled.)
    c = pw.init(pw.Config(validate=True, compile_threads=threads))
    try:
        s = pw.slice(2, mesh={"d": 2}, name="s")
        f, g, h = (pw.compiled(lambda x, k=k: deep(x) * k + threads, slice=s, in_specs=P("d"), out_specs=P("d"), name=n)
                   for k, n in ((1.0, "f"), (2.0, "g"), (3.0, "h")))

        @pw.program(name="three")
        def three(x):
            return h(g(f(f(x))))

        x = jax.device_put(jnp.arange(8.0), s.sharding("d"))
        said = []  # what the run says it compiles when each compile event comes out (a progress view)
        unsubscribe = c.events.subscribe(
            lambda ev: said.append(c.run(ev.run_id).compiling) if getattr(ev, "kind", None) == "compile" else None
        )
        seen = xla_compiles()
        before = len(seen)
        run = three.submit(x, mode="chained").wait()
        unsubscribe()
        assert said == (["f", "g", "h"] if threads == 1 else ["f, g, h"] * 3)
        compiles = sorted(e.node for e in run.events if e.kind == "compile")
        assert compiles == ["compile f", "compile g", "compile h"] and len(seen) - before == 3
        took = [e.end - e.dispatch for e in run.events if e.kind == "compile"]
        assert max(took) <= round(run.compile_time * 1e9) <= sum(took)  # the wall time: compiles may overlap
        want = h(g(f(f(x)))).result()  # (one-node programs of their own: compiled by tracing, not here)
        np.testing.assert_allclose(run.outputs.result(), want, rtol=1e-6)
        again = three.submit(x, mode="chained").wait()
        assert not [e for e in again.events if e.kind == "compile"] and again.compile_time == 0
    finally:
        pw.shutdown()


def test_layers_written_as_separate_closures_compile_once_per_slice(ctl):
    # A model's repeated layer, made by a factory: each call gives a new Python function (as a
    # pipeline's stages are), and JAX alone would compile each. Same computation, same slice: one
    # compile, whose XLA name is the first function's. A different constant is a different layer.
    s = pw.slice(2, mesh={"d": 2}, name="s")

    def make_layer(scale):
        w = np.full((4, 4), scale, np.float32)
        return lambda x: jnp.tanh(x @ w) + 0.125

    layers = [pw.compiled(make_layer(0.5), slice=s, in_specs=P("d"), out_specs=P("d"), name=f"layer{i}") for i in range(3)]
    other = pw.compiled(make_layer(0.25), slice=s, in_specs=P("d"), out_specs=P("d"), name="other")

    @pw.program(name="stack")
    def stack(x):
        for layer in layers:
            x = layer(x)
        return other(x)

    x = jax.device_put(jnp.ones((8, 4), jnp.float32), s.sharding("d"))
    seen = xla_compiles()
    before = len(seen)
    run = stack.submit(x, mode="chained").wait()
    assert len(seen) - before == 2  # the layer once, the other once
    assert sorted(e.node for e in run.events if e.kind == "compile") == ["compile layer0", "compile other"]
    want = x
    for scale in (0.5, 0.5, 0.5, 0.25):
        want = jnp.tanh(want @ np.full((4, 4), scale, np.float32)) + 0.125
    np.testing.assert_allclose(run.outputs.result(), want, rtol=1e-6)


@pytest.mark.parametrize("start", ["fresh", "placed"])
@pytest.mark.parametrize("n", [1, 2])
def test_a_training_loop_compiles_its_step_once_as_jax_jit_does(ctl, n, start):
    # The first call gets fresh arrays (jnp's, on the default device) or arrays placed on the slice; every
    # later call gets the last call's outputs. Both trace to one program (a gradient's constants were
    # resharded to the mesh in one trace and not the other: two programs, two compiles). And the outputs
    # carry the kind of sharding XLA gives them: on one device a fresh array's (JAX's cache keys on that
    # kind; outputs named on the slice's mesh compiled the step again at the second call, a model's whole
    # compile once more on a one-GPU host). (`n`, `start`: nothing earlier compiled it.)
    def step(state):
        loss, grads = jax.value_and_grad(lambda st: sum(jnp.tanh(v @ v).sum() for v in st.values()) * n)(state)
        return jax.tree.map(lambda v, g: v - (0.01 if start == "fresh" else 0.02) * g, state, grads), loss

    s = pw.slice(n, name="s")
    seen = xla_compiles()
    counts = {}
    steps = {"jax.jit": jax.jit(step, donate_argnums=0), "pw": pw.compiled(step, slice=s, donate_argnums=0)}
    for name, fn in steps.items():
        state = {f"w{i}": jnp.eye(8) * (i + 1) for i in range(3)}
        if start == "placed":
            state = jax.device_put(state, s.sharding())
        jax.block_until_ready(state)
        before = len(seen)
        for _ in range(4):
            state, loss = fn(state)
        counts[name] = len(seen) - before
        assert np.isfinite(pw.get(loss)) and pw.get(state)["w2"].shape == (8, 8)
    assert counts == {"jax.jit": 1, "pw": 1}


def test_futures_feed_later_runs_without_waiting(ctl):
    s1 = pw.slice(1, name="s1")
    s2 = pw.slice(1, name="s2")
    gate = threading.Event()

    def wait_for_gate(x):
        gate.wait(30)
        return x

    slow = pw.compiled(
        lambda x: jax.pure_callback(wait_for_gate, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1,
        slice=s1,
        name="slow",
    )
    inc = pw.compiled(lambda x: x + 1, slice=s2, name="inc")
    first = slow(jnp.zeros(3))
    second = inc(first)  # submitted while `first` is still being computed
    third = inc(second)
    assert not first.done() and not third.done()
    assert isinstance(second, pw.Future) and second.shape == (3,) and second.dtype == np.float32
    gate.set()
    np.testing.assert_array_equal(np.asarray(third.result(timeout=60)), [3.0] * 3)
    assert pw.controller().run(second.run.id).state == "done"


def test_compiled_function_alone_is_a_one_node_program(ctl):
    s = pw.slice(2, name="s")
    double = pw.compiled(lambda x: x * 2, slice=s, name="double")
    fut = double(jnp.array([1.0, 2.0]))
    assert isinstance(fut, pw.Future)
    np.testing.assert_array_equal(np.asarray(fut.result()), [2.0, 4.0])
    run = fut.run
    assert run.name == "double" and [e.node for e in run.events if e.kind != "compile"] == ["transfer dev0->s", "double"]

    @pw.compiled(slice=s, in_specs=P("d"), out_specs=P("d"))
    def halve(x):
        return x / 2

    assert isinstance(halve, pw.CompiledFunction) and halve.__name__ == "halve"
    np.testing.assert_array_equal(np.asarray(halve(jnp.array([2.0, 4.0])).result()), [1.0, 2.0])


def test_a_lone_call_hands_its_values_to_on_computed_before_it_is_reported_done(ctl, caplog):
    s = pw.slice(1, name="s")
    double = pw.compiled(lambda x: x * 2, slice=s)
    two = pw.program(lambda x: (double(x) + 1, double(x) * 2), name="two")
    x = jax.device_put(jnp.arange(3.0), s.sharding())
    two.call_run(x)[0].wait()  # (compiled: the next calls compute inside their call)
    seen = []

    def record(values):
        seen.append(([np.asarray(v) for v in values], pw.controller().runs[-1].state))

    run, (a, b) = two.call_run(x, on_computed=record)
    assert run.state == "done"
    (values, state), = seen  # once, with every output, before the run was reported done
    np.testing.assert_array_equal(values[0], np.asarray(a.result()))
    np.testing.assert_array_equal(values[1], np.asarray(b.result()))
    assert state != "done"

    def broken(values):
        raise ValueError("the caller's bug")

    run, (a, _) = two.call_run(x, on_computed=broken)  # logged; the run goes on
    assert run.state == "done" and "the caller's bug" in caplog.text
    np.testing.assert_array_equal(np.asarray(a.result()), np.asarray(x) * 2 + 1)


def test_a_compiled_function_called_again_reuses_its_graph_per_input_signature(ctl):
    s = pw.slice(2, mesh={"d": 2}, name="s")
    double = pw.compiled(lambda x: x * 2, slice=s, in_specs=P("d"), out_specs=P("d"), name="double")
    x = jax.device_put(jnp.arange(4.0), s.sharding("d"))
    a, b = double(x), double(x)
    assert a.run.graph is b.run.graph  # traced once; the second call found it by shape, dtype and sharding
    np.testing.assert_array_equal(np.asarray(b.result()), [0.0, 2.0, 4.0, 6.0])
    longer = double(jax.device_put(jnp.arange(6.0), s.sharding("d")))  # another shape: another graph
    assert longer.run.graph is not a.run.graph and longer.shape == (6,)
    np.testing.assert_array_equal(np.asarray(longer.result()), np.arange(6.0) * 2)
    from_numpy = double(np.arange(4.0, dtype=np.float32))  # numpy: placed by the run, as before
    np.testing.assert_array_equal(np.asarray(from_numpy.result()), [0.0, 2.0, 4.0, 6.0])
    assert jax.jit(lambda v: double(v) + 1)(x).shape == (4,)  # under jax.jit it is traced, not submitted


def test_a_loop_feeding_each_call_the_last_ones_future_computes_what_jax_does(ctl):
    # futures finished by the time of the next call are read as their arrays; pending or failed ones
    # are waited for by the run, as before; the timeline has every node
    s = pw.slice(1, name="s")
    inc = pw.compiled(lambda x: x * 1.5 + 1, slice=s, name="inc")
    slow = pw.compiled(lambda x: jax.lax.fori_loop(0, 20000, lambda i, u: u * 0.999999 + 1e-6, x), slice=s, name="slow")
    x = jax.device_put(jnp.ones(4), s.sharding(None))
    v, want = x, np.ones(4, np.float32)
    for i in range(50):
        v = inc(slow(v) if i % 10 == 0 else v)
        want = np.asarray(jax.jit(lambda u: jax.lax.fori_loop(0, 20000, lambda i, w: w * 0.999999 + 1e-6, u))(want)
                          ) * 1.5 + 1 if i % 10 == 0 else want * 1.5 + 1
    np.testing.assert_allclose(np.asarray(v.result()), want, rtol=1e-5)
    assert len(pw.controller().events.query(program="inc", kind="compute")) == 50

    boom = pw.compiled(lambda x: jax.pure_callback(failing_callback, jax.ShapeDtypeStruct(x.shape, x.dtype), x),
                       slice=s, name="boom")
    bad = boom(x)
    with pytest.raises(pw.InputFailedError, match="boom"):
        inc(bad).result(timeout=60)


def failing_callback(x):
    raise ValueError("sensor offline")


def test_a_failing_node_fails_only_its_run(ctl):
    s = pw.slice(1, name="s")
    other = pw.slice(2, name="other")
    broken = pw.compiled(
        lambda x: jax.pure_callback(failing_callback, jax.ShapeDtypeStruct(x.shape, x.dtype), x),
        slice=s,
        name="read_sensor",
    )
    fine = pw.compiled(lambda x: x + 1, slice=other, name="fine")

    @pw.program
    def pipeline(x):
        y = broken(x)
        return fine(y), fine(x)

    healthy = fine(jnp.ones(2))
    y, z = pipeline(jnp.ones(2))
    for fut in (y, z):
        with pytest.raises(pw.NodeError) as info:
            fut.result(timeout=60)
        err = info.value
        assert err.node == "read_sensor" and err.program == "pipeline"
        assert "sensor offline" in str(err) and "node 'read_sensor' of program 'pipeline'" in str(err)
    assert y.run.state == "failed" and y.exception() is y.run.error
    np.testing.assert_array_equal(np.asarray(healthy.result()), [2.0, 2.0])
    np.testing.assert_array_equal(np.asarray(fine(jnp.ones(2)).result()), [2.0, 2.0])  # controller still fine
    # a future of the failed run used as an input: the new run fails clearly
    later = fine(y)
    with pytest.raises(pw.InputFailedError, match=re.escape(f"reads output 0 of run {y.run.id} ('pipeline'), which failed")):
        later.result(timeout=60)


@pytest.fixture
def one_slot(ctl):
    """A controller whose island takes one node in flight, a slice, and a compiled `hold` that waits for `gate`."""
    pw.init(pw.Config(max_inflight=1, validate=True))
    s = pw.slice(1, name="s")
    started, gate = threading.Event(), threading.Event()

    def hold(x):
        started.set()
        gate.wait(30)
        return x

    blocker = pw.compiled(lambda x: jax.pure_callback(hold, jax.ShapeDtypeStruct(x.shape, x.dtype), x), slice=s, name="hold")
    inc = pw.compiled(lambda x: x + 1, slice=s, name="inc")
    x = jax.device_put(jnp.zeros(2), s.sharding())
    yield blocker, inc, x, started, gate
    gate.set()


def test_cancel_a_queued_run(one_slot):
    blocker, inc, x, started, gate = one_slot
    first = blocker(x)
    assert started.wait(30)
    queued = pw.program(lambda v: inc(v), name="queued").submit(x)
    assert queued.state == "queued"  # the island's one in-flight slot is taken
    assert queued.cancel() is True and queued.state == "cancelled"
    assert queued.cancel() is False
    with pytest.raises(pw.CancelledError, match="was cancelled"):
        queued.outputs.result()
    gate.set()
    np.testing.assert_array_equal(np.asarray(first.result(timeout=60)), [0.0, 0.0])
    assert queued.nodes_dispatched == 0
    np.testing.assert_array_equal(np.asarray(inc(x).result(timeout=60)), [1.0, 1.0])


def test_cancel_a_running_run_drops_undispatched_nodes(one_slot):
    blocker, inc, x, started, gate = one_slot

    @pw.program
    def long(x):
        x = blocker(x)
        for _ in range(10):
            x = inc(x)
        return x

    long.trace(x)
    run = long.submit(x, mode="chained")
    assert started.wait(30)
    assert run.state == "running" and run.cancel()
    gate.set()
    with pytest.raises(pw.CancelledError):
        run.outputs.result(timeout=60)
    assert run.nodes_dispatched < run.nodes_total
    assert run.outputs.cancelled()


def test_a_script_whose_last_calls_compile_a_new_signature_exits_cleanly():
    # The second call's state is the first's output (placed, not a fresh array): a new signature,
    # compiled aside on a thread of its own while the loop goes on. The script then ends with that
    # compile in XLA: the process aborted at exit ("terminate called ...", exit code 134) until
    # the interpreter's exit waited for the thread.
    out = run_python(textwrap.dedent("""
        import jax, jax.numpy as jnp, pw_kernel as pw
        step = pw.compiled(lambda st: jax.tree.map(lambda v: jnp.tanh(v @ v) * 0.5, st), slice=pw.slice(1),
                           donate_argnums=0)
        state = {f"w{i}": jnp.eye(256) for i in range(8)}
        for _ in range(50):
            state = step(state)
        print("end of script")
    """))
    assert "end of script" in out

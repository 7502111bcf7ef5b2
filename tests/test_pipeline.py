"""Pipelines: GPipe and 1F1B over slices give the unpipelined model's loss and gradients."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw

W = 16


def mlp_layer(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])


def mlp_params(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"w": rng.normal(size=(W, W)).astype(np.float32) / 4, "b": np.zeros(W, np.float32)} for _ in range(n)]


def layer_norm(x):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)


def transformer_block(p, x):
    """Pre-norm single-head self-attention + MLP on (batch, seq, W)."""
    h = layer_norm(x)
    q, k, v = h @ p["wq"], h @ p["wk"], h @ p["wv"]
    att = jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) / np.sqrt(W), axis=-1)
    x = x + (att @ v) @ p["wo"]
    return x + jax.nn.gelu(layer_norm(x) @ p["w1"]) @ p["w2"]


def block_params(n, seed=0):
    rng = np.random.default_rng(seed)
    mk = lambda *shape: (rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32)  # noqa: E731
    return [
        {"wq": mk(W, W), "wk": mk(W, W), "wv": mk(W, W), "wo": mk(W, W), "w1": mk(W, 2 * W), "w2": mk(2 * W, W)}
        for _ in range(n)
    ]


def reference(layer, params, x, y):
    def loss(ps):
        h = x
        for p in ps:
            h = layer(p, h)
        return jnp.mean((h - y) ** 2)

    return jax.value_and_grad(loss)(params)


MODELS = {
    "mlp": (mlp_layer, mlp_params, (32, W)),
    "transformer": (transformer_block, block_params, (16, 4, W)),
}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_pipelined_equals_unpipelined(ctl, model, stages, schedule):
    layer, make, shape = MODELS[model]
    rng = np.random.default_rng(1)
    x = rng.normal(size=shape).astype(np.float32)
    y = rng.normal(size=shape).astype(np.float32)
    params = make(stages)
    # data-parallel stages where there are devices to spare
    slices = [pw.slice(8 // stages, mesh={"data": 8 // stages}) for _ in range(stages)]
    pipe = pw.pipeline([layer] * stages, slices=slices, microbatches=4, schedule=schedule)
    placed = pipe.place(params)
    loss, grads = pw.get(pipe.grads(placed, x, y))
    ref_loss, ref_grads = reference(layer, params, x, y)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        for key in r:
            np.testing.assert_allclose(np.asarray(g[key]), np.asarray(r[key]), rtol=2e-4, atol=2e-6)
    for st, g in zip(slices, grads):  # gradients stay on their stage
        assert set(jax.tree_util.tree_leaves(g)[0].sharding.device_set) == set(st.devices)


def test_1f1b_with_fewer_microbatches_than_stages_equals_unpipelined(ctl):
    x = np.random.default_rng(1).normal(size=(32, W)).astype(np.float32)
    y = np.random.default_rng(2).normal(size=(32, W)).astype(np.float32)
    slices = [pw.slice(2, mesh={"data": 2}) for _ in range(4)]
    pipe = pw.pipeline([mlp_layer] * 4, slices=slices, microbatches=2, schedule="1f1b")
    loss, grads = pw.get(pipe.grads(pipe.place(mlp_params(4)), x, y))
    ref_loss, ref_grads = reference(mlp_layer, mlp_params(4), x, y)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        for key in r:
            np.testing.assert_allclose(np.asarray(g[key]), np.asarray(r[key]), rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_training_steps_lower_the_loss(ctl, schedule):
    slices = [pw.slice(2, mesh={"data": 2}) for _ in range(4)]
    pipe = pw.pipeline([mlp_layer] * 4, slices=slices, microbatches=4, schedule=schedule, learning_rate=0.5)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(32, W)).astype(np.float32)
    y = np.tanh(x @ rng.normal(size=(W, W)).astype(np.float32) / 4)
    params = pipe.place(mlp_params(4))
    losses = []
    for _ in range(6):
        params, loss = pipe.step(params, x, y)  # each step reads the previous step's futures
        losses.append(loss)
    values = [float(v.result()) for v in losses]
    assert values[-1] < 0.8 * values[0], values
    assert all(b < a for a, b in zip(values, values[1:]))


def test_the_schedule_is_the_dispatch_order_and_transfers_are_nodes(ctl2):
    slices = [pw.slice(2, mesh={"data": 2}, island=i % 2) for i in range(4)]
    pipe = pw.pipeline([mlp_layer] * 4, slices=slices, microbatches=4, schedule="1f1b")
    params = pipe.place(mlp_params(4))
    x = np.ones((16, W), np.float32)
    run = pipe.submit_step(params, x, x, mode="chained")
    run.wait(60)
    assert run.state == "done"
    names = [e.node.split(":")[0] for e in sorted(run.events, key=lambda e: e.seq) if e.kind == "compute"]
    ops = [f"{k}{s}" for k, s, _ in pw.schedule_ops("1f1b", 4, 4)]
    assert [n for n in names if re.fullmatch(r"[FB]\d", n)] == ops
    transfers = [e for e in run.events if e.kind == "transfer" and e.src_island is not None]
    assert any(e.src_island != e.island for e in transfers)  # stage 0 (island 0) -> stage 1 (island 1)
    # 1F1B keeps at most S microbatches' inputs per stage, GPipe keeps M
    for kind, bound in (("1f1b", lambda s: 4 - s), ("gpipe", lambda s: 4)):
        ops = pw.schedule_ops(kind, 4, 4)
        for s in range(4):
            live = peak = 0
            for k, st, _ in ops:
                if st == s:
                    live += 1 if k == "F" else -1
                    peak = max(peak, live)
            assert peak == bound(s)


def test_validation_errors(ctl):
    s = [pw.slice(2, mesh={"data": 2}) for _ in range(4)]
    with pytest.raises(pw.PipelineError, match=re.escape("needs at least as many microbatches as stages (M >= S), got M=2 for S=4")):
        pw.pipeline([mlp_layer] * 4, slices=s, microbatches=2, schedule="zero_bubble")
    with pytest.raises(pw.PipelineError, match=re.escape("4 stages but 3 slices")):
        pw.pipeline([mlp_layer] * 4, slices=s[:3], microbatches=4)
    with pytest.raises(pw.PipelineError, match=re.escape("must be one of 'gpipe', '1f1b', 'interleaved', 'zero_bubble'; got 'zigzag'")):
        pw.pipeline([mlp_layer] * 4, slices=s, microbatches=4, schedule="zigzag")

    def widen(p, x):
        return jnp.concatenate([x, x], axis=-1)  # 16 -> 32 features

    pipe = pw.pipeline([widen, mlp_layer], slices=s[:2], microbatches=4)
    params = pipe.place(mlp_params(2))
    x = np.ones((8, W), np.float32)
    with pytest.raises(pw.PipelineError, match=re.escape("stage 0 outputs float32[2, 32], which stage 1 cannot take")):
        pipe.grads(params, x, x)
    ok = pw.pipeline([mlp_layer] * 2, slices=s[:2], microbatches=4)
    with pytest.raises(pw.PipelineError, match=re.escape("params of stage 0 live on the host, but stage 0 runs on slice")):
        ok.grads(mlp_params(2), x, x)
    wrong = ok.place(mlp_params(2))[::-1]
    with pytest.raises(pw.PipelineError, match=re.escape("Place them first: `state = pipe.init(params)`")):
        ok.grads(wrong, x, x)
    with pytest.raises(pw.PipelineError, match=re.escape("x has shape [6, 16], whose first (batch) axis does not split into 4 equal microbatches")):
        ok.grads(ok.place(mlp_params(2)), np.ones((6, W), np.float32), np.ones((6, W), np.float32))
    # shapes checked once are not traced again each step; other shapes still are
    placed = ok.place(mlp_params(2))
    ok.grads(placed, x, x)[0].result()
    with pytest.raises(pw.PipelineError, match=re.escape("the microbatch is float32[2, 8], which stage 0 cannot take")):
        ok.grads(placed, np.ones((8, 8), np.float32), x)

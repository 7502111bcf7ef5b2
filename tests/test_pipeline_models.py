"""A real language model on `pw.pipeline`: token ids, tied embeddings, AdamW, clipping, a weighted loss.

For every schedule, with remat on and off, the pipelined loss and every gradient
leaf equal `jax.value_and_grad` of the unpipelined model, and 20 optimizer steps
track the same optax training in plain JAX.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw

optax = pytest.importorskip("optax")

VOCAB, D, T, B = 32, 16, 8, 16


# ---------------------------------------------------------------- the model, as a user writes it
def embed(p, tokens, *, embed, positions):
    return embed[tokens] + p["pos"][positions]


def block(p, h, *, positions):
    rot = jnp.where(positions[..., None] % 2 == 0, 1.0, -1.0)  # an integer field used inside the block
    return h + jnp.tanh(h @ p["w1"]) @ p["w2"] * rot


def head(p, h, *, embed):
    return (h * p["g"]) @ embed.T  # output projection tied to the input embedding


def xent(logits, targets, weights):
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    return jnp.sum(weights * nll) / jnp.sum(weights)


def model_params(n_blocks, seed=0):
    rng = np.random.default_rng(seed)
    mk = lambda *s: (rng.normal(size=s) * 0.3).astype(np.float32)  # noqa: E731
    stages = [{"pos": mk(T, D)}] + [{"w1": mk(D, D), "w2": mk(D, D)} for _ in range(n_blocks)] + [{"g": np.ones(D, np.float32)}]
    return stages, {"embed": mk(VOCAB, D)}


def batch(seed=1):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=(B, T)).astype(np.int32)
    targets = rng.integers(0, VOCAB, size=(B, T)).astype(np.int32)
    weights = (rng.random((B, T)) > 0.3).astype(np.float32)  # padding: unequal counts per microbatch
    positions = np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy()
    return tokens, targets, weights, positions


def unpipelined(stage_params, shared, tokens, targets, weights, positions):
    h = embed(stage_params[0], tokens, embed=shared["embed"], positions=positions)
    for p in stage_params[1:-1]:
        h = block(p, h, positions=positions)
    return xent(head(stage_params[-1], h, embed=shared["embed"]), targets, weights)


def train_beside_optax(pipe, state, opt, ref, steps):
    """``steps`` pipelined steps, submitted without waiting, and the same optax steps on the unpipelined model.

    Returns the pipeline's state, both loss curves and the unpipelined params ``(stage_params, shared)``.
    """
    tokens, targets, weights, positions = batch()
    ref_state = opt.init(ref)
    value_and_grad = jax.jit(jax.value_and_grad(lambda ps: unpipelined(*ps, tokens, targets, weights, positions)))
    losses, ref_losses = [], []
    for _ in range(steps):
        state, step_loss = pipe.step(state, tokens, targets, weights=weights, positions=positions)
        losses.append(step_loss)
        value, g = value_and_grad(ref)
        updates, ref_state = opt.update(g, ref_state, ref)
        ref = optax.apply_updates(ref, updates)
        ref_losses.append(float(value))
    return state, [float(v) for v in pw.get(losses)], ref_losses, ref


LAYOUTS = {  # schedule -> (slices, stage functions); interleaved puts 2 chunks on each slice
    "gpipe": (4, 2),
    "1f1b": (4, 2),
    "zero_bubble": (4, 2),
    "interleaved": (2, 2),
}


def make_pipeline(schedule, remat, opt, clip=1.0):
    n_slices, n_blocks = LAYOUTS[schedule]
    slices = [pw.slice(2, mesh={"data": 2}) for _ in range(n_slices)]
    stages = [embed] + [block] * n_blocks + [head]
    V = len(stages)
    return pw.pipeline(
        stages, slices=slices, microbatches=4, schedule=schedule, loss=xent, optimizer=opt, clip_norm=clip,
        remat=remat, shared={"embed": (0, V - 1)}, fields={"positions": tuple(range(V - 1))},
    ), n_blocks


@pytest.mark.parametrize("remat", [True, False], ids=["remat", "keep"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved", "zero_bubble"])
def test_language_model_equals_unpipelined_and_trains_like_optax(ctl, schedule, remat):
    opt = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 5, 20), weight_decay=0.01)
    pipe, n_blocks = make_pipeline(schedule, remat, opt)
    stage_params, shared = model_params(n_blocks)
    tokens, targets, weights, positions = batch()
    state = pipe.init(stage_params, shared=shared)

    loss, (grads, shared_grads) = pw.get(pipe.grads(state, tokens, targets, weights=weights, positions=positions))
    ref_loss, (ref_grads, ref_shared) = jax.value_and_grad(unpipelined, argnums=(0, 1))(
        stage_params, shared, tokens, targets, weights, positions
    )
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=2e-4)
    for path, g in jax.tree_util.tree_leaves_with_path((grads, shared_grads)):
        r = ref_grads if path[0].idx == 0 else ref_shared
        for k in path[1:]:
            r = r[k.idx if hasattr(k, "idx") else k.key]
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))

    if remat:  # trained with remat in the optimizer table below
        return
    # 20 steps against optax on the unpipelined model (clip_norm=1.0: the chain below)
    chain = optax.chain(optax.clip_by_global_norm(1.0), opt)
    losses = []
    for _ in range(20):
        state, step_loss = pipe.step(state, tokens, targets, weights=weights, positions=positions)
        losses.append(float(step_loss.result()))
    ref_losses, ref, _ = optax_on_the_unpipelined_model(chain, (stage_params, shared), 20)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert losses[-1] < 0.7 * losses[0]
    first, last = pw.get(state.shared["embed"])  # the tied copies got the very same updates
    np.testing.assert_array_equal(np.asarray(first), np.asarray(last))
    np.testing.assert_allclose(np.asarray(first), np.asarray(ref[1]["embed"]), rtol=1e-3, atol=1e-5)


# ---------------------------------------------------------------- optax as on the whole model
def whole_model_optimizers(stage_params):
    """What JAX LM code passes to optax, masks and labels written as one fixed pytree over (params, shared)."""
    matrices = ([{k: v.ndim > 1 for k, v in p.items()} for p in stage_params], {"embed": False})
    labels = ([{k: "matrix" if v.ndim > 1 else "vector" for k, v in p.items()} for p in stage_params], {"embed": "embedding"})
    return {
        "adamw": optax.adamw(1e-2, weight_decay=0.1),
        "clip+adamw(warmup_cosine)": optax.chain(
            optax.clip_by_global_norm(1.0), optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 5, 20), weight_decay=0.01)),
        "adamw(mask=tree)": optax.adamw(1e-2, weight_decay=0.1, mask=matrices),
        "multi_transform": optax.multi_transform(
            {"matrix": optax.adamw(1e-2), "vector": optax.sgd(1e-1), "embedding": optax.adam(3e-3)}, labels),
        "MultiSteps(adamw,2)": optax.MultiSteps(optax.adamw(1e-2), 2),
    }


def optax_on_the_unpipelined_model(opt, ref, steps):
    """``steps`` steps of plain optax on ``ref = (stage_params, shared)``: (losses, params, optimizer state)."""
    tokens, targets, weights, positions = batch()

    @jax.jit
    def step(ps, s):
        value, g = jax.value_and_grad(lambda ps: unpipelined(*ps, tokens, targets, weights, positions))(ps)
        updates, s = opt.update(g, s, ps)
        return optax.apply_updates(ps, updates), s, value

    s, losses = opt.init(ref), []
    for _ in range(steps):
        ref, s, value = step(ref, s)
        losses.append(float(value))
    return losses, ref, s


# Each transformation under two schedules and each schedule under two or three transformations:
# the optimizer runs after the schedule's gradients, on the same path whatever the schedule (all
# 20 pairs took two minutes of the suite's 15).
OPTAX_CASES = [
    ("gpipe", "adamw"), ("interleaved", "adamw"),
    ("1f1b", "clip+adamw(warmup_cosine)"), ("zero_bubble", "clip+adamw(warmup_cosine)"),
    ("gpipe", "adamw(mask=tree)"), ("zero_bubble", "adamw(mask=tree)"),
    ("1f1b", "multi_transform"), ("interleaved", "multi_transform"),
    ("gpipe", "MultiSteps(adamw,2)"), ("1f1b", "MultiSteps(adamw,2)"),
]


def test_the_optax_cases_cover_every_transformation_and_schedule():
    names = set(whole_model_optimizers(model_params(2)[0]))
    assert {n for _, n in OPTAX_CASES} == names and {s for s, _ in OPTAX_CASES} == set(LAYOUTS)


@pytest.mark.parametrize(("schedule", "name"), OPTAX_CASES)
def test_any_optax_transformation_trains_as_on_the_whole_model(ctl, schedule, name):
    # a global-norm clip inside a chain, a fixed mask tree, fixed labels, MultiSteps' counter: all as
    # optax means them on the unpipelined model, loss, params and optimizer state, 20 steps
    n_blocks = LAYOUTS[schedule][1]
    stage_params, shared = model_params(n_blocks)
    opt = whole_model_optimizers(stage_params)[name]
    pipe, _ = make_pipeline(schedule, True, opt, clip=None)
    state = pipe.init(stage_params, shared=shared)
    tokens, targets, weights, positions = batch()
    losses = []
    for _ in range(20):
        state, loss = pipe.step(state, tokens, targets, weights=weights, positions=positions)
        losses.append(loss)
    ref_losses, ref, ref_state = optax_on_the_unpipelined_model(opt, (stage_params, shared), 20)
    np.testing.assert_allclose([float(v) for v in pw.get(losses)], ref_losses, rtol=1e-5)
    got = pw.get(state)
    for copy in got.shared["embed"]:  # every stage's copy of the tied embedding
        np.testing.assert_allclose(np.asarray(copy), np.asarray(ref[1]["embed"]), rtol=1e-5, atol=1e-6)
    for path, a in jax.tree_util.tree_leaves_with_path(got.params):
        b = ref[0][path[0].idx][path[1].key]
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))
    # the optimizer state is optax's own, leaf for leaf
    assert jax.tree_util.tree_structure(got.opt_state) == jax.tree_util.tree_structure(ref_state)
    for path, a in jax.tree_util.tree_leaves_with_path(got.opt_state):
        b = ref_state
        for k in path:
            b = b[k.idx] if hasattr(k, "idx") else b[k.key] if hasattr(k, "key") else getattr(b, k.name)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_the_step_graph_shows_tied_sums_and_the_global_norm_as_small_cross_slice_nodes(ctl):
    pipe, n_blocks = make_pipeline("1f1b", True, optax.adam(1e-3))  # clip_norm=1.0: chain(clip, adam)
    stage_params, shared = model_params(n_blocks)
    tokens, targets, weights, positions = batch()
    state = pipe.init(stage_params, shared=shared)
    graph = pipe.trace(state, tokens, targets, weights=weights, positions=positions)
    names = [n.name for n in graph.nodes]
    assert "tie:embed" in names and "update:cross" in names
    # per slice: its part of the squared norm, then (once the global norm is known) its update
    assert all(f"update{k}.0" in names and f"update{k}.1" in names for k in range(4))
    tie = next(n for n in graph.nodes if n.name == "tie:embed")
    feeding = [graph.nodes[graph.values[v].producer].name for v in tie.inputs]
    assert any(f.startswith("transfer") for f in feeding)  # the last stage's embedding gradient moves to stage 0
    # the global norm reads each other slice's squares as one small transfer, and sends back scalars only
    cross = next(n for n in graph.nodes if n.name == "update:cross")
    moved = [graph.values[v] for v in cross.inputs if graph.nodes[graph.values[v].producer].kind == "transfer"]
    assert len(moved) == 3 and all(v.nbytes <= 64 for v in moved)
    for n in graph.nodes:
        if n.kind == "transfer" and graph.nodes[graph.values[n.inputs[0]].producer or 0].name == "update:cross":
            assert graph.values[n.outputs[0]].nbytes <= 64
    # adam's state is optax's for the whole model, each moment on its parameter's slice
    mu = state.opt_state[1][0].mu
    for st in pipe.stages:
        for leaf in jax.tree_util.tree_leaves(mu[0][st.index]):
            assert set(leaf.sharding.device_set) == set(st.slice.devices)
    assert set(mu[1]["embed"].sharding.device_set) == set(pipe.stages[0].slice.devices)


def test_function_masks_accumulation_and_injected_hyperparams(ctl):
    # what users reach for beyond adamw: decay on matrices only (a mask written as a function of the
    # tree), gradient accumulation over two steps, a learning rate read from the optimizer state
    def make():
        decay = optax.add_decayed_weights(1e-2, mask=lambda tree: jax.tree.map(lambda a: a.ndim > 1, tree))
        return optax.MultiSteps(optax.chain(decay, optax.inject_hyperparams(optax.adam)(learning_rate=1e-2)), 2)

    pipe, n_blocks = make_pipeline("1f1b", True, make(), clip=None)
    stage_params, shared = model_params(n_blocks)
    state = pipe.init(stage_params, shared=shared)
    state, losses, ref_losses, ref = train_beside_optax(pipe, state, make(), (stage_params, shared), 6)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-4)
    assert losses[1] == losses[0] and losses[3] == losses[2]  # MultiSteps: params move every other step
    for got, want in zip(pw.get(state.params), ref[0]):
        for k in want:
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-3, atol=1e-5)


def test_steps_called_inside_a_program_are_one_run_equal_to_separate_steps(ctl):
    # what a `%%pathways` cell with `state, loss = pipe.step(...)` in a loop traces
    pipe, n_blocks = make_pipeline("1f1b", True, optax.adam(1e-2))
    stage_params, shared = model_params(n_blocks)
    tokens, targets, weights, positions = batch()
    state = pipe.init(stage_params, shared=shared)

    @pw.program
    def two_steps(state, tokens, targets, weights, positions):
        state, first = pipe.step(state, tokens, targets, weights=weights, positions=positions)
        state, second = pipe.step(state, tokens, targets, weights=weights, positions=positions)
        return state, first, second

    runs = len(pw.controller().runs)
    new, first, second = pw.get(two_steps(state, tokens, targets, weights, positions))
    assert len(pw.controller().runs) == runs + 1
    with pytest.raises(pw.ArgumentError, match="was donated to run .*'two_steps'"):  # the run used it up
        pipe.step(state, tokens, targets, weights=weights, positions=positions)
    one, l1 = pipe.step(pipe.init(stage_params, shared=shared), tokens, targets, weights=weights, positions=positions)
    two, l2 = pipe.step(one, tokens, targets, weights=weights, positions=positions)
    np.testing.assert_allclose([float(first), float(second)], [float(l1.result()), float(l2.result())], rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(new.params), jax.tree_util.tree_leaves(pw.get(two.params))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("schedule,chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4), ("zero_bubble", 1)])
def test_ideal_replay_equals_the_papers_bubble(schedule, chunks):
    for S in (2, 4, 8):
        for M in (S, 2 * S, 4 * S):
            ops = pw.schedule_ops(schedule, S, M, chunks)
            # one forward/backward per microbatch and stage, each slice's ops in its paper's order
            assert len([o for o in ops if o[0] == "F"]) == S * chunks * M
            r = pw.replay(ops, S, forward=1 / chunks, backward=2 / chunks)
            theory = pw.theory_bubble(schedule, S, M, chunks)
            for b in r.bubble:
                assert b == pytest.approx(theory, abs=1e-9), (S, M, r.bubble, theory)
    # 1F1B also runs fewer microbatches than stages: its warm-up is cut to M, so the bubble stays GPipe's
    for S, M in ((4, 1), (4, 3), (8, 3)):
        r = pw.replay(pw.schedule_ops("1f1b", S, M), S)
        assert r.bubble == pytest.approx([pw.theory_bubble("gpipe", S, M)] * S, abs=1e-9)
        assert r.live == tuple(min(S - i, M) for i in range(S))
    assert pw.theory_bubble("zero_bubble", 4, 8) < pw.theory_bubble("interleaved", 4, 8, 2) < pw.theory_bubble("1f1b", 4, 8)
    # ZB-H1 keeps 1F1B's activation memory on the first stage; GPipe keeps every microbatch
    assert pw.replay(pw.schedule_ops("zero_bubble", 4, 8), 4).live[0] == pw.replay(pw.schedule_ops("1f1b", 4, 8), 4).live[0] == 4
    assert pw.replay(pw.schedule_ops("gpipe", 4, 8), 4).live == (8, 8, 8, 8)


def test_stats_of_a_step_run_and_what_remat_costs(ctl):
    tokens, targets, weights, positions = batch()
    found = {}
    for remat in (True, False):
        pipe, n_blocks = make_pipeline("1f1b", remat, None, clip=None)
        state = pipe.init(*model_params(n_blocks))
        pipe.submit_step(state, tokens, targets, weights=weights, positions=positions).wait()  # compile
        run = pipe.submit_step(state, tokens, targets, weights=weights, positions=positions, mode="chained").wait()
        found[remat] = st = pipe.stats(run)
        assert st.theory == pytest.approx(3 / 7) and st.ideal.mean_bubble == pytest.approx(st.theory)
        assert [s.live for s in st.slices] == [4, 3, 2, 1]  # measured from the run's events
        assert all(0 <= s.bubble < 1 for s in st.slices) and st.span_ns > 0
        assert len(st.rows()) == 4 and st.rows()[0]["slice"] == pipe.stages[0].slice.name
    # keeping residuals holds more per microbatch, and the run's memory estimate shows it
    keep, recompute = found[False].slices, found[True].slices
    assert all(k.live_bytes > r.live_bytes for k, r in zip(keep, recompute))
    assert sum(k.reserved_bytes for k in keep) > sum(r.reserved_bytes for r in recompute)
    from pw_kernel.widgets import stats_html

    html = stats_html(list(found.values()))
    assert "bubble ideal" in html and "0.429" in html


def test_zero_bubble_splits_the_backward_into_input_and_weight_nodes(ctl):
    slices = [pw.slice(2, mesh={"data": 2}) for _ in range(4)]
    layer = lambda p, x: jnp.tanh(x @ p)  # noqa: E731
    pipe = pw.pipeline([layer] * 4, slices=slices, microbatches=4, schedule="zero_bubble")
    params = pipe.place([np.eye(8, dtype=np.float32)] * 4)
    x = np.ones((8, 8), np.float32)
    run = pipe.submit_step(params, x, x, mode="chained").wait()
    order = [e.node.split(":")[0] for e in sorted(run.events, key=lambda e: e.seq) if e.kind == "compute"]
    ops = [f"{k}{s}" for k, s, _ in pw.schedule_ops("zero_bubble", 4, 4) if (k, s) != ("B", 0)]  # stage 0 needs no input gradient
    assert [n for n in order if re.fullmatch(r"[FBW]\d", n)] == ops


def test_learning_rate_changes_take_effect(ctl):
    slices = [pw.slice(2, mesh={"data": 2}) for _ in range(2)]
    pipe = pw.pipeline([lambda p, x: x * p] * 2, slices=slices, microbatches=2, learning_rate=0.0)
    params = pipe.place([np.float32(1.0), np.float32(1.0)])
    x = np.ones((4, 2), np.float32)
    same, _ = pipe.step(params, x, 2 * x)
    np.testing.assert_allclose([float(v) for v in pw.get(same)], [1.0, 1.0])
    pipe.learning_rate = 0.1  # read at every step, not baked into the first trace
    moved, _ = pipe.step(params, x, 2 * x)
    assert all(float(v) > 1.0 for v in pw.get(moved))


def test_a_failing_stage_is_named_in_the_error(ctl):
    slices = [pw.slice(1) for _ in range(3)]  # one device each: a raising host callback must not hang collectives

    def bad(x):
        raise ValueError("stage 1 saw a bad batch")

    def layer(p, x):
        return x * p

    def failing(p, x):
        return x * p + jax.pure_callback(bad, jax.ShapeDtypeStruct(x.shape, x.dtype), jax.lax.stop_gradient(x))

    pipe = pw.pipeline([layer, failing, layer], slices=slices, microbatches=2)
    params = pipe.place([np.float32(1.0)] * 3)
    x = np.ones((4, 2), np.float32)
    loss, grads = pipe.grads(params, x, x)
    with pytest.raises(pw.NodeError) as info:
        loss.result(timeout=60)
    assert info.value.node.split(":")[0] == "F1", str(info.value)
    assert "stage 1 saw a bad batch" in str(info.value)


def test_mistakes_get_errors_that_say_what_to_do(ctl):
    slices = [pw.slice(2, mesh={"data": 2}) for _ in range(2)]
    stages = [embed, head]
    with pytest.raises(pw.PipelineError, match=re.escape("M must be a multiple of the number of slices S; got M=3 for S=2")):
        pw.pipeline(stages * 2, slices=slices, microbatches=3, schedule="interleaved")
    with pytest.raises(pw.PipelineError, match=re.escape("pass v * 2 stages for 2 slices")):
        pw.pipeline(stages, slices=slices, microbatches=4, schedule="interleaved")
    with pytest.raises(pw.PipelineError, match=re.escape("takes an optax GradientTransformation")):
        pw.pipeline(stages, slices=slices, microbatches=2, optimizer="adam")
    with pytest.raises(pw.PipelineError, match=re.escape("'embed' is used by stages [0, 5], but stages are numbered 0..1")):
        pw.pipeline(stages, slices=slices, microbatches=2, shared={"embed": (0, 5)})
    with pytest.raises(pw.PipelineError, match=re.escape("must be one of 'gpipe', '1f1b', 'interleaved', 'zero_bubble'; got 'zigzag'")):
        pw.pipeline(stages, slices=slices, microbatches=2, schedule="zigzag")
    pipe = pw.pipeline(stages, slices=slices, microbatches=2, shared={"embed": (0, 1)}, fields={"positions": (0,)})
    stage_params, shared = model_params(0)
    with pytest.raises(pw.PipelineError, match=re.escape("missing ['embed']")):
        pipe.init(stage_params)
    with pytest.raises(pw.PipelineError, match=re.escape("parameter ['step'] is int32; parameters are trained")):
        pipe.init([{**stage_params[0], "step": np.int32(0)}, stage_params[1]], shared=shared)
    state = pipe.init(stage_params, shared=shared)
    tokens, targets, weights, positions = batch()
    with pytest.raises(pw.PipelineError, match=re.escape("batch fields ['positions'] are declared in `pw.pipeline(fields=...)` but not passed")):
        pipe.step(state, tokens, targets)
    with pytest.raises(pw.PipelineError, match=re.escape("`pipeline.step(weights=...)` needs `pw.pipeline(loss=...)`")):
        pipe.step(state, tokens, targets, weights=weights, positions=positions)
    with pytest.raises(pw.PipelineError, match=re.escape("pass that PipelineState")):
        pipe.step(state.params, tokens, targets, positions=positions)
    with pytest.raises(pw.PipelineError, match=re.escape("x has shape [15, 8], whose first (batch) axis does not split into 2")):
        pipe.step(state, tokens[:15], targets[:15], positions=positions[:15])
    with pytest.raises(pw.PipelineError, match=re.escape("a batch of 6 makes microbatches of 3 examples, which do not split over the 'data' axis (2 devices)")):
        pipe.step(state, tokens[:6], targets[:6], positions=positions[:6])  # what jit would refuse, said before tracing
    weighted = pw.pipeline(stages, slices=slices, microbatches=2, loss=xent, shared={"embed": (0, 1)}, fields={"positions": (0,)})
    with pytest.raises(pw.PipelineError, match=re.escape("as loss(out, target) when no weights= is passed, but xent(logits, targets, weights) needs more")):
        weighted.step(weighted.init(stage_params, shared=shared), tokens, targets, positions=positions)


def test_a_pipeline_under_a_notebooks_set_mesh_says_what_to_do(ctl):
    # today's JAX style: a notebook sets its own Explicit mesh, then pipelines over other slices
    pipe = pw.pipeline([embed, head], slices=[pw.slice(2, mesh={"data": 2}) for _ in range(2)], microbatches=2,
                       loss=xent, shared={"embed": (0, 1)}, fields={"positions": (0,)})
    stage_params, shared = model_params(0)
    state = pipe.init(stage_params, shared=shared)
    tokens, targets, weights, positions = batch()
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    with jax.set_mesh(mesh):
        with pytest.raises(pw.PipelineError, match=re.escape("runs under `jax.set_mesh` with the mesh (x: 2, y: 4; Explicit, Explicit)")) as err:
            pipe.step(state, tokens, targets, weights=weights, positions=positions)
    assert "`jax.set_mesh(None)` clears a mesh set for the whole notebook" in str(err.value)
    state, loss = pipe.step(state, tokens, targets, weights=weights, positions=positions)  # outside it, it runs
    assert np.isfinite(float(loss.result()))


def test_forward_gives_the_models_logits_for_a_batch_or_one_prompt(ctl):
    pipe, n_blocks = make_pipeline("interleaved", True, None, clip=None)
    stage_params, shared = model_params(n_blocks)
    state = pipe.init(stage_params, shared=shared)
    tokens, _, _, positions = batch()
    h = embed(stage_params[0], tokens, embed=shared["embed"], positions=positions)
    for p in stage_params[1:-1]:
        h = block(p, h, positions=positions)
    logits = head(stage_params[-1], h, embed=shared["embed"])
    per_microbatch = pw.get(pipe.forward(state, tokens, positions=positions))
    assert len(per_microbatch) == 4
    np.testing.assert_allclose(np.concatenate(per_microbatch), logits, rtol=1e-5, atol=1e-6)
    (one,) = pw.get(pipe.forward(state, tokens[:1], positions=positions[:1]))  # too small to split: run whole
    np.testing.assert_allclose(np.asarray(one), logits[:1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("schedule,remat", [("1f1b", False), ("zero_bubble", True)])
def test_integer_leaves_inside_the_activations_flow_through(ctl, schedule, remat):
    def first(p, tokens):
        return {"h": p["e"][tokens], "segment": tokens % 3}  # segment ids travel with the activations

    def middle(p, a):
        return {"h": jnp.tanh(a["h"] @ p["w"]) * (a["segment"][..., None] + 1), "segment": a["segment"]}

    def last(p, a):
        return (a["h"] @ p["v"]).sum(-1)

    rng = np.random.default_rng(0)
    params = [{"e": rng.normal(size=(10, 4)).astype(np.float32)}, {"w": rng.normal(size=(4, 4)).astype(np.float32)},
              {"v": rng.normal(size=(4, 2)).astype(np.float32)}]
    tokens = rng.integers(0, 10, (8, 5)).astype(np.int32)
    y = rng.normal(size=(8, 5)).astype(np.float32)
    slices = [pw.slice(2, mesh={"data": 2}) for _ in range(3)]
    pipe = pw.pipeline([first, middle, last], slices=slices, microbatches=4, schedule=schedule, remat=remat)
    loss, grads = pw.get(pipe.grads(pipe.place(params), tokens, y))
    ref_loss, ref_grads = jax.value_and_grad(lambda ps: jnp.mean((last(ps[2], middle(ps[1], first(ps[0], tokens))) - y) ** 2))(params)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-4, atol=1e-6)


@pytest.mark.parametrize("schedule,remat", [("1f1b", True), ("zero_bubble", False)])
def test_dropout_from_per_example_keys_equals_the_unpipelined_model(ctl, schedule, remat):
    # typed PRNG keys (jax.random.key) as a batch field: split with the examples, never differentiated;
    # a recomputed forward draws the same mask from the same key, so the gradients match
    def dropout(key, h, i):
        keep = jax.vmap(lambda k, r: jax.random.bernoulli(jax.random.fold_in(k, i), 0.7, r.shape))(key, h)
        return jnp.where(keep, h / 0.7, 0.0)

    def first(p, tokens, *, keys):
        return dropout(keys, p["e"][tokens], 0)

    def middle(p, h, *, keys):
        return dropout(keys, jnp.tanh(h @ p["w"]), 1)

    def last(p, h):
        return (h @ p["v"]).sum(-1)

    rng = np.random.default_rng(0)
    params = [{"e": rng.normal(size=(10, 4)).astype(np.float32)}, {"w": rng.normal(size=(4, 4)).astype(np.float32)},
              {"v": rng.normal(size=(4, 2)).astype(np.float32)}]
    tokens = rng.integers(0, 10, (8, 5)).astype(np.int32)
    y = rng.normal(size=(8, 5)).astype(np.float32)
    keys = jax.random.split(jax.random.key(3), 8)
    slices = [pw.slice(2, mesh={"data": 2}) for _ in range(3)]
    pipe = pw.pipeline([first, middle, last], slices=slices, microbatches=4, schedule=schedule, remat=remat,
                       fields={"keys": (0, 1)})
    loss, grads = pw.get(pipe.grads(pipe.place(params), tokens, y, keys=keys))

    def model(ps):
        h = middle(ps[1], first(ps[0], tokens, keys=keys), keys=keys)
        return jnp.mean((last(ps[2], h) - y) ** 2)

    ref_loss, ref_grads = jax.value_and_grad(model)(params)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-4, atol=1e-6)


def test_a_stage_sharded_over_a_model_axis_keeps_its_params_and_optimizer_state_sharded(ctl):
    # pipeline x data x tensor parallel: two stages, each on a data=2 x model=2 slice, Megatron MLPs
    def mlp(p, h):
        return h + jax.nn.gelu(h @ p["w1"]) @ p["w2"]

    rng = np.random.default_rng(0)
    params = [{"w1": rng.normal(size=(D, 2 * D)).astype(np.float32) * 0.2,
               "w2": rng.normal(size=(2 * D, D)).astype(np.float32) * 0.2} for _ in range(2)]
    x, t = rng.normal(size=(B, D)).astype(np.float32), rng.normal(size=(B, D)).astype(np.float32)
    megatron = {"w1": jax.sharding.PartitionSpec(None, "model"), "w2": jax.sharding.PartitionSpec("model", None)}
    slices = [pw.slice(4, mesh={"data": 2, "model": 2}) for _ in range(2)]
    pipe = pw.pipeline([mlp, mlp], slices=slices, microbatches=2, schedule="1f1b",
                       loss=lambda y, t: jnp.mean((y - t) ** 2), optimizer=optax.adam(1e-2), param_specs=[megatron] * 2)
    state = pipe.init(params)
    loss, (grads, _) = pw.get(pipe.grads(state, x, t))
    ref_loss, ref_grads = jax.value_and_grad(lambda ps: jnp.mean((mlp(ps[1], mlp(ps[0], x)) - t) ** 2))(params)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-4, atol=1e-6)
    state, _ = pipe.step(state, x, t)
    for j in range(2):
        for tree in (state.params[j], grads[j], pw.get(state.opt_state[0].mu[j])):  # adam's mu of the whole model
            assert tree["w1"].sharding.spec == megatron["w1"] and tree["w2"].sharding.spec == megatron["w2"]


@pytest.mark.parametrize("schedule", ["1f1b", "zero_bubble"])
def test_a_pipeline_on_slices_with_explicit_axes_equals_the_unpipelined_model(ctl, schedule):
    # Explicit-axes code names its output shardings with bare PartitionSpecs, which need a context mesh:
    # each stage is traced under its own slice's mesh, which no single jax.set_mesh could give
    def mlp(p, h):
        return h + jnp.tanh(jnp.matmul(h, p["w"], out_sharding=jax.sharding.PartitionSpec("data", None)))

    def mlp_on_one_device(p, h):  # the unpipelined model: no mesh, no spec
        return h + jnp.tanh(h @ p["w"])

    rng = np.random.default_rng(0)
    params = [{"w": rng.normal(size=(D, D)).astype(np.float32) * 0.2} for _ in range(4)]
    x, t = rng.normal(size=(B, D)).astype(np.float32), rng.normal(size=(B, D)).astype(np.float32)
    slices = [pw.slice(2, mesh={"data": 2}, axis_types=jax.sharding.AxisType.Explicit) for _ in range(4)]
    pipe = pw.pipeline([mlp] * 4, slices=slices, microbatches=4, schedule=schedule,
                       loss=lambda y, t: jnp.mean((y - t) ** 2), optimizer=optax.adam(1e-2))
    loss, (grads, _) = pw.get(pipe.grads(pipe.init(params), x, t))

    def model(ps):
        h = x
        for p in ps:
            h = mlp_on_one_device(p, h)
        return jnp.mean((h - t) ** 2)

    ref_loss, ref_grads = jax.value_and_grad(model)(params)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-4, atol=1e-6)

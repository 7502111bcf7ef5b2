"""Training that survives: asynchronous checkpoints from futures, restored in new processes onto other layouts."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pw_kernel as pw
from fresh_python import run_python

ocp = pytest.importorskip("orbax.checkpoint")
optax = pytest.importorskip("optax")

# A 4-stage MLP trained with a real optax chain: what the fresh processes below rebuild from this text.
MODEL = """
import numpy as np, jax, jax.numpy as jnp, optax
import pw_kernel as pw
from jax.sharding import PartitionSpec as P

W = 16
def stage(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])

def params():
    rng = np.random.default_rng(0)
    return [{"w": rng.normal(size=(W, W)).astype(np.float32) / 4, "b": np.zeros(W, np.float32)} for _ in range(4)]

def batch(step):
    rng = np.random.default_rng(100 + step)
    return rng.normal(size=(8, W)).astype(np.float32), rng.normal(size=(8, W)).astype(np.float32)

OPT = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))
"""
exec(MODEL)  # noqa: S102 - the same model here and in the fresh processes


def four_slices():
    return [pw.slice(2, mesh={"data": 2}) for _ in range(4)]


def leaves_equal(a, b) -> None:
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_save_from_futures_returns_at_once_and_writes_what_was_saved(ctl, tmp_path):
    pipe = pw.pipeline([stage] * 4, slices=four_slices(), microbatches=4, schedule="1f1b", optimizer=OPT)
    state = pipe.init(params())
    ckpt = pw.CheckpointManager(tmp_path / "ck")
    x, y = batch(0)
    state, loss = pipe.step(state, x, y)
    assert isinstance(state.params[0]["w"], pw.Future)
    assert ckpt.save(0, {"state": state, "loss": loss, "step": 0})
    saved = state
    for k in range(1, 4):  # steps submitted after the save make new arrays: the save keeps step 0's
        state, loss = pipe.step(state, *batch(k))
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [0] and ckpt.latest_step() == 0
    back = pipe.restore(ckpt)
    leaves_equal(pw.get(saved), back)
    host = ckpt.restore()  # no target: numpy on the host, the pipeline state layout-free
    assert sorted(host) == ["loss", "state", "step"] and int(host["step"]) == 0
    assert isinstance(host["state"]["params"][0]["w"], np.ndarray)
    ckpt.close()


def test_max_to_keep_and_save_interval_steps_as_orbax_has_them(ctl, tmp_path):
    ckpt = pw.CheckpointManager(tmp_path / "ck", max_to_keep=2, save_interval_steps=3)
    x = jnp.arange(4.0)
    saved = [s for s in range(10) if ckpt.save(s, {"x": x + s})]
    ckpt.wait_until_finished()
    assert saved == [0, 3, 6, 9] and ckpt.all_steps() == [6, 9]
    assert "last finished: step 9" in ckpt.status() and "saving" not in ckpt.status()
    np.testing.assert_array_equal(ckpt.restore(6)["x"], np.arange(4.0) + 6)
    ckpt.close()


def test_restore_reshards_onto_fewer_slices_other_meshes_and_specs(ctl, tmp_path):
    pipe = pw.pipeline([stage] * 4, slices=four_slices(), microbatches=4, schedule="1f1b", optimizer=OPT)
    state = pipe.init(params())
    for k in range(3):
        state, _ = pipe.step(state, *batch(k))
    ckpt = pw.CheckpointManager(tmp_path / "ck")
    ckpt.save(3, {"state": state})
    two = [pw.slice(4, mesh={"data": 2, "model": 2}) for _ in range(2)]
    spec = {"w": P(None, "model"), "b": P()}
    other = pw.pipeline([stage] * 4, slices=two, microbatches=4, schedule="interleaved", optimizer=OPT,
                        param_specs=[spec] * 4)
    back = other.restore(ckpt)
    leaves_equal(pw.get(state), back)
    # stage j on slices[j % 2], its params and its adam moments sharded over 'model' as param_specs say
    assert set(back.params[3]["w"].sharding.device_set) == set(two[1].devices)
    assert back.params[3]["w"].sharding.spec == P(None, "model")
    adam = back.opt_state[1][0]  # chain(clip, adamw): adam's state for the whole model
    assert adam.mu[3]["w"].sharding.spec == P(None, "model") and adam.nu[3]["w"].sharding == back.params[3]["w"].sharding
    # the next step is the same step, whatever the layout
    _, l1 = pipe.step(state, *batch(3))
    _, l2 = other.step(back, *batch(3))
    np.testing.assert_allclose(float(l1.result()), float(l2.result()), rtol=1e-6)
    # the abstract state places nothing and says what restore will give
    abstract = other.abstract_state(params())
    assert isinstance(abstract.params[0]["w"], jax.ShapeDtypeStruct)
    assert abstract.opt_state[1][0].mu[3]["w"].sharding == back.params[3]["w"].sharding
    ckpt.close()


def test_a_shape_that_differs_names_the_leaf_and_both_shapes(ctl, tmp_path):
    pipe = pw.pipeline([stage] * 4, slices=four_slices(), microbatches=4, optimizer=OPT)
    ckpt = pw.CheckpointManager(tmp_path / "ck")
    ckpt.save(0, {"state": pipe.init(params())})

    def wide(p, x):
        return x @ p["w"][:, :W] + p["b"][:W]

    bigger = [{"w": np.zeros((W, 2 * W), np.float32), "b": np.zeros(2 * W, np.float32)} for _ in range(4)]
    big = pw.pipeline([wide] * 4, slices=four_slices(), microbatches=4, optimizer=OPT)
    msg = "the leaf ['state']['params'][0]['b'] was saved with shape (16,), but (32,) is expected here"
    with pytest.raises(pw.CheckpointError, match=re.escape(msg)):
        ckpt.restore(target={"state": big.abstract_state(bigger)})
    with pytest.raises(pw.CheckpointError, match=re.escape("no finished checkpoint of step 7")):
        ckpt.restore(7)
    ckpt.close()


def test_a_flax_nnx_state_with_a_list_of_layers_restores_into_itself(ctl, tmp_path):
    nnx = pytest.importorskip("flax.nnx")

    class Stack(nnx.Module):  # an `nnx.List` of layers: its state's keys are ints, which orbax writes as '0', '1'
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(4, 4, rngs=rngs) for _ in range(2)])

    _, params = nnx.split(Stack(nnx.Rngs(0)), nnx.Param)
    state = (params, optax.adam(1e-3).init(params))
    bump = pw.compiled(lambda st: jax.tree.map(lambda v: v + 1, st), slice=pw.slice(1), donate_argnums=0)
    saved = bump(state)
    ckpt = pw.CheckpointManager(tmp_path / "ck")
    ckpt.save(3, {"state": saved})
    ckpt.wait_until_finished()
    back = ckpt.restore(target={"state": state})["state"]
    want = jax.tree.leaves(pw.get(saved))
    assert [np.asarray(a).tolist() for a in jax.tree.leaves(back)] == [np.asarray(a).tolist() for a in want]
    ckpt.close()


@pytest.mark.system  # (a fresh process of its own)
def test_a_fresh_process_restores_onto_two_slices_and_trains_on_like_the_uninterrupted_run(tmp_path):
    directory = str(tmp_path / "ck")
    first = MODEL + textwrap.dedent(f"""
        slices = [pw.slice(2, mesh={{"data": 2}}) for _ in range(4)]
        pipe = pw.pipeline([stage] * 4, slices=slices, microbatches=4, schedule="1f1b", optimizer=OPT)
        state = pipe.init(params())
        ckpt = pw.CheckpointManager({directory!r}, max_to_keep=3)
        losses = []
        for step in range(8):
            state, loss = pipe.step(state, *batch(step))
            losses.append(loss)
            if step % 3 == 2:
                ckpt.save(step, {{"state": state, "step": step}})
        ckpt.wait_until_finished()
        print("LOSSES", [float(l.result()) for l in losses])
    """)
    out = run_python(first, timeout=240)
    uninterrupted = eval(out.split("LOSSES", 1)[1].strip())
    resumed = MODEL + textwrap.dedent(f"""
        slices = [pw.slice(4, mesh={{"data": 2, "model": 2}}) for _ in range(2)]
        pipe = pw.pipeline([stage] * 4, slices=slices, microbatches=4, schedule="interleaved", optimizer=OPT)
        ckpt = pw.CheckpointManager({directory!r})
        print("STEPS", ckpt.all_steps())
        state = pipe.restore(ckpt, 5)
        start = int(ckpt.restore(5)["step"]) + 1
        losses = []
        for step in range(start, 8):
            state, loss = pipe.step(state, *batch(step))
            losses.append(float(loss.result()))
        print("RESUMED", losses)
    """)
    out = run_python(resumed, timeout=240)
    assert "STEPS [2, 5]" in out
    np.testing.assert_allclose(eval(out.split("RESUMED", 1)[1].strip()), uninterrupted[6:], rtol=1e-5)


def test_a_checkpoint_written_by_pw_opens_with_plain_orbax_and_back(ctl, tmp_path):
    s = pw.slice(4, mesh={"d": 4})
    w = pw.compiled(lambda a: a * 2, slice=s, in_specs=P("d"), out_specs=P("d"))(jnp.arange(8.0))
    ckpt = pw.CheckpointManager(tmp_path / "pw")
    ckpt.save(1, {"w": w, "n": 3})
    ckpt.wait_until_finished()
    plain = ocp.CheckpointManager(tmp_path / "pw")  # what a user without pw does
    target = {"w": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=s.sharding("d")), "n": 0}
    got = plain.restore(1, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))["state"]
    np.testing.assert_array_equal(np.asarray(got["w"]), np.arange(8.0) * 2)
    plain.close()
    # and a plain orbax checkpoint of a pytree (its default item) restores into pw, onto a slice
    other = ocp.CheckpointManager(tmp_path / "orbax")
    other.save(4, args=ocp.args.StandardSave({"w": np.arange(6.0, dtype=np.float32)}))
    other.wait_until_finished()
    other.close()
    mine = pw.CheckpointManager(tmp_path / "orbax")
    back = mine.restore(4, target={"w": jax.ShapeDtypeStruct((6,), jnp.float32, sharding=s.sharding())})
    assert set(back["w"].sharding.device_set) == set(s.devices)
    np.testing.assert_array_equal(np.asarray(back["w"]), np.arange(6.0))
    ckpt.close()
    mine.close()


def test_a_save_that_fails_is_reported_once_and_the_last_checkpoint_stays(ctl, tmp_path):
    s = pw.slice(1)
    ok = pw.compiled(lambda a: a + 1, slice=s)(jnp.zeros(3))
    ckpt = pw.CheckpointManager(tmp_path / "ck")
    ckpt.save(1, {"x": ok})

    def boom(a):
        raise ValueError("sensor offline")

    bad = pw.compiled(lambda a: jax.pure_callback(boom, jax.ShapeDtypeStruct(a.shape, a.dtype), a), slice=s)(ok)
    ckpt.save(2, {"x": bad})
    with pytest.raises(pw.CheckpointError, match=re.escape("checkpoint of step 2")) as info:
        ckpt.wait_until_finished()
    assert "sensor offline" in str(info.value) and "the last finished checkpoint (step 1) is intact" in str(info.value)
    ckpt.wait_until_finished()  # reported once
    assert ckpt.all_steps() == [1]
    np.testing.assert_array_equal(ckpt.restore()["x"], np.ones(3))
    ckpt.close()


def kill_while_saving(directory: str) -> list[str]:
    """Save step 1, then kill the process (SIGKILL) while orbax writes step 2; the folders it was writing."""
    script = textwrap.dedent(f"""
        import sys, numpy as np, jax.numpy as jnp
        import pw_kernel as pw
        ckpt = pw.CheckpointManager({directory!r})
        ckpt.save(1, {{"w": jnp.arange(1000.0)}})
        ckpt.wait_until_finished()
        big = np.ones((64, 1024, 1024), np.float32)   # 256 MiB: seconds to write
        ckpt.save(2, {{"w": big}})
        print("SAVING", flush=True)
        ckpt.wait_until_finished()
        print("FINISHED", flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "SAVING"
    # Kill it once orbax is writing step 2 (its temporary directory exists), before the commit.
    deadline = time.monotonic() + 60
    while not any(n.startswith("2.") for n in os.listdir(directory)) and time.monotonic() < deadline:
        time.sleep(0.001)
    writing = [n for n in os.listdir(directory) if n.startswith("2.")]
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    child.stdout.close()
    assert writing, "the child was killed before it started writing step 2"
    return writing


@pytest.mark.system  # (a process of its own, killed)
def test_a_process_killed_while_saving_leaves_the_last_finished_checkpoint_whole(tmp_path):
    directory = str(tmp_path / "ck")
    kill_while_saving(directory)
    left = os.listdir(directory)
    assert "1" in left and "2" not in left, left  # step 2 never committed
    out = run_python(textwrap.dedent(f"""
        import numpy as np, pw_kernel as pw
        ckpt = pw.CheckpointManager({directory!r})
        w = ckpt.restore()["w"]
        print(ckpt.latest_step(), ckpt.all_steps(), float(w.sum()))
    """))
    assert out.split() == ["1", "[1]", str(float(np.arange(1000.0).sum()))]


def test_the_next_start_after_a_killed_save_clears_what_it_left_and_says_nothing(ctl, tmp_path, caplog):
    directory = str(tmp_path / "ck")
    writing = kill_while_saving(directory)
    assert set(os.listdir(directory)) == {"1", *writing} and all(".orbax-checkpoint-tmp" in n for n in writing)
    caplog.set_level(logging.WARNING)  # orbax warns through absl's logger when it finds a leftover
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = pw.CheckpointManager(directory)  # the next start
        assert sorted(os.listdir(directory)) == ["1"]
        ckpt.save(2, {"w": np.arange(3.0)})  # the step that was cut short, saved again
        ckpt.wait_until_finished()
    assert [str(w.message) for w in caught] == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert ckpt.all_steps() == [1, 2]
    np.testing.assert_array_equal(ckpt.restore(2)["w"], np.arange(3.0))
    np.testing.assert_array_equal(ckpt.restore(1)["w"], np.arange(1000.0))
    # A second manager opened while the first may be saving leaves its temporary folders alone.
    os.mkdir(os.path.join(directory, "3.orbax-checkpoint-tmp"))  # as if the first were writing step 3 now
    reader = pw.CheckpointManager(directory)
    assert reader.all_steps() == [1, 2] and "3.orbax-checkpoint-tmp" in os.listdir(directory)
    reader.close()
    ckpt.close()
    pw.CheckpointManager(directory).close()  # no one else has it open: the leftover goes
    assert sorted(os.listdir(directory)) == ["1", "2"]


def test_a_target_of_arrays_futures_and_numbers_gives_each_back_as_its_kind(ctl, tmp_path):
    s = pw.slice(4, mesh={"d": 4})
    w = pw.compiled(lambda a: a * 2, slice=s, in_specs=P("d"), out_specs=P("d"))(jnp.arange(8.0))
    opt = optax.adam(1e-2)
    params = {"b": jnp.arange(3.0)}
    opt_state = opt.update(params, opt.init(params), params)[1]  # moments that are not zeros
    ckpt = pw.CheckpointManager(tmp_path / "ck")
    ckpt.save(7, {"w": w, "params": params, "opt_state": opt_state, "step": 7, "lr": 0.25, "done": True,
                  "scale": np.float32(1.5)})
    # a new run's state, as its first cell makes it: what each leaf comes back as
    w0 = pw.compiled(lambda a: a * 0, slice=s, in_specs=P("d"), out_specs=P("d"))(jnp.arange(8.0))
    fresh = {"b": jnp.zeros(3)}
    back = ckpt.restore(7, target={"w": w0, "params": fresh, "opt_state": opt.init(fresh), "step": 0, "lr": 0.0,
                                   "done": False, "scale": np.float32(0)})
    np.testing.assert_array_equal(np.asarray(back["w"]), np.arange(8.0) * 2)
    assert back["w"].sharding == w0.sharding
    leaves_equal(back["opt_state"], opt_state)
    assert back["opt_state"][0].mu["b"].shape == (3,)  # an optax state, as the target's
    assert (back["step"], back["lr"], back["done"]) == (7, 0.25, True)
    assert [type(back[k]) for k in ("step", "lr", "done", "scale")] == [int, float, bool, np.float32]
    assert back["scale"] == np.float32(1.5)
    # without a target: numbers as they were saved, the optax state as optax's named tuples
    host = ckpt.restore(7)
    assert (host["step"], host["lr"], host["done"]) == (7, 0.25, True)
    assert [type(host[k]) for k in ("step", "lr", "done", "scale")] == [int, float, bool, np.float32]
    assert type(host["opt_state"]) is tuple and isinstance(host["opt_state"][1], optax.EmptyState)
    np.testing.assert_array_equal(host["opt_state"][0].mu["b"], np.asarray(opt_state[0].mu["b"]))
    assert int(host["opt_state"][0].count) == 1
    ckpt.close()


def test_a_data_parallel_run_and_a_pipeline_restore_the_same_way(ctl, tmp_path):
    ckpt = pw.CheckpointManager(tmp_path / "ck")
    # data parallel: params replicated on a slice, the batch split over its data axis
    s = pw.slice(4, mesh={"data": 4})

    def loss_fn(p, x, y):
        return jnp.mean((jnp.tanh(x @ p["w"] + p["b"]) - y) ** 2)

    def train_step(p, o, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        updates, o = OPT.update(g, o, p)
        return optax.apply_updates(p, updates), o, loss

    dp_step = pw.compiled(train_step, slice=s)
    on_data = lambda a: jax.device_put(a, s.sharding("data"))  # noqa: E731
    p = jax.device_put(params()[0], s.sharding())
    o = OPT.init(p)
    for k in range(2):
        p, o, _ = dp_step(p, o, *map(on_data, batch(k)))
    ckpt.save(2, {"params": p, "opt_state": o, "step": 2})
    # a pipeline: 4 stages on 4 slices
    pipe = pw.pipeline([stage] * 4, slices=four_slices(), microbatches=4, schedule="1f1b", optimizer=OPT)
    state = pipe.init(params())
    for k in range(2):
        state, _ = pipe.step(state, *batch(k))
    ckpt.save(3, {"state": state, "step": 3})
    ckpt.wait_until_finished()

    # restored the same way: a target that stands for each part of the state
    fresh = jax.device_put(params()[1], s.sharding())
    dp = ckpt.restore(2, target={"params": fresh, "opt_state": OPT.init(fresh), "step": 0})
    other = pw.pipeline([stage] * 4, slices=[pw.slice(4, mesh={"data": 2, "model": 2}) for _ in range(2)], microbatches=4,
                        schedule="interleaved", optimizer=OPT)
    pp = ckpt.restore(3, target={"state": other, "step": 0})
    assert dp["step"] == 2 and pp["step"] == 3 and type(pp["step"]) is int
    leaves_equal(dp["params"], p)
    leaves_equal(dp["opt_state"], o)
    assert isinstance(pp["state"], pw.PipelineState)
    leaves_equal(pp["state"], pw.get(state))
    leaves_equal(pp["state"], other.restore(ckpt, 3))  # the pipeline's own restore gives the same state
    assert set(pp["state"].params[1]["w"].sharding.device_set) == set(other.stages[1].slice.devices)
    # and each trains on as the run it came from
    _, _, l1 = dp_step(p, o, *map(on_data, batch(2)))
    _, _, l2 = dp_step(dp["params"], dp["opt_state"], *map(on_data, batch(2)))
    np.testing.assert_allclose(float(l2.result()), float(l1.result()), rtol=1e-6)
    _, l1 = pipe.step(state, *batch(2))
    _, l2 = other.step(pp["state"], *batch(2))
    np.testing.assert_allclose(float(l2.result()), float(l1.result()), rtol=1e-6)
    with pytest.raises(pw.CheckpointError, match=re.escape(
        "the target at ['step'] is the pipeline 'pipeline', but no pipeline state was saved there; "
        "pipeline states are at [\"['state']\"]"
    )):
        ckpt.restore(3, target={"state": None, "step": other})
    ckpt.close()


def test_a_data_iterator_resumes_at_the_batch_the_loop_had_reached(ctl, tmp_path):
    grain = pytest.importorskip("grain")
    ds = grain.MapDataset.range(100).map(lambda i: np.full((2,), i, np.int32)).batch(4)
    it = iter(ds)
    ckpt = pw.CheckpointManager(tmp_path / "ck")
    seen = [next(it) for _ in range(3)]
    ckpt.save(3, {"data": it, "step": 3})
    after = [np.asarray(next(it)) for _ in range(2)]
    ckpt.wait_until_finished()
    fresh = iter(ds)
    back = ckpt.restore(target={"data": fresh, "step": None})  # None: as it was saved, on the host
    assert back["data"] is fresh and int(back["step"]) == 3
    leaves_equal(after, [next(fresh) for _ in range(2)])
    assert int(seen[-1][0][0]) == 8  # the third batch started at 8; the restored iterator goes on at 12

    def gen():
        yield from range(3)

    with pytest.raises(pw.CheckpointError, match="a plain generator cannot say where it is"):
        ckpt.save(4, {"data": gen()})
    ckpt.close()


def test_a_script_that_ends_while_a_save_is_in_flight_says_which_steps_are_not_on_disk(tmp_path):
    # Python stops the thread pools orbax writes with before exit hooks run, so a save
    # in flight at exit cannot finish; what must never happen is a silent gap.
    code = textwrap.dedent(f"""
        import numpy as np, pw_kernel as pw
        s = pw.slice(2)
        ckpt = pw.CheckpointManager({str(tmp_path / "ck")!r})
        ckpt.save(0, {{"w": np.ones((64, 1024, 1024), np.float32)}})   # 256 MiB: still writing at exit
    """)
    _, err = run_python(code, stderr=True)
    on_disk = (tmp_path / "ck" / "0").is_dir()
    said = "the process ended before step(s) [0] were written" in err
    assert on_disk != said, (on_disk, err[-2000:])
    if said:
        assert "Call ckpt.wait_until_finished() before a script ends" in err

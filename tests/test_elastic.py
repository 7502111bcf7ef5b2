"""A lost island mid-training: the runs that need it fail naming it, and training goes on from the last checkpoint."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw
from remote_islands import kill_islands

ray = pytest.importorskip("ray")
pytest.importorskip("orbax.checkpoint")
pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

W = 8


def layer(p, x):
    return jnp.tanh(x @ p)


def params():
    rng = np.random.default_rng(0)
    return [rng.normal(size=(W, W)).astype(np.float32) / 3 for _ in range(2)]


def batch(step):
    rng = np.random.default_rng(10 + step)
    return rng.normal(size=(8, W)).astype(np.float32), rng.normal(size=(8, W)).astype(np.float32)


@pytest.fixture
def cluster(ray_cluster):
    c = pw.init(pw.Config(validate=True))
    yield
    kill_islands(ray, c)


def test_losing_an_island_mid_training_goes_on_from_the_last_checkpoint(cluster, tmp_path):
    (remote,) = pw.add_ray_islands(count=1, devices_per_island=4)
    local = pw.slice(2, mesh={"data": 2})

    def slices_now():  # stage 1 on the remote island while it lives, then on local devices
        return [local, pw.slice(2, mesh={"data": 2}, island=remote.id) if not remote.lost else pw.slice(2, mesh={"data": 2})]

    ckpt = pw.CheckpointManager(tmp_path / "ck")
    losses: dict[int, float] = {}
    retries = []

    @pw.elastic_retry(manager=ckpt, on_retry=lambda k, e: retries.append(e))
    def run():  # what a user's training cell would be: build from what is alive, restore, train on
        pipe = pw.pipeline([layer, layer], slices=slices_now(), microbatches=4, schedule="1f1b")
        start = ckpt.latest_step()
        state = pipe.init(params()) if start is None else pipe.restore(ckpt)
        for step in range(0 if start is None else start + 1, 20):
            state, loss = pipe.step(state, *batch(step))
            if step % 5 == 0:
                ckpt.save(step, {"state": state})
            if step == 12 and not retries:
                # The island dies while the loop runs, once step 10's checkpoint is written (it is
                # written from futures in the background: killed sooner, the retry starts from 5).
                ckpt.wait_until_finished()
                ray.kill(remote.remote.actor)
            losses[step] = float(loss.result(timeout=120))
        ckpt.wait_until_finished()

    run()
    assert len(retries) == 1 and remote.lost and "lost" in repr(pw.islands()[-1])
    assert re.search(rf"island {remote.id} \(Ray actor on", str(retries[0]))
    with pytest.raises(pw.IslandLostError, match=re.escape(f"island {remote.id}")):
        pw.slice(2, island=remote.id)
    assert ckpt.all_steps() == [0, 5, 10, 15]  # 10 before the loss; 15 after the restore from 10
    # the same 20 steps on local slices, uninterrupted: the losses after the restore are the same
    pw.init(pw.Config(validate=True))
    reference: dict[int, float] = {}
    pipe = pw.pipeline([layer, layer], slices=[pw.slice(2, mesh={"data": 2}) for _ in range(2)], microbatches=4)
    state = pipe.init(params())
    for step in range(20):
        state, loss = pipe.step(state, *batch(step))
        reference[step] = float(loss.result())
    np.testing.assert_allclose([losses[s] for s in range(11, 20)], [reference[s] for s in range(11, 20)], rtol=1e-5)

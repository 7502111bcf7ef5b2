"""Checkpoints of state on a remote (Ray) island: the island writes and reads its own shards.

No array bytes of the remote stage pass through the controller, neither when
saving nor when restoring onto a remote slice of another layout; the island's
part is a plain orbax item that a fresh process without Ray opens.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pw_kernel as pw
from remote_islands import kill_islands
from fresh_python import run_python

ray = pytest.importorskip("ray")
ocp = pytest.importorskip("orbax.checkpoint")
pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

W = 8


def layer(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])


def params():
    rng = np.random.default_rng(0)
    return [{"w": rng.normal(size=(W, W)).astype(np.float32) / 3, "b": np.zeros(W, np.float32)} for _ in range(2)]


def batch(step):
    rng = np.random.default_rng(10 + step)
    return rng.normal(size=(8, W)).astype(np.float32), rng.normal(size=(8, W)).astype(np.float32)


@pytest.fixture
def island(ray_cluster):
    c = pw.init(pw.Config(validate=True))
    (remote,) = pw.add_ray_islands(count=1, devices_per_island=4)
    yield remote
    kill_islands(ray, c)


@pytest.fixture
def fetches(monkeypatch):
    """Every time array bytes come from an island to this process (`RemoteArray.fetch` is the only way)."""
    seen: list = []
    real = pw.RemoteArray.fetch

    def counting(self):
        seen.append(self)
        return real(self)

    monkeypatch.setattr(pw.RemoteArray, "fetch", counting)
    return seen


def train(pipe, state, steps):
    for step in steps:
        state, loss = pipe.step(state, *batch(step))
    return state, float(loss.result(timeout=120))


def test_the_island_writes_and_reads_its_own_shards(island, fetches, tmp_path):
    local = pw.slice(2, mesh={"data": 2})
    far = pw.slice(2, mesh={"data": 2}, island=island.id)
    pipe = pw.pipeline([layer, layer], slices=[local, far], microbatches=4, learning_rate=0.1)
    state, _ = train(pipe, pipe.init(params()), range(3))
    w_remote = state.params[1]["w"]
    assert w_remote.remote_array() is not None  # it lives on the island

    ckpt = pw.CheckpointManager(tmp_path / "ck")
    fetches.clear()
    ckpt.save(3, {"state": state})
    ckpt.wait_until_finished()
    assert fetches == []  # the island wrote stage 1's params itself
    step_dir = tmp_path / "ck" / "3"
    assert sorted(p.name for p in step_dir.iterdir() if p.is_dir()) == ["data", "island_0", "state"]

    # Restored onto the island again, on a slice of another layout and spec: read there.
    far4 = pw.slice(4, mesh={"model": 4}, island=island.id)
    pipe2 = pw.pipeline(
        [layer, layer], slices=[pw.slice(2, mesh={"data": 2}), far4], microbatches=4, learning_rate=0.1,
        param_specs=[None, {"w": P(None, "model"), "b": P()}],
    )
    fetches.clear()
    restored = pipe2.restore(ckpt)
    w = restored.params[1]["w"]
    assert isinstance(w, pw.RemoteArray) and w.slice is far4 and w.sharding.spec == P(None, "model")
    assert fetches == []  # the island read its leaves itself
    w_saved = np.asarray(w)  # brought here on purpose, to compare (the counter has been read)
    _, loss_restored = train(pipe2, restored, [3, 4])
    # Training on: activations' gradients and the loss cross to stage 0; no parameter.
    assert not [f for f in fetches[1:] if f.shape in ((W, W), (W,))]

    # The same two steps from the state that was saved: the same loss.
    _, loss_uninterrupted = train(pipe, state, [3, 4])
    np.testing.assert_allclose(loss_restored, loss_uninterrupted, rtol=1e-6)

    # Plain orbax opens the island's item; `state` holds None where the island's leaves were.
    plain = ocp.CheckpointManager(tmp_path / "ck")
    got = plain.restore(3, args=ocp.args.Composite(island_0=ocp.args.StandardRestore()))["island_0"]
    assert any(np.array_equal(v, w_saved) for v in got.values())
    plain.close()
    ckpt.close()


def test_a_fresh_process_without_ray_restores_the_islands_part_onto_local_slices(island, tmp_path):
    far = pw.slice(2, mesh={"data": 2}, island=island.id)
    pipe = pw.pipeline([layer, layer], slices=[pw.slice(2, mesh={"data": 2}), far], microbatches=4)
    state, _ = train(pipe, pipe.init(params()), range(2))
    with pw.CheckpointManager(tmp_path / "ck") as ckpt:
        ckpt.save(2, {"state": state})
    _, loss = train(pipe, state, [2])
    out = run_python(
        f"""
import jax.numpy as jnp, numpy as np
import pw_kernel as pw
{_source_of_model()}
pipe = pw.pipeline([layer, layer], slices=[pw.slice(2), pw.slice(2)], microbatches=4)
state = pipe.restore(pw.CheckpointManager({str(tmp_path / "ck")!r}))
state, loss = pipe.step(state, *batch(2))
print(float(loss.result()))
"""
    )
    assert float(out.split()[-1]) == pytest.approx(loss, rel=1e-6)
    assert os.path.isdir(tmp_path / "ck" / "2" / "island_0")


def _source_of_model() -> str:
    import inspect

    return "W = 8\n" + "\n".join(inspect.getsource(f) for f in (layer, batch))

"""Checkpoints: how long `save` blocks the notebook, write and read throughput against plain orbax, a loop that saves.

    python benchmarks/checkpoint.py [--sizes 10,100,1000] [--rounds 3] [--steps 40] [--json out.json] [--quick]

- blocked: the time `pw.CheckpointManager.save(step, tree)` holds the caller, for a
  state of 10 MB, 100 MB and 1 GB of futures on an 8-device slice (target: under
  10 ms whatever the size; the writing happens on the manager's own thread).
- throughput: bytes per second of a whole save (submitted to committed) and of a
  restore onto the same sharding, pw against plain `ocp.CheckpointManager` with
  `StandardSave` / `StandardRestore` of the same arrays, interleaved round by round
  in this one process, at the two largest sizes (target: pw >= 0.9x orbax at the
  largest). pw adds a fixed cost per checkpoint (its JSON item, reading the step's
  metadata to name a leaf that does not fit): about 10 ms, which shows at 100 MB.
- loop: a data-parallel training step looped `--steps` times, saving every 5 steps,
  against the same loop without saves (target: >= 0.95x the steps per second).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import common


def _state(s, mb: int):
    """A tree of futures of about ``mb`` MB on slice ``s``: 8 float32 matrices split over its data axis."""
    rows = max(8, int(mb * 2**20 / 4 / 8 / 1024) // 8 * 8)
    make = pw.compiled(lambda k: jnp.full((rows, 1024), k, jnp.float32), slice=s, out_specs=P("data"), static_argnums=0)
    return {f"w{i}": make(float(i)) for i in range(8)}


def blocked(s, sizes: list[int], rounds: int, root: str) -> list[dict]:
    rows = []
    for mb in sizes:
        state = _state(s, mb)
        pw.get(state)
        nbytes = sum(int(np.prod(v.shape)) * 4 for v in state.values())
        ckpt = pw.CheckpointManager(f"{root}/blocked{mb}", max_to_keep=1)
        times = []
        for r in range(rounds):
            fresh = {k: pw.compiled(lambda a: a + 1, slice=s)(v) for k, v in state.items()}  # futures, not yet done
            t = time.perf_counter()
            ckpt.save(r, {"state": fresh})
            times.append(time.perf_counter() - t)
            ckpt.wait_until_finished()
        ckpt.close()
        rows.append({"mb": nbytes / 2**20, "blocked_ms": common.Stat.of(times, 1e3).as_dict()})
        print(f"blocked  {nbytes / 2**20:7.0f} MB: save() returned in {rows[-1]['blocked_ms']['median']:.2f} ms (median)")
    print(f"blocked  (the latency of each save() call, {rounds} calls a size: not a timed window)")
    return rows


def throughput(s, mb: int, rounds: int, root: str) -> dict:
    import orbax.checkpoint as ocp

    state = pw.get(_state(s, mb))
    nbytes = sum(v.nbytes for v in state.values())
    target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in state.items()}
    mine = pw.CheckpointManager(f"{root}/pw{mb}", max_to_keep=1)
    plain = ocp.CheckpointManager(f"{root}/orbax{mb}", options=ocp.CheckpointManagerOptions(max_to_keep=1))
    step = {"pw": 0, "orbax": 0}

    def pw_save():
        step["pw"] += 1
        mine.save(step["pw"], state)
        mine.wait_until_finished()

    def orbax_save():
        step["orbax"] += 1
        plain.save(step["orbax"], args=ocp.args.StandardSave(state))
        plain.wait_until_finished()

    saves = common.interleaved({"pw": pw_save, "orbax": orbax_save}, rounds, warmup=1)
    reads = common.interleaved(
        {
            "pw": lambda: jax.block_until_ready(mine.restore(target=target)),
            "orbax": lambda: jax.block_until_ready(plain.restore(plain.latest_step(), args=ocp.args.StandardRestore(target))),
        },
        rounds,
        warmup=1,
    )
    mine.close()
    plain.close()
    window = common.window_note(min(common.window(saves), common.window(reads)))
    print(f"{'':8s} {nbytes / 2**20:5.0f} MB: save and restore {window}")
    out = {"mb": nbytes / 2**20}
    for what, samples in (("save", saves), ("restore", reads)):
        med = {k: common.Stat.of(v).median for k, v in samples.items()}
        out[what] = {k: nbytes / 2**20 / t for k, t in med.items()}  # MB/s
        out[what]["ratio"] = med["orbax"] / med["pw"]
        print(f"{what:8s} {out['mb']:5.0f} MB: pw {out[what]['pw']:7.1f} MB/s, orbax {out[what]['orbax']:7.1f} MB/s, "
              f"pw/orbax {out[what]['ratio']:.2f}x")
    return out


def loop(s, steps: int, width: int, root: str) -> dict:
    import optax

    opt = optax.adam(1e-3)

    @pw.compiled(slice=s, in_specs=(P(), P(), P("data"), P("data")))
    def train_step(w, o, x, y):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((jnp.tanh(x @ w) - y) ** 2))(w)
        u, o = opt.update(g, o, w)
        return optax.apply_updates(w, u), o, loss

    rng = np.random.default_rng(0)
    x = jax.device_put(rng.normal(size=(256, width)).astype(np.float32), s.sharding("data"))
    y = jax.device_put(rng.normal(size=(256, width)).astype(np.float32), s.sharding("data"))
    w0 = jax.device_put(rng.normal(size=(width, width)).astype(np.float32) / 30, s.sharding())
    o0 = jax.device_put(opt.init(w0), s.sharding())
    ckpt = pw.CheckpointManager(f"{root}/loop", max_to_keep=2)

    def run(save: bool):
        w, o = w0, o0
        for k in range(steps):
            w, o, loss = train_step(w, o, x, y)
            if save and k % 5 == 0:
                ckpt.save(k + run.base, {"w": w, "opt": o, "loss": loss}, force=True)
        loss.result()
        if save:
            ckpt.wait_until_finished()
            run.base += steps

    run.base = 0
    samples = common.interleaved({"saves": lambda: run(True), "none": lambda: run(False)}, 3, warmup=1)
    ckpt.close()
    med = {k: common.Stat.of(v).median for k, v in samples.items()}
    out = {"steps": steps, "mb_per_save": 2 * width * width * 4 * 3 / 2**20,
           "steps_per_s": {k: steps / t for k, t in med.items()}, "ratio": med["none"] / med["saves"]}
    print(f"loop     {steps} steps, a save every 5: {out['ratio']:.3f}x the steps/s of the loop without saves")
    print(f"loop     ({common.window_note(common.window(samples))})")
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,100,1000", help="state sizes in MB for the blocked-time rows")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--json", default=None)
    args = common.parse_args(ap, argv, quick={"sizes": "1,4", "rounds": 2, "steps": 10, "width": 128})
    why = common.missing("orbax.checkpoint") or common.missing("optax")
    if why:
        return common.skipped(args.json, "checkpoint", why)
    n = common.fit(8)  # a data axis of 8, or of the devices present (the arrays still split evenly)
    note = common.fewer_devices("checkpoint", 8, n)
    s = pw.slice(n, mesh={"data": n}, name="ckpt")
    root = tempfile.mkdtemp(prefix="pw-ckpt-bench-")
    try:
        sizes = [int(v) for v in args.sizes.split(",")]
        rows = blocked(s, sizes, args.rounds, root)
        tp = [throughput(s, mb, args.rounds, root) for mb in sizes[-2:]]  # the two largest: fixed costs fade
        lp = loop(s, args.steps, args.width, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    worst = max(r["blocked_ms"]["median"] for r in rows)
    targets = [
        common.target("checkpoint: save() blocks the caller (worst size)", worst, 10.0, unit=" ms"),
        common.target("checkpoint: save throughput / plain orbax (largest)", tp[-1]["save"]["ratio"], 0.9, below=False,
                      unit="x"),
        common.target("checkpoint: restore throughput / plain orbax (largest)", tp[-1]["restore"]["ratio"], 0.9,
                      below=False, unit="x"),
        common.target("checkpoint: loop saving every 5 steps / no saves", lp["ratio"], 0.95, below=False, unit="x"),
    ]
    result = {"benchmark": "checkpoint", "machine": common.machine(), "devices": n, "note": note,
              "blocked": rows, "throughput": tp, "loop": lp,
              "targets": targets}
    return common.finish(args.json, result)


if __name__ == "__main__":
    main()

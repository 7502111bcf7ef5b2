"""Pipelines: measured bubble vs (S-1)/(M+S-1), peak live activations per stage, throughput vs SPMD.

    python benchmarks/pipeline.py [--stages 4] [--width 512] [--json out.json] [--quick]

An MLP of S stages (one tanh layer each) on S slices of 8/S devices, trained
with GPipe and 1F1B for several microbatch counts M. From the event log of
each step: per stage, busy time over the step's span (bubble = 1 - that), and
the most microbatches whose forward has finished but whose backward has not
(live activations). Reference: the same model data-parallel (SPMD) over all
8 devices as one `jax.jit` of value_and_grad + SGD.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import common


def layer(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])


def step_stats(run, stages: int):
    evs = [e for e in run.events if e.kind == "compute" and e.node[0] in "FB"]
    by_stage: dict[int, list] = {s: [] for s in range(stages)}
    for e in evs:
        by_stage[int(e.node[1:].split(":")[0])].append(e)
    t0 = min(e.start for e in evs)
    t1 = max(e.end for e in evs)
    span = t1 - t0
    bubbles, live_peaks = [], []
    for s, es in by_stage.items():
        busy = sum(e.end - e.start for e in es)
        bubbles.append(1 - busy / span)
        # live activations: +1 when a forward ends, -1 when its backward ends
        marks = sorted([(e.end, 1 if e.node.startswith("F") else -1) for e in es])
        live = peak = 0
        for _, d in marks:
            live += d
            peak = max(peak, live)
        live_peaks.append(peak)
    return statistics.mean(bubbles), live_peaks, span / 1e9


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--micro", default="4,8,16")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = common.parse_args(ap, argv, {"stages": 2, "width": 64, "batch": 32, "micro": "4", "steps": 1})
    S, W, B = args.stages, args.width, args.batch
    c = pw.init()
    n_dev = len(c.devices)
    rng = np.random.default_rng(0)
    params = [{"w": rng.normal(size=(W, W)).astype(np.float32) / np.sqrt(W), "b": np.zeros(W, np.float32)} for _ in range(S)]
    x = rng.normal(size=(B, W)).astype(np.float32)
    y = rng.normal(size=(B, W)).astype(np.float32)
    slices = [pw.slice(n_dev // S, mesh={"data": n_dev // S}, name=f"stage{i}") for i in range(S)]

    rows = []
    for schedule in ("gpipe", "1f1b"):
        for M in [int(m) for m in args.micro.split(",")]:
            if schedule == "1f1b" and M < S:
                continue
            pipe = pw.pipeline([layer] * S, slices=slices, microbatches=M, schedule=schedule, name=f"{schedule}{M}")
            p = pipe.place(params)
            pipe.submit_step(p, x, y, mode="chained").wait()  # compile
            stats, walls = [], []
            for _ in range(args.steps):
                t = time.perf_counter()
                run = pipe.submit_step(p, x, y, mode="chained")
                run.wait()
                walls.append(time.perf_counter() - t)
                stats.append(step_stats(run, S))
            bubble = statistics.median(s[0] for s in stats)
            peaks = [max(s[1][i] for s in stats) for i in range(S)]
            wall = statistics.median(walls)
            rows.append({
                "schedule": schedule, "M": M, "bubble": bubble, "theory": (S - 1) / (M + S - 1),
                "live_peak_per_stage": peaks, "samples_per_s": B / wall,
            })

    # SPMD reference: the whole model data-parallel over all devices.
    mesh = jax.sharding.Mesh(np.array(c.devices), ("data",))
    rep, dat = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def loss(ps, x, y):
        h = x
        for q in ps:
            h = layer(q, h)
        return jnp.mean((h - y) ** 2)

    @jax.jit
    def sgd(ps, x, y):
        val, g = jax.value_and_grad(loss)(ps, x, y)
        return jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, ps, g), val

    ps = jax.device_put(params, rep)
    xs, ys = jax.device_put(x, dat), jax.device_put(y, dat)
    jax.block_until_ready(sgd(ps, xs, ys))
    walls = []
    for _ in range(args.steps):
        t = time.perf_counter()
        jax.block_until_ready(sgd(ps, xs, ys))
        walls.append(time.perf_counter() - t)
    spmd = B / statistics.median(walls)

    print(f"pipeline: S={S} stages of {n_dev // S} devices, width {W}, batch {B}, {jax.devices()[0].platform}")
    print(f"{'schedule':>8} {'M':>3} {'bubble':>7} {'theory':>7} {'live/stage':>14} {'samples/s':>10} {'vs SPMD':>8}")
    for r in rows:
        print(f"{r['schedule']:>8} {r['M']:>3} {r['bubble']:>7.2f} {r['theory']:>7.2f} "
              f"{str(r['live_peak_per_stage']):>14} {r['samples_per_s']:>10,.0f} {r['samples_per_s'] / spmd:>8.2f}")
    print(f"SPMD data-parallel over {n_dev} devices: {spmd:,.0f} samples/s")
    result = {
        "benchmark": "pipeline", "platform": jax.devices()[0].platform, "jax": jax.__version__,
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
        "stages": S, "width": W, "batch": B, "rows": rows, "spmd_samples_per_s": spmd,
    }
    common.write_json(args.json, result)
    pw.shutdown()
    return result


if __name__ == "__main__":
    main()

"""Memory: the largest pipelined model that fits a device's memory limit, pw against plain JAX's donated step.

    python benchmarks/memory.py [--width 512] [--stages 2] [--micro 4] [--batch 32] [--limit-mb 64] [--json out.json] [--quick]

A model of layers of a fixed width (``tanh(h @ w + b)``), split evenly over
``--stages`` one-device slices, trained with adam, gpipe schedule. For a number
of layers per stage, what each side needs on its most loaded device:

- pw: the state the device holds (params and adam's moments), plus what the
  step's plan reserves there (the run's own allocations: activations kept for
  the backward, gradient sums, transfers, the update's outputs less the buffers
  it reuses), the figure admission control admits a run by; with the update's
  donation (the default) and without (``pw.pipeline(donate=False)``).
- plain JAX: the same stage's training step as one `jax.jit` on that device with
  ``donate_argnums`` for params and adam's state (a scan over the microbatches'
  stage inputs and output gradients, then adam), sized by XLA's own memory
  analysis: arguments + outputs - aliased + temporaries.

The largest layer count whose need fits ``--limit-mb`` is found by bisection;
target: pw's largest >= 0.95x plain JAX's. Where the backend reports memory
(GPU: ``device.memory_stats()``), each candidate's step is then run at its
largest size in a fresh process of its own (this script with ``--measure``:
nothing else ever allocated there, so the device's ``peak_bytes_in_use`` is
that candidate's), and the measured peak is set beside the estimate; the CPU
reports none, and the table says so (``--fresh always`` runs the processes anyway).

On fewer devices than ``--stages``, the stages are as many as the devices
(one a device), and the table says so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
import jax
import jax.numpy as jnp
import numpy as np
import optax

import common


def layer_stack(p, h):
    for w, b in zip(p["w"], p["b"]):
        h = jnp.tanh(h @ w + b)
    return h


def stage_params(layers: int, width: int, stages: int) -> list[dict]:
    rng = np.random.default_rng(0)
    return [{"w": (rng.normal(size=(layers, width, width)) / np.sqrt(width)).astype(np.float32),
             "b": np.zeros((layers, width), np.float32)} for _ in range(stages)]


def _bytes_by_device(tree) -> dict[int, int]:
    out: dict[int, int] = {}
    for a in jax.tree_util.tree_leaves(tree):
        for shard in a.addressable_shards:
            out[shard.device.id] = out.get(shard.device.id, 0) + shard.data.nbytes
    return out


def pw_need(slices, layers: int, a) -> tuple[int, dict]:
    """Bytes pw needs on its most loaded device: resident state + the step's reservation (and the parts)."""
    pipe = pw.pipeline([layer_stack] * a.stages, slices=slices, microbatches=a.micro, schedule="gpipe",
                       optimizer=optax.adam(1e-3), donate=a.donate)
    state = pipe.init(stage_params(layers, a.width, a.stages))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(a.batch, a.width)).astype(np.float32)
    y = rng.normal(size=(a.batch, a.width)).astype(np.float32)
    graph = pipe.trace(state, x, y)
    peak = pw.controller().plan(graph, "chained").peak_bytes
    resident = _bytes_by_device((state.params, state.opt_state))
    need = {d: resident.get(d, 0) + peak.get(d, 0) for d in set(resident) | set(peak)}
    d = max(need, key=need.get)
    return need[d], {"resident": resident.get(d, 0), "reserved": peak.get(d, 0), "pipe": pipe, "state": state, "x": x, "y": y}


def jax_step(device, layers: int, a):
    """One stage's donated training step (jax.jit, donate_argnums) on ``device``, and its arguments."""
    tx = optax.adam(1e-3)
    p = jax.device_put(stage_params(layers, a.width, 1)[0], device)
    s = tx.init(p)
    rows = a.batch // a.micro
    xs = jax.device_put(np.zeros((a.micro, rows, a.width), np.float32), device)

    def step(p, s, xs, dys):
        def one(g, xd):
            x, dy = xd
            _, pull = jax.vjp(lambda q: layer_stack(q, x), p)  # recomputed, as pw's remat=True
            return jax.tree_util.tree_map(jnp.add, g, pull(dy)[0]), None

        g, _ = jax.lax.scan(one, jax.tree_util.tree_map(jnp.zeros_like, p), (xs, dys))
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    return jax.jit(step, donate_argnums=(0, 1)), (p, s, xs, xs)


def jax_need(device, layers: int, a) -> int:
    """XLA's memory analysis of one stage's donated training step (jax.jit, donate_argnums) on ``device``."""
    fn, args = jax_step(device, layers, a)
    m = fn.lower(*args).compile().memory_analysis()
    if m is None:
        return 0
    return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes)


def largest(fits, hi: int) -> int:
    """The largest n in 1..hi with fits(n) (fits is monotone), 0 if none."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


CANDIDATES = {"pw": "pw", "pw, donate=False": "pw-nodonate", "plain JAX (donated jit)": "jax"}


def reports_memory(dev) -> bool:
    """Whether the backend measures ``dev``'s memory (GPUs and TPUs do; the CPU does not)."""
    try:
        stats = dev.memory_stats()
    except Exception:  # noqa: BLE001 - a backend without it may raise instead of returning None
        return False
    return bool(stats) and "peak_bytes_in_use" in stats


def measure(a) -> dict:
    """``--measure``: in this fresh process, run one candidate's step at ``--layers`` and read the device's peak."""
    n = a.stages
    slices = [pw.slice(1, name=f"mem{j}") for j in range(n)]
    devs = list(dict.fromkeys(d for s in slices for d in s.devices))
    if a.measure == "jax":
        fn, args = jax_step(devs[0], a.layers, a)
        jax.block_until_ready(fn(*args))
    else:
        a.donate = a.measure == "pw"
        _, info = pw_need(slices, a.layers, a)
        state, loss = info["pipe"].step(info["state"], info["x"], info["y"])
        float(loss.result())
        pw.get(state)
    out = {"candidate": a.measure, "layers_per_stage": a.layers, "platform": devs[0].platform, "peak_bytes": None}
    if reports_memory(devs[0]):
        peaks = {str(d): d.memory_stats()["peak_bytes_in_use"] for d in devs}
        worst = max(peaks, key=peaks.get)
        out.update(device=worst, peak_bytes=peaks[worst])
    print("MEASURED " + json.dumps(out), flush=True)
    pw.shutdown()
    return out


def measured_in_fresh_process(label: str, layers: int, a) -> dict:
    """Run `measure` for one candidate in a new process (the device's peak then is that candidate's alone)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(common.ROOT), str(common.ROOT / "benchmarks"),
                                                    env.get("PYTHONPATH")) if p)
    # This process holds its own allocations (on a GPU, JAX's preallocated pool): the child takes what it needs.
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    argv = [sys.executable, __file__, "--measure", CANDIDATES[label], "--layers", str(max(layers, 1)),
            "--width", str(a.width), "--stages", str(a.stages), "--micro", str(a.micro), "--batch", str(a.batch)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=common.ROOT, timeout=300)
    for line in proc.stdout.splitlines():
        if line.startswith("MEASURED "):
            return json.loads(line[len("MEASURED "):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()
    why = tail[-1][:300] if tail else f"exit {proc.returncode}"
    return {"candidate": CANDIDATES[label], "peak_bytes": None, "error": why}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--limit-mb", type=float, default=64.0)
    ap.add_argument("--max-layers", type=int, default=64)
    ap.add_argument("--fresh", choices=("auto", "always", "never"), default="auto",
                    help="measure each candidate's peak in a fresh process: where the backend reports memory (auto), "
                         "always (on the CPU too, to check the path: it reports none) or never")
    ap.add_argument("--measure", choices=sorted(CANDIDATES.values()), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None)
    a = common.parse_args(ap, argv, {"width": 64, "limit_mb": 1.0, "max_layers": 16})
    if a.measure:
        return measure(a)
    limit = int(a.limit_mb * 2**20)
    have, note = len(pw.devices()), None
    if have < a.stages:
        note = (f"memory: asks {a.stages} stages on one device each, {have} present: "
                f"measured with {have} stage{'s' if have > 1 else ''} instead")
        print(note)
        a.stages = have
    slices = [pw.slice(1, name=f"mem{j}") for j in range(a.stages)]
    rows = {}
    for label, donate in (("pw", True), ("pw, donate=False", False)):
        a.donate = donate
        n = largest(lambda L: pw_need(slices, L, a)[0] <= limit, a.max_layers)
        need, info = pw_need(slices, max(n, 1), a)
        del info["pipe"], info["state"]
        rows[label] = {"layers_per_stage": n, "need": need, "resident": info["resident"], "reserved": info["reserved"]}
    n_jax = largest(lambda L: jax_need(slices[0].devices[0], L, a) <= limit, a.max_layers)
    rows["plain JAX (donated jit)"] = {"layers_per_stage": n_jax, "need": jax_need(slices[0].devices[0], max(n_jax, 1), a)}
    dev = slices[0].devices[0]
    platform = dev.platform
    reports = reports_memory(dev)
    fresh = a.fresh == "always" or (a.fresh == "auto" and reports)
    for label, r in rows.items():
        r["measured"] = measured_in_fresh_process(label, r["layers_per_stage"], a) if fresh else None
    print(f"width {a.width}, {a.stages} stages, {a.micro} microbatches, batch {a.batch}, limit {a.limit_mb:g} MiB per device")
    print(f"{'':26s} {'layers/stage':>12s} {'need MiB':>9s} {'measured peak MiB':>18s}")
    for label, r in rows.items():
        m = r["measured"]
        peak = f"{m['peak_bytes'] / 2**20:18.2f}" if m and m.get("peak_bytes") is not None else f"{'-':>18s}"
        print(f"{label:26s} {r['layers_per_stage']:12d} {r['need'] / 2**20:9.2f} {peak}")
    ratio = rows["pw"]["layers_per_stage"] / max(1, n_jax)
    print(f"pw / plain JAX: {ratio:.3f}x the layers")
    print("need: the plan's estimate (pw: resident state + the step's reservation) or XLA's memory analysis "
          "(plain JAX) on the most loaded device")
    errors = [f"{label}: {r['measured']['error']}" for label, r in rows.items()
              if r["measured"] and "error" in r["measured"]]
    if not reports:
        ran = " (each candidate's step was run in a fresh process all the same: --fresh always)" if fresh else ""
        print(f"measured peak: none, the {platform} backend reports no memory (device.memory_stats() is None){ran}")
    elif fresh:
        print("measured peak: each candidate's step run once at its largest size in a fresh process of its own; "
              "the device's peak_bytes_in_use there (its state, the step, XLA's scratch)")
    for e in errors:
        print(f"measured peak failed: {e}")
    result = {
        "benchmark": "memory", "machine": common.machine(), "width": a.width, "stages": a.stages, "micro": a.micro,
        "batch": a.batch, "limit_mb": a.limit_mb, "rows": rows, "ratio": ratio, "devices": have, "note": note,
        "backend_reports_memory": reports,
        "measured": (rows["pw"]["measured"] or {}).get("peak_bytes") and rows["pw"]["measured"],
        "targets": [common.target("largest model admitted, pw / plain JAX donated step", ratio, 0.95, below=False, unit="x")],
    }
    return common.finish(a.json, result)


if __name__ == "__main__":
    main()

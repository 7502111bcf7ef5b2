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
(GPU: ``device.memory_stats()``), the step is run at pw's largest size and the
device's measured peak is set beside the plan's estimate; the CPU reports none.
"""

from __future__ import annotations

import argparse

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


def jax_need(device, layers: int, a) -> int:
    """XLA's memory analysis of one stage's donated training step (jax.jit, donate_argnums) on ``device``."""
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

    m = jax.jit(step, donate_argnums=(0, 1)).lower(p, s, xs, xs).compile().memory_analysis()
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


def measured_peak(slices, info) -> dict | None:
    """Run the step once and read the device's peak, where the backend reports memory (GPUs)."""
    dev = slices[0].devices[0]
    stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    before = stats.get("bytes_in_use", 0)
    state, loss = info["pipe"].step(info["state"], info["x"], info["y"])
    float(loss.result())
    pw.get(state)
    after = dev.memory_stats()
    return {"device": str(dev), "peak_bytes": after["peak_bytes_in_use"], "in_use_before": before}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--limit-mb", type=float, default=64.0)
    ap.add_argument("--max-layers", type=int, default=64)
    ap.add_argument("--json", default=None)
    a = common.parse_args(ap, argv, {"width": 64, "limit_mb": 1.0, "max_layers": 16})
    limit = int(a.limit_mb * 2**20)
    slices = [pw.slice(1, name=f"mem{j}") for j in range(a.stages)]
    rows = {}
    for label, donate in (("pw", True), ("pw, donate=False", False)):
        a.donate = donate
        n = largest(lambda L: pw_need(slices, L, a)[0] <= limit, a.max_layers)
        need, info = pw_need(slices, max(n, 1), a)
        rows[label] = {"layers_per_stage": n, "need": need, "resident": info["resident"], "reserved": info["reserved"]}
        if donate:
            best = info
    n_jax = largest(lambda L: jax_need(slices[0].devices[0], L, a) <= limit, a.max_layers)
    rows["plain JAX (donated jit)"] = {"layers_per_stage": n_jax, "need": jax_need(slices[0].devices[0], max(n_jax, 1), a)}
    print(f"width {a.width}, {a.stages} stages, {a.micro} microbatches, batch {a.batch}, limit {a.limit_mb:g} MiB per device")
    print(f"{'':26s} {'layers/stage':>12s} {'need MiB':>9s}")
    for label, r in rows.items():
        print(f"{label:26s} {r['layers_per_stage']:12d} {r['need'] / 2**20:9.2f}")
    ratio = rows["pw"]["layers_per_stage"] / max(1, n_jax)
    print(f"pw / plain JAX: {ratio:.3f}x the layers")
    peak = measured_peak(slices, best)
    if peak is None:
        print(f"measured peak: not reported by the {jax.devices()[0].platform} backend")
    else:
        est = rows["pw"]["need"]
        print(f"measured peak {peak['peak_bytes'] / 2**20:.2f} MiB on {peak['device']}, plan's estimate {est / 2**20:.2f} MiB")
    result = {
        "benchmark": "memory", "machine": common.machine(), "width": a.width, "stages": a.stages, "micro": a.micro,
        "batch": a.batch, "limit_mb": a.limit_mb, "rows": rows, "ratio": ratio, "measured": peak,
        "targets": [common.target("largest model admitted, pw / plain JAX donated step", ratio, 0.95, below=False, unit="x")],
    }
    return common.finish(a.json, result)


if __name__ == "__main__":
    main()

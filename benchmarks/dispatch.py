"""Dispatch cost per node: raw JAX op-by-op vs pw chained vs pw fused vs a hand-written jax.jit.

    python benchmarks/dispatch.py [--k 128] [--repeats 30] [--devices 1] [--json out.json]

A chain of K tiny compiled functions (x -> x * 1.0001 + 0.5 on a small vector)
on one slice. Every mode runs in this one process on the same devices; we
report the median microseconds per node over the repeats and the ratios the
targets are stated in. Runs on CPU (8 simulated devices) or on a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
import jax
import jax.numpy as jnp


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=128, help="nodes in the chain")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--devices", type=int, default=1, help="devices in the slice")
    ap.add_argument("--size", type=int, default=16, help="vector length per device")
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args(argv)

    pw.init()
    s = pw.slice(args.devices, name="bench")
    spec = jax.sharding.PartitionSpec("d")
    steps = [
        pw.compiled(lambda x, i=i: x * 1.0001 + (0.5 + i * 1e-6), slice=s, in_specs=spec, out_specs=spec, name=f"op{i}")
        for i in range(args.k)
    ]
    x = jax.device_put(jnp.ones(args.size * args.devices), s.sharding("d"))

    @pw.program
    def chain(v):
        for f in steps:
            v = f(v)
        return v

    raw = [f.jitted for f in steps]

    def jax_op_by_op():
        v = x
        for f in raw:
            v = f(v)
        v.block_until_ready()

    def whole(v):
        for f in raw:
            v = f(v)
        return v

    whole_jit = jax.jit(whole, in_shardings=s.sharding("d"), out_shardings=s.sharding("d"))

    def jax_jit():
        whole_jit(x).block_until_ready()

    def pw_chained():
        chain.submit(x, mode="chained").outputs.result()

    def pw_fused():
        chain.submit(x, mode="fused").outputs.result()

    submit_only = []

    def pw_chained_submit():
        t = time.perf_counter()
        run = chain.submit(x, mode="chained")
        submit_only.append(time.perf_counter() - t)
        run.outputs.result()

    modes = {
        "jax_op_by_op": jax_op_by_op,
        "pw_chained": pw_chained,
        "pw_fused": pw_fused,
        "jax_jit": jax_jit,
    }
    for fn in (*modes.values(), pw_chained_submit):  # warm up: trace, compile, caches
        fn()
        fn()
    # Interleave the modes so machine noise hits them alike.
    samples: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for m, fn in modes.items():
            samples[m].extend(timed(fn, 1))
    timed(pw_chained_submit, args.repeats)
    us = {m: statistics.median(v) / args.k * 1e6 for m, v in samples.items()}
    us["pw_chained_submit_returns"] = statistics.median(submit_only) / args.k * 1e6
    ratios = {
        "chained_vs_jax_op_by_op": us["pw_chained"] / us["jax_op_by_op"],
        "fused_vs_jax_jit": us["pw_fused"] / us["jax_jit"],
        "fused_vs_jax_op_by_op": us["pw_fused"] / us["jax_op_by_op"],
    }
    dev = jax.devices()[0]
    result = {
        "benchmark": "dispatch",
        "k": args.k,
        "devices_in_slice": args.devices,
        "platform": dev.platform,
        "device_kind": dev.device_kind,
        "jax": jax.__version__,
        "pw_kernel": pw.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
        "us_per_node": us,
        "ratios": ratios,
    }
    print(f"dispatch: chain of {args.k} tiny nodes on a {args.devices}-device slice, {dev.platform} ({dev.device_kind})")
    print(f"{'mode':<28} {'µs/node':>9}")
    for m, v in us.items():
        print(f"{m:<28} {v:>9.2f}")
    print(f"pw chained / JAX op-by-op     {ratios['chained_vs_jax_op_by_op']:.2f}x   (target <= 1.5x)")
    print(f"pw fused   / hand-written jit {ratios['fused_vs_jax_jit']:.2f}x   (target <= 1.1x)")
    print(f"pw fused   / JAX op-by-op     {ratios['fused_vs_jax_op_by_op']:.2f}x   (target < 1x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    pw.shutdown()
    return result


if __name__ == "__main__":
    main()

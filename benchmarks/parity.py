"""Minimum computation size for parity: pw chained throughput as a fraction of raw JAX, by computation size.

    python benchmarks/parity.py [--sizes 10,30,100,300,1000,3000,10000] [--json out.json] [--quick]

The paper's Figure 6. For each size (device time of one computation, from
~10 µs to ~10 ms; see workloads.py), a chain of K calls of one compiled
function on a 1-device slice runs as raw JAX op-by-op (the `jax.jit` called
in a Python loop, asynchronous dispatch, one wait at the end) and as one
pw program of K nodes (`mode="chained"`), interleaved with the fused
reference (a hand-written `jax.jit` of the K-chain) that measures the
computation's size. K shrinks with the size so
every chain lasts ~40 ms (16 <= K <= 128). Reported: computations per
second of each, pw as a fraction of JAX, and the smallest size from which
on pw keeps >= 95% of JAX's throughput.
"""

from __future__ import annotations

import argparse

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
import jax
from jax.sharding import PartitionSpec as P

import common
import workloads

PARITY = 0.95


def measure_size(sized: workloads.Sized, s, chain_ms: float, repeats: int, budget_s: float) -> dict:
    k = int(min(128, max(16, round(chain_ms * 1000 / sized.target_us))))
    f = pw.compiled(sized.fn, slice=s, in_specs=P(), out_specs=P(), name=f"c{sized.param}")
    x = jax.device_put(sized.x, s.sharding())
    jitted = f.jitted

    @pw.program(name=f"chain{sized.param}")
    def chain(v):
        for _ in range(k):
            v = f(v)
        return v

    def jax_opbyop():
        v = x
        for _ in range(k):
            v = jitted(v)
        v.block_until_ready()

    def pw_chained():
        chain.submit(x, mode="chained").outputs.result()

    samples = common.interleaved(
        {"reference": sized.reference(k), "jax": jax_opbyop, "pw": pw_chained}, repeats, warmup=1, budget_s=budget_s
    )
    dev_us = common.per_item_us(samples["reference"], k).median
    jax_us = common.per_item_us(samples["jax"], k)
    pw_us = common.per_item_us(samples["pw"], k)
    return {
        "target_us": sized.target_us,
        "param": sized.param,
        "k": k,
        "device_us": dev_us,
        "jax_us": jax_us.median,
        "pw_us": pw_us.median,
        "jax_per_s": 1e6 / jax_us.median,
        "pw_per_s": 1e6 / pw_us.median,
        "fraction": jax_us.median / pw_us.median,
        "spread": {"jax": jax_us.spread, "pw": pw_us.spread},
        "repeats": len(samples["pw"]), "window_s": common.window(samples),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10,30,100,300,1000,3000,10000", help="target µs per computation")
    ap.add_argument("--chain-ms", type=float, default=40.0)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--budget", type=float, default=6.0, help="seconds of timing per size, at most")
    ap.add_argument("--json", default=None)
    args = common.parse_args(ap, argv, {"sizes": "30,300", "chain_ms": 1.0, "repeats": 2, "budget": 0.5})

    pw.init()
    result: dict = {"benchmark": "parity", "machine": common.machine(), "rows": []}
    m = result["machine"]
    print(f"parity: pw chained vs raw JAX op-by-op by computation size, {m['platform']} ({m['device_kind']}), "
          f"load {m['loadavg']}")
    s = pw.slice(1, name="parity")
    sizes = workloads.calibrate([float(t) for t in args.sizes.split(",")])
    print(f"{'target µs':>10} {'device µs':>10} {'K':>4} {'JAX /s':>10} {'pw /s':>10} {'pw/JAX':>7}")
    for sized in sizes:
        row = measure_size(sized, s, args.chain_ms, args.repeats, args.budget)
        result["rows"].append(row)
        print(f"{row['target_us']:>10.0f} {row['device_us']:>10.1f} {row['k']:>4} {row['jax_per_s']:>10,.0f} "
              f"{row['pw_per_s']:>10,.0f} {row['fraction']:>7.2f}")
    print(f"({common.window_note(min(r['window_s'] for r in result['rows']))})")
    # The smallest size from which on every larger size keeps parity.
    parity_at = None
    for row in reversed(result["rows"]):
        if row["fraction"] < PARITY:
            break
        parity_at = row["device_us"]
    result["parity_threshold"] = PARITY
    result["smallest_parity_size_us"] = parity_at
    result["machine"]["loadavg_end"] = common.loadavg()
    if parity_at is None:
        print(f"pw chained stays below {PARITY:.0%} of JAX at every size measured")
    else:
        print(f"pw chained reaches {PARITY:.0%} of JAX throughput from {parity_at:.0f} µs computations on")
    common.write_json(args.json, result)
    pw.shutdown()
    return result


if __name__ == "__main__":
    main()

"""Utilization: device busy time over wall time for chains of 100 µs and 1 ms computations.

    python benchmarks/utilization.py [--sizes 100,1000] [--n 128] [--json out.json] [--quick]

Device busy time is the time of the fused reference: a hand-written
`jax.jit` of the same N computations unrolled into one executable, in
which the device never waits for the host (see workloads.py). Wall time is the
caller's view, from submit to result. Measured, interleaved:

- raw JAX op-by-op: the `jax.jit` called N times in a Python loop;
- pw chained: one program of N nodes (`mode="chained"`), submit -> result;
- pw chained x4: four such runs submitted back to back, each fed the
  previous one's output future (steady state: no per-run gaps in between);
- pw fused: the same program as one executable.

Cross-check from pw's own event log of the chained runs: the sum of node
durations over the span from the first dispatch to the last end, and how
often a node had to wait for its dispatch (its start is its dispatch time,
later than the previous node's end: the device idled for the host).
"""

from __future__ import annotations

import argparse

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
import jax
from jax.sharding import PartitionSpec as P

import common
import workloads

TARGET = 0.95
BACK_TO_BACK = 4


def log_stats(runs) -> dict:
    """Busy/span and dispatch-starved gaps from the event log of consecutive runs."""
    evs = sorted((e for r in runs for e in r.events), key=lambda e: e.dispatch)
    busy = sum(e.end - e.start for e in evs)
    span = max(e.end for e in evs) - min(e.dispatch for e in evs)
    starved, gap_ns, prev_end = 0, 0, None
    for e in evs:
        if prev_end is not None and e.dispatch > prev_end:
            starved += 1
            gap_ns += e.dispatch - prev_end
        prev_end = e.end if prev_end is None else max(prev_end, e.end)
    return {"busy_over_span": busy / span, "starved_nodes": starved, "starved_us": gap_ns / 1e3}


def measure(sized: workloads.Sized, s, n: int, repeats: int, budget_s: float) -> dict:
    f = pw.compiled(sized.fn, slice=s, in_specs=P(), out_specs=P(), name=f"u{sized.param}")
    x = jax.device_put(sized.x, s.sharding())
    jitted = f.jitted

    @pw.program(name=f"util{sized.param}")
    def chain(v):
        for _ in range(n):
            v = f(v)
        return v

    logs: list[dict] = []

    def jax_opbyop():
        v = x
        for _ in range(n):
            v = jitted(v)
        v.block_until_ready()

    def pw_chained():
        run = chain.submit(x, mode="chained")
        run.outputs.result()
        run.wait()
        logs.append(log_stats([run]))

    def pw_chained_x4():
        runs, v = [], x
        for _ in range(BACK_TO_BACK):
            runs.append(chain.submit(v, mode="chained"))
            v = runs[-1].outputs
        v.result()
        for r in runs:
            r.wait()
        logs.append(log_stats(runs) | {"x4": True})

    def pw_fused():
        chain.submit(x, mode="fused").outputs.result()

    modes = {
        "reference": sized.reference(n),
        "jax": jax_opbyop,
        "pw_chained": pw_chained,
        "pw_chained_x4": pw_chained_x4,
        "pw_fused": pw_fused,
    }
    samples = common.interleaved(modes, repeats, warmup=1, budget_s=budget_s)
    dev_us = common.per_item_us(samples["reference"], n).median
    items = {"jax": n, "pw_chained": n, "pw_chained_x4": n * BACK_TO_BACK, "pw_fused": n}
    util = {m: dev_us / common.per_item_us(samples[m], k).median for m, k in items.items()}
    one = [d for d in logs[2:] if "x4" not in d] or [d for d in logs if "x4" not in d]  # after warm-up
    four = [d for d in logs[2:] if "x4" in d] or [d for d in logs if "x4" in d]

    def med(ds, key):
        return common.Stat.of([d[key] for d in ds]).median

    return {
        "target_us": sized.target_us,
        "device_us": dev_us,
        "n": n,
        "utilization": util,
        "event_log": {
            "chained": {"busy_over_span": med(one, "busy_over_span"), "starved_nodes": med(one, "starved_nodes"),
                        "starved_us": med(one, "starved_us")},
            "chained_x4": {"busy_over_span": med(four, "busy_over_span"), "starved_nodes": med(four, "starved_nodes"),
                           "starved_us": med(four, "starved_us")},
        },
        "repeats": len(samples["jax"]), "window_s": common.window(samples),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100,1000", help="target µs per computation")
    ap.add_argument("--n", type=int, default=128, help="computations per chain")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--budget", type=float, default=12.0, help="seconds of timing per size, at most")
    ap.add_argument("--json", default=None)
    args = common.parse_args(ap, argv, {"sizes": "100", "n": 16, "repeats": 2, "budget": 0.5})

    pw.init()
    result: dict = {"benchmark": "utilization", "machine": common.machine(), "rows": []}
    m = result["machine"]
    print(f"utilization: device busy / wall, chains of {args.n}, {m['platform']} ({m['device_kind']}), "
          f"load {m['loadavg']}")
    s = pw.slice(1, name="util")
    targets = []
    for sized in workloads.calibrate([float(t) for t in args.sizes.split(",")]):
        row = measure(sized, s, args.n, args.repeats, args.budget)
        result["rows"].append(row)
        u, lg = row["utilization"], row["event_log"]
        print(f"{row['device_us']:.0f} µs computations (target {row['target_us']:.0f}; "
              f"{common.window_note(row['window_s'])}):")
        for mode, val in u.items():
            print(f"  {mode:<16} {val:6.1%}")
        for mode, d in lg.items():
            print(f"  event log, {mode:<10} busy/span {d['busy_over_span']:6.1%}, "
                  f"{d['starved_nodes']:.0f} nodes waited for dispatch ({d['starved_us']:.0f} µs)")
        targets.append(common.target(f"utilization at {row['target_us']:.0f} µs, pw chained", u["pw_chained"], TARGET,
                                     below=False))
        targets.append(common.target(f"utilization at {row['target_us']:.0f} µs, pw chained x{BACK_TO_BACK}",
                                     u["pw_chained_x4"], TARGET, below=False))
    result["targets"] = targets
    result["machine"]["loadavg_end"] = common.loadavg()
    print("targets:")
    common.print_targets(targets)
    common.write_json(args.json, result)
    pw.shutdown()
    return result


if __name__ == "__main__":
    main()

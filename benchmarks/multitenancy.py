"""Multi-tenancy: aggregate throughput with 1, 2, 4, 8 tenants, Jain fairness, weighted shares; cancel and priority.

    python benchmarks/multitenancy.py [--json out.json] [--quick]

Each tenant submits a backlog of identical programs (a chain of matmul nodes
on one shared slice of all the devices) from its own thread, so every tenant is
saturating. The backlog is sized by time: at least ``--runs`` programs in all,
and enough that the row's window (first submit to last result) lasts at least
0.5 s on this machine's devices (``--quick``: a short window, said so).
Figures come from the controller's event log (device time per
tenant) and wall clock; raw JAX dispatching the same nodes op-by-op from one
thread is the throughput reference.

Cancel and priority, with the run-ahead unbounded (``Config.run_ahead_s=None``,
as before the bound) and bounded (the default), in each mode: a long program of
slow nodes on one device; after `cancel()`, how long the next tiny call on that
device waits, and how long a priority-10 call submitted behind it waits, each in
units of the slow node's own device time (so the figures mean the same on any
machine). ``auto`` fuses the program, and once a run has measured it longer than
the bound, cuts it into fused segments of about the bound; ``fused`` keeps it one
executable. Fused segments' throughput against one executable: programs of 20 and
128 small nodes, each longer than the bound, auto against fused, interleaved.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import threading
import time

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import common


def jain(xs):
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if xs else 1.0


def setup(width: int, nodes: int):
    s = pw.slice(len(pw.devices()), mesh={"data": len(pw.devices())}, name="shared")
    f = pw.compiled(lambda x, w: jnp.tanh(x @ w), slice=s, in_specs=(P("data"), None), out_specs=P("data"), name="layer")
    w = jax.device_put(jnp.eye(width) * 0.5, s.sharding())
    x = jax.device_put(jnp.ones((len(pw.devices()) * 16, width)), s.sharding("data"))

    @pw.program(name="job")
    def job(x, w):
        for _ in range(nodes):
            x = f(x, w)
        return x

    job.trace(x, w)
    job.submit(x, w, mode="chained").result()
    return s, f, job, x, w


def run_tenants(job, x, w, tenants, runs_per_tenant, weights=None):
    c = pw.controller()
    c.set_policy(pw.FairShare(weights or {}))
    barrier = threading.Barrier(len(tenants) + 1)
    all_runs: dict[str, list] = {t: [] for t in tenants}

    def tenant(name):
        barrier.wait()
        for _ in range(runs_per_tenant):
            all_runs[name].append(job.submit(x, w, mode="chained", tenant=name))

    threads = [threading.Thread(target=tenant, args=(t,)) for t in tenants]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    for runs in all_runs.values():
        for r in runs:
            r.wait()
    wall = time.perf_counter() - t0
    nodes = sum(r.nodes_total for runs in all_runs.values() for r in runs)
    # Shares over the window in which every tenant still had work: up to the first tenant's last node.
    ends = {t: max(e.end for r in runs for e in r.events) for t, runs in all_runs.items()}
    window_end = min(ends.values())
    busy = {
        t: sum(min(e.end, window_end) - e.start for r in runs for e in r.events if e.start < window_end)
        for t, runs in all_runs.items()
    }
    return nodes / wall, busy, wall


def slow_program(iters: int, nodes: int):
    """A 1-device slice, a slow node (``iters`` 256x256 matmuls), a tiny one, and a program of ``nodes`` slow nodes."""
    s = pw.slice(1, name="one")
    grind = pw.compiled(lambda x: jax.lax.fori_loop(0, iters, lambda i, a: jnp.tanh(a @ a), x), slice=s, name="grind")
    tiny = pw.compiled(lambda v: v + 1, slice=s, name="tiny")
    x = jax.device_put(jnp.full((256, 256), 1e-3), s.sharding())
    v = jax.device_put(jnp.zeros(2), s.sharding())

    @pw.program(name="long")
    def long(x):
        for _ in range(nodes):
            x = grind(x)
        return x

    urgent = pw.program(lambda v: tiny(v), name="urgent")
    return long, urgent, x, v


def cancel_and_priority(run_ahead_s, iters: int, nodes: int, repeats: int, mode: str = "chained") -> dict:
    """Next call's wait after cancel, and a priority-10 call's wait, over the slow node's device time."""
    c = pw.init(max_inflight=64, run_ahead_s=run_ahead_s)
    c.set_policy(pw.Priority())
    long, urgent, x, v = slow_program(iters, nodes)
    for _ in range(2):  # compiled, and every node's device time measured
        long.submit(x, mode="chained").result()
        urgent.submit(v, priority=10).result()
    for _ in range(2):  # the mode's own plan compiled (auto: measured whole, then cut)
        long.submit(x, mode=mode).result()
    grinds = [e.end - e.start for r in c.runs for e in r.events if e.node.startswith("grind")]  # grind, grind:1, ...
    node_s = statistics.median(grinds) / 1e9
    after_cancel, priority, still = [], [], []
    for _ in range(repeats):
        run = long.submit(x, mode=mode, priority=0)
        time.sleep(2.5 * node_s)  # under way (its nodes are reported in batches: `nodes_done` lags, unbounded)
        run.cancel()
        still.append(run.nodes_on_devices)
        t0 = time.perf_counter()
        urgent.submit(v, priority=10).result()
        after_cancel.append((time.perf_counter() - t0) / node_s)

        run = long.submit(x, mode=mode, priority=0)
        time.sleep(2.5 * node_s)
        t0 = time.perf_counter()
        urgent.submit(v, priority=10).result()
        priority.append((time.perf_counter() - t0) / node_s)
        run.cancel()
        urgent.submit(v, priority=10).result()  # the device drained before the next round
    pw.shutdown()
    return {
        "run_ahead_s": run_ahead_s,
        "mode": mode,
        "node_ms": node_s * 1e3,
        "nodes": nodes,
        "next_call_after_cancel_over_node": statistics.median(after_cancel),
        "priority_10_wait_over_node": statistics.median(priority),
        "nodes_still_on_device_at_cancel": statistics.median(still),
        "repeats": repeats,
    }


def print_cancel_and_priority(rows: list[dict]) -> None:
    r0 = rows[0]
    print(f"cancel and priority: a {r0['nodes']}-node program of {r0['node_ms']:.1f} ms nodes on one device, "
          f"waits in node times (median of {r0['repeats']}):")
    print(f"  {'run_ahead_s':<14} {'mode':<8} {'next call after cancel':>23} {'priority-10 call':>17} "
          f"{'steps still on device':>22}")
    for r in rows:
        label = "None (before)" if r["run_ahead_s"] is None else f"{r['run_ahead_s']:g}"
        print(f"  {label:<14} {r['mode']:<8} {r['next_call_after_cancel_over_node']:>23.2f} "
              f"{r['priority_10_wait_over_node']:>17.2f} {r['nodes_still_on_device_at_cancel']:>22.0f}")


#: seconds of runs per figure of the segment-throughput table (`--quick`: `common.MIN_WINDOW_S`)
SEGMENT_WINDOW_S = 3.0


def segment_throughput(nodes: int, iters: int) -> dict:
    """Runs/s of a program of ``nodes`` small slow nodes, auto (cut into fused segments) against fused (one executable)."""
    pw.init(max_inflight=64)
    long, _, x, _ = slow_program(iters, nodes)
    for _ in range(2):
        long.submit(x, mode="fused").result()
        long.submit(x, mode="auto").result()
    # The two differ by a few percent, less than this machine's noise over a short window: at least
    # 3 s of runs per figure (the --quick mode keeps its short window).
    samples = common.interleaved({m: (lambda m=m: long.submit(x, mode=m).result()) for m in ("fused", "auto")},
                                 1000, budget_s=0.0,
                                 min_window_s=common.MIN_WINDOW_S if common.QUICK else SEGMENT_WINDOW_S)
    segments = long.submit(x, mode="auto").wait().nodes_total  # (auto's plan, cut once measured)
    pw.shutdown()
    fused, auto = statistics.median(samples["fused"]), statistics.median(samples["auto"])
    return {"nodes": nodes, "segments": segments, "fused_ms": fused * 1e3, "auto_ms": auto * 1e3,
            "auto_over_fused_throughput": fused / auto, "window_s": common.window(samples)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--nodes", type=int, default=16, help="nodes per program")
    ap.add_argument("--runs", type=int, default=24, help="runs per tenant (the backlog)")
    ap.add_argument("--slow-iters", type=int, default=100, help="matmuls in the slow node (cancel and priority)")
    ap.add_argument("--slow-nodes", type=int, default=20, help="slow nodes in the long program")
    ap.add_argument("--slow-repeats", type=int, default=3)
    ap.add_argument("--seg-iters", type=int, default=8, help="matmuls in a node of the segment-throughput programs")
    ap.add_argument("--json", default=None)
    args = common.parse_args(
        ap, argv, {"width": 64, "nodes": 4, "runs": 4, "slow_iters": 20, "slow_nodes": 8, "slow_repeats": 1, "seg_iters": 4}
    )
    pw.init(max_inflight=64)
    s, f, job, x, w = setup(args.width, args.nodes)

    # Raw JAX reference: the same nodes op-by-op from one thread.
    def raw(n_nodes):
        v = x
        t = time.perf_counter()
        for _ in range(n_nodes):
            v = f.jitted(v, w)
        v.block_until_ready()
        return n_nodes / (time.perf_counter() - t)

    raw(args.nodes)
    window = common.MIN_WINDOW_S
    est = raw(args.nodes * args.runs)  # nodes per second, roughly: sizes the windows below
    jax_nodes = max(args.nodes * args.runs, math.ceil(window * est))
    jax_rate = raw(jax_nodes)
    # The backlog by time: enough programs of `nodes` nodes that a row lasts `window` seconds at about this rate.
    t = time.perf_counter()
    job.submit(x, w, mode="chained").result()
    run_s = time.perf_counter() - t
    runs = max(args.runs, math.ceil(window / max(run_s, args.nodes / est)))

    rates = {}
    for k in (1, 2, 4, 8):
        tenants = [f"T{i}" for i in range(k)]
        rate, busy, wall = run_tenants(job, x, w, tenants, max(math.ceil(runs / k), 2) if k > 1 else runs)
        rates[k] = {"nodes_per_s": rate, "relative": None, "jain": jain(list(busy.values())), "window_s": wall}
    for k in rates:
        rates[k]["relative"] = rates[k]["nodes_per_s"] / rates[1]["nodes_per_s"]

    weights = {"w1": 1, "w2": 2, "w4": 4, "w8": 8}
    _, busy, weighted_wall = run_tenants(job, x, w, list(weights), max(args.runs, math.ceil(runs / 4)), weights)
    total = sum(busy.values())
    shares = {t: busy[t] / total for t in weights}
    ideal = {t: weights[t] / sum(weights.values()) for t in weights}

    result = {
        "benchmark": "multitenancy",
        "platform": jax.devices()[0].platform,
        "jax": jax.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "jax_op_by_op_nodes_per_s": jax_rate, "runs": runs, "weighted_window_s": weighted_wall,
        "tenants": rates,
        "weighted_shares": shares,
        "ideal_shares": ideal,
    }
    n = len(pw.devices())
    print(f"multitenancy: programs of {args.nodes} matmul nodes ({args.width}x{args.width}) on one {n}-device slice; "
          f"a backlog of {runs} programs per row ({common.window_note(min(r['window_s'] for r in rates.values()))})")
    print(f"raw JAX op-by-op, one thread: {jax_rate:,.0f} nodes/s ({jax_nodes} nodes)")
    print(f"{'tenants':>8} {'nodes/s':>10} {'vs 1':>6} {'vs JAX':>7} {'Jain':>6} {'window s':>9}")
    for k, r in rates.items():
        print(f"{k:>8} {r['nodes_per_s']:>10,.0f} {r['relative']:>6.2f} {r['nodes_per_s'] / jax_rate:>7.2f} "
              f"{r['jain']:>6.3f} {r['window_s']:>9.2f}")
    print(f"weighted fair share 1:2:4:8, device-time shares while all four were backlogged "
          f"(window {weighted_wall:.2f} s):")
    for t in weights:
        print(f"  {t}: {shares[t]:.3f} (ideal {ideal[t]:.3f})")
    pw.shutdown()
    rows = [cancel_and_priority(ra, args.slow_iters, args.slow_nodes, args.slow_repeats, mode)
            for ra, mode in ((None, "chained"), (0.02, "chained"), (0.02, "fused"), (0.02, "auto"))]
    result["cancel_and_priority"] = rows
    print_cancel_and_priority(rows)
    seg = [segment_throughput(n, args.seg_iters) for n in (20, 128)]
    result["segments"] = seg
    print(f"fused segments against one executable (auto / fused throughput, medians; "
          f"{common.window_note(min(r['window_s'] for r in seg))}):")
    for r in seg:
        print(f"  {r['nodes']:4d} nodes: {r['segments']} segments, {r['auto_ms']:.1f} ms a run against {r['fused_ms']:.1f} ms: "
              f"{r['auto_over_fused_throughput']:.2f}x")
    result["targets"] = [common.target(f"fused-segment throughput, {r['nodes']} nodes, auto / fused",
                                       r["auto_over_fused_throughput"], 0.95, below=False, unit="x") for r in seg]
    common.print_targets(result["targets"])
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

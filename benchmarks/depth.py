"""Depth: nodes/s with 24, 96, 480 and 2,400 runs queued, for 1 and 8 tenants, on a 1-device and an all-device slice.

    python benchmarks/depth.py [--depths 24,96,480,2400] [--json out.json] [--quick]

A controller holds many programs at once (Pathways' holds thousands): what it
costs to pick, complete and retire a node must not grow with what is queued.
Each row keeps ``depth`` runs of a 16-node program of small nodes outstanding
(a closed loop: every finished run is replaced by a new one, from ``tenants``
threads under fair share), and counts nodes finished per second over a window
of at least 0.5 s, the depths interleaved round by round (medians of ``--rounds``). Target: the deepest row >= 0.9x the shallowest, each layout
and tenant count. Raw JAX dispatching the same nodes op-by-op from one thread
is the reference.

The pick alone is measured too, without devices: `Lifecycle.next_work` with
``depth`` runs queued behind a run-ahead bound that is reached (what the
dispatcher asks after every burst on a fast asynchronous device), in µs a call.
"""

from __future__ import annotations

import argparse
import collections
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
from pw_kernel.runtime.extend import Lifecycle, RunRecord


def setup(devices: int, width: int, nodes: int):
    s = pw.slice(devices, mesh={"data": devices}, name=f"d{devices}")
    f = pw.compiled(lambda x: jnp.tanh(x * 0.5 + 0.1), slice=s, in_specs=P("data"), out_specs=P("data"), name="small")
    x = jax.device_put(jnp.ones((devices * 8, width)), s.sharding("data"))

    @pw.program(name="job")
    def job(x):
        for _ in range(nodes):
            x = f(x)
        return x

    job.submit(x, mode="chained").result()
    return f, job, x


def closed_loop(job, x, depth: int, tenants: int, window_s: float) -> tuple[float, float]:
    """(nodes/s, window s): each tenant keeps depth/tenants runs outstanding, replacing each finished one."""
    per = max(1, depth // tenants)
    done = [0] * tenants
    stop = threading.Event()
    started = threading.Barrier(tenants + 1)

    def tenant(i: int) -> None:
        name = f"T{i}"
        q = collections.deque(job.submit(x, mode="chained", tenant=name) for _ in range(per))
        started.wait()
        while not stop.is_set():
            q.popleft().wait()
            done[i] += 1
            q.append(job.submit(x, mode="chained", tenant=name))
        for r in q:
            r.cancel()
        for r in q:
            r.wait()

    threads = [threading.Thread(target=tenant, args=(i,)) for i in range(tenants)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(min(0.3, window_s / 2))  # warm: the queue is full and running
    base, t0 = sum(done), time.perf_counter()
    time.sleep(window_s)
    while sum(done) == base and time.perf_counter() - t0 < 60:  # a window with no run done says nothing
        time.sleep(0.01)  # (--quick's short windows on a loaded machine)
    finished, wall = sum(done) - base, time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    return finished / wall, wall


def pick_us(depth: int, calls: int = 200) -> float:
    """µs per `Lifecycle.next_work` with ``depth`` runs queued behind a reached run-ahead bound (no devices)."""

    class Full:  # the run-ahead bound, reached for every step
        def full(self, step, inflight):
            return True

    class Exe:
        collectives = compiling = False

    class Step:
        island, host_callbacks, remote, src_island, exe = 0, False, False, None, Exe()

    class Plan:
        steps = [Step()] * 16
        peak_bytes: dict = {}
        input_slots = output_slots = output_step = ()
        const_slots: dict = {}
        n_slots = 0

    life = Lifecycle(max_inflight=1 << 20, n_islands=1, policy=pw.FairShare(), gate=Full())
    plan = Plan()
    for i in range(depth):
        life.submit(RunRecord(i + 1, "job", "job", plan, (), tenant=f"T{i % 8}"))
    life.next_work(0.0)  # every run starts waiting for credit
    t = time.perf_counter()
    for _ in range(calls):
        life.next_work(0.0)
    return (time.perf_counter() - t) / calls * 1e6


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--depths", default="24,96,480,2400")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5, help="rounds, each timing every depth once (medians)")
    ap.add_argument("--json", default=None)
    args = common.parse_args(ap, argv, {"depths": "24,480", "rounds": 1})
    depths = [int(d) for d in args.depths.split(",")]
    window = common.MIN_WINDOW_S
    picks = {d: pick_us(d) for d in depths}
    print("the pick alone (`Lifecycle.next_work`, bound reached, no devices), µs a call:")
    for d, us in picks.items():
        print(f"  {d:>6} queued: {us:8.1f} µs")

    pw.init(max_inflight=64)
    n = len(pw.devices())
    layouts = sorted({1, n})
    rows = []
    for devices in layouts:
        f, job, x = setup(devices, args.width, args.nodes)
        t = time.perf_counter()
        v, k = x, 0
        while time.perf_counter() - t < window:
            for _ in range(64):
                v = f.jitted(v)
            k += 64
        v.block_until_ready()
        raw = k / (time.perf_counter() - t)
        for tenants in (1, 8):
            rates: dict[int, list[float]] = {d: [] for d in depths}
            walls: dict[int, float] = {d: 0.0 for d in depths}
            for r in range(args.rounds):  # the depths interleaved round by round: noise hits them alike
                for d in depths[r % len(depths):] + depths[: r % len(depths)]:
                    runs_per_s, wall = closed_loop(job, x, d, tenants, window)
                    rates[d].append(runs_per_s * args.nodes)
                    walls[d] += wall
            for d in depths:
                rows.append({"devices": devices, "tenants": tenants, "depth": d,
                             "nodes_per_s": statistics.median(rates[d]), "samples": rates[d],
                             "window_s": walls[d], "raw_jax_nodes_per_s": raw})
    pw.shutdown()
    print(f"depth: programs of {args.nodes} small nodes kept queued in a closed loop, fair share; medians of "
          f"{args.rounds} interleaved rounds ({common.window_note(min(r['window_s'] for r in rows))})")
    print(f"{'devices':>8} {'tenants':>8} {'queued':>7} {'nodes/s':>10} {'vs first':>9} {'vs raw JAX':>11}")
    targets = []
    for devices in layouts:
        for tenants in (1, 8):
            mine = [r for r in rows if r["devices"] == devices and r["tenants"] == tenants]
            for r in mine:
                r["relative"] = r["nodes_per_s"] / mine[0]["nodes_per_s"]
                print(f"{devices:>8} {tenants:>8} {r['depth']:>7} {r['nodes_per_s']:>10,.0f} {r['relative']:>9.2f} "
                      f"{r['nodes_per_s'] / r['raw_jax_nodes_per_s']:>11.2f}")
            targets.append(common.target(
                f"nodes/s, {mine[-1]['depth']} queued / {mine[0]['depth']}, {devices} device(s), {tenants} tenant(s)",
                mine[-1]["relative"], 0.9, below=False, unit="x"))
    result = {
        "benchmark": "depth", "platform": jax.devices()[0].platform, "jax": jax.__version__,
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
        "pick_us": picks, "rows": rows, "targets": targets,
    }
    common.print_targets(targets)
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

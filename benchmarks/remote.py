"""Remote islands on a local Ray cluster: per-node dispatch cost and cross-island transfer bandwidth,
against local islands, in one process run.

    python benchmarks/remote.py [--k 128] [--sizes 1,16,64] [--json out.json] [--quick]

Two Ray actors, each a process with 4 simulated CPU devices, are remote islands; the controller's own
8 devices are the local reference.
"""

from __future__ import annotations

import argparse
import statistics

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
from pw_kernel.runtime.extend import init_ray
import jax.numpy as jnp
import numpy as np

import common


def chain_time(s, k: int, repeats: int) -> float:
    """Median seconds from submit to result of a chained program of ``k`` tiny nodes on slice ``s``."""
    fs = [pw.compiled(lambda x, i=i: x * 1.0001 + i, slice=s, name=f"op{i}") for i in range(k)]

    @pw.program
    def chain(v):
        for f in fs:
            v = f(v)
        return v

    x = jnp.ones(16)
    chain.submit(x, mode="chained").outputs.result()  # ships and compiles every node
    # at least `repeats` runs, and at least common.MIN_WINDOW_S of them
    return statistics.median(common.timed(lambda: chain.submit(x, mode="chained").outputs.result(), repeats, warmup=0))


def chain_cost(s, k: int, repeats: int) -> dict:
    """Per-node cost (µs) of chains on ``s``: the slope between k/8 and k nodes, and the fixed cost per run.

    The slope is what each further node adds; the fixed part (bringing the input there and the
    result back: two actor round trips on a remote island) is paid once per run.
    """
    short = max(1, k // 8)
    t_short, t_long = chain_time(s, short, repeats), chain_time(s, k, repeats)
    slope = (t_long - t_short) / (k - short)
    return {"per_node_us": slope * 1e6, "per_run_ms": (t_short - slope * short) * 1e3,
            "whole_chain_us": t_long / k * 1e6}


def transfer_rate(src, dst, nbytes: int, repeats: int) -> float:
    """GiB/s of one transfer node moving a value that is already computed on ``src`` to ``dst``."""
    n = nbytes // 4
    make = pw.compiled(lambda x: x + 1, slice=src, name="make")
    use = pw.compiled(lambda x: x[:1], slice=dst, name="use")
    x = np.zeros(n, np.float32)
    rates = []
    for k in range(repeats + 1):
        resident = make(x)
        resident.run.wait()  # the value exists on src: the transfer below is all that is timed
        run = pw.program(lambda v: use(v), name="move").submit(resident, mode="chained")
        run.wait()
        (t,) = [e for e in run.events if e.kind == "transfer"]
        if k:  # the first round compiles
            rates.append(nbytes / max(t.end - t.dispatch, 1) * 1e9 / 2**30)
    return statistics.median(rates)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", default="1,16,64", help="transfer sizes in MiB")
    ap.add_argument("--transfer-repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = common.parse_args(ap, argv, {"k": 16, "repeats": 1, "sizes": "1", "transfer_repeats": 1})
    why = common.missing("ray")
    if why:
        return common.skipped(args.json, "remote", f"needs Ray for remote islands: {why}")
    import ray

    try:
        init_ray("local", num_cpus=4, include_dashboard=False, log_to_driver=False)  # on 127.0.0.1
    except Exception as e:  # noqa: BLE001 - Ray installed but its local cluster cannot start here (a loaded machine)
        line = (str(e).strip().splitlines() or [""])[0][:200]
        return common.skipped(args.json, "remote", f"Ray is installed but could not start a local cluster here: "
                                                   f"{type(e).__name__}: {line}")
    pw.init()
    # a remote island's slices are traced on as many local devices as it has: at most the devices here
    per_island = common.fit(4)
    note = common.fewer_devices("remote islands of 4 devices each", 4, per_island)
    r0, r1 = pw.add_ray_islands(count=2, devices_per_island=per_island)
    local_a, local_b = pw.slice(1, name="la"), pw.slice(1, name="lb")
    notes = [note] if note else []
    if local_a.devices == local_b.devices:
        notes.append("local -> local: one local device, both slices on it: no transfer to time (row left out)")
        print(notes[-1])
    remote_a, remote_b = pw.slice(1, island=r0.id, name="ra"), pw.slice(1, island=r1.id, name="rb")
    per_node = {
        "local": chain_cost(local_a, args.k, args.repeats),
        "remote": chain_cost(remote_a, args.k, args.repeats),
    }
    sizes = [int(float(m) * (1 << 20)) for m in args.sizes.split(",")]
    pairs = {
        "local -> local (device to device)": (local_a, local_b),
        "local -> remote": (local_a, remote_a),
        "remote -> remote (actor to actor)": (remote_a, remote_b),
        "remote -> local": (remote_a, local_a),
    }
    bandwidth = {
        name: {n: transfer_rate(a, b, n, args.transfer_repeats) for n in sizes} for name, (a, b) in pairs.items()
        if a.devices != b.devices or a.island is not b.island  # one local device: no local -> local transfer
    }
    print(f"remote islands: 2 Ray actors x {per_island} CPU devices; chains of {args.k // 8} and {args.k} tiny nodes")
    for where, c in per_node.items():
        print(f"  {where:<7} each further node {c['per_node_us']:8.1f} µs, fixed per run {c['per_run_ms']:6.2f} ms, "
              f"whole chain of {args.k} {c['whole_chain_us']:8.1f} µs per node")
    print(f"  remote / local per node: {per_node['remote']['per_node_us'] / per_node['local']['per_node_us']:.1f}x")
    print(f"{'transfer':<36}" + "".join(f"{n >> 20:>8} MiB" for n in sizes) + "   (GiB/s)")
    for name, row in bandwidth.items():
        print(f"{name:<36}" + "".join(f"{row[n]:>12.2f}" for n in sizes))
    result = {
        "benchmark": "remote", "machine": common.machine(), "ray": ray.__version__,
        "per_node_us": per_node, "notes": notes,
        "bandwidth_gib_s": {k: {str(n): v for n, v in row.items()} for k, row in bandwidth.items()},
    }
    common.write_json(args.json, result)
    pw.shutdown()
    ray.shutdown()
    return result


if __name__ == "__main__":
    main()

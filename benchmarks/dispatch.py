"""Dispatch: computations per second for K tiny computations, raw JAX vs pw_kernel vs Ray vs Dask.

    python benchmarks/dispatch.py [--k 128] [--repeats 30] [--peer-repeats 5]
                                  [--peers ray_tasks,ray_cg,dask | none] [--json out.json] [--quick]

The paper's Figure 5 in miniature. A chain of K computations, each consuming
the previous one's result, run in three modes:

- OpByOp: one submission per computation; results are passed on without
  waiting (raw JAX: a Python loop of `jax.jit` calls, JAX's own asynchronous
  dispatch; pw: K calls of a CompiledFunction outside a program, each a
  one-node program fed the previous call's `pw.Future`), one wait at the end.
  "OpByOp, wait each" blocks on every result (a round trip per computation).
- Chained: one program of K nodes (`mode="chained"`). Raw JAX has no such
  thing short of fusing.
- Fused: the K computations as one executable (pw `mode="fused"`; for raw
  JAX a hand-written `jax.jit` of the whole chain).

Two variants: `tiny` (``x * 1.0001 + c`` on a 16-element vector, K distinct
functions, a 1-device slice) and `allreduce` (the same with a `psum` over a
4-device slice through `jax.shard_map`; one function called K times). Every
mode runs in this one process, interleaved round by round, in two groups
(see GROUPS): raw JAX op-by-op, Chained and Fused together; then the
OpByOp modes that create K runs per call, with raw JAX op-by-op again as
their reference. Each variant starts on a fresh controller. Figures are
medians of microseconds per computation.

Peers (Ray tasks, Ray Compiled Graphs, Dask futures; see peers.py) run the
tiny chain with numpy in a second phase, interleaved with the raw JAX
op-by-op and pw chained rows again, so their ratios come from the same
minutes of the same machine. Missing peers are reported as such.
"""

from __future__ import annotations

import argparse
import time

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import common
import peers as peers_mod

MODES = ("opbyop", "chained", "fused", "opbyop_wait")


def build_tiny(k: int):
    s = pw.slice(1, name="tiny")
    spec = P("d")
    fs = [
        pw.compiled(lambda x, i=i: x * 1.0001 + (0.5 + i * 1e-6), slice=s, in_specs=spec, out_specs=spec, name=f"op{i}")
        for i in range(k)
    ]
    x = jax.device_put(jnp.ones(16, jnp.float32), s.sharding("d"))
    return s, fs, x


def build_allreduce(k: int, n: int = 4):
    s = pw.slice(n, mesh={"i": n}, name="allreduce")

    def body(x):
        return x * 1.0001 + jax.lax.psum(x, "i") * 1e-6

    f = pw.compiled(
        jax.shard_map(body, mesh=s.mesh, in_specs=P("i"), out_specs=P("i")),
        slice=s, in_specs=P("i"), out_specs=P("i"), name="psum_step",
    )
    x = jax.device_put(jnp.ones(64, jnp.float32), s.sharding("i"))
    return s, [f] * k, x


def contenders(fs, x, sharding):
    """(system, mode) -> a callable running the K-chain once and returning its result."""
    raw = [f.jitted for f in fs]

    def jax_opbyop():
        v = x
        for f in raw:
            v = f(v)
        return v.block_until_ready()

    def jax_opbyop_wait():
        v = x
        for f in raw:
            v = f(v).block_until_ready()
        return v

    def whole(v):
        for f in raw:
            v = f(v)
        return v

    whole_jit = jax.jit(whole, in_shardings=sharding, out_shardings=sharding)

    def jax_fused():
        return whole_jit(x).block_until_ready()

    @pw.program(name="chain")
    def chain(v):
        for f in fs:
            v = f(v)
        return v

    submit_s: list[float] = []

    def pw_chained():
        t = time.perf_counter()
        run = chain.submit(x, mode="chained")
        submit_s.append(time.perf_counter() - t)
        return run.outputs.result()

    def pw_fused():
        return chain.submit(x, mode="fused").outputs.result()

    def pw_opbyop():
        v = x
        for f in fs:
            v = f(v)  # a one-node program; returns a pw.Future at once
        return v.result()

    def pw_opbyop_wait():
        v = x
        for f in fs:
            v = f(v).result()
        return v

    return {
        ("jax", "opbyop"): jax_opbyop,
        ("jax", "opbyop_wait"): jax_opbyop_wait,
        ("jax", "fused"): jax_fused,
        ("pw", "opbyop"): pw_opbyop,
        ("pw", "opbyop_wait"): pw_opbyop_wait,
        ("pw", "chained"): pw_chained,
        ("pw", "fused"): pw_fused,
    }, submit_s


def check_equal(modes: dict, what: str) -> None:
    ref = None
    for key, fn in modes.items():
        got = np.asarray(fn())
        if ref is None:
            ref = got
        elif not np.allclose(got, ref, rtol=1e-5):
            raise AssertionError(f"{what}: {key} computed {got[:4]}..., expected {ref[:4]}...")


#: Modes timed together. The targets' group first; the OpByOp group creates K runs per call in pw,
#: and the garbage and controller history that leaves behind would slow whatever runs next (raw JAX
#: included), so it is timed in a group of its own with raw JAX op-by-op as the shared reference.
GROUPS = {
    "targets": [("jax", "opbyop"), ("pw", "chained"), ("jax", "fused"), ("pw", "fused")],
    "opbyop": [("jax", "opbyop"), ("jax", "opbyop_wait"), ("pw", "opbyop"), ("pw", "opbyop_wait")],
}


def run_group(group: str, modes: dict, k: int, repeats: int, budget_s: float, out: dict) -> None:
    """Time one group of modes, interleaved; medians (µs per computation) into ``out``."""
    keys = GROUPS[group]
    samples = common.interleaved({f"{s}/{m}": modes[s, m] for s, m in keys}, repeats, budget_s=budget_s)
    out["repeats"][group] = len(samples[f"{keys[0][0]}/{keys[0][1]}"])
    out.setdefault("window_s", {})[group] = common.window(samples)
    for key, v in samples.items():
        st = common.per_item_us(v, k)
        system, mode = key.split("/")
        if group == "opbyop" and (system, mode) == ("jax", "opbyop"):
            out["jax_opbyop_in_opbyop_group"] = st.median
            continue
        out["us_per_computation"].setdefault(system, {})[mode] = st.median
        out["spread"].setdefault(system, {})[mode] = st.spread


def submit_us(submit_s: list[float], variant: dict, k: int) -> float:
    """µs per node until `submit` returned, over the timed rounds of the targets' group."""
    return common.Stat.of(submit_s[-variant["repeats"]["targets"]:], 1e6 / k).median


def first_call(name: str, modes: dict, k: int) -> dict:
    t = time.perf_counter()
    check_equal(modes, name)  # also the first call of every mode: traces and compiles everything
    return {"us_per_computation": {}, "spread": {}, "repeats": {}, "first_call_s": time.perf_counter() - t}


def run_peers(names: list[str], k: int, tiny_modes: dict, repeats: int, budget_s: float) -> dict:
    """Each peer's modes interleaved with raw JAX op-by-op and pw chained as references."""
    started: list[peers_mod.Peer] = []
    status: dict[str, str] = {}
    modes: dict[str, object] = {
        "jax/opbyop": tiny_modes[("jax", "opbyop")],
        "pw/chained": tiny_modes[("pw", "chained")],
    }
    want = peers_mod.expected(k)
    for name in names:
        cls = peers_mod.PEERS[name]
        peer = cls()
        t = time.perf_counter()
        try:
            peer.start(k)
            pm = peer.modes()
            for mode, fn in pm.items():
                # A copy: a peer's result may be a view of Ray's shared memory, and an array left over after
                # `ray.shutdown()` unmapped it crashes the process when freed.
                got = np.array(fn(), copy=True)
                if not np.allclose(got, want, rtol=1e-5):
                    raise peers_mod.PeerUnavailable(f"failed: {mode} computed {got[:3]}, expected {want[:3]}")
        except peers_mod.PeerUnavailable as e:
            status[name] = str(e)
            peer.stop()
            print(f"  {cls.label}: {e}")
            continue
        except Exception as e:  # a peer's own failure must not end the benchmark
            status[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            peer.stop()
            print(f"  {cls.label}: {status[name]}")
            continue
        status[name] = "ok"
        print(f"  {cls.label}: started in {time.perf_counter() - t:.1f} s")
        started.append(peer)
        for mode, fn in pm.items():
            modes[f"{name}/{mode}"] = fn
    how = {n: peers_mod.PEERS[n].how for n in names}
    out: dict = {"status": status, "how": how, "us_per_computation": {}, "spread": {}}
    try:
        if started:
            samples = common.interleaved(modes, repeats, warmup=1, budget_s=budget_s, min_repeats=3)
            for key, v in samples.items():
                st = common.per_item_us(v, k)
                system, mode = key.split("/")
                out["us_per_computation"].setdefault(system, {})[mode] = st.median
                out["spread"].setdefault(system, {})[mode] = st.spread
            out["repeats"] = len(samples["pw/chained"])
    finally:
        for p in started:
            p.stop()
        peers_mod.shutdown_ray()
    return out


def targets(result: dict) -> list[dict]:
    t = []
    for var in ("tiny", "allreduce"):
        v = result["variants"].get(var)
        if not v or "us_per_computation" not in v:
            continue
        jx, pwu = v["us_per_computation"]["jax"], v["us_per_computation"]["pw"]
        t.append(common.target(f"{var}: pw chained / JAX op-by-op", pwu["chained"] / jx["opbyop"], 1.5, unit="x"))
        t.append(common.target(f"{var}: pw fused / hand-written jax.jit", pwu["fused"] / jx["fused"], 1.1, unit="x"))
        t.append(common.target(f"{var}: pw fused / JAX op-by-op", pwu["fused"] / jx["opbyop"], 1.0, unit="x",
                               note="faster than JAX op-by-op"))
    pu = result.get("peers", {}).get("us_per_computation", {})
    ref = pu.get("pw", {}).get("chained")
    for name, label in (("ray_tasks", "Ray tasks"), ("dask", "Dask futures")):
        peer = pu.get(name, {}).get("opbyop")
        if ref and peer:
            t.append(common.target(f"{label} (futures chained) / pw chained", peer / ref, 20.0, below=False, unit="x"))
    return t


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=128, help="computations in the chain")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--budget", type=float, default=40.0, help="seconds of timing per variant, at most")
    ap.add_argument("--peers", default="ray_tasks,ray_cg,dask", help="comma-separated, or 'none'")
    ap.add_argument("--peer-repeats", type=int, default=5)
    ap.add_argument("--peer-budget", type=float, default=45.0)
    ap.add_argument("--json", default=None, help="write results here")
    args = common.parse_args(
        ap, argv, {"k": 8, "repeats": 3, "budget": 1.0, "peer_repeats": 2, "peer_budget": 2.0}
    )
    k = args.k

    pw.init()
    result: dict = {"benchmark": "dispatch", "machine": common.machine(), "k": k, "variants": {}}
    m = result["machine"]
    print(f"dispatch: chains of {k} computations on {m['platform']} ({m['device_kind']}), load {m['loadavg']}")

    # tiny: the targets' group, then the peers (against this controller's pw chained), then OpByOp.
    s, fs, x = build_tiny(k)
    modes, submit_s = contenders(fs, x, s.sharding("d"))
    tiny = result["variants"]["tiny"] = first_call("tiny", modes, k)
    run_group("targets", modes, k, args.repeats, args.budget, tiny)
    tiny["pw_chained_submit_returns_us_per_node"] = submit_us(submit_s, tiny, k)
    names = [] if args.peers in ("", "none") else args.peers.split(",")
    if names:
        print("peers:")
        result["peers"] = run_peers(names, k, modes, args.peer_repeats, args.peer_budget)
    run_group("opbyop", modes, k, args.repeats, args.budget, tiny)

    pw.init()  # a fresh controller: no history from the tiny variant
    n = common.fit(4)  # a psum over 4 devices; over the devices present where there are fewer
    note = common.fewer_devices("allreduce", 4, n)
    if note:
        note += f" (a psum over a {n}-device axis: {'no' if n == 1 else 'less'} cross-device traffic)"
    s4, fs4, x4 = build_allreduce(k, n)
    modes, submit_s = contenders(fs4, x4, s4.sharding("i"))
    ar = result["variants"]["allreduce"] = first_call("allreduce", modes, k)
    ar["devices"], ar["note"] = n, note
    run_group("targets", modes, k, args.repeats, args.budget, ar)
    ar["pw_chained_submit_returns_us_per_node"] = submit_us(submit_s, ar, k)
    run_group("opbyop", modes, k, args.repeats, args.budget, ar)
    result["targets"] = targets(result)
    result["machine"]["loadavg_end"] = common.loadavg()

    for var, v in result["variants"].items():
        if "us_per_computation" not in v:
            print(f"\n{var}: {v['status']}")
            continue
        print(f"\n{var}: µs per computation (medians of {v['repeats']} rounds, "
              f"{common.window_note(min(v['window_s'].values()))}; first call {v['first_call_s']:.1f} s)")
        if v.get("note"):
            print(f"  {v['note']}")
        print(f"  {'system':<8}" + "".join(f"{mm:>14}" for mm in MODES))
        for system, row in v["us_per_computation"].items():
            print(f"  {system:<8}" + "".join(f"{row[mm]:>14.2f}" if mm in row else f"{'-':>14}" for mm in MODES))
        print(f"  pw chained: submit returns after {v['pw_chained_submit_returns_us_per_node']:.2f} µs per node")
    if "peers" in result:
        pr = result["peers"]
        print(f"\npeers, tiny chain: µs per computation (median of {pr.get('repeats', 0)})")
        for system, row in pr["us_per_computation"].items():
            print(f"  {system:<10}" + "".join(f"{row[mm]:>14.2f}" if mm in row else f"{'-':>14}" for mm in MODES))
        for name, st in pr["status"].items():
            if st != "ok":
                print(f"  {name}: {st}")
    return common.finish(args.json, result)


if __name__ == "__main__":
    main()

"""Interactive latency: what a notebook user feels per waited call, pw_kernel vs plain JAX.

    python benchmarks/interactive.py [--rounds 200] [--nodes 10] [--k 32] [--budget 20] [--json out.json] [--quick]

Every row waits for its result, as a cell that prints a value does, on a tiny
input (a float32[16] vector on a 1-device slice of the default simulated CPU
devices). pw_kernel and plain JAX run side by side in this one process,
interleaved round by round (see common.interleaved); figures are medians of
microseconds per call.

- single: a one-node `pw.compiled` call, `f(x).result()`, vs
  `jax.jit(f)(x).block_until_ready()`.
- fused: a `@pw.program` of N distinct compiled functions chained on the
  slice, `prog.submit(x, mode="fused").outputs.result()`, vs the hand-written
  `jax.jit` of the same chain.
- chained: the same program with `mode="chained"`, vs that `jax.jit` (ratio
  reported) and vs plain JAX op-by-op (the N jitted functions called in turn,
  one wait at the end).
- wait each: K calls of one-node programs, each fed the previous call's
  `.result()`, vs plain JAX calling each jitted function and blocking on each;
  µs per call.

Two groups, each timed on its own (as in dispatch.py): the program rows first,
then the K-call rows, whose K runs per round leave garbage and controller
history that would slow whatever runs after them.
"""

from __future__ import annotations

import argparse
import gc
import time

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import common

#: key -> (label, pw mode, JAX mode, target ratio or None (reported only), the target's name)
ROWS = {
    "single": ("1 call, waited", "pw/single", "jax/single", 3.0,
               "interactive: f(x).result() / jax.jit(f)(x)"),
    "fused": ("program of {n}, fused", "pw/fused", "jax/fused", 2.0,
              "interactive: fused program of {n} / jax.jit"),
    "chained_vs_jit": ("program of {n}, chained (vs jax.jit)", "pw/chained", "jax/fused", None, None),
    "chained": ("program of {n}, chained (vs JAX op-by-op)", "pw/chained", "jax/opbyop", 1.5,
                "interactive: chained program of {n} / JAX op-by-op"),
    "wait_each": ("{k} calls, wait each (per call)", "pw/wait_each", "jax/wait_each", 3.0,
                  "interactive: {k} calls, wait each / JAX"),
}

#: what each JAX mode runs, for the JSON and the README table
JAX_MODES = {
    "jax/single": "jax.jit(f)(x).block_until_ready()",
    "jax/fused": "hand-written jax.jit of the chain, waited on",
    "jax/opbyop": "the N jitted functions called in turn, one wait at the end",
    "jax/wait_each": "K jitted calls, block_until_ready on each",
}

GROUPS = {
    "program": ["pw/single", "jax/single", "pw/fused", "jax/fused", "pw/chained", "jax/opbyop"],
    "wait_each": ["pw/wait_each", "jax/wait_each"],
}


def step(i: int):
    """The i-th tiny computation of the chain (distinct constants: distinct executables)."""
    return lambda x: x * 1.0001 + (0.5 + i * 1e-6)


def contenders(n: int, k: int) -> dict:
    """Mode name -> a callable doing one timed call (K calls for the wait-each modes) and returning the result."""
    s = pw.slice(1, name="interactive")
    spec = P("d")
    fns = [step(i) for i in range(n)]
    fs = [pw.compiled(fn, slice=s, in_specs=spec, out_specs=spec, name=f"op{i}") for i, fn in enumerate(fns)]
    x = jax.device_put(jnp.ones(16, jnp.float32), s.sharding("d"))

    # Plain JAX as a notebook user writes it: jax.jit of the same Python functions.
    jits = [jax.jit(fn) for fn in fns]

    def whole(v):
        for fn in fns:
            v = fn(v)
        return v

    whole_jit = jax.jit(whole)

    @pw.program(name="interactive_chain")
    def chain(v):
        for f in fs:
            v = f(v)
        return v

    f0, j0 = fs[0], jits[0]

    def pw_single():
        return f0(x).result()

    def jax_single():
        return j0(x).block_until_ready()

    def pw_fused():
        return chain.submit(x, mode="fused").outputs.result()

    def jax_fused():
        return whole_jit(x).block_until_ready()

    def pw_chained():
        return chain.submit(x, mode="chained").outputs.result()

    def jax_opbyop():
        v = x
        for j in jits:
            v = j(v)
        return v.block_until_ready()

    def pw_wait_each():
        v = x
        for i in range(k):
            v = fs[i % n](v).result()
        return v

    def jax_wait_each():
        v = x
        for i in range(k):
            v = jits[i % n](v).block_until_ready()
        return v

    return {
        "pw/single": pw_single, "jax/single": jax_single,
        "pw/fused": pw_fused, "jax/fused": jax_fused,
        "pw/chained": pw_chained, "jax/opbyop": jax_opbyop,
        "pw/wait_each": pw_wait_each, "jax/wait_each": jax_wait_each,
    }


#: objects walked between two timed jit calls by the "after touching" context (a working set like a pw call's)
TOUCHED = 4000


def jit_call_after(modes: dict, rounds: int, per_round: int) -> dict[str, float]:
    """µs of one ``jax.jit`` call (waited), timed alone, after each of three things done untimed before it.

    Why a waited pw call costs more than its Python: the jit call inside it is itself slower
    than in a loop of jit calls, because what runs between two calls (pw's ~75 functions and the
    objects they touch) takes the processor's caches from JAX's C++ dispatch path. Contexts,
    interleaved round by round: another jit call (JAX's hot loop), a pw call
    (``f(x).result()``), and a walk over `TOUCHED` Python objects (no pw at all).
    """
    jax_single, pw_single = modes["jax/single"], modes["pw/single"]
    junk = [object() for _ in range(TOUCHED * 50)]

    def touch():
        for _ in junk[::50]:
            pass

    contexts = {"after a jit call": jax_single, "after a pw call": pw_single,
                f"after touching {TOUCHED:,} objects": touch}
    clock = time.perf_counter_ns
    samples: dict[str, list[float]] = {c: [] for c in contexts}
    for r in range(rounds):
        for name, before in contexts.items():
            total = 0
            for _ in range(per_round):
                before()
                t = clock()
                jax_single()
                total += clock() - t
            samples[name].append(total / per_round / 1e3)
    return {c: sorted(v)[len(v) // 2] for c, v in samples.items()}


def first_calls(modes: dict) -> float:
    """Run every mode once (traces and compiles everything) and check that pairs agree; seconds taken."""
    t = time.perf_counter()
    got = {m: np.asarray(fn()) for m, fn in modes.items()}
    for a, b in (("pw/single", "jax/single"), ("pw/fused", "jax/fused"), ("pw/chained", "jax/opbyop"),
                 ("pw/chained", "jax/fused"), ("pw/wait_each", "jax/wait_each")):
        if not np.allclose(got[a], got[b], rtol=1e-5):
            raise AssertionError(f"{a} computed {got[a][:4]}..., {b} computed {got[b][:4]}...")
    return time.perf_counter() - t


def targets(result: dict) -> list[dict]:
    t = []
    for key, (_, _, _, limit, name) in ROWS.items():
        if limit is None:
            continue
        r = result["rows"][key]
        t.append(common.target(name.format(n=result["nodes"], k=result["k"]), r["ratio"], limit, unit="x"))
    return t


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200, help="interleaved rounds per group")
    ap.add_argument("--nodes", type=int, default=10, help="compiled functions in the program")
    ap.add_argument("--k", type=int, default=32, help="calls of the wait-each rows")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timing per group, at most")
    ap.add_argument("--json", default=None, help="write results here")
    args = common.parse_args(ap, argv, {"rounds": 5, "k": 8, "budget": 1.0})
    n, k = args.nodes, args.k

    pw.init()
    result: dict = {"benchmark": "interactive", "machine": common.machine(), "nodes": n, "k": k,
                    "jax_modes": JAX_MODES, "rows": {}, "repeats": {}, "us_per_call": {}, "spread": {}}
    m = result["machine"]
    print(f"interactive: waited calls on a float32[16] vector, {m['platform']} ({m['device_kind']}), "
          f"load {m['loadavg']}")
    modes = contenders(n, k)
    result["first_call_s"] = first_calls(modes)

    for group, names in GROUPS.items():
        gc.collect()
        samples = common.interleaved({mm: modes[mm] for mm in names}, args.rounds, budget_s=args.budget)
        result["repeats"][group] = len(samples[names[0]])
        result.setdefault("window_s", {})[group] = common.window(samples)
        for mm, v in samples.items():
            st = common.per_item_us(v, k if group == "wait_each" else 1)
            result["us_per_call"][mm] = st.median
            result["spread"][mm] = st.spread

    us = result["us_per_call"]
    for key, (label, pm, jm, limit, _) in ROWS.items():
        result["rows"][key] = {
            "label": label.format(n=n, k=k), "pw": pm, "jax": jm, "pw_us": us[pm], "jax_us": us[jm],
            "ratio": us[pm] / us[jm], "limit": limit,
        }
    result["targets"] = targets(result)
    result["jit_call_after"] = jit_call_after(modes, 3 if common.QUICK else 7, 200 if common.QUICK else 2000)
    result["machine"]["loadavg_end"] = common.loadavg()

    rep = result["repeats"]
    print(f"\nµs per call (medians of {rep['program']} + {rep['wait_each']} interleaved rounds; "
          f"first calls {result['first_call_s']:.1f} s; {common.window_note(min(result['window_s'].values()))})")
    print(f"  {'row':<44}{'pw µs':>10}{'JAX µs':>10}{'pw/JAX':>9}  target")
    for r in result["rows"].values():
        tgt = f"<= {r['limit']:g}x" if r["limit"] is not None else "reported"
        print(f"  {r['label']:<44}{r['pw_us']:>10.1f}{r['jax_us']:>10.1f}{r['ratio']:>9.2f}  {tgt}")
    print("\none jax.jit call (waited, the row above's), timed alone after something untimed "
          "(µs, medians of interleaved rounds; see jit_call_after):")
    for name, us in result["jit_call_after"].items():
        print(f"  {name:<44}{us:>10.1f}")
    print(f"  load average at end: {result['machine']['loadavg_end']}")
    return common.finish(args.json, result)


if __name__ == "__main__":
    main()

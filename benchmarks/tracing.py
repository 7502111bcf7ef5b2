"""Tracing: a loop of K calls of one compiled step traced by pw against `jax.make_jaxpr`; a cell's rerun against its first run.

    python benchmarks/tracing.py [--steps 50,200] [--rounds 7] [--pipeline-steps 10] [--json out.json] [--quick]

Loops: a small MLP training step (value_and_grad + SGD on a 2-device slice, the batch
split over its devices) is one `pw.compiled` function; a Python loop calls it K times.
Side by side in this one process, interleaved round by round:

- pw: ``pw.program(loop).trace(...)`` of a new program each round, and its plan
  (``pw.controller().plan(graph)``): what a new `@pw.program` or an edited cell costs
  before anything runs.
- JAX: ``jax.make_jaxpr(loop)`` of a new loop function each round, calling a `jax.jit` of
  the same step with the same shardings (JAX's cache of the step's own trace is warm for
  both, as it is after a first call).

Cells: through a real IPython shell's ``run_cell``, a ``%%pathways`` cell of the same
loop (K = the first of ``--steps``) run for the first time (its text changed by a comment,
so nothing is reused; JAX's caches warm) against the same text run again (its trace and plan
reused), each run waited for outside the timing; and the cell's very first run in the process
(once: JAX traces the step), which the rerun target compares against. Each is timed until the
run is submitted (`Run.submitted_at`: IPython, the cell's trace and plan) and to the end of
``run_cell`` (also submitting, dispatching on the caller's thread and showing the run). With ``--pipeline-steps`` the same for a cell looping a
4-stage 1F1B pipeline's step (thousands of nodes). Needs IPython (the notebook extra);
skipped, saying so, without it.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import statistics
import time

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import common

TARGET_RATIO = 2.0  # pw trace + plan / make_jaxpr
TARGET_RERUN = 0.05  # a rerun's cell time / its first run's


def loss(p, x, y):
    h = jnp.tanh(x @ p["w1"])
    return jnp.mean((h @ p["w2"] - y) ** 2)


def step_fn(p, x, y):
    value, g = jax.value_and_grad(loss)(p, x, y)
    return jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g), value


def make_loop(step, k: int):
    """A new Python function (so no trace cache knows it) calling ``step`` ``k`` times."""

    def loop(p, x, y):
        for _ in range(k):
            p, value = step(p, x, y)
        return p, value

    return loop


def loops(steps: list[int], rounds: int) -> dict:
    """pw trace + plan against make_jaxpr, per K: medians in ms, their ratio, µs per step."""
    d = common.fit(2)  # the batch split over 2 devices, or 1 where there is one
    s = pw.slice(d, mesh={"data": d}, name="tracing")
    rep, dat = s.sharding(), s.sharding("data")
    step = pw.compiled(step_fn, slice=s, name="step", in_specs=(P(), P("data"), P("data")), out_specs=(P(), P()))
    jstep = jax.jit(step_fn, in_shardings=(rep, dat, dat), out_shardings=(rep, rep))
    k1, k2 = jax.random.split(jax.random.key(0))
    p = jax.device_put({"w1": jax.random.normal(k1, (16, 32)) * 0.1, "w2": jax.random.normal(k2, (32, 4)) * 0.1}, rep)
    x, y = jax.device_put(jnp.ones((8, 16)), dat), jax.device_put(jnp.ones((8, 4)), dat)
    c = pw.controller()

    def first(fn):
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    out: dict = {
        "first_s": {  # in this process, once: the step's own trace (and lowering) included
            "pw": first(lambda: c.plan(pw.program(make_loop(step, steps[0])).trace(p, x, y))),
            "jax": first(lambda: jax.make_jaxpr(make_loop(jstep, steps[0]))(p, x, y)),
        },
        "rows": {},
    }
    for k in steps:
        samples = common.interleaved(
            {
                "pw": lambda k=k: c.plan(pw.program(make_loop(step, k)).trace(p, x, y)),
                "jax": lambda k=k: jax.make_jaxpr(make_loop(jstep, k))(p, x, y),
            },
            rounds,
            warmup=1,
        )
        pw_ms, jax_ms = (statistics.median(samples[m]) * 1e3 for m in ("pw", "jax"))
        out["rows"][k] = {
            "pw_ms": pw_ms, "jax_ms": jax_ms, "ratio": pw_ms / jax_ms, "pw_us_per_step": pw_ms * 1e3 / k,
            "jax_us_per_step": jax_ms * 1e3 / k, "rounds": len(samples["pw"]), "window_s": common.window(samples),
            "spread": {m: common.Stat.of(v).spread for m, v in samples.items()},
        }
    return out


# The same step as the traced loop above, defined in the notebook's namespace as a user would.
SETUP_MLP = """
import jax, jax.numpy as jnp
import pw_kernel as pw
from jax.sharding import PartitionSpec as P
""" + inspect.getsource(loss) + inspect.getsource(step_fn) + """
s = pw.slice(D, mesh={"data": D}, name="cell")
step = pw.compiled(step_fn, slice=s, name="step", in_specs=(P(), P("data"), P("data")), out_specs=(P(), P()))
k1, k2 = jax.random.split(jax.random.key(0))
params = jax.device_put({"w1": jax.random.normal(k1, (16, 32)) * 0.1, "w2": jax.random.normal(k2, (32, 4)) * 0.1},
                        s.sharding())
x, y = jax.device_put(jnp.ones((8, 16)), s.sharding("data")), jax.device_put(jnp.ones((8, 4)), s.sharding("data"))
"""

SETUP_PIPELINE = """
import numpy as np, jax.numpy as jnp
import pw_kernel as pw
S, M, W, B = 4, 8, 128, 64
slices = [pw.slice(D, mesh={"data": D}, name=f"stage{i}") for i in range(S)]
def layer(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])
rng = np.random.default_rng(0)
params = [{"w": rng.standard_normal((W, W), dtype=np.float32) / np.sqrt(W), "b": np.zeros(W, np.float32)}
          for _ in range(S)]
X = rng.standard_normal((B, W), dtype=np.float32)
Y = np.tanh(X @ rng.standard_normal((W, W), dtype=np.float32) / np.sqrt(W))
pipe = pw.pipeline([layer] * S, slices=slices, microbatches=M, schedule="1f1b", learning_rate=0.1, name="1f1b")
p = pipe.place(params)
"""


def cell_rounds(ip, setup: str, body: str, wait: str, rounds: int) -> dict:
    """``run_cell`` of a ``%%pathways`` cell: first runs (new text each time) against reruns of one text."""
    from IPython.utils.capture import capture_output

    ok = ip.run_cell(setup)  # it reads D, the devices per slice, from the namespace
    if not ok.success:
        raise RuntimeError(f"tracing.py: the setup cell failed: {ok.error_in_exec or ok.error_before_exec!r}")
    counter = itertools.count()
    fixed = f"%%pathways\n{body}"

    def timed(text: str) -> tuple[float, float]:
        """(seconds until the cell's run was submitted, seconds of the whole ``run_cell``)."""
        pw.get(ip.user_ns.get(wait))  # the previous run finished: each cell starts on idle devices
        with capture_output():  # the run's view, shown as a notebook would (not printed here)
            t0, t = time.time(), time.perf_counter()
            res = ip.run_cell(text)
            dt = time.perf_counter() - t
        if not res.success:
            raise RuntimeError(f"tracing.py: the cell failed: {res.error_in_exec or res.error_before_exec!r}\n{text}")
        pw.get(ip.user_ns[wait])
        return pw.controller().runs[-1].submitted_at - t0, dt

    modes = {
        "first": lambda: timed(f"%%pathways\n# round {next(counter)}\n{body}"),  # new text: traced anew
        "rerun": lambda: timed(fixed),
    }
    cold = timed(fixed)  # the cell's first run in this process: JAX traces the step
    modes["first"]()  # warm-up of an edited text
    samples: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    names = list(modes)
    for r in range(rounds):
        for m in names[r % 2:] + names[: r % 2]:
            samples[m].append(modes[m]())
    out = {"nodes": len(pw.controller().runs[-1].graph.nodes), "rounds": rounds,
           "cold": {"submitted_ms": cold[0] * 1e3, "cell_ms": cold[1] * 1e3}}
    for m in names:
        out[m] = {what: statistics.median(x[k] for x in samples[m]) * 1e3
                  for k, what in enumerate(("submitted_ms", "cell_ms"))}
    out["ratio"] = out["rerun"]["submitted_ms"] / out["cold"]["submitted_ms"]
    out["ratio_edited"] = out["rerun"]["submitted_ms"] / out["first"]["submitted_ms"]
    return out


def cells(k: int, pipeline_steps: int, rounds: int) -> dict:
    """The cell rows, or why they cannot run here."""
    why = common.missing("IPython")
    if why:
        return {"skipped": why}
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "pw_kernel")
    have = common.device_count()
    ip.user_ns["D"] = common.fit(2, have)  # the MLP cell's slice: 2 devices, or 1 where there is one
    out = {"mlp": {"steps": k, **cell_rounds(ip, SETUP_MLP, f"for _ in range({k}):\n    params, l = step(params, x, y)\n",
                                            "l", rounds)}}
    if pipeline_steps:
        body = f"for _ in range({pipeline_steps}):\n    p, loss = pipe.step(p, X, Y)\n"
        ip.user_ns["D"] = d = common.fit(2, have // 4)  # 4 stages of 2 devices; on fewer, stages share devices
        if d < 2:
            out["note"] = (f"pipeline cell: asks 4 stages x 2 devices, {have} present: measured on 4 stages x {d}"
                           + (f", the stages sharing {have} device{'s' if have > 1 else ''}" if 4 * d > have else ""))
        out["pipeline"] = {"steps": pipeline_steps, **cell_rounds(ip, SETUP_PIPELINE, body, "loss", max(3, rounds - 2))}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", default="50,200", help="loop lengths K (comma-separated)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per row")
    ap.add_argument("--pipeline-steps", type=int, default=10, help="steps of the pipeline cell (0: leave it out)")
    ap.add_argument("--json", default=None, help="write results here")
    args = common.parse_args(ap, argv, {"steps": "5,20", "rounds": 3, "pipeline_steps": 1})
    steps = [int(v) for v in args.steps.split(",")]

    pw.init()
    result: dict = {"benchmark": "tracing", "machine": common.machine(), "steps": steps}
    m = result["machine"]
    print(f"tracing: a loop of K calls of one compiled MLP step, {m['platform']} ({m['device_kind']}), "
          f"load {m['loadavg']} (a loaded machine: the figures move between runs; the ratios less)")
    result["loops"] = lp = loops(steps, args.rounds)
    rounds = min(r["rounds"] for r in lp["rows"].values())
    window = common.window_note(min(r["window_s"] for r in lp["rows"].values()))
    print(f"\nms to trace + plan (medians of {rounds} interleaved rounds, {window}; first in this process: "
          f"pw {lp['first_s']['pw'] * 1e3:.0f} ms, make_jaxpr {lp['first_s']['jax'] * 1e3:.0f} ms)")
    print(f"  {'K':>5}{'pw ms':>10}{'make_jaxpr ms':>15}{'pw/JAX':>9}{'pw µs/step':>12}")
    for k, r in lp["rows"].items():
        print(f"  {k:>5}{r['pw_ms']:>10.2f}{r['jax_ms']:>15.2f}{r['ratio']:>9.2f}{r['pw_us_per_step']:>12.1f}")
    lo, hi = lp["rows"][steps[0]], lp["rows"][steps[-1]]
    result["linearity"] = hi["pw_us_per_step"] / lo["pw_us_per_step"]
    print(f"  linear in K: pw µs per step at K={steps[-1]} / at K={steps[0]}: {result['linearity']:.2f}x")

    result["cells"] = cl = cells(steps[0], args.pipeline_steps, args.rounds)
    if "skipped" in cl:
        print(f"\ncells: skipped: {cl['skipped']}")
    else:
        print(f"\n%%pathways cells through IPython's run_cell (medians; each run waited for outside the timing;"
              f" each figure one cell's run, its first run once: not a timed window)")
        if "note" in cl:
            print(f"  {cl['note']}")
        print("  first: the cell's first run in this process (once); edited: its text changed, traced anew with JAX's")
        print("  caches warm; rerun: the same text again. ms until the run was submitted (IPython, the cell's trace")
        print("  and plan) / ms of the whole run_cell (+ submitting, dispatching, showing the run)")
        print(f"  {'cell':<22}{'nodes':>7}{'first':>17}{'edited':>17}{'rerun':>17}{'rerun/first':>13}"
              f"{'rerun/edited':>14}")
        for name, r in cl.items():
            if name == "note":
                continue
            label = f"{name}, {r['steps']} steps"
            cols = "".join(f"{r[m]['submitted_ms']:>9.2f} /{r[m]['cell_ms']:>6.1f}" for m in ("cold", "first", "rerun"))
            print(f"  {label:<22}{r['nodes']:>7}{cols}{r['ratio']:>12.1%}{r['ratio_edited']:>13.1%}")

    targets = [common.target(f"trace + plan / make_jaxpr, K={k}", r["ratio"], TARGET_RATIO, unit="x")
               for k, r in lp["rows"].items()]
    targets.append(common.target("µs per step, longest K / shortest K (linear)", result["linearity"], 1.5, unit="x"))
    if "skipped" not in cl:
        targets += [common.target(f"cell rerun / first run, {name}", r["ratio"], TARGET_RERUN) for name, r in cl.items()
                    if name != "note"]
    result["targets"] = targets
    result["machine"]["loadavg_end"] = common.loadavg()
    return common.finish(args.json, result)


if __name__ == "__main__":
    main()

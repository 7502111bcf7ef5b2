"""Pipelines: pw_kernel's pipelined step against the same stages as a plain-JAX asynchronous loop.

    python benchmarks/pipeline.py [--layouts 2x1,4x2] [--micro 4,8] [--width 512] [--json out.json] [--quick]

An MLP of S stages (one tanh layer each) on S slices of D devices (layouts
"SxD": 2x1 is two 1-device slices, 4x2 four 2-device slices), trained one SGD
step at a time with GPipe and 1F1B for microbatch counts M. Side by side in
this one process, interleaved round by round:

- pw: `pipe.submit_step(...)` and a wait (one program per step).
- plain JAX: the very same ops in the very same order (`pw.schedule_ops`), each
  a `jax.jit` on its stage's devices, `jax.device_put` between the device
  sets, the gradients accumulated and SGD applied per stage; one wait at the end.

Bubble, for both, from wall time: 1 - busy / wall, where busy is one stage's
compute (its forwards and backwards, each timed alone beforehand) averaged
over stages; beside it (S-1)/(M+S-1), and pw's own bubble from its event log.
Also the most microbatches a stage keeps alive (forward done, backward not).
Reference: the same model data-parallel (SPMD) over all devices as one
`jax.jit` of value_and_grad + SGD.

Schedules (the second table): one model of 2S layers on S slices (layout
``--schedules-layout``), as S stages of two layers for 1F1B and ZB-H1 and as
2S stages of one layer (v = 2 chunks per slice) for interleaved 1F1B. Per
schedule: wall ms per waited step, beside one `jax.jit` of the whole model's
value_and_grad + SGD data-parallel over the same devices (the step a user
would write without pipelining), timed in the same rounds; the bubble of the
schedule replayed on ideal devices next to its paper's formula, the bubble
measured from the step's events (`pipe.stats`), and live activations per
slice, ideal and measured. On a GPU (`jax.devices()[0].platform == "gpu"`)
the same script runs as is; there the measured bubble means something.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import common

LR = 0.1


def layer(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])


def mse(out, target):
    return jnp.mean((out - target) ** 2)


class PlainJax:
    """The pipeline's stages as plain `jax.jit`s on each stage's devices, run by a Python loop."""

    def __init__(self, devsets, M: int, schedule: str):
        self.S, self.M = len(devsets), M
        self.ops = pw.schedule_ops(schedule, self.S, M)
        self.act, self.rep, self.f, self.b, self.acc, self.sgd = [], [], [], [], [], []
        for i, devs in enumerate(devsets):
            mesh = Mesh(np.array(devs), ("data",))
            act, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
            last = i == self.S - 1
            if last:
                fwd = lambda p, x, t: mse(layer(p, x), t)  # noqa: E731
                bwd = lambda p, x, t: jax.vjp(lambda p_, x_: mse(layer(p_, x_), t), p, x)[1](jnp.float32(1.0 / M))  # noqa: E731
            else:
                fwd = layer
                bwd = lambda p, x, dy: jax.vjp(layer, p, x)[1](dy)  # noqa: E731
            acc = lambda p, x, dy, g, bwd=bwd: (lambda dp_dx: (jax.tree_util.tree_map(jnp.add, g, dp_dx[0]), dp_dx[1]))(bwd(p, x, dy))  # noqa: E731
            self.act.append(act)
            self.rep.append(rep)
            self.f.append(jax.jit(fwd, in_shardings=(rep, act, act) if last else (rep, act),
                                  out_shardings=rep if last else act))
            self.b.append(jax.jit(bwd, in_shardings=(rep, act, act), out_shardings=(rep, act)))
            self.acc.append(jax.jit(acc, in_shardings=(rep, act, act, rep), out_shardings=(rep, act)))
            self.sgd.append(jax.jit(lambda p, g: jax.tree_util.tree_map(lambda a, b: a - LR * b, p, g),
                                    in_shardings=(rep, rep), out_shardings=rep))

    def place(self, params, x, y):
        ps = [jax.device_put(p, self.rep[i]) for i, p in enumerate(params)]
        mb = x.shape[0] // self.M
        xs = [jax.device_put(x[m * mb:(m + 1) * mb], self.act[0]) for m in range(self.M)]
        ys = [jax.device_put(y[m * mb:(m + 1) * mb], self.act[-1]) for m in range(self.M)]
        return ps, xs, ys

    def step(self, ps, xs, ys):
        """One SGD step, dispatched asynchronously; returns (new params, loss) unwaited."""
        S = self.S
        stored, acts, cots, grads, losses = {}, {}, {}, [None] * S, []
        for kind, s, m in self.ops:
            if kind == "F":
                inp = xs[m] if s == 0 else jax.device_put(acts.pop((s - 1, m)), self.act[s])
                stored[(s, m)] = inp
                if s == S - 1:
                    losses.append(self.f[s](ps[s], inp, ys[m]))
                else:
                    acts[(s, m)] = self.f[s](ps[s], inp)
            else:
                inp = stored.pop((s, m))
                dy = ys[m] if s == S - 1 else jax.device_put(cots.pop((s, m)), self.act[s])
                if grads[s] is None:
                    grads[s], dx = self.b[s](ps[s], inp, dy)
                else:
                    grads[s], dx = self.acc[s](ps[s], inp, dy, grads[s])
                if s > 0:
                    cots[(s - 1, m)] = dx
        new = [self.sgd[s](ps[s], grads[s]) for s in range(S)]
        return new, losses

    def busy_s(self, ps, xs, ys, repeats: int = 20) -> float:
        """One stage's compute per step (forwards + backwards of all microbatches), averaged over stages."""
        per_stage = []
        for s in range(self.S):
            x = xs[0] if s == 0 else jax.device_put(xs[0], self.act[s])
            args_f = (ps[s], x, ys[0]) if s == self.S - 1 else (ps[s], x)
            dy = ys[0] if s == self.S - 1 else jax.device_put(xs[0], self.act[s])
            f = lambda: self.f[s](*args_f)  # noqa: E731
            b = lambda: self.b[s](ps[s], x, dy)  # noqa: E731
            per_stage.append(self.M * (_alone(f, repeats) + _alone(b, repeats)))
        return statistics.mean(per_stage)


def _alone(fn, repeats: int) -> float:
    """Median seconds of one call, waited, with nothing else in flight (at least `common.MIN_WINDOW_S` of calls)."""
    return statistics.median(common.timed(lambda: jax.block_until_ready(fn()), repeats))


def fit_layout(S: int, D: int, have: int) -> tuple[int, str | None]:
    """Devices per stage for layout SxD on ``have`` devices, and the sentence saying what changed (None if nothing).

    Fewer devices than S x D: each slice gets at most ``have // S`` devices (at least one), and where that is
    still too many, stages share devices (the resource manager time-multiplexes them).
    """
    if S * D <= have:
        return D, None
    d = common.fit(D, have // S)  # a divisor of D: the batch still splits evenly
    shared = S * d > have
    parts = [f"measured as {S}x{d}"] if d != D else []
    if shared:
        parts.append(f"its {S} stages share {have} device{'s' if have > 1 else ''}")
    note = f"layout {S}x{D} asks {S * D} devices, {have} present: {', '.join(parts)}"
    return d, note


def step_stats(run, stages: int):
    evs = [e for e in run.events if e.kind == "compute" and e.node[0] in "FB"]
    by_stage: dict[int, list] = {s: [] for s in range(stages)}
    for e in evs:
        by_stage[int(e.node[1:].split(":")[0])].append(e)
    t0 = min(e.start for e in evs)
    t1 = max(e.end for e in evs)
    span = t1 - t0
    bubbles, live_peaks = [], []
    for s, es in by_stage.items():
        busy = sum(e.end - e.start for e in es)
        bubbles.append(1 - busy / span)
        # live activations: +1 when a forward ends, -1 when its backward ends
        marks = sorted([(e.end, 1 if e.node.startswith("F") else -1) for e in es])
        live = peak = 0
        for _, d in marks:
            live += d
            peak = max(peak, live)
        live_peaks.append(peak)
    return statistics.mean(bubbles), live_peaks, span / 1e9


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layouts", default="2x1,4x2", help="SxD: S stages on slices of D devices each")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--micro", default="4,8")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--budget", type=float, default=8.0, help="seconds of timed rounds per configuration")
    ap.add_argument("--schedules-layout", default="4x2", help="SxD for the schedules table")
    ap.add_argument("--schedules-micro", type=int, default=8, help="M for the schedules table")
    ap.add_argument("--json", default=None)
    args = common.parse_args(ap, argv, {"layouts": "2x1", "width": 64, "batch": 32, "micro": "4", "rounds": 3,
                                        "budget": 0.5, "schedules_layout": "2x1", "schedules_micro": 4})
    W, B = args.width, args.batch
    c = pw.init()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(B, W)).astype(np.float32)
    y = rng.normal(size=(B, W)).astype(np.float32)

    rows, notes = [], []
    have = len(c.devices)
    for layout in args.layouts.split(","):
        S, D = (int(v) for v in layout.split("x"))
        D, note = fit_layout(S, D, have)
        layout = f"{S}x{D}"
        if note:
            notes.append(note)
        params = [{"w": rng.normal(size=(W, W)).astype(np.float32) / np.sqrt(W), "b": np.zeros(W, np.float32)}
                  for _ in range(S)]
        slices = [pw.slice(D, mesh={"data": D}, name=f"{layout}:stage{i}") for i in range(S)]
        for schedule in ("gpipe", "1f1b"):
            for M in [int(m) for m in args.micro.split(",")]:
                if schedule == "1f1b" and M < S:
                    continue
                pipe = pw.pipeline([layer] * S, slices=slices, microbatches=M, schedule=schedule,
                                   learning_rate=LR, name=f"{schedule}{M}")
                p = pipe.place(params)
                # The batch already on the devices that read it, as for plain JAX below.
                px = jax.device_put(x, slices[0].sharding("data"))
                py = jax.device_put(y, slices[-1].sharding("data"))
                plain = PlainJax([s.devices for s in slices], M, schedule)
                jp, jxs, jys = plain.place(params, x, y)
                runs = []

                def pw_step():
                    run = pipe.submit_step(p, px, py, mode="chained")
                    run.wait()
                    runs.append(run)

                def jax_step():
                    jax.block_until_ready(plain.step(jp, jxs, jys))

                walls = common.interleaved({"pw": pw_step, "jax": jax_step}, args.rounds, budget_s=args.budget)
                busy = plain.busy_s(jp, jxs, jys)
                stats = [step_stats(r, S) for r in runs[2:]]  # after the warm-up calls
                w_pw, w_jax = statistics.median(walls["pw"]), statistics.median(walls["jax"])
                rows.append({
                    "layout": layout, "stages": S, "devices_per_stage": D, "schedule": schedule, "M": M,
                    "theory": (S - 1) / (M + S - 1),
                    "wall_ms": {"pw": w_pw * 1e3, "jax": w_jax * 1e3}, "pw_over_jax": w_pw / w_jax,
                    "busy_ms": busy * 1e3,
                    "bubble": {"pw": 1 - busy / w_pw, "jax": 1 - busy / w_jax},
                    "pw_event_log_bubble": statistics.median(s[0] for s in stats),
                    "live_peak_per_stage": [max(s[1][i] for s in stats) for i in range(S)],
                    "samples_per_s": {"pw": B / w_pw, "jax": B / w_jax},
                    "rounds": len(walls["pw"]), "window_s": common.window(walls),
                })

    # SPMD reference: the whole model data-parallel over all devices.
    mesh = Mesh(np.array(c.devices), ("data",))
    rep, dat = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    S0 = int(args.layouts.split(",")[0].split("x")[0])
    ref_params = [{"w": rng.normal(size=(W, W)).astype(np.float32) / np.sqrt(W), "b": np.zeros(W, np.float32)}
                  for _ in range(S0)]

    def loss(ps, x, y):
        h = x
        for q in ps:
            h = layer(q, h)
        return mse(h, y)

    @jax.jit
    def sgd(ps, x, y):
        val, g = jax.value_and_grad(loss)(ps, x, y)
        return jax.tree_util.tree_map(lambda a, b: a - LR * b, ps, g), val

    ps = jax.device_put(ref_params, rep)
    xs, ys = jax.device_put(x, dat), jax.device_put(y, dat)
    spmd = B / _alone(lambda: sgd(ps, xs, ys), max(3, args.rounds))

    print(f"pipeline: width {W}, batch {B}, {jax.devices()[0].platform}, {have} device{'s' if have > 1 else ''}; "
          f"wall ms per step (medians, interleaved; {common.window_note(min(r['window_s'] for r in rows))})")
    for note in notes:
        print(f"  {note}")
    print(f"{'layout':>6} {'schedule':>8} {'M':>3} {'pw ms':>8} {'JAX ms':>8} {'pw/JAX':>7} {'bubble pw':>9} "
          f"{'JAX':>6} {'theory':>7} {'event log':>9} {'live/stage':>14}")
    for r in rows:
        print(f"{r['layout']:>6} {r['schedule']:>8} {r['M']:>3} {r['wall_ms']['pw']:>8.2f} {r['wall_ms']['jax']:>8.2f} "
              f"{r['pw_over_jax']:>7.2f} {r['bubble']['pw']:>9.2f} {r['bubble']['jax']:>6.2f} {r['theory']:>7.2f} "
              f"{r['pw_event_log_bubble']:>9.2f} {str(r['live_peak_per_stage']):>14}")
    print(f"SPMD data-parallel over {len(c.devices)} devices ({S0} layers): {spmd:,.0f} samples/s")
    sched_rows = schedule_rows(args, x, y, rng, have, notes)
    result = {
        "benchmark": "pipeline", "platform": jax.devices()[0].platform, "jax": jax.__version__,
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"), "machine": common.machine(),
        "width": W, "batch": B, "rows": rows, "spmd_samples_per_s": spmd, "spmd_layers": S0,
        "schedules": sched_rows, "devices": have, "notes": notes,
    }
    common.write_json(args.json, result)
    pw.shutdown()
    return result


def two_layers(p, x):
    return layer(p[1], layer(p[0], x))


def schedule_rows(args, x, y, rng, have: int, notes: list[str]) -> list[dict]:
    """1F1B, interleaved (v=2) and ZB-H1 on one model of 2S layers, beside one plain `jax.jit` training step."""
    W, B, M = args.width, args.batch, args.schedules_micro
    S, D = (int(v) for v in args.schedules_layout.split("x"))
    D, note = fit_layout(S, D, have)
    if note:
        notes.append(f"schedules: {note}")
    layout = f"{S}x{D}"
    layers = [{"w": rng.normal(size=(W, W)).astype(np.float32) / np.sqrt(W), "b": np.zeros(W, np.float32)}
              for _ in range(2 * S)]
    slices = [pw.slice(D, mesh={"data": D}, name=f"sched:stage{i}") for i in range(S)]
    pipes = {
        "1f1b": pw.pipeline([two_layers] * S, slices=slices, microbatches=M, schedule="1f1b", learning_rate=LR, name="1f1b"),
        "interleaved": pw.pipeline([layer] * (2 * S), slices=slices, microbatches=M, schedule="interleaved",
                                   learning_rate=LR, name="interleaved"),
        "zero_bubble": pw.pipeline([two_layers] * S, slices=slices, microbatches=M, schedule="zero_bubble",
                                   learning_rate=LR, name="zero_bubble"),
    }
    paired = [layers[2 * i:2 * i + 2] for i in range(S)]
    placed = {k: p.place(layers if k == "interleaved" else paired) for k, p in pipes.items()}
    px = jax.device_put(x, slices[0].sharding("data"))
    py = jax.device_put(y, slices[-1].sharding("data"))
    runs: dict[str, list] = {k: [] for k in pipes}

    def pw_step(k):
        def go():
            run = pipes[k].submit_step(placed[k], px, py, mode="chained")
            run.wait()
            runs[k].append(run)
        return go

    # the same model as one jit: value_and_grad + SGD, data-parallel over the same devices
    devs = list(dict.fromkeys(d for s in slices for d in s.devices))  # stages may share devices
    mesh = Mesh(np.array(devs), ("data",))
    rep, dat = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def loss(ps, x, y):
        h = x
        for q in ps:
            h = layer(q, h)
        return mse(h, y)

    @jax.jit
    def sgd(ps, x, y):
        val, g = jax.value_and_grad(loss)(ps, x, y)
        return jax.tree_util.tree_map(lambda a, b: a - LR * b, ps, g), val

    jps, jx, jy = jax.device_put(layers, rep), jax.device_put(x, dat), jax.device_put(y, dat)
    modes = {k: pw_step(k) for k in pipes}
    modes["jit"] = lambda: jax.block_until_ready(sgd(jps, jx, jy))
    walls = common.interleaved(modes, args.rounds, budget_s=args.budget)
    w_jit = statistics.median(walls["jit"])
    rows = []
    for k, pipe in pipes.items():
        stats = [pipe.stats(r) for r in runs[k][2:]]  # after the warm-up calls
        w = statistics.median(walls[k])
        rows.append({
            "layout": layout, "schedule": k, "M": M, "chunks": pipe.chunks,
            "wall_ms": w * 1e3, "jit_ms": w_jit * 1e3, "pw_over_jit": w / w_jit,
            "theory": stats[0].theory, "ideal_bubble": stats[0].ideal.mean_bubble,
            "measured_bubble": statistics.median(s.bubble for s in stats),
            "live_ideal": list(stats[0].ideal.live),
            "live_measured": [max(s.slices[d].live for s in stats) for d in range(S)],
            "rounds": len(walls[k]), "window_s": common.window(walls),
        })
    print(f"\nschedules: {2 * S} layers on {S} slices of {D} (v=2 for interleaved), M={M}; "
          f"one plain jax.jit training step of the same model: {w_jit * 1e3:.2f} ms "
          f"({common.window_note(common.window(walls))})")
    if note:
        print(f"  {note}")
    print(f"{'schedule':>12} {'pw ms':>8} {'/ jit':>6} {'theory':>7} {'ideal':>6} {'measured':>8} "
          f"{'live ideal':>14} {'live measured':>14}")
    for r in rows:
        print(f"{r['schedule']:>12} {r['wall_ms']:>8.2f} {r['pw_over_jit']:>6.2f} {r['theory']:>7.3f} "
              f"{r['ideal_bubble']:>6.3f} {r['measured_bubble']:>8.2f} {str(r['live_ideal']):>14} "
              f"{str(r['live_measured']):>14}")
    return rows


if __name__ == "__main__":
    main()

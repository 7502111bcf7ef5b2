"""Long runs at real sizes: per-step cost against leaf count, a 100,000-step curve, a real model, the service.

    python benchmarks/long_run.py [--parts leaves,curve,cnn,transformer,service] [--slice one|data8|both]
                                  [--curve-steps 100000] [--transformer-steps 2000] [--json out.json] [--quick]

pw against `jax.jit` of the same step, side by side in one process, interleaved round by round
(`common.interleaved`), reported as ratios pw / jax.jit. Every loop chains: each step's outputs
(futures on the pw side) are the next step's inputs, and a round ends when its last state is ready
(`pw.get` / `jax.block_until_ready`). Compiles are out of the timing (warm-up calls first).

* **leaves**: ``step = jax.tree.map(lambda x: x * 0.999 + 0.001, state)`` on a dict of L float32 (16,)
  arrays, L = 1, 30, 100, 400: µs per step, pw / jax.jit. Targets: 400 leaves <= 2.5x, 30 leaves <= 2x.
  ``--slice one`` (default) on a 1-device slice; ``--slice data8`` on an 8-device slice with a "data"
  axis, state replicated, against jax.jit with the same NamedSharding (skipped, saying why, on a host with
  fewer than 8 devices, e.g. ``PW_NUM_CPU_DEVICES=1``); ``--slice both`` runs both tables.
* **curve**: ``--curve-steps`` (100,000) steps of the 30-leaf step through pw, µs per step and the process's
  RSS printed every ``--curve-every`` (10,000) steps as they come; jax.jit's µs per step over a window
  before and after. Targets: the last window / the second (the first holds the warm-up) <= 1.1; RSS growth
  from the first checkpoint to the end <= 64 MiB. Both curves are drawn into
  ``long_run_curve_<platform>.png`` beside the JSON results (with matplotlib, in the ``bench`` and ``test``
  extras; without it the picture is skipped, saying so).
* **cnn** (needs flax and optax): the CNN of flax's NNX MNIST tutorial (824k parameters) trained with
  optax.adamw on one device, batches of 32 given as numpy and pre-placed, rounds of ``--cnn-steps`` (50)
  steps interleaved with the same step under ``jax.jit``. Target: <= 1.15x.
* **transformer** (needs flax and optax): a 12-layer decoder-only transformer in flax NNX (width 64, 4
  heads, 32 tokens, batch 8, vocab 256), optax.adamw; the train step is a pure function of (params,
  opt_state, tokens) (``nnx.split`` outside, ``nnx.merge`` inside), given to ``pw.compiled`` and to
  ``jax.jit``; 5 interleaved rounds of ``--transformer-steps`` / 5 steps each. ms per step both sides
  (target: pw / jax.jit <= 1.1), the state's leaf count, and both final losses (they must match).
* **service** (needs pyzmq): starts ``python -m pw_kernel serve`` as benchmarks/service.py does; a client
  subprocess (this script, ``--client``: a fresh process whose JAX is the CPU stand-in ``pw.connect``
  wants) runs the 30-leaf loop through the service, interleaved with the same loop on its own devices,
  ``--service-steps`` steps in rounds of ``--service-window``: µs per step in the first and last rounds
  (flatness) and the RSS of the client and of the service process at the start and the end; then the step on
  400 leaves both ways (4 interleaved rounds of a tenth of the window): µs per step, service / local.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import common

LEAVES = (1, 30, 100, 400)
TARGETS = {30: 2.0, 400: 2.5}  # leaves -> pw / jax.jit limit


def step(state):
    """The chained training-like step: every leaf updated, nothing else (the per-leaf cost is the figure)."""
    return jax.tree.map(lambda x: x * 0.999 + 0.001, state)


def leaf_state(n: int) -> dict:
    return {f"w{i:03d}": np.full(16, 1.0 + i / 1000, np.float32) for i in range(n)}


def rss_mib(pid: int | None = None) -> float:
    """Resident memory of a process (this one by default), MiB: psutil when installed, else /proc."""
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss / 2**20
    except ImportError:
        pages = int(Path(f"/proc/{pid or 'self'}/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class Chain:
    """A chained loop of one compiled step; each call runs ``n`` steps from where the last call left off."""

    def __init__(self, fn, state, wait):
        self.fn, self.state, self.wait = fn, state, wait

    def __call__(self, n: int) -> None:
        s = self.state
        for _ in range(n):
            s = self.fn(s)
        self.state = s
        self.wait(s)  # the round ends when its last state is ready


def ready(x) -> None:
    jax.block_until_ready(x)


# ----------------------------------------------------------------------------- leaves
def leaves_part(args, layout: str) -> dict:
    """pw / jax.jit µs per step of the chained step on 1-400 leaves, on a 1-device or 8-device slice."""
    if layout == "data8":
        have = common.device_count()
        if have < 8:
            return skip_part(f"leaves ({layout})", f"asks 8 devices, {have} present (PW_NUM_CPU_DEVICES)")
        s = pw.slice(8, mesh={"data": 8}, name="leaves8")
        repl = s.sharding()
        f = pw.compiled(step, slice=s, in_specs=P(), out_specs=P(), name="step8")
        g = jax.jit(step, in_shardings=repl, out_shardings=repl)
        place, where = (lambda st: jax.device_put(st, repl)), "an 8-device slice (data axis of 8, state replicated)"
    else:
        s = pw.slice(1, name="leaves1")
        f = pw.compiled(step, slice=s, name="step")
        g = jax.jit(step)
        place, where = (lambda st: jax.device_put(st, s.sharding())), "a 1-device slice"  # jit's on it too
    rows = []
    print(f"\nleaves ({layout}): the chained step on L leaves of (16,) float32 on {where}, µs per step "
          f"(medians of interleaved rounds of {args.steps} steps)")
    print(f"  {'leaves':>6} {'pw µs':>10} {'jit µs':>10} {'pw/jit':>8}  target")
    for n in LEAVES:
        st = place(leaf_state(n))
        loops = {"pw": Chain(f, st, pw.get), "jit": Chain(g, st, ready)}
        samples = common.interleaved({k: (lambda c=c: c(args.steps)) for k, c in loops.items()}, args.rounds,
                                     warmup=3)
        us = {k: common.per_item_us(v, args.steps).median for k, v in samples.items()}
        ratio = us["pw"] / us["jit"]
        limit = TARGETS.get(n)
        rows.append({"leaves": n, "us": us, "ratio": ratio, "limit": limit, "rounds": len(samples["pw"]),
                     "window_s": common.window(samples)})
        print(f"  {n:>6} {us['pw']:>10,.1f} {us['jit']:>10,.1f} {ratio:>8.2f}  "
              + (f"<= {limit:g}x" if limit else "reported") + f"  ({len(samples['pw'])} rounds)", flush=True)
    print(f"  ({common.window_note(min(r['window_s'] for r in rows))})")
    s.release()
    return {"layout": layout, "steps": args.steps, "rows": rows}


def skip_part(part: str, why: str) -> dict:
    print(f"\n{part}: skipped: {why}")
    return {"skipped": why}


# ----------------------------------------------------------------------------- curve
def curve_part(args, png_dir: Path) -> dict:
    """A long pw run of the 30-leaf step: µs per step and RSS every ``curve_every`` steps, flatness, growth."""
    s = pw.slice(1, name="curve")
    f = pw.compiled(step, slice=s, name="curve_step")
    g = jax.jit(step)
    every, total = args.curve_every, args.curve_steps
    st = jax.device_put(leaf_state(30), s.sharding())  # both sides on the slice's device
    pw_loop, jit_loop = Chain(f, st, pw.get), Chain(g, st, ready)
    for _ in range(3):  # compiles out of the timing
        pw_loop(10)
        jit_loop(10)

    def jit_window() -> float:
        t = time.perf_counter()
        jit_loop(every)
        return (time.perf_counter() - t) / every * 1e6

    print(f"\ncurve: {total:,} steps of the 30-leaf chained step through pw on 1 device; µs per step and "
          f"RSS every {every:,} steps")
    jit_start = jit_window()
    print(f"  {'step':>9} {'µs/step':>9} {'RSS MiB':>9}")
    points = []
    done = 0
    while done < total:
        t = time.perf_counter()
        pw_loop(every)
        done += every
        points.append({"step": done, "us": (time.perf_counter() - t) / every * 1e6, "rss_mib": rss_mib()})
        print(f"  {done:>9,} {points[-1]['us']:>9.1f} {points[-1]['rss_mib']:>9.1f}", flush=True)
    jit_end = jit_window()
    s.release()
    second = points[1]["us"] if len(points) > 1 else points[0]["us"]
    flat = points[-1]["us"] / second
    growth = points[-1]["rss_mib"] - points[0]["rss_mib"]
    print(f"  jax.jit µs/step over {every:,} steps: {jit_start:.1f} before, {jit_end:.1f} after "
          f"(pw / jit: {second / jit_start:.2f}x at the start, {points[-1]['us'] / jit_end:.2f}x at the end)")
    print(f"  last window / second window: {flat:.3f}x (target <= 1.1)")
    print(f"  RSS growth, first checkpoint to the end: {growth:.1f} MiB (target <= 64 MiB)")
    png = png_dir / f"long_run_curve_{jax.devices()[0].platform}.png"
    drew = draw_curve(png, points, (jit_start, jit_end))
    print(f"  curve picture: {png}" if drew == "drawn" else f"  curve picture: {drew}")
    return {"steps": total, "every": every, "points": points, "jit_us": {"start": jit_start, "end": jit_end},
            "flatness": flat, "rss_growth_mib": growth, "png": str(png)}


# ----------------------------------------------------------------------------- the PNG
def draw_curve(path: Path, points: list[dict], jit: tuple[float, float]) -> str:
    """µs per step (jax.jit's before and after: a grey line) and RSS against the step, two panels (matplotlib)."""
    why = common.missing("matplotlib")
    if why is not None:
        return f"skipped: {why}"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    xs = [p["step"] for p in points]
    fig, axes = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for ax, (label, key) in zip(axes, (("µs per step", "us"), ("RSS (MiB)", "rss_mib"))):
        ax.plot(xs, [p[key] for p in points], marker="o", label="pw")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
    axes[0].plot([xs[0], xs[-1]], jit, color="grey", marker="x", label="jax.jit (before, after)")
    axes[0].legend()
    axes[0].set_title(f"{xs[-1]:,} chained steps, 30 leaves")
    axes[-1].set_xlabel("step")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return "drawn"


# ----------------------------------------------------------------------------- transformer
VOCAB = 256


def make_model(layers: int, width: int, heads: int, seq: int):
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln1, self.ln2 = nnx.LayerNorm(width, rngs=rngs), nnx.LayerNorm(width, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=width, decode=False, rngs=rngs)
            self.up, self.down = nnx.Linear(width, 4 * width, rngs=rngs), nnx.Linear(4 * width, width, rngs=rngs)

        def __call__(self, x, mask):
            x = x + self.attn(self.ln1(x), mask=mask)
            return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))

    class Decoder(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(VOCAB, width, rngs=rngs)
            self.pos = nnx.Param(jax.random.normal(rngs.params(), (seq, width)) * 0.02)
            self.blocks = nnx.List([Block(rngs) for _ in range(layers)])
            self.ln = nnx.LayerNorm(width, rngs=rngs)
            self.head = nnx.Linear(width, VOCAB, rngs=rngs)

        def __call__(self, tokens):
            x = self.embed(tokens) + self.pos[...][: tokens.shape[1]]
            mask = nnx.make_causal_mask(tokens)
            for b in self.blocks:
                x = b(x, mask)
            return self.head(self.ln(x))

    return Decoder(nnx.Rngs(0))


def make_train_step(graphdef, tx):
    import optax
    from flax import nnx

    def train_step(params, opt_state, tokens):  # a pure pytree function: the module is rebuilt inside
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def token_batches(n: int, batch: int, seq: int) -> list[np.ndarray]:
    """``n`` batches of byte tokens of a repetitive text (so the loss falls), ``seq + 1`` each row."""
    text = np.frombuffer(b"the quick brown fox jumps over the lazy dog; " * 200, np.uint8).astype(np.int32)
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(text) - seq - 1, size=(n, batch))
    return [np.stack([text[s:s + seq + 1] for s in row]) for row in starts]


def transformer_part(args) -> dict:
    why = common.missing("flax") or common.missing("optax")
    if why:
        return skip_part("transformer", why)
    import optax
    from flax import nnx

    width, heads, seq, batch = 64, 4, 32, 8
    s = pw.slice(1, name="transformer")
    graphdef, params = nnx.split(make_model(args.layers, width, heads, seq))
    tx = optax.adamw(1e-3)
    params, opt_state = jax.device_put((params, tx.init(params)), s.sharding())  # both sides on the slice's device
    leaves = len(jax.tree.leaves((params, opt_state)))
    train_step = make_train_step(graphdef, tx)
    batches = [jax.device_put(b, s.sharding()) for b in token_batches(16, batch, seq)]
    sides = {"pw": pw.compiled(train_step, slice=s, name="train_step"), "jit": jax.jit(train_step)}
    state = {k: (params, opt_state, None, 0) for k in sides}  # (params, opt_state, last loss, steps done)
    waits = {"pw": pw.get, "jit": ready}

    def run(side: str, n: int) -> None:
        p, o, loss, k = state[side]
        for i in range(k, k + n):
            p, o, loss = sides[side](p, o, batches[i % len(batches)])
        waits[side]((p, loss))
        state[side] = (p, o, loss, k + n)

    for side in sides:  # compiles out of the timing
        run(side, 2)
    per_round = max(1, args.transformer_steps // args.transformer_rounds)
    samples = common.interleaved({k: (lambda k=k: run(k, per_round)) for k in sides}, args.transformer_rounds,
                                 warmup=0)
    ms = {k: common.per_item_us(v, per_round).median / 1e3 for k, v in samples.items()}
    ratio = ms["pw"] / ms["jit"]
    loss = {"pw": float(np.asarray(pw.get(state["pw"][2]))), "jit": float(state["jit"][2])}
    match = bool(np.isclose(loss["pw"], loss["jit"], rtol=1e-4, atol=1e-5))
    rounds, steps = len(samples["pw"]), state["pw"][3]
    s.release()
    print(f"\ntransformer: {args.layers}-layer decoder (flax NNX), width {width}, {heads} heads, {seq} tokens, batch "
          f"{batch}, vocab {VOCAB}, optax.adamw; {leaves} leaves in (params, opt_state); {rounds} interleaved rounds "
          f"of {per_round} steps ({common.window_note(common.window(samples))})")
    print(f"  pw       {ms['pw']:>9.3f} ms/step")
    print(f"  jax.jit  {ms['jit']:>9.3f} ms/step")
    print(f"  pw / jit {ratio:>9.3f}x  (target <= 1.1)")
    print(f"  final loss after {steps} steps: pw {loss['pw']:.6f}, jax.jit {loss['jit']:.6f} "
          f"({'match' if match else 'DIFFER'})")
    return {"layers": args.layers, "leaves": leaves, "ms": ms, "ratio": ratio, "rounds": rounds,
            "steps_per_round": per_round, "steps": steps, "loss": loss, "losses_match": match,
            "window_s": common.window(samples)}


# ----------------------------------------------------------------------------- cnn
def make_cnn():
    """The CNN of flax's NNX MNIST tutorial: two 3x3 convolutions with average pooling, two dense layers."""
    from flax import nnx

    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
            self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
            self.linear1 = nnx.Linear(3136, 256, rngs=rngs)
            self.linear2 = nnx.Linear(256, 10, rngs=rngs)

        def __call__(self, x):
            pool = lambda h: nnx.avg_pool(h, window_shape=(2, 2), strides=(2, 2))  # noqa: E731
            x = pool(nnx.relu(self.conv1(x)))
            x = pool(nnx.relu(self.conv2(x)))
            return self.linear2(nnx.relu(self.linear1(x.reshape(x.shape[0], -1))))

    return CNN(nnx.Rngs(0))


def cnn_part(args) -> dict:
    """The tutorial's CNN trained with AdamW on one device, batches of 32 as numpy and pre-placed."""
    why = common.missing("flax") or common.missing("optax")
    if why:
        return skip_part("cnn", why)
    import optax
    from flax import nnx

    s = pw.slice(1, name="cnn")
    graphdef, params = nnx.split(make_cnn())
    tx = optax.adamw(1e-3)
    params, opt_state = jax.device_put((params, tx.init(params)), s.sharding())

    def train_step(params, opt_state, x, y):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(0)
    host = [(rng.standard_normal((32, 28, 28, 1), np.float32), rng.integers(0, 10, 32).astype(np.int32))
            for _ in range(8)]
    placed = [jax.device_put(b, s.sharding()) for b in host]
    sides = {"pw": (pw.compiled(train_step, slice=s, name="cnn_step"), pw.get), "jit": (jax.jit(train_step), ready)}
    n = args.cnn_steps

    def run(side: str, batches: list) -> None:
        fn, wait = sides[side]
        p, o, loss = params, opt_state, None
        for i in range(n):
            p, o, loss = fn(p, o, *batches[i % len(batches)])
        wait(loss)

    rows = {}
    for name, batches in (("numpy", host), ("placed", placed)):
        for side in sides:
            run(side, batches)  # compiles out of the timing
        samples = common.interleaved({k: (lambda k=k, b=batches: run(k, b)) for k in sides}, args.rounds, warmup=0)
        ms = {k: common.per_item_us(v, n).median / 1e3 for k, v in samples.items()}
        rows[name] = {"ms": ms, "ratio": ms["pw"] / ms["jit"], "rounds": len(samples["pw"])}
    leaves = len(jax.tree.leaves((params, opt_state)))
    s.release()
    print(f"\ncnn: flax NNX MNIST tutorial's CNN ({sum(x.size for x in jax.tree.leaves(params)):,} parameters, "
          f"{leaves} leaves with AdamW), batches of 32, 1 device; interleaved rounds of {n} steps")
    for name, r in rows.items():
        print(f"  {name:6s}  pw {r['ms']['pw']:8.3f} ms/step  jax.jit {r['ms']['jit']:8.3f}  pw / jit "
              f"{r['ratio']:.3f}x  (target <= 1.15)")
    return {"rows": rows, "leaves": leaves, "steps_per_round": n}


# ----------------------------------------------------------------------------- service
def service_part(args) -> dict:
    """The 30-leaf loop through a service of its own, measured by a client subprocess (see `client_main`)."""
    why = common.missing("zmq")
    if why:
        return skip_part("service", why)
    from service import start_service, stop_service  # benchmarks/service.py: as it starts and stops its own

    tmp = Path(tempfile.mkdtemp(prefix="pw-bench-long-run-"))
    conn = tmp / "conn.json"
    svc = start_service(conn, tmp / "service.log")
    try:
        n = json.loads(conn.read_text())["devices"]
        env = {k: v for k, v in os.environ.items() if k != "PW_VALIDATE"}
        # A client's JAX: CPU stand-ins of the service's device count (what pw.connect asks for).
        env.update(JAX_PLATFORMS="cpu", PW_NUM_CPU_DEVICES=str(n),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(common.ROOT), str(Path(__file__).parent),
                                                            env.get("PYTHONPATH")])))
        cmd = [sys.executable, __file__, "--client", str(conn), "--service-steps", str(args.service_steps),
               "--service-window", str(args.service_window)]
        proc = subprocess.run(cmd, env=env, cwd=common.ROOT, capture_output=True, text=True, timeout=600, check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise RuntimeError(f"the service client exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        res = json.loads(lines[-1][len("RESULT "):]) | {"devices": n}
    finally:
        stop_service(svc)
        shutil.rmtree(tmp, ignore_errors=True)
    res["us"]["unconnected"] = unconnected(res["window"], res["rounds"])
    print_service(res)
    return res


def unconnected(w: int, rounds: int) -> list[float]:
    """The same loop in this process (never connected), as many windows, after the client: µs per step each."""
    s = pw.slice(1, name="unconnected")
    loop = Chain(pw.compiled(step, slice=s, name="step"), leaf_state(30), pw.get)
    for _ in range(3):
        loop(min(w, 50))
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        loop(w)
        out.append((time.perf_counter() - t) / w * 1e6)
    s.release()
    return out


def client_main(args) -> None:
    """In the client subprocess: the loop through the service and on local devices, rounds interleaved."""
    pw.connect(args.client, name="long_run")
    svc_pid = json.loads(Path(args.client).read_text())["pid"]
    local_island = next(i.id for i in pw.islands() if i.remote is None)
    served = pw.compiled(step, slice=pw.slice(1, name="served"), name="step")
    local = pw.compiled(step, slice=pw.slice(1, name="local", island=local_island), name="step")
    loops = {"service": Chain(served, leaf_state(30), pw.get), "local": Chain(local, leaf_state(30), pw.get)}
    w = args.service_window
    for c in loops.values():  # compiles (in the service, for the served one) out of the timing
        for _ in range(3):
            c(min(w, 50))
    rss = lambda: {"client": rss_mib(), "service": rss_mib(svc_pid)}
    rss0, trail = rss(), []

    def served_round() -> None:
        loops["service"](w)
        trail.append(rss())  # (a few µs in a window of thousands of steps): the shape of any growth

    rounds = max(2, args.service_steps // w)
    samples = common.interleaved({"service": served_round, "local": lambda: loops["local"](w)}, rounds, warmup=0,
                                 min_window_s=0)
    us = {k: [t / w * 1e6 for t in v] for k, v in samples.items()}
    rss1 = rss()
    # A real model's state: the step on 400 leaves, through the service and locally (each leaf a handle, a
    # future and an output there; the few smallest come back with the reply).
    big = {"service": Chain(served, leaf_state(400), pw.get), "local": Chain(local, leaf_state(400), pw.get)}
    wb = max(10, w // 10)
    for c in big.values():
        c(5)
    big_samples = common.interleaved({k: (lambda c=c: c(wb)) for k, c in big.items()}, 4, warmup=0, min_window_s=0)
    us400 = {k: common.Stat.of([t / wb * 1e6 for t in v]).median for k, v in big_samples.items()}
    pw.disconnect()
    print("RESULT " + json.dumps({"window": w, "rounds": rounds, "us": us, "rss_start": rss0, "rss_end": rss1,
                                  "rss_rounds": trail, "leaves400": us400 | {"window": wb}}), flush=True)


def print_service(res: dict) -> None:
    us, w = res["us"], res["window"]
    print(f"\nservice: the 30-leaf chained step through the Pathways service ({res['devices']} devices, a service "
          f"process), from a client subprocess; {res['rounds']} rounds of {w:,} steps interleaved with the same loop "
          f"on the client's own devices (a local slice, not through the service); then the same windows in this process, which is not connected")
    print(f"  {'µs/step':<22} {'first':>9} {'last':>9} {'median':>9} {'last/first':>11}")
    for k, label in (("service", "through the service"), ("local", "client's own devices"),
                     ("unconnected", "not connected (after)")):
        xs = us[k]
        print(f"  {label:<22} {xs[0]:>9.1f} {xs[-1]:>9.1f} {common.Stat.of(xs).median:>9.1f} {xs[-1] / xs[0]:>10.2f}x")
    med = {k: common.Stat.of(v).median for k, v in us.items()}
    print(f"  service / client's own devices: {med['service'] / med['local']:.2f}x; service / not connected: "
          f"{med['service'] / med['unconnected']:.2f}x (medians)")
    print(f"  {'RSS MiB':<22} {'start':>9} {'end':>9} {'growth':>9}")
    for k in ("client", "service"):
        a, b = res["rss_start"][k], res["rss_end"][k]
        print(f"  {k:<22} {a:>9.1f} {b:>9.1f} {b - a:>9.1f}")
    for k in ("client", "service"):  # after each round through the service: a leak grows steadily, a bound levels
        per_kib = (res["rss_end"][k] - res["rss_start"][k]) * 1024 / (res["rounds"] * w)
        print(f"  {k} RSS after each round, MiB: " + ", ".join(f"{r[k]:.0f}" for r in res["rss_rounds"])
              + f" ({per_kib:.2f} KiB per step through the service)")
    big = res["leaves400"]
    print(f"  400 leaves, µs/step (4 rounds of {big['window']} steps, medians): through the service "
          f"{big['service']:.0f}, the client's own devices {big['local']:.0f}: {big['service'] / big['local']:.2f}x")


# ----------------------------------------------------------------------------- main
def targets_of(res: dict) -> list[dict]:
    out = []
    for layout in ("one", "data8"):
        for r in res.get(f"leaves_{layout}", {}).get("rows", []):
            if r["limit"]:
                out.append(common.target(f"leaves ({layout}): {r['leaves']} leaves, pw / jax.jit µs per step",
                                         r["ratio"], r["limit"], unit="x"))
    c = res.get("curve", {})
    if "flatness" in c:
        out.append(common.target(f"curve: µs/step, last {c['every']:,} steps / second", c["flatness"], 1.1, unit="x"))
        out.append(common.target("curve: RSS growth, first checkpoint to end", c["rss_growth_mib"], 64, unit=" MiB"))
    for name, r in res.get("cnn", {}).get("rows", {}).items():
        out.append(common.target(f"cnn ({name} batches): pw / jax.jit ms per step", r["ratio"], 1.15, unit="x"))
    t = res.get("transformer", {})
    if "ratio" in t:
        out.append(common.target(f"transformer ({t['layers']} layers): pw / jax.jit ms per step", t["ratio"], 1.1,
                                 unit="x"))
    return out


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="leaves,curve,cnn,transformer,service")
    ap.add_argument("--cnn-steps", type=int, default=50, help="steps per round of the CNN")
    ap.add_argument("--slice", default="one", choices=("one", "data8", "both"), help="the leaves part's layout")
    ap.add_argument("--steps", type=int, default=200, help="leaves: steps per round")
    ap.add_argument("--rounds", type=int, default=7, help="leaves: rounds (at least)")
    ap.add_argument("--curve-steps", type=int, default=100_000)
    ap.add_argument("--curve-every", type=int, default=10_000)
    ap.add_argument("--layers", type=int, default=12, help="transformer layers")
    ap.add_argument("--transformer-steps", type=int, default=2000)
    ap.add_argument("--transformer-rounds", type=int, default=5)
    ap.add_argument("--service-steps", type=int, default=40_000)
    ap.add_argument("--service-window", type=int, default=4_000)
    ap.add_argument("--client", default=None, help=argparse.SUPPRESS)  # the service part's client subprocess
    ap.add_argument("--json", default=None)
    args = common.parse_args(ap, argv, quick={
        "steps": 20, "rounds": 2, "cnn_steps": 3, "curve_steps": 3_000, "curve_every": 500, "transformer_steps": 8,
        "transformer_rounds": 2, "layers": 2,
        "service_steps": 400, "service_window": 100})
    if args.client:
        client_main(args)
        return None
    parts = args.parts.split(",")
    png_dir = Path(args.json).resolve().parent if args.json else common.RESULTS
    print(f"long_run: {common.device_count()} {jax.devices()[0].platform} device(s); load average {common.loadavg()}")
    res: dict = {}
    if "leaves" in parts:
        for layout in (("one", "data8") if args.slice == "both" else (args.slice,)):
            res[f"leaves_{layout}"] = leaves_part(args, layout)
    if "curve" in parts:
        res["curve"] = curve_part(args, png_dir)
    if "cnn" in parts:
        res["cnn"] = cnn_part(args)
    if "transformer" in parts:
        res["transformer"] = transformer_part(args)
    if "service" in parts:
        res["service"] = service_part(args)
    result = {"benchmark": "long_run", "machine": common.machine(),
              "args": {k: v for k, v in vars(args).items() if k not in ("json", "client")}, **res,
              "targets": targets_of(res)}
    return common.finish(args.json, result)


if __name__ == "__main__":
    main()

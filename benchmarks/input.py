"""Input pipelines: a training loop fed by `pw.prefetch` against the same loop with every batch placed beforehand.

    python benchmarks/input.py [--steps 24] [--rounds 3] [--width 512] [--sources ...] [--json out.json] [--quick]

Each batch takes half a step to load, either waiting on storage (a sleep) or
working on the host's CPU (Python that tokenizes text, as a tokenizer holding the
GIL does), read from a generator or from a grain ``MapDataset`` (each batch one
record whose read waits or works so long; by default the MapDataset with storage
latency, ``--sources generator:sleep,generator:cpu,grain:sleep,grain:cpu`` for all
four). Side by side in one process, interleaved round by round:

- ``placed``: every batch loaded and placed before the loop (the ceiling);
- ``prefetch``: ``for x, y in pw.prefetch(source, to=...)``, loading on threads of its own;
- ``inline``: the loop loads each batch itself (a MapDataset: ``ds[i]``), then submits
  the step with the numpy batch.

Each is run two ways: ``async`` submits every step without waiting (pw's way: the
loop runs ahead of the devices) and ``logged`` reads each step's loss (a loop
that prints its loss). Targets: prefetch >= 0.9x the steps/s of placed, and above
inline, for storage latency, from a generator and from a grain MapDataset. For
CPU-bound loading the host work and the simulated devices share the same cores
(2 on the reference machine): the ratio says what that costs. The same is measured
for a pipelined step (2 stages on 2 slices).
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

B = 256  # examples per batch


def make_step(s, width: int):
    @pw.compiled(slice=s, in_specs=(P(), P("data"), P("data")), name="train_step")
    def step(w, x, y):
        def loss_fn(w):
            h = x
            for _ in range(4):
                h = jnp.tanh(h @ w)
            return jnp.mean((h - y) ** 2)

        loss, g = jax.value_and_grad(loss_fn)(w)
        return w - 0.01 * g, loss

    return step


def batches(n: int, width: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(B, width)).astype(np.float32), rng.normal(size=(B, width)).astype(np.float32))
            for _ in range(n)]


def tokenize_cost(text: str) -> int:
    """Host work that holds the GIL, as a Python tokenizer does: a hash per character."""
    acc = 0
    for c in text:
        acc = (acc * 31 + ord(c)) & 0xFFFF
    return acc


#: The sources measured by default, as reader:load. A grain MapDataset with CPU-bound records
#: ("grain:cpu") on request (--sources): its figures follow the generator's, and the run stays
#: within run_all's time for this script.
SOURCES = "generator:sleep,generator:cpu,grain:sleep"


def source(data, load_s: float, kind: str, text_len: int, reader: str = "generator"):
    """The batches of ``data``, each after ``load_s`` of storage latency ("sleep") or CPU work ("cpu").

    ``reader="grain"``: a ``grain.MapDataset`` of them, each record's read taking that long (as a
    dataset of one file per batch on slow storage would).
    """
    text = ("the quick brown fox " * (text_len // 20 + 1))[:text_len]

    def load(batch):
        if kind == "sleep":
            time.sleep(load_s)
        else:
            tokenize_cost(text)
        return batch

    if reader == "grain":
        import grain

        return grain.MapDataset.source(data).map(load)
    return (load(b) for b in data)


def by_index(ds):
    """A loop that reads a MapDataset itself, one record after the other (no reader threads)."""
    return (ds[i] for i in range(len(ds)))


def calibrate_cpu(load_s: float) -> int:
    """How many characters `tokenize_cost` goes through in ``load_s`` on this machine."""
    n = 100_000
    t = time.perf_counter()
    tokenize_cost("x" * n)
    per_char = (time.perf_counter() - t) / n
    return max(1000, int(load_s / per_char))


def run_loop(kind_of_feed: str, step, w0, data, placed, load, to, logged: bool):
    """One pass of the loop over ``data``; returns when the last step is done."""
    w = w0
    if kind_of_feed == "placed":
        feed = placed
    elif kind_of_feed == "prefetch":
        feed = pw.prefetch(load(), to=to, depth=2)
    else:
        feed = load()
        if hasattr(feed, "__getitem__") and not isinstance(feed, list):  # a MapDataset: by index
            feed = by_index(feed)
    loss = None
    for x, y in feed:
        w, loss = step(w, x, y)
        if logged:
            loss.result()
    return jax.block_until_ready(pw.get(loss))


def scenario(name: str, step, w0, data, placed, load_kind: str, load_s: float, text_len: int, to, rounds: int,
             reader: str = "generator") -> dict:
    load = lambda: source(data, load_s, load_kind, text_len, reader)  # noqa: E731
    modes = {}
    for style in ("async", "logged"):
        for feed in ("placed", "prefetch", "inline"):
            modes[f"{feed}/{style}"] = (lambda f=feed, s=style: run_loop(f, step, w0, data, placed, load, to, s == "logged"))
    samples = common.interleaved(modes, rounds, warmup=1)
    load_label = load_kind if reader == "generator" else f"{reader} {load_kind}"  # "sleep", "grain sleep"
    label = f"{name:9s} {load_label:5s}"
    print(f"{label} ({common.window_note(common.window(samples))})")
    med = {k: common.Stat.of(v).median for k, v in samples.items()}
    n = len(data)
    out = {"load": load_label, "kind": load_kind, "reader": reader, "load_ms": load_s * 1e3, "steps": n,
           "window_s": common.window(samples), "steps_per_s": {k: n / t for k, t in med.items()}}
    for style in ("async", "logged"):
        ref = med[f"placed/{style}"]
        out[style] = {"prefetch": ref / med[f"prefetch/{style}"], "inline": ref / med[f"inline/{style}"]}
        print(f"{label} {style:6s}: placed {n / ref:6.1f} steps/s; prefetch "
              f"{out[style]['prefetch']:.2f}x, inline {out[style]['inline']:.2f}x of placed")
    return out


def step_time(fn, rounds: int = 3) -> float:
    """The fastest of at least ``rounds`` passes of ``fn``, timed over at least `common.MIN_WINDOW_S` in all."""
    return min(common.timed(fn, rounds))


def data_parallel(args) -> list[dict]:
    n = common.fit(8)  # a data axis of 8, or of the devices present (every batch still splits evenly)
    note = common.fewer_devices("data-parallel step", 8, n)
    s = pw.slice(n, mesh={"data": n}, name="dp")
    step = make_step(s, args.width)
    data = batches(args.steps, args.width)
    placed = [jax.device_put(b, s.sharding("data")) for b in data]
    w0 = jax.device_put(np.eye(args.width, dtype=np.float32), s.sharding())
    per_step = step_time(lambda: run_loop("placed", step, w0, data, placed, None, s, False)) / args.steps
    load_s = per_step / 2
    print(f"data-parallel step on {n} devices: {per_step * 1e3:.1f} ms; each batch loads in {load_s * 1e3:.1f} ms")
    text_len = calibrate_cpu(load_s)
    return [{**scenario("dp", step, w0, data, placed, kind, load_s, text_len, s, args.rounds, reader), "devices": n,
             "note": note} for reader, kind in args.sources]


def pipelined(args) -> list[dict]:
    have = common.device_count()
    d = common.fit(4, have // 2)  # 2 stages of 4 devices; on fewer, stages may share a device
    note = None
    if d < 4:
        note = (f"pipelined step: asks 2 stages x 4 devices, {have} present: measured on 2 stages x {d}"
                + (f", the stages sharing {have} device{'s' if have > 1 else ''}" if 2 * d > have else ""))
        print(note)
    slices = [pw.slice(d, mesh={"data": d}, name=f"stage{j}") for j in range(2)]
    layer = lambda p, x: jnp.tanh(x @ p)  # noqa: E731
    pipe = pw.pipeline([layer, layer], slices=slices, microbatches=4, learning_rate=0.01)
    rng = np.random.default_rng(1)
    state0 = pipe.init([rng.normal(size=(args.width, args.width)).astype(np.float32) / 30 for _ in range(2)])
    data = batches(args.steps, args.width, seed=2)
    where = pipe.batch_placement()
    placed = [(jax.device_put(x, where["x"][0].sharding(where["x"][1])), jax.device_put(y, where["y"][0].sharding(where["y"][1])))
              for x, y in data]

    def step(state, x, y):
        return pipe.step(state, x, y)

    per_step = step_time(lambda: run_loop("placed", step, state0, data, placed, None, pipe, False)) / args.steps
    load_s = per_step / 2
    print(f"pipelined step (2 stages x {d} devices, 4 microbatches): {per_step * 1e3:.1f} ms; each batch loads in "
          f"{load_s * 1e3:.1f} ms")
    text_len = calibrate_cpu(load_s)
    return [{**scenario("pipeline", step, state0, data, placed, kind, load_s, text_len, pipe, args.rounds, reader),
             "devices_per_stage": d, "note": note} for reader, kind in args.sources]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--json", default=None)
    ap.add_argument("--sources", default=SOURCES,
                    help="reader:load pairs, comma-separated; reader generator or grain, load sleep or cpu")
    args = common.parse_args(ap, argv, quick={"steps": 6, "rounds": 1, "width": 64})
    args.sources = [tuple(x.split(":")) for x in args.sources.split(",") if x]
    if any(r not in ("generator", "grain") or k not in ("sleep", "cpu") for r, k in args.sources):
        ap.error(f"--sources: reader:load pairs of generator|grain and sleep|cpu; got {args.sources}")
    if any(r == "grain" for r, _ in args.sources) and common.missing("grain"):
        print(f"grain MapDataset source: skipped: {common.missing('grain')}")
        args.sources = [(r, k) for r, k in args.sources if r != "grain"]
    dp = data_parallel(args)
    pp = pipelined(args)
    targets = []
    for label, rows in (("data-parallel", dp), ("pipelined", pp)):
        for row in rows:
            if row["kind"] != "sleep":
                continue
            of = "" if row["reader"] == "generator" else f", {row['reader']} MapDataset"
            targets.append(common.target(f"input ({label}, storage{of}): prefetch / placed", row["async"]["prefetch"],
                                         0.9, below=False, unit="x"))
            targets.append(common.target(f"input ({label}, storage{of}, logged): prefetch / inline",
                                         row["logged"]["prefetch"] / row["logged"]["inline"], 1.0, below=False,
                                         unit="x"))
    result = {"benchmark": "input", "machine": common.machine(), "data_parallel": dp, "pipelined": pp,
              "targets": targets}
    return common.finish(args.json, result)


if __name__ == "__main__":
    main()

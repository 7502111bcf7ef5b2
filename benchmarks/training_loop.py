"""A user's whole training loop: pw against plain JAX, the same data-parallel step, interleaved in one process.

    python benchmarks/training_loop.py [--steps 30] [--rounds 6] [--layers 2] [--width 64] [--seq 64]
                                       [--load N] [--profile] [--json out.json] [--quick]

The loop a researcher writes: a tiny char-level decoder (byte tokens, causal
attention + MLP blocks), optax ``clip_by_global_norm`` + ``adamw``, on every
device of a slice with a "data" axis (8, or the devices present: a data axis of
1 on one device), the state donated, each step's outputs passed to the next
without waiting, and the loss read every ``--log-every`` (10) steps:

- ``pw``: ``step = pw.compiled(train_step, slice=s, in_specs=..., donate_argnums=(0, 1))``;
  futures go from step to step; ``loss.result()`` every 10 steps.
- ``jax``: ``jax.jit(train_step, in_shardings=..., out_shardings=..., donate_argnums=(0, 1))``
  on the same devices and shardings; ``float(loss)`` every 10 steps.

Three variants, each pw against JAX, alternating rounds of ``--steps`` steps (a
round ends when its last state is ready), so noise hits both alike:

- ``placed``: every batch placed on the devices beforehand;
- ``input``: batches from a grain pipeline (``MapDataset.source(tokens).repeat().map().batch()``);
  pw reads it through ``pw.prefetch(ds, to=s)`` (its own thread, 2 batches ahead);
  plain JAX takes ``next(it)`` and ``jax.device_put(batch, sharding)`` in the loop
  (the way the JAX tutorials write it: no thread of its own);
- ``checkpoint``: ``placed`` plus a save of the params and optimizer state every 10 steps:
  ``pw.CheckpointManager.save`` against orbax's asynchronous ``ocp.CheckpointManager``
  with ``StandardSave`` (a round waits for its saves to commit, on both sides).

Target: pw >= 0.95x plain JAX's steps/s in each. ``--load N`` runs N busy Python
processes beside it (``while True: pass``; killed at the end, even on error): the
loaded machine. ``--profile`` samples every thread's stack (``sys._current_frames()``
every 5 ms) during a run of each loop alone and prints where each thread's time
goes (the innermost pw_kernel function, else the innermost function).

Where the time goes (measured 2026-11-27 on the 2-core machine beside other work, load
average 4-11; ``--profile``: CPU seconds per thread from /proc, and Python stacks sampled
every 5 ms, the sampler itself ~7 ms CPU per step). Defaults, 8 devices, ~13 steps/s:

- The step itself is XLA's: its CPU threads (``tf_XLAEigen`` and unnamed native threads)
  take ~130 ms of CPU per step on both sides, ~1.8 of the 2 cores. Whatever Python adds
  competes with them for what is left.
- plain JAX's Python: its main thread, 1.0 ms CPU per step (``placed``).
- pw's Python, ``placed``: main 1.0 ms, ``pw-dispatcher`` 1.8 ms, ``pw-watcher`` 2.3 ms CPU
  per step: +4.1 ms (~3% of the step's CPU). The watcher's share grows with the step's
  length (3.5 ms at ~170 ms steps on one device, 0.25 ms at 7 ms steps under ``--quick``):
  ``runtime/exec/completion.py``'s ``_watch_loop`` wakes every ``_POLL_S`` = 1 ms for up to
  ``_POLL_IDLE_S`` = 1 s after the last batch, ~30 µs of GIL and CPU per wake-up, while a
  step runs. With ``_POLL_S`` set to 20 ms (monkeypatched, an experiment only) the watcher
  fell below 0.5 ms per step. The dispatcher thread's samples are ``completion.py:_complete``
  (``block_until_ready`` on each output, a wait in C: 53 of its 67 ms per step) and
  ``dispatcher.py:_dispatch`` (the XLA call, 13 ms); the main thread's are
  ``dispatcher.py:call_one`` and ``run.py:Run.__enter__`` (~3 ms of wall per step together).
- At small steps (``--quick``: ~7 ms) the same path is the whole gap (0.72-0.80x): pw's
  threads 1.9 ms CPU per step (dispatcher 1.0, main 0.6, watcher 0.25) against JAX's main
  0.4 ms.
- ``input``: ``pw-prefetch`` 2.2 ms CPU per step (``targets.place`` -> ``batched_device_put``,
  then a ``block_until_ready`` for the timeline's bar) against 2.0 ms that plain JAX's main
  thread spends in its own ``device_put``; grain's ``grain-prefetch`` thread (its shuffle's
  ``_shuffled_index``) 5-7 ms on both sides. pw.prefetch adds nothing measurable beyond
  pw's per-step path.
- ``checkpoint``: ``pw-checkpoint`` 6.3 ms CPU per step (orbax's ``StandardSave`` copying
  the arrays on the device, ``apply_primitive``, 11 ms of its wall per step) against 4.7 ms
  more on plain JAX's main thread, where orbax does the same copy before ``save`` returns;
  orbax's writer threads (``array_type_handler``, ``ts_pool_worker``) the same on both.
  A step that reads a state being saved is not donated (``hold``), so the step right after
  each save runs with its inputs kept (a copy of params and adamw state: 1.6 MB here).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import common

VOCAB = 256  # byte tokens


# ----------------------------------------------------------------------------- the model
def init_params(rng: np.random.Generator, layers: int, width: int, seq: int) -> dict:
    def w(*shape):
        return (rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32)

    blocks = [{"qkv": w(width, 3 * width), "o": w(width, width), "up": w(width, 4 * width), "down": w(4 * width, width)}
              for _ in range(layers)]
    return {"embed": w(VOCAB, width) * 0.1, "pos": w(seq, width) * 0.1, "blocks": blocks, "out": w(width, VOCAB)}


def loss_fn(params: dict, tokens: jax.Array) -> jax.Array:
    x, y = tokens[:, :-1], tokens[:, 1:]
    t = x.shape[1]
    h = params["embed"][x] + params["pos"][:t]
    mask = jnp.tril(jnp.ones((t, t), bool))
    for b in params["blocks"]:
        q, k, v = jnp.split(jax.nn.standardize(h) @ b["qkv"], 3, axis=-1)
        att = jnp.where(mask, q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]), -1e9)
        h = h + (jax.nn.softmax(att, axis=-1) @ v) @ b["o"]
        h = h + jax.nn.gelu(jax.nn.standardize(h) @ b["up"]) @ b["down"]
    logits = jax.nn.standardize(h) @ params["out"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[..., None], axis=-1))


def make_train_step(opt):
    import optax

    def train_step(params, opt_state, tokens):  # what a user gives jax.jit
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def token_stream(seed: int, n: int, seq: int) -> np.ndarray:
    """``n`` rows of ``seq + 1`` byte tokens of English-like text."""
    words = b"the quick brown fox jumps over a lazy dog while seven wizards quietly pack boxes of liquor".split()
    rng = np.random.default_rng(seed)
    text = b" ".join(words[i] for i in rng.integers(0, len(words), size=n * (seq + 1) // 3 + 16))
    return np.frombuffer(text[: n * (seq + 1)], np.uint8).astype(np.int32).reshape(n, seq + 1)


def grain_dataset(rows: np.ndarray, batch: int):
    import grain

    def augment(row):  # the per-example Python work an input pipeline does (a shift, a cast)
        return np.asarray(row, np.int32)

    return (grain.MapDataset.source(list(rows)).shuffle(seed=0).repeat().map(augment)
            .batch(batch, drop_remainder=True))


# ----------------------------------------------------------------------------- the two loops
class Loops:
    """Both sides' state, data and loops; each loop call runs ``steps`` steps and continues the last one's state."""

    def __init__(self, args, root: str):
        import optax

        n = common.fit(8)
        self.devices = n
        self.note = common.fewer_devices("data-parallel training loop", 8, n)
        s = pw.slice(n, mesh={"data": n}, name="dp")
        self.slice = s
        self.steps, self.log_every = args.steps, args.log_every
        opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
        train_step = make_train_step(opt)
        repl, data = s.sharding(), s.sharding("data")
        self.data_sharding = data
        self.pw_step = pw.compiled(train_step, slice=s, in_specs=(P(), P(), P("data")), out_specs=(P(), P(), P()),
                                   donate_argnums=(0, 1), name="train_step")
        self.jax_step = jax.jit(train_step, in_shardings=(repl, repl, data), out_shardings=(repl, repl, repl),
                                donate_argnums=(0, 1))
        rng = np.random.default_rng(0)
        params = init_params(rng, args.layers, args.width, args.seq)
        self.state = {}
        for side in ("pw", "jax"):  # each side its own copy: donation consumes it
            p = jax.device_put(params, repl)
            self.state[side] = (p, jax.device_put(opt.init(p), repl))
        rows = token_stream(1, 64 * args.batch, args.seq)
        self.placed = [jax.device_put(rows[i * args.batch:(i + 1) * args.batch], data) for i in range(args.steps)]
        self.batch = args.batch
        self.rows = rows
        self.prefetch = None
        self.jax_iter = None
        self.root = root
        self.ckpt = {}
        self.saved = {"pw": 0, "jax": 0}
        self.losses = {"pw": [], "jax": []}

    # -------------------------------------------------------------- variants
    def start_input(self) -> None:
        self.prefetch = pw.prefetch(grain_dataset(self.rows, self.batch), to=self.slice, depth=2)
        self.jax_iter = iter(grain_dataset(self.rows, self.batch))

    def start_checkpoints(self) -> None:
        import orbax.checkpoint as ocp

        self.ckpt["pw"] = pw.CheckpointManager(f"{self.root}/pw", max_to_keep=2)
        self.ckpt["jax"] = ocp.CheckpointManager(
            f"{self.root}/orbax", options=ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=True))

    def close(self) -> None:
        if self.prefetch is not None:
            self.prefetch.close()
        for c in self.ckpt.values():
            c.wait_until_finished()
            c.close()

    def feed(self, side: str, variant: str):
        if variant != "input":
            return iter(self.placed)
        if side == "pw":
            return (b for _, b in zip(range(self.steps), self.prefetch))
        return (jax.device_put(next(self.jax_iter), self.data_sharding) for _ in range(self.steps))

    def pw_loop(self, variant: str) -> None:
        params, opt_state = self.state["pw"]
        ckpt = self.ckpt.get("pw") if variant == "checkpoint" else None
        for k, tokens in enumerate(self.feed("pw", variant)):
            params, opt_state, loss = self.pw_step(params, opt_state, tokens)
            if ckpt is not None and k % 10 == 9:
                self.saved["pw"] += 1
                ckpt.save(self.saved["pw"], {"params": params, "opt_state": opt_state}, force=True)
            if k % self.log_every == self.log_every - 1:
                self.losses["pw"].append(float(loss.result()))
        self.state["pw"] = (params, opt_state)
        pw.get(params)  # the round ends when its last state is ready
        if ckpt is not None:
            ckpt.wait_until_finished()

    def jax_loop(self, variant: str) -> None:
        import orbax.checkpoint as ocp

        params, opt_state = self.state["jax"]
        ckpt = self.ckpt.get("jax") if variant == "checkpoint" else None
        for k, tokens in enumerate(self.feed("jax", variant)):
            params, opt_state, loss = self.jax_step(params, opt_state, tokens)
            if ckpt is not None and k % 10 == 9:
                self.saved["jax"] += 1
                ckpt.save(self.saved["jax"], args=ocp.args.StandardSave({"params": params, "opt_state": opt_state}))
            if k % self.log_every == self.log_every - 1:
                self.losses["jax"].append(float(loss))
        self.state["jax"] = (params, opt_state)
        jax.block_until_ready(params)
        if ckpt is not None:
            ckpt.wait_until_finished()


def variant_row(loops: Loops, variant: str, rounds: int) -> dict:
    samples = common.interleaved({"pw": lambda: loops.pw_loop(variant), "jax": lambda: loops.jax_loop(variant)},
                                 rounds, warmup=2)  # 2: grain's first read-ahead (its 16 threads) lands in either
    med = {k: common.Stat.of(v).median for k, v in samples.items()}
    sps = {k: loops.steps / t for k, t in med.items()}
    spread = {k: common.Stat.of(v).spread for k, v in samples.items()}
    row = {"variant": variant, "steps_per_s": sps, "ratio": sps["pw"] / sps["jax"], "rounds": len(samples["pw"]),
           "window_s": common.window(samples), "spread": spread}
    print(f"  {variant:<11} {sps['pw']:9.1f} {sps['jax']:9.1f} {row['ratio']:8.3f}  "
          f"({row['rounds']} rounds of {loops.steps} steps, {common.window_note(row['window_s'])})")
    return row


# ----------------------------------------------------------------------------- load and profile
@contextlib.contextmanager
def busy_processes(n: int):
    """``n`` CPU-bound Python processes (``while True: pass``) for the duration; always killed."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=10)


#: Innermost functions in which a thread is waiting (a lock, a condition, a selector), not working.
WAITS = {"wait", "block_until_ready", "_wait_for_tstate_lock", "select", "acquire", "get", "join", "sleep", "poll", "result",
         "_worker", "_recv", "recv_into", "accept", "_wait", "wait_for"}


class Sampler:
    """Every thread's stack every ``interval`` s (``sys._current_frames()``): busy samples per thread and function.

    A sample whose innermost Python function is a wait (`WAITS`) counts as waiting; any other
    (including a C call made from Python, such as an XLA execute or a device_put) as busy.
    """

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.seen: collections.Counter = collections.Counter()
        self.busy: collections.Counter = collections.Counter()
        self.by_func: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.samples = 0
        self.cpu: dict[int, tuple[str, float]] = {}  # native thread id -> (name, CPU seconds since start)
        self._cpu0: dict[int, float] = {}
        self._names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._cpu0 = {tid: t for tid, (_, t) in _thread_cpu().items()}
        self._t0 = os.times()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._read_cpu()
        t1 = os.times()
        self.process_cpu = (t1.user + t1.system) - (self._t0.user + self._t0.system)

    def _read_cpu(self) -> None:
        """CPU seconds of each thread since the start (a thread that ended keeps its last reading)."""
        for tid, (comm, t) in _thread_cpu().items():
            name = self._names.get(tid) or f"native: {re.sub(r'[-_:]?[0-9]+$', '', comm)}"
            self.cpu[tid] = (name, t - self._cpu0.get(tid, 0.0))

    @staticmethod
    def _name(name: str) -> str:
        if name == "MainThread":
            return "main"
        m = re.match(r"Thread-\d+ \((\w+)\)", name)
        if m:  # an executor's or a plain thread: by its target
            return f"thread ({m.group(1)})"
        return re.sub(r"[_-]?\d+$", "", name) or name

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            threads = threading.enumerate()
            names = {t.ident: t.name for t in threads}
            for t in threads:
                if t.native_id is not None:
                    self._names[t.native_id] = self._name(t.name)
            self.samples += 1
            if self.samples % 20 == 0:
                self._read_cpu()
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = self._name(names.get(ident, "?"))
                self.seen[name] += 1
                if frame.f_code.co_name in WAITS:
                    continue
                self.busy[name] += 1
                self.by_func[name][self._where(frame)] += 1

    @staticmethod
    def _where(frame) -> str:
        """The innermost pw_kernel function on the stack, with the innermost function if that is elsewhere."""
        leaf = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"
        f = frame
        while f is not None:
            path = f.f_code.co_filename
            if "pw_kernel" in path:
                mine = f"{path.split('pw_kernel/')[-1]}:{f.f_code.co_name}"
                return mine if f is frame else f"{mine} > {leaf}"
            f = f.f_back
        return leaf

    def report(self, label: str, seconds: float, steps: int, top: int) -> dict:
        n = max(1, self.samples)
        print(f"\nprofile: {label}, {steps} steps in {seconds:.2f} s ({steps / seconds:.1f} steps/s); {self.samples} "
              f"samples every {self.interval * 1e3:.0f} ms; busy: % of samples a thread was not waiting "
              f"(ms per step in brackets)")
        ms = seconds * 1e3 / steps / n  # ms per step that one sample stands for
        per = collections.Counter()
        for name, t in self.cpu.values():
            per[name] += t
        print(f"  CPU ms per step, by thread (/proc; the process: {self.process_cpu * 1e3 / steps:.1f} ms per step, "
              f"{self.process_cpu / seconds:.2f} cores):")
        for name, t in per.most_common():
            if t * 1e3 / steps >= 0.05 * self.process_cpu * 1e3 / steps / 10:
                print(f"    {name:<32} {t * 1e3 / steps:7.2f}")
        out = {"seconds": seconds, "steps": steps, "samples": self.samples, "threads": {},
               "cpu_ms_per_step": {name: t * 1e3 / steps for name, t in per.items()},
               "process_cpu_ms_per_step": self.process_cpu * 1e3 / steps}
        print("  Python stacks (busy: not in a Python-level wait; a C call such as block_until_ready counts as busy):")
        for name, count in self.busy.most_common():
            pct = 100 * count / n
            if pct < 1 or (name != "main" and not name.startswith("pw-")):
                continue  # the main thread and pw's own; the others show in the CPU table
            print(f"  {name:<32} {pct:5.1f}%  [{count * ms:.2f} ms]")
            funcs = []
            for func, c in self.by_func[name].most_common(top):
                if 100 * c / n >= 0.5:
                    print(f"      {100 * c / n:5.1f}%  [{c * ms:.2f} ms]  {func}")
                funcs.append((func, 100 * c / n, c * ms))
            out["threads"][name] = {"busy_pct": pct, "ms_per_step": count * ms, "top": funcs}
        return out


def _thread_cpu() -> dict[int, tuple[str, float]]:
    """Every thread of this process: native id -> (its OS name, user + system CPU seconds), from /proc."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            comm = open(f"/proc/self/task/{tid}/comm").read().strip()
        except OSError:
            continue
        cpu = common.cpu_seconds(f"/proc/self/task/{tid}/stat")
        if cpu is not None:
            out[int(tid)] = (comm, cpu)
    return out


def profile(loops: Loops, variant: str, steps_total: int, top: int) -> dict:
    out = {}
    for side, fn in (("pw", loops.pw_loop), ("jax", loops.jax_loop)):
        fn(variant)  # warm
        rounds = max(1, steps_total // loops.steps)
        with Sampler() as s:
            t = time.perf_counter()
            for _ in range(rounds):
                fn(variant)
            dt = time.perf_counter() - t
        out[side] = s.report(f"{variant}, {side}", dt, rounds * loops.steps, top)
    return out


# ----------------------------------------------------------------------------- main
def run(args) -> dict:
    root = tempfile.mkdtemp(prefix="pw_training_loop_")
    loops = Loops(args, root)
    try:
        print(f"training loop: {args.layers}-layer byte decoder, width {args.width}, {args.seq} tokens, batch "
              f"{args.batch}, clip + adamw, data axis of {loops.devices}; {args.load} busy processes beside; "
              f"load average {common.loadavg()}")
        print(f"  {'variant':<11} {'pw st/s':>9} {'JAX st/s':>9} {'pw/JAX':>8}")
        rows = []
        variants = []
        needs = {"input": "grain", "checkpoint": "orbax.checkpoint"}
        for v in args.variants.split(","):  # a variant whose package is missing says so, and the others run
            why = common.missing(needs[v]) if v in needs else None
            if why:
                print(f"  {v:<11} skipped: {why}")
            else:
                variants.append(v)
        if "input" in variants:
            loops.start_input()
        if "checkpoint" in variants:
            loops.start_checkpoints()
        for v in variants:
            rows.append(variant_row(loops, v, args.rounds))
        prof = {v: profile(loops, v, args.profile_steps, args.top) for v in variants} if args.profile else None
        last = {k: round(v[-1], 4) if v else None for k, v in loops.losses.items()}
        print(f"  last loss read: pw {last['pw']}, JAX {last['jax']}; load average {common.loadavg()}")
    finally:
        loops.close()
        shutil.rmtree(root, ignore_errors=True)
    return {"rows": rows, "devices": loops.devices, "note": loops.note, "profile": prof}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="steps per round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--variants", default="placed,input,checkpoint")
    ap.add_argument("--load", type=int, default=0, help="busy Python processes beside the benchmark")
    ap.add_argument("--profile", action="store_true", help="sample every thread's stack in each loop alone")
    ap.add_argument("--profile-steps", type=int, default=150)
    ap.add_argument("--top", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = common.parse_args(ap, argv, quick={"steps": 10, "rounds": 2, "layers": 1, "width": 32, "seq": 16,
                                               "batch": 16, "profile_steps": 20})
    old = signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # a killed run still kills its busy processes
    try:
        with busy_processes(args.load):
            res = run(args)
    finally:
        signal.signal(signal.SIGTERM, old)
    targets = [common.target(f"training loop ({r['variant']}): pw / JAX steps/s", r["ratio"], 0.95, below=False,
                             unit="x") for r in res["rows"]]
    result = {"benchmark": "training_loop", "machine": common.machine(), "load": args.load,
              "args": {k: v for k, v in vars(args).items() if k != "json"}, **res, "targets": targets}
    return common.finish(args.json, result)


if __name__ == "__main__":
    main()

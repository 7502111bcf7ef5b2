"""Host overhead profile: where the controller's time goes per node, sampled with py-spy.

    python benchmarks/profile_overhead.py [--seconds 5] [--rate 500] [--workloads chained,opbyop] [--json out.json]

A worker process runs a pw workload in a loop (after warming up: every node
traced and compiled), and py-spy attaches to it twice for ``--seconds``:

1. all threads, idle ones included (``--idle``): where each controller
   thread spends its wall time (the dispatcher, the completion watcher, the
   caller's thread), including the time it waits;
2. only samples that hold the GIL (``--gil``): the controller's threads
   share one GIL, so GIL time per node bounds the node rate of the process.

Samples are grouped by what the innermost runtime frame is doing (the
source line decides inside `Dispatcher._dispatch` and `_complete`, so the
JAX call, the event record and the hand-off to the watcher are told apart)
and turned into microseconds per node with the node count the worker logged
during each window. Workloads (K = 128 tiny nodes, as in dispatch.py):
``chained`` (one program of K nodes, submit and wait, repeatedly) and
``opbyop`` (K one-node programs fed each other's futures).

The worker also times the pieces of the per-node path in isolation
(``micro``): the raw `jax.jit` call, the trace-cache key, a Run with its
futures, a NodeEvent, an event-log append, a queue hand-off.

No py-spy here: the sampled profile is reported as "not installed"; the
micro timings still run.
"""

from __future__ import annotations

import argparse
import json
import linecache
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import common

K = 128


# ------------------------------------------------------------------ worker
def worker(kind: str, seconds: float, out: str) -> None:
    import pw_kernel as pw  # noqa: I001
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    pw.init()
    s = pw.slice(1, name="prof")
    fs = [
        pw.compiled(lambda x, i=i: x * 1.0001 + (0.5 + i * 1e-6), slice=s, in_specs=P("d"), out_specs=P("d"),
                    name=f"op{i}")
        for i in range(K)
    ]
    x = jax.device_put(jnp.ones(16, jnp.float32), s.sharding("d"))

    @pw.program(name="chain")
    def chain(v):
        for f in fs:
            v = f(v)
        return v

    def chained():
        chain.submit(x, mode="chained").outputs.result()

    def opbyop():
        v = x
        for f in fs:
            v = f(v)
        v.result()

    body = {"chained": chained, "opbyop": opbyop}[kind]
    for _ in range(3):
        body()
    progress = [(time.time(), 0)]
    print("READY", flush=True)
    deadline = time.time() + seconds
    nodes = 0
    while time.time() < deadline:
        body()
        nodes += K
        progress.append((time.time(), nodes))
    result = {"progress": progress, "machine": common.machine()}
    if kind == "chained":
        result["micro"] = micro(pw, chain, fs, x)
    Path(out).write_text(json.dumps(result))
    pw.shutdown()


def micro(pw, chain, fs, x) -> dict[str, float]:
    """Nanoseconds per call of the pieces of the per-node path, each timed alone (best of 5)."""
    import collections
    import concurrent.futures
    import queue
    import threading

    import jax

    from pw_kernel.runtime import plan as plan_mod
    from pw_kernel.runtime import program as program_mod
    from pw_kernel.runtime import tracing
    from pw_kernel.runtime.events import EventLog, NodeEvent
    from pw_kernel.runtime.futures import Future
    from pw_kernel.runtime.run import Run

    c = pw.controller()
    graph = chain.trace(x)
    plan = plan_mod.plan_for(graph, "chained")
    st = plan.steps[0]
    node_fn = st.call
    jitted = fs[0].jitted
    log = EventLog()
    q: queue.SimpleQueue = queue.SimpleQueue()
    cond = threading.Condition(threading.RLock())
    ev = NodeEvent(1, 1, "p", "t", "n", "compute", (0,), 0, None, 0, 64, "f32[16] -> f32[16]")
    batch64 = [(jitted(x),) for _ in range(64)]
    jax.block_until_ready(batch64)
    a = jitted(x).block_until_ready()
    run = Run(c, -1, "m", graph, plan, [x])

    def t_jax_call():
        jitted(x)

    def t_node_call():
        node_fn(x)

    def t_signature():
        tracing.signature((x,), {})

    def t_trace_lookup():
        chain.trace(x)

    def t_traced_leaves():
        program_mod._traced_leaves((x,), {})

    def t_plan_for():
        plan_mod.plan_for(graph, "chained")

    def t_run_init():
        Run(c, -1, "m", graph, plan, [x])

    def t_future_init():
        Future(run, 0, (16,), "float32", None)

    def t_node_event():
        NodeEvent(1, 1, "p", "t", "n", "compute", (0,), 0, None, 0, 64, "f32[16] -> f32[16]")

    def t_emit_node():
        log.emit_node(ev)

    def t_now():
        log.now()

    def t_queue_put_get():
        q.put(1)
        q.get()

    def t_is_ready():
        a.is_ready()

    def t_block_ready_batch64():
        jax.block_until_ready(batch64)

    def t_future_set_result():
        concurrent.futures.Future().set_result(1)

    def t_cond_notify():
        with cond:
            cond.notify()

    def t_deque_append():
        d.append(1)

    d: collections.deque = collections.deque(maxlen=1000)
    out = {}
    for name, fn in list(locals().items()):
        if not name.startswith("t_"):
            continue
        n = 200 if name in ("t_jax_call", "t_node_call", "t_run_init") else 2000
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter_ns()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter_ns() - t) / n)
        out[name[2:]] = best
        jax.block_until_ready(jitted(x))
    out["block_ready_batch64"] /= 64  # per node
    return out


# ------------------------------------------------------------ classification
IDLE_FUNCS = {"Condition.wait", "Event.wait", "Thread.join", "Condition.__enter__"}


def _line(file: str, line: int) -> str:
    return linecache.getline(file, line).strip()


def parse_raw(path: str) -> list[tuple[str, list[tuple[str, str, int]], int]]:
    """py-spy raw (collapsed) output -> (thread label, frames outer->inner, count)."""
    out = []
    for row in Path(path).read_text().splitlines():
        if not row.strip():
            continue
        stack, _, count = row.rpartition(" ")
        parts = stack.split(";")
        thread = parts[0]
        frames = []
        for p in parts[1:]:
            func, _, loc = p.rpartition(" (")
            file, _, line = loc.rstrip(")").rpartition(":")
            frames.append((func, file, int(line) if line.isdigit() else 0))
        out.append((thread, frames, int(count)))
    return out


def role(thread: str, frames) -> str:
    funcs = {f for f, _, _ in frames}
    if "Dispatcher._dispatch_loop" in funcs:
        return "dispatcher"
    if "Dispatcher._watch_loop" in funcs:
        return "watcher"
    if "MainThread" in thread or "worker" in funcs or "<module>" in funcs:
        return "caller"
    return "other"


def category(r: str, frames) -> str:
    """What a sample of thread role ``r`` is doing; see the module docstring."""
    funcs = [f for f, _, _ in frames]
    fs = set(funcs)
    leaf_func, leaf_file, leaf_line = frames[-1] if frames else ("", "", 0)
    leaf_src = _line(leaf_file, leaf_line) if leaf_file else ""
    if "EventLog.emit_node" in fs or "EventLog.emit_run" in fs:
        return "event log (emit_*)"
    if r == "caller":
        if "Future.result" in fs or "Run.wait" in fs or "get" in fs:
            return "caller: waits for results"
        if "trace_program" in fs:
            return "submit: tracing (cache miss)"
        if "Program.trace" in fs or "signature" in fs:
            return "submit: trace-cache lookup"
        if "Run.__init__" in fs or "Future.__init__" in fs:
            return "submit: Run + futures"
        if "plan_for" in fs:
            return "submit: plan lookup"
        if "Program.submit" in fs or "Controller.submit" in fs or "_traced_leaves" in fs:
            return "submit: other (leaves, lock, queue, wake)"
        if "CompiledFunction.__call__" in fs:
            return "submit: CompiledFunction.__call__"
        return "caller: benchmark loop"
    if r == "dispatcher":
        if "Dispatcher._pick" in fs:
            return "scheduling (_pick, _start)"
        if "Dispatcher._dispatch" in fs:
            i = funcs.index("Dispatcher._dispatch")
            _, file, line = frames[i]
            src = _line(file, line)
            deeper = funcs[i + 1:]
            if "st.call(" in src:
                slow = "cache_miss" in " ".join(deeper)
                return "dispatch: JAX call (Python slow path)" if slow else "dispatch: JAX call"
            if "NodeEvent" in src or "NodeEvent.__init__" in deeper or src.startswith(("self.seq", "st.nbytes")):
                return "dispatch: NodeEvent record"
            if "queue.put" in src:
                return "dispatch: hand-off to watcher (queue.put)"
            if "Condition.__enter__" in deeper or "_fail" in src:
                return "dispatch: lock"
            return "dispatch: bookkeeping (slots, counters, batch)"
        if leaf_func in IDLE_FUNCS or ".wait(" in leaf_src:
            return "dispatcher: idle (cond.wait)"
        if "del dead" in leaf_src or "graveyard" in leaf_src:
            return "dispatcher: freeing finished buffers"
        return "dispatcher: loop, lock"
    if r == "watcher":
        if "Dispatcher._complete" in fs:
            i = funcs.index("Dispatcher._complete")
            _, file, line = frames[i]
            src = _line(file, line)
            deeper = funcs[i + 1:]
            if "is_ready" in src or "block_until_ready" in src or "block_until_ready" in deeper:
                return "watcher: is_ready / block_until_ready"
            done_funcs = ("set_result", "_transition", "_on_done")
            if any(w in src for w in done_funcs) or any(w in d for d in deeper for w in done_funcs):
                return "watcher: futures + run done"
            if "Condition.__enter__" in deeper or "with self.cond" in src:
                return "watcher: lock"
            return "watcher: bookkeeping (times, counters)"
        if ".get()" in leaf_src or leaf_func in IDLE_FUNCS:
            return "watcher: idle (queue.get)"
        if "graveyard" in leaf_src or "del batch" in leaf_src:
            return "watcher: freeing / graveyard"
        return "watcher: loop"
    return "other thread"


def _leaf(frames) -> str:
    """The innermost frame, as function (file:line) with the file shortened."""
    if not frames:
        return "<native>"
    func, file, line = frames[-1]
    short = file.split("/site-packages/")[-1].split("/work/main/")[-1].split("/lib/python3")[-1]
    return f"{func} ({short}:{line})"


def summarise(raw_path: str, rate: int, nodes: int) -> dict:
    by_role: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    leaves: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for thread, frames, count in parse_raw(raw_path):
        r = role(thread, frames)
        c = category(r, frames)
        by_role[r][c] += count
        leaves[r, c][_leaf(frames)] += count
    out = {}
    for r, cats in by_role.items():
        total = sum(cats.values())
        out[r] = {
            "samples": total,
            "categories": {
                c: {
                    "samples": n,
                    "share": n / total,
                    "us_per_node": n / rate / max(nodes, 1) * 1e6,
                    "top_leaves": dict(sorted(leaves[r, c].items(), key=lambda kv: -kv[1])[:6]),
                }
                for c, n in sorted(cats.items(), key=lambda kv: -kv[1])
            },
        }
    return out


# ------------------------------------------------------------------ parent
def find_py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def nodes_between(progress: list, t0: float, t1: float) -> int:
    inside = [n for t, n in progress if t0 <= t <= t1]
    before = [n for t, n in progress if t < t0]
    if not inside:
        return 0
    return inside[-1] - (before[-1] if before else 0)


def profile(kind: str, py_spy: str | None, seconds: int, rate: int, tmp: Path) -> dict:
    out = tmp / f"{kind}.json"
    windows = 2 if py_spy else 0
    cmd = [sys.executable, __file__, "--worker", kind, "--worker-seconds", str(windows * (seconds + 1.5) + 1.0),
           "--worker-out", str(out)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(common.ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("READY"):
            break
    result: dict = {"workload": kind}
    if py_spy:
        for mode, flags in (("wall", ["--idle", "--threads"]), ("gil", ["--gil", "--threads"])):
            raw = tmp / f"{kind}-{mode}.txt"
            t0 = time.time()
            subprocess.run(
                [py_spy, "record", "--pid", str(proc.pid), "--duration", str(seconds), "--rate", str(rate),
                 "--format", "raw", "--full-filenames", "-o", str(raw), *flags],
                capture_output=True, text=True, check=False,
            )
            t1 = time.time()
            result[mode] = {"raw": str(raw), "t0": t0, "t1": t1}
    proc.stdout.read()
    proc.wait()
    data = json.loads(out.read_text())
    progress = data["progress"]
    for mode in ("wall", "gil"):
        if mode in result and Path(result[mode]["raw"]).exists():
            w = result[mode]
            nodes = nodes_between(progress, w["t0"], w["t1"])
            w["nodes"] = nodes
            w["nodes_per_s"] = nodes / (w["t1"] - w["t0"])
            w["threads"] = summarise(w.pop("raw"), rate, nodes)
    if "micro" in data:
        result["micro_ns"] = data["micro"]
    result["machine"] = data.get("machine")
    span = progress[-1][0] - progress[0][0]
    result["unprofiled_nodes_per_s"] = progress[-1][1] / span if span else 0.0
    return result


def print_profile(res: dict, rate: int) -> None:
    for mode, title in (("wall", "wall time per thread (idle included)"), ("gil", "GIL held")):
        w = res.get(mode)
        if not w:
            continue
        print(f"\n[{res['workload']}] {title}: {w['nodes']} nodes in {w['t1'] - w['t0']:.1f} s "
              f"({w['nodes_per_s']:,.0f} nodes/s under the profiler)")
        for r, d in w["threads"].items():
            tot = sum(c["us_per_node"] for c in d["categories"].values())
            print(f"  {r} ({d['samples']} samples, {tot:.1f} µs per node)")
            for c, v in d["categories"].items():
                if v["share"] >= 0.005:
                    print(f"    {c:<48} {v['share']:6.1%} {v['us_per_node']:8.2f} µs/node")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=5, help="py-spy window, per mode")
    ap.add_argument("--rate", type=int, default=500, help="samples per second")
    ap.add_argument("--workloads", default="chained,opbyop")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-seconds", type=float, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.worker_seconds, args.worker_out)
        return {}

    # The parent never starts JAX: on a GPU the worker must be the only process holding the device.
    py_spy = find_py_spy()
    result: dict = {
        "benchmark": "profile_overhead", "machine": None, "k": K, "rate": args.rate,
        "seconds": args.seconds, "py_spy": py_spy or "not installed", "workloads": {},
    }
    print(f"profile_overhead: py-spy {'at ' + py_spy if py_spy else 'not installed'}, load {common.loadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.workloads.split(","):
            res = profile(kind, py_spy, args.seconds, args.rate, Path(tmp))
            result["machine"] = result["machine"] or res.pop("machine", None)
            res.pop("machine", None)
            result["workloads"][kind] = res
            print_profile(res, args.rate)
    micro_ns = result["workloads"].get("chained", {}).get("micro_ns")
    if micro_ns:
        print("\nper-call cost of the pieces, timed alone (ns):")
        for name, ns in micro_ns.items():
            print(f"  {name:<24} {ns:10.0f}")
    if result["machine"]:
        result["machine"]["loadavg_end"] = common.loadavg()
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

"""Host overhead profile: where pw's microseconds per node go, by thread and by module, through public calls.

    python benchmarks/profile_overhead.py [--k 128] [--seconds 5] [--workloads chained,opbyop]
                                          [--rate 500] [--json out.json] [--quick]

Each workload runs in a worker process (a fresh controller; the parent never
starts JAX, so on a GPU the worker holds the device alone). The worker warms
up (every node traced and compiled), times the workload unprofiled for
``--seconds``, then profiles it:

1. cProfile (the standard library, always there), for ``--seconds``: one
   deterministic profile per thread: the caller's (the notebook's thread,
   which submits) and the controller's own threads (``pw-dispatcher``,
   ``pw-watcher``), each switched on by a `threading.setprofile` hook when
   the window opens. Time is grouped by where it is spent: a pw_kernel
   module, JAX's Python, a C function (waits on locks, conditions and queues
   apart: that is an idle thread), the standard library's threading and
   queue code, the rest; then the functions that take the most. All in
   microseconds per node. cProfile slows Python code down (several times
   for code made of many small calls): the unprofiled figure is the real
   cost, the profile says how it splits. A compiled function's C++ fast
   path has no frame of its own: its time counts in the pw_kernel function
   that calls it (the ``jax_call`` micro timing below is its size).
2. py-spy (optional: ``pip install py-spy``), sampling all threads from
   outside for ``--seconds`` twice: idle samples included (where each
   thread's wall time goes) and only samples holding the GIL (the threads
   share one GIL, so GIL time per node bounds the node rate), grouped the
   same way by the innermost Python frame. Without py-spy this part is
   reported as not installed.

Workloads (K tiny nodes, as in dispatch.py): ``chained`` (one program of K
nodes, submit and wait, repeatedly) and ``opbyop`` (K one-node programs,
each fed the previous one's future).

The ``chained`` worker also times public calls alone (``micro``, ns per call,
best of 5): the raw `jax.jit` call, the trace-cache hit (`Program.trace`), a
one-node call (returns a future) and its round trip, building a
`pw.NodeEvent`, appending it to the controller's `EventLog`, and the result of a finished
future.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import linecache
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import common

#: C functions in which a thread waits (for a lock, a condition, a queue, time): it is idle, not working.
WAITS = ("'acquire' of '_thread", "'_acquire_restore' of '_thread", "'get' of '_queue", "time.sleep", "'wait' of")


def where(file: str, func: str) -> str:
    """The group a profiled function belongs to: a pw_kernel module, JAX, a wait, the standard library, the rest."""
    file = file.replace("\\", "/")
    if "/pw_kernel/" in file:
        return "pw_kernel/" + file.split("/pw_kernel/", 1)[1]
    if file in ("~", ""):  # a C function, as cProfile names it: "<method 'acquire' of '_thread.lock' objects>"
        if any(w in func for w in WAITS):
            return "waiting (locks, conditions, queues)"
        return "JAX (C++)" if "jax" in func else "Python builtins (C)"
    if "/jax/" in file or "/jaxlib/" in file:
        return "JAX (Python)"
    if file.endswith(("/threading.py", "/queue.py")):
        return "threading, queue (Python)"
    if file.endswith("/concurrent/futures/_base.py"):
        return "concurrent.futures (Python)"
    if file == __file__ or file.endswith("/benchmarks/profile_overhead.py"):
        return "the benchmark's own code"
    return "other Python"


def short(file: str, line: int, func: str) -> str:
    """A function as ``func (file:line)``, the file shortened to what identifies it."""
    if file in ("~", ""):
        return func
    file = file.replace("\\", "/")
    if "/pw_kernel/" in file:
        file = "pw_kernel/" + file.split("/pw_kernel/", 1)[1]
    elif "/site-packages/" in file:
        file = file.split("/site-packages/", 1)[1]
    elif "/lib/python3" in file:  # the standard library: .../lib/python3.11/threading.py
        file = file.split("/lib/python3", 1)[1].partition("/")[2]
    return f"{func} ({file}:{line})"


# ------------------------------------------------------------------ worker
_PROFILES: dict[str, cProfile.Profile] = {}
_WINDOW = threading.Event()


def _profile_from_window(frame, event, arg):
    """`threading.setprofile` hook of the controller's threads: start this thread's cProfile when the window opens."""
    if _WINDOW.is_set():
        prof = cProfile.Profile()
        _PROFILES[threading.current_thread().name] = prof
        prof.enable()  # replaces this hook for this thread


def summarise_cprofile(prof: cProfile.Profile, nodes: int, seconds: float, top: int = 8) -> dict:
    """Microseconds per node by group (`where`) and the functions with the most own time."""
    prof.snapshot_stats()  # not create_stats: that would disable the profiler of the calling thread
    groups: dict[str, float] = defaultdict(float)
    funcs = []
    for (file, line, func), (_cc, _nc, tt, _ct, _callers) in prof.stats.items():
        groups[where(file, func)] += tt
        funcs.append((tt, short(file, line, func), where(file, func)))
    funcs.sort(reverse=True)
    per_node = 1e6 / max(nodes, 1)
    return {
        "us_per_node": {g: t * per_node for g, t in sorted(groups.items(), key=lambda kv: -kv[1])},
        "share": {g: t / seconds for g, t in groups.items()},
        "top": [{"function": f, "where": w, "us_per_node": t * per_node} for t, f, w in funcs[:top]],
    }


def worker(kind: str, k: int, seconds: float, out: str) -> None:
    threading.setprofile(_profile_from_window)  # before the controller starts its threads
    import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    pw.init()
    s = pw.slice(1, name="prof")
    fs = [
        pw.compiled(lambda x, i=i: x * 1.0001 + (0.5 + i * 1e-6), slice=s, in_specs=P("d"), out_specs=P("d"),
                    name=f"op{i}")
        for i in range(k)
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

    def loop(until: float | threading.Event, progress: list | None = None) -> tuple[int, float]:
        t0, nodes = time.perf_counter(), 0
        while not (until.is_set() if isinstance(until, threading.Event) else time.perf_counter() >= until):
            body()
            nodes += k
            if progress is not None:
                progress.append((time.time(), nodes))
        return nodes, time.perf_counter() - t0

    nodes, wall = loop(time.perf_counter() + seconds)
    result: dict = {"unprofiled_us_per_node": wall / max(nodes, 1) * 1e6, "machine": common.machine()}
    result["threads"] = {f"0x{t.ident:x}": t.name for t in threading.enumerate()}
    if kind == "chained":
        result["micro_ns"] = micro(pw, chain, fs, x)

    # Sampled by py-spy from outside (if the parent has it) until the parent says "next" on stdin.
    told = threading.Event()
    reader = threading.Thread(target=lambda: (sys.stdin.readline(), told.set()), name="stdin", daemon=True)
    reader.start()
    print("READY", flush=True)
    progress = [(time.time(), 0)]
    loop(told, progress)
    reader.join()  # gone before the profiling window opens
    result["progress"] = progress

    main = cProfile.Profile()
    _WINDOW.set()
    main.enable()
    nodes, wall = loop(time.perf_counter() + seconds)
    main.disable()
    t1 = time.perf_counter()
    pw.shutdown()  # ends the controller's threads, and with them their profiles
    threads_wall = wall + (time.perf_counter() - t1)
    result["cprofile"] = {
        "nodes": nodes,
        "seconds": wall,
        "us_per_node": wall / max(nodes, 1) * 1e6,
        "threads": {"caller": summarise_cprofile(main, nodes, wall)}
        | {name: summarise_cprofile(p, nodes, threads_wall) for name, p in sorted(_PROFILES.items())},
    }
    Path(out).write_text(json.dumps(result))


def micro(pw, chain, fs, x) -> dict[str, float]:
    """Nanoseconds per call of public calls on the per-node path, each timed alone (best of 5)."""
    import jax
    from pw_kernel.runtime.extend import EventLog

    f = fs[0]
    jitted = f.jitted
    log = EventLog()
    ev = pw.NodeEvent(1, 1, "p", "t", "n", "compute", (0,), 0, None, 0, 64, "f32[16] -> f32[16]")
    finished = f(x)
    finished.result()

    def t_jax_call():
        jitted(x)

    def t_trace_cache_hit():
        chain.trace(x)

    def t_one_node_call():
        f(x)

    def t_one_node_round_trip():
        f(x).result()

    def t_node_event():
        pw.NodeEvent(1, 1, "p", "t", "n", "compute", (0,), 0, None, 0, 64, "f32[16] -> f32[16]")

    def t_event_log_append():
        log.emit_node(ev)

    def t_finished_future_result():
        finished.result()

    out = {}
    for name, fn in list(locals().items()):
        if not name.startswith("t_"):
            continue
        n = 200 if name in ("t_jax_call", "t_one_node_call", "t_one_node_round_trip") else 2000
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter_ns()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter_ns() - t) / n)
            pw.controller().wait_all(timeout=60)  # one-node calls run on: let them finish between rounds
        out[name[2:]] = best
        jax.block_until_ready(jitted(x))
    return out


# ------------------------------------------------------------------ py-spy
def parse_raw(path: str) -> list[tuple[str, list[tuple[str, str, int]], int]]:
    """py-spy raw (collapsed) output -> (thread label, frames outer->inner, count)."""
    out = []
    for row in Path(path).read_text().splitlines():
        if not row.strip():
            continue
        stack, _, count = row.rpartition(" ")
        parts = stack.split(";")
        frames = []
        for p in parts[1:]:
            func, _, loc = p.rpartition(" (")
            file, _, line = loc.rstrip(")").rpartition(":")
            frames.append((func, file, int(line) if line.isdigit() else 0))
        out.append((parts[0], frames, int(count)))
    return out


def thread_name(label: str, names: dict[str, str]) -> str:
    """py-spy's thread label ("thread (12093): pw-dispatcher", or "thread (0x7f..)") -> the Python thread's name."""
    name = label.split("): ", 1)[1] if "): " in label else None
    for ident, known in names.items():
        if name is None and ident.lower() in label.lower():
            name = known
    return "caller" if name == "MainThread" else name or label


#: A source line that blocks: the thread is idle there (the call itself is C, so it has no frame of its own).
BLOCKING = re.compile(r"\.(get|wait|acquire|join|readline)\(")


def sampled_where(frames: list[tuple[str, str, int]]) -> str:
    """`where` for a py-spy sample, by its innermost Python frame; a blocking line there is a wait."""
    if not frames:
        return "native code"
    func, file, line = frames[-1]
    src = linecache.getline(file, line)
    if "block_until_ready(" in src:
        return "JAX (C++)"
    if BLOCKING.search(src):
        return "waiting (locks, conditions, queues)"
    return where(file, func)


def summarise_samples(raw_path: str, rate: int, nodes: int, names: dict[str, str]) -> dict:
    """Samples per thread grouped by `sampled_where`, as µs per node and share of the thread's samples."""
    by_thread: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for label, frames, count in parse_raw(raw_path):
        thread = thread_name(label, names)
        if thread != "stdin":  # the worker's own helper, blocked on its input
            by_thread[thread][sampled_where(frames)] += count
    out = {}
    for t, groups in by_thread.items():
        total = sum(groups.values())
        out[t] = {
            "samples": total,
            "us_per_node": {g: n / rate / max(nodes, 1) * 1e6 for g, n in sorted(groups.items(), key=lambda kv: -kv[1])},
            "share": {g: n / total for g, n in groups.items()},
        }
    return out


def find_py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def nodes_between(progress: list, t0: float, t1: float) -> int:
    inside = [n for t, n in progress if t0 <= t <= t1]
    before = [n for t, n in progress if t < t0]
    if not inside:
        return 0
    return inside[-1] - (before[-1] if before else 0)


# ------------------------------------------------------------------ parent
def profile(kind: str, k: int, py_spy: str | None, seconds: float, rate: int, tmp: Path) -> dict:
    out = tmp / f"{kind}.json"
    cmd = [sys.executable, __file__, "--worker", kind, "--k", str(k), "--seconds", str(seconds),
           "--worker-out", str(out)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(common.ROOT), str(Path(__file__).parent),
                                                    env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("READY"):
            break
    windows: dict = {}
    if py_spy:
        for mode, flags in (("wall", ["--idle", "--threads"]), ("gil", ["--gil", "--threads"])):
            raw = tmp / f"{kind}-{mode}.txt"
            t0 = time.time()
            spy = subprocess.run(
                [py_spy, "record", "--pid", str(proc.pid), "--duration", str(max(1, round(seconds))),
                 "--rate", str(rate), "--format", "raw", "--full-filenames", "-o", str(raw), *flags],
                capture_output=True, text=True, check=False,
            )
            windows[mode] = {"raw": raw, "t0": t0, "t1": time.time(), "error": spy.stderr.strip()[-300:]}
    proc.stdin.write("next\n")
    proc.stdin.close()
    proc.stdout.read()
    if proc.wait() != 0 or not out.exists():
        raise SystemExit(f"profile_overhead: the {kind} worker failed (exit {proc.returncode})")
    data = json.loads(out.read_text())
    result: dict = {"workload": kind, "unprofiled_us_per_node": data["unprofiled_us_per_node"],
                    "cprofile": data["cprofile"], "machine": data["machine"]}
    if "micro_ns" in data:
        result["micro_ns"] = data["micro_ns"]
    for mode, w in windows.items():
        if not w["raw"].exists():
            result[mode] = {"error": w["error"] or "py-spy wrote nothing"}
            continue
        nodes = nodes_between(data["progress"], w["t0"], w["t1"])
        result[mode] = {
            "nodes": nodes,
            "nodes_per_s": nodes / (w["t1"] - w["t0"]),
            "threads": summarise_samples(str(w["raw"]), rate, nodes, data["threads"]),
        }
    return result


def print_profile(res: dict) -> None:
    cp = res["cprofile"]
    print(f"\n[{res['workload']}] unprofiled {res['unprofiled_us_per_node']:.1f} µs per node; under cProfile "
          f"{cp['us_per_node']:.1f} µs per node ({cp['nodes']} nodes in {cp['seconds']:.1f} s)")
    print(f"  {'thread':<14} {'where (cProfile, own time)':<48} {'µs/node':>9} {'share':>7}")
    for thread, d in cp["threads"].items():
        for group, us_ in d["us_per_node"].items():
            if d["share"][group] >= 0.005:
                print(f"  {thread:<14} {group:<48} {us_:>9.2f} {d['share'][group]:>7.1%}")
    for thread, d in cp["threads"].items():
        print(f"  {thread}: most own time in")
        for f in d["top"][:5]:
            print(f"    {f['us_per_node']:8.2f} µs/node  {f['function']}")
    for mode, title in (("wall", "py-spy, wall time (idle included)"), ("gil", "py-spy, GIL held")):
        w = res.get(mode)
        if not w:
            continue
        if "error" in w:
            print(f"  {title}: {w['error']}")
            continue
        print(f"  {title}: {w['nodes']} nodes, {w['nodes_per_s']:,.0f} nodes/s under the profiler")
        for thread, d in w["threads"].items():
            for group, us_ in d["us_per_node"].items():
                if d["share"][group] >= 0.01:
                    print(f"    {thread:<14} {group:<46} {us_:>9.2f} µs/node {d['share'][group]:>7.1%}")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=128, help="nodes per chain")
    ap.add_argument("--seconds", type=float, default=5.0, help="each window: unprofiled, cProfile, py-spy per mode")
    ap.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    ap.add_argument("--workloads", default="chained,opbyop")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = common.parse_args(ap, argv, {"k": 16, "seconds": 0.5})
    if args.worker:
        worker(args.worker, args.k, args.seconds, args.worker_out)
        return {}

    py_spy = find_py_spy()
    result: dict = {
        "benchmark": "profile_overhead", "machine": None, "k": args.k, "rate": args.rate,
        "seconds": args.seconds, "py_spy": py_spy or "not installed", "workloads": {},
    }
    print(f"profile_overhead: K = {args.k}, {args.seconds:g} s windows; cProfile per thread; py-spy "
          f"{'at ' + py_spy if py_spy else 'not installed (pip install py-spy): no sampled profile'}; "
          f"load {common.loadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.workloads.split(","):
            res = profile(kind, args.k, py_spy, args.seconds, args.rate, Path(tmp))
            result["machine"] = result["machine"] or res.pop("machine", None)
            res.pop("machine", None)
            result["workloads"][kind] = res
            print_profile(res)
    micro_ns = result["workloads"].get("chained", {}).get("micro_ns")
    if micro_ns:
        print("\npublic calls timed alone (ns per call, best of 5):")
        for name, ns in micro_ns.items():
            print(f"  {name:<24} {ns:10.0f}")
    if result["machine"]:
        result["machine"]["loadavg_end"] = common.loadavg()
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

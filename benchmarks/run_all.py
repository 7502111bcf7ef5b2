"""Run every benchmark, write JSON results and the results table at the top of benchmarks/README.md.

    python benchmarks/run_all.py                 # everything; rewrites the README's results table
    python benchmarks/run_all.py --only dispatch,parity   # those rows only; the other rows are kept
    python benchmarks/run_all.py --quick         # every script's --quick mode: a smoke test of about two minutes
    python benchmarks/run_all.py --quick --write-readme   # ... and its (quick-marked) figures into the table
    python benchmarks/run_all.py --render-only   # the table again from the JSON already in results/

Each benchmark runs in its own process (a fresh controller and JAX runtime;
on a GPU, one process holds the device at a time) with this Python, so the
same command works in the project's virtual environment and on a bare
machine whose Python has only jax and numpy (``PYTHONPATH=.``): peers,
py-spy and Chromium are optional and reported as missing. Results go to
``benchmarks/results/<name>_<platform>.json`` (git-ignored). The targets are
evaluated on them (benchmarks/targets.py: one place for every target) and the
table goes between the ``results:start`` / ``results:end`` markers of
benchmarks/README.md, nothing else in the README touched; a row is one figure on
one machine, so a GPU run's rows sit beside a CPU run's. Every benchmark's detailed
tables are printed (``--tables FILE`` writes them to a file as well).
``--quick`` runs each script's own ``--quick`` mode (tiny sizes, few rounds):
its figures only show that everything runs, so its results go to a temporary
folder (or ``--results``) and the README is left alone unless ``--write-readme``
(the rows then say ``--quick`` in their date, and the caption says so).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import report
import targets

BENCH = common.ROOT / "benchmarks"
README = BENCH / "README.md"

#: name -> (script, extra arguments, timeout in seconds)
STEPS: dict[str, tuple[str, list[str], int]] = {
    "dispatch": ("dispatch.py", [], 420),
    "interactive": ("interactive.py", [], 180),
    "parity": ("parity.py", [], 240),
    "utilization": ("utilization.py", [], 180),
    "profile_overhead": ("profile_overhead.py", [], 240),
    "multitenancy": ("multitenancy.py", [], 240),
    "pipeline": ("pipeline.py", [], 240),
    "timeline_redraw": ("timeline_redraw.py", [], 240),
    "remote": ("remote.py", [], 300),
    "checkpoint": ("checkpoint.py", [], 420),
    "input": ("input.py", [], 420),
    "memory": ("memory.py", [], 420),
    "tracing": ("tracing.py", [], 300),
    "training_loop": ("training_loop.py", [], 420),
    "depth": ("depth.py", [], 300),
    "service": ("service.py", [], 300),
    "cluster": ("cluster.py", [], 420),
    "long_run": ("long_run.py", [], 900),
}


def detect_machine(env: dict) -> dict:
    """The platform JAX picks, its device kind and count, and the host's cores, asked in a child process
    (the parent never holds the device)."""
    code = ("import json, os, pw_kernel, jax; d = jax.devices(); print(json.dumps({'platform': d[0].platform, "
            "'device_kind': d[0].device_kind, 'devices': len(d), 'cores': os.cpu_count()}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=common.ROOT,
                         timeout=300)
    if out.returncode:
        raise SystemExit(f"run_all: cannot start JAX here:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def detect_platform(env: dict) -> str:
    """The platform JAX picks (see `detect_machine`)."""
    return detect_machine(env)["platform"]


def write_table(results: Path, platform: str, status: dict | None, readme: Path = README) -> list[dict]:
    """Evaluate the targets on ``platform``'s results and rewrite the README's results table; the rows."""
    rows = targets.rows(results, platform, status)
    targets.write_readme(readme, rows, status)
    return rows


#: What ``--no-peers`` passes: a script's own way of leaving out the other frameworks it times beside pw.
NO_PEERS: dict[str, list[str]] = {"dispatch": ["--peers", "none"]}


def run_step(name: str, platform: str, env: dict, quick: bool, results: Path, peers: bool = True) -> dict:
    script, extra, timeout = STEPS[name]
    if not peers:
        extra = [*extra, *NO_PEERS.get(name, [])]
    path = results / f"{name}_{platform}.json"
    if path.exists():
        path.unlink()  # never render a stale result as this run's
    args = [sys.executable, str(BENCH / script), "--json", str(path), *extra]
    if quick:
        args.append("--quick")
        timeout = min(timeout, 180)
    print(f"\n=== {name}: {' '.join(args[1:])}", flush=True)
    t = time.perf_counter()
    try:
        proc = subprocess.run(args, env=env, cwd=common.ROOT, timeout=timeout, text=True,
                              stdout=None, stderr=subprocess.PIPE)
        rc, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = "timeout", (e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or "")
    wall = time.perf_counter() - t
    if err:
        sys.stderr.write(err[-4000:])
    status = {"name": name, "wall_s": round(wall, 1), "rc": rc}
    if rc == 0 and path.exists():
        status["json"] = str(path.relative_to(common.ROOT) if path.is_relative_to(common.ROOT) else path)
    else:
        lines = [ln for ln in (err or "").strip().splitlines() if ln.strip()]
        status["error"] = lines[-1][:300] if lines else f"exit {rc}"
        if name == "timeline_redraw" and any(w in (err or "") for w in ("playwright", "chromium", "Chromium")):
            status["error"] = "skipped: needs Playwright and Chromium (" + status["error"][:160] + ")"
        elif "ModuleNotFoundError" in status["error"]:
            status["error"] = "skipped: not installed (" + status["error"].split(":", 1)[-1].strip() + ")"
    print(f"=== {name}: {'ok' if 'json' in status else 'FAILED: ' + status['error']} ({wall:.0f} s)", flush=True)
    return status


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated subset of: " + ", ".join(STEPS))
    ap.add_argument("--skip", default="", help="comma-separated steps to leave out")
    ap.add_argument("--quick", action="store_true",
                    help="each script's --quick mode: tiny sizes, few rounds (a smoke test); leaves the README alone "
                         "unless --write-readme")
    ap.add_argument("--results", default=None,
                    help="folder for the JSON results (default: benchmarks/results; with --quick a temporary one)")
    ap.add_argument("--render-only", action="store_true",
                    help="run nothing: the README's results table (and the printed tables) from the JSON in --results")
    ap.add_argument("--write-readme", action="store_true",
                    help="with --quick: write its figures into the README's results table too (marked --quick)")
    ap.add_argument("--no-readme", action="store_true", help="do not touch benchmarks/README.md")
    ap.add_argument("--no-peers", action="store_true",
                    help="leave out the other frameworks a script times beside pw (dispatch.py's Ray and Dask peers)")
    ap.add_argument("--readme", default=str(README), help=argparse.SUPPRESS)  # another copy (tests)
    ap.add_argument("--tables", default=None, help="also write every benchmark's detailed Markdown tables to this file")
    ap.add_argument("--platform", default=None, help="with --render-only: which results to render (default: all)")
    args = ap.parse_args(argv)

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(common.ROOT), str(BENCH), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if args.results:
        results = Path(args.results)
    elif args.quick and not args.render_only:
        results = Path(tempfile.mkdtemp(prefix="pw-bench-quick-"))
    else:
        results = common.RESULTS
    results.mkdir(parents=True, exist_ok=True)

    readme = Path(args.readme)
    tables: list[str] = []
    if args.render_only:
        platforms = [args.platform] if args.platform else sorted(
            {p.stem.rsplit("_", 1)[-1] for p in results.glob("*_*.json") if not p.stem.startswith("run_all")}
        )
        for platform in platforms:
            status_path = results / f"run_all_{platform}.json"
            status = json.loads(status_path.read_text()) if status_path.exists() else None
            md = report.render(platform, results, status)
            print(md)
            tables.append(md)
            if not args.no_readme:
                write_table(results, platform, status, readme)
                print(f"rendered {platform} results into the table of {readme}")
        if args.tables:
            Path(args.tables).write_text("\n".join(tables))
        return

    names = args.only.split(",") if args.only else list(STEPS)
    skip = set(filter(None, args.skip.split(",")))
    unknown = [n for n in [*names, *skip] if n not in STEPS]
    if unknown:
        raise SystemExit(f"run_all: unknown benchmark(s) {unknown}; choose from {list(STEPS)}")
    machine = detect_machine(env)
    platform = machine["platform"]
    started = time.time()
    status = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "platform": platform,
        "machine": machine,
        "loadavg_start": common.loadavg(),
        "quick": args.quick,
        "steps": {},
    }
    print(f"run_all: platform {platform}, load average {status['loadavg_start']}, python {sys.executable}, "
          f"results in {results}")
    for name in names:
        if name in skip:
            continue
        status["steps"][name] = run_step(name, platform, env, args.quick, results, peers=not args.no_peers)
    status["loadavg_end"] = common.loadavg()
    status["wall_s"] = round(time.time() - started, 1)
    common.write_json(results / f"run_all_{platform}.json", status)
    md = report.render(platform, results, status)
    print("\n" + md)
    if args.tables:
        Path(args.tables).write_text(md)
    rows = targets.rows(results, platform, status)
    print("\nTargets (benchmarks/targets.py):")
    for r in rows:
        print(f"  {r['met']}  {r['figure']}: {r['measured']} (target {r['target']})")
    if args.no_readme or (args.quick and not args.write_readme):
        print(f"\nrun_all{' --quick' if args.quick else ''}: README left alone ({status['wall_s']:.0f} s in all)")
    else:
        targets.write_readme(readme, rows, status)
        print(f"\nrun_all: results table written to {readme} ({status['wall_s']:.0f} s in all)")

if __name__ == "__main__":
    main()

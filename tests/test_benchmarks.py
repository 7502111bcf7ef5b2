"""Every benchmark runs end to end in its --quick mode, so none can rot unnoticed.

Each script runs in its own process as `run_all.py` runs it (the repository and
benchmarks/ on PYTHONPATH, validation off), with tiny sizes and few rounds: the
figures mean nothing here, the test checks that the script exits 0 and printed
its table. A benchmark whose optional package is missing must say so and exit 0.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import chromium
import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"

pytestmark = pytest.mark.timeout(300)


def bench(script: str, *args: str, hide: tuple[str, ...] = (), timeout: float = 240) -> str:
    """Run ``benchmarks/<script> --quick *args``; its stdout. ``hide``: packages to run as if not installed."""
    env = {k: v for k, v in os.environ.items() if k != "PW_VALIDATE"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(BENCH)])
    path = str(BENCH / script)
    argv = [path, "--quick", *args]
    if hide:  # a None in sys.modules makes `import name` raise ModuleNotFoundError, as when it is not installed
        code = (
            f"import runpy, sys; sys.modules.update(dict.fromkeys({list(hide)!r})); sys.argv = {argv!r}; "
            f"runpy.run_path({path!r}, run_name='__main__')"
        )
        cmd = [sys.executable, "-c", code]
    else:
        cmd = [sys.executable, *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def has_table(out: str, *lines: str) -> None:
    """Each regular expression in ``lines`` matches a whole line of ``out``."""
    for line in lines:
        assert re.search(line, out, re.M), f"no line matching {line!r} in:\n{out}"


NUM = r"[\d,.]+"

#: script, extra arguments, packages hidden, lines of its table (regular expressions)
QUICK = {
    "dispatch": (
        "dispatch.py",
        ["--peers", "ray_tasks,ray_cg,dask"],
        ("ray", "distributed", "dask"),  # the peers are optional: each says it is missing, the rest runs
        [
            r"^tiny: µs per computation \(medians of .*\)$",
            rf"^  pw\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}$",
            r"^allreduce: µs per computation",
            r"^  tiny: pw chained / JAX op-by-op\s+",
            r"^  Ray tasks: not installed \(ray\)$",
            r"^  Dask futures: not installed \(distributed\)$",
        ],
    ),
    "interactive": (
        "interactive.py",
        [],
        (),
        [
            r"^µs per call \(medians of \d+ \+ \d+ interleaved rounds; first calls .*\)$",
            rf"^  1 call, waited\s+{NUM}\s+{NUM}\s+{NUM}  <= 3x$",
            rf"^  program of 10, fused\s+{NUM}\s+{NUM}\s+{NUM}  <= 2x$",
            rf"^  program of 10, chained \(vs jax\.jit\)\s+{NUM}\s+{NUM}\s+{NUM}  reported$",
            rf"^  program of 10, chained \(vs JAX op-by-op\)\s+{NUM}\s+{NUM}\s+{NUM}  <= 1\.5x$",
            rf"^  \d+ calls, wait each \(per call\)\s+{NUM}\s+{NUM}\s+{NUM}  <= 3x$",
            r"^  interactive: f\(x\)\.result\(\) / jax\.jit\(f\)\(x\)\s+",
        ],
    ),
    "parity": (
        "parity.py",
        [],
        (),
        [r"^ target µs  device µs    K     JAX /s      pw /s  pw/JAX$", rf"^\s+300\s+{NUM}\s+\d+\s+{NUM}\s+{NUM}\s+{NUM}"],
    ),
    "utilization": (
        "utilization.py",
        [],
        (),
        [rf"^  pw_chained\s+{NUM}%$", rf"^  event log, chained\s+busy/span\s+{NUM}%", r"^  utilization at 100 µs"],
    ),
    "profile_overhead": (
        "profile_overhead.py",
        [],
        (),
        [
            rf"^\[chained\] unprofiled {NUM} µs per node; under cProfile {NUM} µs per node",
            rf"^\[opbyop\] unprofiled {NUM} µs per node",
            rf"^  caller\s+pw_kernel/runtime/\S+\.py\s+{NUM}\s+{NUM}%$",  # the thread that submits
            # and every pw thread named, though the dispatcher and the watcher may have nothing to do (callers
            # dispatch and complete small runs; the watcher sleeps 20 ms after its last batch)
            r"^\s+pw-watcher: most own time in$", r"^\s+pw-dispatcher: most own time in$",
            rf"^  one_node_round_trip\s+{NUM}$",
        ],
    ),
    "multitenancy": (
        "multitenancy.py",
        [],
        (),
        [rf"^\s+8\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}$", rf"^  w8: {NUM} \(ideal 0.533\)$",
         r"^multitenancy: .*; a backlog of \d+ programs per row \(each figure timed over >= .*\)$"],
    ),
    "pipeline": (
        "pipeline.py",
        [],
        (),
        [rf"^\s+2x1\s+gpipe\s+4(\s+-?{NUM}){{7}}\s+\[4, 4\]$", rf"^\s+2x1\s+1f1b\s+4(\s+-?{NUM}){{7}}\s+\[2, 1\]$",
         r"^SPMD data-parallel", rf"^\s+1f1b(\s+{NUM}){{2}}\s+0\.200\s+0\.200\s+{NUM}\s+\[2, 1\]\s+\[2, 1\]$",
         rf"^\s+interleaved(\s+{NUM}){{2}}\s+0\.111\s+0\.111\s+{NUM}\s+\[5, 3\]\s+\[5, 3\]$",
         rf"^\s+zero_bubble(\s+{NUM}){{2}}\s+0\.077\s+0\.077\s+{NUM}\s+\[2, 2\]\s+\[2, 2\]$"],
    ),
    "checkpoint": (
        "checkpoint.py",
        [],
        (),
        [rf"^blocked\s+{NUM} MB: save\(\) returned in {NUM} ms \(median\)$",
         rf"^restore\s+{NUM} MB: pw\s+{NUM} MB/s, orbax\s+{NUM} MB/s, pw/orbax {NUM}x$",
         rf"^loop\s+10 steps, a save every 5: {NUM}x the steps/s of the loop without saves$"],
    ),
    "input": (
        "input.py",
        [],
        (),
        [rf"^data-parallel step on 8 devices: {NUM} ms; each batch loads in {NUM} ms$",
         rf"^dp\s+sleep async : placed\s+{NUM} steps/s; prefetch {NUM}x, inline {NUM}x of placed$",
         rf"^pipeline\s+cpu\s+logged: placed\s+{NUM} steps/s; prefetch {NUM}x, inline {NUM}x of placed$"],
    ),
    "memory": (
        "memory.py",
        [],
        (),
        [rf"^pw\s+\d+\s+{NUM}\s+(-|{NUM})$", rf"^pw, donate=False\s+\d+\s+{NUM}\s+(-|{NUM})$",
         rf"^plain JAX \(donated jit\)\s+\d+\s+{NUM}\s+(-|{NUM})$", rf"^pw / plain JAX: {NUM}x the layers$",
         # the CPU measures no memory; a GPU runs each candidate in a fresh process and reads its peak
         r"^measured peak: (none, the \w+ backend reports no memory .*|each candidate's step run once .*)$"],
    ),
    "call_walk": (
        "call_walk.py",
        [],
        (),
        # the walk of a warm call goes down the import tree and back: no call into a module it does not import
        [r"^a warm f\(x\)\.result\(\): \d+ files, \d+ functions, \d+ calls, \d+ returns to a file it had left, "
         r"0 upward calls$"],
    ),
    "tracing": (
        "tracing.py",
        [],
        (),
        [r"^ms to trace \+ plan \(medians of \d+ interleaved rounds, each figure timed over >= .*; "
         r"first in this process: .*\)$",
         rf"^\s+5\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}$", rf"^\s+20\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}$",
         rf"^  linear in K: pw µs per step at K=20 / at K=5: {NUM}x$",
         rf"^  mlp, 5 steps\s+5(\s+{NUM} /\s*{NUM}){{3}}\s+{NUM}%\s+{NUM}%$",
         rf"^  pipeline, 1 steps\s+\d+(\s+{NUM} /\s*{NUM}){{3}}\s+{NUM}%\s+{NUM}%$"],
    ),
    "training_loop": (
        "training_loop.py",
        ["--load", "1"],  # the busy process beside it starts and is killed
        (),
        [r"^training loop: .*data axis of \d+; 1 busy processes beside; load average .*$",
         *(rf"^  {v}\s+{NUM}\s+{NUM}\s+{NUM}  \(\d+ rounds of \d+ steps, each figure timed over >= .*\)$"
           for v in ("placed", "input", "checkpoint")),
         rf"^  last loss read: pw {NUM}, JAX {NUM}; load average .*$"],
    ),
    "depth": (
        "depth.py",
        [],
        (),
        [r"^the pick alone \(`Lifecycle.next_work`, bound reached, no devices\), µs a call:$",
         rf"^\s+24 queued:\s+{NUM} µs$", rf"^\s+480 queued:\s+{NUM} µs$",
         *(rf"^\s+{d}\s+{t}\s+{q}\s+{NUM}\s+{NUM}\s+{NUM}$" for d in (1, 8) for t in (1, 8) for q in (24, 480))],
    ),
    "service": (
        "service.py",
        [],
        (),
        [r"^\(a\) a waited 1-node call, µs \(medians of \d+ interleaved rounds, .*\)$",
         *(rf"^  {row}\s+{NUM}$" for row in ("through the service", "local slice, this process", "raw ZeroMQ round trip")),
         rf"^  service / \(round trip \+ local\)\s+{NUM}x$",
         r"^  device time heavy / light\s+\S+\s+\(samples \[.*\]\)$",
         rf"^  both / alone\s+{NUM}x$",
         r"^\(c\) a client SIGKILLed with \d+ runs \(.*\) and \d+ MiB in the service; "
         r"(one kill|the median of \d+ kills)$",
         rf"^  this client's next call\s+{NUM} ms  \(-?{NUM} ms more than idle\)$",
         rf"^    every kill: more than idle / its bound, ms  -?{NUM} / {NUM}(, -?{NUM} / {NUM})*$",
         r"^  its memory and runs gone after\s+\S+ s  \(the longest of \d+\)$",
         r"^  a killed client's memory back\s+.*\(target <= 10 s\)  (met|MISSED)$"],
    ),
    "long_run": (
        "long_run.py",
        ["--slice", "both"],  # the 8-device variant too (skipped, saying why, on a host with fewer)
        (),
        [r"^leaves \(one\): the chained step on L leaves of \(16,\) float32 on a 1-device slice, .*$",
         *(rf"^\s+{n}\s+{NUM}\s+{NUM}\s+{NUM}  {t}  \(\d+ rounds\)$"
           for n, t in ((1, "reported"), (30, "<= 2x"), (100, "reported"), (400, r"<= 2\.5x"))),
         r"^leaves \(data8\): (skipped: asks 8 devices, \d present .*|the chained step .* on an 8-device slice .*)$",
         rf"^\s+3,000\s+{NUM}\s+{NUM}$",  # the curve's last checkpoint
         rf"^  jax\.jit µs/step over 500 steps: {NUM} before, {NUM} after .*$",
         rf"^  last window / second window: {NUM}x \(target <= 1\.1\)$",
         rf"^  RSS growth, first checkpoint to the end: -?{NUM} MiB \(target <= 64 MiB\)$",
         r"^  curve picture: \S+long_run_curve_\w+\.png$",
         r"^cnn: flax NNX MNIST tutorial's CNN \([\d,]+ parameters, \d+ leaves with AdamW\), .*$",
         *(rf"^  {b}\s+pw\s+{NUM} ms/step  jax\.jit\s+{NUM}  pw / jit {NUM}x  \(target <= 1\.15\)$" for b in ("numpy", "placed")),
         r"^transformer: 12-layer decoder \(flax NNX\), .*; \d+ leaves in \(params, opt_state\); .*$",
         rf"^  pw / jit\s+{NUM}x  \(target <= 1\.1\)$",
         rf"^  final loss after \d+ steps: pw {NUM}, jax\.jit {NUM} \(match\)$",  # the same losses both sides
         *(rf"^  {row}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}x$"
           for row in ("through the service", "client's own devices", r"not connected \(after\)")),
         *(rf"^  {who}\s+{NUM}\s+{NUM}\s+-?{NUM}$" for who in ("client", "service")),
         *(rf"^  {who} RSS after each round, MiB: {NUM}(, {NUM})+ \(-?{NUM} KiB per step through the service\)$"
           for who in ("client", "service"))],
    ),
}


@pytest.mark.parametrize("name", list(QUICK))
def test_a_benchmark_runs_end_to_end_in_its_quick_mode(name, tmp_path):
    script, args, hide, lines = QUICK[name]
    out = bench(script, *args, "--json", str(tmp_path / "result.json"), hide=hide)
    has_table(out, *lines)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["benchmark"] == name and "skipped" not in result


def test_the_timeline_redraw_benchmark_runs_in_chromium(tmp_path):
    pytest.importorskip("playwright", reason="the timeline benchmark drives Chromium through Playwright")
    pytest.importorskip("anywidget")
    if not chromium.available():
        pytest.skip(f"no Chromium at {chromium.CHROMIUM}")
    out = bench("timeline_redraw.py", "--json", str(tmp_path / "result.json"))
    has_table(
        out,
        r"^timeline redraw, 2,000 events \([\d,]+ bars, \d+ lanes\), Chromium [\d.]+:$",
        *(rf"^  {view}\s+median\s+{NUM} ms\s+p95\s+{NUM} ms" for view in ("full", "zoom", "zoom_deep", "pan")),
        rf"^  python: widget built in {NUM} µs/event",
    )
    assert json.loads((tmp_path / "result.json").read_text())["redraw"]["pan"]["median_ms"] > 0


@pytest.mark.parametrize(
    "script, hide, note",
    [
        ("remote.py", ("ray",), "remote: skipped: needs Ray for remote islands: ray is not installed"),
        ("checkpoint.py", ("orbax",), "checkpoint: skipped: orbax.checkpoint is not installed"),
        ("timeline_redraw.py", ("playwright",), "timeline_redraw: skipped: needs Playwright, anywidget and Chromium: "
                                                "playwright is not installed"),
    ],
)
def test_a_benchmark_whose_optional_package_is_missing_says_so_and_exits_0(script, hide, note, tmp_path):
    out = bench(script, "--json", str(tmp_path / "result.json"), hide=hide)
    assert note in out
    assert "is not installed" in json.loads((tmp_path / "result.json").read_text())["skipped"]


def test_the_long_run_benchmark_skips_its_optional_parts_saying_why(tmp_path):
    out = bench("long_run.py", "--parts", "curve,cnn,transformer,service", "--json", str(tmp_path / "result.json"),
                hide=("flax", "optax", "zmq", "matplotlib"))
    assert "transformer: skipped: flax is not installed" in out and "service: skipped: zmq is not installed" in out
    assert "cnn: skipped: flax is not installed" in out
    assert "curve picture: skipped: matplotlib is not installed" in out
    result = json.loads((tmp_path / "result.json").read_text())
    assert "is not installed" in result["transformer"]["skipped"] and "is not installed" in result["service"]["skipped"]
    assert not list(tmp_path.glob("*.png"))


def test_run_all_quick_runs_the_scripts_quick_modes_and_leaves_the_readme_alone(tmp_path):
    readme = (BENCH / "README.md").read_text()
    env = {k: v for k, v in os.environ.items() if k != "PW_VALIDATE"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--quick", "--only", "multitenancy", "--results", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert re.search(r"^=== multitenancy: .*multitenancy\.py --json \S+ --quick$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^=== multitenancy: ok \(\d+ s\)$", proc.stdout, re.M), proc.stdout
    has_table(proc.stdout, r"^#### Multi-tenancy \(multitenancy\.py\)$", rf"^\| 8 \| {NUM} \| {NUM} \| {NUM} \| {NUM} \|$")
    assert "README left alone" in proc.stdout and (BENCH / "README.md").read_text() == readme
    status = json.loads(next(tmp_path.glob("run_all_*.json")).read_text())
    assert status["quick"] is True and status["steps"]["multitenancy"]["rc"] == 0


@pytest.mark.timeout(900)
def test_run_all_quick_runs_every_step_on_a_one_device_host(tmp_path):
    """PW_NUM_CPU_DEVICES=1 (a one-GPU host): every benchmark adapts its layout, none fails, nothing left in benchmarks/."""
    env = {k: v for k, v in os.environ.items() if k != "PW_VALIDATE"}
    env["PW_NUM_CPU_DEVICES"] = "1"
    before = _files_in_benchmarks()
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--quick", "--results", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=840,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    status = json.loads(next(tmp_path.glob("run_all_*.json")).read_text())
    assert status["quick"] is True
    failed = {name: st for name, st in status["steps"].items() if st["rc"] != 0}
    assert not failed, f"{failed}\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
    assert set(status["steps"]) == {"dispatch", "interactive", "parity", "utilization", "profile_overhead",
                                    "multitenancy", "pipeline", "timeline_redraw", "remote", "checkpoint", "input",
                                    "memory", "tracing", "training_loop", "depth", "service", "long_run"}
    # what needs more devices says what it measured instead
    assert "allreduce: asks 4 devices, 1 present: measured on 1 instead" in proc.stdout
    assert "layout 2x1 asks 2 devices, 1 present: its 2 stages share 1 device" in proc.stdout
    # every result is drawn into the tables (a renderer that failed would say "could not be rendered")
    assert "could not be rendered" not in proc.stdout, proc.stdout[-5000:]
    for title in ("The scheduler at depth (depth.py)", "A user's training loop against plain JAX (training_loop.py)",
                  "The Pathways service (service.py)", "Long runs at real sizes (long_run.py)"):
        assert f"#### {title}" in proc.stdout, title
    assert _files_in_benchmarks() == before


def _files_in_benchmarks() -> set[Path]:
    """Every file under benchmarks/ (results/ included, git-ignored as it is), less Python's byte code."""
    return {p for p in BENCH.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


# ----------------------------------------------------------- needs Ray
@pytest.mark.ray
@pytest.mark.slow
def test_the_dispatch_benchmark_times_its_ray_peers(tmp_path):
    pytest.importorskip("ray", reason="the Ray peers need Ray (pip install ray)")
    out = bench("dispatch.py", "--peers", "ray_tasks,ray_cg", "--json", str(tmp_path / "result.json"))
    has_table(out, r"^peers, tiny chain: µs per computation", rf"^  ray_tasks\s+{NUM}\s+", rf"^  ray_cg\s+-\s+{NUM}")
    assert json.loads((tmp_path / "result.json").read_text())["peers"]["status"] == {"ray_tasks": "ok", "ray_cg": "ok"}


@pytest.mark.ray
@pytest.mark.slow
def test_the_remote_islands_benchmark_runs_on_a_local_ray_cluster(tmp_path):
    pytest.importorskip("ray", reason="remote islands are Ray actors (pip install ray)")
    out = bench("remote.py", "--json", str(tmp_path / "result.json"))
    has_table(
        out,
        rf"^  local\s+each further node\s+-?{NUM} µs, fixed per run\s+-?{NUM} ms",
        rf"^  remote / local per node: -?{NUM}x$",
        *(rf"^{re.escape(pair)}\s+{NUM}$" for pair in ("local -> remote", "remote -> remote (actor to actor)")),
    )

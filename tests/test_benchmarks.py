"""Every benchmark runs end to end in its --quick mode, so none can rot unnoticed.

Each script runs in its own process as `run_all.py` runs it (the repository and
benchmarks/ on PYTHONPATH, validation off), with tiny sizes and few rounds: the
figures mean nothing here, the test checks that the script exits 0 and printed
its table. A benchmark whose optional package is missing must say so and exit 0.
"""

from __future__ import annotations

import ast
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
    "cluster": (
        "cluster.py",
        [],
        (),
        [r"^cluster: a head and 2 worker Ray nodes on 127\.0\.0\.1 .*\(Ray's default: ~15 s\).*; load average .*$",
         rf"^  one host \(2 devices of one node's island\)\s+{NUM} steps/s$",
         rf"^  two hosts \(two nodes' islands\)\s+{NUM} steps/s$",
         rf"^  two hosts / one host\s+{NUM}x$",
         rf"^  pw, through the service\s+-?{NUM} ms\s+-?{NUM} GiB/s  \(call .*\)$",
         rf"^  raw Ray: ray\.put on A, ray\.get on B\s+-?{NUM} ms\s+-?{NUM} GiB/s  \(call .*\)$",
         rf"^  pw / raw Ray bandwidth\s+-?{NUM}x$",
         rf"^  Ray service, a Ray node's island\s+{NUM}$", rf"^  one-host service, its own island\s+{NUM}$",
         rf"^  Ray node island / one-host\s+{NUM}x$",
         rf"^  this client's next call on node 1's island\s+{NUM} ms  \(-?{NUM} ms more than idle .*\)$",
         # the killed host's runs fail (naming the lost island), none left hanging
         rf"^  the lost client's runs all failed after\s+{NUM} s  \(\d+ failed, \d+ completed before the kill\)$",
         r"^  the lost runs failed after the kill\s+.*\(target <= 10 s\)  (met|MISSED)$"],
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
         r"^transformer: 2-layer decoder \(flax NNX\), .*; \d+ leaves in \(params, opt_state\); .*$",
         rf"^  pw / jit\s+{NUM}x  \(target <= 1\.1\)$",
         rf"^  final loss after \d+ steps: pw {NUM}, jax\.jit {NUM} \(match\)$",  # the same losses both sides
         *(rf"^  {row}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}x$"
           for row in ("through the service", "client's own devices", r"not connected \(after\)")),
         *(rf"^  {who}\s+{NUM}\s+{NUM}\s+-?{NUM}$" for who in ("client", "service")),
         *(rf"^  {who} RSS after each round, MiB: {NUM}(, {NUM})+ \(-?{NUM} KiB per step through the service\)$"
           for who in ("client", "service"))],
    ),
}


#: benchmarks that are system tests: they start a Ray cluster (and skip where Ray is missing)
MARKS = {"cluster": (pytest.mark.ray, pytest.mark.slow)}


@pytest.mark.parametrize("name", [pytest.param(n, marks=MARKS.get(n, ())) for n in QUICK])
def test_a_benchmark_runs_end_to_end_in_its_quick_mode(name, tmp_path):
    script, args, hide, lines = QUICK[name]
    if name in MARKS:
        pytest.importorskip("ray", reason=f"{script} starts a local Ray cluster (pip install ray)")
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


def _run_all_steps() -> list[str]:
    """The step names of run_all.py's STEPS, read from its source (importing it needs benchmarks/ on the path)."""
    tree = ast.parse((BENCH / "run_all.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "STEPS")
    return [k.value for k in node.value.keys]


@pytest.mark.timeout(900)
def test_run_all_quick_runs_the_layout_steps_on_a_one_device_host(tmp_path):
    """PW_NUM_CPU_DEVICES=1 (a one-GPU host): each benchmark that lays work out over devices adapts, none fails,
    nothing is left in benchmarks/.

    These are the scripts with a one-device path of their own (each says what it measured instead) and the
    service's (a one-GPU box's pool); the others run the same code on one device or eight (each runs on 8 in
    `test_a_benchmark_runs_end_to_end_in_its_quick_mode`), and cluster.py's islands are Ray nodes' devices
    (``--ray-devices``): one device a node is tests/test_service_cluster.py's and tutorial 10's. remote.py's
    only change is its Ray actors' device count (tests/test_service_cluster.py starts one-device actors),
    and dispatch.py's Ray and Dask peers do not depend on the devices (`--no-peers`): each Ray cluster they
    would start costs ~20 s of the suite."""
    env = {k: v for k, v in os.environ.items() if k != "PW_VALIDATE"}
    env["PW_NUM_CPU_DEVICES"] = "1"
    before = _files_in_benchmarks()
    steps = ["dispatch", "pipeline", "timeline_redraw", "checkpoint", "input", "memory", "tracing",
             "training_loop", "service"]
    same = {"interactive", "parity", "utilization", "profile_overhead", "multitenancy", "depth", "long_run", "remote"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--quick", "--no-peers", "--only", ",".join(steps),
         "--results", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=840,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    status = json.loads(next(tmp_path.glob("run_all_*.json")).read_text())
    assert status["quick"] is True
    failed = {name: st for name, st in status["steps"].items() if st["rc"] != 0}
    assert not failed, f"{failed}\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
    assert set(status["steps"]) == set(steps) == set(_run_all_steps()) - same - {"cluster"}  # (a new one is placed)
    # what needs more devices says what it measured instead
    assert "allreduce: asks 4 devices, 1 present: measured on 1 instead" in proc.stdout
    assert "layout 2x1 asks 2 devices, 1 present: its 2 stages share 1 device" in proc.stdout
    # `--no-peers`: dispatch.py was told so, and timed no other framework
    assert re.search(r"^=== dispatch: .*dispatch\.py --json \S+ --peers none --quick$", proc.stdout, re.M), proc.stdout
    assert "peers" not in json.loads((tmp_path / f"dispatch_{status['platform']}.json").read_text())
    # every result is drawn into the tables (a renderer that failed would say "could not be rendered")
    assert "could not be rendered" not in proc.stdout, proc.stdout[-5000:]
    for title in ("A user's training loop against plain JAX (training_loop.py)", "The Pathways service (service.py)"):
        assert f"#### {title}" in proc.stdout, title
    assert _files_in_benchmarks() == before
    # the README's results table from these results: every target evaluated, its limits the scripts' own
    targets = _targets_module()
    platform = status["platform"]
    rows = targets.rows(tmp_path, platform, status)
    assert [r["figure"] for r in rows] == [t.figure for t in targets.TARGETS]
    assert {r["machine"] for r in rows} == {f"{os.cpu_count()}-core CPU, 1 simulated device"}
    assert all(r["date"].endswith("(--quick)") for r in rows)
    # every script that ran has its figures (those left out have none)
    unmeasured = {r["figure"] for r in rows if r["value"] is None}
    assert unmeasured <= {t.figure for t in targets.TARGETS if t.bench not in steps or str(t.key).startswith("peers.")}, (
        unmeasured)
    _check_limits_agree_with_the_scripts(targets, rows, tmp_path, platform)
    readme = tmp_path / "README.md"
    readme.write_text((BENCH / "README.md").read_text())
    assert targets.write_readme(readme, rows, status)
    _check_only_the_block_changed(targets, (BENCH / "README.md").read_text(), readme.read_text())


def _targets_module():
    sys.path.insert(0, str(BENCH))
    try:
        import targets
    finally:
        sys.path.remove(str(BENCH))
    return targets


def _check_limits_agree_with_the_scripts(targets, rows, results: Path, platform: str) -> None:
    """Where a script reports the same figure among its own targets, it holds it to the same limit."""
    matched = 0
    for r in rows:
        t = r["spec"]
        if r["value"] is None or t.op not in ("<=", ">="):
            continue
        path = results / f"{t.bench}_{platform}.json"
        for own in json.loads(path.read_text()).get("targets", []):
            if abs(own["value"] - r["value"]) <= 1e-9 * max(1.0, abs(r["value"])):
                assert (own["limit"], own["below"]) == (t.limit, t.op == "<="), (t.figure, own)
                matched += 1
    assert matched >= 15, matched


def _check_only_the_block_changed(targets, before: str, after: str) -> None:
    def outside(text: str) -> tuple[str, str]:
        head, rest = text.split(targets.START, 1)
        return head, rest.split(targets.END, 1)[1]

    assert outside(after) == outside(before)
    assert after.count(targets.START) == after.count(targets.END) == 1
    assert after != before


def test_the_readme_results_table_is_well_formed_and_agrees_with_its_targets():
    """The committed table is run_all.py's: one row per figure and machine, the figures and targets of targets.py,
    and each mark what the measured figure gives against its target."""
    targets = _targets_module()
    text = (BENCH / "README.md").read_text()
    assert text.count(targets.START) == text.count(targets.END) == 1
    assert text.index(targets.START) < text.index("## How to run")  # the table leads
    block = text.split(targets.START, 1)[1].split(targets.END, 1)[0]
    assert "generated by benchmarks/run_all.py" in block
    table = [ln for ln in block.splitlines() if ln.startswith("|")]
    assert table[0] == "| " + " | ".join(targets.HEADER) + " |" and all(ln.count("|") == 7 for ln in table), table[:3]
    rows = targets.parse_block(text)
    specs = {t.figure: t for t in targets.TARGETS}
    assert rows and all(r["figure"] in specs for r in rows)
    assert len({(r["figure"], r["machine"]) for r in rows}) == len(rows)
    for r in rows:
        t = specs[r["figure"]]
        assert r["target"] == targets.target_text(t), r
        assert re.fullmatch(r"\d{4}-\d\d-\d\d( \(--quick\))?", r["date"]), r
        m = re.fullmatch(r"(-?[\d,.]+)(x|%| ms| s| µs| MiB)?", r["measured"])
        if not m:
            assert r["met"] == "—", r
            continue
        value = float(m.group(1).replace(",", "")) / (100 if m.group(2) == "%" else 1)
        ok = targets.met(t, value)
        # the table rounds; a figure that rounds onto its limit may go either way
        if ok is not None and abs(value - (t.limit if t.op != "in" else t.limit[0])) > 0.01 * abs(value):
            assert r["met"] == ("✓" if ok else "✗"), r


def test_run_all_render_only_rewrites_the_results_table_and_nothing_else(tmp_path):
    """--render-only from results in a folder: this machine's rows replaced, another machine's kept, the rows of a
    benchmark the run left out kept, nothing outside the markers touched."""
    targets = _targets_module()
    readme = tmp_path / "README.md"
    original = (BENCH / "README.md").read_text()
    readme.write_text(original)
    results = tmp_path / "results"
    results.mkdir()

    def render(status: dict, **res: dict) -> list[dict]:
        for name, r in res.items():
            (results / f"{name}_cpu.json").write_text(json.dumps({"benchmark": name, **r}))
        (results / "run_all_cpu.json").write_text(json.dumps(status))
        proc = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--render-only", "--results", str(results),
                               "--readme", str(readme), "--platform", "cpu"],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        _check_only_the_block_changed(targets, original, readme.read_text())
        return targets.parse_block(readme.read_text())

    machine = {"platform": "cpu", "device_kind": "cpu", "devices": 8, "cores": 64}
    interactive = {"rows": {"single": {"ratio": 2.5}, "fused": {"ratio": 2.5}, "chained": {"ratio": 1.2},
                            "wait_each": {"ratio": 9.0}}}
    service = {"waited_call": {"ratio": 1.4}, "shares": {"ratio": 2.3, "both_nodes_per_s": 95, "alone_nodes_per_s": 100},
               "killed": {"extra_wait_s": 0.01, "bound_s": 0.02, "kills": [{"memory_back_s": 0.5},
                                                                            {"memory_back_s": 12.0}]}}
    status = {"date": "2030-01-02 03:04", "platform": "cpu", "machine": machine, "quick": False, "wall_s": 60,
              "steps": {"interactive": {"rc": 0, "wall_s": 1.0}, "service": {"rc": 0, "wall_s": 1.0}}}
    rows = render(status, interactive=interactive, service=service)
    mine = {r["figure"]: r for r in rows if r["machine"] == "64-core CPU, 8 simulated devices"}
    assert set(mine) == {t.figure for t in targets.TARGETS if t.bench in ("interactive", "service")}
    got = {f: (r["measured"], r["met"]) for f, r in mine.items() if r["date"] == "2030-01-02"}
    fig = {t.key: t.figure for t in targets.TARGETS if isinstance(t.key, str)}
    assert got[fig["rows.single.ratio"]] == ("2.50x", "✓") and got[fig["rows.wait_each.ratio"]] == ("9.00x", "✗")
    assert got[fig["waited_call.ratio"]] == ("1.40x", "✓")
    assert got[fig["shares.ratio"]] == ("2.3", "✗")  # outside 1.9 to 2.1
    assert got[fig["killed.extra_wait_s / killed.bound_s"]] == ("0.50x", "✓")
    assert got[fig["killed.kills[*].memory_back_s"]] == ("12 s", "✗")  # the longest counts
    assert fig["rows[variant=placed].ratio"] not in mine  # never measured on this machine: no row for it

    # a run on another machine (one device), of interactive only: its rows beside the first machine's
    one = dict(machine, devices=1)
    rows = render(dict(status, machine=one, date="2030-02-03 04:05", quick=True, steps={"interactive": {"rc": 0, "wall_s": 1.0}}),
                  interactive={"rows": {k: {"ratio": 1.0} for k in interactive["rows"]}})
    by = {(r["figure"], r["machine"]): r for r in rows}
    assert by[(fig["rows.single.ratio"], "64-core CPU, 1 simulated device")]["date"] == "2030-02-03 (--quick)"
    assert by[(fig["rows.single.ratio"], "64-core CPU, 8 simulated devices")]["measured"] == "2.50x"
    assert by[(fig["waited_call.ratio"], "64-core CPU, 8 simulated devices")]["measured"] == "1.40x"
    # the first machine again, service only: its interactive rows stay as they were
    rows = render(dict(status, steps={"service": {"rc": 0, "wall_s": 1.0}}), service=dict(service, waited_call={"ratio": 2.2}))
    by = {(r["figure"], r["machine"]): r for r in rows}
    assert by[(fig["waited_call.ratio"], "64-core CPU, 8 simulated devices")]["measured"] == "2.20x"
    assert by[(fig["rows.single.ratio"], "64-core CPU, 8 simulated devices")]["measured"] == "2.50x"
    assert by[(fig["rows.single.ratio"], "64-core CPU, 1 simulated device")]["measured"] == "1.00x"


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

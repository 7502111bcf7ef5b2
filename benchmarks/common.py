"""Shared helpers of the benchmarks: interleaved timing, medians, machine description, JSON.

Imports only the standard library (and jax lazily, in `machine`), so every
benchmark runs where only jax and numpy are installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

#: Seconds every timed figure covers at least (the sum of the samples it is made of), so that a
#: figure means something on a fast device too; ``--quick`` lowers it (and the tables say so).
MIN_WINDOW_S = 0.5
QUICK_WINDOW_S = 0.02
QUICK = False


def parse_args(ap: argparse.ArgumentParser, argv: list[str] | None, quick: dict[str, Any]) -> argparse.Namespace:
    """Parse ``argv`` with a ``--quick`` flag: tiny sizes and few rounds, so the script runs end to end in seconds.

    ``quick`` maps option names (as in the namespace) to the values ``--quick``
    uses; an option given explicitly on the command line keeps its value.
    """
    ap.add_argument("--quick", action="store_true", help="tiny sizes, few rounds: a smoke test that runs in seconds")
    args = ap.parse_args(argv)
    global MIN_WINDOW_S, QUICK
    QUICK = bool(args.quick)
    MIN_WINDOW_S = QUICK_WINDOW_S if QUICK else 0.5
    if args.quick:
        for name, value in quick.items():
            if getattr(args, name) == ap.get_default(name):
                setattr(args, name, value)
    return args


def missing(module: str) -> str | None:
    """Why ``module`` (an optional package) cannot be imported here, or None when it can."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        return f"{module} is not installed ({type(e).__name__}: {e})"
    return None


def skipped(path: str | os.PathLike | None, benchmark: str, why: str) -> dict[str, Any]:
    """Report a benchmark (or part) that cannot run here: a printed note and a JSON result saying why."""
    print(f"{benchmark}: skipped: {why}")
    result = {"benchmark": benchmark, "skipped": why}
    write_json(path, result)
    return result


def interleaved(
    modes: dict[str, Callable[[], Any]],
    repeats: int,
    *,
    warmup: int = 2,
    budget_s: float | None = None,
    min_repeats: int = 3,
    min_window_s: float | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of every mode, the modes interleaved round by round.

    Each round runs every mode once, in an order rotated by one each round, so
    machine noise (other processes, frequency changes) hits all modes alike and
    no mode always follows the same one. Stops after ``repeats`` rounds, or
    early after ``min_repeats`` rounds when ``budget_s`` has been spent, but
    never before every mode's samples add up to ``min_window_s`` (default
    `MIN_WINDOW_S`: on a fast device, more rounds rather than a window too
    short to mean anything). `window` gives the window a result covers.
    """
    window = MIN_WINDOW_S if min_window_s is None else min_window_s
    for fn in modes.values():
        for _ in range(warmup):
            fn()
    names = list(modes)
    samples: dict[str, list[float]] = {m: [] for m in names}
    t0 = time.perf_counter()
    r = 0
    while True:
        k = r % len(names)
        for m in names[k:] + names[:k]:
            fn = modes[m]
            t = time.perf_counter()
            fn()
            samples[m].append(time.perf_counter() - t)
        r += 1
        done = r >= repeats or (budget_s is not None and r >= min_repeats and time.perf_counter() - t0 > budget_s)
        if done and all(sum(xs) >= window for xs in samples.values()):
            return samples


def timed(fn: Callable[[], Any], repeats: int, *, warmup: int = 1, min_window_s: float | None = None) -> list[float]:
    """Seconds of each call of ``fn`` alone: at least ``repeats`` calls, and at least ``min_window_s`` in all."""
    return interleaved({"fn": fn}, repeats, warmup=warmup, min_window_s=min_window_s)["fn"]


def window(samples: dict[str, list[float]] | list[float]) -> float:
    """The shortest total time one figure of ``samples`` (a mode's samples, or one list) was measured over."""
    lists = samples.values() if isinstance(samples, dict) else [samples]
    return min(sum(xs) for xs in lists)


def window_note(seconds: float) -> str:
    """How long a table's figures were each timed: a phrase for its header (``--quick`` says its windows are short)."""
    note = f"each figure timed over >= {seconds:.2f} s"
    if QUICK:
        note += " (--quick: short windows, figures meaningless)"
    return note


def device_count() -> int:
    """How many devices pw_kernel's controller has (all islands)."""
    import pw_kernel as pw

    return len(pw.devices())


def fit(want: int, have: int | None = None) -> int:
    """The largest divisor of ``want`` that is at most ``have`` devices (default: the devices present).

    A data axis sized this way still splits every batch made for ``want`` devices evenly.
    """
    have = device_count() if have is None else have
    return max(d for d in range(1, want + 1) if want % d == 0 and d <= max(1, have))


def fewer_devices(what: str, want: int, got: int, have: int | None = None) -> str | None:
    """The sentence a table prints when ``what`` asked for ``want`` devices and runs on ``got`` (None when equal)."""
    have = device_count() if have is None else have
    if got >= want:
        return None
    note = f"{what}: asks {want} devices, {have} present: measured on {got} instead"
    print(note)
    return note


@dataclasses.dataclass(frozen=True)
class Stat:
    """Median and quartiles of a list of samples (same unit as the samples)."""

    median: float
    p25: float
    p75: float
    n: int

    @classmethod
    def of(cls, xs: list[float], scale: float = 1.0) -> Stat:
        xs = sorted(x * scale for x in xs)
        if len(xs) == 1:
            return cls(xs[0], xs[0], xs[0], 1)
        q = statistics.quantiles(xs, n=4, method="inclusive")
        return cls(statistics.median(xs), q[0], q[2], len(xs))

    @property
    def spread(self) -> float:
        """Interquartile range over the median: a noise figure."""
        return (self.p75 - self.p25) / self.median if self.median else 0.0

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def per_item_us(samples: list[float], items: int) -> Stat:
    """Microseconds per item (node, computation) from seconds per call of ``items`` items."""
    return Stat.of(samples, 1e6 / items)


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def cpu_seconds(stat_path: str) -> float | None:
    """User + system CPU seconds from a /proc ``stat`` file (a process's or a thread's), or None without one.

    Example::

        cpu_seconds(f"/proc/{pid}/stat")      # another process's CPU time so far
    """
    try:
        stat = Path(stat_path).read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT, capture_output=True, text=True, timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPU, cores, load, accelerator, versions, date."""
    import jax

    devs = jax.devices()
    d0 = devs[0]
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "loadavg": loadavg(),
        "platform": d0.platform,
        "device_kind": d0.device_kind,
        "devices": len(devs),
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "versions": {
            name: _version(name)
            for name in ("jax", "jaxlib", "numpy", "ray", "dask", "distributed", "py-spy")
        },
        "git": _git_commit(),
    }


def write_json(path: str | os.PathLike | None, result: dict[str, Any]) -> None:
    if not path:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str))


def target(name: str, value: float, limit: float, *, below: bool = True, unit: str = "", note: str = "") -> dict:
    """One performance target: met when ``value`` is at most (``below``) or at least ``limit``."""
    met = value <= limit if below else value >= limit
    return {"name": name, "value": value, "limit": limit, "below": below, "unit": unit, "met": met, "note": note}


def finish(path: str | os.PathLike | None, result: dict[str, Any]) -> dict[str, Any]:
    """A benchmark's last step: print its targets, write its JSON, shut the controller down."""
    import pw_kernel as pw

    print("\ntargets:")
    print_targets(result["targets"])
    write_json(path, result)
    pw.shutdown()
    return result


def print_targets(targets: list[dict]) -> None:
    for t in targets:
        rel = "<=" if t["below"] else ">="
        mark = "met" if t["met"] else "MISSED"
        print(f"  {t['name']:<52} {t['value']:>9.3g}{t['unit']}  (target {rel} {t['limit']:g}{t['unit']})  {mark}")

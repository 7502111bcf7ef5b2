"""The benchmarks' targets in one place, and the results table run_all.py writes at the top of benchmarks/README.md.

Each `Target` names a benchmark (its result is ``results/<bench>_<platform>.json``),
a key into that JSON (see `lookup`), what the figure is (pw against the
competitor it was run beside, in the same process, interleaved), and the
target: ``<=`` or ``>=`` a limit, ``in`` a range, or ``None`` (reported only).
`rows` evaluates every target on one run's results; `write_readme` puts the
table between the ``results:start`` / ``results:end`` markers of the README and
touches nothing else. A row is one figure on one machine: a run replaces the rows
of the machine it ran on and keeps the others' (a GPU run's beside a CPU run's; a
``--only`` run's beside the rest of an earlier full run).

The scripts also print their own targets (``common.target``) when run alone;
tests/test_benchmarks.py checks that those limits agree with these.

Only the standard library: this module runs where run_all.py runs.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

START = "<!-- results:start -->"
END = "<!-- results:end -->"
HEADER = ("figure", "target", "measured", "met", "date", "machine")


@dataclasses.dataclass(frozen=True)
class Target:
    bench: str  #: the benchmark: run_all.py's step name, and the stem of its JSON result
    key: str | Callable[[dict], Any]  #: where the figure is in the JSON (`lookup`), or a function of the JSON
    figure: str  #: what is measured, as pw / the competitor run beside it
    op: str | None  #: "<=", ">=", "in" (``limit`` is (low, high)), or None: reported, no target
    limit: float | tuple[float, float] | None = None
    unit: str = "x"  #: "x", " ms", " s", " µs", " MiB", "%" (a fraction shown as a percentage) or ""
    reduce: Callable[[list[float]], float] | None = None  #: for a key that selects several values: the one that counts
    none: str = "not measured"  #: what the table says where the benchmark ran and the key's figure is null


# ----------------------------------------------------------------------------- derived figures


def _cancel_over_bound(r: dict) -> float | None:
    """The next call's wait after `cancel()`, in units of (the run-ahead bound + one node), chained, default bound."""
    for row in r.get("cancel_and_priority") or []:
        if row["run_ahead_s"] is not None and row["mode"] == "chained":
            return row["next_call_after_cancel_over_node"] / (row["run_ahead_s"] * 1e3 / row["node_ms"] + 1)
    return None


def _prefetch_over_inline(r: dict) -> float | None:
    """`pw.prefetch` / loading in the loop when the loop reads each step's loss, storage latency: the worst row."""
    rows = [x for part in ("data_parallel", "pipelined") for x in r.get(part, []) if x["kind"] == "sleep"]
    return min((x["logged"]["prefetch"] / x["logged"]["inline"] for x in rows), default=None)


def _deepest_over_shallowest(r: dict) -> float | None:
    """nodes/s with the deepest queue measured / the shallowest, the worst of the layouts and tenant counts."""
    rows = r.get("rows") or []
    if not rows:
        return None
    deepest = max(x["depth"] for x in rows)
    return min(x["relative"] for x in rows if x["depth"] == deepest)


TARGETS: tuple[Target, ...] = (
    # dispatch.py: a chain of K tiny computations (the paper's Figure 5)
    Target("dispatch", "variants.tiny.us_per_computation.pw.chained / variants.tiny.us_per_computation.jax.opbyop",
           "dispatch: tiny chain, pw chained program / raw JAX op-by-op, µs per computation", "<=", 1.5),
    Target("dispatch", "variants.tiny.us_per_computation.pw.fused / variants.tiny.us_per_computation.jax.fused",
           "dispatch: tiny chain, pw fused / hand-written `jax.jit`", "<=", 1.1),
    Target("dispatch",
           "variants.allreduce.us_per_computation.pw.chained / variants.allreduce.us_per_computation.jax.opbyop",
           "dispatch: all-reduce chain, pw chained / raw JAX op-by-op", "<=", 1.5),
    Target("dispatch", "variants.allreduce.us_per_computation.pw.fused / variants.allreduce.us_per_computation.jax.fused",
           "dispatch: all-reduce chain, pw fused / hand-written `jax.jit`", "<=", 1.1),
    Target("dispatch", "peers.us_per_computation.ray_tasks.opbyop / peers.us_per_computation.pw.chained",
           "dispatch: Ray tasks / pw chained, µs per computation", ">=", 20.0),
    # interactive.py: waited calls on a float32[16] vector
    Target("interactive", "rows.single.ratio", "interactive: 1 waited call, pw / `jax.jit`", "<=", 3.0),
    Target("interactive", "rows.fused.ratio", "interactive: waited fused program of 10, pw / `jax.jit`", "<=", 2.0),
    Target("interactive", "rows.chained.ratio", "interactive: waited chained program of 10, pw / JAX op-by-op",
           "<=", 1.5),
    Target("interactive", "rows.wait_each.ratio", "interactive: calls each waited, pw / JAX, per call", "<=", 3.0),
    # parity.py (the paper's Figure 6): reported, no target
    Target("parity", "smallest_parity_size_us",
           "parity: smallest computation from which pw chained keeps ≥ 95% of JAX op-by-op's throughput", None,
           unit=" µs", none="none of the sizes measured"),
    # utilization.py
    Target("utilization", "rows[target_us=100].utilization.pw_chained",
           "utilization: 100 µs computations, pw chained, device busy / wall", ">=", 0.95, unit="%"),
    Target("utilization", "rows[target_us=1000].utilization.pw_chained",
           "utilization: 1 ms computations, pw chained, device busy / wall", ">=", 0.95, unit="%"),
    # multitenancy.py
    Target("multitenancy", "tenants.8.relative", "multitenancy: 8 tenants' nodes/s / 1 tenant's", ">=", 0.9),
    Target("multitenancy", "tenants.8.jain", "multitenancy: Jain fairness, 8 tenants", ">=", 0.95, unit=""),
    Target("multitenancy", _cancel_over_bound,
           "multitenancy: next call after `cancel()` / (run-ahead bound + one node)", "<=", 1.0),
    Target("multitenancy", "segments[nodes=128].auto_over_fused_throughput",
           "multitenancy: 128-node program in fused segments (auto) / one executable, throughput", ">=", 0.95),
    # pipeline.py
    Target("pipeline", "rows[*].pw_over_jax",
           "pipeline: pw pipelined step / plain-JAX loop of the same ops, worst layout and schedule", "<=", 1.1,
           reduce=max),
    # timeline_redraw.py
    Target("timeline_redraw", "redraw.{zoom,pan}.p95_ms", "timeline widget: zoom or pan redraw in Chromium, p95",
           "<=", 50.0, unit=" ms", reduce=max),
    # remote.py
    Target("remote", "per_node_us.remote.per_node_us / per_node_us.local.per_node_us",
           "remote: each further node on a Ray-actor island / on a local island", "<=", 5.0),
    # checkpoint.py
    Target("checkpoint", "blocked[*].blocked_ms.median", "checkpoint: `save()` blocks the caller, worst size",
           "<=", 10.0, unit=" ms", reduce=max),
    Target("checkpoint", "throughput[-1].save.ratio", "checkpoint: save throughput, pw / plain orbax, largest state",
           ">=", 0.9),
    Target("checkpoint", "throughput[-1].restore.ratio",
           "checkpoint: restore throughput, pw / plain orbax, largest state", ">=", 0.9),
    Target("checkpoint", "loop.ratio", "checkpoint: loop saving every 5 steps / the same loop without saves",
           ">=", 0.95),
    # input.py
    Target("input", "{data_parallel,pipelined}[kind=sleep].async.prefetch",
           "input: `pw.prefetch` / batches placed beforehand, storage latency, worst case", ">=", 0.9, reduce=min),
    Target("input", _prefetch_over_inline,
           "input: `pw.prefetch` / loading in the loop, loss read every step, storage latency, worst case", ">=", 1.0),
    # memory.py
    Target("memory", "ratio", "memory: largest model admitted, pw / plain JAX's donated `jax.jit` step", ">=", 0.95),
    # tracing.py
    Target("tracing", "loops.rows.*.ratio", "tracing: trace + plan a loop, pw / `jax.make_jaxpr`, worst K", "<=", 2.0,
           reduce=max),
    Target("tracing", "linearity", "tracing: pw µs per step, longest loop / shortest (linear in K)", "<=", 1.5),
    Target("tracing", "cells.{mlp,pipeline}.ratio", "tracing: `%%pathways` cell rerun / its first run, worst cell",
           "<=", 0.05, unit="%", reduce=max),
    # depth.py
    Target("depth", _deepest_over_shallowest,
           "depth: nodes/s with the deepest queue / the shallowest, worst layout and tenant count", ">=", 0.9),
    # training_loop.py
    Target("training_loop", "rows[variant=placed].ratio",
           "training loop: batches placed beforehand, pw / `jax.jit` steps/s", ">=", 0.95),
    Target("training_loop", "rows[variant=input].ratio",
           "training loop: fed by `pw.prefetch` / `jax.device_put` in the loop, steps/s", ">=", 0.95),
    Target("training_loop", "rows[variant=checkpoint].ratio",
           "training loop: saving every 10 steps, pw / orbax's async `CheckpointManager`, steps/s", ">=", 0.95),
    # service.py
    Target("service", "waited_call.ratio",
           "service: waited 1-node call through the service / (raw ZeroMQ round trip + local call)", "<=", 1.5),
    Target("service", "shares.ratio", "service: device-time shares of clients weighted 2:1, heavy / light", "in",
           (1.9, 2.1), unit=""),
    Target("service", "shares.both_nodes_per_s / shares.alone_nodes_per_s",
           "service: two clients' nodes/s / one client alone", ">=", 0.9),
    Target("service", "killed.extra_wait_s / killed.bound_s",
           "service: next call after another client's SIGKILL, beyond idle / (run-ahead bound + one node)", "<=", 1.0),
    Target("service", "killed.kills[*].memory_back_s", "service: a SIGKILLed client's memory back, longest", "<=", 10.0,
           unit=" s", reduce=max),
    # cluster.py: the service over a local 3-node Ray cluster (issue 50)
    Target("cluster", "pipeline.ratio",
           "cluster: 2-stage pipeline (20 ms stages) across two hosts / on one host, steps/s", ">=", 0.9),
    Target("cluster", "transfer.ratio", "cluster: 64 MiB island to island between two nodes, pw / raw Ray, bandwidth",
           ">=", 0.8),
    Target("cluster", "call.ratio",
           "cluster: waited tiny call, a Ray node's island of the service / a one-host service's island", "<=", 1.5),
    Target("cluster", "kill.extra_wait_s / kill.bound_s",
           "cluster: next call after a host's kill, beyond idle / (run-ahead bound + one node)", "<=", 1.0),
    Target("cluster", "kill.lost_s", "cluster: the killed host's runs failed, after the kill", "<=", 10.0,
           unit=" s", none="none failed"),
    # long_run.py
    Target("long_run", "leaves_one.rows[leaves=30].ratio", "long run: chained step on 30 leaves, pw / `jax.jit`",
           "<=", 2.0),
    Target("long_run", "leaves_one.rows[leaves=400].ratio", "long run: chained step on 400 leaves, pw / `jax.jit`",
           "<=", 2.5),
    Target("long_run", "curve.flatness", "long run: the 100,000-step curve, µs per step, last window / second",
           "<=", 1.1),
    Target("long_run", "curve.rss_growth_mib", "long run: RSS growth over the 100,000-step curve", "<=", 64.0,
           unit=" MiB"),
    Target("long_run", "cnn.rows.*.ratio", "long run: flax NNX MNIST CNN, pw / `jax.jit` ms per step, worse batches",
           "<=", 1.15, reduce=max),
    Target("long_run", "transformer.ratio", "long run: 12-layer flax NNX transformer, pw / `jax.jit` ms per step",
           "<=", 1.1),
)


# ----------------------------------------------------------------------------- keys into a result


def lookup(result: dict, key: str | Callable[[dict], Any]) -> float | list[float] | None:
    """The figure ``key`` names in ``result``, or None where the result has no such figure.

    A key is a dotted path: ``a.b.c``; ``name[field=value]`` keeps the items of a list
    whose field equals value (several: ``[f=1,g=x]``); ``[*]`` every item; ``[-1]`` one by
    index; ``*`` every value of a dict; ``{a,b}`` those keys of a dict (missing ones
    skipped). A path with a wildcard gives a list. ``p / q`` divides two paths' figures
    (item by item for lists of one length). A callable is called with the result.
    """
    if callable(key):
        try:
            return key(result)
        except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError):
            return None
    if " / " in key:
        num, den = (lookup(result, k) for k in key.split(" / ", 1))
        if num is None or den is None:
            return None
        if isinstance(num, list) or isinstance(den, list):
            if not (isinstance(num, list) and isinstance(den, list) and len(num) == len(den)):
                return None
            return [a / b for a, b in zip(num, den) if b]
        return num / den if den else None
    nodes, many = [result], False
    for part in key.split("."):
        m = re.fullmatch(r"(\{[^}]*\}|[^\[{]*)(?:\[([^\]]*)\])?", part)
        name, sel = m.group(1), m.group(2)
        nxt = []
        for n in nodes:
            if name.startswith("{"):
                many = True
                nxt += [n[k] for k in name[1:-1].split(",") if isinstance(n, dict) and k in n]
            elif name == "*":
                many = True
                nxt += list(n.values()) if isinstance(n, dict) else []
            elif name:
                if isinstance(n, dict) and name in n:
                    nxt.append(n[name])
            else:
                nxt.append(n)
        if sel is not None:
            picked = []
            for n in nxt:
                if not isinstance(n, list):
                    continue
                if sel == "*":
                    many = True
                    picked += n
                elif re.fullmatch(r"-?\d+", sel):
                    if -len(n) <= int(sel) < len(n):
                        picked.append(n[int(sel)])
                else:
                    many = True
                    conds = [c.split("=", 1) for c in sel.split(",")]
                    picked += [x for x in n if isinstance(x, dict) and all(_same(x.get(f), v) for f, v in conds)]
            nxt = picked
        nodes = nxt
    values = [n for n in nodes if isinstance(n, (int, float)) and not isinstance(n, bool)]
    if many:
        return values or None
    return values[0] if values else None


def _same(value: Any, text: str) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(text) == value
        except ValueError:
            return False
    return str(value) == text


# ----------------------------------------------------------------------------- one run's rows


def machine_label(m: dict) -> str:
    """'2-core CPU, 8 simulated devices' or '16-core host, 1 NVIDIA H200 (gpu)', from a run's machine description."""
    cores, platform, n = m.get("cores") or "?", m.get("platform") or "?", m.get("devices") or "?"
    if platform == "cpu":
        return f"{cores}-core CPU, {n} simulated device{'s' if n != 1 else ''}"
    kind = m.get("device_kind") or platform
    return f"{cores}-core host, {n} {kind} ({platform})"


def fmt(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value:.1%}" if abs(value) < 0.1 else f"{value:.0%}"
    if unit == "x":
        return f"{value:.2f}x" if abs(value) < 10 else f"{value:.1f}x"
    if abs(value) >= 100:
        return f"{value:,.0f}{unit}"
    return f"{value:.3g}{unit}" if unit in ("", " s") else f"{value:.1f}{unit}"


def _limit(v: float, unit: str) -> str:
    return f"{v:.0%}" if unit == "%" else f"{v:g}{unit}"


def target_text(t: Target) -> str:
    if t.op is None:
        return "reported"
    if t.op == "in":
        lo, hi = t.limit
        return f"{_limit(lo, t.unit)} to {_limit(hi, t.unit)}"
    return f"{'≤' if t.op == '<=' else '≥'} {_limit(t.limit, t.unit)}"


def met(t: Target, value: float) -> bool | None:
    if t.op is None:
        return None
    if t.op == "in":
        return t.limit[0] <= value <= t.limit[1]
    return value <= t.limit if t.op == "<=" else value >= t.limit


def rows(results: Path, platform: str, status: dict | None) -> list[dict]:
    """Every target evaluated on the results in ``results`` of ``platform``: one dict per row of the table."""
    status = status or {}
    steps = status.get("steps")
    loaded: dict[str, dict | None] = {}
    for t in TARGETS:
        if steps is not None and t.bench not in steps:  # not in this run: an older result there is not this run's
            loaded[t.bench] = None
        elif t.bench not in loaded:
            p = results / f"{t.bench}_{platform}.json"
            try:
                loaded[t.bench] = json.loads(p.read_text()) if p.exists() else None
            except json.JSONDecodeError:
                loaded[t.bench] = None
    m = dict(status.get("machine") or next((r["machine"] for r in loaded.values()
                                             if r and isinstance(r.get("machine"), dict)), {}))
    m.setdefault("platform", platform)
    date = (status.get("date") or m.get("date") or "?").split(" ")[0]
    if status.get("quick"):
        date += " (--quick)"
    steps = steps or {}
    out = []
    for t in TARGETS:
        r = loaded[t.bench]
        row = {"spec": t, "figure": t.figure, "target": target_text(t), "date": date, "machine": machine_label(m)}
        value = None
        if r is not None and "skipped" not in r:
            value = lookup(r, t.key)
            if isinstance(value, list):
                value = (t.reduce or statistics.median)(value) if value else None
        if value is None:
            err = (steps.get(t.bench) or {}).get("error")
            why = (f"skipped: {r['skipped'].split(' (')[0]}" if r and "skipped" in r else "failed" if err else
                   "not in this run" if r is None else t.none)
            row.update(measured=why, met="—", value=None, ran=r is not None or bool(err))
        else:
            ok = met(t, value)
            text = fmt(value, t.unit)
            if ok is not None and t.unit == "x" and abs(value) < 10 and met(t, round(value, 2)) != ok:
                text = f"{value:.3f}x"  # (1.503x, not a "1.50x" that reads as met against "≤ 1.5x")
            row.update(measured=text, met="—" if ok is None else "✓" if ok else "✗", value=value, ran=True)
        out.append(row)
    return out


# ----------------------------------------------------------------------------- the README block


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def parse_block(text: str) -> list[dict]:
    """The rows of the table between the markers of ``text`` (a README), as dicts keyed by HEADER."""
    if START not in text or END not in text:
        return []
    block = text.split(START, 1)[1].split(END, 1)[0]
    out = []
    for line in block.splitlines():
        if not line.startswith("|"):
            continue
        cells = _cells(line)
        if len(cells) != len(HEADER) or cells == list(HEADER) or set(cells[0]) <= set("-: "):
            continue
        out.append(dict(zip(HEADER, cells)))
    return out


def render_block(table_rows: list[dict], caption: str) -> str:
    note = "<!-- generated by benchmarks/run_all.py (targets in benchmarks/targets.py): edits here are overwritten -->"
    lines = [START, note, "", caption, "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in table_rows:
        lines.append("| " + " | ".join(str(r[h]).replace("|", "\\|") for h in HEADER) + " |")
    return "\n".join(lines + ["", END])


def merge(new: list[dict], old: list[dict]) -> list[dict]:
    """This run's rows, and the old rows of figures this run did not measure or of other machines, in TARGETS order.

    A figure this run did not reach (a benchmark left out with ``--only``) keeps its old row on the
    same machine, and has none on a machine that never measured it (a GPU run of a few benchmarks adds
    their rows only); one it reached but could not measure is shown as such.
    """
    order = {t.figure: i for i, t in enumerate(TARGETS)}
    machine = new[0]["machine"] if new else None
    mine = {r["figure"]: r for r in new}
    kept = [o for o in old if o["figure"] in order and (o["machine"] != machine or
                                                         (o["figure"] in mine and not mine[o["figure"]]["ran"]))]
    replaced = {o["figure"] for o in kept if o["machine"] == machine}
    rows_ = kept + [r for r in new if r["figure"] not in replaced and r["ran"]]
    machines = list(dict.fromkeys([machine, *(r["machine"] for r in rows_)]))
    return sorted(rows_, key=lambda r: (order[r["figure"]], machines.index(r["machine"])))


def caption(status: dict | None, new_rows: list[dict], table_rows: list[dict]) -> str:
    """What the last run was and what it found (``new_rows``); a warning when rows of a ``--quick`` run are shown."""
    status = status or {}
    n_met = sum(r["met"] == "✓" for r in new_rows)
    n_missed = sum(r["met"] == "✗" for r in new_rows)
    n_none = sum(r["value"] is None for r in new_rows)
    la0, la1 = status.get("loadavg_start"), status.get("loadavg_end")
    load = f"; load average {la0[0]:.1f} at start, {la1[0]:.1f} at end" if la0 and la1 else ""
    text = (f"Last written by `run_all.py{' --quick' if status.get('quick') else ''}` on {status.get('date', '?')}"
            f" ({status.get('wall_s', 0):.0f} s{load}): {n_met} targets met, {n_missed} missed, {n_none} not "
            "measured. Each figure is pw against its competitor run beside it in the same process, interleaved, "
            "so the ratios mean more than the machine's absolute speed. A row keeps the date and machine "
            "it was measured on.")
    cores = (status.get("machine") or {}).get("cores") or next(
        (int(m.group(1)) for r in new_rows[:1] if (m := re.match(r"(\d+)-core", r["machine"]))), None)
    if cores and la0 and la1 and max(la0[0], la1[0]) > cores:
        text += (f" The machine was loaded beyond its {cores} cores during the run (other work beside it): "
                 "the figures are noisier than usual.")
    if any("--quick" in r["date"] for r in table_rows):
        text += (" **Rows dated `(--quick)` come from a `--quick` run** (tiny sizes, windows of ~20 ms): they show "
                 "that everything runs and roughly where it stands, not that a target is met or missed.")
    return text


def write_readme(readme: Path, new_rows: list[dict], status: dict | None) -> bool:
    """Rewrite the block between START and END of ``readme`` (added at the top, under the title, if missing).

    Returns whether the text changed. Nothing outside the block is touched.
    """
    text = readme.read_text() if readme.exists() else "# Benchmarks\n"
    table_rows = merge(new_rows, parse_block(text))
    block = render_block(table_rows, caption(status, new_rows, table_rows))
    if START in text and END in text:
        head, rest = text.split(START, 1)
        new = head + block + rest.split(END, 1)[1]
    else:
        title, nl, body = text.partition("\n")
        new = f"{title}\n\n{block}\n{nl}{body}"
    if new != text:
        readme.write_text(new)
    return new != text

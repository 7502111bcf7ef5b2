"""Markdown tables from the benchmarks' JSON results (used by run_all.py)."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

SYSTEMS = {
    "jax": "raw JAX",
    "pw": "pw_kernel",
    "ray_tasks": "Ray tasks",
    "ray_cg": "Ray Compiled Graph",
    "dask": "Dask futures (threads)",
}
MODES = (("opbyop", "OpByOp"), ("chained", "Chained"), ("fused", "Fused"), ("opbyop_wait", "OpByOp, wait each"))


def _load(results: Path, name: str, platform: str) -> dict | None:
    p = results / f"{name}_{platform}.json"
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError:
        return None


def us(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def rate(v: float | None) -> str:
    if not v:
        return ""
    r = 1e6 / v
    if r >= 1e6:
        return f"{r / 1e6:.1f}M/s"
    if r >= 1e3:
        return f"{r / 1e3:.0f}k/s" if r >= 1e4 else f"{r / 1e3:.1f}k/s"
    return f"{r:.0f}/s"


def cell(v: float | None) -> str:
    return "—" if v is None else f"{us(v)} ({rate(v)})"


def pct(v: float) -> str:
    return f"{v:.1%}"


def header(platform: str, status: dict | None, any_result: dict | None) -> list[str]:
    m = (any_result or {}).get("machine", {})
    v = m.get("versions", {})
    la0 = (status or {}).get("loadavg_start") or m.get("loadavg")
    la1 = (status or {}).get("loadavg_end") or m.get("loadavg_end")
    load = " / ".join(f"{x:.2f}" for x in la0) if la0 else "?"
    if la1:
        load += " at start, " + " / ".join(f"{x:.2f}" for x in la1) + " at end"
    dev = f"{m.get('devices', '?')} {'simulated CPU devices' if platform == 'cpu' else m.get('device_kind', platform)}"
    names = ("jax", "jaxlib", "numpy", "ray", "dask", "py-spy")
    vers = ", ".join(f"{k} {v[k]}" if v.get(k) else f"{k}: not installed" for k in names)
    lines = [
        f"### {platform.upper()}: {(status or {}).get('date') or m.get('date', '?')}",
        "",
        f"- Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('os', '?')}; {dev}.",
        f"- Load average (1 / 5 / 15 min): {load}.",
        f"- Versions: Python {m.get('python', '?')}, {vers}; pw_kernel at git {m.get('git') or '?'}.",
    ]
    if status:
        steps = status.get("steps", {})
        took = ", ".join(f"{n} {s['wall_s']:.0f} s" for n, s in steps.items())
        quick = " --quick" if status.get("quick") else ""
        lines.append(f"- `run_all.py`{quick}: {status.get('wall_s', 0):.0f} s in all ({took}).")
        lines.append("- Timed windows: " + (
            "--quick, short windows (figures meaningless)." if status.get("quick") else
            "every timed figure is made of at least 0.5 s of timing (more rounds on a fast device); "
            "the tables give each one's window where it is longer or the timing is a single call's latency."))
        for n, s in steps.items():
            if "error" in s:
                lines.append(f"- **{n}**: {s['error']}")
    return lines


def dispatch_tables(d: dict) -> tuple[list[str], list[dict]]:
    k = d["k"]
    out = [f"#### Dispatch: a chain of K = {k} tiny computations, µs per computation (computations per second)", ""]
    tiny = d["variants"]["tiny"]
    peers = d.get("peers", {})
    out.append("| system | " + " | ".join(h for _, h in MODES) + " |")
    out.append("|---|" + "---|" * len(MODES))
    for system in ("jax", "pw"):
        row = tiny["us_per_computation"][system]
        out.append(f"| {SYSTEMS[system]} | " + " | ".join(cell(row.get(m)) if m in row else
                   ("n/a: no programs" if (system, m) == ("jax", "chained") else "—") for m, _ in MODES) + " |")
    for name, st in peers.get("status", {}).items():
        label = SYSTEMS.get(name, name)
        if st != "ok":
            out.append(f"| {label} | {st} |" + " |" * (len(MODES) - 1))
            continue
        row = peers["us_per_computation"].get(name, {})
        out.append(f"| {label} | " + " | ".join(cell(row.get(m)) for m, _ in MODES) + " |")
    out.append("")
    rep = tiny["repeats"]
    note = (
        f"Medians of interleaved rounds: OpByOp (raw JAX) / Chained / Fused timed together ({rep.get('targets', '?')} "
        f"rounds); pw OpByOp and both \"wait each\" columns in a second group ({rep.get('opbyop', '?')} rounds, "
        f"raw JAX "
        f"op-by-op there: {us(tiny.get('jax_opbyop_in_opbyop_group'))} µs), because the K runs per call of pw OpByOp "
        f"leave garbage and history that slow whatever runs next. pw chained: `submit` returns after "
        f"{us(tiny['pw_chained_submit_returns_us_per_node'])} µs per node; first call of every mode "
        f"(trace + compile): "
        f"{tiny['first_call_s']:.1f} s."
    )
    if peers.get("us_per_computation"):
        ref = peers["us_per_computation"]
        note += (
            f" Peer rows: {peers.get('repeats', '?')} rounds interleaved with raw JAX op-by-op "
            f"({us(ref['jax']['opbyop'])} µs)"
            f" and pw chained ({us(ref['pw']['chained'])} µs) again; the peer ratios use those same-round figures."
        )
    out += [note, ""]
    ar = d["variants"].get("allreduce", {})
    if "us_per_computation" in ar:
        out.append(f"#### Dispatch, all-reduce variant: `psum` over a {ar.get('devices', 4)}-device slice "
                   f"(`jax.shard_map`), K = {k}, µs per computation")
        out.append("")
        if ar.get("note"):
            out += [ar["note"] + ".", ""]
        out.append("| system | " + " | ".join(h for _, h in MODES) + " |")
        out.append("|---|" + "---|" * len(MODES))
        for system in ("jax", "pw"):
            row = ar["us_per_computation"][system]
            out.append(f"| {SYSTEMS[system]} | " + " | ".join(cell(row.get(m)) if m in row else
                       ("n/a: no programs" if (system, m) == ("jax", "chained") else "—") for m, _ in MODES) + " |")
        out.append("| Ray, Dask | n/a (no collectives over JAX devices) | | | |")
        out.append("")
    elif ar:
        out += [f"All-reduce variant: {ar.get('status', 'not run')}.", ""]
    return out, d.get("targets", [])


def interactive_table(it: dict) -> tuple[list[str], list[dict]]:
    rep = it["repeats"]
    out = [
        "#### Interactive latency (interactive.py): waited calls on a float32[16] vector, µs per call",
        "",
        "| row | pw_kernel | plain JAX | pw / JAX | target |",
        "|---|---|---|---|---|",
    ]
    for r in it["rows"].values():
        tgt = f"≤ {r['limit']:g}x" if r["limit"] is not None else "reported"
        out.append(f"| {r['label']} | {us(r['pw_us'])} | {us(r['jax_us'])} | {r['ratio']:.2f} | {tgt} |")
    out += ["", f"Medians of interleaved rounds ({rep.get('program', '?')} for the program rows, "
                f"{rep.get('wait_each', '?')} for the wait-each rows); first calls (trace + compile): "
                f"{it['first_call_s']:.1f} s.", ""]
    return out, it.get("targets", [])


def parity_table(p: dict) -> tuple[list[str], list[dict]]:
    out = [
        "#### Minimum computation size for parity: pw chained vs raw JAX op-by-op (computations per second)",
        "",
        "| computation (device µs) | K | raw JAX | pw chained | pw / JAX |",
        "|---|---|---|---|---|",
    ]
    for r in p["rows"]:
        mark = " ✓" if r["fraction"] >= p["parity_threshold"] else ""
        out.append(f"| {us(r['device_us'])} | {r['k']} | {r['jax_per_s']:,.0f} | {r['pw_per_s']:,.0f} "
                   f"| {r['fraction']:.2f}{mark} |")
    out.append("")
    at = p.get("smallest_parity_size_us")
    out.append(
        f"Smallest computation from which on pw keeps ≥ {p['parity_threshold']:.0%} of raw JAX's throughput: "
        + (f"**{us(at)} µs**." if at is not None else "**none of the sizes measured**.")
    )
    out.append("")
    t = []
    if at is not None:
        t.append({"name": "parity: smallest size with pw chained ≥ 95% of JAX", "value": at, "limit": None,
                  "below": True, "unit": " µs", "met": None, "note": "reported (no target in the spec)"})
    return out, t


def utilization_table(u: dict) -> tuple[list[str], list[dict]]:
    out = [
        "#### Utilization: device busy time / wall time (busy = N × the computation's fused-reference time)",
        "",
        "| computation (device µs) | N | raw JAX op-by-op | pw chained | pw chained / raw JAX "
        "| pw chained, 4 runs back to back | pw fused | event log: busy / span (chained) "
        "| nodes that waited for dispatch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in u["rows"]:
        x = r["utilization"]
        lg = r["event_log"]["chained"]
        out.append(
            f"| {us(r['device_us'])} | {r['n']} | {pct(x['jax'])} | {pct(x['pw_chained'])} "
            f"| {x['pw_chained'] / x['jax']:.2f} "
            f"| {pct(x['pw_chained_x4'])} | "
            f"{pct(x['pw_fused'])} | {pct(lg['busy_over_span'])} "
            f"| {lg['starved_nodes']:.0f} ({us(lg['starved_us'])} µs) |"
        )
    out.append("")
    return out, u.get("targets", [])


def profile_tables(pr: dict) -> list[str]:
    out = [
        f"#### Host overhead profile (profile_overhead.py): where the µs per node go, K = {pr['k']} tiny nodes",
        "",
    ]
    if pr.get("py_spy") == "not installed":
        out += ["py-spy is not installed here: no sampled profile (cProfile per thread and the public calls below ran).",
                ""]
    workloads = (("chained", "pw chained (one program of K nodes)"), ("opbyop", "pw OpByOp (K one-node programs)"))
    for kind, title in workloads:
        w = pr["workloads"].get(kind)
        if not w:
            continue
        cp = w["cprofile"]
        out.append(f"{title}: {w['unprofiled_us_per_node']:.1f} µs per node unprofiled, {cp['us_per_node']:.1f} under "
                   f"cProfile. Own time per thread by where it is spent (share of the thread's time):")
        out.append("")
        out += _thread_shares(cp["threads"], "µs/node", 0.01)
        tops = [(f["us_per_node"], thread, f["function"]) for thread, d in cp["threads"].items() for f in d["top"]
                if not f["where"].startswith("waiting")]
        out.append("Functions with the most own time (waits left out): " + "; ".join(
            f"{fn} on {thread} {v:.2f} µs" for v, thread, fn in sorted(tops, reverse=True)[:6]) + ".")
        out.append("")
        gil = w.get("gil")
        if gil and "threads" in gil:
            out.append(f"py-spy, GIL held ({gil['nodes_per_s']:,.0f} nodes/s under the profiler):")
            out.append("")
            out += _thread_shares(gil["threads"], "GIL µs/node", 0.02)
    micro = pr["workloads"].get("chained", {}).get("micro_ns")
    if micro:
        out.append("Public calls timed alone (ns per call, best of 5):")
        out.append("")
        out.append("| " + " | ".join(micro) + " |")
        out.append("|" + "---|" * len(micro))
        out.append("| " + " | ".join(f"{v:,.0f}" for v in micro.values()) + " |")
        out.append("")
    return out


def multitenancy_table(mt: dict) -> tuple[list[str], list[dict]]:
    out = [
        "#### Multi-tenancy (multitenancy.py)",
        "",
        *([f"A backlog of {mt['runs']} programs per row; each row timed over "
           f"{min(r['window_s'] for r in mt['tenants'].values()):.2f} s or more.", ""] if "runs" in mt else []),
        "| tenants | nodes/s | vs 1 tenant | vs raw JAX (one thread) | Jain fairness |",
        "|---|---|---|---|---|",
    ]
    jr = mt["jax_op_by_op_nodes_per_s"]
    t = []
    for k, r in mt["tenants"].items():
        out.append(f"| {k} | {r['nodes_per_s']:,.0f} | {r['relative']:.2f} | {r['nodes_per_s'] / jr:.2f} "
                   f"| {r['jain']:.3f} |")
        if k != "1":
            t.append({"name": f"multitenancy: {k} tenants vs 1", "value": r["relative"], "limit": 0.9, "below": False,
                      "unit": "x", "met": r["relative"] >= 0.9, "note": ""})
            t.append({"name": f"multitenancy: Jain fairness, {k} tenants", "value": r["jain"], "limit": 0.95,
                      "below": False, "unit": "", "met": r["jain"] >= 0.95, "note": ""})
    shares = " / ".join(f"{v:.3f}" for v in mt["weighted_shares"].values())
    ideal = " / ".join(f"{v:.3f}" for v in mt["ideal_shares"].values())
    out += ["", f"Weighted shares 1:2:4:8: {shares} (ideal {ideal}).", ""]
    rows = mt.get("cancel_and_priority") or []
    if rows:
        r0 = rows[0]
        out += [
            f"Cancel and priority: a {r0['nodes']}-node program of {r0['node_ms']:.1f} ms nodes on one device; "
            f"waits in units of that node's device time (median of {r0['repeats']}); before = `run_ahead_s=None`.",
            "",
            "| run_ahead_s | next call after `cancel()` | priority-10 call behind it "
            "| nodes still on the device at cancel |",
            "|---|---|---|---|",
        ]
        for r in rows:
            label = "None (before)" if r["run_ahead_s"] is None else f"{r['run_ahead_s']:g}"
            after, prio = r["next_call_after_cancel_over_node"], r["priority_10_wait_over_node"]
            out.append(f"| {label} | {after:.2f} | {prio:.2f} | {r['nodes_still_on_device_at_cancel']:.0f} |")
            if r["run_ahead_s"] is None:
                continue
            limit = r["run_ahead_s"] * 1e3 / r["node_ms"] + 1  # the bound plus one node, in node times
            for what, key in (("next call after cancel", "next_call_after_cancel_over_node"),
                              ("priority-10 call", "priority_10_wait_over_node")):
                t.append({"name": f"multitenancy: {what}, node times", "value": r[key], "limit": round(limit, 2),
                          "below": True, "unit": "", "met": r[key] <= limit, "note": "bound + one node"})
        out.append("")
    return out, t


def _thread_shares(threads: dict, unit: str, min_share: float) -> list[str]:
    """Time per node by thread and where it goes, the groups of at least ``min_share`` of a thread's time."""
    out = [f"| thread | where | {unit} | share |", "|---|---|---|---|"]
    for thread, d in threads.items():
        for group, v in d["us_per_node"].items():
            if d["share"][group] >= min_share:
                out.append(f"| {thread} | {group} | {v:.2f} | {d['share'][group]:.1%} |")
    return out + [""]


def pipeline_table(pp: dict) -> tuple[list[str], list[dict]]:
    out = [
        "#### Pipelines (pipeline.py): pw's pipelined step vs the same stages as a plain-JAX asynchronous loop",
        "",
        "Layout SxD: S stages on slices of D devices. Wall ms per SGD step (medians of interleaved rounds); "
        "bubble = 1 - one stage's compute / wall, for both; pw's own bubble from its event log beside it.",
        "",
        "| layout | schedule | M | pw ms | plain JAX ms | pw / JAX | bubble pw | bubble JAX | (S-1)/(M+S-1) "
        "| pw event log | peak live activations per stage |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    t = []
    for r in pp["rows"]:
        out.append(f"| {r['layout']} | {r['schedule']} | {r['M']} | {r['wall_ms']['pw']:.1f} | {r['wall_ms']['jax']:.1f} "
                   f"| {r['pw_over_jax']:.2f} | {r['bubble']['pw']:.2f} | {r['bubble']['jax']:.2f} | {r['theory']:.2f} "
                   f"| {r['pw_event_log_bubble']:.2f} | {r['live_peak_per_stage']} |")
        t.append({"name": f"pipeline {r['layout']} {r['schedule']} M={r['M']}: pw / plain-JAX loop", "value": r["pw_over_jax"],
                  "limit": 1.1, "below": True, "unit": "x", "met": r["pw_over_jax"] <= 1.1, "note": ""})
    out += ["", f"SPMD data-parallel reference ({pp['spmd_layers']} layers over all devices): "
                f"{pp['spmd_samples_per_s']:,.0f} samples/s.", ""]
    rows = pp.get("schedules") or []
    if rows:
        out += [
            f"Schedules on one model of 2S layers (layout {rows[0]['layout']}, M={rows[0]['M']}; interleaved as 2S "
            "one-layer stages, v=2): wall ms per waited step beside one plain `jax.jit` training step of the same "
            "model data-parallel over the same devices; bubble of the ideal-device replay vs the paper's formula, "
            "and measured from the step's events; live activations per slice.",
            "",
            "| schedule | pw ms | plain jit ms | pw / jit | theory | ideal replay | measured | live ideal | live measured |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            out.append(f"| {r['schedule']} | {r['wall_ms']:.1f} | {r['jit_ms']:.1f} | {r['pw_over_jit']:.2f} | {r['theory']:.3f} "
                       f"| {r['ideal_bubble']:.3f} | {r['measured_bubble']:.2f} | {r['live_ideal']} | {r['live_measured']} |")
            t.append({"name": f"pipeline {r['schedule']}: ideal-device bubble = paper's formula", "value": r["ideal_bubble"],
                      "limit": r["theory"], "below": True, "unit": "", "met": abs(r["ideal_bubble"] - r["theory"]) < 1e-9,
                      "note": ""})
        out.append("")
    return out, t


def timeline_table(tl: dict) -> tuple[list[str], list[dict]]:
    out = [
        f"#### Timeline widget redraw (timeline_redraw.py): {tl['events']:,} events, "
        f"Chromium {tl.get('chromium', '?')}",
        "",
        "| view | median ms | p95 ms | max ms |",
        "|---|---|---|---|",
    ]
    t = []
    for view, r in tl["redraw"].items():
        out.append(f"| {view} | {r['median_ms']:.1f} | {r['p95_ms']:.1f} | {r['max_ms']:.1f} |")
        if view in ("zoom", "pan"):
            t.append({"name": f"timeline: {view} redraw p95, {tl['events']:,} events", "value": r["p95_ms"], "limit": 50,
                      "below": True, "unit": " ms", "met": r["p95_ms"] < 50, "note": ""})
    out.append("")
    return out, t


def remote_table(rm: dict) -> tuple[list[str], list[dict]]:
    pn = rm["per_node_us"]
    lo, re_ = pn["local"], pn["remote"]
    ratio = re_["per_node_us"] / lo["per_node_us"]
    out = [
        "#### Remote islands on a local Ray cluster (remote.py)",
        "",
        "Chains of tiny nodes on one slice, chained mode: what each further node adds (the slope between "
        "a short and a long chain), the fixed cost of a run, and the whole long chain per node.",
        "",
        "| island | each further node | fixed per run | whole chain, per node |",
        "|---|---|---|---|",
    ]
    for name, c in (("local", lo), ("remote (Ray actor)", re_)):
        out.append(f"| {name} | {us(c['per_node_us'])} µs | {c['per_run_ms']:.2f} ms | {us(c['whole_chain_us'])} µs |")
    out += ["", f"Remote / local per further node: {ratio:.1f}x.", ""]
    targets = [{"name": "remote: per further node / local", "value": ratio, "limit": 5, "below": True, "unit": "x",
                "met": ratio <= 5, "note": ""}]
    bw = rm["bandwidth_gib_s"]
    sizes = list(next(iter(bw.values())))
    out.append("| transfer | " + " | ".join(f"{int(n) >> 20} MiB" for n in sizes) + " |")
    out.append("|---|" + "---|" * len(sizes))
    for name, row in bw.items():
        out.append(f"| {name} | " + " | ".join(f"{row[n]:.2f} GiB/s" for n in sizes) + " |")
    out.append("")
    return out, targets


def checkpoint_table(ck: dict) -> tuple[list[str], list[dict]]:
    out = [
        "#### Checkpoints against plain orbax (checkpoint.py)",
        "",
        "| state | save() blocks the caller (median) |",
        "|---|---|",
    ]
    out += [f"| {r['mb']:.0f} MB of futures | {r['blocked_ms']['median']:.2f} ms |" for r in ck["blocked"]]
    out += ["", "| state | save, pw | save, orbax | pw / orbax | restore, pw | restore, orbax | pw / orbax |",
            "|---|---|---|---|---|---|---|"]
    for t in ck["throughput"]:
        sv, rs = t["save"], t["restore"]
        out.append(f"| {t['mb']:.0f} MB | {sv['pw']:.0f} MB/s | {sv['orbax']:.0f} MB/s | {sv['ratio']:.2f}x | "
                   f"{rs['pw']:.0f} MB/s | {rs['orbax']:.0f} MB/s | {rs['ratio']:.2f}x |")
    lp = ck["loop"]
    out += ["", f"A {lp['steps']}-step loop saving {lp['mb_per_save']:.0f} MB every 5 steps runs at "
            f"{lp['ratio']:.3f}x the steps/s of the same loop without saves.", ""]
    return out, ck["targets"]


def input_table(inp: dict) -> tuple[list[str], list[dict]]:
    out = [
        "#### Input pipelines: pw.prefetch against batches placed beforehand (input.py)",
        "",
        "Each batch takes half a step to load (storage: a sleep; CPU: Python tokenizing, holding the GIL). "
        "async: the loop submits every step without waiting; logged: it reads each step's loss. "
        "inline: the loop loads each batch itself.",
        "",
        "| step | load | loop | placed (steps/s) | prefetch / placed | inline / placed |",
        "|---|---|---|---|---|---|",
    ]
    for label, rows in (("data-parallel", inp["data_parallel"]), ("pipelined", inp["pipelined"])):
        for r in rows:
            for style in ("async", "logged"):
                sps = r["steps_per_s"][f"placed/{style}"]
                out.append(f"| {label} | {r['load']} ({r['load_ms']:.0f} ms) | {style} | {sps:.1f} | "
                           f"{r[style]['prefetch']:.2f}x | {r[style]['inline']:.2f}x |")
    out.append("")
    return out, inp["targets"]
def memory_table(mm: dict) -> tuple[list[str], list[dict]]:
    out = [
        "#### Memory: the largest model admitted under a limit (memory.py)",
        "",
        f"Layers of width {mm['width']}, {mm['stages']} one-device stages, {mm['micro']} microbatches, adam, "
        f"{mm['limit_mb']:g} MiB per device. pw: resident state + the step's reservation (admission's figure); "
        f"plain JAX: XLA's memory analysis of the stage's donated jitted step.",
        "",
        "| | layers per stage | need on the fullest device | measured peak (fresh process) |",
        "|---|---|---|---|",
    ]
    for label, r in mm["rows"].items():
        m = r.get("measured") or {}
        peak = f"{m['peak_bytes'] / 2**20:.2f} MiB" if m.get("peak_bytes") is not None else "—"
        out.append(f"| {label} | {r['layers_per_stage']} | {r['need'] / 2**20:.2f} MiB | {peak} |")
    if "backend_reports_memory" in mm:
        out += ["", "Measured peak: " + ("each candidate's step once at its largest size, in a fresh process of its "
                                         "own: the device's `peak_bytes_in_use`." if mm["backend_reports_memory"] else
                                         "none, this backend reports no memory (`memory_stats()` is None)."), ""]
    else:  # a result from before the per-candidate measurement
        m = mm.get("measured")
        out += ["", "Measured peak: " + ("not reported by this backend." if not m else
                f"{m['peak_bytes'] / 2**20:.2f} MiB on {m['device']} (plan's estimate "
                f"{mm['rows']['pw']['need'] / 2**20:.2f} MiB)."), ""]
    return out, mm["targets"]


def tracing_table(tr: dict) -> tuple[list[str], list[dict]]:
    lp = tr["loops"]
    out = [
        "#### Tracing: a loop of K calls of one compiled step, and a cell run again (tracing.py)",
        "",
        "pw: a new `@pw.program` of the loop traced and planned; JAX: `jax.make_jaxpr` of a new loop function "
        "calling a `jax.jit` of the same step with the same shardings. Medians of interleaved rounds.",
        "",
        "| K | pw ms | make_jaxpr ms | pw/JAX | pw µs per step |",
        "|---|---|---|---|---|",
    ]
    for k, r in lp["rows"].items():
        out.append(f"| {k} | {r['pw_ms']:.2f} | {r['jax_ms']:.2f} | {r['ratio']:.2f}x | {r['pw_us_per_step']:.1f} |")
    cl = tr.get("cells") or {}
    if "skipped" in cl:
        out += ["", f"Cells: skipped: {cl['skipped']}", ""]
        return out, tr["targets"]
    out += [
        "",
        "`%%pathways` cells through IPython's `run_cell` (first: the cell's first run in the process; edited: its "
        "text changed, traced anew with JAX's caches warm; rerun: the same text again, its trace and plan reused). "
        "ms until the run was submitted (IPython, trace, plan) / ms of the whole `run_cell`.",
        "",
        "| cell | nodes | first | edited | rerun | rerun / first | rerun / edited |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in cl.items():
        if name == "note":
            continue
        cols = " | ".join(f"{r[m]['submitted_ms']:.2f} / {r[m]['cell_ms']:.1f}" for m in ("cold", "first", "rerun"))
        out.append(f"| {name}, {r['steps']} steps | {r['nodes']} | {cols} | {pct(r['ratio'])} | "
                   f"{pct(r['ratio_edited'])} |")
    out.append("")
    return out, tr["targets"]


def depth_table(dp: dict) -> tuple[list[str], list[dict]]:
    out = ["#### The scheduler at depth (depth.py)", "", "| runs queued | the pick alone (µs a call) |", "|---|---|"]
    out += [f"| {int(d):,} | {us:.1f} |" for d, us in dp["pick_us"].items()]
    depths = sorted({r["depth"] for r in dp["rows"]})
    out += ["", "| devices | tenants | " + " | ".join(f"{d:,} queued" for d in depths) + f" | {depths[-1]:,} / {depths[0]:,} |",
            "|---|---|" + "---|" * (len(depths) + 1)]
    for key in sorted({(r["devices"], r["tenants"]) for r in dp["rows"]}):
        by = {r["depth"]: r["nodes_per_s"] for r in dp["rows"] if (r["devices"], r["tenants"]) == key}
        out.append(f"| {key[0]} | {key[1]} | " + " | ".join(f"{by[d]:,.0f}" if d in by else "-" for d in depths)
                   + f" | {by[depths[-1]] / by[depths[0]]:.2f}x |")
    out += ["", "(nodes/s, medians of interleaved rounds)", ""]
    return out, dp["targets"]


def training_loop_table(tl: dict) -> tuple[list[str], list[dict]]:
    out = ["#### A user's training loop against plain JAX (training_loop.py)", "",
           "| variant | pw steps/s | JAX steps/s | pw / JAX | window (s) |", "|---|---|---|---|---|"]
    for r in tl["rows"]:
        out.append(f"| {r['variant']} | {r['steps_per_s']['pw']:.1f} | {r['steps_per_s']['jax']:.1f} | "
                   f"{r['ratio']:.2f}x | {r['window_s']:.1f} |")
    return out + [""], tl["targets"]


def service_table(sv: dict) -> tuple[list[str], list[dict]]:
    w = sv["waited_call"]["us"]
    k = sv["killed"]
    out = ["#### The Pathways service (service.py)", "",
           "| a waited 1-node call | µs |", "|---|---|",
           f"| through the service | {w['service']:,.0f} |", f"| on a local slice | {w['local']:,.0f} |",
           f"| a raw ZeroMQ round trip | {w['zmq']:,.0f} |", "",
           f"A SIGKILLed client: the other client's next call waited {k['wait_s'] * 1e3:.1f} ms (run-ahead bound "
           f"plus a node: {k['bound_s'] * 1e3:.1f} ms); its memory was back after {k['memory_back_s']:.2f} s.", ""]
    return out, sv["targets"]


def cluster_table(cl: dict) -> tuple[list[str], list[dict]]:
    a, b, c, d = cl["pipeline"], cl["transfer"], cl["call"], cl["kill"]
    lost = "none failed" if d["lost_s"] is None else f"{d['lost_s']:.2f} s"
    out = ["#### The service over a Ray cluster (cluster.py)", "",
           "| row | pw | competitor | ratio |", "|---|---|---|---|",
           (f"| 2-stage pipeline ({a['stage_ms_island']:.0f} ms stages), steps/s: two hosts / one host | "
            f"{a['steps_per_s']['two hosts']:.1f} | {a['steps_per_s']['one host']:.1f} | {a['ratio']:.2f}x |"),
           (f"| {b['mib']} MiB node to node, GiB/s: pw / raw Ray | {b['pw']['gib_s']:.2f} | "
            f"{b['ray']['gib_s']:.2f} | {b['ratio']:.2f}x |"),
           (f"| waited tiny call, µs: Ray node island / one-host service | {c['us']['ray node island']:,.0f} | "
            f"{c['us']['one-host service']:,.0f} | {c['ratio']:.2f}x |"), "",
           (f"A host killed: the next call on another node's island waited {d['wait_s'] * 1e3:.1f} ms "
            f"({d['extra_wait_s'] * 1e3:.1f} beyond idle; bound {d['bound_s'] * 1e3:.1f} ms); the lost client's "
            f"runs all failed after {lost}."), ""]
    return out, cl["targets"]


def long_run_table(lr: dict) -> tuple[list[str], list[dict]]:
    out = ["#### Long runs at real sizes (long_run.py)", ""]
    for layout in ("one", "data8"):
        lv = lr.get(f"leaves_{layout}")
        if not lv or "skipped" in lv:
            out += [f"leaves ({layout}): skipped: {lv['skipped']}", ""] if lv else []
            continue
        out += [f"| leaves ({layout}) | pw µs/step | jax.jit µs/step | pw / jit |", "|---|---|---|---|"]
        out += [f"| {r['leaves']} | {r['us']['pw']:,.1f} | {r['us']['jit']:,.1f} | {r['ratio']:.2f}x |" for r in lv["rows"]]
        out.append("")
    c, t, sv = lr.get("curve"), lr.get("transformer"), lr.get("service")
    if c:
        out += [f"Curve: {c['steps']:,} steps of the 30-leaf step, pw µs/step "
                + ", ".join(f"{p['us']:.0f}" for p in c["points"])
                + f" (every {c['every']:,} steps; jax.jit {c['jit_us']['start']:.0f} before, {c['jit_us']['end']:.0f} "
                f"after); RSS {c['points'][0]['rss_mib']:.0f} -> {c['points'][-1]['rss_mib']:.0f} MiB.", ""]
    if t:
        out += [f"transformer: skipped: {t['skipped']}" if "skipped" in t else
                f"Transformer ({t['layers']} layers, {t['leaves']} leaves): pw {t['ms']['pw']:.2f} ms/step, jax.jit "
                f"{t['ms']['jit']:.2f} ({t['ratio']:.2f}x); final losses {t['loss']['pw']:.4f} / {t['loss']['jit']:.4f}.",
                ""]
    if sv:
        med = {k: statistics.median(v) for k, v in sv.get("us", {}).items()}
        out += [f"service: skipped: {sv['skipped']}" if "skipped" in sv else
                f"Service: the 30-leaf step {med['service']:.0f} µs/step through it (first round "
                f"{sv['us']['service'][0]:.0f}, last {sv['us']['service'][-1]:.0f}), {med['local']:.0f} on the client's "
                f"own devices; service RSS {sv['rss_start']['service']:.0f} -> {sv['rss_end']['service']:.0f} MiB.", ""]
    return out, lr["targets"]


def targets_table(targets: list[dict]) -> list[str]:
    out = ["#### Targets", "", "| target | measured | limit | |", "|---|---|---|---|"]
    for t in targets:
        if t.get("limit") is None:
            out.append(f"| {t['name']} | {t['value']:.3g}{t['unit']} | — | {t.get('note', '')} |")
            continue
        rel = "≤" if t["below"] else "≥"
        mark = "met" if t["met"] else "**missed**"
        out.append(f"| {t['name']} | {t['value']:.3g}{t['unit']} | {rel} {t['limit']:g}{t['unit']} | {mark} |")
    out.append("")
    return out


def _device_notes(result: dict) -> list[str]:
    """The sentences a benchmark wrote where it asked for more devices than were present (what it measured instead)."""
    notes: list[str] = []

    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                if k in ("note", "notes") and x:
                    notes.extend([x] if isinstance(x, str) else x)
                elif k not in ("variants", "targets"):  # dispatch shows its all-reduce note itself; a target's note
                    walk(x)                                 # is about the target
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(result)
    notes = list(dict.fromkeys(notes))
    return [*(f"On this host: {n}." for n in notes), ""] if notes else []


def render(platform: str, results: Path, status: dict | None) -> str:
    loaded = {n: _load(results, n, platform) for n in
              ("dispatch", "interactive", "parity", "utilization", "profile_overhead", "multitenancy", "pipeline",
               "timeline_redraw", "remote", "checkpoint", "input", "memory", "tracing", "depth", "training_loop",
               "service", "cluster", "long_run")}
    first = next((v for v in loaded.values() if v and isinstance(v.get("machine"), dict)), None)
    lines = header(platform, status, first)
    lines.append("")
    targets: list[dict] = []
    body: list[str] = []
    tail: list[str] = []
    renderers = (
        ("dispatch", dispatch_tables, body), ("interactive", interactive_table, body),
        ("parity", parity_table, body), ("utilization", utilization_table, body),
        ("profile_overhead", lambda r: (profile_tables(r), []), tail), ("multitenancy", multitenancy_table, tail),
        ("pipeline", pipeline_table, tail), ("timeline_redraw", timeline_table, tail),
        ("remote", remote_table, tail), ("checkpoint", checkpoint_table, tail), ("input", input_table, tail),
        ("memory", memory_table, tail), ("tracing", tracing_table, tail), ("depth", depth_table, tail),
        ("training_loop", training_loop_table, tail), ("service", service_table, tail),
        ("cluster", cluster_table, tail),
        ("long_run", long_run_table, tail),
    )
    for name, fn, where in renderers:
        if not loaded[name]:
            continue
        if "skipped" in loaded[name]:  # the benchmark could not run here (an optional package is missing)
            where += [f"{name}: skipped: {loaded[name]['skipped']}", ""]
            continue
        try:
            md, t = fn(loaded[name])
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:  # an old or partial result file
            md, t = [f"{name}: results/{name}_{platform}.json could not be rendered ({type(e).__name__}: {e}).", ""], []
        where += md + _device_notes(loaded[name])
        targets += t
    return "\n".join(lines + body + targets_table(targets) + tail).rstrip() + "\n"


def update_readme(readme: Path, platform: str, md: str) -> None:
    """Put ``md`` between the markers of ``platform`` (added before the insertion marker if missing)."""
    text = readme.read_text() if readme.exists() else "# Benchmarks\n"
    begin, end = f"<!-- run_all:{platform}:begin -->", f"<!-- run_all:{platform}:end -->"
    block = f"{begin}\n<!-- generated by benchmarks/run_all.py: edits here are overwritten -->\n{md}{end}"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    elif "<!-- run_all:insert -->" in text:
        text = text.replace("<!-- run_all:insert -->", block + "\n\n<!-- run_all:insert -->")
    else:
        text = text.rstrip() + "\n\n## Latest results\n\n" + block + "\n"
    readme.write_text(text)

"""Static HTML for the widgets: what nbconvert, GitHub and a kernel-less notebook show.

Every renderer here consumes the same plain data the widgets sync as traits
(dicts, lists, numbers, strings), never runtime objects, so the live view and
the static picture cannot drift apart. Every user-provided string goes
through `esc`. Layout is inline-styled: some static viewers strip ``<style>``.
"""

from __future__ import annotations

import colorsys
import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..runtime import Future
from ..runtime.extend import describe_sharding

#: Distinct hues first (dark), then their light partners: 8 devices get 8 clearly different colours.
DEVICE_PALETTE: tuple[str, ...] = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)  # fmt: skip

#: Colours of runs (or programs, tenants) on the timeline; no pure red: red marks errors and DCN hops.
RUN_PALETTE: tuple[str, ...] = (
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948",
    "#ff9da7", "#9c755f", "#8cd17d", "#499894", "#d4a6c8", "#bab0ac",
)  # fmt: skip

#: Light fills for slices, in the program graph and the devices overview (black text stays readable).
SLICE_PALETTE: tuple[str, ...] = (
    "#8ecae6", "#ffb703", "#90be6d", "#f4a3c0", "#b8a1e3", "#f9844a", "#4cc9f0", "#d9d9d9",
)  # fmt: skip

#: A run's state as a colour: the badges and progress bars of every view.
STATE_COLOURS: dict[str, str] = {
    "queued": "#9e9e9e",
    "running": "#1e88e5",
    "done": "#43a047",
    "failed": "#e53935",
    "cancelled": "#fb8c00",
}

#: Transfers between islands (the paper's DCN hops), in the graph, the timelines and their legends.
CROSS_ISLAND = "#d62828"
FONT = "system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif"


def state_colour(state: str) -> str:
    """The colour of a run state (grey for one this palette does not know)."""
    return STATE_COLOURS.get(state, "#757575")


def percent_done(done: int, total: int, state: str) -> float:
    """How full a run's progress bar is: nodes done of total (a run with no nodes is full once done)."""
    if total == 0:
        return 100.0 if state == "done" else 0.0
    return 100.0 * done / total


def esc(x: Any) -> str:
    """HTML-escape ``str(x)``, quotes included: safe in text and in attribute values (every view's one escaper)."""
    return html.escape(str(x), quote=True)


def device_colour(k: int) -> str:
    """The colour of the k-th device of a view: the palette, then golden-angle hues."""
    if k < len(DEVICE_PALETTE):
        return DEVICE_PALETTE[k]
    h = (k * 0.618033988749895) % 1.0
    r, g, b = colorsys.hls_to_rgb(h, 0.62, 0.55)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def text_colour(bg: str) -> str:
    """Black or white, whichever reads better on ``bg`` (#rrggbb)."""
    r, g, b = (int(bg[i : i + 2], 16) / 255 for i in (1, 3, 5))
    lum = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "#111" if lum > 0.5 else "#fff"


def stripes(colours: Sequence[str]) -> str:
    """A CSS background: one colour, or diagonal stripes of several (a replicated shard)."""
    if len(colours) == 1:
        return colours[0]
    step = 8
    stops = []
    for k, c in enumerate(colours):
        stops.append(f"{c} {k * step}px {(k + 1) * step}px")
    return f"repeating-linear-gradient(135deg,{','.join(stops)})"


def page(body: str, cls: str) -> str:
    return (
        f'<div class="pw-static {cls}" style="font-family:{FONT};font-size:12px;line-height:1.35;'
        f'color:#222;max-width:100%;overflow-x:auto">{body}</div>'
    )


def fmt_bytes(n: float) -> str:
    """A size in binary units: ``512 B``, ``1.5 KiB``, ``3.0 MiB``, ``2.1 GiB``."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def fmt_ns(ns: float) -> str:
    """A duration: ``850 ns``, ``12.3 µs``, ``4.56 ms``, ``1.23 s``."""
    a = abs(ns)
    if a < 1e3:
        return f"{ns:.0f} ns"
    if a < 1e6:
        return f"{ns / 1e3:.3g} µs"
    if a < 1e9:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e9:.3g} s"


def nice_step(span: float, target: int) -> float:
    """A 1-2-5 step that cuts ``span`` into about ``target`` ticks."""
    raw = span / max(target, 1)
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


# --------------------------------------------------------------------- mesh
_CELL = "display:inline-block;box-sizing:border-box;border-radius:3px;text-align:center;overflow:hidden"


def _device_cell(dev: Mapping[str, Any], extra_title: str = "") -> str:
    bg = dev["colour"]
    title = f"{dev['label']}" + (f" · {dev['coords']}" if dev.get("coords") else "") + extra_title
    return (
        f'<div class="pw-mesh-cell" title="{esc(title)}" style="{_CELL};width:56px;height:36px;margin:2px;'
        f'background:{bg};color:{text_colour(bg)};padding-top:3px"><b>{esc(dev["id"])}</b>'
        f'<div style="font-size:9px;opacity:.85">{esc(dev["short"])}</div></div>'
    )


def mesh_facets_html(facets: Sequence[Mapping[str, Any]], devices: Mapping[str, Mapping[str, Any]]) -> str:
    out = []
    for f in facets:
        rows = []
        head = "".join(
            f'<th style="font-weight:500;color:#555;padding:0 2px;font-size:10px">{esc(c)}</th>'
            for c in f["col_labels"]
        )
        rows.append(f"<tr><th></th>{head}</tr>")
        grid: dict[tuple[int, int], int] = {(c["r"], c["c"]): c["device"] for c in f["cells"]}
        for r in range(f["rows"]):
            label = f["row_labels"][r] if f["row_labels"] else ""
            cells = "".join(
                f'<td style="padding:0">{_device_cell(devices[str(grid[(r, c)])]) if (r, c) in grid else ""}</td>'
                for c in range(f["cols"])
            )
            rows.append(
                f'<tr><th style="font-weight:500;color:#555;padding:0 4px;font-size:10px;text-align:right">'
                f"{esc(label)}</th>{cells}</tr>"
            )
        caption = f'<div style="color:#555;font-size:11px">{esc(f["label"])}</div>' if f["label"] else ""
        out.append(
            f'<div class="pw-mesh-facet" style="display:inline-block;vertical-align:top;margin:0 12px 8px 0">'
            f'{caption}<table style="border-collapse:collapse">{"".join(rows)}</table></div>'
        )
    return "".join(out)


def array_html(array: Mapping[str, Any], devices: Mapping[str, Mapping[str, Any]]) -> str:
    out = [
        f'<div style="margin:6px 0 2px"><b>{esc(array["name"])}</b>: <code>{esc(array["type"])}</code> · '
        f"<code>{esc(array['spec'])}</code> · {esc(array['summary'])}</div>"
    ]
    for f in array["facets"]:
        tiles = []
        for t in f["tiles"]:
            colours = [devices[str(d)]["colour"] for d in t["devices"]]
            fg = text_colour(colours[0])
            ids = ",".join(str(d) for d in t["devices"])
            rep = f" (replicated ×{len(t['devices'])})" if len(t["devices"]) > 1 else ""
            title = f"{array['name']}{t['index']} · shard {t['shard']} · device{'s' if rep else ''} {ids}{rep}"
            mark = f'<div style="font-size:9px">×{len(t["devices"])}</div>' if rep else ""
            tiles.append(
                f'<div class="pw-tile" title="{esc(title)}" style="position:absolute;box-sizing:border-box;'
                f"left:{t['x']}px;top:{t['y']}px;width:{t['w']}px;height:{t['h']}px;background:{stripes(colours)};"
                f"color:{fg};border:1px solid #fff;font-size:10px;display:flex;flex-direction:column;"
                f'align-items:center;justify-content:center;overflow:hidden">'
                f'<span style="background:rgba(255,255,255,.75);color:#111;border-radius:2px;padding:0 2px">'
                f"{esc(ids)}</span>{mark}</div>"
            )
        caption = f'<div style="color:#555;font-size:11px">{esc(f["label"])}</div>' if f["label"] else ""
        out.append(
            f'<div class="pw-array-facet" style="display:inline-block;vertical-align:top;margin:0 12px 8px 0">'
            f'{caption}<div style="position:relative;width:{f["width"]}px;height:{f["height"]}px">'
            f"{''.join(tiles)}</div></div>"
        )
    return "".join(out)


def devices_html(islands: Sequence[Mapping[str, Any]], slices: Sequence[Mapping[str, Any]], devices) -> str:
    out = []
    for isl in islands:
        cells = []
        for d in isl["devices"]:
            dev = devices[str(d)]
            chips = (
                "".join(
                    f'<div style="font-size:9px;border-radius:2px;margin:1px 2px;padding:0 2px;'
                    f'background:{s["colour"]};color:{text_colour(s["colour"])}">{esc(s["name"])}</div>'
                    for s in slices
                    if d in s["devices"]
                )
                or '<div style="font-size:9px;color:#999">free</div>'
            )
            cells.append(
                f'<div class="pw-mesh-cell" title="{esc(dev["label"])}" style="{_CELL};min-width:64px;margin:2px;'
                f'border:1px solid #bbb;background:#fafafa;vertical-align:top;padding:2px 0">'
                f'<b>{esc(d)}</b><div style="font-size:9px;color:#666">{esc(dev["short"])}</div>{chips}</div>'
            )
        out.append(
            f'<div style="margin:4px 0"><b>island {esc(isl["id"])}</b> '
            f'<span style="color:#666">({esc(isl["platform"])}, {len(isl["devices"])} devices)</span>'
            f"<div>{''.join(cells)}</div></div>"
        )
    if slices:
        rows = "".join(
            f'<tr><td><span style="display:inline-block;width:10px;height:10px;background:{s["colour"]}"></span> '
            f"<code>{esc(s['name'])}</code></td><td>{esc(s['mesh'])}</td><td>{esc(', '.join(map(str, s['devices'])))}"
            f"</td><td>{esc(s['island'])}</td></tr>"
            for s in slices
        )
        out.append(
            '<table style="border-collapse:collapse;margin-top:4px"><tr><th align=left>slice</th>'
            f"<th align=left>mesh</th><th align=left>devices</th><th align=left>island</th></tr>{rows}</table>"
        )
    return "".join(out)


def mesh_html(state: Mapping[str, Any]) -> str:
    """A MeshWidget's state as static HTML."""
    devices = state["devices"]
    body = [f'<div style="font-weight:600;margin-bottom:4px">{esc(state["title"])}</div>']
    if state["kind"] == "devices":
        body.append(devices_html(state["islands"], state["slices"], devices))
    else:
        if state["kind"] == "array":
            body.append('<div style="color:#555;font-size:11px">device mesh</div>')
        body.append(mesh_facets_html(state["mesh_facets"], devices))
        if state["kind"] == "array":
            body.append(array_html(state["array"], devices))
    return page("".join(body), "pw-mesh")


# ---------------------------------------------------------------------- run
def run_html(s: Mapping[str, Any]) -> str:
    """A RunWidget's state as static HTML."""
    state = s["state"]
    colour = state_colour(state)
    done, total = s["done"], s["total"]
    pct = percent_done(done, total, state)
    err = ""
    if s.get("error"):
        err = (
            '<div class="pw-run-error" style="white-space:pre-wrap;color:#b71c1c;background:#fff5f5;'
            f'border-left:3px solid #e53935;padding:4px 8px;margin:4px 0">{esc(s["error"])}</div>'
        )
    body = (
        f'<div><b>run {esc(s["run_id"])}</b> <code class="pw-run-name">{esc(s["name"])}</code> '
        f'<span style="background:{colour};color:#fff;border-radius:3px;padding:0 6px;font-weight:600">'
        f"{esc(state)}</span> "
        f'<span style="display:inline-block;width:140px;height:8px;background:#eee;border-radius:4px;'
        f'vertical-align:middle" title="{done}/{total}"><span style="display:block;height:8px;width:{pct:.0f}%;'
        f'background:{colour};border-radius:4px"></span></span> {done}/{total} nodes'
        f'{" · compiling " + esc(s["compiling"]) if s.get("compiling") else ""}'
        f'{" · " + esc(s["pace"]) if s.get("pace") else ""} · {s["elapsed"]:.3f} s'
        f" · mode {esc(s['mode'])} · tenant <code>{esc(s['tenant'])}</code></div>{err}"
    )
    rows = s.get("outputs") or []
    if rows:
        body += (
            '<table class="pw-run-outputs" style="border-collapse:collapse;margin-top:2px">'
            + "".join(
                f'<tr><td style="padding:0 8px 0 0"><code>{esc(r["name"])}</code></td>'
                f'<td style="padding:0 8px 0 0">{esc(r.get("kind", "Future"))} <code>{esc(r["type"])}</code></td>'
                f'<td style="color:#555">{esc(r["sharding"])}</td></tr>'
                for r in rows
            )
            + "</table>"
        )
    return page(body, "pw-run")


# ----------------------------------------------------------------- timeline
def describe_outputs(outputs: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """``{name: value or tuple of values}`` as rows of name, kind, type (``float32[8,8]``) and sharding.

    The kind is what the name is bound to: ``Future`` until ``--block`` binds the arrays.

    Example::

        describe_outputs({"y": fut})  # [{'name': 'y', 'kind': 'Future', 'type': 'float32[8]', 'sharding': ...}]
    """
    rows = []
    for name, value in (outputs or {}).items():
        leaves = value if isinstance(value, (list, tuple)) else [value]
        types, shardings, kinds = [], [], set()
        for f in leaves:
            if hasattr(f, "shape") and hasattr(f, "dtype"):
                types.append(f"{f.dtype.name}[{','.join(map(str, f.shape))}]")
                shardings.append(describe_sharding(getattr(f, "sharding", None)))
                kinds.add("Future" if isinstance(f, Future) else "Array")
        kind = kinds.pop() if len(kinds) == 1 else "Future" if kinds else ""
        rows.append({"name": str(name), "kind": kind, "type": _condensed(types, ", ", counted=True),
                     "sharding": _condensed(shardings, "; ", counted=False)})
    return rows


def _condensed(items: list[str], sep: str, counted: bool, most: int = 4) -> str:
    """Distinct ``items`` in order, joined: with their counts (``30 x float32[]``) if ``counted``; long lists cut short."""
    counts = dict.fromkeys(items, 0)
    for item in items:
        counts[item] += 1
    parts = [f"{n} x {item}" if counted and n > 1 else item for item, n in counts.items()]
    if len(parts) > most:
        parts = parts[:most] + [f"... ({len(items)} in all)"]
    return sep.join(parts)

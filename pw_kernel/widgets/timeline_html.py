"""The one static timeline renderer: the runtime's node events as SVG in HTML, for viewers without JavaScript.

Every static timeline is drawn here, from the columnar arrays an
`EventEncoder` makes of the runtime's events (`static_timeline` encodes them;
`TimelineWidget` hands over the arrays it already holds):

* the full picture (`timeline_html`): what nbconvert, GitHub and a
  kernel-less notebook show in place of `TimelineWidget`, and what the
  notebook's text views draw. It follows the rules the live view
  (``static/timeline.js``) follows: bars closer than a pixel merge (level of
  detail), back-to-back bars wide enough to see are cut by a 1px gap,
  compiles are hatched, transfers are light boxes or, merged, a strip, and
  every look drawn has a legend entry;
* a run's mini timeline (`mini_timeline_html`): a row per device, bars
  coloured by kind, a caption, row names and a time scale, as ``static/run.js``
  draws it live in `RunWidget`.

Every user-provided string goes through `esc`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ._html import CROSS_ISLAND, FONT, RUN_PALETTE, esc, fmt_ns, nice_step, page
from .timeline_encoder import KINDS, NONE, EventEncoder, busy_union

MAX_LEGEND = 12
#: Pixels a bar must span for a gap to cut it from the next bar of its colour (timeline.js's GAP_MIN).
GAP_MIN = 4
#: Compile bars (host lane): a diagonal hatch, as in timeline.js; grey where a viewer drops SVG patterns.
HATCH = ("#8a8a8a", "#e4e4e4")
HATCH_CSS = f"repeating-linear-gradient(135deg,{HATCH[0]} 0 1.5px,{HATCH[1]} 1.5px 4px)"
#: Transfers closer together than a pixel, merged into a strip: (intra-island, cross-island) fill.
MERGED = ("#8c8c8c", "#e07a7a")
LABEL_W, UTIL_W, AXIS_H = 120, 46, 18  # pixels: lane labels, utilization column, time axis
_TRANSFER = KINDS.index("transfer")
_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))
#: The latest events a picture drawn from the runtime's events shows (a static picture: plenty).
MAX_EVENTS = 20_000
#: The mini timeline's bar kinds (on device rows: `KINDS` 0, 1, 2) as (name, colour); run.js's KIND.
MINI_KINDS: tuple[tuple[str, str], ...] = (("compute", "#4e79a7"), ("glue", "#a0cbe8"), ("transfer", "#bbbbbb"))
MINI_H = 80  # px the mini timeline's rows share at most
MINI_LABEL_W = 84  # px of the mini timeline's row names
LABEL_MIN = 8  # px a mini-timeline row needs for its own name; thinner rows name only the first and last device


def static_timeline(
    events: Iterable[Any],
    *,
    title: str = "timeline",
    runs: Iterable[Any] = (),
    devices: Iterable[tuple[int, str, int | None]] = (),
    names: Mapping[int, str] | None = None,
    mini: bool = False,
    width: int | None = None,
    color_by: str = "run",
) -> str:
    """The runtime's node events (`NodeEvent`) as a static timeline: the full picture, or with ``mini`` a run's.

    ``runs`` (`Run` s) name the colour keys; ``devices`` (id, label, island) are rows drawn even when idle, in
    order; ``names`` labels the other devices (device id -> name). Draws the latest `MAX_EVENTS` events.

    Example::

        static_timeline(run.events, title=f"run {run.id}", runs=[run])   # lanes, bars, axis, legend
        static_timeline(run.events, mini=True)                           # "" when nothing ran on a device
    """
    enc = EventEncoder(devices, dict(names or {}))
    enc.encode(list(events)[-MAX_EVENTS:])
    measures, ids, bars, strings = enc.arrays()
    if mini:
        return mini_timeline_html(enc.lanes, measures, ids, bars, width or 560)
    rows = _run_rows(runs, ids, strings)
    return timeline_html(title, enc.lanes, rows, RUN_PALETTE, color_by, measures, ids, bars, strings, width or 760)


def _run_rows(runs: Iterable[Any], ids: np.ndarray, strings: Sequence[str]) -> list[dict[str, Any]]:
    """The colour keys of a picture by run: ``runs`` first, then runs only the events name (state unknown)."""
    rows = {
        int(r.id): {"id": int(r.id), "name": str(r.name), "tenant": str(r.tenant), "state": str(r.state)} for r in runs
    }
    for run, prog, tenant in ids[:, [0, 2, 3]].tolist():
        if run != NONE and run not in rows:  # NONE: host work of no run (a checkpoint)
            name = strings[prog] if prog != NONE else ""
            rows[run] = {"id": run, "name": name, "tenant": strings[tenant] if tenant != NONE else "", "state": "?"}
    return list(rows.values())


def lane_order(lanes: list[dict[str, Any]]) -> list[int]:
    """The rows' order (timeline.js's too): each device, its XLA ops beneath it (a profile's), then the rest."""
    ops = {x["device"]: k for k, x in enumerate(lanes) if x["kind"] == "ops"}
    order = []
    for k, x in enumerate(lanes):
        if x["kind"] == "device":
            order.append(k)
            if x["device"] in ops:
                order.append(ops[x["device"]])
    return order + [k for k, x in enumerate(lanes) if x["kind"] not in ("device", "ops")]


def timeline_html(
    title: str,
    lanes: Sequence[dict[str, Any]],
    runs: Sequence[dict[str, Any]],
    palette: Sequence[str],
    color_by: str,
    measures: np.ndarray,
    ids: np.ndarray,
    bars: np.ndarray,
    strings: Sequence[str],
    width: int = 760,
    live: bool = False,
) -> str:
    """A static SVG timeline: lanes, bars, axis, a legend for every colour and pattern drawn.

    Bars narrower than a few pixels merge with neighbours of their colour (level of detail); wider ones
    that run back to back are cut by a 1px gap, so six chained layers read as six bars.

    Example::

        measures, ids, bars, strings = encoder.arrays()
        timeline_html("timeline", encoder.lanes, runs, RUN_PALETTE, "run", measures, ids, bars, strings)
    """
    n = len(measures)
    n_dev = sum(1 for x in lanes if x["kind"] == "device")
    head = (
        f'<div style="margin-bottom:2px"><b>{esc(title)}</b> · {n} events · {len(runs)} runs · '
        f"{n_dev} devices{' · live (static snapshot)' if live else ''}</div>"
    )
    if n == 0:
        return page(head + '<div style="color:#666">no node events yet</div>', "pw-timeline")
    order = lane_order(lanes)
    plot = _plot(measures, ids, runs, strings, palette, color_by, width)
    merged: set[bool] = set()  # merged-transfer strips drawn: False intra-island, True cross-island
    parts = []
    y = AXIS_H
    for lane in order:
        svg, h = _lane_svg(plot, lanes[lane], lane, y, measures, bars, merged)
        parts.append(svg)
        y += h
    has_host = any(x["kind"] == "host" for x in lanes)
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 4}" '
        f'style="font:10px {FONT}">{_hatch_defs() if has_host else ""}{_ticks_svg(plot.span, plot.plot_w)}'
        f"{''.join(parts)}</svg>"
    )
    entries = _legend_entries(color_by, runs, ids, strings, palette)
    legend = _legend_html(entries[-MAX_LEGEND:], max(0, len(entries) - MAX_LEGEND), host=has_host, merged=merged)
    return page(head + legend + svg, "pw-timeline")


class _Plot(NamedTuple):
    """What every lane of one picture is drawn with: the time span in pixels, and each event's colour key."""

    span: float
    width: int
    plot_w: int
    px0: np.ndarray  # per event, its first pixel
    px1: np.ndarray  # per event, one past its last pixel (at least one pixel wide)
    keys: np.ndarray  # per event, its colour key's index
    kind: np.ndarray  # per event, its kind's index in KINDS
    palette: Sequence[str]


def _plot(
    measures: np.ndarray,
    ids: np.ndarray,
    runs: Sequence[dict[str, Any]],
    strings: Sequence[str],
    palette: Sequence[str],
    color_by: str,
    width: int,
) -> _Plot:
    t0 = float(measures[:, 0].min())
    t1 = float(measures[:, 1].max())
    span = max(t1 - t0, 1.0)
    plot_w = width - LABEL_W - UTIL_W
    px0 = np.floor((measures[:, 0] - t0) / span * plot_w).astype(np.int64)
    px1 = np.maximum(np.ceil((measures[:, 1] - t0) / span * plot_w).astype(np.int64), px0 + 1)
    keys = _colour_keys(color_by, ids, runs, strings)
    return _Plot(span, width, plot_w, px0, px1, keys, ids[:, 6], palette)


def _ticks_svg(span: float, plot_w: int) -> str:
    """The time axis: ticks at whole multiples of a round step from the first event's start."""
    step = nice_step(span, 6)
    values = [k * step for k in range(int(span / step + 1e-9) + 1)]  # multiples of the step: no drift
    ticks = []
    for v, label in zip(values, axis_labels(values, step)):
        x = LABEL_W + v / span * plot_w
        ticks.append(
            f'<line x1="{x:.1f}" y1="{AXIS_H - 4}" x2="{x:.1f}" y2="{AXIS_H}" stroke="#888"/>'
            f'<text x="{x:.1f}" y="{AXIS_H - 6}" text-anchor="middle" fill="#555">{esc(label)}</text>'
        )
    return "".join(ticks)


def _lane_svg(
    plot: _Plot, info: dict[str, Any], lane: int, y: int, measures: np.ndarray, bars: np.ndarray, merged: set[bool]
) -> tuple[str, int]:
    """One lane's label, background, bars and utilization, and its height; notes merged-transfer strips drawn."""
    h = 16 if info["kind"] == "device" else 12  # (an ops lane: as thin as a transfer path's)
    ev = bars[bars[:, 1] == lane, 0].astype(np.int64)
    util = busy_union(measures, bars, lane) / plot.span
    parts = [
        (
            f'<text x="{LABEL_W - 4}" y="{y + h - 4}" text-anchor="end" fill="#333">{esc(info["label"])}</text>'
            f'<rect x="{LABEL_W}" y="{y}" width="{plot.plot_w}" height="{h - 2}" fill="#f4f4f4"/>'
            f'<text x="{plot.width - 2}" y="{y + h - 4}" text-anchor="end" fill="#333">{util * 100:.0f}%</text>'
        )
    ]
    if not len(ev):
        return "".join(parts), h
    # colour keys: >= 0 the palette; -2 a transfer, -3 a cross-island transfer, -4 a compile (host lane).
    # On a device lane transfers are drawn low, under the compute bars, as the live view draws them.
    strips = []  # (bars, their colour keys, y, height)
    if info["kind"] == "device":
        xfer = plot.kind[ev] == _TRANSFER
        strips.append((ev[~xfer], plot.keys[ev[~xfer]], y + 1, h - 4))
        strips.append((ev[xfer], np.full(int(xfer.sum()), -2), y + h // 2 + 1, h - h // 2 - 3))
    elif info["kind"] == "ops":  # a node's ops, in its run's (program's, tenant's) colour
        strips.append((ev, plot.keys[ev], y + 1, h - 4))
    else:
        look = -4 if info["kind"] == "host" else -3 if info["cross"] else -2
        strips.append((ev, np.full(len(ev), look), y + 1, h - 4))
    for sev, colour, sy, sh in strips:
        for c, a, w, k in _lane_rects(colour, sev, plot.px0, plot.px1, plot.plot_w) if len(sev) else ():
            parts.append(_rect_svg(c, k, LABEL_W + a, sy, w, sh, plot.palette, merged))
    return "".join(parts), h


def _rect_svg(c: int, k: int, x: int, y: int, w: int, h: int, palette: Sequence[str], merged: set[bool]) -> str:
    """One rect of colour key ``c`` holding ``k`` bars: a palette colour, the compile hatch, or a transfer's look."""
    if c >= 0:
        fill, stroke = palette[c % len(palette)], ""
    elif c == -4:
        fill, stroke = f"url(#pw-tl-hatch) {HATCH[1]}", ' stroke="#666" stroke-width="1"'
    elif k > 1:  # transfers closer than a pixel: a strip, as the live view draws them
        fill, stroke = MERGED[c == -3], ""
        merged.add(c == -3)
    else:
        fill = "#e9e9e9"
        stroke = f' stroke="{CROSS_ISLAND if c == -3 else "#555"}" stroke-width="1"'
    return f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{fill}"{stroke}/>'


def _hatch_defs() -> str:
    """The SVG pattern compile bars are filled with."""
    return (
        '<defs><pattern id="pw-tl-hatch" patternUnits="userSpaceOnUse" width="6" height="6">'
        f'<rect width="6" height="6" fill="{HATCH[1]}"/><path d="M-1,1 l2,-2 M0,6 l6,-6 M5,7 l2,-2" '
        f'stroke="{HATCH[0]}" stroke-width="1.5"/></pattern></defs>'
    )


def _legend_entries(
    color_by: str, runs: Sequence[dict[str, Any]], ids: np.ndarray, strings: Sequence[str], palette: Sequence[str]
) -> list[tuple[str, str]]:
    """(colour, label) of each colour key, in the order the keys first appear."""
    if color_by == "run":
        return [(palette[k % len(palette)], f"run {r['id']} {r['name']} ({r['state']})") for k, r in enumerate(runs)]
    col = 2 if color_by == "program" else 3
    seen = list(dict.fromkeys(int(x) for x in ids[:, col]))
    return [(palette[k % len(palette)], strings[s] if s != NONE else "?") for k, s in enumerate(seen)]


def _colour_keys(color_by: str, ids: np.ndarray, runs: Sequence[dict[str, Any]], strings: Sequence[str]) -> np.ndarray:
    """Per event, the index of its colour key (run, program or tenant) in order of first appearance."""
    if color_by == "run":
        order = {r["id"]: k for k, r in enumerate(runs)}
        return np.fromiter((order.get(int(x), 0) for x in ids[:, 0]), dtype=np.int64, count=len(ids))
    col = 2 if color_by == "program" else 3
    _, first, inverse = np.unique(ids[:, col], return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))
    return rank[inverse]


def _lane_rects(
    colour: np.ndarray, ev: np.ndarray, px0: np.ndarray, px1: np.ndarray, plot_w: int
) -> list[tuple[int, int, int, int]]:
    """One lane's rects, (colour key, x, width, bars in it) in plot pixels, for bars ``ev`` coloured ``colour``.

    Later-starting bars paint over earlier ones; runs of one colour merge into one rect, except where a bar
    at least `GAP_MIN` px wide ends and the next such bar starts: there the earlier rect ends a pixel early.
    """
    n = plot_w + 1
    cover = np.full(n, -1, dtype=np.int64)
    owner = np.full(n, -1, dtype=np.int64)
    o = np.argsort(px0[ev], kind="stable")[-20000:]  # a static picture: the latest 20k bars per lane are plenty
    for e, c in zip(ev[o].tolist(), colour[o].tolist()):
        cover[px0[e] : px1[e]] = c
        owner[px0[e] : px1[e]] = e
    change = np.flatnonzero((np.diff(cover) != 0) | (np.diff(owner) != 0)) + 1
    bounds = np.concatenate(([0], change, [n])).tolist()
    rects: list[tuple[int, int, int, int]] = []
    cur: list[int] | None = None  # colour, start, end, owner of the last piece, bars merged
    for a, b in itertools.pairwise(bounds):
        c, e = int(cover[a]), int(owner[a])
        if cur is not None and c == cur[0] and a == cur[2] and c != -1:
            prev = cur[3]
            # bar e starts here and the previous bar ends here (ceil/floor: within a pixel): back to back
            abut = a == px0[e] and px1[prev] <= a + 1 and e != prev
            if abut and cur[2] - cur[1] >= GAP_MIN and px1[e] - px0[e] >= GAP_MIN:
                rects.append((cur[0], cur[1], cur[2] - 1, cur[4]))
                cur = [c, a, b, e, 1]
            else:
                cur[2], cur[3], cur[4] = b, e, cur[4] + (e != prev)
            continue
        if cur is not None and cur[0] != -1:
            rects.append((cur[0], cur[1], cur[2], cur[4]))
        cur = [c, a, b, e, 1]
    if cur is not None and cur[0] != -1:
        rects.append((cur[0], cur[1], cur[2], cur[4]))
    return [(c, a, min(b, plot_w) - a, k) for c, a, b, k in rects if a < plot_w and min(b, plot_w) > a]


def _legend_html(entries: Sequence[tuple[str, str]], more: int, host: bool, merged: set[bool]) -> str:
    """The static legend: the colour keys, then the looks that are not colour keys (compile, transfers)."""

    def item(swatch: str, label: str) -> str:
        return (
            f'<span style="margin-right:10px;white-space:nowrap"><span style="display:inline-block;width:10px;'
            f'height:10px;border-radius:2px;vertical-align:middle;{swatch}"></span> {esc(label)}</span>'
        )

    items = [item(f"background:{c}", label) for c, label in entries]
    if more:
        items.append(f'<span style="color:#666;margin-right:10px">+{more} more</span>')
    if host:  # compiles are drawn on the host lane
        items.append(item(f"background:{HATCH_CSS};border:1px solid #666", "host: compile, checkpoint, input load"))
    items.append(item("background:#e9e9e9;border:1.5px solid #555", "transfer"))
    items.append(item(f"background:#e9e9e9;border:1.5px solid {CROSS_ISLAND}", "cross-island transfer"))
    if False in merged:
        items.append(item(f"background:{MERGED[False]}", "transfers merged at this scale"))
    if True in merged:
        items.append(item(f"background:{MERGED[True]}", "cross-island transfers merged"))
    return f'<div class="pw-legend" style="margin:2px 0 4px">{"".join(items)}</div>'


def mini_lane_height(n: int) -> int:
    """Pixel height of a mini-timeline row when there are ``n`` device rows (run.js's laneHeight)."""
    return max(3, min(10, MINI_H // max(n, 1)))


def mini_timeline_html(
    lanes: Sequence[dict[str, Any]], measures: np.ndarray, ids: np.ndarray, bars: np.ndarray, width: int = 560
) -> str:
    """A run's mini timeline from an `EventEncoder`'s arrays: its device lanes only; "" when they hold no bar.

    A caption with the colour key of the kinds drawn, a name per row (the first and last only when rows
    are thin) and a time scale from the first node's start, as run.js draws it live.

    Example::

        static_timeline(run.events, mini=True)   # caption, 'cpu:0', bars, '0 ns' ... '2.1 ms'
    """
    rows = [k for k, x in enumerate(lanes) if x["kind"] == "device"]
    on = np.isin(bars[:, 1], rows) if len(bars) else np.zeros(0, dtype=bool)
    if not rows or not on.any():
        return ""
    bars = bars[on]
    drawn = bars[:, 0].astype(np.int64)
    t0 = float(measures[drawn, 0].min())
    end = max(float(measures[drawn, 1].max()) - t0, 1.0)
    plot_w = width - MINI_LABEL_W
    px0 = np.floor((measures[:, 0] - t0) / end * plot_w).astype(np.int64)
    px1 = np.maximum(np.ceil((measures[:, 1] - t0) / end * plot_w).astype(np.int64), px0 + 1)
    kind = np.minimum(ids[:, 6].astype(np.int64), len(MINI_KINDS) - 1)  # device rows hold compute, glue, transfer
    lane_h = mini_lane_height(len(rows))
    height = len(rows) * lane_h
    gap = 1 if lane_h > 2 else 0
    parts = [f'<rect x="{MINI_LABEL_W}" y="0" width="{plot_w}" height="{height}" fill="#f2f2f2"/>']
    for r, lane in enumerate(rows):
        ev = bars[bars[:, 1] == lane, 0].astype(np.int64)
        for c, a, w, _ in _lane_rects(kind[ev], ev, px0, px1, plot_w) if len(ev) else ():
            parts.append(
                f'<rect x="{MINI_LABEL_W + a}" y="{r * lane_h}" width="{w}" height="{lane_h - gap}" '
                f'fill="{MINI_KINDS[c][1]}"/>'
            )
    named = range(len(rows)) if lane_h >= LABEL_MIN else sorted({0, len(rows) - 1})
    for k in named:
        y = (k + 1) * lane_h - 1 if lane_h >= LABEL_MIN else (8 if k == 0 else height)
        parts.append(
            f'<text class="pw-run-mini-label" x="{MINI_LABEL_W - 4}" y="{y}" text-anchor="end" fill="#555">'
            f'{esc(lanes[rows[k]]["label"])}</text>'
        )
    parts.append(
        f'<text class="pw-run-mini-scale" x="{MINI_LABEL_W}" y="{height + 10}" fill="#555">0 ns</text>'
        f'<text class="pw-run-mini-scale" x="{width}" y="{height + 10}" text-anchor="end" fill="#555">'
        f"{esc(fmt_ns(end))}</text>"
    )
    keys = "".join(
        f'<span style="margin-left:8px;white-space:nowrap"><span style="display:inline-block;width:10px;height:10px;'
        f'border-radius:2px;vertical-align:middle;background:{MINI_KINDS[k][1]}"></span> {MINI_KINDS[k][0]}</span>'
        for k in sorted(set(kind[drawn].tolist()))
    )
    caption = (
        '<div class="pw-run-mini-caption" style="color:#555;font-size:10px">'
        f"this run&#x27;s nodes on each device over time:{keys}</div>"
    )
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 12}" '
        f'style="font:9px {FONT};display:block">{"".join(parts)}</svg>'
    )
    return page(caption + svg, "pw-run-mini")


def axis_labels(values: Sequence[float], step: float) -> list[str]:
    """Time-axis tick labels for ticks ``step`` ns apart: one unit, as many decimals as ``step`` needs.

    Neighbouring labels always differ, also zoomed far in, and the origin reads ``0 ns``
    (timeline.js's ``axisLabels`` is the same rule).

    Example::

        axis_labels([0, 5e5, 1e6], 5e5)                     # ['0 ns', '0.5 ms', '1.0 ms']
        axis_labels([14_100_100, 14_100_200], 100)          # ['14.1001 ms', '14.1002 ms']
    """
    big = max([step, *(abs(v) for v in values)])
    scale, unit = next(((sc, u) for sc, u in _UNITS if big >= sc), _UNITS[-1])
    dec = min(20, max(0, math.ceil(-math.log10(step / scale) - 1e-9)))
    return ["0 ns" if v == 0 else f"{v / scale:.{dec}f} {unit}" for v in values]


__all__ = [
    "GAP_MIN",
    "HATCH",
    "HATCH_CSS",
    "MERGED",
    "MINI_KINDS",
    "axis_labels",
    "mini_lane_height",
    "mini_timeline_html",
    "static_timeline",
    "timeline_html",
]

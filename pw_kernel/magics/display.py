"""Static rich displays of runs, graphs, timelines, status and devices (HTML with a text fallback).

Built only from the runtime's public objects (Run, ProgramGraph, NodeEvent,
Status, Island, VirtualSlice). Each piece is a small function returning a
`View`, so the widgets can replace them one by one. Colours, escaping and the
program graph's picture come from the widgets' static side (`widgets._html`,
`widgets.graph`, neither needs anywidget): every user-provided string goes
through its `esc`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..runtime import controller, short_error
from ..widgets._html import CROSS_ISLAND, RUN_PALETTE, describe_outputs, esc, percent_done, state_colour
from ..widgets.graph import graph_html

MAX_TABLE_ROWS = 200
MAX_TIMELINE_EVENTS = 5000

_CSS = (
    "<style>.pw-view{font-family:system-ui,-apple-system,Segoe UI,Helvetica,sans-serif;font-size:12px;"
    "line-height:1.4}.pw-view table{border-collapse:collapse;margin:4px 0}.pw-view th,.pw-view td{padding:2px 8px;"
    "border-bottom:1px solid #e0e0e0;text-align:left;vertical-align:top}.pw-view th{font-weight:600}"
    ".pw-view code{font-size:11px}.pw-badge{color:#fff;border-radius:3px;padding:0 6px;font-weight:600}"
    ".pw-bar{display:inline-block;width:120px;height:8px;background:#eee;border-radius:4px;vertical-align:middle}"
    ".pw-bar>span{display:block;height:8px;border-radius:4px}.pw-err{white-space:pre-wrap;color:#b71c1c;"
    "background:#fff5f5;border-left:3px solid #e53935;padding:4px 8px;margin:4px 0}</style>"
)


class View:
    """A display: ``_repr_html_`` in notebooks, ``__repr__`` (plain text) everywhere else."""

    def __init__(self, text: str, html_: str):
        self.text = text
        self.html = html_

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return self.html


class WithText:
    """A widget shown with a view's text: notebooks render the widget, plain-text readers the text."""

    def __init__(self, widget: Any, view: View):
        self.widget = widget
        self.view = view

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if bundle is None:  # the widget was closed: the view is all there is
            return {"text/plain": repr(self.view), "text/html": self.view._repr_html_()}, {}
        data, metadata = bundle
        return {**data, "text/plain": repr(self.view)}, metadata

    def __repr__(self) -> str:
        return repr(self.view)


def _page(body: str) -> str:
    return f'{_CSS}<div class="pw-view">{body}</div>'


def _badge(state: str, text: str | None = None) -> str:
    """A state in its colour; ``text``: what to write instead ('cancelling: 2 nodes on the devices')."""
    return f'<span class="pw-badge" style="background:{state_colour(state)}">{esc(text or state)}</span>'


def _bar(done: int, total: int, state: str) -> str:
    pct = percent_done(done, total, state)
    colour = state_colour(state)
    fill = f'<span style="width:{pct:.0f}%;background:{colour}"></span>'
    return f'<span class="pw-bar" title="{done}/{total}">{fill}</span>'


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Rows are already-escaped HTML cells."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


_FRAME = re.compile(r'^(\s*)File "([^"]+)", line (\d+), in (.+)$')


def condense_frames(
    text: str, keep: Callable[[str], bool], label: Callable[[str], str | None] = lambda filename: None
) -> str:
    """Drop the frames of quoted tracebacks (``File "...", line N, in f``) whose file ``keep`` rejects.

    Errors raised on a device (e.g. in a `jax.pure_callback`) quote the whole host
    traceback in their message; the user's own frames are what they can act on.
    ``label`` renames files (a cell's temporary file -> ``Cell In[N]``).
    """
    out: list[str] = []
    hidden = 0
    dropping_indent: int | None = None
    for line in text.splitlines():
        m = _FRAME.match(line)
        if m is None and dropping_indent is not None and len(line) - len(line.lstrip()) > dropping_indent:
            continue  # the source line (and ^^^ markers) of a dropped frame
        dropping_indent = None
        if m is not None:
            indent, filename, lineno, func = m.groups()
            if not keep(filename):
                hidden += 1
                dropping_indent = len(indent)
                continue
            name = label(filename)
            if name is not None:
                line = f"{indent}{name}, line {lineno}, in {func}"
        out.append(line)
    text = "\n".join(out)
    if hidden:
        note = f"Traceback ({hidden} frames of Python, JAX and pw_kernel hidden; most recent call last):"
        text = text.replace("Traceback (most recent call last):", note)
    return text


def error_headline(text: str) -> str:
    """The first line of an error, with a quoted traceback's own last line (its exception) as the cause.

    Example::

        error_headline("NodeError: node 'f' failed: a host callback raised: Traceback (...):\n  ...\nValueError: x")
        # "NodeError: node 'f' failed: ValueError: x"
    """
    lines = text.splitlines()
    head = lines[0] if lines else ""
    cause = next((line for line in reversed(lines[1:]) if line and not line[0].isspace()), None)
    m = re.match(r"(.*?failed: )(?:a host callback raised: )?Traceback \(", head)
    if m is not None and cause is not None:
        return m.group(1) + cause
    return head


# ---------------------------------------------------------------------- runs
def progress_line(run) -> str:
    """One line of progress for a terminal: ``run 3 'In[5]' running 4/10 nodes, 2.3 s, compiling 'step'``."""
    done, total = run.progress
    line = f"pw_kernel: run {run.id} {run.name!r} {run.state} {done}/{total} nodes, {run.elapsed:.1f} s"
    return f"{line}, compiling {run.compiling!r}" if run.compiling else line


def run_view(
    run, outputs: dict[str, Any] | None = None, timeline: bool = True, condense: Callable[[str], str] = str
) -> View:
    """A run's state, progress, elapsed time, outputs, error and a mini timeline.

    ``outputs`` maps the names a cell bound to the run's futures; ``condense``
    shortens error text (see `condense_frames`).
    """
    error = None if run.error is None else condense(f"{type(run.error).__name__}: {run.error}")
    done, total = run.progress
    outputs = outputs or {}
    outs = [(r["name"], f'{r["kind"]} {r["type"]} {r["sharding"]}') for r in describe_outputs(outputs)]
    activity = f" (compiling {run.compiling!r})" if run.compiling else ""
    head = (
        f"run {run.id} {run.name!r}: {run.state}{activity}, {done}/{total} nodes, {run.elapsed:.3f} s, "
        f"mode={run.mode}, tenant={run.tenant!r}"
    )
    lines = [head]
    lines += [f"  {name} = {desc}" for name, desc in outs]
    if run.error is not None and run.state != "cancelled":
        lines.append("  error: " + short_error(error).replace("\n", "\n  "))
    text = "\n".join(lines)

    parts = [
        f"<div><b>run {run.id}</b> <code>{esc(run.name)}</code> {_badge(run.state)}{esc(activity)} "
        f"{_bar(done, total, run.state)} "
        f"{done}/{total} nodes · {run.elapsed:.3f} s · mode {esc(run.mode)} · "
        f"tenant <code>{esc(run.tenant)}</code></div>"
    ]
    if outs:
        parts.append(_table(["output", "bound to, sharding"], [(f"<code>{esc(n)}</code>", esc(d)) for n, d in outs]))
    if run.error is not None and run.state != "cancelled":
        parts.append(f'<div class="pw-err">{esc(short_error(error, 40))}</div>')
    if timeline and run.events:
        parts.append(timeline_svg(run.events, height_per_lane=8))
    return View(text, _page("".join(parts)))


def failure_view(run, condense: Callable[[str], str] = str) -> View:
    """The report of a run that failed while the user was elsewhere (shown once, after the next cell)."""
    err = short_error(condense(f"{type(run.error).__name__}: {run.error}"), 20)
    futs = "its futures raise this error too"
    text = (
        f"pw_kernel: run {run.id} {run.name!r} failed after the cell that submitted it had returned "
        f"({futs}).\n{err}"
    )
    body = (
        f'<div class="pw-err"><b>pw_kernel: run {run.id} <code>{esc(run.name)}</code> failed</b> after the cell '
        f"that submitted it had returned ({esc(futs)}).\n{esc(err)}</div>"
    )
    return View(text, _page(body))


def message_view(text: str) -> View:
    return View(text, _page(f"<div>{esc(text)}</div>"))


# --------------------------------------------------------------------- graph
def graph_view(graph) -> View:
    """The program's dataflow graph: summary and SVG via graphviz ``dot``, else the install hint and DOT source.

    The same picture the graph shows of itself in a notebook (`ProgramGraph._repr_html_`).
    """
    return View(repr(graph), graph_html(graph))


# ------------------------------------------------------------------ timeline
def timeline_svg(events: Iterable[Any], height_per_lane: int = 14, width: int = 720) -> str:
    """A lane per device, a bar per node (colour per run, transfers outlined); hover shows details."""
    events = list(events)[-MAX_TIMELINE_EVENTS:]
    if not events:
        return ""
    devices = sorted({d for ev in events for d in ev.devices})
    lane = {d: k for k, d in enumerate(devices)}
    t0 = min(ev.start for ev in events)
    t1 = max(ev.end for ev in events)
    span = max(t1 - t0, 1)
    label_w = 48
    plot_w = width - label_w
    h = height_per_lane
    total_h = h * len(devices) + 14
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_h}" style="font:10px sans-serif">']
    for d, k in lane.items():
        out.append(f'<text x="0" y="{k * h + h - 2}">dev {d}</text>')
        out.append(f'<rect x="{label_w}" y="{k * h}" width="{plot_w}" height="{h - 1}" fill="#f5f5f5"/>')
    for ev in events:
        x = label_w + (ev.start - t0) / span * plot_w
        w = max((ev.end - ev.start) / span * plot_w, 1.0)
        colour = RUN_PALETTE[ev.run_id % len(RUN_PALETTE)]
        cross = ev.kind == "transfer" and ev.src_island is not None and ev.src_island != ev.island
        if cross:  # the paper's DCN hop between islands
            stroke = f' stroke="{CROSS_ISLAND}" stroke-width="1.5"'
        else:
            stroke = ' stroke="#333"' if ev.kind == "transfer" else ""
        fill = "#ffffff" if ev.kind == "transfer" else colour
        tip = (
            f"{ev.node} ({ev.kind}) · run {ev.run_id} {ev.program} · {(ev.end - ev.start) / 1e6:.3f} ms"
            f" · {ev.shapes}" + (f" · {ev.error}" if ev.error else "")
        )
        for d in ev.devices:
            y = lane[d] * h
            out.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h - 1}" fill="{fill}"{stroke}>'
                f"<title>{esc(tip)}</title></rect>"
            )
    out.append(f'<text x="{label_w}" y="{total_h - 2}">0 ms</text>')
    out.append(f'<text x="{width - 4}" y="{total_h - 2}" text-anchor="end">{span / 1e6:.3f} ms</text>')
    out.append("</svg>")
    return "".join(out)


def timeline_view(events: Iterable[Any], title: str = "timeline") -> View:
    """Node events as a per-device chart and a table (the latest rows when there are many)."""
    events = list(events)
    if not events:
        msg = f"{title}: no node events yet"
        return View(msg, _page(f"<div>{esc(msg)}</div>"))
    t0 = min(ev.start for ev in events)
    shown = events[-MAX_TABLE_ROWS:]
    rows = [
        (
            str(ev.run_id),
            ev.program,
            ev.node,
            ev.kind,
            ",".join(map(str, ev.devices)),
            f"{(ev.start - t0) / 1e6:.3f}",
            f"{(ev.end - ev.start) / 1e6:.3f}",
            ev.shapes,
        )
        for ev in shown
    ]
    headers = ["run", "program", "node", "kind", "devices", "start ms", "duration ms", "shapes"]
    more = f" (latest {len(shown)} of {len(events)})" if len(shown) < len(events) else ""
    busy = controller().events.busy(events)
    span = max(max(ev.end for ev in events) - t0, 1)
    util = ", ".join(f"dev {d}: {100 * b / span:.0f}%" for d, b in sorted(busy.items()))
    head = f"{title}: {len(events)} node events{more}; busy {util}"
    text = head + "\n" + _text_table(headers, rows)
    body = (
        f"<div><b>{esc(head)}</b></div>"
        + timeline_svg(events)
        + f'<details><summary>events table</summary>{_table(headers, [[esc(c) for c in r] for r in rows])}</details>'
    )
    return View(text, _page(body))


# ------------------------------------------------------------ status, devices
def status_view(status, runs: Sequence[Any] = (), checkpoints: Sequence[str] = ()) -> View:
    """Islands, slices and runs (state and progress) from `Controller.status()`; checkpoints in progress and done."""
    text = "\n".join([str(status), *checkpoints])
    isl_rows = [
        (
            esc(i.id),
            esc(i.platform),
            esc(", ".join(str(d.id) for d in i.devices)),
            esc(status.inflight.get(i.id, 0)),
        )
        for i in status.islands
    ]
    sl_rows = [
        (
            f"<code>{esc(s.name)}</code>",
            esc(dict(s.mesh.shape)),
            esc(", ".join(str(d.id) for d in s.devices)),
            esc(s.island.id),
        )
        for s in status.slices
    ]
    by_id = {r.id: r for r in runs}
    run_rows = []
    shown, hidden = status.recent_runs()
    for summary in shown:
        r = by_id.get(summary.id)
        state = summary.state
        elapsed = f"{r.elapsed:.3f} s" if r is not None else ""
        err = esc(short_error(r.error, 3)) if r is not None and r.error is not None and state == "failed" else ""
        progress = f"{_bar(summary.done, summary.total, state)} {summary.done}/{summary.total}"
        compiled = f"{summary.compile_s * 1e3:.0f} ms" if summary.compile_s else ""
        run_rows.append(
            (esc(summary.id), f"<code>{esc(summary.name)}</code>", _badge(state, summary.state_text), progress, elapsed,
             compiled, err)
        )
    counts = ", ".join(f"{v} {k}" for k, v in sorted(status.counts().items())) or "none"
    body = (
        f"<div><b>pw_kernel controller</b>: {len(status.islands)} islands, policy {esc(status.policy)}, "
        f"runs: {esc(counts)}</div>"
        + _table(["island", "platform", "devices", "in flight"], isl_rows)
        + (_table(["slice", "mesh", "devices", "island"], sl_rows) if sl_rows else "<div>no slices</div>")
        + (
            _table(["run", "name", "state", "progress", "elapsed", "compile", "error"], run_rows)
            if run_rows
            else "<div>no runs</div>"
        )
        + (
            f'<div style="color:#555">... and {hidden} earlier finished runs '
            "(<code>pw.controller().runs</code> has them all)</div>"
            if hidden
            else ""
        )
        + "".join(f"<div>{esc(line)}</div>" for line in checkpoints)
    )
    return View(text, _page(body))


def devices_view(islands: Sequence[Any], slices: Sequence[Any]) -> View:
    """Every device, grouped by island, with the slices placed on it."""
    on: dict[int, list[str]] = {}
    for s in slices:
        for d in s.devices:
            on.setdefault(d.id, []).append(s.name)
    lines = []
    blocks = []
    for isl in islands:
        lines.append(f"island {isl.id} ({isl.platform}, {len(isl.devices)} devices)")
        cells = []
        for d in isl.devices:
            names = on.get(d.id, [])
            kind = getattr(d, "device_kind", d.platform)
            lines.append(f"  {d.platform}:{d.id:<3d} {kind:12s} slices: {', '.join(names) or '-'}")
            tag = "".join(f"<div><code>{esc(n)}</code></div>" for n in names) or '<div style="color:#999">free</div>'
            cells.append(
                f'<div style="display:inline-block;min-width:80px;margin:2px;padding:4px;border:1px solid #bbb;'
                f'border-radius:4px;vertical-align:top"><b>{esc(d.platform)}:{esc(d.id)}</b>'
                f'<div style="color:#666">{esc(kind)}</div>{tag}</div>'
            )
        blocks.append(
            f"<div><b>island {esc(isl.id)}</b> ({esc(isl.platform)}, {len(isl.devices)} devices)</div>"
            f"<div>{''.join(cells)}</div>"
        )
    return View("\n".join(lines), _page("".join(blocks)))

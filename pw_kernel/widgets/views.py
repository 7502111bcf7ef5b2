"""Static rich displays of runs, graphs, timelines, status and devices: HTML with a plain-text fallback.

What the notebook front (`%%pathways`, `%pathways`) shows where no widget can be
(a terminal IPython, nbconvert, a front-end without widgets), and the text
beside a widget. Built only from the runtime's public objects (Run,
ProgramGraph, NodeEvent, Status, Island, VirtualSlice); each piece is a small
function returning a `View`. Timelines are `timeline_html.static_timeline`'s
pictures, the graph is `graph.graph_html`'s; every user-provided string goes
through `esc`. Needs neither anywidget nor IPython.

Example::

    from pw_kernel.widgets import run_view
    run_view(pw.controller().runs[-1])   # text in a terminal, HTML in a notebook
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..runtime import controller
from ..runtime.extend import short_error
from ._html import describe_outputs, esc, percent_done, state_colour
from .graph import graph_html
from .timeline_html import static_timeline

MAX_TABLE_ROWS = 200

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
    shortens error text (the notebook passes one that keeps only the user's frames).
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
        parts.append(static_timeline(list(run.events), mini=True, names=_device_names()))
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


def story_view(story) -> View:
    """A run's story (`Run.story()`): its transitions in order, with the stimulus and thread of each.

    Example::

        story_view(run.story())      # `%pathways story RUN` shows this
    """
    headers = ["time", "from", "to", "event", "stimulus", "thread"]
    rows = story.rows()
    head = f"story of run {story.run_id} ({story.name!r}): {len(story)} transitions"
    if not rows:
        head += " (none kept: the run is older than the lifecycle's log)"
    body = f"<div><b>{esc(head)}</b></div>" + (_table(headers, [[esc(c) for c in r] for r in rows]) if rows else "")
    return View(str(story), _page(body))


def message_view(text: str) -> View:
    return View(text, _page(f"<div>{esc(text)}</div>"))


def clients_view(clients: Sequence[Any]) -> View:
    """A Pathways service's clients (`pw.clients()`) as a table: HTML in a notebook, aligned text in a terminal.

    Example::

        clients_view(pw.clients())      # `%pathways clients` shows this
    """
    headers = ["", "client", "weight", "device time", "runs", "nodes", "pid", "connected for"]
    rows = [
        ["*" if c.you else "", str(c.name), f"{c.weight:g}", f"{c.device_time_s:.3f} s", str(c.runs), str(c.nodes),
         str(c.pid), f"{c.connected_s:.0f} s"]
        for c in clients
    ]
    head = f"pw_kernel service clients ({len(rows)}; * is this kernel)"
    body = f"<div><b>{esc(head)}</b></div>" + _table(headers, [[esc(x) for x in r] for r in rows])
    return View(f"{head}:\n{_text_table(headers, rows)}", _page(body))


# --------------------------------------------------------------------- graph
def graph_view(graph) -> View:
    """The program's dataflow graph: summary and SVG via graphviz ``dot``, else the install hint and DOT source.

    The same picture the graph shows of itself in a notebook (`ProgramGraph._repr_html_`).
    """
    return View(repr(graph), graph_html(graph))


# ------------------------------------------------------------------ timeline
def timeline_view(events: Iterable[Any], title: str = "timeline", runs: Iterable[Any] = ()) -> View:
    """Node events as the static timeline and a table (the latest rows when there are many).

    ``runs`` (`Run` s) name the picture's colour keys.
    """
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
        + static_timeline(events, title=title, runs=runs, names=_device_names())
        + f'<details><summary>events table</summary>{_table(headers, [[esc(c) for c in r] for r in rows])}</details>'
    )
    return View(text, _page(body))


def _device_names() -> dict[int, str]:
    """How the current controller names its devices (``cpu:0``); empty when there is none."""
    c = controller(create=False)
    return dict(c.events.device_names) if c is not None else {}


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
        pace = summary.pace
        progress = f"{_bar(summary.done, summary.total, state)} {summary.done}/{summary.total}" + (
            f" · {esc(pace)}" if pace else ""
        )
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


__all__ = [
    "View",
    "WithText",
    "devices_view",
    "failure_view",
    "graph_view",
    "message_view",
    "progress_line",
    "run_view",
    "status_view",
    "timeline_view",
]

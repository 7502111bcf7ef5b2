"""The program graph as a picture: its DOT source (`pw_kernel.widgets.dot`) laid out into SVG by graphviz.

Layout goes through the ``graphviz`` Python package, which runs the ``dot``
binary; without the package, or without ``dot``, `graph_html` shows what to
install plus the DOT source, which any graphviz viewer opens. A pipeline's
grid is checked after layout (rows top to bottom in stage order) and its
in-row edges are drawn as arcs above the row (`graph_svg`).

`ProgramGraph.to_dot`, ``_repr_svg_`` and ``_repr_html_`` delegate here, so
this module imports neither anywidget nor IPython: the runtime's graph must
draw itself with only jax and numpy installed. In a notebook the graph shows
as `GraphWidget` (zoom, pan, search; `pw_kernel.widgets.graph_widget`),
through `pw_kernel.widgets.graph_display`, imported only when displayed.
"""

from __future__ import annotations

import functools
import html
import re
import shutil
import threading
from typing import Any

from ._html import esc, page
from .dot import FONT_SIZE, Arc, pipeline_rows, write_dot
from .errors import GraphvizError

DOT_TIMEOUT = 30.0  # seconds; large graphs take dot a while, a hung dot must not hang the kernel
INSTALL_HINT = (
    "Install graphviz: `apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` (macOS), "
    "`conda install graphviz`, or run ./scripts/setup.sh."
)
PACKAGE_HINT = (
    "Install the `graphviz` Python package (`pip install graphviz`, or `pip install 'pw_kernel[notebook]'`), "
    "which lays graphs out with graphviz's `dot` binary (`apt-get install graphviz`, `brew install graphviz`, "
    "`conda install graphviz`, or ./scripts/setup.sh installs both)."
)


def dot_binary() -> str | None:
    """The path of graphviz's ``dot``, or None."""
    return shutil.which("dot")


def _graphviz_package() -> Any:
    """The ``graphviz`` Python package, or None when it is not installed."""
    try:
        import graphviz
    except ImportError:
        return None
    return graphviz


def layout_available() -> bool:
    """Whether `graph_svg` can lay graphs out here: the ``graphviz`` package and its ``dot`` binary are installed."""
    return _graphviz_package() is not None and dot_binary() is not None


def clear_layout_cache() -> None:
    """Forget the SVGs laid out so far (the last 64 DOT sources are kept, as graphviz takes a while on each).

    For tests that change what graphviz does, and for long-lived kernels that want the memory back.
    """
    _layout.cache_clear()


@functools.lru_cache(maxsize=64)
def _layout(source: str) -> str:
    gv = _graphviz_package()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["svg"] = gv.Source(source).pipe(format="svg", encoding="utf-8", quiet=True)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    # the package's pipe() has no timeout: wait for it on a helper thread, so a hung dot cannot hang the kernel
    worker = threading.Thread(target=work, name="pw-graphviz", daemon=True)
    worker.start()
    worker.join(DOT_TIMEOUT)
    if worker.is_alive():
        raise GraphvizError(
            f"`graph_svg`: graphviz `dot` took longer than {DOT_TIMEOUT:.0f} s to lay the graph out. "
            f"The DOT source:\n{source}",
            source,
        )
    err = box.get("error")
    if isinstance(err, gv.ExecutableNotFound):
        raise GraphvizError(f"`graph_svg`: could not run graphviz `dot`: {err}. {INSTALL_HINT}", source) from None
    if isinstance(err, gv.CalledProcessError):
        stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else str(err.stderr or "")
        raise GraphvizError(
            f"`graph_svg`: graphviz `dot` failed (exit {err.returncode}): {stderr.strip()}\nThe DOT source:\n{source}",
            source,
        ) from None
    if err is not None:
        raise GraphvizError(
            f"`graph_svg`: graphviz could not lay the graph out: {err!r}\nThe DOT source:\n{source}", source
        )
    svg = box["svg"]
    start = svg.find("<svg")
    svg = svg[start:] if start >= 0 else svg
    # at its own size wherever it is inlined: notebook CSS shrinks SVGs to the output's width (tiny text)
    return svg.replace("<svg ", '<svg class="pw-graph-drawing jp-mod-unconfined" style="max-width:none" ', 1)


def dot_to_svg(source: str) -> str:
    """Lay out DOT source with graphviz (the ``graphviz`` package running ``dot``).

    Raises GraphvizError (holding the source) when the package or ``dot`` is missing, or dot fails.
    """
    if _graphviz_package() is None:
        raise GraphvizError(
            "`graph_svg`: the `graphviz` Python package is not installed, so the program graph cannot be laid "
            f"out. {PACKAGE_HINT} Meanwhile, the DOT source (paste it into any graphviz viewer):\n{source}",
            source,
        )
    if dot_binary() is None:
        raise GraphvizError(
            "`graph_svg`: graphviz's `dot` binary was not found on PATH, so the program graph cannot be laid "
            f"out. {INSTALL_HINT} Meanwhile, the DOT source (paste it into any graphviz viewer):\n{source}",
            source,
        )
    return _layout(source)


def graph_svg(graph: Any) -> str:
    """The program graph as an SVG string (``<svg ...>``), laid out by graphviz.

    Raises GraphvizError, whose message says what to install and includes
    the DOT source, when the ``graphviz`` package or ``dot`` is missing.

    A pipeline's rows should read top to bottom in stage order, which dot
    does not promise (it orders boxes to cut crossings): the layout is
    checked, and laid out once more with other hints when the order came out
    wrong (the first layout is kept when none is right).

    Example::

        svg = graph_svg(step.trace(x))
        IPython.display.SVG(svg)
    """
    grid = pipeline_rows(graph)
    if grid is None:
        return dot_to_svg(write_dot(graph, None, posts=False))
    arcs: list[Arc] = []
    svg = dot_to_svg(write_dot(graph, grid, posts=True, arcs=arcs))
    if not _rows_in_order(svg, len(grid.rows)):
        again = dot_to_svg(write_dot(graph, grid, posts=False, arcs=[]))
        svg = again if _rows_in_order(again, len(grid.rows)) else svg
    return _draw_arcs(svg, arcs)


_NUM = r"-?[\d.]+(?:e-?\d+)?"


def _boxes(svg: str) -> dict[str, tuple[float, float, float, float]]:
    """Each drawn node's and cluster's box (x0, y0, x1, y1) in graphviz's SVG, by DOT id / cluster name."""
    out = {}
    for part in re.split(r'<g id="(?:node|clust)\d+" class="(?:node|cluster)">', svg)[1:]:
        part = part.split("<!--", 1)[0]
        title = re.search(r"<title>([^<]*)</title>", part)
        if title is None:
            continue
        pts = re.findall(rf"({_NUM}),({_NUM})", " ".join(re.findall(r'(?:points|d)="([^"]*)"', part)))
        if not pts:  # a plaintext node: its text, about 0.6 em a character wide
            t = re.search(rf'<text text-anchor="middle" x="({_NUM})" y="({_NUM})"[^>]*>([^<]*)</text>', part)
            if t is None:
                continue
            x, y, w = float(t.group(1)), float(t.group(2)), 0.3 * FONT_SIZE * len(html.unescape(t.group(3)))
            out[title.group(1)] = (x - w, y - FONT_SIZE, x + w, y + 3)
            continue
        xs, ys = [float(a) for a, _ in pts], [float(b) for _, b in pts]
        out[title.group(1)] = (min(xs), min(ys), max(xs), max(ys))
    return out


def _draw_arcs(svg: str, arcs: list[Arc]) -> str:
    """``svg`` with ``arcs`` drawn in, under the nodes: from one node over the top of a later one in its row."""
    if not arcs:
        return svg
    boxes = _boxes(svg)
    parts = ['<g id="pw-arcs" class="pw-arcs">']
    for a in arcs:
        s, d = boxes.get(a.src), boxes.get(a.dst)
        if s is None or d is None:
            continue
        if a.src.startswith("in"):  # an input at the row's start: leave from its right end
            x1, y1 = s[2] + 2, (s[1] + s[3]) / 2
        else:
            x1, y1 = (s[0] + s[2]) / 2 + 4, s[1]
        x2, y2 = (d[0] + d[2]) / 2 - 4, d[1] - 1
        lift = min(12 + 0.06 * abs(x2 - x1), 2.2 * FONT_SIZE)  # longer reads arc higher, inside the row's box
        top = min(y1, y2) - lift
        colour = "#c0c0c0" if a.faint else "#8a8a8a"
        tip = esc(f"{a.src} -> {a.dst}: {a.tip}")
        parts.append(
            f'<g class="edge pw-arc"><title>{tip}</title>'
            f'<path fill="none" stroke="{colour}" d="M{x1:.1f},{y1:.1f}C{x1 + (x2 - x1) / 4:.1f},{top:.1f} '
            f'{x2 - (x2 - x1) / 4:.1f},{top:.1f} {x2:.1f},{y2 - 5:.1f}"/>'
            f'<polygon fill="{colour}" stroke="{colour}" points="{x2 - 2.5:.1f},{y2 - 5:.1f} {x2 + 2.5:.1f},{y2 - 5:.1f} '
            f'{x2:.1f},{y2:.1f}"/></g>'
        )
    parts.append("</g>")
    # after the boxes and under the nodes and edges, inside the graph's own group (its transform applies)
    at = min((i for i in (svg.find('<g id="node'), svg.find('<g id="edge')) if i >= 0), default=-1)
    if at < 0:
        return svg
    at = svg.rfind("<!--", 0, at) if svg.rfind("<!--", 0, at) > svg.rfind("</g>", 0, at) else at
    return svg[:at] + "".join(parts) + "\n" + svg[at:]


def _rows_in_order(svg: str, n: int) -> bool:
    """Whether the boxes ``cluster_0 .. cluster_{n-1}`` of a laid-out grid sit top to bottom in that order."""
    tops = []
    for k in range(n):
        m = re.search(rf"<title>cluster_{k}</title>.*?(?:points|d)=\"M?(-?[\d.]+),(-?[\d.]+)", svg, re.DOTALL)
        if m is None:
            return True  # not a layout this check understands: keep it
        tops.append(float(m.group(2)))
    return tops == sorted(tops)


def repr_svg(graph: Any) -> str | None:
    """For ``ProgramGraph._repr_svg_``: the SVG, or None without graphviz (so the HTML repr shows the message)."""
    try:
        return graph_svg(graph)
    except GraphvizError:
        return None


def graph_summary(graph: Any) -> str:
    """The graph's one-line summary (its name when it has no `summary`): the pictures' title."""
    return graph.summary() if hasattr(graph, "summary") else str(getattr(graph, "name", "program graph"))


def graph_html(graph: Any) -> str:
    """For ``ProgramGraph._repr_html_``: a summary line and the SVG, or what to install and the DOT source.

    The SVG keeps its own size (text stays readable however large the graph)
    in a box that scrolls both ways; no script, so nbconvert, GitHub and an
    untrusted notebook show it as it is. `GraphWidget` adds zoom, pan and search.
    """
    head = f'<div style="margin-bottom:4px"><b>{esc(graph_summary(graph))}</b></div>'
    try:
        svg = graph_svg(graph)
    except GraphvizError as e:
        return page(head + _missing_html(e), "pw-graph")
    body = (
        '<div class="pw-graph-svg" style="overflow:auto;max-height:720px;max-width:100%;'
        f'border:1px solid #e0e0e0">{svg}</div>'
    )
    return page(head + body, "pw-graph")


def _missing_html(e: GraphvizError) -> str:
    msg = str(e).split(" Meanwhile,")[0].split("\nThe DOT source")[0]
    return (
        f'<div style="color:#8a4b00">{esc(msg)}</div>'
        f'<details open><summary>DOT source</summary><pre style="font-size:11px">{esc(e.dot)}</pre></details>'
    )


__all__ = [
    "GraphvizError",
    "clear_layout_cache",
    "dot_binary",
    "dot_to_svg",
    "graph_html",
    "graph_summary",
    "graph_svg",
    "layout_available",
    "repr_svg",
]

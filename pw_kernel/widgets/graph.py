"""The program graph as SVG, laid out by graphviz's ``dot`` binary (a subprocess; no Python bindings needed).

`graph_dot` writes the picture from the graph's public structure (nodes,
values, slices): compute nodes as boxes and glue as rounded boxes, coloured
by slice; transfers as diamonds, cross-island ones outlined red; edges
labelled with shape and dtype; hover tooltips with shardings, devices and
the user's source line. Every user string is escaped for DOT (and graphviz
escapes it again for SVG). Without ``dot`` you get a message that says how
to install it, plus the DOT source, which any graphviz viewer opens.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from typing import Any

from ..runtime.errors import GraphvizError
from . import _html

DOT_TIMEOUT = 30.0  # seconds; large graphs take dot a while, a hung dot must not hang the kernel
INSTALL_HINT = (
    "Install graphviz: `apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` (macOS), "
    "`conda install graphviz`, or run ./scripts/setup.sh."
)


def graph_dot(graph: Any) -> str:
    """DOT source of a ProgramGraph (the runtime's `ProgramGraph.to_dot`)."""
    return graph.to_dot()


def dot_binary() -> str | None:
    """The path of graphviz's ``dot``, or None."""
    return shutil.which("dot")


@functools.lru_cache(maxsize=64)
def _layout(source: str, exe: str) -> str:
    try:
        proc = subprocess.run([exe, "-Tsvg"], input=source, capture_output=True, text=True, timeout=DOT_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise GraphvizError(
            f"`graph_svg`: graphviz `dot` took longer than {DOT_TIMEOUT:.0f} s to lay the graph out. "
            f"The DOT source:\n{source}",
            source,
        ) from None
    except OSError as e:
        raise GraphvizError(f"`graph_svg`: could not run graphviz `dot` ({exe}): {e}. {INSTALL_HINT}", source) from None
    if proc.returncode != 0:
        raise GraphvizError(
            f"`graph_svg`: graphviz `dot` failed (exit {proc.returncode}): {proc.stderr.strip()}\n"
            f"The DOT source:\n{source}",
            source,
        )
    svg = proc.stdout
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def dot_to_svg(source: str) -> str:
    """Lay out DOT source with ``dot -Tsvg``; raises GraphvizError (with the source) when dot is missing or fails."""
    exe = dot_binary()
    if exe is None:
        raise GraphvizError(
            "`graph_svg`: graphviz's `dot` binary was not found on PATH, so the program graph cannot be laid "
            f"out. {INSTALL_HINT} Meanwhile, the DOT source (paste it into any graphviz viewer):\n{source}",
            source,
        )
    return _layout(source, exe)


def graph_svg(graph: Any) -> str:
    """The program graph as an SVG string (``<svg ...>``), laid out by ``dot``.

    Raises GraphvizError, whose message says how to install graphviz and
    includes the DOT source, when ``dot`` is missing.

    Example::

        svg = graph_svg(step.trace(x))
        IPython.display.SVG(svg)
    """
    return dot_to_svg(graph_dot(graph))


def repr_svg(graph: Any) -> str | None:
    """For ``ProgramGraph._repr_svg_``: the SVG, or None without ``dot`` (so the HTML repr shows the message)."""
    try:
        return graph_svg(graph)
    except GraphvizError:
        return None


def graph_html(graph: Any) -> str:
    """For ``ProgramGraph._repr_html_``: a summary line and the SVG, or the install message and the DOT source."""
    summary = graph.summary() if hasattr(graph, "summary") else str(getattr(graph, "name", "program graph"))
    head = f'<div style="margin-bottom:4px"><b>{_html.esc(summary)}</b></div>'
    try:
        svg = graph_svg(graph)
        body = f'<div class="pw-graph-svg" style="overflow:auto;max-height:720px">{svg}</div>'
    except GraphvizError as e:
        msg = str(e).split(" Meanwhile,")[0].split("\nThe DOT source")[0]
        body = (
            f'<div style="color:#8a4b00">{_html.esc(msg)}</div>'
            f'<details open><summary>DOT source</summary><pre style="font-size:11px">{_html.esc(e.dot)}</pre></details>'
        )
    return _html.page(head + body, "pw-graph")


__all__ = ["GraphvizError", "dot_binary", "dot_to_svg", "graph_dot", "graph_html", "graph_svg", "repr_svg"]

"""How the runtime's data draws itself: the views attach these to the runtime's classes.

The runtime holds data only (a `ProgramGraph` is nodes, values and edges) and
imports no view. `register` (called once when `pw_kernel` is imported) gives
`ProgramGraph` its DOT source and its notebook reprs from this side; the
drawing modules load on first use, so registering costs no import of graphviz
or anywidget.
"""

from __future__ import annotations

from ..runtime import ProgramGraph


def _to_dot(self: ProgramGraph) -> str:
    """Graphviz source: a box per slice, transfers as diamonds, edges labelled with shape and dtype."""
    from .dot import graph_dot

    return graph_dot(self)


def _repr_svg_(self: ProgramGraph) -> str | None:
    from .graph import repr_svg  # graphviz `dot` in a subprocess; None without it

    return repr_svg(self)


def _repr_html_(self: ProgramGraph) -> str:
    from .graph import graph_html  # summary + inline SVG, or the install hint + DOT source

    return graph_html(self)


def _ipython_display_(self: ProgramGraph) -> None:
    """In a notebook: the graph as a widget that zooms, pans and searches (static HTML beside it)."""
    from .graph_display import display_graph  # anywidget is imported there, only when there is one

    display_graph(self)


def register() -> None:
    """Attach the views' drawing methods to the runtime's data classes (idempotent)."""
    ProgramGraph.to_dot = _to_dot
    ProgramGraph._repr_svg_ = _repr_svg_
    ProgramGraph._repr_html_ = _repr_html_
    ProgramGraph._ipython_display_ = _ipython_display_

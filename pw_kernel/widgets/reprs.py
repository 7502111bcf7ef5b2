"""How the runtime's data draws itself: the views attach these to the runtime's classes.

The runtime holds data only (a `ProgramGraph` is nodes, values and edges) and
imports no view. `register` (called once when `pw_kernel` is imported) gives
`ProgramGraph` its DOT source and its notebook reprs, and a run's `Story` its
table, from this side; the
drawing modules load on first use, so registering costs no import of graphviz
or anywidget.
"""

from __future__ import annotations

from ..runtime import ProgramGraph
from ..runtime.extend import Story


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


def _story_html(self: Story) -> str:
    """A run's story as a table (`Run.story()` in a notebook)."""
    from .views import story_view

    return story_view(self)._repr_html_()


def register() -> None:
    """Attach the views' drawing methods to the runtime's data classes (idempotent)."""
    Story._repr_html_ = _story_html
    ProgramGraph.to_dot = _to_dot
    ProgramGraph._repr_svg_ = _repr_svg_
    ProgramGraph._repr_html_ = _repr_html_
    ProgramGraph._ipython_display_ = _ipython_display_

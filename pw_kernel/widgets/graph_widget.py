"""GraphWidget: the program graph laid out by graphviz, with zoom, pan and a search box.

The picture is the SVG `graph_svg` makes (the same the static HTML shows);
the front-end (``static/graph.js``) puts it in a viewport: the wheel zooms
around the cursor, a drag pans, ``fit`` / ``1:1`` reset the view, and the
search box highlights the nodes whose name (or slice, or tooltip) matches
and steps through them with Enter. Text starts at a readable size however
large the graph: the first view is never scaled below `MIN_START_ZOOM`.

`ProgramGraph` shows itself as this widget in a notebook
(``_ipython_display_``); its mimebundle also carries the static HTML.
"""

from __future__ import annotations

from typing import Any

import traitlets as t

from ._base import PwWidget
from .esm import STATIC, esm_source
from .graph import graph_html, graph_summary, graph_svg

MIN_START_ZOOM = 0.7  # 12 pt labels stay >= 11 px on screen in the first view


class GraphWidget(PwWidget):
    """A program graph you can zoom, pan and search.

    Raises GraphvizError (what to install, and the DOT source) without graphviz.

    Example::

        from pw_kernel.widgets.graph_widget import GraphWidget
        GraphWidget(step.trace(x), height=700)
    """

    _esm = esm_source("graph")
    _css = (STATIC / "widgets.css").read_text() + (STATIC / "graph.css").read_text()

    svg = t.Unicode("").tag(sync=True)
    title = t.Unicode("").tag(sync=True)
    height = t.Int(560).tag(sync=True)  # the viewport's height at most, in pixels
    min_start_zoom = t.Float(MIN_START_ZOOM).tag(sync=True)

    def __init__(self, graph: Any, *, height: int = 560, **kwargs: Any):
        svg = graph_svg(graph)
        super().__init__(svg=svg, title=graph_summary(graph), height=height, **kwargs)
        self._static = graph_html(graph)  # cached layout: the same SVG
        self._text = repr(graph)  # its nodes, one per line: what a plain-text reader of the notebook sees

    def static_html(self) -> str:
        return self._static

    def _repr_mimebundle_(self, **kwargs: Any):
        out = super()._repr_mimebundle_(**kwargs)
        if out is None:
            return None
        data, metadata = out
        return {**data, "text/plain": self._text}, metadata

    def __repr__(self) -> str:
        return f"GraphWidget({self.title})"


__all__ = ["MIN_START_ZOOM", "GraphWidget"]

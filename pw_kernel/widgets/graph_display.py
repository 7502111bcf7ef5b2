"""How a program graph shows itself in a notebook: `GraphWidget` when anywidget is there, else its static picture.

Apart from `pw_kernel.widgets.graph` so that the drawing functions import no
widget: this module imports the widget lazily, and the widget imports the
drawing functions, never the other way round.
"""

from __future__ import annotations

from typing import Any

from .errors import GraphvizError
from .graph import graph_html


def display_graph(graph: Any) -> None:
    """Show the graph in a notebook (``ProgramGraph._ipython_display_``): `GraphWidget` when anywidget is there.

    The widget zooms, pans and searches; its mimebundle carries `graph_html` too,
    so nbconvert and untrusted notebooks show the static picture. Without
    anywidget, or without graphviz, the static HTML is shown on its own.

    Example::

        display_graph(step.trace(x))    # what a cell ending in `step.trace(x)` shows
    """
    from IPython.display import display

    try:
        from .graph_widget import GraphWidget
    except ImportError:  # anywidget or ipywidgets missing: the picture without the controls
        GraphWidget = None
    if GraphWidget is not None:
        try:
            widget = GraphWidget(graph)
        except GraphvizError:
            widget = None
        if widget is not None:
            widget._ipython_display_()
            return
    display({"text/plain": repr(graph), "text/html": graph_html(graph)}, raw=True)


__all__ = ["display_graph"]

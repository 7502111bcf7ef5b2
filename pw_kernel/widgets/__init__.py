"""pw_kernel's views: anywidget front-ends (ES modules in ``static/``) with static HTML fallbacks.

* `show_mesh` / `MeshWidget`: a device mesh with axis names, or where every shard of an array lives.
* `timeline` / `TimelineWidget`: a lane per device and per transfer path, a bar per node, live.
* `show_pipeline`: a timeline of pipelined steps with their per-slice bubble and live activations beside it.
* `RunWidget`: a run's state, nodes done / total, elapsed time, error and a mini timeline, live.
* `graph_dot` / `graph_svg` / `graph_html`: the program graph as DOT (``dot.py``), and laid out by
  graphviz ``dot`` (``graph.py``; what `ProgramGraph.to_dot` and its reprs return): a box per slice,
  pipelines as a slices x microbatches grid (`pipeline_rows`).
* `GraphWidget` / `display_graph`: that picture in a notebook, with zoom, pan and search.

The views consume only the runtime's public objects and its event stream. The
front-ends share ``static/prelude.js`` (elements, colours, formatting, pan and
zoom), which `esm.esm_source` puts in front of each widget's own files.
Names resolve lazily: the graph's functions need neither anywidget nor ipywidgets.

Example::

    from pw_kernel.widgets import show_mesh, timeline, RunWidget, graph_svg
    show_mesh(pw.slice(4, mesh={"data": 2, "model": 2}))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "MeshWidget": ".mesh",
    "show_mesh": ".mesh",
    "TimelineWidget": ".timeline_widget",
    "timeline": ".timeline_widget",
    "RunWidget": ".run",
    "show_pipeline": ".pipeline",
    "stats_html": ".pipeline",
    "GraphvizError": ".errors",
    "graph_dot": ".dot",
    "graph_svg": ".graph",
    "graph_html": ".graph",
    "repr_svg": ".graph",
    "dot_to_svg": ".graph",
    "display_graph": ".graph_display",
    "pipeline_rows": ".dot",
    "GraphWidget": ".graph_widget",
}

if TYPE_CHECKING:
    from .dot import graph_dot, pipeline_rows
    from .errors import GraphvizError
    from .graph import dot_to_svg, graph_html, graph_svg, repr_svg
    from .graph_display import display_graph
    from .graph_widget import GraphWidget
    from .mesh import MeshWidget, show_mesh
    from .pipeline import show_pipeline, stats_html
    from .run import RunWidget
    from .timeline_widget import TimelineWidget, timeline


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'pw_kernel.widgets' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "GraphWidget",
    "GraphvizError",
    "MeshWidget",
    "RunWidget",
    "TimelineWidget",
    "display_graph",
    "dot_to_svg",
    "graph_dot",
    "graph_html",
    "graph_svg",
    "pipeline_rows",
    "repr_svg",
    "show_mesh",
    "show_pipeline",
    "stats_html",
    "timeline",
]

"""pw_kernel's views: anywidget front-ends (ES modules in ``static/``) with static HTML fallbacks.

* `show_mesh` / `MeshWidget`: a device mesh with axis names, or where every shard of an array lives.
* `timeline` / `TimelineWidget`: a lane per device and per transfer path, a bar per node, live.
* `PoolWidget` (`pw.pool()`): a Pathways service's whole pool, live: a lane per device with every client's
  nodes, a legend of clients, shares, queues and memory (``pool.py``; the service's dashboard serves it too).
* `show_pipeline`: a timeline of pipelined steps with their per-slice bubble and live activations beside it.
* `RunWidget`: a run's state, nodes done / total, elapsed time, error and a mini timeline, live.
* `MetricsPlot` / `metrics_svg`: a curve per metric `pw.log` records, against step, live.
* `graph_dot` / `graph_svg` / `graph_html`: the program graph as DOT (``dot.py``), and laid out by
  graphviz ``dot`` (``graph.py``; what `ProgramGraph.to_dot` and its reprs return): a box per slice,
  pipelines as a slices x microbatches grid (`pipeline_rows`).
* `GraphWidget` / `display_graph`: that picture in a notebook, with zoom, pan and search.
* `static_timeline`: the one static timeline renderer (``timeline_html.py``): node events as SVG in
  HTML, the full picture or a run's mini timeline; every static timeline of every view is its picture.
* `run_view`, `timeline_view`, `status_view`, `devices_view`, `graph_view`, `failure_view`,
  `message_view`, `clients_view`, `progress_line` (``views.py``): what the notebook front shows where no widget can be,
  as HTML with a plain-text fallback; `WithText` shows a widget with such a text.
* `ticker`: the one refresh mechanism of every live view (``_ticker.py``); `describe_outputs`: a cell's
  bound names as rows of type and sharding.

The views consume only the runtime's public objects and its event stream. The
front-ends share ``static/prelude.js`` (elements, colours, formatting, pan and
zoom), which `esm.esm_source` puts in front of each widget's own files.
Names resolve lazily: the static pictures, the text views and the ticker need neither anywidget nor
ipywidgets nor IPython. Submodules import each other directly, never this package.

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
    "PoolWidget": ".pool",
    "RunWidget": ".run",
    "MetricsPlot": ".metrics",
    "metrics_svg": ".metrics",
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
    "static_timeline": ".timeline_html",
    "View": ".views",
    "WithText": ".views",
    "clients_view": ".views",
    "devices_view": ".views",
    "failure_view": ".views",
    "graph_view": ".views",
    "message_view": ".views",
    "progress_line": ".views",
    "run_view": ".views",
    "status_view": ".views",
    "story_view": ".views",
    "timeline_view": ".views",
    "describe_outputs": "._html",
    "ticker": "._ticker",
}

if TYPE_CHECKING:
    from ._html import describe_outputs
    from ._ticker import ticker
    from .dot import graph_dot, pipeline_rows
    from .errors import GraphvizError
    from .graph import dot_to_svg, graph_html, graph_svg, repr_svg
    from .graph_display import display_graph
    from .graph_widget import GraphWidget
    from .mesh import MeshWidget, show_mesh
    from .metrics import MetricsPlot, metrics_svg
    from .pipeline import show_pipeline, stats_html
    from .pool import PoolWidget
    from .run import RunWidget
    from .timeline_html import static_timeline
    from .timeline_widget import TimelineWidget, timeline
    from .views import (
        View,
        WithText,
        clients_view,
        devices_view,
        failure_view,
        graph_view,
        message_view,
        progress_line,
        run_view,
        status_view,
        timeline_view,
    )


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
    "PoolWidget",
    "RunWidget",
    "TimelineWidget",
    "View",
    "WithText",
    "clients_view",
    "describe_outputs",
    "devices_view",
    "display_graph",
    "dot_to_svg",
    "failure_view",
    "graph_dot",
    "graph_html",
    "graph_svg",
    "graph_view",
    "message_view",
    "pipeline_rows",
    "progress_line",
    "repr_svg",
    "run_view",
    "show_mesh",
    "show_pipeline",
    "static_timeline",
    "stats_html",
    "status_view",
    "story_view",
    "ticker",
    "timeline",
    "timeline_view",
]

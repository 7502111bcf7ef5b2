"""The widgets' front-ends as anywidget loads them: ``static/prelude.js`` in front of each widget's own files.

The prelude holds what every front-end shares (elements, colours, formatting,
tooltips, pan and zoom); a widget's files use its names as their own. The
files are joined when Python loads them (anywidget's ``_esm`` takes the
module's source as a string), so there is no build step: edit a ``.js`` file
and restart the kernel. The browser tests and the timeline benchmark load
exactly this source too.
"""

from __future__ import annotations

import pathlib

STATIC = pathlib.Path(__file__).parent / "static"
PRELUDE = "prelude.js"
#: Each widget's own files under ``static/``, in the order they are joined after the prelude.
PARTS: dict[str, tuple[str, ...]] = {
    "graph": ("graph.js",),
    "mesh": ("mesh.js",),
    "metrics": ("metrics.js",),
    "run": ("run.js",),
    "timeline": ("timeline_store.js", "timeline_draw.js", "timeline.js"),
    "pool": ("timeline_store.js", "timeline_draw.js", "pool.js"),  # the timeline's lanes and bars, its own view
}


def esm_source(widget: str) -> str:
    """The ES module of ``widget`` (a key of `PARTS`): the prelude, then the widget's files, read now.

    Example::

        class TimelineWidget(PwWidget):
            _esm = esm_source("timeline")
    """
    if widget not in PARTS:
        raise KeyError(f"`esm_source`: no front-end named {widget!r}; the widgets are {sorted(PARTS)}")
    names = (PRELUDE, *PARTS[widget])
    # a comment names each file where it starts, so a browser's error line can be traced back to it
    return "\n".join(f"// ---- static/{name}\n{(STATIC / name).read_text()}" for name in names)


__all__ = ["PARTS", "STATIC", "esm_source"]

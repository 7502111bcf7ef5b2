"""MetricsPlot: a live curve per metric against step, from `pw.log` (a `MetricsLog`), with a static picture.

The log tells the widget as values arrive (on the metrics thread); the widget
only buffers that and pokes the `ticker`, which pushes the curves to the
front-end (``static/metrics.js``) at most ten times a second. The static
picture (`metrics_svg`: an SVG per metric) is what nbconvert and a saved
notebook show.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import traitlets as t

from ._base import PwWidget
from ._html import device_colour, esc, page
from ._ticker import ticker
from .esm import esm_source

#: Points a curve is drawn with at most: a longer series is thinned evenly (its last point always kept).
MAX_POINTS = 2000
WIDTH, HEIGHT = 520, 120  # one chart's plot area, px (the static picture; the front-end takes its width)


def thinned(steps: Sequence[int], values: Sequence[float], most: int = MAX_POINTS) -> tuple[list, list]:
    """At most ``most`` of the points, evenly spread, the last one always among them."""
    n = len(steps)
    if n <= most:
        return list(steps), list(values)
    idx = sorted({round(k * (n - 1) / (most - 1)) for k in range(most)})
    return [steps[i] for i in idx], [values[i] for i in idx]


def metrics_svg(name: str, steps: Sequence[int], values: Sequence[float], k: int = 0) -> str:
    """One metric's curve as an SVG: steps across, values up, the range's ends and the last value written."""
    pts = [(s, v) for s, v in zip(steps, values) if math.isfinite(v)]
    title = f"{name}: no value yet" if not pts else f"{name}: {pts[-1][1]:.4g} at step {pts[-1][0]}"
    if not pts:
        return f'<div class="pw-metric"><div><b>{esc(title)}</b></div></div>'
    s0, s1 = min(s for s, _ in pts), max(s for s, _ in pts)
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    sx = WIDTH / max(s1 - s0, 1)
    sy = HEIGHT / (hi - lo)
    line = " ".join(f"{(s - s0) * sx:.1f},{HEIGHT - (v - lo) * sy:.1f}" for s, v in zip(*thinned(*zip(*pts))))
    colour = device_colour(k)
    return (
        f'<div class="pw-metric" style="margin:4px 0"><div><b>{esc(name)}</b> '
        f'<span style="color:#555">{esc(title.split(": ", 1)[1])}</span></div>'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH + 60}" height="{HEIGHT + 18}" '
        f'role="img" aria-label="{esc(title)}">'
        f'<g transform="translate(56,2)"><rect width="{WIDTH}" height="{HEIGHT}" fill="#fafafa" stroke="#ddd"/>'
        f'<polyline class="pw-metric-line" fill="none" stroke="{colour}" stroke-width="1.5" points="{line}"/></g>'
        f'<text x="52" y="10" text-anchor="end" font-size="10" fill="#555">{esc(f"{hi:.4g}")}</text>'
        f'<text x="52" y="{HEIGHT + 2}" text-anchor="end" font-size="10" fill="#555">{esc(f"{lo:.4g}")}</text>'
        f'<text x="56" y="{HEIGHT + 15}" font-size="10" fill="#555">step {s0}</text>'
        f'<text x="{WIDTH + 56}" y="{HEIGHT + 15}" text-anchor="end" font-size="10" fill="#555">step {s1}</text>'
        f"</svg></div>"
    )


class MetricsPlot(PwWidget):
    """A live curve per metric of a `MetricsLog` against step, updated as values arrive.

    Example::

        pw.log.plot()                           # every metric pw.log records
        MetricsPlot(pw.log, names=["loss"])     # only the loss
    """

    _esm = esm_source("metrics")

    series = t.Dict().tag(sync=True)  # name -> {"steps": [...], "values": [...]} (thinned to MAX_POINTS)
    names = t.List(t.Unicode()).tag(sync=True)  # in the order drawn
    colours = t.List(t.Unicode()).tag(sync=True)  # one per name (the views' palette)

    def __init__(self, log: Any, names: list[str] | None = None, *, live: bool = True, **kwargs: Any):
        self.metrics_log = log
        self._only = list(names) if names is not None else None
        self._dirty = True
        super().__init__(**kwargs)
        self._update()
        if live:
            self._unsubscribe = log.subscribe(self._on_scalars)
            ticker.add(self)

    def _wanted(self) -> list[str]:
        return [n for n in self.metrics_log.names if self._only is None or n in self._only]

    def _on_scalars(self, scalars: list[Any]) -> None:
        self._dirty = True  # (the metrics thread: only noted, the ticker redraws)
        ticker.poke()

    def _tick(self, now: float) -> float | None:
        if self.comm is None:
            self._unfollow()
            return None
        if self._dirty:
            self._update()
        return None

    def _update(self) -> None:
        self._dirty = False
        names = self._wanted()
        series = {}
        for n in names:
            steps, values = thinned(*self.metrics_log.series(n))
            series[n] = {"steps": steps, "values": [v if math.isfinite(v) else None for v in values]}
        with self.hold_sync():
            self.names = names
            self.colours = [device_colour(k) for k in range(len(names))]
            self.series = series

    def flush(self) -> None:
        """Draw what is recorded now (the ticker does this on its own as values arrive)."""
        self._update()

    def static_html(self) -> str:
        charts = []
        for k, n in enumerate(self.names):
            s = self.series.get(n, {})
            charts.append(metrics_svg(n, s.get("steps", []), [v if v is not None else math.nan for v in s.get("values", [])], k))
        return page("".join(charts) or "<div>no metrics logged yet (<code>pw.log</code>)</div>", "pw-metrics")

    def close(self) -> None:
        self._unfollow()
        super().close()

    def __repr__(self) -> str:
        parts = [f"{n}: {len(self.series.get(n, {}).get('steps', []))} steps" for n in self.names]
        return f"MetricsPlot({', '.join(parts) or 'empty'})"


__all__ = ["MetricsPlot", "metrics_svg"]

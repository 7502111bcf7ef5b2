"""PoolWidget: the whole pool of a Pathways service, live: every client's nodes on each device, shares, queues, memory.

`pw.pool()` makes one (`service/session.py`). It holds no runtime object: it
is given ``fetch(since_ns)``, which asks the service for its plain pool dict
(`pw_kernel.service.pool.pool_data` says the keys), and syncs that dict as its
``data`` trait; ``static/pool.js`` draws it (the timeline's lanes and bars, a
legend per client, the share strip and a table). The service's dashboard
(`service/dashboard.py`) serves the same front-end with the same dict.

It refreshes on the one ticker (`_ticker.ticker`) every ``every_s`` seconds
while it is open, also while a cell runs; `close()` (or a service that stops
answering: the view then says why) stops it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import traitlets as t

from ._base import PwWidget, ticker
from ._html import RUN_PALETTE, esc, fmt_bytes, fmt_ns, page
from .esm import STATIC, esm_source


def pool_css() -> str:
    """The pool view's styles: the widgets' shared ones, then its own (``static/pool.css``)."""
    return (STATIC / "widgets.css").read_text() + (STATIC / "pool.css").read_text()


class PoolWidget(PwWidget):
    """The service's devices as lanes, every client's nodes as bars in its colour, with shares, queues and memory.

    Example::

        w = pw.pool()          # after pw.connect(): display it; it refreshes every second
        w.data["clients"]      # the latest answer: [{"name": "trainer", "weight": 2.0, "share": 0.61, ...}, ...]
        w.close()              # stops asking
    """

    _esm = esm_source("pool")
    _css = pool_css()

    title = t.Unicode("pool of the Pathways service").tag(sync=True)
    data = t.Dict().tag(sync=True)
    palette = t.List(t.Unicode(), default_value=list(RUN_PALETTE)).tag(sync=True)
    window_s = t.Float(30.0).tag(sync=True)
    live = t.Bool(True).tag(sync=True)
    error = t.Unicode("").tag(sync=True)

    def __init__(self, fetch: Callable[[int], dict], *, window_s: float = 30.0, every_s: float = 1.0, **kwargs: Any):
        self._fetch = fetch
        self._every = float(every_s)
        self._due = 0.0
        self._lock = threading.Lock()
        super().__init__(window_s=float(window_s), **kwargs)
        self.refresh()
        ticker.add(self)

    def refresh(self) -> dict:
        """Ask the service now (the latest ``window_s`` seconds of activity); returns the dict the view shows."""
        with self._lock:
            data = self._fetch(-int(self.window_s * 1e9))
            self.data = data
        return data

    def _tick(self, now: float) -> float | None:
        if self.comm is None:  # closed
            self.stop()
            return None
        if now < self._due:
            return self._due
        try:
            self.refresh()
        except Exception as e:  # (the service is gone, or this client was dropped: say so, stop asking)
            self.error = f"pw.pool(): stopped refreshing: {type(e).__name__}: {e}"
            self.stop()
            return None
        self._due = now + self._every
        return self._due

    def stop(self) -> None:
        """Stop refreshing (the view keeps the last picture)."""
        self._unfollow()
        self.live = False

    def close(self) -> None:
        if not sys.is_finalizing():  # (ipywidgets closes what is left at exit, when the ticker is gone)
            self.stop()
        super().close()

    def static_html(self) -> str:
        return pool_html(self.data, self.palette)


def pool_html(data: dict, palette: list[str] | tuple[str, ...] = RUN_PALETTE) -> str:
    """The pool dict as static HTML: a row per client (colour, weight, share, runs queued, memory, device time)."""
    rows = []
    for c in data.get("clients", []):
        colour = palette[int(c.get("colour") or 0) % len(palette)]
        name = esc(c["name"]) + (" (you)" if c.get("you") else "") + ("" if c.get("connected") else " (gone)")
        cells = [
            f'<span style="display:inline-block;width:10px;height:10px;background:{esc(colour)}"></span> {name}',
            esc("–" if c.get("weight") is None else f"{c['weight']:g}"), f"{100 * (c.get('share') or 0):.1f}%",
            esc(c.get("queued", 0)), esc(fmt_bytes(int(c.get("memory_bytes") or 0))),
            esc("–" if c.get("device_time_s") is None else fmt_ns(c["device_time_s"] * 1e9)),
        ]
        rows.append("<tr>" + "".join(f'<td style="padding:1px 10px 1px 0">{x}</td>' for x in cells) + "</tr>")
    head = "".join(
        f'<th style="text-align:left;padding:1px 10px 1px 0">{h}</th>'
        for h in ("client", "weight", "share (10 s)", "runs queued", "memory held", "device time")
    )
    n_dev = len(data.get("devices", []))
    n_spans = len(data.get("spans", {}).get("start", []))
    return page(
        f"<b>pool of the Pathways service</b>: {n_dev} devices, {n_spans} node spans"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>",
        "pw-pool",
    )


__all__ = ["PoolWidget", "pool_css", "pool_html"]

"""The service's dashboard: the pool view (`pw.pool()`'s) as a web page, on 127.0.0.1, for whoever runs the box.

``python -m pw_kernel serve --dashboard PORT`` starts a `Dashboard` beside the
service: Python's `http.server` on a thread of its own, bound to 127.0.0.1
only. ``GET /`` is the page: the widget's own front-end (``/pool.js``, the
same ES module `PoolWidget` runs in a notebook) mounted on a small stand-in for
a widget model, which polls ``GET /pool.json?since=NS`` and sets its ``data``.
``/pool.json`` is `pool.pool_data`, computed in this process as a client's
`Pool` request is (``since`` < 0: the last ``-since`` ns of activity).

It is read-only and asks for no key: it shows every client's name and timings
to whoever can open 127.0.0.1:PORT on this host (as the service's devices'
own tools would). A request naming another host (a page elsewhere that
rebinds its name to 127.0.0.1) is refused.

Example::

    board = Dashboard(lambda since_ns: pool_data(record, state.clients, devices, since_ns), port=8765)
    board.url          # 'http://127.0.0.1:8765/'
    board.stop()
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..runtime import ArgumentError, PathwaysError

log = logging.getLogger("pw_kernel.service")

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>pw_kernel: the service's pool</title>
<style>body{margin:12px;background:#fff}</style><style>%(css)s</style></head>
<body><div id="pool"></div>
<script type="module">
import view from "./pool.js";
const config = %(config)s;
const asked = Number(new URLSearchParams(location.search).get("window"));
const state = {data: {}, palette: config.palette, window_s: asked > 0 ? asked : config.window_s, title: config.title,
               live: true, error: ""};
const handlers = new Map();
const model = {  // what the view reads of a widget's model: its traits and their change events
  get: (k) => state[k],
  set: (k, v) => { state[k] = v; (handlers.get(`change:${k}`) || []).forEach((f) => f()); },
  on: (n, f) => { if (!handlers.has(n)) handlers.set(n, []); handlers.get(n).push(f); },
  off: (n, f) => handlers.set(n, (handlers.get(n) || []).filter((g) => g !== f)),
  send: () => {}, save_changes: () => {},
};
view.render({model, el: document.getElementById("pool")});
async function poll() {
  try {
    const r = await fetch(`./pool.json?since=${-Math.round(state.window_s * 1e9)}`, {cache: "no-store"});
    if (!r.ok) throw new Error(`${r.status}: ${await r.text()}`);
    const data = await r.json();
    model.set("error", "");
    model.set("live", true);
    model.set("data", data);
  } catch (e) {
    model.set("error", `the service did not answer (${e.message || e}); trying again`);
    model.set("live", false);
  }
  setTimeout(poll, config.every_s * 1000);
}
poll();
</script></body></html>
"""


class Dashboard:
    """The pool view as a web page on 127.0.0.1:``port`` (0: a free one), served from a thread; `stop` ends it.

    ``data(since_ns)`` is the pool dict (`pool.pool_data`); ``window_s`` the
    seconds of activity the page shows (``/?window=S`` changes it), ``every_s``
    how often it asks again.

    Example::

        board = Dashboard(lambda since_ns: {...}, port=0)
        print(board.url)
        board.stop()
    """

    def __init__(self, data: Callable[[int], dict], port: int = 0, *, window_s: float = 30.0, every_s: float = 1.0):
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ArgumentError(f"`serve(dashboard=...)` takes a TCP port (0-65535, 0: any free one); got {port!r}.")
        self.data = data
        self._page = self._render_page(window_s, every_s)
        from ..widgets.esm import esm_source

        self._js = esm_source("pool").encode()
        try:
            self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        except OSError as e:
            raise PathwaysError(
                f"`serve --dashboard {port}`: cannot listen on 127.0.0.1:{port} ({e.strerror or e}). Pick another "
                f"port, or 0 for any free one."
            ) from None
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self._thread = threading.Thread(target=self.server.serve_forever, name="pw-service-dashboard", daemon=True)
        self._thread.start()

    @staticmethod
    def _render_page(window_s: float, every_s: float) -> bytes:
        from ..widgets._html import RUN_PALETTE
        from ..widgets.pool import pool_css

        config = {"palette": list(RUN_PALETTE), "window_s": float(window_s), "every_s": float(every_s),
                  "title": "pool of the Pathways service"}
        text = PAGE % {"css": pool_css(), "config": json.dumps(config).replace("</", "<\\/")}
        return text.encode()

    def _handler(self) -> type:
        board = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                host = (self.headers.get("Host") or "").lower()
                if host not in (f"127.0.0.1:{board.port}", f"localhost:{board.port}"):
                    return self._send(403, "text/plain", b"the dashboard answers requests for 127.0.0.1 only")
                url = urllib.parse.urlsplit(self.path)
                if url.path in ("/", "/index.html"):
                    return self._send(200, "text/html; charset=utf-8", board._page)
                if url.path == "/pool.js":
                    return self._send(200, "text/javascript; charset=utf-8", board._js)
                if url.path == "/pool.json":
                    return self._pool(urllib.parse.parse_qs(url.query).get("since", ["0"])[0])
                return self._send(404, "text/plain", b"not here: / is the dashboard, /pool.json its data")

            def _pool(self, since: str) -> None:
                try:
                    since_ns = int(since)
                except ValueError:
                    return self._send(400, "text/plain", f"since must be an integer of ns; got {since!r}".encode())
                try:
                    body = json.dumps(board.data(since_ns)).encode()
                except Exception as e:  # (the service is stopping: the page says so and asks again)
                    log.debug("pw_kernel dashboard: /pool.json failed", exc_info=True)
                    return self._send(500, "text/plain", f"{type(e).__name__}: {e}".encode())
                self._send(200, "application/json", body)

            def _send(self, code: int, kind: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
                log.debug("pw_kernel dashboard: " + format, *args)

        return Handler

    def stop(self) -> None:
        """Stop serving the page (idempotent)."""
        if self._thread.is_alive():
            self.server.shutdown()
        self.server.server_close()


__all__ = ["Dashboard"]

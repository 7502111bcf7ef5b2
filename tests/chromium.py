"""Debian's Chromium for the browser tests and the timeline benchmark (Playwright drives it; it downloads nothing)."""

from __future__ import annotations

import contextlib
import os
import tempfile

CHROMIUM = os.environ.get("PW_CHROMIUM", "/usr/bin/chromium")
#: Headless, no sandbox (root), and none of the background traffic a closed network refuses.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def available() -> bool:
    return os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)


#: A stand-in for the ipywidgets model: `await mount(src, state, width)` renders a widget's ES module into a new
#: element (``width``: its CSS width, optional) and returns {model, el, sent, emit, cleanup, root}; ``sent`` holds
#: what the front-end sent to the kernel, ``emit(name, ...)`` fires model events such as ``msg:custom``.
MOUNT = """
window.mount = async (src, state, width) => {
  const handlers = new Map();
  const sent = [];
  const model = {
    get: (k) => state[k],
    set: (k, v) => { state[k] = v; (handlers.get(`change:${k}`) || []).forEach((f) => f()); },
    on: (n, f) => { if (!handlers.has(n)) handlers.set(n, []); handlers.get(n).push(f); },
    off: (n, f) => handlers.set(n, (handlers.get(n) || []).filter((g) => g !== f)),
    send: (m) => sent.push(m),
    save_changes: () => {},
  };
  const mod = (await import(URL.createObjectURL(new Blob([src], {type: 'text/javascript'})))).default;
  const el = document.createElement('div');
  if (width) el.style.width = width;
  document.body.appendChild(el);
  const cleanup = mod.render({model, el});
  const emit = (name, ...args) => (handlers.get(name) || []).forEach((f) => f(...args));
  return {model, el, sent, emit, cleanup, root: el.querySelector('.pw-w') || el.firstElementChild};
};
"""


@contextlib.contextmanager
def widget_page(css: str, script: str = "", viewport: dict | None = None):
    """A Chromium page (fresh profile) with the widgets' ``css``, `MOUNT` and ``script``; dialogs are recorded.

    Example::

        with widget_page(css) as page:
            page.evaluate("async (src) => { window.w = await mount(src, {}); }", js_source)
    """
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            pg = ctx.new_page()
            if viewport:
                pg.set_viewport_size(viewport)
            pg.set_content(f"<html><head><style>{css}</style></head><body></body></html>")
            pg.add_script_tag(content=MOUNT + script)
            pg.dialogs = []
            pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
            yield pg
        finally:
            ctx.close()

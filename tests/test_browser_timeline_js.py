"""The timeline's front-end on its own in Chromium: the chunk protocol, level of detail at 100,000 events, escaping.

The ES module runs against a stand-in for the ipywidgets model, fed with the
very bytes `EventEncoder` produces; no Jupyter involved (that is
test_browser_widgets.py), so these checks are quick and exact.
"""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path

import pytest

from chromium import CHROMIUM, available  # noqa: E402

if not available():
    pytest.skip(f"no Chromium at {CHROMIUM} (scripts/setup.sh installs Debian's chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="pip install playwright (the browser itself is Debian's chromium)")

from playwright.sync_api import sync_playwright  # noqa: E402

from pw_kernel.runtime import NodeEvent  # noqa: E402
from pw_kernel.widgets import _html  # noqa: E402
from pw_kernel.widgets.timeline_widget import EventEncoder  # noqa: E402

pytestmark = pytest.mark.timeout(120)

STATIC = Path(__file__).resolve().parent.parent / "pw_kernel" / "widgets" / "static"
HOSTILE = "<img src=x onerror=alert(1)>"
from chromium import CHROMIUM_ARGS as ARGS  # noqa: E402, I001
HARNESS = """
window.b64 = (s) => { const bin = atob(s); const u = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i); return new DataView(u.buffer); };
window.mount = async (src, state) => {
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
  document.body.appendChild(el);
  const cleanup = mod.render({model, el});
  const emit = (name, ...args) => (handlers.get(name) || []).forEach((f) => f(...args));
  return {model, el, sent, emit, cleanup, root: el.querySelector('.pw-timeline')};
};
"""


def events(n, run=0, program="p", seed=0):
    out = []
    t = 0
    for k in range(n):
        devs = (k % 8,) if k % 10 else (0, 4)
        kind = "transfer" if k % 10 == 0 else "compute"
        src = 1 if kind == "transfer" else None
        ev = NodeEvent(k, run + k // 1000, program, "default", f"node{k % 17}", kind, devs, 0, src, t, 1024, "f32[8]")
        ev.start, ev.end = t, t + 5_000 + (k % 7) * 1000
        t += 1_300
        out.append(ev)
    return out


def wire(meta, buffers):
    """A chunk message as the page gets it: content, and base64 for the three buffers."""
    return meta, [base64.b64encode(b).decode() for b in buffers]


def state_for(enc, runs, base=True, **extra):
    meta, (measures, ids, bars) = enc.pack(0)
    # the wire names are the typed arrays the front-end builds: Float64Array, Uint32Array
    b64 = {k: base64.b64encode(v).decode() for k, v in (("f64", measures), ("u32", ids), ("bars", bars))}
    st = {
        "title": "t",
        "lanes": enc.lanes,
        "runs": runs,
        "palette": list(_html.RUN_PALETTE),
        "color_by": "run",
        "live": True,
        "n_events": enc.n_events if base else 0,
        "n_chunks": len(enc.chunks) if base else 0,
        "uid": os.urandom(6).hex(),
        "_base": {**meta, **b64} if base else {},
    }
    st.update(extra)
    return st


MOUNT = """async ([src, st]) => {
    if (st._base && st._base.f64) st._base = {...st._base, f64: b64(st._base.f64), u32: b64(st._base.u32),
                                               bars: b64(st._base.bars)};
    window.w = await mount(src, st);
    return window.w.root.dataset.events;
}"""


@pytest.fixture(scope="module")
def page():
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True, args=ARGS)
        pg = ctx.new_page()
        pg.set_content(f"<html><head><style>{(STATIC / 'widgets.css').read_text()}</style></head><body></body></html>")
        pg.add_script_tag(content=HARNESS)
        pg.dialogs = []
        pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
        yield pg
        ctx.close()


def test_chunks_apply_in_order_and_a_gap_asks_the_kernel(page):
    enc = EventEncoder([(d, f"cpu:{d}", 0) for d in range(8)])
    chunks = [enc.encode(events(50)), enc.encode(events(30)), enc.encode(events(20))]
    assert all(chunks)
    st = state_for(enc, [{"id": 0, "name": "p", "tenant": "default", "state": "running"}], base=False)
    page.evaluate(MOUNT, [(STATIC / "timeline.js").read_text(), st])
    send = """([meta, bufs]) => {
        window.w.emit('msg:custom', meta, bufs.map(b64));
        return window.w.root.dataset.events;
    }"""
    assert page.evaluate(send, wire(*enc.pack(0, 1))) in ("0", None)  # applied; drawn on the next frame
    page.wait_for_function("() => window.w.root.dataset.events === '50'")
    page.evaluate(send, wire(*enc.pack(2, 3)))  # chunk 1 never arrived: ask for what we lack
    assert page.evaluate("() => window.w.sent") == [{"type": "sync", "have": 1}]
    page.evaluate(send, wire(*enc.pack(1, 3)))  # the kernel's answer: chunks 1..2 in one message
    page.wait_for_function("() => window.w.root.dataset.events === '100'")
    page.evaluate(send, wire(*enc.pack(1, 2)))  # a duplicate is ignored
    page.wait_for_function("() => window.w.root.dataset.events === '100'")
    page.evaluate("() => window.w.cleanup()")


def test_a_hundred_thousand_events_redraw_fast_with_level_of_detail(page):
    enc = EventEncoder([(d, f"cpu:{d}", 0) for d in range(8)])
    enc.encode(events(100_000))
    runs = [{"id": r, "name": f"run{r}", "tenant": "default", "state": "done"} for r in range(100)]
    st = state_for(enc, runs)
    assert page.evaluate(MOUNT, [(STATIC / "timeline.js").read_text(), st]) == "100000"
    stats = page.evaluate(
        """() => { const tl = window.w.root.pwTimeline; tl.redraw(); const ms = [];
                   for (let i = 0; i < 5; i++) ms.push(tl.redraw());
                   const full = tl.stats(); tl.setView(full.tmin, full.tmin + (full.tmax - full.tmin) / 50);
                   const zoomed = tl.redraw(); return {...full, full: Math.min(...ms), zoomed}; }"""
    )
    assert stats["events"] == 100_000 and stats["lanes"] == 9
    assert stats["rects"] < stats["bars"] / 5, stats  # merged: canvas calls bounded by pixels, not bars
    assert stats["full"] < 250 and stats["zoomed"] < 100, stats  # loose bounds; the benchmark gives real numbers
    page.evaluate("() => window.w.cleanup()")


def test_names_are_text_in_labels_legend_and_tooltip(page):
    enc = EventEncoder([(0, HOSTILE, 0)])
    ev = NodeEvent(0, 3, HOSTILE, HOSTILE, HOSTILE, "compute", (0,), 0, None, 0, 8, HOSTILE)
    ev.start, ev.end = 0, 1_000_000
    enc.encode([ev])
    st = state_for(enc, [{"id": 3, "name": HOSTILE, "tenant": HOSTILE, "state": "done"}], title=HOSTILE)
    page.evaluate(MOUNT, [(STATIC / "timeline.js").read_text(), st])
    root = page.locator(".pw-timeline").last
    assert root.locator(".pw-tl-lane-label").first.inner_text() == HOSTILE
    assert HOSTILE in root.locator(".pw-tl-legend").inner_text()
    assert root.locator(".pw-title").inner_text() == HOSTILE
    box = root.locator("canvas").bounding_box()
    root.locator("canvas").hover(position={"x": box["width"] / 2, "y": 22 + 5})
    tip = root.locator(".pw-tip")
    assert tip.is_visible() and tip.inner_text().startswith(HOSTILE)
    assert page.locator("img").count() == 0 and page.dialogs == []
    page.evaluate("() => window.w.cleanup()")

"""The timeline's front-end on its own in Chromium: the chunk protocol, level of detail at 100,000 events, escaping,
what the picture tells a reader (legend, bars kept apart, time axis), and the run widget's labelled mini timeline.

The ES module (`esm_source`: the shared prelude and the widget's files, as
the widget loads it) runs against a stand-in for the ipywidgets model, fed with the
very bytes `EventEncoder` produces; no Jupyter involved (that is
test_browser_widgets.py), so these checks are quick and exact.
"""

from __future__ import annotations

import base64
import os
import re

import pytest

from chromium import CHROMIUM, available  # noqa: E402

if not available():
    pytest.skip(f"no Chromium at {CHROMIUM} (scripts/setup.sh installs Debian's chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="pip install playwright (the browser itself is Debian's chromium)")

from chromium import widget_page  # noqa: E402
from pw_kernel.runtime import NodeEvent  # noqa: E402
from pw_kernel.widgets import _html  # noqa: E402
from pw_kernel.widgets.esm import STATIC, esm_source  # noqa: E402
from pw_kernel.widgets.timeline_encoder import EventEncoder  # noqa: E402
from timeline_events import chained_layers, node  # noqa: E402

pytestmark = pytest.mark.timeout(120)

HOSTILE = "<img src=x onerror=alert(1)>"
HARNESS = """
// Record the text drawn on canvases (the time axis), as a person reads it off the screen.
window.texts = [];
const fillText = CanvasRenderingContext2D.prototype.fillText;
CanvasRenderingContext2D.prototype.fillText = function (t, ...rest) {
  window.texts.push(String(t));
  return fillText.call(this, t, ...rest);
};
window.b64 = (s) => { const bin = atob(s); const u = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i); return new DataView(u.buffer); };
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
    with widget_page((STATIC / "widgets.css").read_text(), HARNESS) as pg:
        yield pg


def test_chunks_apply_in_order_and_a_gap_asks_the_kernel(page):
    enc = EventEncoder([(d, f"cpu:{d}", 0) for d in range(8)])
    chunks = [enc.encode(events(50)), enc.encode(events(30)), enc.encode(events(20))]
    assert all(chunks)
    st = state_for(enc, [{"id": 0, "name": "p", "tenant": "default", "state": "running"}], base=False)
    page.evaluate(MOUNT, [esm_source("timeline"), st])
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


def test_a_hundred_thousand_events_redraw_with_level_of_detail(page):
    # What a redraw does is counted, not timed: the canvas calls are bounded by pixels, not by bars, and a zoom
    # visits only the bars in view. (How long it takes: benchmarks/timeline_redraw.py, medians and p95.)
    enc = EventEncoder([(d, f"cpu:{d}", 0) for d in range(8)])
    enc.encode(events(100_000))
    runs = [{"id": r, "name": f"run{r}", "tenant": "default", "state": "done"} for r in range(100)]
    st = state_for(enc, runs)
    assert page.evaluate(MOUNT, [esm_source("timeline"), st]) == "100000"
    full, zoomed, width = page.evaluate(
        """() => { const tl = window.w.root.pwTimeline; tl.redraw(); const full = tl.stats();
                   tl.setView(full.tmin, full.tmin + (full.tmax - full.tmin) / 50); tl.redraw();
                   return [full, tl.stats(), window.w.root.querySelector('canvas').clientWidth]; }"""
    )
    assert full["events"] == 100_000 and full["lanes"] == 9
    # every bar is in the full view; merged, the canvas calls are far fewer than the bars ...
    assert full["bars"] >= 100_000 and full["rects"] < full["bars"] / 5, full
    # ... and at most two per pixel column of each lane (bars, and transfers drawn low on device lanes)
    pixels = 2 * full["lanes"] * (width + 2)
    assert full["rects"] <= pixels and zoomed["rects"] <= pixels, (full, zoomed, width)
    # a zoom to a fiftieth of the span looks at about a fiftieth of the bars, not all of them
    assert 0 < zoomed["bars"] <= full["bars"] / 50 + 2 * zoomed["lanes"], (full, zoomed)
    page.evaluate("() => window.w.cleanup()")


def test_names_are_text_in_labels_legend_and_tooltip(page):
    enc = EventEncoder([(0, HOSTILE, 0)])
    ev = NodeEvent(0, 3, HOSTILE, HOSTILE, HOSTILE, "compute", (0,), 0, None, 0, 8, HOSTILE)
    ev.start, ev.end = 0, 1_000_000
    enc.encode([ev])
    st = state_for(enc, [{"id": 3, "name": HOSTILE, "tenant": HOSTILE, "state": "done"}], title=HOSTILE)
    page.evaluate(MOUNT, [esm_source("timeline"), st])
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


# ------------------------------------------------------------ what a reader sees
BLUE = (0x4E, 0x79, 0xA7)  # the first run's colour
AXIS_TEXT = "() => { window.texts = []; window.w.root.pwTimeline.redraw(); return window.texts; }"
PIXEL_ROW = """(lane) => {
    const root = window.w.root;
    const canvas = root.querySelector('canvas');
    const label = root.querySelector(`.pw-tl-lane-label[data-lane="${lane}"]`).getBoundingClientRect();
    const box = canvas.getBoundingClientRect();
    const dpr = canvas.width / box.width;
    const y = Math.round((label.top + label.height / 2 - box.top) * dpr);
    return Array.from(canvas.getContext('2d').getImageData(0, y, canvas.width, 1).data);
}"""


def mount(page, evs, devices=range(4), islands=None, runs=None):
    enc = EventEncoder([(d, f"cpu:{d}", (islands or {}).get(d, 0)) for d in devices])
    enc.encode(evs)
    st = state_for(enc, runs or [{"id": 0, "name": "layers", "tenant": "default", "state": "done"}], live=False)
    page.evaluate(MOUNT, [esm_source("timeline"), st])
    page.evaluate("() => window.w.root.pwTimeline.redraw()")
    return page.locator(".pw-timeline").last


def bar_runs(pixels, colour=BLUE):
    """How many separate stretches of ``colour`` a row of RGBA pixels shows."""
    on = [
        px[3] > 200 and all(abs(px[i] - colour[i]) < 24 for i in range(3))
        for px in (pixels[i : i + 4] for i in range(0, len(pixels), 4))
    ]
    return sum(1 for k, v in enumerate(on) if v and (k == 0 or not on[k - 1]))


def test_legend_explains_compile_bars_and_merged_transfers(page):
    islands = {d: 0 if d < 4 else 1 for d in range(8)}
    evs = [node(0, "compile layer", 0, 3_000_000, devices=(), kind="compile")]
    evs += [node(1 + k, "layer", 3_000_000 + k * 1_000_000, 4_000_000 + k * 1_000_000, (0, 1, 2, 3)) for k in range(6)]
    # hundreds of short transfers, far closer together than a pixel: drawn as shaded strips
    for k in range(400):
        t = 3_000_000 + k * 15_000
        evs.append(node(100 + k, "transfer", t, t + 5_000, (0,), "transfer", island=0, src=0))
        evs.append(node(600 + k, "transfer", t, t + 5_000, (4,), "transfer", island=1, src=0))
    tl = mount(page, evs, devices=range(8), islands=islands)
    legend = tl.locator(".pw-tl-legend").inner_text()
    for entry in ("host: compile, checkpoint", "transfer", "cross-island transfer", "transfers merged at this zoom",
                  "cross-island transfers merged"):  # fmt: skip
        assert entry in legend, legend
    # the strip is really there, dark grey, on the intra-island transfer lane
    strip = page.evaluate(PIXEL_ROW, "xfer:0:0")
    dark = [strip[i : i + 4] for i in range(0, len(strip), 4) if strip[i + 3] > 100 and max(strip[i : i + 3]) < 140]
    assert len(dark) > 50
    # a timeline of compute alone lists only what it draws
    plain = mount(page, chained_layers())
    legend = plain.locator(".pw-tl-legend").inner_text()
    assert "compile" not in legend and "merged" not in legend, legend
    page.evaluate("() => window.w.cleanup()")


def test_six_chained_layers_show_as_six_bars(page):
    tl = mount(page, chained_layers(6))
    for d in range(4):
        assert bar_runs(page.evaluate(PIXEL_ROW, f"dev:{d}")) == 6, d
    assert tl.get_attribute("data-bar-gaps") == "20"  # 5 cuts on each of 4 devices
    # zoomed far out the layers are thinner than a pixel: they merge (level of detail)
    page.evaluate("() => { const s = window.w.root.pwTimeline.stats(); window.w.root.pwTimeline.setView("
                  "s.tmin - 1e9, s.tmin + 1e9); window.w.root.pwTimeline.redraw(); }")  # fmt: skip
    assert bar_runs(page.evaluate(PIXEL_ROW, "dev:0")) == 1
    assert tl.get_attribute("data-bar-gaps") == "0"
    page.evaluate("() => window.w.cleanup()")


def test_time_axis_starts_at_0_ns_and_labels_differ_zoomed_far_in(page):
    tl = mount(page, chained_layers(20))  # 20 ms of layers
    labels = page.evaluate(AXIS_TEXT)
    assert labels[0] == "0 ns" and len(labels) >= 3, labels
    assert len(set(labels)) == len(labels), labels
    # zoom in with the mouse wheel around 14.1 ms, down to a window of a microsecond or so
    canvas = tl.locator("canvas")
    box = canvas.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.70, box["y"] + box["height"] / 2)
    for _ in range(12):
        page.mouse.wheel(0, -600)
    page.wait_for_function(
        "() => /in view [\\d.]+ (ns|µs)/.test(window.w.root.querySelector('.pw-tl-stats').textContent)"
    )
    labels = page.evaluate(AXIS_TEXT)
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
    assert all(re.fullmatch(r"1\d\.\d{4,} ms", x) for x in labels), labels  # ms since the start, to the tick
    page.evaluate("() => window.w.cleanup()")


RUN_STATE = {
    "run_id": 4, "name": "layers", "program": "layers", "state": "done", "done": 6, "total": 6, "elapsed": 0.01,
    "error": "", "mode": "chained", "tenant": "default", "outputs": [],
}  # fmt: skip


def test_run_widget_mini_timeline_says_what_it_shows(page):
    lanes = [f"cpu:{d}" for d in range(3)] + [HOSTILE]
    bars = [lane for k in range(6) for lane in (k % 4, k * 1e6 / 3, (k + 1) * 1e6 / 3, 0)] + [3, 0, 2e6, 2]
    st = {**RUN_STATE, "lanes": lanes, "bars": bars}
    page.evaluate(MOUNT, [esm_source("run"), st])
    run = page.locator(".pw-run").last
    caption = run.locator(".pw-run-mini-caption").inner_text()
    assert "nodes on each device over time" in caption and "compute" in caption and "transfer" in caption
    assert "glue" not in caption  # the key lists the kinds drawn
    assert run.locator(".pw-run-mini-label").all_inner_texts() == lanes  # a name per row, as text
    assert run.locator(".pw-run-mini-scale span").all_inner_texts() == ["0 ns", "2 ms"]
    assert page.locator("img").count() == 0 and page.dialogs == []
    page.evaluate("() => window.w.cleanup()")
    # many devices: rows too thin for a name each; the first and last are named
    many = [f"cpu:{d}" for d in range(32)]
    page.evaluate(MOUNT, [esm_source("run"), {**RUN_STATE, "lanes": many, "bars": [0, 0, 1e6, 0]}])
    assert page.locator(".pw-run").last.locator(".pw-run-mini-label").all_inner_texts() == ["cpu:0", "cpu:31"]
    page.evaluate("() => window.w.cleanup()")

"""Timeline widget redraw time in Chromium for 100,000 node events (zoom, pan, full view).

    python benchmarks/timeline_redraw.py [--events 100000] [--repeats 40] [--json out.json] [--screenshot out.png]

The widget's own front-end (``pw_kernel/widgets/static/timeline.js``) runs in
headless Chromium (``/usr/bin/chromium`` through Playwright) against a small
stand-in for the ipywidgets model; its data is the very encoding the Python
side produces (`EventEncoder`) for synthetic events shaped like a real
multi-program workload: 8 devices in two islands, slices of 2 and 4 devices,
10% transfers (half of them across islands), 1,000 runs. We time synchronous
redraws (`root.pwTimeline.redraw()`) of: the full view (every bar in view),
wheel zooms around random points, and drag pans, and report median / p95 /
max milliseconds. The target: a zoom or pan redraws in under 50 ms.
Also reported: Python-side encoding cost per event and the static HTML time.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pw_kernel.runtime.events import NodeEvent  # noqa: E402
from pw_kernel.widgets import _html  # noqa: E402
from pw_kernel.widgets.timeline_widget import EventEncoder, timeline_html  # noqa: E402

STATIC = ROOT / "pw_kernel" / "widgets" / "static"
sys.path.insert(0, str(ROOT / "tests"))
from chromium import CHROMIUM, CHROMIUM_ARGS  # noqa: E402 - the flags the browser tests use

# A stand-in for the anywidget model: get / set / on / off / send / save_changes.
FAKE_MODEL = """
window.makeModel = (state) => {
  const handlers = new Map();
  return {
    get: (k) => state[k],
    set: (k, v) => { state[k] = v; (handlers.get(`change:${k}`) || []).forEach((f) => f()); },
    on: (name, f) => { if (!handlers.has(name)) handlers.set(name, []); handlers.get(name).push(f); },
    off: (name, f) => { const a = handlers.get(name) || []; handlers.set(name, f ? a.filter((g) => g !== f) : []); },
    send: (msg) => { (window.sent = window.sent || []).push(msg); },
    save_changes: () => {},
    emit: (name, ...args) => (handlers.get(name) || []).forEach((f) => f(...args)),
  };
};
window.b64 = (s) => { const bin = atob(s); const u = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i); return new DataView(u.buffer); };
"""


def synthetic_events(n: int = 100_000, runs: int = 1000, seed: int = 0) -> list[NodeEvent]:
    """Events like a multi-program workload on 8 devices in two islands."""
    rng = np.random.default_rng(seed)
    slices = [(0, 1, 2, 3), (4, 5, 6, 7), (0, 1), (2, 3), (4, 5), (6, 7)]
    island = {d: 0 if d < 4 else 1 for d in range(8)}
    free = np.zeros(8)
    durs = rng.lognormal(math.log(150_000), 0.9, size=n)  # ns, median 150 µs
    out = []
    for k in range(n):
        run = k * runs // n
        if rng.random() < 0.1:
            src = slices[rng.integers(0, 2)]
            dst = slices[rng.integers(0, 6)]
            devs = tuple(dict.fromkeys(src + dst))
            kind, name, src_island = "transfer", "transfer", island[src[0]]
            isl = island[dst[0]]
            dur = durs[k] * 0.3
        else:
            devs = slices[rng.integers(0, 6)]
            kind = "compute" if rng.random() < 0.8 else "glue"
            name = f"layer{rng.integers(0, 24)}"
            src_island, isl, dur = None, island[devs[0]], durs[k]
        start = max(free[list(devs)]) + rng.exponential(20_000)
        end = start + dur
        free[list(devs)] = end
        ev = NodeEvent(
            k,
            run,
            f"train_step_{run % 7}",
            f"tenant{run % 3}",
            name,
            kind,
            devs,
            isl,
            src_island,
            int(start),
            4096 * len(devs),
            "f32[128,1024] -> f32[128,1024]",
        )
        ev.start, ev.end = int(start), int(end)
        out.append(ev)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--json", default=None, help="write results here")
    ap.add_argument("--screenshot", default=None, help="save a PNG of the widget here")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    events = synthetic_events(args.events)
    devices = [(d, f"cpu:{d}", 0 if d < 4 else 1) for d in range(8)]
    enc = EventEncoder(devices)
    t = time.perf_counter()
    enc.encode(events)
    encode_s = time.perf_counter() - t
    meta, (f64, u32, bars) = enc.pack(0)
    runs = [{"id": r, "name": f"train_step_{r % 7}", "tenant": f"tenant{r % 3}", "state": "done"} for r in range(1000)]
    t = time.perf_counter()
    f64a, u32a, barsa, strings = enc.arrays()
    static = timeline_html("bench", enc.lanes, runs, list(_html.RUN_PALETTE), "run", f64a, u32a, barsa, strings)
    static_s = time.perf_counter() - t
    state = {
        "title": f"{args.events:,} synthetic events",
        "lanes": enc.lanes,
        "runs": runs,
        "palette": list(_html.RUN_PALETTE),
        "color_by": "run",
        "live": False,
        "n_events": enc.n_events,
        "n_chunks": 1,
        "uid": "bench",
    }
    base = {
        **meta,
        "f64": base64.b64encode(f64).decode(),
        "u32": base64.b64encode(u32).decode(),
        "bars": base64.b64encode(bars).decode(),
    }

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1200, "height": 800},
        )
        page = ctx.new_page()
        page.set_content(
            f"<html><head><style>{(STATIC / 'widgets.css').read_text()}</style></head>"
            f"<body style='margin:8px;width:1100px'><div id='host'></div></body></html>"
        )
        page.add_script_tag(content=FAKE_MODEL)
        page.evaluate(
            """async ([src, state, base]) => {
                const url = URL.createObjectURL(new Blob([src], {type: 'text/javascript'}));
                const mod = (await import(url)).default;
                state._base = {...base, f64: b64(base.f64), u32: b64(base.u32), bars: b64(base.bars)};
                window.model = makeModel(state);
                window.cleanup = mod.render({model: window.model, el: document.getElementById('host')});
            }""",
            [(STATIC / "timeline.js").read_text(), state, base],
        )
        page.wait_for_selector(f".pw-timeline[data-events='{enc.n_events}']")
        timings = page.evaluate(
            """(repeats) => {
                const root = document.querySelector('.pw-timeline');
                const tl = root.pwTimeline;
                const s = tl.stats();
                const full = [s.tmin, s.tmax];
                const out = {full: [], zoom: [], pan: [], zoom_deep: []};
                let seed = 1;
                const rnd = () => ((seed = (seed * 16807) % 2147483647) / 2147483647);
                tl.redraw();  // warm up (sorts lanes once)
                for (let i = 0; i < repeats; i++) { tl.fit(); out.full.push(tl.redraw()); }
                const canvas = root.querySelector('canvas');
                const r = canvas.getBoundingClientRect();
                for (let i = 0; i < repeats; i++) {
                    // a real wheel event: zoom in or out around a random point
                    tl.fit(); tl.redraw();
                    const ev = new WheelEvent('wheel', {deltaY: rnd() < 0.5 ? -240 : 240,
                        clientX: r.left + rnd() * r.width, clientY: r.top + 40, bubbles: true, cancelable: true});
                    canvas.dispatchEvent(ev);
                    out.zoom.push(tl.redraw());
                }
                for (let i = 0; i < repeats; i++) {
                    const span = (full[1] - full[0]) * (0.001 + 0.05 * rnd());
                    const t0 = full[0] + rnd() * (full[1] - full[0] - span);
                    tl.setView(t0, t0 + span);
                    out.zoom_deep.push(tl.redraw());
                }
                tl.setView(full[0], full[0] + (full[1] - full[0]) * 0.3); tl.redraw();
                for (let i = 0; i < repeats; i++) {
                    const x = r.left + r.width / 2;
                    const opts = (cx) => ({clientX: cx, clientY: r.top + 40, bubbles: true, pointerId: 1, button: 0});
                    canvas.dispatchEvent(new PointerEvent('pointerdown', opts(x)));
                    canvas.dispatchEvent(new PointerEvent('pointermove', opts(x - 15 - 30 * rnd())));
                    out.pan.push(tl.redraw());
                    canvas.dispatchEvent(new PointerEvent('pointerup', opts(x)));
                }
                out.stats = tl.stats();
                return out;
            }""",
            args.repeats,
        )
        if args.screenshot:
            page.evaluate(
                "() => { const tl = document.querySelector('.pw-timeline').pwTimeline; tl.fit(); tl.redraw(); }"
            )
            page.locator(".pw-timeline").screenshot(path=args.screenshot)
        version = ctx.browser.version if ctx.browser else "chromium"
        ctx.close()

    def summary(xs):
        xs = sorted(xs)
        return {"median_ms": statistics.median(xs), "p95_ms": xs[int(0.95 * (len(xs) - 1))], "max_ms": xs[-1]}

    result = {
        "events": enc.n_events,
        "bars": enc.n_bars,
        "lanes": len(enc.lanes),
        "chromium": version,
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "python_encode_us_per_event": 1e6 * encode_s / max(enc.n_events, 1),
        "python_static_html_s": static_s,
        "static_html_kb": len(static) / 1024,
        "redraw": {k: summary(timings[k]) for k in ("full", "zoom", "zoom_deep", "pan")},
        "last_stats": timings["stats"],
    }
    print(
        f"timeline redraw, {result['events']:,} events ({result['bars']:,} bars, {result['lanes']} lanes), "
        f"Chromium {version}:"
    )
    for k, v in result["redraw"].items():
        print(f"  {k:10s} median {v['median_ms']:6.2f} ms   p95 {v['p95_ms']:6.2f} ms   max {v['max_ms']:6.2f} ms")
    print(
        f"  python: encode {result['python_encode_us_per_event']:.2f} µs/event, "
        f"static html {static_s * 1e3:.0f} ms ({result['static_html_kb']:.0f} KiB)"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()

"""Timeline widget redraw time in Chromium for 100,000 node events (zoom, pan, full view).

    python benchmarks/timeline_redraw.py [--events 100000] [--repeats 40] [--json out.json] [--screenshot out.png] [--quick]

The widget's own front-end (its ``_esm``: ``pw_kernel/widgets/static/prelude.js`` and the
timeline's files, as ``pw_kernel.widgets.esm.esm_source("timeline")`` joins them) runs in
headless Chromium (``/usr/bin/chromium`` through Playwright) against a small
stand-in for the ipywidgets model, with the very trait state a `TimelineWidget`
built from synthetic events syncs to a front-end (`get_state()`); the events are shaped like a real
multi-program workload: 8 devices in two islands, slices of 2 and 4 devices,
10% transfers (half of them across islands), 1,000 runs. We time synchronous
redraws (`root.pwTimeline.redraw()`) of: the full view (every bar in view),
wheel zooms around random points, and drag pans, and report median / p95 /
max milliseconds. The target: a zoom or pan redraws in under 50 ms.
Also reported: the Python side's cost per event (building the widget: encoding
and packing) and the time of its static HTML. Without Playwright, anywidget or
Chromium the benchmark says so and exits cleanly.
"""

from __future__ import annotations

import argparse
import base64
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import pw_kernel as pw  # noqa: I001 - configures simulated CPU devices before JAX starts

import common

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import chromium  # noqa: E402 - the browser and flags the browser tests use

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


def device_layout(devices: int) -> tuple[int, list[tuple[int, ...]]]:
    """Islands and slices of the synthetic workload: on 8 devices, two islands of 4, slices of 4 and of 2.

    On fewer devices, the same shape where it fits: two islands when the count is even, one otherwise;
    a slice per island (the transfers' sources), then pairs within each island.
    """
    islands = 2 if devices >= 2 and devices % 2 == 0 else 1
    per = devices // islands
    big = [tuple(range(i * per, (i + 1) * per)) for i in range(islands)]
    pairs = [b[j:j + 2] for b in big for j in range(0, per - 1, 2)] if per > 2 else []
    return islands, big + pairs


def synthetic_events(n: int = 100_000, runs: int = 1000, seed: int = 0, devices: int = 8) -> list[pw.NodeEvent]:
    """Events like a multi-program workload on 8 devices in two islands (or on ``devices``: `device_layout`)."""
    rng = np.random.default_rng(seed)
    islands, slices = device_layout(devices)
    n_big = islands
    island = {d: d * islands // devices for d in range(devices)}
    free = np.zeros(devices)
    durs = rng.lognormal(math.log(150_000), 0.9, size=n)  # ns, median 150 µs
    out = []
    for k in range(n):
        run = k * runs // n
        if rng.random() < 0.1:
            src = slices[rng.integers(0, n_big)]
            dst = slices[rng.integers(0, len(slices))]
            devs = tuple(dict.fromkeys(src + dst))
            kind, name, src_island = "transfer", "transfer", island[src[0]]
            isl = island[dst[0]]
            dur = durs[k] * 0.3
        else:
            devs = slices[rng.integers(0, len(slices))]
            kind = "compute" if rng.random() < 0.8 else "glue"
            name = f"layer{rng.integers(0, 24)}"
            src_island, isl, dur = None, island[devs[0]], durs[k]
        start = max(free[list(devs)]) + rng.exponential(20_000)
        end = start + dur
        free[list(devs)] = end
        ev = pw.NodeEvent(
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
    args = common.parse_args(ap, argv, {"events": 2000, "repeats": 3})
    why = common.missing("playwright") or common.missing("anywidget")
    if why is None and not chromium.available():
        why = f"no Chromium at {chromium.CHROMIUM} (set PW_CHROMIUM)"
    if why:
        return common.skipped(args.json, "timeline_redraw", f"needs Playwright, anywidget and Chromium: {why}")
    from playwright.sync_api import sync_playwright

    from pw_kernel.widgets import TimelineWidget

    devices = min(8, len(pw.devices()))
    islands, _ = device_layout(devices)
    note = None
    if devices < 8:
        note = (f"timeline_redraw: the workload asks 8 devices in two islands, {len(pw.devices())} present: "
                f"its events are laid on {devices} device{'s' if devices > 1 else ''} in {islands} island"
                f"{'s' if islands > 1 else ''} instead")
        print(note)
    events = synthetic_events(args.events, devices=devices)
    c = pw.init(islands=islands)  # the widget's device lanes: 8 devices in two islands (or those present)
    t = time.perf_counter()
    widget = TimelineWidget(controller=c, events=events, live=False, title=f"{args.events:,} synthetic events")
    encode_s = time.perf_counter() - t
    t = time.perf_counter()
    static = widget.static_html()
    static_s = time.perf_counter() - t
    # What the front-end receives: the synced traits, the event columns in `_base` as binary buffers.
    state = widget.get_state()
    base, src, css = state.pop("_base"), state.pop("_esm"), state.pop("_css")
    state = {k: v for k, v in state.items() if not k.startswith("_") and k not in ("layout",)}
    for k in ("f64", "u32", "bars"):
        base[k] = base64.b64encode(base[k]).decode()
    n_events, n_bars, n_lanes = widget.n_events, base["n_bars"], len(widget.lanes)
    widget.close()
    pw.shutdown()

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            profile,
            executable_path=chromium.CHROMIUM,
            headless=True,
            args=chromium.CHROMIUM_ARGS,
            viewport={"width": 1200, "height": 800},
        )
        page = ctx.new_page()
        page.set_content(
            f"<html><head><style>{css}</style></head>"
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
            [src, state, base],
        )
        page.wait_for_selector(f".pw-timeline[data-events='{n_events}']")
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
        "benchmark": "timeline_redraw", "note": note,
        "events": n_events,
        "bars": n_bars,
        "lanes": n_lanes,
        "chromium": version,
        "machine": common.machine(),
        "python_encode_us_per_event": 1e6 * encode_s / max(n_events, 1),
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
        f"  python: widget built in {result['python_encode_us_per_event']:.2f} µs/event, "
        f"static html {static_s * 1e3:.0f} ms ({result['static_html_kb']:.0f} KiB)"
    )
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

// TimelineWidget front-end, part 3 of 3: the view. A canvas with a lane per device, per transfer path and for
// the host's compiles, a legend for every colour and pattern drawn, a utilization column; wheel zooms, drag pans,
// double-click fits, hover shows a bar's node, run and duration. Every string goes in through textContent.
// Loaded after prelude.js, timeline_store.js (the data) and timeline_draw.js (the canvas).

function render({ model, el }) {
  const store = storeFor(model);
  const detach = attach(model, store);

  const root = h("div", "pw-w pw-timeline");
  const { head, title, stats, live, legend, body, labels, plot, canvas, util, hint, tip } = laneFrame(
    "wheel: zoom · drag: pan · double-click: fit · hover: details · paler bars: several short bars merged at this zoom",
  );
  const controls = h("span", "pw-tl-controls");
  const fit = h("button", "", "fit");
  fit.title = "Fit the latest activity and follow new events (or double-click the plot); wheel out for earlier ones";
  const colourBy = h("select");
  for (const v of ["run", "program", "tenant"]) {
    const o = h("option", "", `colour by ${v}`);
    o.value = v;
    colourBy.appendChild(o);
  }
  controls.append(fit, colourBy);
  head.append(controls);
  root.append(head, legend, body, hint, tip);
  el.appendChild(root);

  let layout = { rows: [], height: AXIS_H, width: 0 };
  let labelEls = [];
  let utilEls = [];
  let colours = { mode: null, runsKey: null, version: -1, n: 0, idx: new Uint16Array(0) };
  let raf = 0;
  let lastDrawMs = 0;
  let drawn = { bars: 0, rects: 0, gaps: 0, axis: [] };
  let hover = null;
  const rects = new Rects();

  // ---- layout: display rows (devices first, then transfer paths) and DOM labels
  function buildLayout() {
    const lanes = model.get("lanes") || [];
    // each device, its XLA ops beneath it (a profile's: timeline_html.lane_order), then the rest
    const ops = new Map();
    lanes.forEach((l, k) => l.kind === "ops" && ops.set(l.device, k));
    const order = [];
    lanes.forEach((l, k) => {
      if (l.kind !== "device") return;
      order.push(k);
      if (ops.has(l.device)) order.push(ops.get(l.device));
    });
    lanes.forEach((l, k) => l.kind !== "device" && l.kind !== "ops" && order.push(k));
    const n = Math.max(order.length, 1);
    const devH = Math.max(6, Math.min(18, Math.floor(520 / n)));
    const xferH = Math.max(6, Math.min(14, devH));
    let y = AXIS_H;
    const rows = order.map((k) => {
      const lane = lanes[k];
      const hgt = lane.kind === "device" ? devH : xferH;
      const row = { lane: k, info: lane, y, h: hgt };
      y += hgt;
      return row;
    });
    layout = { rows, height: y + 2, width: layout.width };
    labels.replaceChildren();
    util.replaceChildren();
    labels.style.paddingTop = `${AXIS_H}px`;
    util.style.paddingTop = `${AXIS_H}px`;
    const font = `${Math.max(8, Math.min(11, devH - 4))}px`;
    labelEls = rows.map((r) => {
      const d = h("div", "pw-tl-lane-label", r.info.label);
      d.dataset.kind = r.info.kind;
      d.dataset.lane = r.info.key;
      d.style.height = d.style.lineHeight = `${r.h}px`;
      d.style.fontSize = font;
      if (r.info.cross) d.style.color = CROSS;
      d.title =
        r.info.kind === "device"
          ? `device lane ${r.info.label}`
          : r.info.kind === "ops"
            ? `XLA ops on ${r.info.label.replace(" · XLA ops", "")}, each under the node it ran in`
          : r.info.kind === "host"
            ? "host lane: compiling executables (a program's first call)"
            : `transfer path ${r.info.label}`;
      labels.appendChild(d);
      return d;
    });
    utilEls = rows.map((r) => {
      const d = h("div", "pw-tl-lane-util");
      d.style.height = `${r.h}px`;
      d.style.fontSize = font;
      const bar = h("span", "pw-tl-ubar");
      const fill = h("span");
      bar.appendChild(fill);
      const txt = h("span", "", "");
      d.append(bar, txt);
      util.appendChild(d);
      return { d, fill, txt };
    });
    root.dataset.lanes = String(rows.length);
    root.dataset.deviceLanes = String(rows.filter((r) => r.info.kind === "device").length);
  }

  // ---- colours: per event, an index into the palette (by run, program or tenant)
  function colourIndex() {
    const mode = model.get("color_by") || "run";
    const runs = model.get("runs") || [];
    const runsKey = runs.length ? `${runs.length}:${runs[0].id}:${runs[runs.length - 1].id}` : "0";
    if (colours.mode !== mode || colours.runsKey !== runsKey || colours.version > store.version || colours.n > store.nEv) {
      colours = { mode, runsKey, version: store.version, n: 0, idx: new Uint16Array(Math.max(store.nEv, 16)) };
    }
    if (colours.n === store.nEv) return colours.idx;
    colours.idx = grow(colours.idx, store.nEv);
    const idx = colours.idx;
    const u32 = store.u32;
    if (mode === "run") {
      const order = new Map(runs.map((r, k) => [r.id, k]));
      for (let i = colours.n; i < store.nEv; i++) {
        const run = u32[i * U];
        const k = order.get(run);
        idx[i] = k === undefined ? run : k;
      }
    } else {
      const c = mode === "program" ? 0 : 1;
      const order = store.order[c];
      for (let i = colours.n; i < store.nEv; i++) idx[i] = order.get(u32[i * U + 2 + c]) || 0;
    }
    colours.n = store.nEv;
    colours.version = store.version;
    return idx;
  }

  function legendEntries() {
    const palette = model.get("palette") || ["#4e79a7"];
    const mode = model.get("color_by") || "run";
    const out = [];
    if (mode === "run") {
      (model.get("runs") || []).forEach((r, k) =>
        out.push([palette[k % palette.length], `run ${r.id} ${r.name}${r.state && r.state !== "?" ? ` (${r.state})` : ""}`]),
      );
    } else {
      const order = store.order[mode === "program" ? 0 : 1];
      for (const [sid, k] of order) out.push([palette[k % palette.length], store.str(sid) ?? "?"]);
    }
    return out;
  }

  function drawLegend() {
    legend.replaceChildren();
    const entries = legendEntries();
    const shown = entries.slice(-12);
    for (const [c, text] of shown) {
      const item = h("span", "pw-item pw-tl-legend-item");
      item.append(swatch(colour(c)), h("span", "", text));
      legend.appendChild(item);
    }
    if (entries.length > shown.length) legend.appendChild(h("span", "pw-sub", `+${entries.length - shown.length} more`));
    // What is drawn besides the coloured bars: an entry for each such look, for the lanes that can show it.
    const kinds = laneKinds();
    const extra = (entry, cls, text, tip) => {
      const item = h("span", "pw-item pw-tl-legend-extra");
      item.dataset.entry = entry;
      item.title = tip;
      item.append(h("span", `pw-swatch ${cls}`), h("span", "", text));
      legend.appendChild(item);
    };
    if (kinds.host) extra("compile", "pw-compile", "host: compile, checkpoint, input load", "compiling an executable before a program's first call, writing a checkpoint, or loading a batch (pw.prefetch)");
    extra("transfer", "pw-xfer", "transfer", "one transfer: a light box (drawn low on a device lane)");
    extra("cross", "pw-xfer-cross", "cross-island transfer", "a transfer between islands (the paper's DCN hop)");
    if (kinds.transfer)
      extra("merged", "pw-xfer-merged", "transfers merged at this zoom", "several transfers too close to tell apart; darker: busier");
    if (kinds.cross)
      extra("merged-cross", "pw-xfer-cross-merged", "cross-island transfers merged", "several cross-island transfers too close to tell apart");
  }

  function laneKinds() {
    const lanes = model.get("lanes") || [];
    return {
      host: lanes.some((l) => l.kind === "host"),
      transfer: lanes.some((l) => l.kind === "transfer"),
      cross: lanes.some((l) => l.cross),
    };
  }

  function drawHead() {
    title.textContent = model.get("title");
    live.style.display = model.get("live") ? "" : "none";
    colourBy.value = model.get("color_by") || "run";
  }

  // ---- the view window
  function fitWindow() {
    if (!(store.tmax > store.tmin)) return { v0: 0, v1: 1e6 };
    // the latest burst of activity (after the last idle gap), not the whole idle session; wheel out for more
    const t0 = Math.min(Math.max(store.tmin, model.get("recent_t0") || 0), store.tmax - 1);
    const span = store.tmax - t0;
    return { v0: t0 - span * 0.01, v1: store.tmax + span * 0.02 };
  }
  function windowNow() {
    if (store.view.follow || !(store.view.v1 > store.view.v0)) {
      const w = fitWindow();
      store.view.v0 = w.v0;
      store.view.v1 = w.v1;
    }
    return store.view;
  }

  // ---- drawing
  function draw() {
    raf = 0;
    const t0 = performance.now();
    const width = Math.max(120, Math.floor(plot.clientWidth || 600));
    const height = layout.height;
    layout.width = width;
    const ctx = canvasContext(canvas, width, height);
    const ink = getComputedStyle(root).color || "#222";
    const { v0, v1 } = windowNow();
    const span = v1 - v0;
    const kx = width / span;
    const win = { v0, v1, kx, width };
    const origin = Number.isFinite(store.tmin) ? store.tmin : 0;
    const axis = drawGrid(ctx, layout.rows, width, height, win, origin, ink);
    const palette = (model.get("palette") || ["#4e79a7"]).map(colour);
    const drawnBars = drawBars(ctx, store, layout.rows, win, colourIndex(), palette, rects);
    const { bars: nBars, gaps: nGaps, util: utilOut } = drawnBars;
    if (!store.nEv) {
      ctx.fillStyle = ink;
      ctx.globalAlpha = 0.6;
      ctx.textAlign = "center";
      ctx.font = "12px system-ui, sans-serif";
      ctx.fillText("waiting for node events…", width / 2, AXIS_H + Math.min(40, (height - AXIS_H) / 2 + 4));
      ctx.globalAlpha = 1;
    }
    if (hover) {
      ctx.strokeStyle = ink;
      ctx.lineWidth = 1.5;
      const x0 = Math.max(0, (hover.s - v0) * kx);
      const x1 = Math.min(width, (hover.e - v0) * kx);
      ctx.strokeRect(x0, hover.row.y + 0.5, Math.max(2, x1 - x0), hover.row.h - 2);
    }
    // utilization column and header
    let devBusy = 0;
    let devN = 0;
    layout.rows.forEach((r, i) => {
      const u = utilOut[i] || 0;
      const el = utilEls[i];
      if (!el) return;
      const pct = Math.min(100, u * 100);
      el.fill.style.width = `${pct.toFixed(0)}%`;
      el.txt.textContent = `${pct.toFixed(0)}%`;
      el.d.title = `${r.info.label}: busy ${pct.toFixed(1)}% of the visible window`;
      if (r.info.kind === "device") {
        devBusy += u;
        devN++;
      }
    });
    const runs = (model.get("runs") || []).length;
    const total = Number.isFinite(store.tmax) ? store.tmax - store.tmin : 0;
    stats.textContent =
      `${store.nEv.toLocaleString()} events · ${runs} run${runs === 1 ? "" : "s"} · ${devN} devices` +
      (total > 0 ? ` · span ${fmtNs(total)} · in view ${fmtNs(span)}` : "") +
      (devN && store.nEv ? ` · mean device utilization ${((100 * devBusy) / devN).toFixed(0)}%` : "");
    drawn = { bars: nBars, rects: rects.n, gaps: nGaps, axis };
    root.dataset.events = String(store.nEv);
    root.dataset.barsInView = String(nBars);
    root.dataset.barGaps = String(nGaps); // pixel gaps cut between back-to-back bars of one colour
    root.dataset.axis = axis.join(" | "); // the tick labels drawn on the canvas, for tests and tools
    lastDrawMs = performance.now() - t0;
    root.dataset.drawMs = lastDrawMs.toFixed(2);
  }

  function schedule() {
    if (!raf) raf = requestAnimationFrame(draw);
  }

  // ---- hit testing and tooltip
  function rowAt(y) {
    for (const r of layout.rows) if (y >= r.y && y < r.y + r.h) return r;
    return null;
  }
  function barAt(x, y) {
    const row = rowAt(y);
    if (!row) return null;
    const lane = store.lanes[row.lane];
    if (!lane || !lane.n) return null;
    lane.ensureSorted();
    const { v0, v1 } = store.view;
    const perPx = (v1 - v0) / Math.max(layout.width, 1);
    const t = v0 + x * perPx;
    const tol = 3 * perPx;
    let best = -1;
    let bestD = Infinity;
    let bestDur = Infinity;
    const hi = lane.lowerBound(t + tol);
    let scanned = 0;
    for (let i = hi - 1; i >= 0 && scanned < 20000; i--, scanned++) {
      const s = lane.s[i];
      const e = lane.e[i];
      if (s < t - tol - lane.maxDur) break;
      const d = t < s ? s - t : t > e ? t - e : 0;
      if (d > tol) continue;
      const dur = e - s;
      if (d < bestD || (d === bestD && dur < bestDur)) {
        best = i;
        bestD = d;
        bestDur = dur;
      }
    }
    if (best < 0) return null;
    return { row, ev: lane.idx[best], s: lane.s[best], e: lane.e[best] };
  }
  function showBarTip(hit, clientX, clientY) {
    const ev = hit.ev;
    const u = store.u32;
    const kind = KINDS[u[ev * U + 6]] || "compute";
    const run = u[ev * U];
    const prog = store.str(u[ev * U + 2]);
    const tenant = store.str(u[ev * U + 3]);
    const shapes = store.str(u[ev * U + 4]);
    const err = store.str(u[ev * U + 5]);
    const lines = [
      `${store.str(u[ev * U + 1]) ?? "?"}  (${kind})`,
      run === NONE ? `${prog ?? "?"} (no run)` : `run ${run} · ${prog ?? "?"}${tenant && tenant !== "default" ? ` · tenant ${tenant}` : ""}`,
      `duration ${fmtNs(hit.e - hit.s)} · starts at ${fmtNs(hit.s - store.tmin)}`,
      `lane ${hit.row.info.label}`,
    ];
    if (shapes) lines.push(shapes);
    if (store.nbytes[ev]) lines.push(`${fmtBytes(store.nbytes[ev])} out`);
    if (err) lines.push(`error: ${err}`);
    showTip(tip, root, lines, clientX, clientY);
  }
  function hideTip() {
    tip.style.display = "none";
    if (hover) {
      hover = null;
      schedule();
    }
  }

  // ---- interaction: wheel zooms around the cursor, drag pans, double-click fits
  const pointer = panZoom(canvas, {
    perPixel: 0.002,
    zoom: (factor, x) => {
      const w = windowNow();
      const f = x / Math.max(layout.width, 1);
      const t = w.v0 + f * (w.v1 - w.v0);
      const full = Math.max(store.tmax - store.tmin, 1e3);
      const span = Math.min(Math.max((w.v1 - w.v0) / factor, 100), full * 50);
      store.view = { v0: t - f * span, v1: t - f * span + span, follow: false };
      schedule();
    },
    grab: () => ({ ...windowNow() }),
    pan: (dx, _dy, from) => {
      const dt = (-dx / Math.max(layout.width, 1)) * (from.v1 - from.v0);
      store.view = { v0: from.v0 + dt, v1: from.v1 + dt, follow: false };
      tip.style.display = "none";
      schedule();
    },
    hover: (e) => {
      const rect = canvas.getBoundingClientRect();
      const hit = barAt(e.clientX - rect.left, e.clientY - rect.top);
      if (!hit) return hideTip();
      hover = hit;
      showBarTip(hit, e.clientX, e.clientY);
      schedule();
    },
  });
  function onFit() {
    store.view = { ...store.view, follow: true };
    schedule();
  }
  canvas.addEventListener("pointerleave", () => !pointer.dragging() && hideTip());
  canvas.addEventListener("dblclick", onFit);
  fit.addEventListener("click", onFit);
  colourBy.addEventListener("change", () => {
    model.set("color_by", colourBy.value);
    model.save_changes();
  });

  // ---- wiring
  const onData = () => {
    drawLegendIfNeeded();
    schedule();
  };
  let legendKey = "";
  function drawLegendIfNeeded() {
    const mode = model.get("color_by");
    const k = laneKinds();
    const key =
      `${mode}:${JSON.stringify(model.get("runs") || []).length}:${store.order[0].size}:${store.order[1].size}` +
      `:${k.host}:${k.transfer}:${k.cross}`;
    if (key !== legendKey) {
      legendKey = key;
      drawLegend();
    }
  }
  const onLanes = () => {
    buildLayout();
    drawLegendIfNeeded(); // a new host or transfer lane brings its legend entries
    schedule();
  };
  const onRuns = () => {
    legendKey = "";
    drawLegendIfNeeded();
    schedule();
  };
  const onHead = () => {
    drawHead();
    legendKey = "";
    drawLegendIfNeeded();
    schedule();
  };
  store.listeners.add(onData);
  const offs = [
    onChange(model, ["lanes"], onLanes),
    onChange(model, ["runs", "palette"], onRuns),
    onChange(model, ["color_by", "title", "live"], onHead),
  ];
  const resize = typeof ResizeObserver === "function" ? new ResizeObserver(() => schedule()) : null;
  resize?.observe(plot);

  // A handle for benchmarks and debugging: synchronous redraws and view control.
  root.pwTimeline = {
    redraw() {
      if (raf) cancelAnimationFrame(raf);
      draw();
      return lastDrawMs;
    },
    setView(v0, v1) {
      store.view = { v0, v1, follow: false };
    },
    fit: onFit,
    stats: () => ({ events: store.nEv, lanes: layout.rows.length, ...drawn, drawMs: lastDrawMs, tmin: store.tmin, tmax: store.tmax }),
  };

  buildLayout();
  drawHead();
  drawLegend();
  draw();

  return () => {
    if (raf) cancelAnimationFrame(raf);
    store.listeners.delete(onData);
    for (const off of offs) off();
    resize?.disconnect();
    detach();
    el.replaceChildren();
  };
}

export default { initialize, render };

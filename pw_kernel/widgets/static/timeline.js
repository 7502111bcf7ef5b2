// TimelineWidget front-end: a canvas timeline with a lane per device and per transfer path.
//
// Data arrives as column-wise chunks (custom messages with binary buffers, or the `_base` trait) and is
// kept in one store per model (shared by its views, surviving re-renders). Each lane keeps its bars
// sorted by start, so a redraw touches only bars in view; bars closer than a pixel merge (level of
// detail), so canvas calls are bounded by pixels, not events. Bars wide enough to see stay apart: back to
// back bars of one colour (six chained layers) are cut by a 1px gap, not drawn as one long bar. Every
// colour and pattern drawn has a legend entry. Every string goes in through textContent.

const HEX = /^#[0-9a-fA-F]{6}$/;
const NONE = 0xffffffff;
const KINDS = ["compute", "glue", "transfer", "compile"];
const U = 7; // uint32 fields per event: run, node, program, tenant, shapes, error, kind
const AXIS_H = 22;
const CROSS = "#d62828";
const XFER = "#666"; // transfer lanes; merged transfers become a strip of this colour
const XFER_DEV = "#444"; // transfers drawn low on device lanes
const HATCH = ["#8a8a8a", "#e4e4e4"]; // compile bars on the host lane: diagonal hatch (stripes, ground)
// A bar at least this wide on screen ends a pixel early where the next bar of its colour starts, so the two
// read as two bars; narrower bars still merge (level of detail).
const GAP_MIN = 4;
const UNITS = [
  [1e9, "s"],
  [1e6, "ms"],
  [1e3, "µs"],
  [1, "ns"],
];
const STORES = (globalThis.__pwTimelineStores = globalThis.__pwTimelineStores || new Map());

function h(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function colour(c) {
  return HEX.test(c) ? c : "#999999";
}

function fmtNs(ns) {
  const a = Math.abs(ns);
  const p = (x) => (Math.abs(x) >= 100 ? x.toFixed(0) : Math.abs(x) >= 10 ? x.toFixed(1) : x.toFixed(2));
  if (a < 1e3) return `${ns.toFixed(0)} ns`;
  if (a < 1e6) return `${p(ns / 1e3)} µs`;
  if (a < 1e9) return `${p(ns / 1e6)} ms`;
  return `${p(ns / 1e9)} s`;
}

// Tick labels of the time axis: one unit for the whole axis (from its largest value) and as many decimals
// as the tick step needs, so neighbouring labels differ even zoomed far in (14.1001 ms, 14.1002 ms, not
// 14.1 ms twice). The origin reads "0 ns". timeline_widget.axis_labels is the same rule for the static picture.
function axisLabels(values, step) {
  let big = step;
  for (const v of values) big = Math.max(big, Math.abs(v));
  const [scale, unit] = UNITS.find(([sc]) => big >= sc) || UNITS[UNITS.length - 1];
  const dec = Math.min(20, Math.max(0, Math.ceil(-Math.log10(step / scale) - 1e-9)));
  return values.map((v) => (v === 0 ? "0 ns" : `${(v / scale).toFixed(dec)} ${unit}`));
}

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let k = 0;
  while (n >= 1024 && k < units.length - 1) {
    n /= 1024;
    k++;
  }
  return k ? `${n.toFixed(1)} ${units[k]}` : `${n} B`;
}

function niceStep(span, target) {
  const raw = span / Math.max(target, 1);
  if (!(raw > 0)) return 1;
  const mag = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

// Copy a DataView / ArrayBuffer / typed array into a fresh, aligned typed array.
function typed(buf, Kind) {
  if (!buf) return new Kind(0);
  let bytes;
  if (buf instanceof ArrayBuffer) bytes = buf.slice(0);
  else if (ArrayBuffer.isView(buf)) bytes = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
  else return new Kind(0);
  return new Kind(bytes, 0, Math.floor(bytes.byteLength / Kind.BYTES_PER_ELEMENT));
}

function grow(arr, need) {
  if (need <= arr.length) return arr;
  const next = new arr.constructor(Math.max(need, arr.length * 2, 256));
  next.set(arr);
  return next;
}

// ---------------------------------------------------------------- the store
class Lane {
  constructor() {
    this.n = 0;
    this.idx = new Uint32Array(64);
    this.s = new Float64Array(64);
    this.e = new Float64Array(64);
    this.sorted = true;
    this.maxDur = 0;
  }
  push(ev, s, e) {
    const n = this.n;
    if (n === this.idx.length) {
      this.idx = grow(this.idx, n + 1);
      this.s = grow(this.s, n + 1);
      this.e = grow(this.e, n + 1);
    }
    if (n && s < this.s[n - 1]) this.sorted = false;
    this.idx[n] = ev;
    this.s[n] = s;
    this.e[n] = e;
    if (e - s > this.maxDur) this.maxDur = e - s;
    this.n = n + 1;
  }
  ensureSorted() {
    if (this.sorted) return;
    const { n, s } = this;
    const order = new Uint32Array(n);
    for (let i = 0; i < n; i++) order[i] = i;
    order.sort((a, b) => s[a] - s[b] || a - b);
    const idx = new Uint32Array(this.idx.length);
    const s2 = new Float64Array(this.s.length);
    const e2 = new Float64Array(this.e.length);
    for (let i = 0; i < n; i++) {
      const j = order[i];
      idx[i] = this.idx[j];
      s2[i] = s[j];
      e2[i] = this.e[j];
    }
    this.idx = idx;
    this.s = s2;
    this.e = e2;
    this.sorted = true;
  }
  // first position whose start is >= t
  lowerBound(t) {
    let lo = 0;
    let hi = this.n;
    const s = this.s;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (s[mid] < t) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
}

class Store {
  constructor(uid) {
    this.uid = uid;
    this.listeners = new Set();
    this.view = { v0: 0, v1: 1, follow: true };
    this.pendingSince = 0;
    this.reset();
  }
  reset() {
    this.have = 0;
    this.nEv = 0;
    this.strings = [];
    this.start = new Float64Array(1024);
    this.end = new Float64Array(1024);
    this.nbytes = new Float64Array(1024);
    this.u32 = new Uint32Array(1024 * U);
    this.lanes = [];
    this.tmin = Infinity;
    this.tmax = -Infinity;
    this.order = [new Map(), new Map()]; // program, tenant string id -> order of first appearance
    this.version = (this.version || 0) + 1;
  }
  lane(k) {
    while (this.lanes.length <= k) this.lanes.push(new Lane());
    return this.lanes[k];
  }
  // Apply one chunk message (content, [f64, u32, bars]). Returns false when it does not continue the store.
  apply(meta, f64buf, u32buf, barsbuf) {
    if (meta.seq0 !== this.have || meta.ev0 !== this.nEv || meta.str0 !== this.strings.length) return false;
    const f64 = typed(f64buf, Float64Array);
    const u32 = typed(u32buf, Uint32Array);
    const bars = typed(barsbuf, Uint32Array);
    const n = meta.n_ev;
    if (f64.length < n * 3 || u32.length < n * U) return false;
    for (const s of meta.strings) this.strings.push(s);
    const base = this.nEv;
    this.start = grow(this.start, base + n);
    this.end = grow(this.end, base + n);
    this.nbytes = grow(this.nbytes, base + n);
    this.u32 = grow(this.u32, (base + n) * U);
    for (let i = 0; i < n; i++) {
      const s = f64[3 * i];
      const e = Math.max(f64[3 * i + 1], s);
      this.start[base + i] = s;
      this.end[base + i] = e;
      this.nbytes[base + i] = f64[3 * i + 2];
      if (s < this.tmin) this.tmin = s;
      if (e > this.tmax) this.tmax = e;
    }
    this.u32.set(u32.subarray(0, n * U), base * U);
    for (let i = 0; i < n; i++) {
      for (let c = 0; c < 2; c++) {
        const id = u32[i * U + 2 + c];
        if (!this.order[c].has(id)) this.order[c].set(id, this.order[c].size);
      }
    }
    for (let j = 0; j + 1 < bars.length; j += 2) {
      const ev = bars[j];
      this.lane(bars[j + 1]).push(ev, this.start[ev], this.end[ev]);
    }
    this.nEv = base + n;
    this.have = meta.seq1;
    this.version++;
    return true;
  }
  str(k) {
    return k === NONE ? null : this.strings[k];
  }
  notify() {
    for (const fn of this.listeners) fn();
  }
  // Ask the kernel for the chunks we lack (at most one request in flight; retried after 3 s).
  request(model) {
    const now = performance.now();
    if (this.pendingSince && now - this.pendingSince < 3000) return;
    this.pendingSince = now;
    try {
      model.send({ type: "sync", have: this.have });
    } catch (e) {
      /* the comm may be closed */
    }
  }
  onMessage(model, content, buffers) {
    if (!content || content.type !== "chunk") return;
    if (content.seq1 <= this.have) return; // already have it (another listener applied it)
    if (content.seq0 === this.have && this.apply(content, buffers[0], buffers[1], buffers[2])) {
      this.pendingSince = 0;
      this.notify();
      return;
    }
    this.request(model); // a gap: chunks were sent before we listened
  }
  loadBase(model) {
    const base = model.get("_base");
    if (!base || typeof base.seq1 !== "number" || base.seq1 <= this.have) return;
    this.reset();
    if (this.apply(base, base.f64, base.u32, base.bars)) this.notify();
  }
  check(model) {
    if (this.have < (model.get("n_chunks") || 0)) this.request(model);
  }
}

function storeFor(model) {
  const uid = model.get("uid") || "default";
  let store = STORES.get(uid);
  if (!store) {
    store = new Store(uid);
    STORES.set(uid, store);
  }
  return store;
}

// Listen to the model's data on behalf of the store; several listeners are harmless (chunks apply once).
function attach(model, store) {
  const onMsg = (content, buffers) => store.onMessage(model, content, buffers || []);
  const onBase = () => store.loadBase(model);
  const onCount = () => store.check(model);
  model.on("msg:custom", onMsg);
  model.on("change:_base", onBase);
  model.on("change:n_chunks", onCount);
  store.loadBase(model);
  store.check(model);
  return () => {
    model.off("msg:custom", onMsg);
    model.off("change:_base", onBase);
    model.off("change:n_chunks", onCount);
  };
}

function initialize({ model }) {
  const uid = model.get("uid") || "default";
  const detach = attach(model, storeFor(model));
  return () => {
    detach();
    STORES.delete(uid); // the model is gone, and with it every view of it
  };
}

// ------------------------------------------------------------------ the view
function render({ model, el }) {
  const store = storeFor(model);
  const detach = attach(model, store);

  const root = h("div", "pw-w pw-timeline");
  const head = h("div", "pw-tl-head");
  const title = h("span", "pw-title");
  const stats = h("span", "pw-tl-stats");
  const live = h("span", "pw-tl-live", "live");
  const controls = h("span", "pw-tl-controls");
  const fit = h("button", "", "fit");
  fit.title = "Fit all events and follow new ones (or double-click the plot)";
  const colourBy = h("select");
  for (const v of ["run", "program", "tenant"]) {
    const o = h("option", "", `colour by ${v}`);
    o.value = v;
    colourBy.appendChild(o);
  }
  controls.append(fit, colourBy);
  head.append(title, stats, live, controls);
  const legend = h("div", "pw-tl-legend");
  const body = h("div", "pw-tl-body");
  const labels = h("div", "pw-tl-labels");
  const plot = h("div", "pw-tl-plot");
  const canvas = h("canvas");
  plot.appendChild(canvas);
  const util = h("div", "pw-tl-util");
  body.append(labels, plot, util);
  const hint = h(
    "div",
    "pw-tl-hint",
    "wheel: zoom · drag: pan · double-click: fit · hover: details · paler bars: several short bars merged at this zoom",
  );
  const tip = h("div", "pw-tip");
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
  let hatchTile = null;
  const rectBufs = new Map(); // colour -> {a: Float64Array of [x, y, w, h, alpha, bars merged], n}

  // ---- layout: display rows (devices first, then transfer paths) and DOM labels
  function buildLayout() {
    const lanes = model.get("lanes") || [];
    const order = [];
    lanes.forEach((l, k) => l.kind === "device" && order.push(k));
    lanes.forEach((l, k) => l.kind !== "device" && order.push(k));
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
      const sw = h("span", "pw-swatch");
      sw.style.background = colour(c);
      item.append(sw, h("span", "", text));
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
    if (kinds.host) extra("compile", "pw-compile", "compile (host)", "compiling an executable before a program's first call");
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

  // The compile bars' fill: a small diagonal-hatch tile, repeated.
  function hatch(ctx) {
    if (!hatchTile) {
      hatchTile = document.createElement("canvas");
      hatchTile.width = hatchTile.height = 6;
      const g = hatchTile.getContext("2d");
      g.fillStyle = HATCH[1];
      g.fillRect(0, 0, 6, 6);
      g.strokeStyle = HATCH[0];
      g.lineWidth = 1.5;
      g.beginPath();
      for (const d of [-6, 0, 6]) {
        g.moveTo(d, 6);
        g.lineTo(d + 6, 0);
      }
      g.stroke();
    }
    return ctx.createPattern(hatchTile, "repeat");
  }

  function drawHead() {
    title.textContent = model.get("title");
    live.style.display = model.get("live") ? "" : "none";
    colourBy.value = model.get("color_by") || "run";
  }

  // ---- the view window
  function fitWindow() {
    if (!(store.tmax > store.tmin)) return { v0: 0, v1: 1e6 };
    const span = store.tmax - store.tmin;
    return { v0: store.tmin - span * 0.01, v1: store.tmax + span * 0.02 };
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
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(height * dpr);
      canvas.style.width = `${width}px`;
      canvas.style.height = `${height}px`;
    }
    layout.width = width;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const ink = getComputedStyle(root).color || "#222";
    const { v0, v1 } = windowNow();
    const span = v1 - v0;
    const kx = width / span;
    const origin = Number.isFinite(store.tmin) ? store.tmin : 0;

    // lane backgrounds
    layout.rows.forEach((r, i) => {
      ctx.fillStyle = i % 2 ? "rgba(128,128,128,0.07)" : "rgba(128,128,128,0.13)";
      ctx.fillRect(0, r.y, width, r.h - 1);
    });
    // axis and grid
    const step = niceStep(span, Math.max(2, Math.floor(width / 110)));
    ctx.font = "10px system-ui, sans-serif";
    ctx.textAlign = "center";
    ctx.textBaseline = "alphabetic";
    // ticks at whole multiples of the step from the origin (computed, not accumulated: no drift at deep zoom)
    const rels = [];
    for (let k = Math.ceil((v0 - origin) / step); origin + k * step <= v1 && rels.length < 500; k++) rels.push(k * step);
    const axis = axisLabels(rels, step);
    rels.forEach((rel, i) => {
      const x = (origin + rel - v0) * kx;
      ctx.fillStyle = "rgba(128,128,128,0.35)";
      ctx.fillRect(Math.round(x), AXIS_H - 5, 1, height - AXIS_H + 5);
      ctx.fillStyle = ink;
      const half = ctx.measureText(axis[i]).width / 2 + 1;
      ctx.fillText(axis[i], Math.min(Math.max(x, half), width - half), AXIS_H - 8);
    });
    ctx.fillStyle = "rgba(128,128,128,0.6)";
    ctx.fillRect(0, AXIS_H - 1, width, 1);

    const palette = (model.get("palette") || ["#4e79a7"]).map(colour);
    const cidx = colourIndex();
    const u32 = store.u32;
    let nBars = 0;
    let nRects = 0;
    let nGaps = 0;
    // per colour: flat [x, y, w, h, alpha, ...]; -1: transfers on a device lane, -2: transfer lane, -3: cross-island,
    // -4: compiles on the host lane.
    // alpha shows density: a merged rect whose bars cover little of its pixels is drawn fainter.
    // Buffers are reused between draws: no allocation per redraw.
    for (const buf of rectBufs.values()) buf.n = 0;
    const put = (c, x, y, w, hh, busyNs, count) => {
      let buf = rectBufs.get(c);
      if (!buf) rectBufs.set(c, (buf = { a: new Float64Array(6 * 256), n: 0 }));
      if ((buf.n + 1) * 6 > buf.a.length) buf.a = grow(buf.a, (buf.n + 1) * 6);
      const density = (busyNs * kx) / Math.max(w, 1);
      const o = buf.n * 6;
      buf.a[o] = x;
      buf.a[o + 1] = y;
      buf.a[o + 2] = w;
      buf.a[o + 3] = hh;
      buf.a[o + 4] = density >= 0.6 ? 1 : 0.3 + density;
      buf.a[o + 5] = count;
      buf.n++;
      nRects++;
    };
    const utilOut = [];
    for (const row of layout.rows) {
      const lane = store.lanes[row.lane];
      let busy = 0;
      if (lane && lane.n) {
        lane.ensureSorted();
        const isDev = row.info.kind === "device";
        const laneColour = isDev ? null : row.info.kind === "host" ? -4 : row.info.cross ? -3 : -2;
        const yb = row.y + 1;
        const hb = row.h - 3;
        const yx = row.y + Math.floor(row.h * 0.55);
        const hx = Math.max(2, row.h - 3 - Math.floor(row.h * 0.55) + 1);
        // two merge streams: bars, and transfers drawn low on device lanes
        let bc = -99, bx0 = 0, bx1 = -1, bb = 0, bn = 0;
        let tx0 = 0, tx1 = -1, tOn = false, tb = 0, tn = 0;
        let us = 0, ue = -Infinity;
        const { s, e, idx } = lane;
        for (let i = lane.lowerBound(v0 - lane.maxDur); i < lane.n; i++) {
          const si = s[i];
          if (si >= v1) break;
          const ei = e[i];
          if (ei <= v0) continue;
          nBars++;
          const a = si > v0 ? si : v0;
          const b = ei < v1 ? ei : v1;
          if (a > ue) {
            if (ue > us) busy += ue - us;
            us = a;
            ue = b;
          } else if (b > ue) ue = b;
          let x0 = (si - v0) * kx;
          let x1 = (ei - v0) * kx;
          if (x0 < 0) x0 = 0;
          if (x1 > width) x1 = width;
          if (x1 - x0 < 1) x1 = x0 + 1;
          const ev = idx[i];
          const dur = b - a;
          if (isDev && u32[ev * U + 6] === 2) {
            // back to back and both wide enough to see: two transfers, a pixel apart
            const tgap = tOn && x0 >= tx1 - 0.5 && tx1 - tx0 >= GAP_MIN && x1 - x0 >= GAP_MIN;
            if (tOn && x0 <= tx1 + 0.5 && !tgap) {
              if (x1 > tx1) tx1 = x1;
              tb += dur;
              tn++;
            } else {
              if (tgap) {
                const cut = Math.round(tx1);
                put(-1, tx0, yx, cut - 1 - tx0, hx, tb, tn);
                nGaps++;
                if (x0 < cut) x0 = cut;
              } else if (tOn) put(-1, tx0, yx, tx1 - tx0, hx, tb, tn);
              tx0 = x0;
              tx1 = x1;
              tb = dur;
              tn = 1;
              tOn = true;
            }
            continue;
          }
          const c = laneColour === null ? cidx[ev] % palette.length : laneColour;
          // Back to back with the bar before, in its colour, and both wide enough to see: keep them two bars
          // (the earlier one ends a pixel early, on a whole pixel, so the gap is crisp) instead of merging.
          const gap = c === bc && x0 >= bx1 - 0.5 && bx1 - bx0 >= GAP_MIN && x1 - x0 >= GAP_MIN;
          if (gap) {
            const cut = Math.round(bx1);
            put(bc, bx0, yb, cut - 1 - bx0, hb, bb, bn);
            nGaps++;
            bx0 = x0 < cut ? cut : x0;
            bx1 = x1;
            bb = dur;
            bn = 1;
          } else if (c === bc && x0 <= bx1 + 0.5) {
            if (x1 > bx1) bx1 = x1;
            bb += dur;
            bn++;
          } else if (x1 <= Math.ceil(bx1)) {
            bb += dur; // inside pixels already painted by another colour: level of detail drops it
            bn++;
          } else {
            if (bx1 >= 0) put(bc, bx0, yb, bx1 - bx0, hb, bb, bn);
            bc = c;
            bx0 = x0 < bx1 ? bx1 : x0;
            bx1 = x1;
            bb = dur;
            bn = 1;
          }
        }
        if (bx1 >= 0) put(bc, bx0, yb, bx1 - bx0, hb, bb, bn);
        if (tOn) put(-1, tx0, yx, tx1 - tx0, hx, tb, tn);
        if (ue > us) busy += ue - us;
      }
      utilOut.push(span > 0 ? busy / span : 0);
    }
    for (const [c, { a, n }] of rectBufs) {
      if (!n) continue;
      if (c >= 0) {
        ctx.fillStyle = palette[c] || palette[0];
        for (let j = 0; j < n * 6; j += 6) {
          ctx.globalAlpha = a[j + 4];
          ctx.fillRect(a[j], a[j + 1], a[j + 2], a[j + 3]);
        }
        continue;
      }
      if (c === -4) {
        // compiles: hatched; one wide enough also outlined; merged ones paler where they cover little
        ctx.fillStyle = hatch(ctx);
        ctx.strokeStyle = XFER;
        ctx.lineWidth = 1;
        for (let j = 0; j < n * 6; j += 6) {
          ctx.globalAlpha = a[j + 4];
          ctx.fillRect(a[j], a[j + 1], a[j + 2], a[j + 3]);
          if (a[j + 5] === 1 && a[j + 2] >= 3) ctx.strokeRect(a[j] + 0.5, a[j + 1] + 0.5, a[j + 2] - 1, a[j + 3] - 1);
        }
        continue;
      }
      // transfers: one transfer wide enough is an outlined box; merged or thin ones a density strip
      const stroke = c === -3 ? CROSS : c === -1 ? XFER_DEV : XFER;
      const fill = c === -1 ? "rgba(255,255,255,0.8)" : "rgba(210,210,210,0.7)";
      ctx.strokeStyle = stroke;
      ctx.lineWidth = 1;
      for (let j = 0; j < n * 6; j += 6) {
        if (a[j + 5] === 1 && a[j + 2] >= 3) {
          ctx.globalAlpha = 1;
          ctx.fillStyle = fill;
          ctx.fillRect(a[j], a[j + 1], a[j + 2], a[j + 3]);
          ctx.strokeRect(a[j] + 0.5, a[j + 1] + 0.5, a[j + 2] - 1, a[j + 3] - 1);
        } else {
          ctx.globalAlpha = 0.25 + 0.75 * Math.min(1, a[j + 4] - 0.3);
          ctx.fillStyle = stroke;
          ctx.fillRect(a[j], a[j + 1], a[j + 2], a[j + 3]);
        }
      }
    }
    ctx.globalAlpha = 1;
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
    drawn = { bars: nBars, rects: nRects, gaps: nGaps, axis };
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
  function showTip(hit, clientX, clientY) {
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
      `run ${run} · ${prog ?? "?"}${tenant && tenant !== "default" ? ` · tenant ${tenant}` : ""}`,
      `duration ${fmtNs(hit.e - hit.s)} · starts at ${fmtNs(hit.s - store.tmin)}`,
      `lane ${hit.row.info.label}`,
    ];
    if (shapes) lines.push(shapes);
    if (store.nbytes[ev]) lines.push(`${fmtBytes(store.nbytes[ev])} out`);
    if (err) lines.push(`error: ${err}`);
    tip.replaceChildren();
    lines.forEach((line, k) => tip.appendChild(h("div", k === 0 ? "pw-tip-head" : "", line)));
    tip.style.display = "block";
    const r = root.getBoundingClientRect();
    let x = clientX - r.left + 14;
    if (x + tip.offsetWidth > r.width) x = Math.max(0, clientX - r.left - tip.offsetWidth - 10);
    tip.style.left = `${x}px`;
    tip.style.top = `${clientY - r.top + 14}px`;
  }
  function hideTip() {
    tip.style.display = "none";
    if (hover) {
      hover = null;
      schedule();
    }
  }

  // ---- interaction: wheel zooms around the cursor, drag pans, double-click fits
  let drag = null;
  function localX(e) {
    return e.clientX - canvas.getBoundingClientRect().left;
  }
  function onWheel(e) {
    e.preventDefault();
    const w = windowNow();
    const x = localX(e);
    const f = x / Math.max(layout.width, 1);
    const t = w.v0 + f * (w.v1 - w.v0);
    const scale = e.deltaMode === 1 ? 0.05 : e.deltaMode === 2 ? 0.5 : 0.002;
    const full = Math.max(store.tmax - store.tmin, 1e3);
    const span = Math.min(Math.max((w.v1 - w.v0) * Math.exp(e.deltaY * scale), 100), full * 50);
    store.view = { v0: t - f * span, v1: t - f * span + span, follow: false };
    schedule();
  }
  function onDown(e) {
    if (e.button !== 0) return;
    const w = windowNow();
    drag = { x: e.clientX, v0: w.v0, v1: w.v1, moved: false };
    canvas.setPointerCapture?.(e.pointerId);
    canvas.classList.add("pw-dragging");
  }
  function onMove(e) {
    const rect = canvas.getBoundingClientRect();
    if (drag) {
      const dx = e.clientX - drag.x;
      if (Math.abs(dx) > 1) drag.moved = true;
      const dt = (-dx / Math.max(layout.width, 1)) * (drag.v1 - drag.v0);
      store.view = { v0: drag.v0 + dt, v1: drag.v1 + dt, follow: false };
      tip.style.display = "none";
      schedule();
      return;
    }
    const hit = barAt(e.clientX - rect.left, e.clientY - rect.top);
    if (!hit) return hideTip();
    hover = hit;
    showTip(hit, e.clientX, e.clientY);
    schedule();
  }
  function onUp(e) {
    if (!drag) return;
    canvas.releasePointerCapture?.(e.pointerId);
    canvas.classList.remove("pw-dragging");
    drag = null;
  }
  function onFit() {
    store.view = { ...store.view, follow: true };
    schedule();
  }
  canvas.addEventListener("wheel", onWheel, { passive: false });
  canvas.addEventListener("pointerdown", onDown);
  canvas.addEventListener("pointermove", onMove);
  canvas.addEventListener("pointerup", onUp);
  canvas.addEventListener("pointercancel", onUp);
  canvas.addEventListener("pointerleave", () => !drag && hideTip());
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
  model.on("change:lanes", onLanes);
  model.on("change:runs", onRuns);
  model.on("change:palette", onRuns);
  model.on("change:color_by", onHead);
  model.on("change:title", onHead);
  model.on("change:live", onHead);
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
    model.off("change:lanes", onLanes);
    model.off("change:runs", onRuns);
    model.off("change:palette", onRuns);
    model.off("change:color_by", onHead);
    model.off("change:title", onHead);
    model.off("change:live", onHead);
    resize?.disconnect();
    detach();
    el.replaceChildren();
  };
}

export default { initialize, render };

// TimelineWidget front-end, part 2 of 3: the canvas. Lane backgrounds, the time axis, and each lane's bars with
// level of detail: bars closer than a pixel merge into one rect (fainter where they cover little of it), so canvas
// calls are bounded by pixels, not events. Bars wide enough to see stay apart: back to back bars of one colour
// (six chained layers) are cut by a 1px gap, not drawn as one long bar. timeline_html.py draws the same rules.
// Loaded after prelude.js and timeline_store.js; timeline.js (the view) follows.

const AXIS_H = 22;
const CROSS = "#d62828";
const XFER = "#666"; // transfer lanes; merged transfers become a strip of this colour
const XFER_DEV = "#444"; // transfers drawn low on device lanes
const HATCH = ["#8a8a8a", "#e4e4e4"]; // compile bars on the host lane: diagonal hatch (stripes, ground)
// A bar at least this wide on screen ends a pixel early where the next bar of its colour starts, so the two
// read as two bars; narrower bars still merge (level of detail).
const GAP_MIN = 4;
let hatchTile = null; // the compile hatch, drawn once

// The frame both lane views (the timeline, the pool) draw into: a head (title, stats, "live"), a legend, the
// body (device labels, the plot's canvas, a utilization column), a hint line and the hover tip; each view
// adds its own parts and puts them in its root.
function laneFrame(hintText) {
  const head = h("div", "pw-tl-head");
  const title = h("span", "pw-title");
  const stats = h("span", "pw-tl-stats");
  const live = h("span", "pw-tl-live", "live");
  head.append(title, stats, live);
  const legend = h("div", "pw-tl-legend");
  const body = h("div", "pw-tl-body");
  const labels = h("div", "pw-tl-labels");
  const plot = h("div", "pw-tl-plot");
  const canvas = h("canvas");
  plot.appendChild(canvas);
  const util = h("div", "pw-tl-util");
  body.append(labels, plot, util);
  const hint = h("div", "pw-tl-hint", hintText);
  const tip = h("div", "pw-tip");
  return { head, title, stats, live, legend, body, labels, plot, canvas, util, hint, tip };
}

// Lane backgrounds, then grid lines and tick labels of the time since `origin`; returns the labels drawn.
function drawGrid(ctx, rows, width, height, win, origin, ink) {
  const { v0, v1, kx } = win;
  rows.forEach((r, i) => {
    ctx.fillStyle = i % 2 ? "rgba(128,128,128,0.07)" : "rgba(128,128,128,0.13)";
    ctx.fillRect(0, r.y, width, r.h - 1);
  });
  const step = niceStep(v1 - v0, Math.max(2, Math.floor(width / 110)));
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
  return axis;
}

// The rects of one redraw, per colour key: flat [x, y, w, h, alpha, bars merged, ...]. Keys >= 0 index the palette;
// -1: transfers on a device lane, -2: a transfer lane, -3: a cross-island one, -4: compiles on the host lane.
// Alpha shows density: a merged rect whose bars cover little of its pixels is drawn fainter.
// The buffers are reused between redraws: no allocation per redraw.
class Rects {
  constructor() {
    this.bufs = new Map();
    this.n = 0;
    this.kx = 1; // pixels per ns of this redraw
  }
  clear(kx) {
    for (const buf of this.bufs.values()) buf.n = 0;
    this.n = 0;
    this.kx = kx;
  }
  put(c, x, y, w, hh, busyNs, count) {
    let buf = this.bufs.get(c);
    if (!buf) this.bufs.set(c, (buf = { a: new Float64Array(6 * 256), n: 0 }));
    if ((buf.n + 1) * 6 > buf.a.length) buf.a = grow(buf.a, (buf.n + 1) * 6);
    const density = (busyNs * this.kx) / Math.max(w, 1);
    const o = buf.n * 6;
    buf.a[o] = x;
    buf.a[o + 1] = y;
    buf.a[o + 2] = w;
    buf.a[o + 3] = hh;
    buf.a[o + 4] = density >= 0.6 ? 1 : 0.3 + density;
    buf.a[o + 5] = count;
    buf.n++;
    this.n++;
  }
}

// Every lane's bars in the window `win` into `rects`, then painted; returns {bars, gaps, util}: bars in view, pixel
// gaps cut, and each row's busy fraction of the window.
function drawBars(ctx, store, rows, win, cidx, palette, rects) {
  rects.clear(win.kx);
  const out = { bars: 0, gaps: 0, util: [] };
  for (const row of rows) {
    const lane = store.lanes[row.lane];
    let busy = 0;
    if (lane && lane.n) {
      lane.ensureSorted();
      const got = laneBars(lane, row, win, cidx, palette.length, store.u32, rects);
      busy = got.busy;
      out.bars += got.bars;
      out.gaps += got.gaps;
    }
    const span = win.v1 - win.v0;
    out.util.push(span > 0 ? busy / span : 0);
  }
  paintRects(ctx, rects, palette);
  return out;
}

// One lane's bars in view as rects, merged at this zoom; returns {busy: ns covered, bars, gaps}.
function laneBars(lane, row, win, cidx, nColours, u32, rects) {
  const { v0, v1, kx, width } = win;
  const put = rects.put.bind(rects);
  let busy = 0;
  let nBars = 0;
  let nGaps = 0;
  const isDev = row.info.kind === "device";
  const ownColour = isDev || row.info.kind === "ops"; // a node's ops: in its run's (program's...) colour
  const laneColour = ownColour ? null : row.info.kind === "host" ? -4 : row.info.cross ? -3 : -2;
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
    const c = laneColour === null ? cidx[ev] % nColours : laneColour;
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
  return { busy, bars: nBars, gaps: nGaps };
}

// Paint every rect: palette colours, hatched compiles, transfers as outlined boxes or density strips.
function paintRects(ctx, rects, palette) {
  for (const [c, { a, n }] of rects.bufs) {
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

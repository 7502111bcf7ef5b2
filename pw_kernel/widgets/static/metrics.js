// MetricsPlot front-end: one chart per metric (a line against step), redrawn as the kernel sends values.
// Traits: `names` (the order drawn), `colours` (one per name: the views' palette, from the kernel),
// `series` (name -> {steps, values}; a value may be null: not finite).

const METRIC_H = 120; // a chart's plot height, px
const METRIC_LEFT = 56; // room for the value labels

function fmtValue(v) {
  if (v === null || v === undefined || !isFinite(v)) return "-";
  const a = Math.abs(v);
  return a !== 0 && (a >= 1e5 || a < 1e-3) ? v.toExponential(3) : Number(v.toPrecision(4)).toString();
}

function drawMetric(box, name, s, stroke, width) {
  const steps = s.steps || [];
  const values = s.values || [];
  const pts = [];
  for (let i = 0; i < steps.length; i++) if (values[i] !== null && isFinite(values[i])) pts.push([steps[i], values[i]]);
  const head = h("div", "pw-metric-head");
  head.append(h("b", "", name), " ");
  const last = pts.length ? pts[pts.length - 1] : null;
  head.append(h("span", "pw-sub", last ? `${fmtValue(last[1])} at step ${last[0]}` : "no value yet"));
  box.appendChild(head);
  if (!pts.length) return;
  let s0 = Infinity, s1 = -Infinity, lo = Infinity, hi = -Infinity;
  for (const [x, y] of pts) {
    s0 = Math.min(s0, x); s1 = Math.max(s1, x); lo = Math.min(lo, y); hi = Math.max(hi, y);
  }
  if (hi === lo) { lo -= 0.5; hi += 0.5; }
  const w = Math.max(120, width - METRIC_LEFT - 8);
  const sx = w / Math.max(s1 - s0, 1);
  const sy = METRIC_H / (hi - lo);
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", w + METRIC_LEFT + 4);
  svg.setAttribute("height", METRIC_H + 18);
  const el = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [a, v] of Object.entries(attrs)) e.setAttribute(a, v);
    if (text !== undefined) e.textContent = text;
    svg.appendChild(e);
    return e;
  };
  el("rect", { x: METRIC_LEFT, y: 2, width: w, height: METRIC_H, fill: "#fafafa", stroke: "#ddd" });
  const line = pts.map(([x, y]) => `${(METRIC_LEFT + (x - s0) * sx).toFixed(1)},${(2 + METRIC_H - (y - lo) * sy).toFixed(1)}`);
  el("polyline", { class: "pw-metric-line", fill: "none", stroke: colour(stroke), "stroke-width": 1.5, points: line.join(" ") });
  el("text", { x: METRIC_LEFT - 4, y: 10, "text-anchor": "end", "font-size": 10, fill: "#555" }, fmtValue(hi));
  el("text", { x: METRIC_LEFT - 4, y: METRIC_H + 2, "text-anchor": "end", "font-size": 10, fill: "#555" }, fmtValue(lo));
  el("text", { x: METRIC_LEFT, y: METRIC_H + 15, "font-size": 10, fill: "#555" }, `step ${s0}`);
  el("text", { x: METRIC_LEFT + w, y: METRIC_H + 15, "text-anchor": "end", "font-size": 10, fill: "#555" }, `step ${s1}`);
  box.appendChild(svg);
}

function render({ model, el }) {
  const root = h("div", "pw-widget pw-metrics");
  el.appendChild(root);
  function draw() {
    root.replaceChildren();
    const names = model.get("names") || [];
    const series = model.get("series") || {};
    const colours = model.get("colours") || [];
    if (!names.length) {
      root.appendChild(h("div", "pw-sub", "no metrics logged yet (pw.log)"));
      return;
    }
    const width = Math.min(Math.max(root.clientWidth || 600, 240), 900);
    names.forEach((name, k) => {
      const box = h("div", "pw-metric");
      drawMetric(box, name, series[name] || {}, colours[k], width);
      root.appendChild(box);
    });
  }
  const off = onChange(model, ["names", "colours", "series"], draw);
  draw();
  return off;
}

export default { render };

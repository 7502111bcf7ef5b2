// RunWidget front-end: name, state, nodes done/total bar, elapsed (ticking while running), error, mini timeline.
// The mini timeline is labelled (a caption with its colour key, a name per device row, a time scale), so it
// reads on its own; run.py's static picture draws the same. Every string goes in through textContent.
// Loaded after prelude.js (h, swatch, fmtNs, onChange, canvasContext).

const STATE = { queued: "#9e9e9e", running: "#1e88e5", done: "#43a047", failed: "#e53935", cancelled: "#fb8c00" };
const KIND = ["#4e79a7", "#a0cbe8", "#bbbbbb"]; // compute, glue, transfer (timeline_html.py's MINI_KINDS)
const KIND_NAMES = ["compute", "glue", "transfer"];
const MINI_H = 80; // px the mini timeline's rows share at most
const LABEL_MIN = 8; // px a row needs for its own name; thinner rows name only the first and last device

function fmtSeconds(s) {
  if (s < 1) return `${(s * 1000).toFixed(0)} ms`;
  if (s < 60) return `${s.toFixed(2)} s`;
  return `${Math.floor(s / 60)} min ${(s % 60).toFixed(0)} s`;
}

// Row height of the mini timeline for n device rows (timeline_html.py's mini_lane_height).
function laneHeight(n) {
  return Math.max(3, Math.min(10, Math.floor(MINI_H / Math.max(n, 1))));
}

function render({ model, el }) {
  const root = h("div", "pw-w pw-run");
  const line = h("div", "pw-run-line");
  const id = h("b", "pw-run-id");
  const name = h("code", "pw-run-name");
  const badge = h("span", "pw-badge pw-run-state");
  const bar = h("span", "pw-bar");
  const fill = h("span");
  bar.appendChild(fill);
  const count = h("span", "pw-run-count");
  const elapsed = h("span", "pw-run-elapsed");
  const meta = h("span", "pw-sub pw-run-meta");
  line.append(id, name, badge, bar, count, elapsed, meta);
  const error = h("div", "pw-run-error");
  const outputs = h("table", "pw-run-outputs");
  // the mini timeline: caption and colour key, device names | canvas over a time scale
  const mini = h("div", "pw-run-mini");
  const caption = h("div", "pw-sub pw-run-mini-caption");
  const miniLabels = h("div", "pw-run-mini-labels");
  const canvas = h("canvas");
  const scale = h("div", "pw-sub pw-run-mini-scale");
  const plot = h("div", "pw-run-mini-plot");
  plot.append(canvas, scale);
  const miniBody = h("div", "pw-run-mini-body");
  miniBody.append(miniLabels, plot);
  mini.append(caption, miniBody);
  root.append(line, error, outputs, mini);
  el.appendChild(root);

  let base = 0; // elapsed seconds at the last update
  let baseAt = performance.now();

  function tickElapsed() {
    const state = model.get("state");
    const live = state === "queued" || state === "running";
    const s = base + (live ? (performance.now() - baseAt) / 1000 : 0);
    elapsed.textContent = fmtSeconds(s);
  }

  function update() {
    const state = model.get("state");
    const done = model.get("done");
    const total = model.get("total");
    const c = STATE[state] || "#757575";
    root.dataset.state = state;
    id.textContent = `run ${model.get("run_id")}`;
    name.textContent = model.get("name");
    badge.textContent = state;
    badge.style.background = c;
    const pct = total ? (100 * done) / total : state === "done" ? 100 : 0;
    fill.style.width = `${pct.toFixed(1)}%`;
    fill.style.background = c;
    bar.title = `${done}/${total} nodes`;
    const compiling = model.get("compiling");
    const pace = model.get("pace");
    count.textContent =
      `${done}/${total} nodes` + (compiling ? ` · compiling ${compiling}` : "") + (pace ? ` · ${pace}` : "");
    const prog = model.get("program");
    const bits = [];
    if (prog && prog !== model.get("name")) bits.push(`program ${prog}`);
    if (model.get("mode")) bits.push(`mode ${model.get("mode")}`);
    if (model.get("tenant")) bits.push(`tenant ${model.get("tenant")}`);
    meta.textContent = bits.join(" · ");
    const err = model.get("error");
    error.textContent = err || "";
    error.style.display = err ? "block" : "none";
    outputs.replaceChildren();
    for (const row of model.get("outputs") || []) {
      const tr = h("tr");
      const name = h("td");
      name.appendChild(h("code", "", row.name));
      const type = h("td");
      type.append(`${row.kind || "Future"} `, h("code", "", row.type));
      tr.append(name, type, h("td", "pw-sub", row.sharding));
      outputs.appendChild(tr);
    }
    base = model.get("elapsed");
    baseAt = performance.now();
    tickElapsed();
  }

  function drawMini() {
    const lanes = model.get("lanes") || [];
    const bars = model.get("bars") || [];
    if (!bars.length || !lanes.length) {
      mini.style.display = "none";
      return;
    }
    mini.style.display = "block";
    const width = Math.max(120, Math.min((root.clientWidth || 560) - 84, 640));
    const laneH = laneHeight(lanes.length);
    const height = lanes.length * laneH;
    let end = 1;
    const kinds = new Set();
    for (let i = 0; i < bars.length; i += 4) {
      end = Math.max(end, bars[i + 2]);
      kinds.add(bars[i + 3]);
    }
    // caption and colour key: what the rows, the colours and the scale mean
    caption.replaceChildren(h("span", "", "this run's nodes on each device over time:"));
    for (const k of [0, 1, 2]) {
      if (!kinds.has(k)) continue;
      const item = h("span", "pw-run-mini-key");
      item.append(swatch(KIND[k]), h("span", "", KIND_NAMES[k]));
      caption.appendChild(item);
    }
    // a name per row, or the first and last device's when rows are too thin for text
    miniLabels.replaceChildren();
    miniLabels.style.height = `${height}px`;
    const each = laneH >= LABEL_MIN;
    miniLabels.classList.toggle("pw-compact", !each);
    lanes.forEach((name, k) => {
      if (!each && k !== 0 && k !== lanes.length - 1) return;
      const d = h("div", "pw-run-mini-label", name);
      d.title = `row ${k + 1}: ${name}`;
      if (each) d.style.height = d.style.lineHeight = `${laneH}px`;
      miniLabels.appendChild(d);
    });
    scale.replaceChildren(h("span", "", "0 ns"), h("span", "", fmtNs(end))); // from the first node's start
    scale.style.width = `${width}px`;
    canvas.title = `${bars.length / 4} node executions on ${lanes.length} devices over ${fmtNs(end)}`;
    const ctx = canvasContext(canvas, width, height);
    ctx.fillStyle = "rgba(128,128,128,0.10)";
    ctx.fillRect(0, 0, width, height);
    for (let i = 0; i < bars.length; i += 4) {
      const x0 = (bars[i + 1] / end) * width;
      const x1 = (bars[i + 2] / end) * width;
      ctx.fillStyle = KIND[bars[i + 3]] || KIND[0];
      ctx.fillRect(x0, bars[i] * laneH, Math.max(1, x1 - x0), laneH - (laneH > 2 ? 1 : 0));
    }
  }

  const keys = ["run_id", "name", "program", "state", "done", "total", "elapsed", "error", "mode", "tenant", "pace", "outputs"];
  const offUpdate = onChange(model, keys, update);
  const offMini = onChange(model, ["bars", "lanes"], drawMini);
  const timer = setInterval(tickElapsed, 100);
  update();
  drawMini();
  return () => {
    clearInterval(timer);
    offUpdate();
    offMini();
    el.replaceChildren();
  };
}

export default { render };

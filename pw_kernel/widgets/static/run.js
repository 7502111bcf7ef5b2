// RunWidget front-end: name, state, nodes done/total bar, elapsed (ticking while running), error, mini timeline.
// Every string goes in through textContent.

const STATE = { queued: "#9e9e9e", running: "#1e88e5", done: "#43a047", failed: "#e53935", cancelled: "#fb8c00" };
const KIND = ["#4e79a7", "#a0cbe8", "#bbbbbb"]; // compute, glue, transfer

function h(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function fmtSeconds(s) {
  if (s < 1) return `${(s * 1000).toFixed(0)} ms`;
  if (s < 60) return `${s.toFixed(2)} s`;
  return `${Math.floor(s / 60)} min ${(s % 60).toFixed(0)} s`;
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
  const canvas = h("canvas");
  root.append(line, error, outputs, canvas);
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
    count.textContent = `${done}/${total} nodes`;
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
      canvas.style.display = "none";
      return;
    }
    canvas.style.display = "block";
    const dpr = window.devicePixelRatio || 1;
    const width = Math.max(120, Math.min(root.clientWidth || 480, 720));
    const laneH = Math.max(2, Math.min(6, Math.floor(48 / lanes.length)));
    const height = lanes.length * laneH;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    canvas.title = `${bars.length / 4} node executions on ${lanes.length} devices`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "rgba(128,128,128,0.10)";
    ctx.fillRect(0, 0, width, height);
    let end = 1;
    for (let i = 0; i < bars.length; i += 4) end = Math.max(end, bars[i + 2]);
    for (let i = 0; i < bars.length; i += 4) {
      const x0 = (bars[i + 1] / end) * width;
      const x1 = (bars[i + 2] / end) * width;
      ctx.fillStyle = KIND[bars[i + 3]] || KIND[0];
      ctx.fillRect(x0, bars[i] * laneH, Math.max(1, x1 - x0), laneH - (laneH > 2 ? 1 : 0));
    }
  }

  const keys = ["run_id", "name", "program", "state", "done", "total", "elapsed", "error", "mode", "tenant", "outputs"];
  for (const k of keys) model.on(`change:${k}`, update);
  model.on("change:bars", drawMini);
  model.on("change:lanes", drawMini);
  const timer = setInterval(tickElapsed, 100);
  update();
  drawMini();
  return () => {
    clearInterval(timer);
    for (const k of keys) model.off(`change:${k}`, update);
    model.off("change:bars", drawMini);
    model.off("change:lanes", drawMini);
    el.replaceChildren();
  };
}

export default { render };

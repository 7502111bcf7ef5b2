// PoolWidget front-end: the whole pool of a Pathways service. A lane per service device with every client's nodes
// as bars in the client's colour (the timeline's lanes and bar drawing: timeline_store.js's Lane, timeline_draw.js's
// drawGrid / drawBars), a legend of the clients (name, weight), each client's share of the pool per second as a
// stacked strip, and a table: share, runs queued, memory held, device time. It reads one trait, `data` (the plain
// dict `pw_kernel.service.pool.pool_data` answers), so the same module draws the notebook's widget and the
// service's dashboard page (service/dashboard.py). Every string goes in through textContent.
// Loaded after prelude.js, timeline_store.js and timeline_draw.js (pw_kernel/widgets/esm.py).

const SHARES_H = 56;

// The spans of `data` in lanes, one per device: {store: {lanes, u32} as drawBars reads it, cidx: colour per span,
// rows: a row per device lane}.
function poolLanes(data) {
  const devices = data.devices || [];
  const sp = data.spans || {};
  const n = (sp.start || []).length;
  const clients = data.clients || [];
  const laneOf = new Map(devices.map((d, k) => [d.id, k]));
  const lanes = devices.map(() => new Lane());
  const cidx = new Uint16Array(Math.max(n, 1));
  for (let i = 0; i < n; i++) {
    const k = laneOf.get(sp.device[i]);
    if (k === undefined) continue;
    lanes[k].push(i, sp.start[i], Math.max(sp.end[i], sp.start[i]));
    const c = clients[sp.client[i]];
    cidx[i] = c ? c.colour : 0;
  }
  // kind 0 (compute) for every span: drawBars draws transfers apart, and these are all nodes
  return { store: { lanes, u32: new Uint32Array(Math.max(n, 1) * U) }, cidx, n };
}

function render({ model, el }) {
  const root = h("div", "pw-w pw-timeline pw-pool");
  const { head, title, stats, live, legend, body, labels, plot, canvas, util, hint, tip } = laneFrame(
    "time before the latest node (0) · a bar: one node of a client, in its colour · hover: client, device, duration",
  );
  legend.classList.add("pw-pool-legend");
  const error = h("div", "pw-pool-error");
  const sharesBox = h("div", "pw-pool-shares");
  const sharesCaption = h("div", "pw-sub");
  const sharesCanvas = h("canvas");
  sharesBox.append(sharesCaption, sharesCanvas);
  const table = h("table", "pw-pool-table");
  root.append(head, error, legend, body, hint, sharesBox, table, tip);
  el.appendChild(root);

  const rects = new Rects();
  let view = { rows: [], lanes: null, win: null, data: {} };
  let raf = 0;

  function palette() {
    return (model.get("palette") || ["#4e79a7"]).map(colour);
  }
  function clientColour(c) {
    const p = palette();
    return p[(c.colour || 0) % p.length];
  }

  // ---- the device lanes: labels and rows
  function buildRows(devices) {
    const n = Math.max(devices.length, 1);
    const hgt = Math.max(8, Math.min(22, Math.floor(360 / n)));
    let y = AXIS_H;
    const rows = devices.map((d, k) => {
      const row = { lane: k, info: { kind: "device", label: d.label, key: `dev:${d.id}` }, y, h: hgt };
      y += hgt;
      return row;
    });
    labels.replaceChildren();
    util.replaceChildren();
    labels.style.paddingTop = util.style.paddingTop = `${AXIS_H}px`;
    const utilEls = rows.map((r) => {
      const label = h("div", "pw-tl-lane-label", r.info.label);
      label.dataset.kind = "device";
      label.dataset.lane = r.info.key;
      label.style.height = label.style.lineHeight = `${r.h}px`;
      label.title = `device ${r.info.label} of the service`;
      labels.appendChild(label);
      const d = h("div", "pw-tl-lane-util");
      d.style.height = `${r.h}px`;
      const bar = h("span", "pw-tl-ubar");
      const fill = h("span");
      bar.appendChild(fill);
      const txt = h("span");
      d.append(bar, txt);
      util.appendChild(d);
      return { d, fill, txt };
    });
    return { rows, height: y + 2, utilEls };
  }

  // ---- legend and table: one entry per client, with what the view drew of it
  function drawClients(clients, barsOf) {
    legend.replaceChildren();
    clients.forEach((c, k) => {
      const item = h("span", "pw-item pw-pool-client");
      item.dataset.client = c.name;
      item.dataset.bars = String(barsOf[k] || 0);
      item.dataset.connected = String(!!c.connected);
      const weight = c.weight === null || c.weight === undefined ? "" : ` · weight ${c.weight}`;
      item.append(swatch(clientColour(c)), h("span", "", `${c.name}${c.you ? " (you)" : ""}${weight}`));
      if (!c.connected) item.append(h("span", "pw-sub", " gone"));
      item.title = c.connected ? `client ${c.name} (pid ${c.pid})` : `client ${c.name}: disconnected; its bars stay`;
      legend.appendChild(item);
    });
    const headRow = h("tr");
    for (const t of ["client", "weight", "share (10 s)", "runs queued", "memory held", "device time", "runs", "nodes"])
      headRow.appendChild(h("th", "", t));
    const thead = h("thead");
    thead.appendChild(headRow);
    const tbody = h("tbody");
    for (const c of clients) {
      const tr = h("tr");
      tr.dataset.client = c.name;
      const name = h("td");
      name.append(swatch(clientColour(c)), h("span", "", c.name + (c.you ? " (you)" : "") + (c.connected ? "" : " (gone)")));
      const cell = (v) => h("td", "", v === null || v === undefined ? "–" : v);
      tr.append(
        name,
        cell(c.weight),
        cell(`${(100 * (c.share || 0)).toFixed(1)}%`),
        cell(c.queued),
        cell(c.connected ? fmtBytes(c.memory_bytes || 0) + (c.memory_cap ? ` (cap ${fmtBytes(c.memory_cap)}/device)` : "") : null),
        cell(c.device_time_s === null || c.device_time_s === undefined ? null : fmtNs(c.device_time_s * 1e9)),
        cell(c.runs),
        cell(c.nodes),
      );
      tbody.appendChild(tr);
    }
    table.replaceChildren(thead, tbody);
  }

  // ---- the share strip: per whole window, each client's share of the pool's device time, stacked
  function drawShares(data, clients, width) {
    const s = data.samples || {};
    const t = s.t || [];
    const by = s.share || {};
    const ctx = canvasContext(sharesCanvas, width, SHARES_H);
    ctx.fillStyle = "rgba(128,128,128,0.13)";
    ctx.fillRect(0, 0, width, SHARES_H);
    const n = t.length;
    sharesCaption.textContent = n
      ? `share of the pool's device time, per ${fmtNs(s.window_ns || 1e9)}, the last ${fmtNs(n * (s.window_ns || 1e9))}`
      : "share of the pool's device time: no whole window yet";
    sharesBox.dataset.windows = String(n);
    if (!n) return;
    const bw = width / n;
    for (let i = 0; i < n; i++) {
      let y = SHARES_H;
      for (const c of clients) {
        const v = (by[c.name] || [])[i] || 0;
        if (v <= 0) continue;
        const hh = Math.min(y, v * SHARES_H);
        ctx.fillStyle = clientColour(c);
        ctx.fillRect(i * bw, y - hh, Math.max(bw - (bw > 3 ? 1 : 0), 1), hh);
        y -= hh;
      }
    }
  }

  // ---- drawing
  function draw() {
    raf = 0;
    const data = model.get("data") || {};
    const clients = data.clients || [];
    const devices = data.devices || [];
    const built = buildRows(devices);
    const { store, cidx, n } = poolLanes(data);
    const width = Math.max(120, Math.floor(plot.clientWidth || 600));
    const ctx = canvasContext(canvas, width, built.height);
    const inkColour = getComputedStyle(root).color || "#222";
    const windowNs = Math.max(1e6, (model.get("window_s") || 30) * 1e9);
    const latest = data.latest_ns || data.now_ns || windowNs;
    const v1 = latest + windowNs * 0.02;
    const v0 = latest - windowNs;
    const win = { v0, v1, kx: width / (v1 - v0), width };
    drawGrid(ctx, built.rows, width, built.height, win, latest, inkColour);
    const drawn = drawBars(ctx, store, built.rows, win, cidx, palette(), rects);
    if (!n) {
      ctx.fillStyle = inkColour;
      ctx.globalAlpha = 0.6;
      ctx.textAlign = "center";
      ctx.font = "12px system-ui, sans-serif";
      ctx.fillText("no node has run on the service's devices yet", width / 2, AXIS_H + 14);
      ctx.globalAlpha = 1;
    }
    built.rows.forEach((r, i) => {
      const pct = Math.min(100, (drawn.util[i] || 0) * 100);
      const u = built.utilEls[i];
      u.fill.style.width = `${pct.toFixed(0)}%`;
      u.txt.textContent = `${pct.toFixed(0)}%`;
      u.d.title = `${r.info.label}: busy ${pct.toFixed(1)}% of the visible window`;
    });
    const sp = data.spans || {};
    const barsOf = clients.map(() => 0);
    for (let i = 0; i < n; i++) if (sp.end[i] >= v0 && sp.client[i] < barsOf.length) barsOf[sp.client[i]]++;
    drawClients(clients, barsOf);
    drawShares(data, clients, width);
    const ago = data.now_ns && data.latest_ns ? data.now_ns - data.latest_ns : null;
    stats.textContent =
      `${clients.filter((c) => c.connected).length} clients · ${devices.length} devices · ${drawn.bars} nodes in view` +
      (ago === null ? "" : ago > 1e9 ? ` · latest activity ${fmtNs(ago)} ago` : " · busy now");
    title.textContent = model.get("title") || "pool";
    live.style.display = model.get("live") ? "" : "none";
    const err = model.get("error") || "";
    error.textContent = err;
    error.style.display = err ? "" : "none";
    root.dataset.clients = String(clients.length);
    root.dataset.deviceLanes = String(built.rows.length);
    root.dataset.barsInView = String(drawn.bars);
    view = { rows: built.rows, lanes: store.lanes, win, data };
  }

  function schedule() {
    if (!raf) raf = requestAnimationFrame(draw);
  }

  // ---- hover: the bar under the pointer, its client, device and duration
  canvas.addEventListener("pointermove", (e) => {
    const r = canvas.getBoundingClientRect();
    const x = e.clientX - r.left;
    const y = e.clientY - r.top;
    const row = view.rows.find((w) => y >= w.y && y < w.y + w.h);
    const lane = row && view.lanes ? view.lanes[row.lane] : null;
    if (!lane || !lane.n || !view.win) return (tip.style.display = "none");
    lane.ensureSorted();
    const t = view.win.v0 + x / view.win.kx;
    const tol = 3 / view.win.kx;
    let hit = -1;
    for (let i = lane.lowerBound(t + tol) - 1; i >= 0 && lane.s[i] >= t - tol - lane.maxDur; i--) {
      if (lane.e[i] >= t - tol) {
        hit = i;
        break;
      }
    }
    if (hit < 0) return (tip.style.display = "none");
    const data = view.data;
    const c = (data.clients || [])[data.spans.client[lane.idx[hit]]] || { name: "?" };
    showTip(tip, root, [
      `${c.name}${c.weight === null || c.weight === undefined ? "" : ` (weight ${c.weight})`}`,
      `${fmtNs(lane.e[hit] - lane.s[hit])} on ${row.info.label}`,
      `ended ${fmtNs((data.latest_ns || 0) - lane.e[hit])} before the latest node`,
    ], e.clientX, e.clientY);
  });
  canvas.addEventListener("pointerleave", () => (tip.style.display = "none"));

  const offs = [onChange(model, ["data", "palette", "window_s", "title", "live", "error"], schedule)];
  const resize = typeof ResizeObserver === "function" ? new ResizeObserver(() => schedule()) : null;
  resize?.observe(plot);
  root.pwPool = { redraw: draw };
  draw();
  return () => {
    if (raf) cancelAnimationFrame(raf);
    for (const off of offs) off();
    resize?.disconnect();
    el.replaceChildren();
  };
}

export default { render };

// GraphWidget front-end: the program graph's SVG (laid out by graphviz) in a viewport that zooms and pans.
// Wheel: zoom around the cursor · drag: pan · double-click or "fit": the whole graph · "1:1": natural size.
// The search box highlights nodes whose label or tooltip contains the text; Enter steps through them.
// The SVG is parsed as XML (DOMParser), never as HTML, and anything active in it is dropped.
// Loaded after prelude.js (h, panZoom, onChange).

const MIN_ZOOM = 0.02;
const MAX_ZOOM = 8;

function parseSvg(text) {
  if (!text) return null;
  const doc = new DOMParser().parseFromString(text, "image/svg+xml");
  const root = doc.documentElement;
  if (!root || root.nodeName !== "svg" || doc.getElementsByTagName("parsererror").length) return null;
  for (const bad of root.querySelectorAll("script, foreignObject, iframe, object, embed")) bad.remove();
  for (const e of root.querySelectorAll("*")) {
    for (const a of Array.from(e.attributes)) {
      const v = a.value.trim().toLowerCase();
      if (a.name.toLowerCase().startsWith("on") || ((a.localName === "href") && v.startsWith("javascript:"))) {
        e.removeAttribute(a.name);
      }
    }
  }
  return document.importNode(root, true);
}

function nodeText(g) {
  // what a search matches: the label, and the tooltip (name, slice, shapes) graphviz keeps on the link
  const label = Array.from(g.querySelectorAll("text"), (t) => t.textContent).join(" ");
  const link = g.querySelector("a");
  const tip = link ? link.getAttribute("xlink:title") || link.getAttributeNS("http://www.w3.org/1999/xlink", "title") || "" : "";
  return `${label}\n${tip}`.toLowerCase();
}

function render({ model, el }) {
  const root = h("div", "pw-w pw-graph-view");
  const title = h("div", "pw-gv-title");
  const bar = h("div", "pw-gv-bar");
  const search = h("input", "pw-gv-search");
  search.type = "search";
  search.placeholder = "search (Enter: next)";
  search.setAttribute("aria-label", "search nodes");
  const count = h("span", "pw-gv-count");
  const out = h("button", "pw-gv-out", "−");
  out.title = "zoom out";
  const inn = h("button", "pw-gv-in", "+");
  inn.title = "zoom in";
  const fit = h("button", "pw-gv-fit", "fit");
  fit.title = "show the whole graph";
  const one = h("button", "pw-gv-reset", "1:1");
  one.title = "natural size (reset)";
  bar.append(search, count, out, inn, fit, one);
  const viewport = h("div", "pw-gv-viewport");
  const stage = h("div", "pw-gv-stage");
  viewport.appendChild(stage);
  const hint = h("div", "pw-gv-hint", "wheel: zoom · drag: pan · double-click: fit · hover a node: details");
  root.append(title, bar, viewport, hint);
  el.appendChild(root);

  let svg = null;
  let natural = { w: 1, h: 1 }; // the SVG's size in CSS pixels at zoom 1
  let view = { x: 0, y: 0, k: 1 };
  let hits = [];
  let current = -1;
  let touched = false; // the user moved the view: a resize no longer resets it

  function apply(byUser = false) {
    if (byUser) touched = true;
    stage.style.transform = `translate(${view.x}px, ${view.y}px) scale(${view.k})`;
    root.dataset.zoom = view.k.toFixed(4);
  }

  function viewportSize() {
    const r = viewport.getBoundingClientRect();
    return { w: Math.max(r.width, 1), h: Math.max(r.height, 1) };
  }

  function zoomAt(px, py, k) {
    const k2 = Math.min(Math.max(k, MIN_ZOOM), MAX_ZOOM);
    view = { x: px - ((px - view.x) * k2) / view.k, y: py - ((py - view.y) * k2) / view.k, k: k2 };
    apply(true);
  }

  function fitAll() {
    const v = viewportSize();
    const k = Math.min(v.w / natural.w, v.h / natural.h, 1);
    view = { x: (v.w - natural.w * k) / 2, y: (v.h - natural.h * k) / 2, k };
    apply(true);
  }

  function startZoom(width, maxH) {
    // the whole graph if that keeps text readable, else as much as does (pan for the rest); never enlarged
    const whole = Math.min(width / natural.w, maxH / natural.h);
    return Math.min(1, Math.max(model.get("min_start_zoom") || 0.7, whole));
  }

  function startView() {
    const width = viewport.getBoundingClientRect().width;
    const maxH = model.get("height") || 560;
    const k = width > 0 ? startZoom(width, maxH) : 1;
    viewport.style.height = `${Math.round(Math.min(maxH, Math.max(natural.h * k + 2, 60)))}px`;
    view = { x: width > 0 && natural.w * k < width ? (width - natural.w * k) / 2 : 0, y: 0, k };
    apply();
  }

  function svgSize(s) {
    // graphviz sizes its SVG in points (96 px = 72 pt)
    const px = (a) => {
      const v = parseFloat(a || "");
      return Number.isFinite(v) && v > 0 ? (/pt$/.test(a.trim()) ? (v * 4) / 3 : v) : null;
    };
    const vb = s.viewBox && s.viewBox.baseVal;
    const w = px(s.getAttribute("width")) || (vb && vb.width) || 300;
    const h = px(s.getAttribute("height")) || (vb && vb.height) || 150;
    return { w, h };
  }

  function draw() {
    title.textContent = model.get("title") || "";
    stage.replaceChildren();
    svg = parseSvg(model.get("svg"));
    if (!svg) {
      viewport.style.height = "40px";
      stage.appendChild(h("div", "pw-sub", "(no picture)"));
      root.dataset.nodes = "0";
      return;
    }
    natural = svgSize(svg);
    svg.style.width = `${natural.w}px`;
    svg.style.height = `${natural.h}px`;
    stage.appendChild(svg);
    root.dataset.nodes = String(svg.querySelectorAll("g.node").length);
    touched = false;
    startView();
    runSearch();
  }

  // ---- search
  function runSearch() {
    if (!svg) return;
    const q = search.value.trim().toLowerCase();
    for (const g of svg.querySelectorAll("g.node")) g.classList.remove("pw-gv-hit", "pw-gv-current");
    hits = [];
    current = -1;
    if (!q) {
      svg.classList.remove("pw-gv-searching");
      count.textContent = "";
      root.dataset.hits = "0";
      return;
    }
    for (const g of svg.querySelectorAll("g.node")) {
      if (nodeText(g).includes(q)) {
        g.classList.add("pw-gv-hit");
        hits.push(g);
      }
    }
    svg.classList.add("pw-gv-searching");
    count.textContent = hits.length === 1 ? "1 node" : `${hits.length} nodes`;
    root.dataset.hits = String(hits.length);
  }

  function showNext() {
    if (!hits.length) return;
    if (current >= 0) hits[current].classList.remove("pw-gv-current");
    current = (current + 1) % hits.length;
    const g = hits[current];
    g.classList.add("pw-gv-current");
    count.textContent = `${current + 1} of ${hits.length}`;
    // centre it, at a readable zoom
    const k = Math.max(view.k, 1);
    const vr = viewport.getBoundingClientRect();
    const gr = g.getBoundingClientRect();
    const cx = (gr.left + gr.width / 2 - vr.left - view.x) / view.k; // in natural pixels
    const cy = (gr.top + gr.height / 2 - vr.top - view.y) / view.k;
    view = { x: vr.width / 2 - cx * k, y: vr.height / 2 - cy * k, k };
    apply(true);
  }

  // ---- interaction
  panZoom(viewport, {
    perPixel: 0.0015,
    zoom: (factor, x, y) => zoomAt(x, y, view.k * factor),
    grab: () => ({ x: view.x, y: view.y }),
    pan: (dx, dy, from) => {
      view = { ...view, x: from.x + dx, y: from.y + dy };
      apply(true);
    },
  });
  function centre() {
    const v = viewportSize();
    return [v.w / 2, v.h / 2];
  }
  const onIn = () => zoomAt(...centre(), view.k * 1.25);
  const onOut = () => zoomAt(...centre(), view.k / 1.25);
  const onOne = () => {
    view = { x: 0, y: 0, k: 1 };
    apply(true);
  };
  const onKey = (e) => {
    if (e.key === "Enter") {
      e.preventDefault();
      showNext();
    } else if (e.key === "Escape") {
      search.value = "";
      runSearch();
    }
  };

  viewport.addEventListener("dblclick", fitAll);
  inn.addEventListener("click", onIn);
  out.addEventListener("click", onOut);
  fit.addEventListener("click", fitAll);
  one.addEventListener("click", onOne);
  search.addEventListener("input", runSearch);
  search.addEventListener("keydown", onKey);

  const off = onChange(model, ["svg", "title", "height"], draw);
  draw();
  // the output area may lay the widget out after render: start over once it has a width (until the user moves)
  const resized = new ResizeObserver(() => {
    if (!touched && svg) startView();
  });
  resized.observe(viewport);
  return () => {
    resized.disconnect();
    off();
    el.replaceChildren();
  };
}

export default { render };

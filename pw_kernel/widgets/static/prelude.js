// What every pw_kernel widget's front-end shares: elements, colours, formatting, tooltips, pan and zoom.
// Python puts this file in front of each widget's own files when it loads the widget's ES module
// (pw_kernel/widgets/esm.py, `esm_source`), so these are plain declarations in scope in every widget: no
// imports, no exports, no build step. A widget's files must not declare these names again.
// Every string goes into the page as text (`h` sets textContent), never parsed as HTML.

const HEX = /^#[0-9a-fA-F]{6}$/;
const TIME_UNITS = [
  [1e9, "s"],
  [1e6, "ms"],
  [1e3, "µs"],
  [1, "ns"],
];

// ---------------------------------------------------------------- elements
// An element with a class and a text (set as text: a user's string never becomes markup).
function h(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

// Call `fn` on a change of any of the traits `names`; returns what stops it (for a view's cleanup).
function onChange(model, names, fn) {
  for (const k of names) model.on(`change:${k}`, fn);
  return () => {
    for (const k of names) model.off(`change:${k}`, fn);
  };
}

// ----------------------------------------------------------------- colours
// A colour from the kernel if it is #rrggbb, else grey: a trait never turns into CSS it did not mean.
function colour(c) {
  return HEX.test(c) ? c : "#999999";
}

// Black or white, whichever reads better on `bg` (_html.text_colour).
function ink(bg) {
  const c = colour(bg);
  const [r, g, b] = [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16) / 255);
  return 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 ? "#111" : "#fff";
}

// A legend's colour square (class `pw-swatch`, widgets.css).
function swatch(c) {
  const s = h("span", "pw-swatch");
  s.style.background = c;
  return s;
}

// -------------------------------------------------------------- formatting
// A duration as _html.fmt_ns writes it: 850 ns, 12.3 µs, 4.56 ms, 1.23 s.
function fmtNs(ns) {
  const a = Math.abs(ns);
  const g = (x) => String(Number(x.toPrecision(3)));
  if (a < 1e3) return `${ns.toFixed(0)} ns`;
  if (a < 1e6) return `${g(ns / 1e3)} µs`;
  if (a < 1e9) return `${g(ns / 1e6)} ms`;
  return `${g(ns / 1e9)} s`;
}

// A size in binary units, as _html.fmt_bytes writes it: 512 B, 1.5 KiB, 3.0 MiB.
function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let k = 0;
  while (n >= 1024 && k < units.length - 1) {
    n /= 1024;
    k++;
  }
  return k ? `${n.toFixed(1)} ${units[k]}` : `${n} B`;
}

// A 1-2-5 step that cuts `span` into about `target` ticks (_html.nice_step).
function niceStep(span, target) {
  const raw = span / Math.max(target, 1);
  if (!(raw > 0)) return 1;
  const mag = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

// Tick labels of a time axis: one unit for the whole axis (from its largest value) and as many decimals as the
// tick step needs, so neighbouring labels differ even zoomed far in (14.1001 ms, 14.1002 ms, not 14.1 ms twice).
// The origin reads "0 ns". timeline_html.axis_labels is the same rule for the static picture.
function axisLabels(values, step) {
  let big = step;
  for (const v of values) big = Math.max(big, Math.abs(v));
  const [scale, unit] = TIME_UNITS.find(([sc]) => big >= sc) || TIME_UNITS[TIME_UNITS.length - 1];
  const dec = Math.min(20, Math.max(0, Math.ceil(-Math.log10(step / scale) - 1e-9)));
  return values.map((v) => (v === 0 ? "0 ns" : `${(v / scale).toFixed(dec)} ${unit}`));
}

// ---------------------------------------------------------------- tooltips
// Fill the tooltip `tip` (class `pw-tip`, inside `box`) with `lines`, the first in bold, and show it by the pointer.
function showTip(tip, box, lines, clientX, clientY) {
  tip.replaceChildren(...lines.map((line, k) => h("div", k === 0 ? "pw-tip-head" : "", line)));
  tip.style.display = "block";
  moveTip(tip, box, clientX, clientY);
}

// Keep the tooltip beside the pointer: right of it, or left of it where it would leave `box`.
function moveTip(tip, box, clientX, clientY) {
  const r = box.getBoundingClientRect();
  let x = clientX - r.left + 14;
  if (x + tip.offsetWidth > r.width) x = Math.max(0, clientX - r.left - tip.offsetWidth - 10);
  tip.style.left = `${x}px`;
  tip.style.top = `${clientY - r.top + 14}px`;
}

// ------------------------------------------------------------ pan and zoom
// The wheel zooms and a left-button drag pans `el`, as every widget does it:
//   zoom(factor, x, y)  a wheel turn: factor > 1 zooms in, around (x, y) in pixels from el's corner;
//                       `perPixel` is how much one pixel of wheel delta zooms (lines and pages are fixed steps);
//   grab()              a drag starts: returns what `pan` gets back as `from` (the view it started from);
//   pan(dx, dy, from)   the pointer moved dx, dy pixels since the drag started;
//   hover(e)            the pointer moved without a drag (optional).
// Returns {dragging()}: whether a drag is under way. The listeners go with the element.
function panZoom(el, { perPixel, zoom, grab, pan, hover }) {
  let drag = null;
  el.addEventListener(
    "wheel",
    (e) => {
      e.preventDefault();
      const r = el.getBoundingClientRect();
      const unit = e.deltaMode === 1 ? 0.05 : e.deltaMode === 2 ? 0.5 : perPixel;
      zoom(Math.exp(-e.deltaY * unit), e.clientX - r.left, e.clientY - r.top);
    },
    { passive: false },
  );
  el.addEventListener("pointerdown", (e) => {
    if (e.button !== 0) return;
    drag = { x: e.clientX, y: e.clientY, from: grab() };
    el.setPointerCapture?.(e.pointerId);
    el.classList.add("pw-dragging");
  });
  el.addEventListener("pointermove", (e) => {
    if (drag) pan(e.clientX - drag.x, e.clientY - drag.y, drag.from);
    else if (hover) hover(e);
  });
  const up = (e) => {
    if (!drag) return;
    el.releasePointerCapture?.(e.pointerId);
    el.classList.remove("pw-dragging");
    drag = null;
  };
  el.addEventListener("pointerup", up);
  el.addEventListener("pointercancel", up);
  return { dragging: () => drag !== null };
}

// ------------------------------------------------------------------ canvas
// `canvas` sized to width x height CSS pixels at the screen's pixel ratio (sharp on HiDPI screens); returns its 2-D
// context, cleared, drawing in CSS pixels.
function canvasContext(canvas, width, height) {
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  return ctx;
}

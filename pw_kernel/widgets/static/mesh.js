// MeshWidget front-end: the device mesh grid, where each shard lives, or every device by island.
// Draws only what the traits say; every string goes in through textContent.
// Loaded after prelude.js (h, colour, ink, swatch, showTip, moveTip, onChange).

function stripes(colours) {
  if (colours.length === 1) return colour(colours[0]);
  const stops = colours.map((c, k) => `${colour(c)} ${k * 8}px ${(k + 1) * 8}px`);
  return `repeating-linear-gradient(135deg,${stops.join(",")})`;
}

function render({ model, el }) {
  const root = h("div", "pw-w pw-mesh");
  const tip = h("div", "pw-tip");
  el.appendChild(root);

  function tipAt(ev, lines) {
    showTip(tip, root, lines, ev.clientX, ev.clientY);
  }
  function followTip(ev) {
    moveTip(tip, root, ev.clientX, ev.clientY);
  }
  function hideTip() {
    tip.style.display = "none";
  }

  function draw() {
    root.replaceChildren();
    const kind = model.get("kind");
    const devices = model.get("devices") || {};
    root.dataset.kind = kind;
    root.appendChild(h("div", "pw-title", model.get("title")));
    const cells = new Map(); // device id -> [cell elements]
    const tiles = []; // [element, device ids]
    const holds = new Map(); // device id -> [index strings]

    function highlight(ids, on) {
      const set = new Set(ids);
      for (const [d, els] of cells) for (const c of els) c.classList.toggle("pw-hl", on && set.has(d));
      for (const [t, devs] of tiles) {
        const mine = devs.some((d) => set.has(d));
        t.classList.toggle("pw-hl", on && mine);
        t.classList.toggle("pw-dim", on && !mine);
      }
    }

    function deviceCell(id) {
      const dev = devices[String(id)] || { id, label: `device ${id}`, short: "", colour: "#999999", coords: "" };
      const c = h("div", "pw-mesh-cell");
      c.dataset.device = String(id);
      c.style.background = colour(dev.colour);
      c.style.color = ink(dev.colour);
      c.appendChild(h("b", "", id));
      c.appendChild(h("div", "pw-dev-kind", dev.short));
      c.addEventListener("mouseenter", (ev) => {
        const lines = [dev.label];
        if (dev.coords) lines.push(`mesh position: ${dev.coords}`);
        const held = holds.get(id);
        if (held) lines.push(`holds ${held.join(", ")}`);
        tipAt(ev, lines);
        highlight([id], true);
      });
      c.addEventListener("mousemove", followTip);
      c.addEventListener("mouseleave", () => {
        hideTip();
        highlight([], false);
      });
      if (!cells.has(id)) cells.set(id, []);
      cells.get(id).push(c);
      return c;
    }

    if (kind === "devices") {
      const slices = model.get("slices") || [];
      for (const isl of model.get("islands") || []) {
        const box = h("div", "pw-island");
        const head = h("div", "");
        head.appendChild(h("b", "", `island ${isl.id}`));
        head.appendChild(h("span", "pw-sub", ` (${isl.platform}, ${isl.devices.length} devices)`));
        box.appendChild(head);
        const row = h("div", "pw-island-cells");
        for (const d of isl.devices) {
          const dev = devices[String(d)] || { label: `device ${d}`, short: "" };
          const c = h("div", "pw-dev-box pw-mesh-cell");
          c.style.height = "auto";
          c.style.width = "auto";
          c.dataset.device = String(d);
          c.appendChild(h("b", "", d));
          c.appendChild(h("div", "pw-dev-kind", dev.short));
          const on = slices.filter((s) => s.devices.includes(d));
          if (!on.length) c.appendChild(h("div", "pw-chip pw-sub", "free"));
          for (const s of on) {
            const chip = h("div", "pw-chip", s.name);
            chip.style.background = colour(s.colour);
            chip.style.color = ink(s.colour);
            c.appendChild(chip);
          }
          c.addEventListener("mouseenter", (ev) =>
            tipAt(ev, [dev.label, on.length ? `slices: ${on.map((s) => s.name).join(", ")}` : "no slice"]),
          );
          c.addEventListener("mousemove", followTip);
          c.addEventListener("mouseleave", hideTip);
          row.appendChild(c);
        }
        box.appendChild(row);
        root.appendChild(box);
      }
      if (slices.length) {
        const table = h("table", "pw-slices");
        const tr = h("tr");
        for (const t of ["slice", "mesh", "devices", "island"]) tr.appendChild(h("th", "", t));
        table.appendChild(tr);
        for (const s of slices) {
          const row = h("tr");
          const name = h("td");
          name.appendChild(swatch(colour(s.colour)));
          name.appendChild(h("code", "", s.name));
          row.appendChild(name);
          row.appendChild(h("td", "", s.mesh));
          row.appendChild(h("td", "", s.devices.join(", ")));
          row.appendChild(h("td", "", s.island));
          table.appendChild(row);
        }
        root.appendChild(table);
      }
      root.appendChild(tip);
      return;
    }

    const array = model.get("array") || {};
    if (kind === "array") {
      for (const f of array.facets || [])
        for (const t of f.tiles) for (const d of t.devices) {
          if (!holds.has(d)) holds.set(d, []);
          holds.get(d).push(`${array.name}${t.index}`);
        }
      root.appendChild(h("div", "pw-sub", "device mesh"));
    }
    const meshBox = h("div", "pw-facets");
    for (const f of model.get("mesh_facets") || []) {
      const facet = h("div", "pw-facet pw-mesh-facet");
      if (f.label) facet.appendChild(h("div", "pw-facet-label", f.label));
      const grid = h("div", "pw-grid");
      grid.style.gridTemplateColumns = `auto repeat(${f.cols}, 58px)`;
      const at = new Map(f.cells.map((c) => [`${c.r},${c.c}`, c.device]));
      grid.appendChild(h("div", "pw-axis"));
      for (const lab of f.col_labels) grid.appendChild(h("div", "pw-axis", lab));
      for (let r = 0; r < f.rows; r++) {
        grid.appendChild(h("div", "pw-axis pw-row", f.row_labels[r] || ""));
        for (let c = 0; c < f.cols; c++) {
          const id = at.get(`${r},${c}`);
          grid.appendChild(id === undefined ? h("div") : deviceCell(id)); // a wrapped 1-D mesh ends early
        }
      }
      facet.appendChild(grid);
      meshBox.appendChild(facet);
    }
    root.appendChild(meshBox);

    if (kind === "array") {
      const head = h("div", "pw-array-head");
      head.appendChild(h("b", "", array.name));
      head.appendChild(document.createTextNode(": "));
      head.appendChild(h("code", "", array.type));
      head.appendChild(document.createTextNode(" · "));
      head.appendChild(h("code", "", array.spec));
      head.appendChild(h("span", "pw-sub", ` · ${array.summary}`));
      root.appendChild(head);
      const box = h("div", "pw-facets");
      for (const f of array.facets || []) {
        const facet = h("div", "pw-facet pw-array-facet");
        if (f.label) facet.appendChild(h("div", "pw-facet-label", f.label));
        const area = h("div", "pw-tiles");
        area.style.width = `${f.width}px`;
        area.style.height = `${f.height}px`;
        for (const t of f.tiles) {
          const tile = h("div", "pw-tile");
          tile.dataset.devices = t.devices.join(",");
          tile.dataset.index = t.index;
          Object.assign(tile.style, { left: `${t.x}px`, top: `${t.y}px`, width: `${t.w}px`, height: `${t.h}px` });
          const cols = t.devices.map((d) => (devices[String(d)] || {}).colour || "#999999");
          tile.style.background = stripes(cols);
          tile.appendChild(h("span", "pw-ids", t.devices.join(",")));
          const replicated = t.devices.length > 1;
          if (replicated) tile.appendChild(h("span", "pw-rep", `×${t.devices.length}`));
          tile.addEventListener("mouseenter", (ev) => {
            const where = t.devices.map((d) => {
              const dev = devices[String(d)] || {};
              return `  ${dev.label || d}${dev.coords ? `  (${dev.coords})` : ""}`;
            });
            tipAt(ev, [
              `${array.name}${t.index}`,
              `shard ${t.shard}`,
              replicated ? `replicated on ${t.devices.length} devices:` : "on device:",
              ...where,
            ]);
            highlight(t.devices, true);
          });
          tile.addEventListener("mousemove", followTip);
          tile.addEventListener("mouseleave", () => {
            hideTip();
            highlight([], false);
          });
          tiles.push([tile, t.devices]);
          area.appendChild(tile);
        }
        facet.appendChild(area);
        box.appendChild(facet);
      }
      root.appendChild(box);
    }
    root.appendChild(tip);
  }

  const off = onChange(model, ["kind", "title", "devices", "mesh_facets", "array", "islands", "slices"], draw);
  draw();
  return () => {
    off();
    el.replaceChildren();
  };
}

export default { render };

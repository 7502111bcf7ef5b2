// TimelineWidget front-end, part 1 of 3: the data. Chunks of events (column-wise, as custom messages with binary
// buffers or in the `_base` trait) go into one store per model, shared by its views and surviving re-renders.
// Each lane keeps its bars sorted by start, so a redraw touches only the bars in view (timeline_draw.js).
// Loaded after prelude.js; timeline_draw.js and timeline.js follow (pw_kernel/widgets/esm.py).

const NONE = 0xffffffff;
const KINDS = ["compute", "glue", "transfer", "compile", "checkpoint", "input", "op"];
const U = 7; // uint32 fields per event: run, node, program, tenant, shapes, error, kind
const STORES = (globalThis.__pwTimelineStores = globalThis.__pwTimelineStores || new Map());

// Copy a DataView / ArrayBuffer / typed array into a fresh, aligned typed array.
function typed(buf, Kind) {
  if (!buf) return new Kind(0);
  let bytes;
  if (buf instanceof ArrayBuffer) bytes = buf.slice(0);
  else if (ArrayBuffer.isView(buf)) bytes = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
  else return new Kind(0);
  return new Kind(bytes, 0, Math.floor(bytes.byteLength / Kind.BYTES_PER_ELEMENT));
}

// `arr`, or a copy of it at least `need` long (doubling, so appending costs O(1) amortized).
function grow(arr, need) {
  if (need <= arr.length) return arr;
  const next = new arr.constructor(Math.max(need, arr.length * 2, 256));
  next.set(arr);
  return next;
}

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


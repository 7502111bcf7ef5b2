"""What the pool did lately: every client's nodes on the service's devices, and each client's share of them.

`PoolRecord` is fed by the service's controller as it times nodes (the node
events the service already counts device time from, `state.ServiceState.on_node_time`):
one span per node and device, (device, start, end, client's tenant), in a ring of
the latest `SPANS`; and each client's device time per `SAMPLE_NS` window, for the
last `SAMPLES` windows (five minutes), from which its share of the pool is read.
Recording a node costs a few appends under a lock: nothing scans history, and
no buffer is counted, on a call's path.

`pool_data` is the answer to a `protocol.Pool` request and what the dashboard
serves (`dashboard.py`): computed when asked, a plain dict (JSON as it is) of
the devices, every client (weight, share over the recent windows, runs queued,
bytes of buffers held, device time), the spans since a time, and the share
samples. `pw.pool()` draws it live, ``python -m pw_kernel serve --dashboard PORT``
as a web page; neither is drawn here.

Privacy: every client of a service sees every other client's bars, **named**.
All clients of one service are the same user: the connection file is that
user's alone (0600), and every message is signed with the key inside it, so
whoever can ask is whoever could read (or free) any of those clients' arrays.
The dashboard shows the same to whoever can open 127.0.0.1:PORT on this host.

Example::

    record = PoolRecord(ctrl.events.epoch)
    ctrl.events.subscribe(record.on_node)           # the service feeds it from its node events
    pool_data(record, state.clients, devices)       # {"devices": [...], "clients": [...], "spans": {...}, ...}
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable
from typing import Any


#: Node spans kept (one per node and device), the oldest first out.
SPANS = 20_000
#: The window a share is measured over (ns) ...
SAMPLE_NS = 1_000_000_000
#: ... and how many windows are kept: five minutes of shares.
SAMPLES = 300
#: A client's ``share`` in `pool_data`: over this many of the latest whole windows.
RECENT = 10


class PoolRecord:
    """The pool's recent activity: a ring of node spans per device and client, and device time per client per window.

    Times are the service's clock (`time.perf_counter_ns`, as `protocol.Clock`
    answers); node events come in ns after the event log's ``epoch``.

    Example::

        record = PoolRecord(epoch_ns=0, spans=100)
        record.add(0, 1_000, 2_000, "alice")          # device 0 ran a node of alice's
        record.spans_since(0)                         # [(0, 1000, 2000, 'alice')]
    """

    def __init__(self, epoch_ns: int = 0, spans: int = SPANS, sample_ns: int = SAMPLE_NS, samples: int = SAMPLES):
        self.epoch = epoch_ns
        self.sample_ns = sample_ns
        self.samples = samples
        self.spans: collections.deque[tuple[int, int, int, str]] = collections.deque(maxlen=spans)
        self.recorded = 0  # spans recorded in all (those beyond the ring's size are gone)
        self._windows: dict[int, dict[str, int]] = {}  # window index -> tenant -> device ns in it
        self._newest = -1  # the newest window index seen
        self._colours: dict[str, int] = {}  # tenant -> its colour index (the smallest free when first seen)
        self._lock = threading.Lock()

    def on_node(self, ev: Any) -> None:
        """A node event of the service's controller (on its thread): one span per device it ran on."""
        if ev.kind == "compile":  # (device time is running time: compiles are the host's)
            return
        start, end = ev.start + self.epoch, ev.end + self.epoch
        for d in ev.devices:
            self.add(int(d), start, end, ev.tenant)

    def add(self, device: int, start_ns: int, end_ns: int, tenant: str) -> None:
        """Record that ``device`` ran a node of ``tenant`` from ``start_ns`` to ``end_ns`` (the service's clock)."""
        end_ns = max(end_ns, start_ns)
        with self._lock:
            self.spans.append((device, start_ns, end_ns, tenant))
            self.recorded += 1
            if tenant not in self._colours:
                self._colour(tenant)
            w_ns = self.sample_ns
            last = (end_ns - 1) // w_ns if end_ns > start_ns else start_ns // w_ns
            # a node longer than the windows kept counts in those kept only (bounded work per node)
            for w in range(max(start_ns // w_ns, last - self.samples + 1), last + 1):
                part = min(end_ns, (w + 1) * w_ns) - max(start_ns, w * w_ns)
                if part <= 0:
                    continue
                window = self._windows.get(w)
                if window is None:
                    window = self._windows[w] = {}
                    if w > self._newest:
                        self._newest = w
                        self._forget_windows_before(w - self.samples + 1)
                window[tenant] = window.get(tenant, 0) + part

    def _forget_windows_before(self, w: int) -> None:
        # (a new window began: about once a `sample_ns`; at most `samples` keys to look at)
        for k in [k for k in self._windows if k < w]:
            del self._windows[k]

    def _colour(self, tenant: str) -> int:
        used = set(self._colours.values())
        k = next(i for i in range(len(used) + 1) if i not in used)
        self._colours[tenant] = k
        return k

    def spans_since(self, since_ns: int = 0) -> list[tuple[int, int, int, str]]:
        """The spans kept that end at or after ``since_ns``, oldest first (a copy); ``since_ns`` < 0: those
        that end within ``-since_ns`` of the latest span's end (the latest activity, whatever the clock says)."""
        with self._lock:
            spans = list(self.spans)  # (copied under the lock: the controller's thread appends)
        if since_ns < 0:
            since_ns += max((s[2] for s in spans), default=0)
        return [s for s in spans if s[2] >= since_ns]

    def shares(self, now_ns: int) -> tuple[list[int], dict[str, list[float]]]:
        """The starts of the windows kept, up to the last whole one before ``now_ns``, and each client's device
        time in each, in devices busy on average (its device ns / the window's ns)."""
        w_ns = self.sample_ns
        last = now_ns // w_ns - 1  # (the window under way is not whole yet: its share would read low)
        first = last - self.samples + 1
        with self._lock:
            windows = {w: dict(self._windows.get(w, {})) for w in range(first, last + 1)}
        starts = [w * w_ns for w in windows]
        tenants = sorted({t for v in windows.values() for t in v})
        return starts, {t: [windows[w].get(t, 0) / w_ns for w in windows] for t in tenants}

    def colours(self, keep: Iterable[str]) -> dict[str, int]:
        """Each tenant's colour index, for ``keep`` (given one now if new); the others are forgotten."""
        keep = list(keep)
        with self._lock:
            for t in keep:
                if t not in self._colours:
                    self._colour(t)
            wanted = set(keep)
            for t in [t for t in self._colours if t not in wanted]:
                del self._colours[t]
            return {t: self._colours[t] for t in keep}


def pool_data(record: PoolRecord, clients: Iterable[Any], devices: list, since_ns: int = 0, you: Any = None) -> dict:
    """What the pool did lately, as a plain dict (the `Pool` request's answer; JSON as it is).

    ``clients``: the service's connected `clients.Client` s; ``devices``: its
    devices; ``since_ns``: spans that end at or after it, on the service's clock
    (0: every span kept; < 0: the last ``-since_ns`` ns of activity). Keys:
    ``now_ns``, ``latest_ns`` (the latest span's end, 0 if none), ``devices``
    [{id, label}], ``clients`` [{name, weight, colour, connected, you, queued
    (runs submitted, not finished), memory_bytes (of its buffers, all devices; `memory.Held`),
    memory_peak_bytes (on its fullest device), memory_cap (its `pw.connect(memory=...)`, or None), buffers,
    device_time_s, runs, nodes, pid, share}] (``share``: of the pool's device
    time over the last `RECENT` whole windows; a disconnected client whose
    spans are still kept comes last, ``connected`` False), ``spans`` {device,
    start, end, client} (columns; ``client`` indexes ``clients``), ``samples``
    {window_ns, t, share: {name: [share of the pool in each window]}} (the last
    `SAMPLES` windows), ``recorded`` (spans recorded in all: the ring keeps the latest).

    Example::

        d = pool_data(state.pool_record, state.clients, state.devices, since_ns=0)
        [c["name"] for c in d["clients"]]          # ['trainer', 'evaluator']
    """
    now = time.perf_counter_ns()
    spans = record.spans_since(since_ns)
    starts, shares = record.shares(now)
    n_dev = max(1, len(devices))
    rows = [_client_row(c, c is you) for c in list(clients)]
    named = {r["name"] for r in rows}
    for t in dict.fromkeys(s[3] for s in spans):
        if t not in named:
            named.add(t)
            rows.append(_gone_row(t))
    colours = record.colours(r["name"] for r in rows)
    index = {r["name"]: k for k, r in enumerate(rows)}
    for r in rows:
        r["colour"] = colours[r["name"]]
        recent = shares.get(r["name"], [])[-RECENT:]
        r["share"] = sum(recent) / (RECENT * n_dev)
    return {
        "now_ns": now,
        "latest_ns": max((s[2] for s in spans), default=0),
        "devices": [{"id": int(d.id), "label": f"{d.platform}:{d.id}"} for d in devices],
        "clients": rows,
        "spans": {
            "device": [s[0] for s in spans], "start": [s[1] for s in spans], "end": [s[2] for s in spans],
            "client": [index[s[3]] for s in spans],
        },
        "samples": {
            "window_ns": record.sample_ns, "t": starts,
            "share": {t: [x / n_dev for x in series] for t, series in shares.items()},
        },
        "recorded": record.recorded,
    }


def _client_row(c: Any, you: bool) -> dict:
    return {
        "name": c.tenant, "weight": float(c.weight), "connected": True, "you": bool(you), "queued": len(c.live),
        "memory_bytes": c.buffers.held.total, "memory_peak_bytes": c.buffers.held.peak, "memory_cap": c.memory,
        "buffers": len(c.buffers), "device_time_s": c.device_ns / 1e9,
        "runs": int(c.runs), "nodes": int(c.nodes), "pid": int(c.pid),
    }


def _gone_row(tenant: str) -> dict:
    return {
        "name": tenant, "weight": None, "connected": False, "you": False, "queued": 0, "memory_bytes": 0,
        "memory_peak_bytes": 0, "memory_cap": None,
        "buffers": 0, "device_time_s": None, "runs": None, "nodes": None, "pid": None,
    }


__all__ = ["RECENT", "SAMPLES", "SAMPLE_NS", "SPANS", "PoolRecord", "pool_data"]

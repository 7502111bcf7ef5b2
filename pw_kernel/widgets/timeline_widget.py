"""TimelineWidget: a lane per device and per transfer path, a bar per executed node, live.

Data path, kept cheap at 100,000 events:

* The widget subscribes to the controller's event log. The callback runs on a
  controller thread and only appends the event to a deque.
* The shared ticker thread (`_base.ticker`) drains the deque at most ~10 times
  a second, encodes the new events column-wise into numpy arrays (a *chunk*:
  ``measures`` (start, end, bytes) as float64, ``ids`` (run, string ids, kind)
  as uint32, one (event, lane) pair per bar, plus the strings not sent
  before) and pushes that chunk to the
  front-end as one custom message with binary buffers. Traits announce what
  exists (``n_chunks``, ``n_events``, ``lanes``, ``runs``), so a front-end
  that missed chunks (a page reload, a message sent before the view existed)
  asks for them again (``{"type": "sync", "have": k}``); the first chunks
  also travel in the ``_base`` trait until a front-end has said hello.
* The front-end (``static/timeline.js``) keeps typed arrays per lane sorted by
  start, and draws on a canvas with level of detail: bars closer than a pixel
  merge, so a redraw costs O(visible bars) and O(pixels) canvas calls.
"""

from __future__ import annotations

import collections
import itertools
import math
import secrets
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import traitlets as t

from ..runtime import FINAL, TraceRow, busy_time, chrome_trace
from ..runtime import controller as get_controller
from . import _html
from ._base import STATIC, PwWidget, controller_of, ticker
from ._devices import island_devices

KINDS: tuple[str, ...] = ("compute", "glue", "transfer", "compile")
_KIND = {k: i for i, k in enumerate(KINDS)}
NONE = 0xFFFFFFFF  # "no string" (an event without an error)
MEASURE_FIELDS = ("start", "end", "nbytes")  # the columns of `Chunk.measures` (float64)
ID_FIELDS = ("run", "node", "program", "tenant", "shapes", "error", "kind")  # the columns of `Chunk.ids` (uint32)
BASE_WINDOW = 5.0  # seconds during which chunks also go into the `_base` trait until the front-end says hello
MAX_LEGEND = 12
FINAL_GRACE = 0.5  # seconds a timeline of given runs keeps listening after they are all final
#: Pixels a bar must span for a gap to cut it from the next bar of its colour (timeline.js's GAP_MIN).
GAP_MIN = 4
#: Compile bars (host lane): a diagonal hatch, as in timeline.js; grey where a viewer drops SVG patterns.
HATCH = ("#8a8a8a", "#e4e4e4")
HATCH_CSS = f"repeating-linear-gradient(135deg,{HATCH[0]} 0 1.5px,{HATCH[1]} 1.5px 4px)"
#: Transfers closer together than a pixel, merged into a strip: (intra-island, cross-island) fill.
MERGED = ("#8c8c8c", "#e07a7a")
_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))


class Chunk(NamedTuple):
    """New events, column-wise: ``measures`` (n, 3), ``ids`` (n, 7), ``bars`` (m, 2) = (event index, lane).

    ``measures`` holds `MEASURE_FIELDS` (float64), ``ids`` holds `ID_FIELDS`
    (uint32: the run id, string-table ids, the kind's index in `KINDS`).
    """

    ev0: int
    str0: int
    strings: list[str]
    measures: np.ndarray
    ids: np.ndarray
    bars: np.ndarray


def transfer_key(src: int | None, dst: int | None) -> tuple[str, str, bool]:
    """(lane key, label, crosses islands) of the transfer path ``src`` -> ``dst`` (None: the host)."""
    a = "host" if src is None else f"island {src}"
    b = "host" if dst is None else f"island {dst}"
    if src == dst:
        return f"xfer:{src}:{dst}", f"{a} (intra)", False
    return f"xfer:{src}:{dst}", f"{a} → {b}", src is not None and dst is not None


class EventEncoder:
    """NodeEvents to append-only columnar chunks, with a string table and the lanes they touch."""

    def __init__(self, devices: Iterable[tuple[int, str, int | None]] = (), names: dict[int, str] | None = None):
        self.names = names if names is not None else {}  # device id -> label, for lanes found in events
        self.lanes: list[dict[str, Any]] = []
        self._lane_of: dict[Any, int] = {}
        self._strings: dict[str, int] = {}
        self.strings: list[str] = []  # the string table, in id order
        self.chunks: list[Chunk] = []
        self.n_events = 0
        self.n_bars = 0
        for dev_id, label, island in devices:
            self.device_lane(dev_id, label, island)

    @property
    def n_strings(self) -> int:
        return len(self._strings)

    def device_lane(self, dev_id: int, label: str | None = None, island: int | None = None) -> int:
        lane = self._lane_of.get(("dev", dev_id))
        if lane is None:
            lane = len(self.lanes)
            self._lane_of[("dev", dev_id)] = lane
            self.lanes.append(
                {
                    "key": f"dev:{dev_id}",
                    "label": label or self.names.get(dev_id, f"device {dev_id}"),
                    "kind": "device",
                    "device": int(dev_id),
                    "island": island,
                    "cross": False,
                }
            )
        return lane

    def host_lane(self) -> int:
        """The lane of host work that occupies no device: compiling executables."""
        lane = self._lane_of.get("host")
        if lane is None:
            lane = len(self.lanes)
            self._lane_of["host"] = lane
            self.lanes.append(
                {
                    "key": "host",
                    "label": "host (compile)",
                    "kind": "host",
                    "device": None,
                    "island": None,
                    "cross": False,
                }
            )
        return lane

    def transfer_lane(self, src: int | None, dst: int | None) -> int:
        key, label, cross = transfer_key(src, dst)
        lane = self._lane_of.get(key)
        if lane is None:
            lane = len(self.lanes)
            self._lane_of[key] = lane
            self.lanes.append(
                {"key": key, "label": label, "kind": "transfer", "device": None, "island": dst, "cross": cross}
            )
        return lane

    def encode(self, events: Iterable[Any]) -> Chunk | None:
        """Append a chunk for ``events`` (NodeEvent-like objects); None when there are none."""
        strings = self._strings
        table = self.strings
        new: list[str] = []
        str0 = len(strings)

        def sid(x: Any) -> int:
            if x is None:
                return NONE
            s = x if isinstance(x, str) else str(x)
            k = strings.get(s)
            if k is None:
                k = strings[s] = len(strings)
                new.append(s)
                table.append(s)
            return k

        measures: list[float] = []
        ids: list[int] = []
        bars: list[int] = []
        k = self.n_events
        lane_of = self._lane_of
        for ev in events:
            measures += (ev.start, ev.end, ev.nbytes or 0)
            kind = _KIND.get(ev.kind, 0)
            ids += (ev.run_id, sid(ev.node), sid(ev.program), sid(ev.tenant), sid(ev.shapes), sid(ev.error), kind)
            if kind == 2:
                bars += (k, self.transfer_lane(ev.src_island, ev.island))
            elif kind == 3:
                bars += (k, self.host_lane())
            for d in ev.devices:
                lane = lane_of.get(("dev", d))
                if lane is None:
                    lane = self.device_lane(d, island=ev.island)
                bars += (k, lane)
            k += 1
        n = k - self.n_events
        if n == 0:
            return None
        chunk = Chunk(
            ev0=self.n_events,
            str0=str0,
            strings=new,
            measures=np.asarray(measures, dtype=np.float64).reshape(n, 3),
            ids=np.asarray(ids, dtype=np.uint32).reshape(n, 7),
            bars=np.asarray(bars, dtype=np.uint32).reshape(-1, 2),
        )
        self.chunks.append(chunk)
        self.n_events = k
        self.n_bars += len(chunk.bars)
        return chunk

    def pack(self, seq0: int, seq1: int | None = None) -> tuple[dict[str, Any], list[bytes]]:
        """Chunks ``seq0:seq1`` as one message: JSON content and three binary buffers (measures, ids, bars)."""
        part = self.chunks[seq0:seq1]
        seq1 = seq0 + len(part)
        if part:
            ev0, str0 = part[0].ev0, part[0].str0
            strings = [s for c in part for s in c.strings]
            measures = np.concatenate([c.measures for c in part]) if len(part) > 1 else part[0].measures
            ids = np.concatenate([c.ids for c in part]) if len(part) > 1 else part[0].ids
            bars = np.concatenate([c.bars for c in part]) if len(part) > 1 else part[0].bars
        else:
            ev0, str0, strings = self.n_events, self.n_strings, []
            measures, ids, bars = np.zeros((0, 3)), np.zeros((0, 7), np.uint32), np.zeros((0, 2), np.uint32)
        meta = {
            "type": "chunk",
            "seq0": seq0,
            "seq1": seq1,
            "ev0": ev0,
            "str0": str0,
            "strings": strings,
            "n_ev": len(measures),
            "n_bars": len(bars),
        }
        return meta, [measures.tobytes(), ids.tobytes(), bars.tobytes()]

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """Everything so far: measures (n, 3), ids (n, 7), bars (m, 2), the string table."""
        if not self.chunks:
            return np.zeros((0, 3)), np.zeros((0, 7), np.uint32), np.zeros((0, 2), np.uint32), []
        measures = np.concatenate([c.measures for c in self.chunks])
        ids = np.concatenate([c.ids for c in self.chunks])
        bars = np.concatenate([c.bars for c in self.chunks])
        return measures, ids, bars, self.strings


def _run_ids(runs: Any) -> set[int] | None:
    if runs is None:
        return None
    if isinstance(runs, (int, np.integer)) or hasattr(runs, "events"):
        runs = [runs]
    return {int(r) if isinstance(r, (int, np.integer)) else int(r.id) for r in runs}


class TimelineWidget(PwWidget):
    """Per-device timeline of executed nodes: lanes per device and per transfer path, live.

    Wheel zooms, drag pans, double-click fits; hover a bar for node, run,
    duration and shapes; the right column is each lane's utilization in view.

    Example::

        tl = pw.timeline()          # every run so far, then live
        tl                          # display it; bars appear as nodes finish
        tl.to_perfetto("trace.json")
    """

    _esm = STATIC / "timeline.js"

    title = t.Unicode("timeline").tag(sync=True)
    lanes = t.List(t.Dict()).tag(sync=True)
    runs = t.List(t.Dict()).tag(sync=True)
    palette = t.List(t.Unicode(), default_value=list(_html.RUN_PALETTE)).tag(sync=True)
    color_by = t.Enum(("run", "program", "tenant"), default_value="run").tag(sync=True)
    live = t.Bool(False).tag(sync=True)
    n_events = t.Int(0).tag(sync=True)
    n_chunks = t.Int(0).tag(sync=True)
    uid = t.Unicode("").tag(sync=True)
    _base = t.Dict().tag(sync=True)

    def __init__(
        self,
        runs: Any = None,
        live: bool = True,
        *,
        controller: Any = None,
        events: Iterable[Any] | None = None,
        title: str | None = None,
        **kwargs: Any,
    ):
        if runs is not None and not isinstance(runs, (int, np.integer)) and not hasattr(runs, "events"):
            runs = list(runs)  # read twice below
        if controller is None:
            given = [r for r in (runs if isinstance(runs, list) else [runs]) if hasattr(r, "events")]
            controller = controller_of(given[0]) if given else None
            if given and controller is None and events is None:
                # their controller was shut down or replaced: show what the runs did, follow nothing
                events = [e for r in given for e in list(r.events)]
            if controller is None and events is None:
                controller = get_controller()
        self._controller = controller
        self._filter = _run_ids(runs)
        self._lock = threading.RLock()
        self._pending: collections.deque[Any] = collections.deque()
        self._pending_runs: collections.deque[Any] = collections.deque()
        self._unsubscribe = None
        self._dedupe: set[int] | None = None
        self._acked = False
        self._final_at: float | None = None
        self._created = time.monotonic()
        self._run_index: dict[int, int] = {}
        self._runs: list[dict[str, Any]] = []
        devices = []
        names: dict[int, str] = {}
        if controller is not None:
            names = controller.events.device_names
            for isl in controller.islands:
                for ref in island_devices(isl, names):
                    devices.append((ref.id, ref.label, int(isl.id)))
        self._enc = EventEncoder(devices, names)
        if title is None:
            title = (
                "timeline"
                if self._filter is None
                else "timeline of run"
                + (f" {next(iter(self._filter))}" if len(self._filter) == 1 else f"s {sorted(self._filter)}")
            )
        super().__init__(title=title, uid=secrets.token_hex(8), **kwargs)
        log = controller.events if controller is not None else None
        if live and log is not None:
            self._unsubscribe = log.subscribe(self._on_event)
        if events is None:
            events = list(log.nodes) if log is not None else []
            if self._filter is not None and controller is not None:
                events = [e for r in controller.runs if r.id in self._filter for e in list(r.events)]
        else:
            events = list(events)
        if self._unsubscribe is not None:
            self._dedupe = {id(e) for e in events[-4096:]}
            self._snapshot = events  # keeps the ids above unique while the first flush dedupes
        if controller is not None:
            for r in list(controller.runs):
                if self._filter is None or r.id in self._filter:
                    self._note_run(r.id, r.name, r.tenant, r.state)
        self.on_msg(self._on_front_msg)
        with self._lock:
            self._append(events)
            with self.hold_sync():
                self.live = self._unsubscribe is not None
                self._sync_traits()
                self._base = self._pack_dict()
        if self._unsubscribe is not None:
            ticker.add(self)
            if self._filter is not None:
                ticker.poke()  # runs that are already final: stop following soon

    # ----------------------------------------------------- event stream side
    def _on_event(self, ev: Any) -> None:
        """Called on controller threads for every event: buffer it and poke the ticker, nothing more."""
        if hasattr(ev, "node"):
            if self._filter is None or ev.run_id in self._filter:
                self._pending.append(ev)
                ticker.poke()
        elif self._filter is None or ev.run_id in self._filter:
            self._pending_runs.append(ev)
            ticker.poke()

    def _tick(self, now: float) -> float | None:
        if self.comm is None:  # closed
            self.stop()
            return None
        if self._pending or self._pending_runs:
            with self._lock:
                # Run events first: a run's node events are emitted before its final transition, so every
                # node event of a run seen final here is already in `_pending`.
                run_events = _drain(self._pending_runs)
                events = _drain(self._pending)
                if self._dedupe is not None:
                    events = [e for e in events if id(e) not in self._dedupe]
                    self._dedupe = None
                    self._snapshot = None
                for rev in run_events:
                    self._note_run(rev.run_id, rev.program, rev.tenant, rev.state)
                n_lanes = len(self._enc.lanes)
                chunk = self._append(events)
                if chunk is not None:
                    meta, buffers = self._enc.pack(len(self._enc.chunks) - 1)
                    self.send(meta, buffers)
                with self.hold_sync():
                    self._sync_traits(lanes=len(self._enc.lanes) != n_lanes)
                    if chunk is not None and not self._acked and now - self._created < BASE_WINDOW:
                        self._base = self._pack_dict()
        return self._maybe_finish(now)

    def _maybe_finish(self, now: float) -> float | None:
        """A timeline of given runs stops following once they are all final, and re-publishes its picture."""
        if self._filter is None or self._unsubscribe is None:
            return None
        states = {r["id"]: r["state"] for r in self._runs}
        if not all(states.get(rid) in FINAL for rid in self._filter):
            self._final_at = None
            return None
        if self._final_at is None:  # a grace period for node events that straggle behind a failure
            self._final_at = now
        if now - self._final_at < FINAL_GRACE:
            return self._final_at + FINAL_GRACE
        # The final picture is published before `live` drops: whoever sees `live` False sees it too.
        self._unfollow()
        self.refresh_static()
        self._show_stopped()
        return None

    def _append(self, events: Sequence[Any]) -> Chunk | None:
        chunk = self._enc.encode(events)
        if chunk is not None:
            for rid in np.unique(chunk.ids[:, 0]).tolist():
                if rid not in self._run_index:
                    first = np.flatnonzero(chunk.ids[:, 0] == rid)[0]
                    prog = chunk.ids[first, 2]
                    names = self._enc.strings
                    self._note_run(int(rid), names[prog] if prog != NONE else "", names[chunk.ids[first, 3]], "?")
        return chunk

    def _note_run(self, run_id: int, name: str, tenant: str, state: str) -> None:
        k = self._run_index.get(run_id)
        if k is None:
            self._run_index[run_id] = len(self._runs)
            self._runs.append({"id": int(run_id), "name": str(name), "tenant": str(tenant), "state": str(state)})
        else:
            self._runs[k] = {**self._runs[k], "state": str(state)}
        self._runs_dirty = True

    def _sync_traits(self, lanes: bool = True) -> None:
        if lanes or len(self.lanes) != len(self._enc.lanes):
            self.lanes = [dict(x) for x in self._enc.lanes]
        if getattr(self, "_runs_dirty", True):
            self.runs = [dict(r) for r in self._runs]
            self._runs_dirty = False
        self.n_chunks = len(self._enc.chunks)
        self.n_events = self._enc.n_events

    def _pack_dict(self) -> dict[str, Any]:
        meta, (measures, ids, bars) = self._enc.pack(0)
        # the wire names say which typed array the front-end (and benchmarks/timeline_redraw.py) builds
        return {**meta, "f64": measures, "u32": ids, "bars": bars}

    def _on_front_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict) or content.get("type") != "sync":
            return
        self._acked = True
        with self._lock:
            have = int(content.get("have", 0))
            if 0 <= have < len(self._enc.chunks):
                meta, buffers = self._enc.pack(have)
                self.send(meta, buffers)

    # ----------------------------------------------------------- public API
    def stop(self) -> None:
        """Stop following the event stream (the events shown so far stay).

        A timeline of given runs stops on its own once they are all final.
        """
        self._unfollow()
        self._show_stopped()

    def _show_stopped(self) -> None:
        if self.comm is not None:
            self.live = False

    def close(self) -> None:
        self.stop()
        super().close()

    def flush(self) -> None:
        """Push buffered events now (the ticker does this on its own at ~10 Hz)."""
        self._tick(time.monotonic())

    @property
    def events(self) -> list[dict[str, Any]]:
        """The events shown, as dicts (node, run, program, tenant, kind, start, end, nbytes, shapes, error, lanes)."""
        measures, ids, bars, strings = self._enc.arrays()
        lanes_of: dict[int, list[str]] = collections.defaultdict(list)
        for ev, lane in bars.tolist():
            lanes_of[ev].append(self._enc.lanes[lane]["key"])

        def s(k: int) -> str | None:
            return None if k == NONE else strings[k]

        out = []
        for i in range(len(measures)):
            st, en, nb = measures[i].tolist()
            run, node, prog, tenant, shapes, err, kind = ids[i].tolist()
            out.append(
                {
                    "run": run,
                    "node": s(node),
                    "program": s(prog),
                    "tenant": s(tenant),
                    "kind": KINDS[kind],
                    "start": int(st),
                    "end": int(en),
                    "nbytes": int(nb),
                    "shapes": s(shapes),
                    "error": s(err),
                    "lanes": lanes_of[i],
                }
            )
        return out

    def utilization(self) -> dict[str, float]:
        """Busy fraction of each lane (union of its bars) over the whole time span, by lane name.

        The names are the lane labels the widget shows (`lane_names`): devices, transfer paths and the
        host's compile lane; a label two lanes share gets the lane's key appended.

        Example::

            tl = pw.timeline(live=False)
            tl.utilization()
            # {'TFRT_CPU_0': 0.62, ..., 'island 0 → island 1': 0.03, 'host (compile)': 0.41}
        """
        measures, _, bars, _ = self._enc.arrays()
        names = lane_names(self._enc.lanes)
        if not len(measures):
            return dict.fromkeys(names, 0.0)
        t0, t1 = measures[:, 0].min(), measures[:, 1].max()
        span = max(t1 - t0, 1.0)
        return {name: busy_union(measures, bars, k) / span for k, name in enumerate(names)}

    def to_chrome_trace(self) -> dict[str, Any]:
        """The shown events as Chrome trace JSON (a thread per lane), by the runtime's one trace writer."""
        lanes = self._enc.lanes
        tid = {lane["key"]: k for k, lane in enumerate(lanes)}
        rows = (
            TraceRow(
                0,
                tid[key],
                ev["node"],
                ev["kind"],
                ev["start"],
                ev["end"],
                {
                    "run": ev["run"],
                    "program": ev["program"],
                    "tenant": ev["tenant"],
                    "bytes": ev["nbytes"],
                    "shapes": ev["shapes"],
                    **({"error": ev["error"]} if ev["error"] else {}),
                },
            )
            for ev in self.events
            for key in ev["lanes"]
        )
        return chrome_trace(rows, lambda pid: "pw_kernel", lambda pid, k: lanes[k]["label"], "pw_kernel.widgets")

    def to_perfetto(self, path: str) -> str:
        """Write the shown events as Chrome trace JSON (open it at ui.perfetto.dev); returns the path.

        Uses the controller's own exporter when the widget follows a controller.
        """
        import json
        import os

        path = os.fspath(path)
        log = self._controller.events if self._controller is not None else None
        if log is not None and hasattr(log, "to_perfetto"):
            if self._filter is None:
                return log.to_perfetto(path)
            return log.to_perfetto(path, [e for r in self._controller.runs if r.id in self._filter for e in r.events])
        with open(path, "w") as f:
            json.dump(self.to_chrome_trace(), f)
        return path

    def static_html(self) -> str:
        measures, ids, bars, strings = self._enc.arrays()
        return timeline_html(
            self.title,
            self._enc.lanes,
            self._runs,
            list(self.palette),
            self.color_by,
            measures,
            ids,
            bars,
            strings,
            live=self._unsubscribe is not None,  # not the `live` trait: that drops after the final picture is out
        )

    def __repr__(self) -> str:
        n_dev = sum(1 for x in self._enc.lanes if x["kind"] == "device")
        n_x = len(self._enc.lanes) - n_dev
        live = ", live" if self._unsubscribe is not None else ""
        return (
            f"TimelineWidget({self.title!r}: {self._enc.n_events} events, {len(self._runs)} runs, "
            f"{n_dev} device lanes, {n_x} transfer lanes{live})"
        )


def _drain(q: collections.deque) -> list[Any]:
    out = []
    pop = q.popleft
    for _ in range(len(q)):
        out.append(pop())
    return out


def lane_names(lanes: Sequence[dict[str, Any]]) -> list[str]:
    """Each lane's display name: its label, with ``[key]`` appended where two lanes share a label.

    Example::

        lane_names([{"key": "dev:0", "label": "cpu:0"}, {"key": "host", "label": "host (compile)"}])
        # ['cpu:0', 'host (compile)']
    """
    count = collections.Counter(str(lane["label"]) for lane in lanes)
    return [str(x["label"]) if count[str(x["label"])] == 1 else f"{x['label']} [{x['key']}]" for x in lanes]


def axis_labels(values: Sequence[float], step: float) -> list[str]:
    """Time-axis tick labels for ticks ``step`` ns apart: one unit, as many decimals as ``step`` needs.

    Neighbouring labels always differ, also zoomed far in, and the origin reads ``0 ns``
    (timeline.js's ``axisLabels`` is the same rule).

    Example::

        axis_labels([0, 5e5, 1e6], 5e5)                     # ['0 ns', '0.5 ms', '1.0 ms']
        axis_labels([14_100_100, 14_100_200], 100)          # ['14.1001 ms', '14.1002 ms']
    """
    big = max([step, *(abs(v) for v in values)])
    scale, unit = next(((sc, u) for sc, u in _UNITS if big >= sc), _UNITS[-1])
    dec = min(20, max(0, math.ceil(-math.log10(step / scale) - 1e-9)))
    return ["0 ns" if v == 0 else f"{v / scale:.{dec}f} {unit}" for v in values]


def busy_union(measures: np.ndarray, bars: np.ndarray, lane: int, t0: float = -np.inf, t1: float = np.inf) -> float:
    """Nanoseconds covered by at least one bar of ``lane`` within [t0, t1] (the runtime's `busy_time`)."""
    ev = bars[bars[:, 1] == lane, 0]
    return busy_time(measures[ev, 0], measures[ev, 1], t0, t1)


# --------------------------------------------------------------- static HTML
def _colour_keys(color_by: str, ids: np.ndarray, runs: Sequence[dict[str, Any]], strings: Sequence[str]) -> np.ndarray:
    """Per event, the index of its colour key (run, program or tenant) in order of first appearance."""
    if color_by == "run":
        order = {r["id"]: k for k, r in enumerate(runs)}
        return np.fromiter((order.get(int(x), 0) for x in ids[:, 0]), dtype=np.int64, count=len(ids))
    col = 2 if color_by == "program" else 3
    _, first, inverse = np.unique(ids[:, col], return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))
    return rank[inverse]


def timeline_html(
    title: str,
    lanes: Sequence[dict[str, Any]],
    runs: Sequence[dict[str, Any]],
    palette: Sequence[str],
    color_by: str,
    measures: np.ndarray,
    ids: np.ndarray,
    bars: np.ndarray,
    strings: Sequence[str],
    width: int = 760,
    live: bool = False,
) -> str:
    """A static SVG timeline: lanes, bars, axis, a legend for every colour and pattern drawn.

    Bars narrower than a few pixels merge with neighbours of their colour (level of detail); wider ones
    that run back to back are cut by a 1px gap, so six chained layers read as six bars.
    """
    esc = _html.esc
    n = len(measures)
    n_dev = sum(1 for x in lanes if x["kind"] == "device")
    head = (
        f'<div style="margin-bottom:2px"><b>{esc(title)}</b> · {n} events · {len(runs)} runs · '
        f"{n_dev} devices{' · live (static snapshot)' if live else ''}</div>"
    )
    if n == 0:
        return _html.page(head + '<div style="color:#666">no node events yet</div>', "pw-timeline")
    order = [k for k, x in enumerate(lanes) if x["kind"] == "device"] + [
        k for k, x in enumerate(lanes) if x["kind"] != "device"
    ]
    t0 = float(measures[:, 0].min())
    t1 = float(measures[:, 1].max())
    span = max(t1 - t0, 1.0)
    label_w, util_w, axis_h = 120, 46, 18
    plot_w = width - label_w - util_w
    keys = _colour_keys(color_by, ids, runs, strings)
    px0 = np.floor((measures[:, 0] - t0) / span * plot_w).astype(np.int64)
    px1 = np.maximum(np.ceil((measures[:, 1] - t0) / span * plot_w).astype(np.int64), px0 + 1)
    parts = []
    y = axis_h
    step = _html.nice_step(span, 6)
    ticks = []
    values = [k * step for k in range(int(span / step + 1e-9) + 1)]  # multiples of the step: no drift
    for v, label in zip(values, axis_labels(values, step)):
        x = label_w + v / span * plot_w
        ticks.append(
            f'<line x1="{x:.1f}" y1="{axis_h - 4}" x2="{x:.1f}" y2="{axis_h}" stroke="#888"/>'
            f'<text x="{x:.1f}" y="{axis_h - 6}" text-anchor="middle" fill="#555">{esc(label)}</text>'
        )
    kind = ids[:, 6]
    merged: set[bool] = set()  # merged-transfer strips drawn: False intra-island, True cross-island
    for lane in order:
        info = lanes[lane]
        h = 16 if info["kind"] == "device" else 12
        ev = bars[bars[:, 1] == lane, 0].astype(np.int64)
        util = busy_union(measures, bars, lane) / span
        parts.append(
            f'<text x="{label_w - 4}" y="{y + h - 4}" text-anchor="end" fill="#333">{esc(info["label"])}</text>'
            f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{h - 2}" fill="#f4f4f4"/>'
            f'<text x="{width - 2}" y="{y + h - 4}" text-anchor="end" fill="#333">{util * 100:.0f}%</text>'
        )
        if len(ev):
            # colour keys: >= 0 the palette; -2 a transfer, -3 a cross-island transfer, -4 a compile (host lane).
            # On a device lane transfers are drawn low, under the compute bars, as the live view draws them.
            strips = []  # (bars, their colour keys, y, height)
            if info["kind"] == "device":
                xfer = kind[ev] == _KIND["transfer"]
                strips.append((ev[~xfer], keys[ev[~xfer]], y + 1, h - 4))
                strips.append((ev[xfer], np.full(int(xfer.sum()), -2), y + h // 2 + 1, h - h // 2 - 3))
            else:
                strips.append(
                    (ev, np.full(len(ev), -4 if info["kind"] == "host" else -3 if info["cross"] else -2), y + 1, h - 4)
                )
            for sev, colour, sy, sh in strips:
                for c, a, w, k in _lane_rects(colour, sev, px0, px1, plot_w) if len(sev) else ():
                    if c >= 0:
                        fill, stroke = palette[c % len(palette)], ""
                    elif c == -4:
                        fill, stroke = f"url(#pw-tl-hatch) {HATCH[1]}", ' stroke="#666" stroke-width="1"'
                    elif k > 1:  # transfers closer than a pixel: a strip, as the live view draws them
                        fill, stroke = MERGED[c == -3], ""
                        merged.add(c == -3)
                    else:
                        fill = "#e9e9e9"
                        stroke = f' stroke="{_html.CROSS_ISLAND if c == -3 else "#555"}" stroke-width="1"'
                    parts.append(f'<rect x="{label_w + a}" y="{sy}" width="{w}" height="{sh}" fill="{fill}"{stroke}/>')
        y += h
    height = y + 4
    has_host = any(x["kind"] == "host" for x in lanes)
    defs = (
        '<defs><pattern id="pw-tl-hatch" patternUnits="userSpaceOnUse" width="6" height="6">'
        f'<rect width="6" height="6" fill="{HATCH[1]}"/><path d="M-1,1 l2,-2 M0,6 l6,-6 M5,7 l2,-2" '
        f'stroke="{HATCH[0]}" stroke-width="1.5"/></pattern></defs>'
        if has_host
        else ""
    )
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'style="font:10px {_html.FONT}">{defs}{"".join(ticks)}{"".join(parts)}</svg>'
    )
    if color_by == "run":
        entries = [(palette[k % len(palette)], f"run {r['id']} {r['name']} ({r['state']})") for k, r in enumerate(runs)]
    else:
        col = 2 if color_by == "program" else 3
        seen = list(dict.fromkeys(int(x) for x in ids[:, col]))
        entries = [(palette[k % len(palette)], strings[s] if s != NONE else "?") for k, s in enumerate(seen)]
    legend = _legend_html(entries[-MAX_LEGEND:], max(0, len(entries) - MAX_LEGEND), host=has_host, merged=merged)
    return _html.page(head + legend + svg, "pw-timeline")


def _lane_rects(
    colour: np.ndarray, ev: np.ndarray, px0: np.ndarray, px1: np.ndarray, plot_w: int
) -> list[tuple[int, int, int, int]]:
    """One lane's rects, (colour key, x, width, bars in it) in plot pixels, for bars ``ev`` coloured ``colour``.

    Later-starting bars paint over earlier ones; runs of one colour merge into one rect, except where a bar
    at least `GAP_MIN` px wide ends and the next such bar starts: there the earlier rect ends a pixel early.
    """
    n = plot_w + 1
    cover = np.full(n, -1, dtype=np.int64)
    owner = np.full(n, -1, dtype=np.int64)
    o = np.argsort(px0[ev], kind="stable")[-20000:]  # a static picture: the latest 20k bars per lane are plenty
    for e, c in zip(ev[o].tolist(), colour[o].tolist()):
        cover[px0[e] : px1[e]] = c
        owner[px0[e] : px1[e]] = e
    change = np.flatnonzero((np.diff(cover) != 0) | (np.diff(owner) != 0)) + 1
    bounds = np.concatenate(([0], change, [n])).tolist()
    rects: list[tuple[int, int, int, int]] = []
    cur: list[int] | None = None  # colour, start, end, owner of the last piece, bars merged
    for a, b in itertools.pairwise(bounds):
        c, e = int(cover[a]), int(owner[a])
        if cur is not None and c == cur[0] and a == cur[2] and c != -1:
            prev = cur[3]
            # bar e starts here and the previous bar ends here (ceil/floor: within a pixel): back to back
            abut = a == px0[e] and px1[prev] <= a + 1 and e != prev
            if abut and cur[2] - cur[1] >= GAP_MIN and px1[e] - px0[e] >= GAP_MIN:
                rects.append((cur[0], cur[1], cur[2] - 1, cur[4]))
                cur = [c, a, b, e, 1]
            else:
                cur[2], cur[3], cur[4] = b, e, cur[4] + (e != prev)
            continue
        if cur is not None and cur[0] != -1:
            rects.append((cur[0], cur[1], cur[2], cur[4]))
        cur = [c, a, b, e, 1]
    if cur is not None and cur[0] != -1:
        rects.append((cur[0], cur[1], cur[2], cur[4]))
    return [(c, a, min(b, plot_w) - a, k) for c, a, b, k in rects if a < plot_w and min(b, plot_w) > a]


def _legend_html(entries: Sequence[tuple[str, str]], more: int, host: bool, merged: set[bool]) -> str:
    """The static legend: the colour keys, then the looks that are not colour keys (compile, transfers)."""
    esc = _html.esc

    def item(swatch: str, label: str) -> str:
        return (
            f'<span style="margin-right:10px;white-space:nowrap"><span style="display:inline-block;width:10px;'
            f'height:10px;border-radius:2px;vertical-align:middle;{swatch}"></span> {esc(label)}</span>'
        )

    items = [item(f"background:{c}", label) for c, label in entries]
    if more:
        items.append(f'<span style="color:#666;margin-right:10px">+{more} more</span>')
    if host:  # compiles are drawn on the host lane
        items.append(item(f"background:{HATCH_CSS};border:1px solid #666", "compile (host)"))
    items.append(item("background:#e9e9e9;border:1.5px solid #555", "transfer"))
    items.append(item(f"background:#e9e9e9;border:1.5px solid {_html.CROSS_ISLAND}", "cross-island transfer"))
    if False in merged:
        items.append(item(f"background:{MERGED[False]}", "transfers merged at this scale"))
    if True in merged:
        items.append(item(f"background:{MERGED[True]}", "cross-island transfers merged"))
    return f'<div class="pw-legend" style="margin:2px 0 4px">{"".join(items)}</div>'


def timeline(runs: Any = None, live: bool = True, **kwargs: Any) -> TimelineWidget:
    """A live per-device timeline of the controller's runs (all of them, or ``runs``: Runs or run ids).

    Example::

        pw.timeline()                         # everything so far, then live
        pw.timeline(pw.controller().runs[-1]) # one run
        pw.timeline(live=False)               # a snapshot
    """
    return TimelineWidget(runs, live=live, **kwargs)


__all__ = ["EventEncoder", "TimelineWidget", "axis_labels", "busy_union", "lane_names", "timeline", "timeline_html"]

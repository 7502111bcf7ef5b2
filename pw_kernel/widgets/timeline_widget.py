"""TimelineWidget: a lane per device and per transfer path, a bar per executed node, live.

Data path, kept cheap at 100,000 events:

* The widget subscribes to the controller's event log. The callback runs on a
  controller thread and only appends the event to a deque.
* The shared ticker thread (`_ticker.ticker`) drains the deque at most ~10 times
  a second, encodes the new events column-wise into numpy arrays (a *chunk*
  of `timeline_encoder.EventEncoder`: ``measures`` (start, end, bytes) as
  float64, ``ids`` (run, string ids, kind) as uint32, one (event, lane) pair
  per bar, plus the strings not sent before) and pushes that chunk to the
  front-end as one custom message with binary buffers. Traits announce what
  exists (``n_chunks``, ``n_events``, ``lanes``, ``runs``), so a front-end
  that missed chunks (a page reload, a message sent before the view existed)
  asks for them again (``{"type": "sync", "have": k}``); the first chunks
  also travel in the ``_base`` trait until a front-end has said hello.
* The front-end (``static/timeline.js``) keeps typed arrays per lane sorted by
  start, and draws on a canvas with level of detail: bars closer than a pixel
  merge, so a redraw costs O(visible bars) and O(pixels) canvas calls.
* Static viewers get `timeline_html.timeline_html` (the one static timeline renderer), drawn from the same arrays.
"""

from __future__ import annotations

import collections
import contextlib
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import traitlets as t

from ..runtime import Profile
from ..runtime import controller as get_controller
from ..runtime.extend import FINAL, TraceRow, chrome_trace
from ._base import PwWidget, controller_of, ticker
from ._devices import island_devices
from ._html import RUN_PALETTE
from .esm import esm_source
from .timeline_encoder import KINDS, NONE, Chunk, EventEncoder, busy_union, lane_names
from .timeline_html import timeline_html

BASE_WINDOW = 5.0  # seconds during which chunks also go into the `_base` trait until the front-end says hello
FINAL_GRACE = 0.5  # seconds a timeline of given runs keeps listening after they are all final


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

    _esm = esm_source("timeline")

    title = t.Unicode("timeline").tag(sync=True)
    lanes = t.List(t.Dict()).tag(sync=True)
    runs = t.List(t.Dict()).tag(sync=True)
    palette = t.List(t.Unicode(), default_value=list(RUN_PALETTE)).tag(sync=True)
    color_by = t.Enum(("run", "program", "tenant"), default_value="run").tag(sync=True)
    live = t.Bool(False).tag(sync=True)
    n_events = t.Int(0).tag(sync=True)
    n_chunks = t.Int(0).tag(sync=True)
    recent_t0 = t.Float(0.0).tag(sync=True)  # the view opens here: the latest burst of activity, not idle hours
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
        self._paused = 0  # `paused()` blocks entered and not left
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
                if self._paused:
                    return None  # held: the block's end pokes the ticker
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
                if rid not in self._run_index and rid != NONE:  # NONE: host work of no run (a checkpoint)
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
        self.recent_t0 = self._enc.recent_t0

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

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold pushes to the front-end while the block runs: events keep buffering and go out as one chunk after it.

        A push already under way finishes first. Other widgets keep updating meanwhile.

        Example::

            tl = pw.timeline()
            with tl.paused():
                for _ in range(100):
                    step.submit(x)        # the timeline fills in once, after the loop
        """
        with self._lock:  # the ticker drains under this lock: once it is ours, no tick is half-way through
            self._paused += 1
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1
            ticker.poke()

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
            # {'TFRT_CPU_0': 0.62, ..., 'island 0 → island 1': 0.03, 'host work': 0.41}
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
        title = self.title
        earlier = measures[:, 1] < self._enc.recent_t0
        if earlier.any():  # the latest burst of activity, as the live view opens on it
            keep = ~earlier
            index = np.cumsum(keep) - 1
            bars = bars[keep[bars[:, 0]]]
            bars = np.stack([index[bars[:, 0]], bars[:, 1]], axis=1).astype(np.uint32)
            measures, ids = measures[keep], ids[keep]
            title += f" (latest activity; {int(earlier.sum())} earlier events before an idle gap not drawn)"
        return timeline_html(
            title,
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


def timeline(runs: Any = None, live: bool = True, **kwargs: Any) -> TimelineWidget:
    """A live per-device timeline of the controller's runs (all of them, or ``runs``: Runs or run ids),
    or of a `pw.profile` window: its nodes, and each device's XLA ops on a lane beneath the device's.

    Example::

        pw.timeline()                         # everything so far, then live
        pw.timeline(pw.controller().runs[-1]) # one run
        pw.timeline(live=False)               # a snapshot
        pw.timeline(prof)                     # a profile: nodes and their XLA ops
    """
    if isinstance(runs, Profile):
        kwargs.setdefault("title", f"profile: {len(runs.nodes)} node bars, {len(runs.ops)} XLA ops")
        return TimelineWidget(events=runs.events(), live=False, **kwargs)
    return TimelineWidget(runs, live=live, **kwargs)


__all__ = ["TimelineWidget", "timeline"]

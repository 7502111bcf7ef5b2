"""The event log: one record per executed node and per run transition, streamed to subscribers.

Times are nanoseconds since the log's epoch (`time.perf_counter_ns`). A node's
``start`` is max(its dispatch, the end of the previous node on the same
devices); its ``end`` is when the completion watcher saw its outputs ready.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np


def busy_time(starts, ends, t0: float = -np.inf, t1: float = np.inf) -> float:
    """Time covered by at least one of the intervals [starts[i], ends[i]], clipped to [t0, t1].

    The one definition of "busy" (a device running two nodes at once is busy
    once, not twice), used by `EventLog.busy`, the timeline and the benchmarks.

    Example::

        busy_time([0, 10, 30], [20, 15, 40])   # 30.0: [0, 20] and [30, 40]
    """
    s = np.clip(np.asarray(starts, dtype=np.float64), t0, t1)
    e = np.clip(np.asarray(ends, dtype=np.float64), t0, t1)
    if not s.size:
        return 0.0
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # a new segment starts where an interval begins after everything before it has ended
    starts_seg = np.concatenate(([True], s[1:] > reach[:-1]))
    seg_start = s[starts_seg]
    seg_end = np.concatenate((reach[np.flatnonzero(starts_seg)[1:] - 1], reach[-1:]))
    return float(np.sum(seg_end - seg_start))


class NodeEvent:
    """What one node of one run did, and when."""

    __slots__ = (
        "seq",
        "run_id",
        "program",
        "tenant",
        "node",
        "kind",
        "devices",
        "island",
        "src_island",
        "dispatch",
        "start",
        "end",
        "nbytes",
        "shapes",
        "error",
    )

    def __init__(self, seq, run_id, program, tenant, node, kind, devices, island, src_island, dispatch, nbytes, shapes):
        self.seq = seq
        self.run_id = run_id
        self.program = program
        self.tenant = tenant
        self.node = node
        self.kind = kind
        self.devices = devices
        self.island = island
        self.src_island = src_island
        self.dispatch = dispatch
        self.start = dispatch
        self.end = dispatch
        self.nbytes = nbytes
        self.shapes = shapes
        self.error = None

    @property
    def duration(self) -> int:
        return self.end - self.start

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self) -> str:
        return (
            f"NodeEvent(run={self.run_id}, node={self.node!r}, kind={self.kind}, devices={list(self.devices)}, "
            f"dispatch={self.dispatch}, start={self.start}, end={self.end})"
        )


class RunEvent:
    """A run's state transition."""

    __slots__ = ("run_id", "program", "tenant", "state", "time", "error")

    def __init__(self, run_id, program, tenant, state, time_ns, error=None):
        self.run_id = run_id
        self.program = program
        self.tenant = tenant
        self.state = state
        self.time = time_ns
        self.error = error

    def __repr__(self) -> str:
        return f"RunEvent(run={self.run_id}, {self.program!r}, state={self.state})"


Subscriber = Callable[[Any], None]
_log = logging.getLogger("pw_kernel")


class EventLog:
    """Completed node events and run transitions: query them, subscribe, export Chrome trace JSON.

    Example::

        log = pw.controller().events
        unsubscribe = log.subscribe(print)
        log.query(run=3, kind="transfer")
        log.to_perfetto("trace.json")   # open in ui.perfetto.dev
    """

    def __init__(self, max_events: int = 1_000_000):
        self.epoch = time.perf_counter_ns()
        self.nodes: collections.deque[NodeEvent] = collections.deque(maxlen=max_events)
        self.runs: collections.deque[RunEvent] = collections.deque(maxlen=max_events)
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        self.device_names: dict[int, str] = {}
        self.island_names: dict[int, str] = {}

    def now(self) -> int:
        return time.perf_counter_ns() - self.epoch

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(event)`` for every NodeEvent and RunEvent from now on; returns an unsubscribe function.

        Callbacks run on the controller's threads: keep them short (a widget
        should batch and redraw on its own clock).
        """
        with self._lock:
            self._subscribers = [*self._subscribers, callback]

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = [s for s in self._subscribers if s is not callback]

        return unsubscribe

    def emit_node(self, ev: NodeEvent) -> None:
        self.nodes.append(ev)
        for cb in self._subscribers:
            self._call(cb, ev)

    def emit_run(self, ev: RunEvent) -> None:
        self.runs.append(ev)
        for cb in self._subscribers:
            self._call(cb, ev)

    def _call(self, cb: Subscriber, ev: Any) -> None:
        try:
            cb(ev)
        except Exception:  # a broken view must never stop the controller: log it once, drop it
            _log.exception("pw_kernel: event subscriber %r raised; it is unsubscribed", cb)
            with self._lock:
                self._subscribers = [s for s in self._subscribers if s is not cb]

    def query(
        self,
        run: int | None = None,
        kind: str | None = None,
        device: int | None = None,
        program: str | None = None,
    ) -> list[NodeEvent]:
        """Node events matching every given filter, in completion order."""
        out = []
        for ev in list(self.nodes):
            if run is not None and ev.run_id != run:
                continue
            if kind is not None and ev.kind != kind:
                continue
            if device is not None and device not in ev.devices:
                continue
            if program is not None and ev.program != program:
                continue
            out.append(ev)
        return out

    def busy(self, events: Iterable[NodeEvent] | None = None) -> dict[int, int]:
        """Busy nanoseconds per device id over ``events`` (default: all), as `busy_time` counts them."""
        spans: dict[int, tuple[list[int], list[int]]] = {}
        for ev in self.nodes if events is None else events:
            for d in ev.devices:
                s, e = spans.setdefault(d, ([], []))
                s.append(ev.start)
                e.append(ev.end)
        return {d: int(busy_time(s, e)) for d, (s, e) in spans.items()}

    def to_chrome_trace(self, events: Iterable[NodeEvent] | None = None) -> dict[str, Any]:
        """Chrome trace JSON (complete "X" events; a pid per island, a tid per device) that Perfetto opens."""
        trace: list[dict[str, Any]] = []
        seen_pid: set[int] = set()
        seen_tid: set[tuple[int, int]] = set()
        for ev in self.nodes if events is None else events:
            pid = ev.island if ev.island is not None else -1
            if pid not in seen_pid:
                seen_pid.add(pid)
                name = self.island_names.get(pid, f"island {pid}")
                trace.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
            for d in ev.devices:
                if (pid, d) not in seen_tid:
                    seen_tid.add((pid, d))
                    label = self.device_names.get(d, f"device {d}")
                    trace.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": d, "args": {"name": label}})
                trace.append(
                    {
                        "ph": "X",
                        "name": ev.node,
                        "cat": ev.kind,
                        "pid": pid,
                        "tid": d,
                        "ts": ev.start / 1e3,
                        "dur": max(ev.end - ev.start, 0) / 1e3,
                        "args": {
                            "run": ev.run_id,
                            "program": ev.program,
                            "tenant": ev.tenant,
                            "dispatch_us": ev.dispatch / 1e3,
                            "bytes": ev.nbytes,
                            "shapes": ev.shapes,
                            **({"error": ev.error} if ev.error else {}),
                        },
                    }
                )
        return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": {"producer": "pw_kernel"}}

    def to_perfetto(self, path: str | os.PathLike, events: Iterable[NodeEvent] | None = None) -> str:
        """Write `to_chrome_trace` to ``path`` (open it at ui.perfetto.dev); returns the path."""
        path = os.fspath(path)
        with open(path, "w") as f:
            json.dump(self.to_chrome_trace(events), f)
        return path

    def clear(self) -> None:
        self.nodes.clear()
        self.runs.clear()

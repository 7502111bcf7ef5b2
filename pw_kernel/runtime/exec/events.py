"""The event log: one record per executed node and per run transition, streamed to subscribers.

What a node printed or logged on a remote island as it ran comes as an
`IslandOutput`, to the subscribers that ask for it (the notebook front routes
it to the cell that submitted the run); with none, it is echoed to this
process's stdout or stderr, each line marked with the island.

Times are nanoseconds since the log's epoch (`time.perf_counter_ns`). A node's
``start`` is max(its dispatch, the end of the previous node on the same
devices); its ``end`` is when the completion watcher saw its outputs ready.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal, NamedTuple

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


def busy_by_device(events: Iterable[NodeEvent]) -> dict[int, int]:
    """Busy nanoseconds per device id over node ``events``, as `busy_time` counts them.

    Example::

        busy_by_device(run.events)      # {0: 120000, 1: 118500, ...}
    """
    spans: dict[int, tuple[list[int], list[int]]] = {}
    for ev in events:
        for d in ev.devices:
            starts, ends = spans.setdefault(d, ([], []))
            starts.append(ev.start)
            ends.append(ev.end)
    return {d: int(busy_time(starts, ends)) for d, (starts, ends) in spans.items()}


class TraceRow(NamedTuple):
    """One bar of a Chrome trace: a complete event on thread ``tid`` of process ``pid``, times in ns."""

    pid: int
    tid: int
    name: str
    category: str
    start: int
    end: int
    args: dict[str, Any]


def chrome_trace(
    rows: Iterable[TraceRow],
    process_name: Callable[[int], str],
    thread_name: Callable[[int, int], str],
    producer: str = "pw_kernel",
) -> dict[str, Any]:
    """Chrome trace JSON that Perfetto opens: the rows as complete ("X") events in µs, processes and threads named.

    The one trace writer: `EventLog.to_chrome_trace` (a process per island, a
    thread per device) and the timeline widget (a thread per lane) both call it.
    ``process_name(pid)`` and ``thread_name(pid, tid)`` label what the rows use.

    Example::

        rows = [TraceRow(0, 3, "matmul", "compute", 1_000, 5_000, {"run": 1})]
        chrome_trace(rows, lambda pid: f"island {pid}", lambda pid, tid: f"cpu:{tid}")
    """
    trace: list[dict[str, Any]] = []
    seen_pid: set[int] = set()
    seen_tid: set[tuple[int, int]] = set()
    for row in rows:
        pid, tid = row.pid, row.tid
        if pid not in seen_pid:
            seen_pid.add(pid)
            label = process_name(pid)
            trace.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        if (pid, tid) not in seen_tid:
            seen_tid.add((pid, tid))
            label = thread_name(pid, tid)
            trace.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}})
        trace.append(
            {
                "ph": "X",
                "name": row.name,
                "cat": row.category,
                "pid": pid,
                "tid": tid,
                "ts": row.start / 1e3,
                "dur": max(row.end - row.start, 0) / 1e3,
                "args": row.args,
            }
        )
    return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": {"producer": producer}}


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


class RunEvent(NamedTuple):
    """A run's state transition (a named tuple: three are made per call)."""

    run_id: int
    program: str
    tenant: str
    state: str
    time: int  # ns since the log's epoch
    error: str | None = None

    def __repr__(self) -> str:
        return f"RunEvent(run={self.run_id}, {self.program!r}, state={self.state})"


class IslandOutput(NamedTuple):
    """What node ``node`` of run ``run_id`` wrote on remote island ``island`` as it ran (``stream``: "stdout" or
    "stderr"; a log record comes as stderr text)."""

    run_id: int
    node: str
    island: int
    stream: str
    text: str

    def marked(self) -> str:
        """``text`` with each line marked with its island: ``[island 1] x = 3.0``."""
        lines = self.text.splitlines()
        return "".join(f"[island {self.island}] {line}\n" for line in lines)


def echo(out: IslandOutput) -> None:
    """Write ``out`` to this process's stdout or stderr (looked up now), its lines marked with the island."""
    stream = sys.stderr if out.stream == "stderr" else sys.stdout
    stream.write(out.marked())
    stream.flush()


Subscriber = Callable[[Any], None]
EventKind = Literal["node", "run", "output"]
_log = logging.getLogger("pw_kernel")


def _run_events(row: tuple) -> list[RunEvent]:
    """The RunEvents of one kept row: one per state it entered."""
    state = row[3]
    if type(state) is tuple:
        run_id, program, tenant, _, t, error = row
        return [RunEvent(run_id, program, tenant, s, t, error) for s in state]
    return [RunEvent._make(row)]


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
        # Run events as plain tuples, RunEvent's fields in order: the garbage collector stops walking a
        # tuple of strings and numbers; RunEvents are made for readers. A row whose state is a tuple
        # of states is a run that entered them at once (a lone call: queued, running, done), one row.
        self._run_rows: collections.deque[tuple] = collections.deque(maxlen=max_events)
        self._lock = threading.Lock()
        self._by_kind: dict[str, list[Subscriber]] = {"node": [], "run": [], "output": []}
        self._rebind()
        #: What nodes wrote on remote islands as they ran, oldest first (the newest 10,000).
        self.outputs: collections.deque[IslandOutput] = collections.deque(maxlen=10_000)
        self.device_names: dict[int, str] = {}
        self.island_names: dict[int, str] = {}

    def now(self) -> int:
        return time.perf_counter_ns() - self.epoch

    def subscribe(self, callback: Subscriber, *, kinds: Iterable[EventKind] = ("node", "run")) -> Callable[[], None]:
        """Call ``callback(event)`` for every event of ``kinds`` from now on; returns an unsubscribe function.

        ``"node"``: NodeEvents; ``"run"``: RunEvents; ``"output"``: `IslandOutput`s, which such a
        subscriber takes: while one is subscribed, they are not echoed to this process's stdout and
        stderr (the notebook front routes them to cells). Callbacks run on the controller's threads:
        keep them short (a widget should batch and redraw on its own clock).

        Example::

            stop = log.subscribe(lambda out: print(out.marked(), end=""), kinds=("output",))
        """
        kinds = set(kinds)
        if not kinds <= {"node", "run", "output"}:
            raise ValueError(f"`EventLog.subscribe`: kinds are 'node', 'run' and 'output'; got {sorted(kinds)}")
        with self._lock:
            for kind, subs in self._by_kind.items():
                if kind in kinds:
                    self._by_kind[kind] = [*subs, callback]
            self._rebind()

        def unsubscribe() -> None:
            self._drop(callback)

        return unsubscribe

    def _drop(self, callback: Subscriber) -> None:
        with self._lock:
            for kind, subs in self._by_kind.items():
                self._by_kind[kind] = [s for s in subs if s is not callback]
            self._rebind()

    def _rebind(self) -> None:
        """The lists each emit reads (replaced, never changed in place: an emit reads one without the lock)."""
        self._node_subscribers = self._by_kind["node"]
        self._run_subscribers = self._by_kind["run"]
        self._output_subscribers = self._by_kind["output"]

    def emit_output(self, out: IslandOutput) -> None:
        """Record what a node wrote on a remote island; subscribers to outputs get it, or, with none, `echo` writes it."""
        self.outputs.append(out)
        takers = self._output_subscribers
        if not takers:
            try:
                echo(out)
            except Exception:  # a closed stream (interpreter shutdown): the log keeps it
                pass
        for cb in takers:
            self._call(cb, out)

    def emit_node(self, ev: NodeEvent) -> None:
        self.nodes.append(ev)
        for cb in self._node_subscribers:
            self._call(cb, ev)

    def emit_nodes(self, evs: list[NodeEvent]) -> None:
        """`emit_node` for each of ``evs`` in order (a completed batch): one append for all of them."""
        self.nodes.extend(evs)
        if self._node_subscribers:
            for ev in evs:
                for cb in self._node_subscribers:  # read per event: a subscriber that raised is dropped
                    self._call(cb, ev)

    @property
    def runs(self) -> list[RunEvent]:
        """Run transitions kept, oldest first (a copy).

        Example::

            [(e.run_id, e.state) for e in pw.controller().events.runs][-3:]
        """
        return [ev for row in list(self._run_rows) for ev in _run_events(row)]

    def emit_run(self, run_id: int, program: str, tenant: str, state: str | tuple[str, ...], error: str | None = None) -> None:
        """Record that run ``run_id`` entered ``state`` now; subscribers get a RunEvent.

        A tuple of states: it went through each of them, in order, in one transition (a lone
        call is queued, running and done at once): one row, read as one event per state.
        """
        row = (run_id, program, tenant, state, time.perf_counter_ns() - self.epoch, error)
        self._run_rows.append(row)
        if self._run_subscribers:
            for ev in _run_events(row):
                for cb in self._run_subscribers:
                    self._call(cb, ev)

    def _call(self, cb: Subscriber, ev: Any) -> None:
        try:
            cb(ev)
        except Exception:  # a broken view must never stop the controller: log it once, drop it
            _log.exception("pw_kernel: event subscriber %r raised; it is unsubscribed", cb)
            self._drop(cb)

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
        return busy_by_device(self.nodes if events is None else events)

    def to_chrome_trace(self, events: Iterable[NodeEvent] | None = None) -> dict[str, Any]:
        """Chrome trace JSON (complete "X" events; a pid per island, a tid per device) that Perfetto opens."""
        rows = (
            TraceRow(
                -1 if ev.island is None else ev.island,
                d,
                ev.node,
                ev.kind,
                ev.start,
                ev.end,
                {
                    "run": ev.run_id,
                    "program": ev.program,
                    "tenant": ev.tenant,
                    "dispatch_us": ev.dispatch / 1e3,
                    "bytes": ev.nbytes,
                    "shapes": ev.shapes,
                    **({"error": ev.error} if ev.error else {}),
                },
            )
            for ev in (list(self.nodes) if events is None else events)  # a copy: other threads append
            for d in ev.devices
        )
        return chrome_trace(
            rows,
            lambda pid: self.island_names.get(pid, f"island {pid}"),
            lambda pid, d: self.device_names.get(d, f"device {d}"),
        )

    def to_perfetto(self, path: str | os.PathLike, events: Iterable[NodeEvent] | None = None) -> str:
        """Write `to_chrome_trace` to ``path`` (open it at ui.perfetto.dev); returns the path."""
        path = os.fspath(path)
        with open(path, "w") as f:
            json.dump(self.to_chrome_trace(events), f)
        return path

    def clear(self) -> None:
        self.nodes.clear()
        self._run_rows.clear()
        self.outputs.clear()

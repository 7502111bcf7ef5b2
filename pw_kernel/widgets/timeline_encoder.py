"""The timeline's data: node events encoded column-wise into append-only chunks, and the lanes they touch.

An `EventEncoder` turns NodeEvents into a `Chunk`: ``measures`` (start, end,
bytes) as float64, ``ids`` (run, string ids, kind) as uint32, one (event,
lane) pair per bar, plus the strings not sent before. `TimelineWidget` ships
chunks to its front-end as binary buffers; `timeline_html` draws the static
picture from the same arrays. Lanes are one per device, one per transfer
path (``island a → island b``), one for the host's compiles and checkpoints,
one for input (`pw.prefetch` loading batches, programs taking them), and, in a
profile (`pw.profile`), one of XLA ops under each device's lane.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..runtime.extend import busy_time

KINDS: tuple[str, ...] = ("compute", "glue", "transfer", "compile", "checkpoint", "input", "op")
_INPUT = KINDS.index("input")
_OP = KINDS.index("op")  # an XLA op inside a node (`pw.profile`): on its device's ops lane
_KIND = {k: i for i, k in enumerate(KINDS)}
NONE = 0xFFFFFFFF  # "no string" (an event without an error)
#: An idle stretch this long (ns) ends a burst of activity: a view opens on the latest burst, not the whole session.
IDLE_GAP_NS = 2_000_000_000
MEASURE_FIELDS = ("start", "end", "nbytes")  # the columns of `Chunk.measures` (float64)
ID_FIELDS = ("run", "node", "program", "tenant", "shapes", "error", "kind")  # the columns of `Chunk.ids` (uint32)


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
        self.recent_t0 = 0.0  # where the latest burst of activity starts (after the last idle gap)
        self._reach = -float("inf")  # the latest end seen
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
        """The lane of host work that occupies no device: compiling executables, writing checkpoints."""
        lane = self._lane_of.get("host")
        if lane is None:
            lane = len(self.lanes)
            self._lane_of["host"] = lane
            self.lanes.append(
                {
                    "key": "host",
                    "label": "host work",
                    "kind": "host",
                    "device": None,
                    "island": None,
                    "cross": False,
                }
            )
        return lane

    def input_lane(self) -> int:
        """The host lane of input: `pw.prefetch` loading each batch, and programs' input nodes taking one."""
        lane = self._lane_of.get("input")
        if lane is None:
            lane = len(self.lanes)
            self._lane_of["input"] = lane
            self.lanes.append(
                {"key": "input", "label": "input: load", "kind": "host", "device": None, "island": None, "cross": False}
            )
        return lane

    def ops_lane(self, dev_id: int, island: int | None = None) -> int:
        """The lane of the XLA ops a profile saw on device ``dev_id`` (drawn under the device's own lane)."""
        lane = self._lane_of.get(("ops", dev_id))
        if lane is None:
            self.device_lane(dev_id, island=island)
            lane = len(self.lanes)
            self._lane_of[("ops", dev_id)] = lane
            label = self.lanes[self._lane_of[("dev", dev_id)]]["label"]
            self.lanes.append(
                {"key": f"ops:{dev_id}", "label": f"{label} · XLA ops", "kind": "ops", "device": int(dev_id),
                 "island": island, "cross": False}
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
            if ev.start > self._reach + IDLE_GAP_NS:
                self.recent_t0 = float(ev.start)
            self._reach = max(self._reach, ev.end)
            kind = _KIND.get(ev.kind, 0)
            # host work of no run (a checkpoint) has run id -1: no run, as a string may be no string
            ids += (ev.run_id if ev.run_id >= 0 else NONE, sid(ev.node), sid(ev.program), sid(ev.tenant), sid(ev.shapes), sid(ev.error), kind)
            if kind == 2:
                bars += (k, self.transfer_lane(ev.src_island, ev.island))
            elif kind == _INPUT:  # on the input lane only: taking a placed batch occupies no device
                bars += (k, self.input_lane())
                k += 1
                continue
            elif kind == _OP:  # inside a node's bar: on the ops lane beneath the device's
                for d in ev.devices:
                    bars += (k, self.ops_lane(d, ev.island))
                k += 1
                continue
            elif kind >= 3:  # compile, checkpoint
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


def lane_names(lanes: Sequence[dict[str, Any]]) -> list[str]:
    """Each lane's display name: its label, with ``[key]`` appended where two lanes share a label.

    Example::

        lane_names([{"key": "dev:0", "label": "cpu:0"}, {"key": "host", "label": "host work"}])
        # ['cpu:0', 'host work']
    """
    count = collections.Counter(str(lane["label"]) for lane in lanes)
    return [str(x["label"]) if count[str(x["label"])] == 1 else f"{x['label']} [{x['key']}]" for x in lanes]


def busy_union(measures: np.ndarray, bars: np.ndarray, lane: int, t0: float = -np.inf, t1: float = np.inf) -> float:
    """Nanoseconds covered by at least one bar of ``lane`` within [t0, t1] (the runtime's `busy_time`)."""
    ev = bars[bars[:, 1] == lane, 0]
    return busy_time(measures[ev, 0], measures[ev, 1], t0, t1)


__all__ = [
    "IDLE_GAP_NS",
    "ID_FIELDS",
    "KINDS",
    "MEASURE_FIELDS",
    "NONE",
    "Chunk",
    "EventEncoder",
    "busy_union",
    "lane_names",
    "transfer_key",
]

"""XLA's ops inside pw's nodes: `pw.profile()` takes a `jax.profiler` trace of a window and puts its ops on pw's clock.

While the window is open, JAX's profiler records what XLA runs (on the CPU,
each thunk: fusions, copies, collectives; on a GPU, each kernel), with the HLO
module and device it ran for. When it closes, `Profile` reads the trace
(``perfetto_trace.json.gz``, the Chrome trace JSON the profiler writes beside
its ``.xplane.pb``), moves every op onto the event log's clock (an annotation
made at a known time is the anchor), and attributes it to the pw node that was
running on that device then: each op becomes a `NodeEvent` of kind ``"op"``
(its name the HLO op's, its program the HLO module, its shapes the op's kind
and the node it ran in), so the timeline draws a device's ops on a lane under
the device's own (``pw.timeline(prof)``), and `Profile.export` writes one
Perfetto trace where the ops sit inside their nodes, on one clock.

Nothing of this runs outside a ``with pw.profile()`` block: profiling off costs nothing.

Example::

    with pw.profile() as prof:
        state, loss = pipe.step(state, x, y)
        loss.result()
    prof.ops_of("B3")               # the XLA ops of node B3
    pw.timeline(prof)               # nodes, and each device's ops beneath them
    prof.export("step.json")        # open at ui.perfetto.dev
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time
from typing import Any

import jax

from .errors import ArgumentError, PathwaysError
from .devices import remote_device_id
from .exec.events import NodeEvent

#: The annotation whose start is read on both clocks (the profiler's and the event log's).
ANCHOR = "pw_kernel.profile clock anchor"
#: How far the two clocks may disagree (ns): the anchor is read a few µs after the annotation starts.
_SLACK_NS = 50_000
#: How many of the temporary folders `pw.profile()` made stay on disk (a few MiB each: JAX's trace): the
#: newest, for TensorBoard; an older one goes when a newer one is made, and all of them when the process exits
#: (`tempfile.TemporaryDirectory`'s own clean-up at exit).
KEEP_OWN_DIRS = 4
_own_dirs: collections.deque[tempfile.TemporaryDirectory] = collections.deque()


def _own_dir() -> str:
    """A new temporary folder for a profile, removing the oldest of those made so that `KEEP_OWN_DIRS` remain."""
    while len(_own_dirs) >= KEEP_OWN_DIRS:
        _own_dirs.popleft().cleanup()
    folder = tempfile.TemporaryDirectory(prefix="pw_profile_", ignore_cleanup_errors=True)
    _own_dirs.append(folder)
    return folder.name


_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "send", "recv")


def op_kind(name: str) -> str:
    """What kind of XLA op ``name`` is: 'fusion', 'collective', 'copy', 'custom-call' or 'op'."""
    base = name.split(".")[0]
    if "fusion" in base:
        return "fusion"
    if base.startswith(_COLLECTIVES):
        return "collective"
    if "copy" in base:
        return "copy"
    if "custom-call" in base or base.startswith("cublas") or base.startswith("cudnn"):
        return "custom-call"
    return "op"


def start_trace(logdir: str) -> int:
    """Start JAX's profiler into ``logdir``; returns the anchor's time (this process's ``perf_counter_ns``).

    Example::

        anchor = start_trace(tempfile.mkdtemp())
        ...
        runs = executions(logdir, anchor)   # after jax.profiler.stop_trace()
    """
    try:
        jax.profiler.start_trace(logdir, create_perfetto_trace=True)
    except RuntimeError as e:  # JAX's profiler holds one session per process
        raise PathwaysError(
            f"`pw.profile()`: JAX's profiler is already tracing ({e}); close the other `pw.profile()` "
            f"block or `jax.profiler.stop_trace()` first."
        ) from e
    with jax.profiler.TraceAnnotation(ANCHOR):
        return time.perf_counter_ns()


def trace_file(logdir: str) -> str:
    """The Chrome trace JSON that JAX's profiler wrote under ``logdir`` (the latest)."""
    found = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "perfetto_trace.json.gz")),
                   key=os.path.getmtime)
    if not found:
        raise PathwaysError(
            f"`pw.profile()`: JAX's profiler wrote no perfetto_trace.json.gz under {logdir!r}; "
            f"is another profiler session running (jax.profiler.start_trace)?"
        )
    return found[-1]


def executions(logdir: str, anchor_ns: int) -> list[tuple[int, str, str, list[tuple[str, int, int]]]]:
    """XLA's executions in the trace: (device ordinal, HLO module, XLA's run id, [(op, start, end)]).

    Times are on the clock ``anchor_ns`` was read on (`start_trace`'s: this process's ``perf_counter_ns``,
    or any clock shifted from it). One execution is one run of one module on one device.
    """
    with gzip.open(trace_file(logdir), "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    anchor = next((e for e in events if e.get("ph") == "X" and e.get("name") == ANCHOR), None)
    if anchor is None:
        raise PathwaysError("`pw.profile()`: the profiler's trace holds no clock anchor; nothing can be placed.")
    offset = anchor_ns - round(anchor["ts"] * 1e3)  # profiler µs -> the anchor's clock, ns
    runs: dict[tuple, list[tuple[str, int, int]]] = {}
    for e in events:
        args = e.get("args") or {}
        op = args.get("hlo_op")
        dev = args.get("device_ordinal", args.get("device_id"))
        if e.get("ph") != "X" or op is None or dev is None:
            continue
        start = round(e["ts"] * 1e3) + offset
        key = (int(dev), args.get("hlo_module", ""), str(args.get("run_id", f"op{start}")))
        runs.setdefault(key, []).append((op, start, start + round(e.get("dur", 0) * 1e3)))
    return [(dev, hlo, run, ops) for (dev, hlo, run), ops in runs.items()]


class Profile:
    """The XLA ops of a profiled window, on pw's clock and inside pw's nodes (see the module's docstring).

    ``ops``: one `NodeEvent` of kind ``"op"`` per op (``run_id`` the node's run, -1 for an op
    outside every node); ``nodes``: the node events of the window.
    """

    def __init__(self, controller: Any, logdir: str | None):
        self._controller = controller
        self.logdir = logdir
        self._own_dir = logdir is None
        self.ops: list[NodeEvent] = []
        self.nodes: list[NodeEvent] = []
        self._anchor_ns = 0  # when the window opened, on the event log's clock
        self._remotes: list = []  # remote islands tracing the window too
        self._open = False

    def __enter__(self) -> Profile:
        if self._open:
            raise PathwaysError("`pw.profile()`: this profile is already open; make a new one for another window.")
        if self._own_dir:
            self.logdir = _own_dir()
        log = self._controller.events
        self._anchor_ns = start_trace(self.logdir) - log.epoch
        self._open = True
        # Remote islands that profile themselves (the Pathways service) trace the same window there.
        self._remotes = [i.remote for i in self._controller.islands if i.remote is not None and i.remote.profiles]
        for r in self._remotes:
            r.start_profile()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._open = False
        jax.profiler.stop_trace()
        remote = []
        for r in self._remotes:
            try:
                remote.append((r, r.stop_profile()))
            except Exception:
                if exc_type is None:
                    raise
        t0 = self._anchor_ns
        self.nodes = [ev for ev in list(self._controller.events.nodes) if ev.end >= t0 and ev.kind != "compile"]
        try:
            self.ops = self._read_ops(remote)
        except Exception:
            if exc_type is None:
                raise
            self.ops = []  # the block's own error is the one to see

    # ------------------------------------------------------------------ reading the trace
    def _trace_file(self) -> str:
        return trace_file(self.logdir)

    def _read_ops(self, remote: list = ()) -> list[NodeEvent]:
        """Every XLA op of the trace (and of remote islands' traces) as an "op" `NodeEvent`, on the log's clock,
        in the node it ran in.

        One execution of an HLO module (`jit_<name>`) on a device is one node's; the node,
        as the profile shows it (``nodes``), spans its ops on that device: when XLA ran it
        there (the log's own times are what the controller saw, later on the CPU). A remote
        island's executions are its own modules: matched to the island's nodes by device and time.
        """
        epoch = self._controller.events.epoch
        found = [(dev, hlo, ops, True) for dev, hlo, _, ops in executions(self.logdir, self._anchor_ns + epoch)]
        for r, runs in remote:
            pos = {d: k for k, d in enumerate(r.info["devices"])}
            shift = r.offset_ns  # the island's perf_counter_ns -> this process's
            for dev, hlo, _, ops in runs:
                if dev in pos and r.island is not None:
                    found.append((remote_device_id(r.island, pos[dev]), hlo,
                                  [(op, a + shift, b + shift) for op, a, b in ops], False))
        module = self._modules()
        # Each execution to the node that ran it: on its device, of its module, dispatched before it
        # began and seen done after it ended, the earliest such (a device runs its nodes in order).
        taken: set[tuple[int, int]] = set()
        ops: list[NodeEvent] = []
        spans: dict[tuple[int, int], list[int]] = {}  # (id of the node event, device) -> [start, end] of its ops
        for dev, hlo, run_ops, local in sorted(found, key=lambda x: min(o[1] for o in x[2])):
            run_ops = [(op, a - epoch, b - epoch) for op, a, b in run_ops]
            first, last = min(o[1] for o in run_ops), max(o[2] for o in run_ops)
            fits = [n for n in self.nodes if dev in n.devices and (module.get((n.run_id, n.node)) == hlo or not local)
                    and (id(n), dev) not in taken and n.dispatch <= first + _SLACK_NS and last <= n.end + _SLACK_NS]
            node = min(fits, key=lambda n: n.dispatch, default=None)
            if node is not None:
                taken.add((id(node), dev))
                spans[(id(node), dev)] = [first, last]
            for op, start, end in run_ops:
                ev = NodeEvent(
                    len(ops), -1 if node is None else node.run_id, hlo, "" if node is None else node.tenant, op, "op",
                    (dev,), None if node is None else node.island, None, start, 0,
                    op_kind(op) + ("" if node is None else f" in {node.node}"),
                )
                ev.start, ev.end = start, end
                ops.append(ev)
        ops.sort(key=lambda ev: ev.start)
        self.nodes = self._per_device(spans)
        return ops

    def _modules(self) -> dict[tuple[int, str], str]:
        """(run id, node name) -> the HLO module its step runs (``jit_`` and the executable's name)."""
        runs = {ev.run_id for ev in self.nodes}
        out = {}
        for run in list(self._controller.runs):
            if run.id in runs:
                for st in run.plan.steps:
                    name = getattr(st.call, "__name__", None)
                    if name:
                        out[(run.id, st.name)] = "jit_" + re.sub(r"[^0-9A-Za-z_]", "_", name)
        return out

    def _per_device(self, spans: dict[tuple[int, int], list[int]]) -> list[NodeEvent]:
        """The window's nodes, one event per device: when its ops ran there, or the log's times if none did."""
        out = []
        for ev in self.nodes:
            for d in ev.devices:
                copy = NodeEvent(ev.seq, ev.run_id, ev.program, ev.tenant, ev.node, ev.kind, (d,), ev.island,
                                 ev.src_island, ev.dispatch, ev.nbytes, ev.shapes)
                copy.start, copy.end = spans.get((id(ev), d), (ev.start, ev.end))
                copy.error = ev.error
                out.append(copy)
        return sorted(out, key=lambda ev: ev.start)

    # ------------------------------------------------------------------ views of it
    def ops_of(self, node: str | NodeEvent) -> list[NodeEvent]:
        """The ops that ran inside ``node`` (its name, every run of it; or one node event)."""
        if isinstance(node, NodeEvent):
            return [op for op in self.ops if op.run_id == node.run_id and op.shapes.endswith(f" in {node.node}")
                    and set(op.devices) <= set(node.devices) and node.start <= op.start <= node.end]
        if not isinstance(node, str):
            raise ArgumentError(f"`Profile.ops_of` takes a node's name or a NodeEvent; got {type(node).__name__}.")
        return [op for op in self.ops if op.shapes.endswith(f" in {node}")]

    def events(self) -> list[NodeEvent]:
        """The window's node events and op events, by start."""
        return sorted([*self.nodes, *self.ops], key=lambda ev: ev.start)

    def to_chrome_trace(self) -> dict[str, Any]:
        """One Chrome trace (Perfetto opens it): pw's nodes and XLA's ops on one clock, ops nested in their nodes."""
        return self._controller.events.to_chrome_trace(self.events())

    def export(self, path: str | os.PathLike) -> str:
        """Write `to_chrome_trace` to ``path`` (open it at ui.perfetto.dev); returns the path."""
        path = os.fspath(path)
        with open(path, "w") as f:
            json.dump(self.to_chrome_trace(), f)
        return path

    def summary(self, top: int = 10) -> list[tuple[str, int, float]]:
        """The ``top`` ops by total time: (name, count, total ms)."""
        total: dict[str, list[float]] = {}
        for op in self.ops:
            t = total.setdefault(op.node, [0, 0.0])
            t[0] += 1
            t[1] += (op.end - op.start) / 1e6
        rows = sorted(((n, int(c), ms) for n, (c, ms) in total.items()), key=lambda r: -r[2])
        return rows[:top]

    def __repr__(self) -> str:
        nodes = len({(ev.run_id, ev.node) for ev in self.nodes})
        return f"<pw.Profile: {nodes} nodes, {len(self.ops)} XLA ops, trace in {self.logdir!r}>"

"""RunWidget: one run's name, state, nodes done / total, elapsed time, error and a mini timeline, live.

The mini timeline is labelled: a caption with its colour key, a name per device row and a time scale
(``static/run.js`` draws it live; the static picture is `timeline_html.static_timeline`'s, from the run's events).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

import traitlets as t

from ..runtime.extend import FINAL, pace, short_error
from ._base import PwWidget, controller_of
from ._devices import slice_devices
from ._html import describe_outputs, run_html
from ._ticker import ticker
from .esm import esm_source
from .timeline_html import static_timeline

MAX_MINI_BARS = 1500
MINI_PERIOD = 0.25  # seconds between two updates of the mini timeline (the bar and counters go at ~10 Hz)
#: Seconds between two looks at a running run with no events: a compile starts and ends without one.
QUIET_PERIOD = 0.5


class RunWidget(PwWidget):
    """A run's progress, updated live from the controller's event stream until it is final.

    ``outputs`` (optional) maps names to the run's futures, shown with type and sharding.

    Example::

        run = step.submit(x)
        pw.widgets.RunWidget(run, {"y": run.outputs})   # queued -> running 3/8 -> done 8/8, 0.42 s
    """

    _esm = esm_source("run")

    run_id = t.Int(0).tag(sync=True)
    name = t.Unicode("").tag(sync=True)
    program = t.Unicode("").tag(sync=True)
    state = t.Unicode("queued").tag(sync=True)
    done = t.Int(0).tag(sync=True)
    total = t.Int(0).tag(sync=True)
    elapsed = t.Float(0.0).tag(sync=True)
    error = t.Unicode("").tag(sync=True)
    mode = t.Unicode("").tag(sync=True)
    tenant = t.Unicode("").tag(sync=True)
    compiling = t.Unicode("").tag(sync=True)  # the step XLA is compiling now (a first call), else ""
    pace = t.Unicode("").tag(sync=True)  # a long run's "85 nodes/s, ~12 s left" (`runtime.run.pace`), else ""
    lanes = t.List(t.Unicode()).tag(sync=True)
    bars = t.List(t.Float()).tag(sync=True)  # flat: lane, start ns, end ns, kind (0 compute, 1 glue, 2 transfer)
    outputs = t.List(t.Dict()).tag(sync=True)  # the names a cell bound: {name, type, sharding}

    def __init__(
        self,
        run: Any,
        outputs: dict[str, Any] | None = None,
        *,
        live: bool = True,
        condense: Callable[[str], str] = str,
        **kwargs: Any,
    ):
        self.run = run
        self._condense = condense  # shortens quoted tracebacks, as the notebook's other error views do
        kwargs.setdefault("outputs", describe_outputs(outputs))
        self._lock = threading.RLock()
        self._pending: collections.deque[Any] = collections.deque()
        self._dirty = False
        self._unsubscribe = None
        self._lane_of: dict[int, int] = {}
        self._lane_names: list[str] = []
        self._mini: list[tuple[int, int, int, int]] = []
        self._mini_at = 0.0
        graph = getattr(run, "graph", None)
        owner = controller_of(run)
        log = owner.events if owner is not None else None
        self._names = getattr(log, "device_names", {})
        refs = {r.id: r for s in getattr(graph, "slices", ()) for r in slice_devices(s, self._names)}
        for ref in sorted(refs.values(), key=lambda r: r.id):
            self._lane(ref.id, ref.label)
        super().__init__(**kwargs)
        if live and log is not None and run.state not in FINAL:
            self._unsubscribe = log.subscribe(self._on_event)
            ticker.add(self)
        with self._lock:
            self._pending.extend(list(getattr(run, "events", ())))
            self._update(time.monotonic(), force_mini=True)
        if self._unsubscribe is not None and run.state in FINAL:  # it finished while we subscribed
            self._finish()

    def _lane(self, dev_id: int, label: str | None = None) -> int:
        k = self._lane_of.get(dev_id)
        if k is None:
            k = self._lane_of[dev_id] = len(self._lane_names)
            self._lane_names.append(label or self._names.get(dev_id, f"device {dev_id}"))
        return k

    def _on_event(self, ev: Any) -> None:
        if ev.run_id != self.run.id:
            return
        if hasattr(ev, "node"):
            self._pending.append(ev)
        self._dirty = True
        ticker.poke()

    def _tick(self, now: float) -> float | None:
        if self.comm is None:
            self._unfollow()
            return None
        if not self._dirty and not self._pending and (self.run.compiling or "") == self.compiling:
            return now + QUIET_PERIOD if self.run.state == "running" else None
        with self._lock:
            self._dirty = False
            final = self.run.state in FINAL
            self._update(now)
        if final:
            self._finish()
            return None
        # come back for the mini timeline if it was throttled, and to see a compile start or end
        return self._mini_at + MINI_PERIOD if self._pending else now + QUIET_PERIOD

    def _update(self, now: float, force_mini: bool = False) -> None:
        run = self.run
        done, total = run.progress
        state = run.state
        mini = force_mini or state in FINAL or now - self._mini_at >= MINI_PERIOD
        if mini:
            self._mini_at = now
            while self._pending:
                ev = self._pending.popleft()
                kind = 2 if ev.kind == "transfer" else (1 if ev.kind == "glue" else 0)
                for d in ev.devices:
                    self._mini.append((self._lane(d), ev.start, ev.end, kind))
        graph = getattr(run, "graph", None)
        err = run.error if state in ("failed",) else None
        with self.hold_sync():
            self.run_id = int(run.id)
            self.name = str(run.name)
            self.program = str(getattr(graph, "name", run.name))
            self.done, self.total = int(done), int(total)
            self.elapsed = float(run.elapsed)
            self.error = short_error(None if err is None else self._condense(f"{type(err).__name__}: {err}"))
            self.mode = str(getattr(run, "mode", ""))
            self.tenant = str(getattr(run, "tenant", ""))
            self.compiling = "" if state in FINAL else (run.compiling or "")
            self.pace = pace(state, run.throughput, run.time_left, done, total)
            if mini:
                if len(self.lanes) != len(self._lane_names):
                    self.lanes = list(self._lane_names)
                self.bars = self._mini_flat()
            # last: whoever sees the final state (another thread reading traits) sees its counts too
            self.state = str(state)

    def _mini_flat(self) -> list[float]:
        bars = self._mini[-MAX_MINI_BARS:]
        if not bars:
            return []
        t0 = min(b[1] for b in bars)
        out: list[float] = []
        for lane, s, e, k in bars:
            out += (lane, float(s - t0), float(e - t0), k)
        return out

    def _finish(self) -> None:
        self._unfollow()
        with self._lock:
            self._update(time.monotonic(), force_mini=True)
        self.refresh_static()  # a saved notebook shows the final state, not "queued"

    def flush(self) -> None:
        """Show the run's progress now (the ticker does this on its own, about ten times a second)."""
        self._tick(time.monotonic())

    def close(self) -> None:
        self._unfollow()
        super().close()

    def state_dict(self) -> dict[str, Any]:
        keys = (
            "run_id", "name", "program", "state", "done", "total", "elapsed", "error", "mode", "tenant", "compiling",
            "pace", "outputs",
        )
        return {k: getattr(self, k) for k in keys}

    def static_html(self) -> str:
        with self._lock:  # the rows the live view has, in its order
            rows = sorted(self._lane_of.items(), key=lambda kv: kv[1])
            devices = [(dev, self._lane_names[k], None) for dev, k in rows]
        mini = static_timeline(list(self.run.events), mini=True, devices=devices, names=self._names)
        return run_html(self.state_dict()) + mini

    def __repr__(self) -> str:
        err = f", {self.error.splitlines()[0]}" if self.error else ""
        return (
            f"RunWidget(run {self.run_id} {self.name!r}: {self.state}, {self.done}/{self.total} nodes, "
            f"{self.elapsed:.3f} s{err})"
        )


__all__ = ["RunWidget"]

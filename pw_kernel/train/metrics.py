"""Metrics from futures, never blocking: `pw.log({"loss": loss}, step=i)` as researchers know it from wandb.

A training loop made asynchronous must not wait for its loss to print it.
`pw.log` (a `MetricsLog`, called) takes futures (or arrays, or numbers) and returns at once; each value is
recorded when its future resolves, read to the host on the metrics thread
(never the dispatching or completing one). `MetricsLog` keeps every scalar by
name and step, tells subscribers (the live plot, `MetricsLog.plot`) as values
arrive, and writes TensorBoard event files when asked (`to_tensorboard`,
through tensorboardX), so a run shows where researchers already look.

Example::

    for i, batch in enumerate(batches):
        params, opt_state, loss = step(params, opt_state, batch)
        pw.log({"loss": loss, "lr": schedule(i)}, step=i)    # returns at once
    pw.log.plot()                                             # a live curve per metric
    pw.log.series("loss")                                     # ([0, 1, ...], [2.31, 2.27, ...])
"""

from __future__ import annotations

import bisect
import collections
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from ..runtime import ArgumentError, Future


class Scalar(NamedTuple):
    """One recorded value: its metric, step, value and when it was recorded (`time.time()`)."""

    name: str
    step: int
    value: float
    time: float


class MetricsLog:
    """Scalars by name and step, recorded as the futures they come from resolve.

    `pw.log` is the process's one: call it to log, ask it what it recorded.

    Example::

        pw.log({"loss": loss}, step=3)
        pw.log.wait()                   # every value logged so far recorded
        pw.log.series("loss")           # ([3], [0.91])
        pw.log.plot()                   # a live curve per metric
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._series: dict[str, tuple[list[int], list[float]]] = {}
        self._next_step = 0
        self._pending = 0  # values logged, not yet recorded (or failed)
        self._idle = threading.Condition(self._lock)
        self._queue: queue.SimpleQueue[tuple[str, int, Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._subscribers: list[Callable[[list[Scalar]], Any]] = []
        self.errors: collections.deque[str] = collections.deque(maxlen=100)  # values that could not be read

    # ------------------------------------------------------------------ logging
    def __call__(self, values: Mapping[str, Any], step: int | None = None) -> int:
        """Record ``values`` (name -> future, array or number; scalars) at ``step``; returns the step at once.

        ``step`` defaults to one more than the last logged (0 first), as wandb's does. A future is
        read once it resolves, on the metrics thread: logging never waits for the devices.

        Example::

            params, opt_state, loss = step(params, opt_state, batch)
            pw.log({"loss": loss}, step=i)          # recorded when loss resolves
        """
        if not isinstance(values, Mapping):
            raise ArgumentError(
                f"`pw.log` takes a dict of name -> scalar (a future, an array or a number), as "
                f"`pw.log({{'loss': loss}}, step=i)`; got {type(values).__name__}."
            )
        if step is not None and (isinstance(step, bool) or not isinstance(step, (int, np.integer))):
            raise ArgumentError(f"`pw.log`: `step` must be an int (or None: the next step); got {step!r}.")
        checked = [(self._name(k), v) for k, v in values.items()]
        for name, v in checked:
            self._check_scalar(name, v)
        with self._lock:
            step = self._next_step if step is None else int(step)
            self._next_step = step + 1
            self._pending += len(checked)
        now = time.time()
        ready = []
        for name, v in checked:
            if isinstance(v, (int, float, np.number)):
                ready.append(Scalar(name, step, float(v), now))
            elif isinstance(v, Future):
                # Resolved under the controller's lock: the callback only queues it (read on our thread).
                v.add_done_callback(lambda fut, name=name: self._queue_read(name, step, fut))
            else:  # an array: possibly still computing, read on the metrics thread
                self._queue_read(name, step, v)
        if ready:
            self._record(ready)
        return step

    @staticmethod
    def _name(key: Any) -> str:
        if not isinstance(key, str) or not key:
            raise ArgumentError(f"`pw.log`: metric names must be non-empty strings; got {key!r}.")
        return key

    @staticmethod
    def _check_scalar(name: str, v: Any) -> None:
        if isinstance(v, (bool, np.bool_)):
            raise ArgumentError(f"`pw.log`: {name!r} is a bool; log a number (`float(flag)`).")
        if isinstance(v, (int, float, np.number)):
            return
        shape = getattr(v, "shape", None)
        if shape is None:
            raise ArgumentError(
                f"`pw.log`: {name!r} is a {type(v).__name__}; log a scalar future, array or number."
            )
        if math.prod(shape) != 1:
            raise ArgumentError(
                f"`pw.log`: {name!r} has shape {tuple(shape)}; a metric is one number. Log a reduction "
                f"of it (`x.mean()` inside the step), or one entry."
            )

    def _queue_read(self, name: str, step: int, value: Any) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._read_loop, name="pw-metrics", daemon=True)
                    self._thread.start()
        self._queue.put((name, step, value))

    def _read_loop(self) -> None:
        q = self._queue
        while True:
            item = q.get()
            if item is None:
                return
            batch = [item]
            while True:  # what has queued meanwhile goes to subscribers in one update
                try:
                    more = q.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    q.put(None)
                    break
                batch.append(more)
            got = []
            for name, step, value in batch:
                try:
                    v = value.result() if isinstance(value, Future) else value
                    got.append(Scalar(name, step, float(np.asarray(v).reshape(())), time.time()))
                except Exception as e:  # a failed run's loss: recorded nowhere, said in `errors`
                    self.errors.append(f"{name!r} at step {step}: {type(e).__name__}: {e}")
                    with self._lock:
                        self._pending -= 1
                        self._idle.notify_all()
            if got:
                self._record(got)

    def _record(self, scalars: list[Scalar]) -> None:
        with self._lock:
            for s in scalars:
                steps, values = self._series.setdefault(s.name, ([], []))
                if steps and s.step < steps[-1]:  # (resolved out of order: kept sorted by step)
                    k = bisect.bisect_right(steps, s.step)
                    steps.insert(k, s.step)
                    values.insert(k, s.value)
                else:
                    steps.append(s.step)
                    values.append(s.value)
            self._pending -= len(scalars)
            self._idle.notify_all()
            subscribers = list(self._subscribers)
        for cb in subscribers:
            try:
                cb(scalars)
            except Exception:  # a broken view must never lose a value: drop the view
                with self._lock:
                    self._subscribers = [c for c in self._subscribers if c is not cb]

    # ------------------------------------------------------------------ reading
    @property
    def names(self) -> list[str]:
        """The metrics logged so far, in the order they first arrived."""
        with self._lock:
            return list(self._series)

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) of metric ``name`` recorded so far, by step (copies)."""
        with self._lock:
            if name not in self._series:
                raise KeyError(f"`MetricsLog.series`: no metric {name!r} recorded yet; recorded: {list(self._series)}")
            steps, values = self._series[name]
            return list(steps), list(values)

    def last(self, name: str) -> float | None:
        """The value of ``name`` at the highest step recorded so far, or None."""
        with self._lock:
            got = self._series.get(name)
            return got[1][-1] if got and got[1] else None

    @property
    def pending(self) -> int:
        """Values logged and not yet recorded (their futures still computing)."""
        with self._lock:
            return self._pending

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every value logged so far is recorded (or failed); False if ``timeout`` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending <= 0, timeout)

    def subscribe(self, callback: Callable[[list[Scalar]], Any]) -> Callable[[], None]:
        """Call ``callback(scalars)`` with each batch of newly recorded scalars; returns an unsubscribe function."""
        with self._lock:
            self._subscribers = [*self._subscribers, callback]

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = [c for c in self._subscribers if c is not callback]

        return unsubscribe

    def clear(self) -> None:
        """Forget every recorded value (a new experiment); values still pending are recorded when they come."""
        with self._lock:
            self._series.clear()
            self._next_step = 0

    # ------------------------------------------------------------------ outputs
    def plot(self, names: list[str] | None = None):
        """A live plot of ``names`` (default: every metric, as they arrive) against step; see `MetricsPlot`."""
        from ..widgets import MetricsPlot  # (the views need the notebook stack; the log does not)

        return MetricsPlot(self, names=names)

    def to_tensorboard(self, logdir: str) -> Callable[[], None]:
        """Also write every scalar, recorded so far and from now on, as TensorBoard event files in ``logdir``.

        Uses tensorboardX's `SummaryWriter` (``pip install tensorboardX``; in the ``train`` extra).
        Returns a function that stops writing and closes the files.
        """
        try:
            from tensorboardX import SummaryWriter
        except ImportError as e:
            raise ImportError(
                f"`MetricsLog.to_tensorboard` needs tensorboardX ({e}): pip install 'pw_kernel[train]' "
                f"(or tensorboardX alone)."
            ) from e
        writer = SummaryWriter(logdir)
        lock = threading.Lock()

        def write(scalars: list[Scalar]) -> None:
            with lock:
                for s in scalars:
                    writer.add_scalar(s.name, s.value, s.step, walltime=s.time)
                writer.flush()

        with self._lock:  # what is recorded already, then what comes (no value twice, none missed)
            now = time.time()
            past = [Scalar(n, st, v, now) for n, (steps, vals) in self._series.items() for st, v in zip(steps, vals)]
            self._subscribers = [*self._subscribers, write]
        write(past)

        def stop() -> None:
            with self._lock:
                self._subscribers = [c for c in self._subscribers if c is not write]
            with lock:
                writer.close()

        return stop

    def __repr__(self) -> str:
        with self._lock:
            parts = [f"{n}: {len(s)} steps, last {v[-1]:.4g}" for n, (s, v) in self._series.items() if v]
            pending = self._pending
        more = f"; {pending} pending" if pending else ""
        return f"<pw.MetricsLog {'; '.join(parts) or 'empty'}{more}>"


#: The log `pw.log` is: call it to log (`MetricsLog.__call__`), ask it for what it recorded.
log = MetricsLog()

"""Clients' nodes that call the host, in the service: loaded as Python, their output given to the run that made it.

`jax.export` cannot carry a host callback (`jax.debug.print`, `pure_callback`,
`io_callback`, `debug.callback`), so such a node comes as its pickled
evaluator, as it goes to a Ray island (`pw_kernel.runtime.remote.shipped`),
and runs its Python in the service process. A Ray actor runs one node at a
time and takes whatever is written meanwhile; the service runs several clients'
nodes at once, so each write and log record is routed by the thread that makes
it: a callback's thread names its node executable (`calling_node`), whose
`NodeSink` gives it to the run of that executable running now (the first of
those dispatched whose outputs are not computed yet: a device runs its queue
in order). What a run's nodes wrote and raised goes back with its reply.
"""

from __future__ import annotations

import collections
import pickle
import threading
from typing import Any

from ..runtime.extend import RoutedOutput, callback_failure, calling_node

_output: RoutedOutput | None = None
_output_lock = threading.Lock()


def load(blob: bytes) -> tuple[Any, NodeSink]:
    """A shipped node's evaluator and the sink its callbacks report to (pickled by `shipped.ship`)."""
    global _output
    with _output_lock:
        if _output is None:  # (once per process: stdout, stderr and the root logger, routed by thread)
            _output = RoutedOutput(_pieces_here)
            _output.install()
    evaluate, errors = pickle.loads(blob)
    sink = errors.sink = NodeSink()
    return evaluate, sink


def expected(shipped: dict, ops: list) -> list:
    """``(op index, its node's sink, this run of it)`` for each op of a burst whose node calls the host:
    expected in dispatch order before it can run, so what its callbacks write is this run's."""
    said = []
    for i, op in enumerate(ops if shipped else ()):
        sink = shipped.get(op[0])
        if sink is not None:
            said.append((i, sink, sink.expect()))
    return said


def _pieces_here() -> list | None:
    """What the run whose host callback runs on this thread wrote so far (what is written now joins it)."""
    sink = getattr(calling_node(), "sink", None)
    if sink is None:
        return None
    said = sink.now()
    return None if said is None else said.pieces


class Said:
    """One run of a shipped node: its outputs (set once dispatched) and what it wrote and raised."""

    __slots__ = ("outs", "pieces", "errors")

    def __init__(self) -> None:
        self.outs: list | None = None
        self.pieces: list[tuple[str, str]] = []
        self.errors: list[BaseException] = []

    def ran(self) -> bool:
        return self.outs is not None and all(f.is_ready() for f in self.outs)

    def failure(self) -> str | None:
        return callback_failure(self.errors[0]) if self.errors else None


class NodeSink:
    """One client's shipped node executable: its runs in dispatch order, and what each wrote.

    Example::

        said = sink.expect()          # before the burst with the node is submitted
        said.outs = outputs           # once it is
        ...                           # its callbacks write: into sink.now().pieces
        sink.finished(said)           # its run is answered with said.pieces
    """

    def __init__(self) -> None:
        self._runs: collections.deque[Said] = collections.deque()
        self._lock = threading.Lock()

    def expect(self) -> Said:
        said = Said()
        with self._lock:
            self._runs.append(said)
        return said

    def finished(self, said: Said) -> None:
        with self._lock:
            try:
                self._runs.remove(said)
            except ValueError:
                pass

    def now(self) -> Said | None:
        """The run whose callback runs now: the first not yet computed (before its outputs are even set, a
        node computed inside its dispatch is running)."""
        with self._lock:
            for said in self._runs:
                if not said.ran():
                    return said
            return self._runs[-1] if self._runs else None

    def raised(self, error: BaseException) -> None:
        said = self.now()
        if said is not None:
            said.errors.append(error)

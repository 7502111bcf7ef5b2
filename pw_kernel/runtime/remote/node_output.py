"""What a node writes while it runs on a remote island: caught there, given to the node, sent back.

A node's host callbacks (`jax.debug.print`, a `jax.debug.callback` or
`io_callback` that prints or logs) run on XLA's threads, not on the thread that
called the node. The island's actor runs a burst's nodes one after another and
waits for each, so whatever its process writes while a node runs is that
node's: `NodeOutput` stands in for ``sys.stdout`` and ``sys.stderr`` once,
and while `catching` (a handler on the root logger then too) it keeps every
write and log record, from any thread, as ``(stream, text)`` pieces for the
burst's reply. Outside a catch a write goes where it always went (the
worker's log).

A process that runs several clients' nodes at once (the Pathways service) cannot
say "whatever is written now is that node's": `RoutedOutput` asks, for each
write and record, whose host callback runs on the writing thread.

Only the standard library: it runs inside the island's process.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Callable, Iterator

#: A node's output: (stream, text) pieces, in the order written; stream is "stdout" or "stderr".
Pieces = list[tuple[str, str]]


class _Stream:
    """``sys.stdout`` or ``sys.stderr`` on the island: each write kept while a node runs, and passed on."""

    def __init__(self, name: str, inner, sink: NodeOutput):
        self._name = name
        self._inner = inner
        self._sink = sink

    def write(self, text: str) -> int:
        self._sink.keep(self._name, text)
        return self._inner.write(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, attr):  # flush, fileno, isatty, encoding, ...: the stream it stands for
        return getattr(self._inner, attr)


class _Records(logging.Handler):
    """Log records made while a node runs (those their logger's level lets through), as stderr text."""

    def __init__(self, sink: NodeOutput):
        super().__init__(logging.NOTSET)
        self._sink = sink
        self.setFormatter(logging.Formatter(logging.BASIC_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        self._sink.keep("stderr", self.format(record) + "\n")


class NodeOutput:
    """The island process's output catcher (one per actor; `install` once, then `catching` per node).

    Example::

        out = NodeOutput()
        out.install()
        with out.catching() as pieces:
            run_the_node()
        pieces   # [("stdout", "x = 3.0\\n")]
    """

    def __init__(self) -> None:
        self._pieces: Pieces | None = None  # the running node's, while catching
        self._lock = threading.Lock()  # XLA's threads may write at once
        self._installed = False
        self._records = _Records(self)

    def install(self) -> None:
        if self._installed:
            return
        self._installed = True
        _wrap_streams(self)

    def keep(self, stream: str, text: str) -> None:
        pieces = self._pieces
        if pieces is None or not text:
            return
        with self._lock:
            _add(pieces, stream, text)

    @contextlib.contextmanager
    def catching(self) -> Iterator[Pieces]:
        """Keep what is written until the block ends (a node's run), in the list it yields."""
        pieces: Pieces = []
        self._pieces = pieces
        root = logging.getLogger()
        root.addHandler(self._records)  # (only now: outside a catch, records go where they always went)
        try:
            yield pieces
        finally:
            root.removeHandler(self._records)
            self._pieces = None


class RoutedOutput:
    """Writes and log records made inside a host callback, given to that callback's node by the writing thread.

    ``whose()`` says, on the calling thread, which pieces what is written now joins (a list), or
    None: then it only goes where it always went.

    Example::

        out = RoutedOutput(lambda: pieces_of_the_node_whose_callback_runs_here())
        out.install()      # once per process
    """

    def __init__(self, whose: Callable[[], Pieces | None]):
        self._whose = whose
        self._lock = threading.Lock()
        self._records = _Records(self)
        self._records.addFilter(lambda record: self._whose() is not None)  # (formatted only if someone keeps it)
        self._installed = False

    def install(self) -> None:
        if self._installed:
            return
        self._installed = True
        _wrap_streams(self)
        logging.getLogger().addHandler(self._records)

    def keep(self, stream: str, text: str) -> None:
        pieces = self._whose()
        if pieces is not None and text:
            with self._lock:
                _add(pieces, stream, text)


def _wrap_streams(sink) -> None:
    """``sys.stdout`` and ``sys.stderr`` write through ``sink.keep`` too, from now on."""
    sys.stdout = _Stream("stdout", sys.stdout, sink)
    sys.stderr = _Stream("stderr", sys.stderr, sink)


def _add(pieces: Pieces, stream: str, text: str) -> None:
    if pieces and pieces[-1][0] == stream:  # print's text and its newline: one piece
        pieces[-1] = (stream, pieces[-1][1] + text)
    else:
        pieces.append((stream, text))

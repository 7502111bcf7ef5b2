"""What a node prints or logs on a remote island, shown in the output of the cell that submitted its run.

Nothing is added to the path of a call: before each cell (`pre_run_cell`) the
router notes the controller's newest run id and the cell's parent header (the
Jupyter request the cell answers); after it (`post_run_cell`) the runs with
later ids are that cell's. The event log hands it every `IslandOutput` (it
subscribes to outputs, so they are not echoed plainly), on the thread that
completed the node; it writes the lines to this process's stdout or stderr with
the cell's parent header set for that thread only (ipykernel's
`OutStream.set_thread_parent`), so they land in that cell even while another
one runs. Each line is marked with its island::

    [island 1] x = 3.0

A run whose cell is still running, or that no cell submitted, prints where the
kernel prints now: in the running cell.
"""

from __future__ import annotations

import bisect
import sys
import weakref
from typing import Any

from ..runtime import IslandOutput, controller

#: Cells remembered (their runs' id spans): older ones print where the kernel prints now.
KEEP_CELLS = 1000


class IslandOutputRouter:
    """Routes `IslandOutput` events to the cells that submitted their runs (`register` on a shell)."""

    def __init__(self, shell: Any):
        self.shell = shell
        self._mark: tuple[int, dict | None] | None = None  # before the cell: (newest run id, its parent header)
        # Per cell that submitted runs, oldest first: (its first run id, its last, its parent header). Read on
        # the completing thread: appended to, or replaced whole, never changed in place.
        self._cells: list[tuple[int, int, dict | None]] = []
        self._log = None  # the event log followed (a new controller has a new one)
        self._stop = None

    def register(self) -> None:
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)
        self._follow()

    def unregister(self) -> None:
        for event, hook in (("pre_run_cell", self.pre_run_cell), ("post_run_cell", self.post_run_cell)):
            try:
                self.shell.events.unregister(event, hook)
            except ValueError:
                pass
        if self._stop is not None:
            self._stop()
            self._stop = self._log = None

    def _follow(self) -> Any:
        """Subscribe to the current controller's outputs (a new controller: a new log, the old cells forgotten)."""
        c = controller(create=False)  # (creating one would start JAX)
        if c is None or c.events is self._log:
            return c
        if self._stop is not None:
            self._stop()
        self._cells = []
        self._log = c.events
        self._stop = c.events.subscribe(self._write, kinds=("output",))
        return c

    def pre_run_cell(self, info=None) -> None:
        c = self._follow()
        runs = c.runs if c is not None else []
        self._mark = (runs[-1].id if runs else -1, _parent_header())

    def post_run_cell(self, result=None) -> None:
        mark, self._mark = self._mark, None
        before = self._log
        c = self._follow()
        if c is None or mark is None:
            return
        after = mark[0] if c.events is before else -1  # made during the cell (`pw.init`): all its runs are the cell's
        runs = c.runs
        if not runs or runs[-1].id <= after:
            return
        self._cells.append((after + 1, runs[-1].id, mark[1]))
        if len(self._cells) > KEEP_CELLS:
            self._cells = self._cells[KEEP_CELLS // 2 :]

    def parent_of(self, run_id: int) -> dict | None:
        """The parent header of the cell that submitted run ``run_id`` (None: unknown, or still running)."""
        cells = self._cells
        k = bisect.bisect_right(cells, run_id, key=_first) - 1
        if k < 0:
            return None
        _, last, parent = cells[k]
        return parent if run_id <= last else None

    def _write(self, out: IslandOutput) -> None:
        """Write ``out``'s lines, marked with the island, into its cell's output (the completing thread)."""
        stream = sys.stderr if out.stream == "stderr" else sys.stdout
        parent = self.parent_of(out.run_id)
        if not parent or not hasattr(stream, "set_thread_parent"):
            stream.write(out.marked())
            return
        token = stream.set_thread_parent(parent)
        try:
            stream.write(out.marked())  # (buffered under this parent; ipykernel's IO thread sends it)
        finally:
            stream.reset_thread_parent(token)


def _first(cell: tuple) -> int:
    return cell[0]


def _parent_header() -> dict | None:
    """The header of the Jupyter request the running cell answers (None outside ipykernel)."""
    header = getattr(sys.stdout, "parent_header", None)
    return dict(header) if header else None

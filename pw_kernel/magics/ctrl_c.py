"""Ctrl-C in a cell cancels what that cell submitted, in any loop; and the one wording of what Ctrl-C cancelled.

Nothing is added to the path of a call: before each cell (`pre_run_cell`) the
hook notes the controller, its newest run id and the cell's thread; when the
cell raises KeyboardInterrupt (IPython's custom exception handler, before the
traceback is drawn), it asks the controller which later runs that thread
submitted (`Controller.submitted_by`) and cancels those not final. Runs of
earlier cells, and of other threads, keep running.

Example::

    for batch in batches:          # Ctrl-C here ...
        loss = pipe.step(batch)
    # pw_kernel: Ctrl-C cancelled 150 runs (ids 12-161: 'step'): 0 of 300 nodes had finished; ...
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..runtime import controller
from .custom_exc import ChainedHandler


def ctrl_c_message(runs: Sequence[Any]) -> str:
    """What Ctrl-C did to ``runs`` (cancelled by it), in one line: every Ctrl-C of the notebook says it so.

    Example::

        ctrl_c_message([run])
        # "pw_kernel: Ctrl-C cancelled run 7 ('step'): 2 of 8 nodes had finished; 5 not yet dispatched
        #  were dropped; 1 on the devices finish first."
    """
    if len(runs) == 1:
        what = f"run {runs[0].id} ({runs[0].name!r})"
    else:
        what = f"{len(runs)} runs (ids {_ids(runs)}: {_names(runs)})"
    done = sum(r.nodes_done for r in runs)
    total = sum(r.nodes_total for r in runs)
    dropped = sum(r.nodes_total - r.nodes_dispatched for r in runs)
    running = sum(r.nodes_on_devices for r in runs)  # XLA runs what it was given: at most Config.run_ahead_s
    still = f"; {running} on the devices finish first" if running > 0 else ""
    return (
        f"pw_kernel: Ctrl-C cancelled {what}: {done} of {total} nodes had finished; {dropped} not yet "
        f"dispatched were dropped{still}."
    )


def _ids(runs: Sequence[Any], most: int = 4) -> str:
    """``3-40, 42, 45-60``: the runs' ids as ranges (the first ``most`` of them)."""
    spans: list[list[int]] = []
    for i in sorted(r.id for r in runs):
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans[:most])
    return text + (", ..." if len(spans) > most else "")


def _names(runs: Sequence[Any], most: int = 3) -> str:
    names = list(dict.fromkeys(r.name for r in runs))
    return ", ".join(repr(n) for n in names[:most]) + (", ..." if len(names) > most else "")


class CellInterrupts:
    """The hooks that make Ctrl-C cancel the interrupted cell's runs.

    `pre_run_cell` notes where the cell starts. A KeyboardInterrupt the cell raises reaches IPython's
    custom exception handler (`set_custom_exc`, chained to one already set): it cancels the cell's
    runs and says so before the traceback is drawn (which can take seconds through JAX's frames),
    then shows it with the user's frames only, as `--block` does. `post_run_cell` cancels them if
    another handler took the interrupt instead (one set later, say).
    """

    def __init__(self, shell: Any, present: Callable[[BaseException], BaseException] = lambda e: e):
        self.shell = shell
        self.present = present  # readies an error for the notebook (`Presenter.presentable`)
        # Before the cell: (its controller, weakly, or None; that controller's newest run id; the cell's thread).
        self._mark: tuple[weakref.ReferenceType | None, int, threading.Thread] | None = None
        self._hook = ChainedHandler(shell, (KeyboardInterrupt,), self._custom_tb)

    def register(self) -> None:
        shell = self.shell
        shell.events.register("pre_run_cell", self.pre_run_cell)
        shell.events.register("post_run_cell", self.post_run_cell)
        self._hook.register()

    def unregister(self) -> None:
        shell = self.shell
        for event, hook in (("pre_run_cell", self.pre_run_cell), ("post_run_cell", self.post_run_cell)):
            try:
                shell.events.unregister(event, hook)
            except ValueError:
                pass
        self._hook.unregister()

    def pre_run_cell(self, info=None) -> None:
        c = controller(create=False)  # (creating one would start JAX)
        runs = c.runs if c is not None else []
        newest = runs[-1].id if runs else -1
        self._mark = (weakref.ref(c) if c is not None else None, newest, threading.current_thread())

    def post_run_cell(self, result=None) -> None:
        if isinstance(getattr(result, "error_in_exec", None), KeyboardInterrupt):
            self.interrupted()
        self._mark = None

    def interrupted(self) -> bool:
        """The cell was interrupted: cancel its runs not final yet and say so (once per cell); True if any."""
        mark, self._mark = self._mark, None
        if mark is None:
            return False
        try:
            cancelled = self.cancel_since(*mark)
        except Exception:  # cancelling must never break the user's cell
            return False
        if cancelled:
            print(ctrl_c_message(cancelled), file=sys.stderr, flush=True)
        return bool(cancelled)

    def _custom_tb(self, shell, etype, value, tb, tb_offset=None):
        """IPython's handler for a KeyboardInterrupt (`ChainedHandler`): cancel the cell's runs, then show it."""
        try:
            if self.interrupted():  # as `--block` shows it; other interrupts keep IPython's whole traceback
                value = self.present(value)
        finally:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None

    @staticmethod
    def cancel_since(ref: weakref.ReferenceType | None, after: int, thread: threading.Thread) -> list[Any]:
        """Cancel the runs ``thread`` submitted after run ``after`` of controller ``ref``; returns those cancelled."""
        c = controller(create=False)
        if c is None:
            return []
        if ref is None or ref() is not c:  # made during the cell (`pw.init`): all its runs are newer
            after = -1
        runs = c.submitted_by(thread, after)
        cancelled = []
        with c.lock:  # newest first, all at once: no queued run of the cell starts while the others are cancelled
            for r in reversed(runs):
                try:
                    if r.cancel():
                        cancelled.append(r)
                except Exception:  # (one run the controller refuses to cancel leaves the others to cancel)
                    continue
        return cancelled[::-1]

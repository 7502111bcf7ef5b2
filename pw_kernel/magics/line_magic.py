"""`%pathways COMMAND [RUN]`: look at and steer the controller (status, devices, timeline, graph, wait, cancel, story,
reset) and this kernel's link to a Pathways service (connect, clients, disconnect).

Each command is the plain Python in `LINE_DOC`, with a view that is a live
widget in a kernel and a text/HTML view elsewhere.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError

from ..runtime import Future, PathwaysError, Program, ProgramGraph, Run, controller
from ..train import checkpoint_lines
from ..widgets import (
    clients_view, devices_view, graph_view, message_view, run_view, status_view, story_view, timeline_view,
)
from .live import Progress, in_kernel, wait_for, widgets_here
from .reporting import FailureReporter
from .tracebacks import Presenter

LINE_DOC = """Inspect and control the controller: ``%pathways COMMAND [RUN]``.

Commands, and the Python each one is::

    %pathways status        print(pw.controller().status())        # islands, slices, runs
    %pathways devices       pw.islands(); pw.devices()              # devices and their slices
    %pathways timeline      pw.controller().events.query()          # every node event so far
    %pathways graph NAME    pw.controller().runs[...].graph         # a run's (or a pw.Program's) graph
    %pathways wait [RUN]    pw.controller().run(RUN).wait()         # all unfinished runs without RUN
    %pathways cancel RUN    pw.controller().run(RUN).cancel()
    %pathways story RUN     print(pw.controller().run(RUN).story())   # its transitions and their causes
    %pathways reset         pw.controller().cancel_all(); [s.release() for s in slices]
    %pathways connect [FILE] pw.connect(FILE)                      # become a client of the service
    %pathways clients       pw.clients()                            # its clients: weight, device time, runs
    %pathways disconnect    pw.disconnect()

RUN is a run id, a run name (``--name`` of a cell, ``In[5]`` by default), or a
variable holding a Run (``--out``) or a Future. Ctrl-C during ``wait`` cancels
what it waits for. FILE is a service's connection file (default: this user's
local service, as ``python -m pw_kernel serve`` writes it); for a name or a
weight, call ``pw.connect(name=..., weight=...)``.
"""

COMMANDS = (
    "status", "devices", "timeline", "graph", "wait", "cancel", "story", "reset", "connect", "clients", "disconnect",
)


class LineCommands:
    """The `%pathways` commands in ``shell``: errors through ``presenter``; what ``wait`` raised is reported."""

    def __init__(self, shell: Any, presenter: Presenter, reporter: FailureReporter):
        self.shell = shell
        self.presenter = presenter
        self.reporter = reporter

    def run(self, command: str, target: str | None):
        """Run ``command`` (one of `COMMANDS`) on ``target`` (a run, or for ``graph`` a program); returns its view."""
        return getattr(self, command)(target)

    def status(self, target):
        c = controller()
        return status_view(c.status(), list(c.runs), checkpoint_lines())

    def devices(self, target):
        c = controller()
        if widgets_here(self.shell):
            from ..widgets import show_mesh

            return show_mesh(c)
        return devices_view(list(c.islands), list(c.status().slices))

    def timeline(self, target):
        c = controller()
        runs = self.find_runs(target, "timeline") if target is not None else None
        if widgets_here(self.shell):
            from ..widgets import timeline

            return timeline(runs)
        if runs is not None:
            return timeline_view([e for r in runs for e in r.events], title=f"runs {[r.id for r in runs]}", runs=runs)
        return timeline_view(list(c.events.nodes), title="all runs", runs=list(c.runs))

    def graph(self, target):
        if target is None:
            raise UsageError("`%pathways graph NAME`: name a run (id or name) or a variable holding a pw.Program.")
        value = self.shell.user_ns.get(target)
        if isinstance(value, ProgramGraph):
            return self._graph(value)
        if isinstance(value, Program):
            graphs = value.graphs
            if not graphs:
                raise UsageError(
                    f"`%pathways graph {target}`: program {value.name!r} has not been traced yet. Call it (or "
                    f"`{target}.trace(*args)`) first."
                )
            return self._graph(graphs[-1])
        run = self.find_runs(target, "graph")[-1]
        return self._graph(run.graph)

    def _graph(self, graph):
        # In a notebook the graph shows itself (SVG via graphviz `dot`); elsewhere, a text/HTML view.
        return graph if widgets_here(self.shell) else graph_view(graph)

    def wait(self, target):
        c = controller()
        runs = self.find_runs(target, "wait") if target is not None else [r for r in c.runs if not r.done()]
        if not runs:
            return message_view("pw_kernel: no unfinished runs to wait for.")
        progress = Progress(in_kernel(self.shell), condense=self.presenter.condense)
        wait_for(runs, None, "%pathways wait", progress, self.presenter.presentable)
        failed = [r for r in runs if r.state == "failed"]
        if len(runs) > 1:
            view = status_view(c.status(), list(c.runs), checkpoint_lines())
        else:
            view = run_view(runs[0], condense=self.presenter.condense)
        if failed:
            from IPython.display import display as ipy_display

            ipy_display(view)
            self.reporter.mark_reported(failed[0])
            raise self.presenter.presentable(failed[0].error)
        return view

    def cancel(self, target):
        if target is None:
            raise UsageError("`%pathways cancel RUN`: name the run (id or name); `%pathways reset` cancels everything.")
        runs = self.find_runs(target, "cancel")
        cancelled = [r for r in runs if r.cancel()]
        if not cancelled:
            states = ", ".join(f"run {r.id} is {r.state}" for r in runs)
            return message_view(f"pw_kernel: nothing to cancel ({states}).")
        done = "; ".join(
            f"run {r.id} ({r.name!r}) cancelled at {r.nodes_done}/{r.nodes_total} nodes" for r in cancelled
        )
        return message_view(f"pw_kernel: {done}.")

    def story(self, target):
        if target is None:
            raise UsageError("`%pathways story RUN`: name the run (id or name, or a variable holding a Run or Future).")
        return story_view(self.find_runs(target, "story")[-1].story())

    def reset(self, target):
        if target is not None:
            raise UsageError("`%pathways reset` takes no argument: it cancels every run and releases every slice.")
        c = controller()
        n = c.cancel_all()
        slices = list(c.status().slices)
        for s in slices:
            s.release()
        names = ", ".join(repr(s.name) for s in slices) or "none"
        return message_view(
            f"pw_kernel: cancelled {n} runs and released {len(slices)} slices ({names}). "
            f"Create slices and compiled functions again with `pw.slice(...)` and `pw.compiled(...)`."
        )

    def connect(self, target):
        from ..service import connect

        try:
            conn = connect(target)
        except PathwaysError as e:
            raise UsageError(f"`%pathways connect{' ' + target if target else ''}`: {e}") from None
        return message_view(f"pw_kernel: {conn!r}. `pw.slice(n)` now places slices on the service's devices.")

    def clients(self, target):
        from ..service.session import clients  # (`service.clients` is also a module's name)

        if target is not None:
            raise UsageError("`%pathways clients` takes no argument.")
        try:
            rows = clients()
        except PathwaysError as e:
            raise UsageError(f"`%pathways clients`: {e}") from None
        return clients_view(rows)

    def disconnect(self, target):
        from ..service import disconnect

        if target is not None:
            raise UsageError("`%pathways disconnect` takes no argument.")
        was = disconnect()
        return message_view(
            "pw_kernel: disconnected; slices go to this kernel's devices again." if was
            else "pw_kernel: not connected to a service."
        )

    def find_runs(self, target: str, cmd: str) -> list[Any]:
        """The runs ``target`` names: a variable holding a Run or Future, a run id, or a run's name (the latest)."""
        c = controller()
        value = self.shell.user_ns.get(target)
        if isinstance(value, Run):
            return [value]
        if isinstance(value, Future):
            return [value.run]
        if target.lstrip("-").isdigit():
            try:
                return [c.run(int(target))]
            except PathwaysError as e:
                raise UsageError(f"`%pathways {cmd} {target}`: {e}") from None
        runs = [r for r in c.runs if r.name == target or r.graph.name == target]
        if not runs:
            recent = ", ".join(f"{r.id} ({r.name!r})" for r in c.runs[-8:]) or "none yet"
            raise UsageError(
                f"`%pathways {cmd} {target}`: no run named {target!r} and no variable holding a Run or Future. "
                f"Recent runs: {recent}."
            )
        if cmd == "cancel":
            return [r for r in runs if not r.done()] or runs[-1:]
        return runs[-1:]

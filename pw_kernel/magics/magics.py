"""The magics IPython registers: `%%pathways` (a cell as a program) and `%pathways` (commands).

Only the entry points and their options live here; the cell magic is
`cell_magic.CellMagic`, the commands `line_magic.LineCommands`, live displays
and blocking waits `live`, error presentation `tracebacks.Presenter`.
"""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, output_can_be_silenced
from IPython.core.magic_arguments import argument, kwds, magic_arguments, parse_argstring

from .cell_magic import CELL_DOC, CellMagic
from .ctrl_c import CellInterrupts
from .island_output import IslandOutputRouter
from .line_magic import COMMANDS, LINE_DOC, LineCommands
from .live import LiveDisplays
from .reporting import FailureReporter
from .tracebacks import Presenter


@magics_class
class PathwaysMagics(Magics):
    """`%%pathways` (a cell as a program) and `%pathways` (status, devices, timeline, graph, wait, cancel, reset)."""

    def __init__(self, shell):
        super().__init__(shell)
        self.presenter = Presenter(shell)
        self.reporter = FailureReporter(shell, condense=self.presenter.condense)
        self.live = LiveDisplays()
        self.cells = CellMagic(shell, self.presenter, self.reporter, self.live)
        self.commands = LineCommands(shell, self.presenter, self.reporter)
        # Ctrl-C in any cell cancels the runs that cell submitted (and shows only the user's frames).
        self.interrupts = CellInterrupts(shell, self.presenter.presentable)
        # What stages print on remote islands shows in the cell that submitted their run.
        self.island_output = IslandOutputRouter(shell)

    def close(self) -> None:
        self.live.close()

    @magic_arguments(name="%pathways")
    @kwds(description=CELL_DOC)
    @argument("--name", metavar="NAME", help="name of the program and its run (default: In[N])")
    @argument("--slice", metavar="NAME", help="slice (name or variable) for glue ops that read no device value")
    @argument("--block", action="store_true", help="wait for the run; bind arrays instead of futures")
    @argument("--timeout", type=float, metavar="S", help="with --block: give up waiting after S seconds")
    @argument("--graph", action="store_true", help="show the program graph")
    @argument("--timeline", action="store_true", help="show this run on a timeline")
    @argument("--out", metavar="VAR", help="bind the Run to VAR")
    @argument("--mode", choices=("fused", "chained", "auto"), help="execution mode (default: auto)")
    @argument("--tenant", metavar="NAME", help="tenant for multi-tenant scheduling (default: 'default')")
    @output_can_be_silenced
    @cell_magic("pathways")
    def pathways_cell(self, line: str, cell: str):
        args = _parse(self.pathways_cell, line, "%%pathways")
        return self.cells.run(args, line, cell)

    @magic_arguments(name="pathways")
    @kwds(description=LINE_DOC)
    @argument("command", choices=COMMANDS, help="what to do")
    @argument("target", nargs="?", metavar="RUN", help="run id or name (graph: a run or a pw.Program variable)")
    @line_magic("pathways")
    def pathways_line(self, line: str):
        args = _parse(self.pathways_line, line, "%pathways")
        return self.commands.run(args.command, args.target)


def _parse(fn, line: str, magic: str):
    """``line`` parsed by ``fn``'s options; a mistake is a `UsageError` with the usage and where to read more."""
    try:
        return parse_argstring(fn, line)
    except UsageError as e:
        usage = " ".join(fn.parser.format_usage().replace("::", "").split())
        raise UsageError(f"`{magic} {line.strip()}`: {e}\nUsage: {usage}\nSee `{magic}?` for details.") from None

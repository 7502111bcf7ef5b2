"""Errors that point at the user's cells: ``Cell In[N]`` for a cell's file, and only the user's frames.

A `%%pathways` cell is compiled under IPython's temporary filename for it;
errors raised while tracing, on a device later, or by ``fut.result()`` in
another cell all name that file. The `Presenter` reads it as ``Cell In[N]``
and gives an error a traceback of the user's frames only (no runtime, JAX or
library frames), chosen when IPython displays it.

Example::

    presenter = Presenter(shell)
    raise presenter.presentable(err)     # shows "Cell In[5], line 3" and the user's frames
"""

from __future__ import annotations

import functools
import linecache
import re
import sys
import types
from collections.abc import Callable
from typing import Any

from ..runtime import PathwaysError
from ..runtime.extend import is_library, set_file_labels
from .custom_exc import ChainedHandler

_FRAME = re.compile(r'^(\s*)File "([^"]+)", line (\d+), in (.+)$')


def condense_frames(
    text: str, keep: Callable[[str], bool], label: Callable[[str], str | None] = lambda filename: None
) -> str:
    """Drop the frames of quoted tracebacks (``File "...", line N, in f``) whose file ``keep`` rejects.

    Errors raised on a device (e.g. in a `jax.pure_callback`) quote the whole host
    traceback in their message; the user's own frames are what they can act on.
    ``label`` renames files (a cell's temporary file -> ``Cell In[N]``).
    """
    out: list[str] = []
    hidden = 0
    dropping_indent: int | None = None
    for line in text.splitlines():
        m = _FRAME.match(line)
        if m is None and dropping_indent is not None and len(line) - len(line.lstrip()) > dropping_indent:
            continue  # the source line (and ^^^ markers) of a dropped frame
        dropping_indent = None
        if m is not None:
            indent, filename, lineno, func = m.groups()
            if not keep(filename):
                hidden += 1
                dropping_indent = len(indent)
                continue
            name = label(filename)
            if name is not None:
                line = f"{indent}{name}, line {lineno}, in {func}"
        out.append(line)
    text = "\n".join(out)
    if hidden:
        note = f"Traceback ({hidden} frames of Python, JAX and pw_kernel hidden; most recent call last):"
        text = text.replace("Traceback (most recent call last):", note)
    return text


def error_headline(text: str) -> str:
    """The first line of an error, with a quoted traceback's own last line (its exception) as the cause.

    Example::

        error_headline("NodeError: node 'f' failed: a host callback raised: Traceback (...):\n  ...\nValueError: x")
        # "NodeError: node 'f' failed: ValueError: x"
    """
    lines = text.splitlines()
    head = lines[0] if lines else ""
    cause = next((line for line in reversed(lines[1:]) if line and not line[0].isspace()), None)
    m = re.match(r"(.*?failed: )(?:a host callback raised: )?Traceback \(", head)
    if m is not None and cause is not None:
        return m.group(1) + cause
    return head


class Presenter:
    """The cells this magic compiled (filename -> ``In[N]``), and errors shown as pointing at them."""

    def __init__(self, shell: Any):
        self.shell = shell
        self._cell_files: dict[str, int] = {}  # filenames this magic compiled -> execution count
        self._hook = ChainedHandler(shell, (PathwaysError,), self._show)

    def register(self) -> None:
        """Any cell's pw_kernel error points at the user's cells, not only a `%%pathways` cell's.

        The runtime's messages name a cell's file ``Cell In[N]`` (`set_file_labels`), and a
        `PathwaysError` raised in a plain cell (a `pw.compiled` call, a pipeline's step) is
        shown with the user's frames only, through IPython's custom exception handler.
        """
        set_file_labels(self.cell_label)
        self._hook.register()

    def unregister(self) -> None:
        set_file_labels(None)
        self._hook.unregister()

    def _show(self, shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> None:
        """IPython's handler for a `PathwaysError` (`ChainedHandler`): show it as `presentable` makes it."""
        shell.showtraceback((etype, self.presentable(value), tb), tb_offset=tb_offset)

    def add_cell_file(self, filename: str, number: int) -> None:
        """``filename`` holds the code of cell ``In[number]``."""
        self._cell_files[filename] = number

    def cell_number(self) -> int:
        """The execution count of the cell being run (its ``In[N]``)."""
        files = getattr(self.shell.compile, "_filename_map", {})
        frame = sys._getframe(1)
        while frame is not None:  # the frame running the cell's code: IPython compiled it under In[N]'s name
            n = files.get(frame.f_code.co_filename)
            if n is not None:
                return n
            frame = frame.f_back
        # Called from Python (`ip.run_cell_magic`): IPython >= 9 counts the cell before running it.
        import IPython

        return self.shell.execution_count - (1 if IPython.version_info >= (9,) else 0)

    def cell_label(self, filename: str) -> str | None:
        n = self._cell_files.get(filename)
        if n is None:
            n = getattr(self.shell.compile, "_filename_map", {}).get(filename)
        return None if n is None else f"Cell In[{n}]"

    def where(self, filename: str, line: int) -> str:
        """``Cell In[N], line L: <the line's text>``."""
        label = self.cell_label(filename) or filename
        text = linecache.getline(filename, line).strip()
        return f"{label}, line {line}" + (f": {text}" if text else "")

    def condense(self, text: str) -> str:
        """``text`` with quoted tracebacks cut to the user's frames and cells read as ``Cell In[N]``."""
        return self.relabel(condense_frames(text, self.is_user_file, self.cell_label))

    def relabel(self, text: str) -> str:
        """``text`` with every cell's temporary filename read as ``Cell In[N]`` (frames and "at ..." lines)."""
        files = {**getattr(self.shell.compile, "_filename_map", {}), **self._cell_files}
        for fname in files:
            if fname in text:
                text = text.replace(fname, self.cell_label(fname) or fname)
        return text

    def headline(self, text: str) -> str:
        """An error in one line, for a view shown above the same error's traceback."""
        return error_headline(self.condense(text)) + " (the traceback is below)"

    def source_map(self, graph) -> dict[str, str]:
        """Node name -> the cell line it came from."""
        return {n.name: self.where(*n.source) for n in graph.nodes if n.source is not None}

    def fused_source_map(self, graph, filename: str, number: int) -> dict[str, str]:
        """A fused run is one executable (step ``NAME[fused]``): its failure can only point at the cell's lines."""
        lines = sorted({n.source[1] for n in graph.nodes if n.source is not None and n.source[0] == filename})
        span = f"line {lines[0]}" if len(lines) == 1 else f"lines {lines[0]}-{lines[-1]}" if lines else "the cell"
        where = f"Cell In[{number}], {span} (fused into one executable; `--mode chained` shows the failing line)"
        return {f"{graph.name}[fused]": where}

    def is_user_file(self, filename: str) -> bool:
        if self.cell_label(filename) is not None:
            return True
        if filename.startswith("<"):
            return False
        return not is_library(filename) and "/IPython/" not in filename

    def presentable(self, err: BaseException, relabel: bool = True) -> BaseException:
        """``err`` for the notebook: cell filenames read ``Cell In[N]``; its traceback shows only user frames.

        The traceback is chosen when IPython displays the error, so a run's error
        raised later by ``fut.result()`` shows that cell's line, not the runtime's.
        """
        if relabel and err.args and isinstance(err.args[0], str):
            err.args = (self.relabel(err.args[0]), *err.args[1:])
        if getattr(err, "_render_traceback_", None) is None:  # IPython's protocol for a custom traceback
            err._render_traceback_ = functools.partial(
                _render_user_traceback, self.shell, err, self.is_user_file, self.condense
            )
        return err



def _render_user_traceback(shell, err: BaseException, is_user, condense) -> list[str]:
    """IPython's rendering of ``err`` with only the user's frames and no chained runtime exceptions."""
    tb = _user_traceback(err, is_user)
    saved = (err.args, err.__cause__, err.__context__, err.__suppress_context__)
    try:
        if err.args and isinstance(err.args[0], str):
            err.args = (condense(err.args[0]), *err.args[1:])
        if tb is None:  # nothing of the user's to show: the message says where (`at Cell In[N], line L`)
            return [f"{type(err).__name__}: {err}" if str(err) else type(err).__name__]
        err.__cause__ = err.__context__ = None
        err.__suppress_context__ = True
        return shell.InteractiveTB.structured_traceback(type(err), err, tb, tb_offset=0)
    finally:
        err.args, err.__cause__, err.__context__, err.__suppress_context__ = saved


def _user_traceback(err: BaseException, is_user) -> types.TracebackType | None:
    """A traceback of only the user's frames: ``err``'s (the user's call), then those of the exceptions it
    chains to, outermost first (the user's function it failed in), each frame once."""
    best: list[types.TracebackType] = []
    frames: set[int] = set()
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            nxt = tb.tb_next
            calls_magic = nxt is not None and nxt.tb_frame.f_code.co_name in ("run_cell_magic", "run_line_magic")
            # (a magic's own line says nothing; a frame both exceptions passed through shows once)
            if is_user(tb.tb_frame.f_code.co_filename) and not calls_magic and id(tb.tb_frame) not in frames:
                frames.add(id(tb.tb_frame))
                best.append(tb)
            tb = nxt
        e = e.__cause__ if e.__cause__ is not None else e.__context__
    new = None
    for t in reversed(best):
        new = types.TracebackType(new, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return new

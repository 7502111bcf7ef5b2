"""The notebook front's errors and warnings: a cell that cannot become a program, a setup that limits pw_kernel.

`CellError` is a `PathwaysError` like every error pw_kernel raises on purpose;
the magic shows it as IPython's `UsageError` (no traceback), naming the cell line.
"""

from __future__ import annotations

from ..runtime import PathwaysError


class CellError(PathwaysError):
    """A cell that cannot become a program (``return`` at cell level, ``global``, ``import *``); ``line`` says where."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


class Uncacheable(Exception):
    """A value a cell reads whose changes a trace's key cannot see: the cell is traced every time (not an error to show)."""


class PathwaysWarning(UserWarning):
    """Something about the notebook setup that limits what pw_kernel can do."""


__all__ = ["CellError", "PathwaysWarning"]

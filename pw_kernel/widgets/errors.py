"""Errors of the views: subclasses of the runtime's `PathwaysError`."""

from __future__ import annotations

from ..runtime import PathwaysError


class GraphvizError(PathwaysError):
    """graphviz's ``dot`` is missing or failed; ``.dot`` holds the DOT source."""

    def __init__(self, message: str, dot: str):
        super().__init__(message)
        self.dot = dot


__all__ = ["GraphvizError"]

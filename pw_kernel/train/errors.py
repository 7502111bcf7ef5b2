"""Errors of the training layer: subclasses of the runtime's `PathwaysError`."""

from __future__ import annotations

from ..runtime import PathwaysError


class PipelineError(PathwaysError, ValueError):
    """A pipeline that cannot be built as asked (schedule, shapes, placement)."""


__all__ = ["PipelineError"]

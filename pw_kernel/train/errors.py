"""Errors of the training layer: subclasses of the runtime's `PathwaysError`."""

from __future__ import annotations

from ..runtime import PathwaysError


class PipelineError(PathwaysError, ValueError):
    """A pipeline that cannot be built as asked (schedule, shapes, placement)."""


class CheckpointError(PathwaysError, RuntimeError):
    """A checkpoint that cannot be written or read as asked (no such step, shapes that differ, a failed save)."""


class PrefetchError(PathwaysError, RuntimeError):
    """A `pw.prefetch` batch that could not be read or placed (the source raised, a shape that does not split)."""


__all__ = ["CheckpointError", "PipelineError", "PrefetchError"]

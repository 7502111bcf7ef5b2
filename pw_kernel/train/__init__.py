"""The training layer: model training built on the runtime's public face only.

It owns pipelines and checkpoints (`pw.pipeline`: stages on slices, microbatches streamed
through them as one program per training step, with the GPipe, 1F1B,
interleaved and zero-bubble schedules, their ideal replay and measured
statistics). It holds no run state of its own: a training step is a program
the controller runs like any other.

One module per concept: `pipeline` (the `Pipeline` users call and the
`pipeline` factory that checks its arguments), `stages` (each stage's compiled
forward and backward nodes), `state` (`PipelineState` and placing params and
optimizer state on the slices), `step` (the traced training step: schedule
order, accumulation, shared-gradient sums, clipping, optimizer update),
`schedules` (op orders and their ideal replay), `stats` (`PipelineStats` of a
finished step), `checkpoint` (`CheckpointManager`: asynchronous saves from
futures, orbax underneath), `restore` (reading back onto any slice layout),
`elastic` (`elastic_retry`: training again on what is left after a lost
island), `prefetch` (`pw.prefetch`: batches loaded on a thread and placed
ahead of the step, checkpointable; input nodes inside traced programs),
`metrics` (`pw.log`: scalars from futures, recorded as they resolve, never blocking),
`targets` (where a batch goes: a slice's data axis, a sharding, a pipeline's
stages) and `errors`. For the notebook front (`pw_kernel.magics`), which uses
this face only: `checkpoint_lines` (``%pathways status``) and
`take_failed_saves` (failed saves reported after a cell).

Example::

    from pw_kernel.train import pipeline
    pipe = pipeline([stage0, stage1], slices=[a, b], microbatches=8, schedule="1f1b")
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from ..runtime import VirtualSlice, controller
from .checkpoint import CheckpointManager, checkpoint_lines, take_failed_saves
from .elastic import elastic_retry
from .errors import CheckpointError, PipelineError, PrefetchError
from .pipeline import Pipeline
from .pipeline import pipeline as _pipeline
from .metrics import MetricsLog, Scalar, log
from .prefetch import PrefetchIterator, prefetch
from .schedules import SCHEDULES, Replay, Schedule, replay, schedule_ops, theory_bubble
from .state import PipelineState
from .stats import PipelineStats, SliceStats


@functools.wraps(_pipeline)
def pipeline(stages: Sequence[Callable], slices: Sequence[VirtualSlice], microbatches: int, *args, **kwargs) -> Pipeline:
    return _pipeline(stages, slices, microbatches, *args, controller=controller, **kwargs)


__all__ = [
    "SCHEDULES",
    "CheckpointError",
    "CheckpointManager",
    "Pipeline",
    "PipelineError",
    "PipelineState",
    "PipelineStats",
    "PrefetchError",
    "PrefetchIterator",
    "MetricsLog",
    "Scalar",
    "Replay",
    "Schedule",
    "SliceStats",
    "elastic_retry",
    "log",
    "pipeline",
    "prefetch",
    "replay",
    "schedule_ops",
    "theory_bubble",
    # for the notebook front: checkpoints in `%pathways status`, failed saves reported after a cell
    "checkpoint_lines",
    "take_failed_saves",
]

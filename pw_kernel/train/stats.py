"""PipelineStats: what a finished pipelined step did, per slice, next to what its schedule promises.

From the run's node events: each slice's bubble (1 - its forward/backward busy
time over the step's span) and the most microbatches it held at once (forward
ended, last backward op not yet). From the schedule: the paper's bubble and
the same ops replayed on ideal devices. From the plan: the memory the run
reserved per slice, which is where ``remat=False`` shows.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from .errors import PipelineError
from .schedules import Replay, replay, theory_bubble

_OP = re.compile(r"^([FBW])(\d+)(?::\d+)?$")


@dataclasses.dataclass(frozen=True)
class SliceStats:
    """One slice of a pipelined step: measured and ideal."""

    slice: str
    stages: tuple[int, ...]  # the (virtual) stages it runs
    bubble: float  # measured: 1 - busy / span
    ideal_bubble: float  # the schedule replayed on ideal devices
    live: int  # measured: most microbatch-stage inputs held at once
    ideal_live: int
    live_bytes: int  # live x what one microbatch-stage keeps for its backward
    reserved_bytes: int  # the run's memory estimate on each device of the slice
    busy_ns: int


@dataclasses.dataclass(frozen=True)
class PipelineStats:
    """Bubble, live activations and the ideal-device replay of one pipelined step, per slice.

    Example::

        run = pipe.submit_step(state, x, y).wait()
        st = pipe.stats(run)
        st.bubble, st.theory, st.ideal.mean_bubble
        st.rows()          # one dict per slice, for a table
    """

    pipeline: str
    schedule: str
    stages: int  # slices S
    chunks: int  # model chunks per slice (interleaved)
    microbatches: int
    remat: bool
    span_ns: int  # first forward start to last backward end
    theory: float  # the paper's bubble formula
    ideal: Replay
    slices: tuple[SliceStats, ...]
    run: Any = dataclasses.field(default=None, repr=False, compare=False)  # the Run it was read from

    @property
    def bubble(self) -> float:
        """Measured bubble, the mean over slices."""
        return sum(s.bubble for s in self.slices) / len(self.slices)

    def rows(self) -> list[dict[str, Any]]:
        """One plain dict per slice (for a table or a DataFrame)."""
        return [dataclasses.asdict(s) for s in self.slices]

    def __repr__(self) -> str:
        return (
            f"PipelineStats({self.pipeline!r}, {self.schedule}, S={self.stages}, M={self.microbatches}"
            f"{f', v={self.chunks}' if self.chunks > 1 else ''}: bubble {self.bubble:.3f} measured, "
            f"{self.ideal.mean_bubble:.3f} ideal, {self.theory:.3f} theory; live {[s.live for s in self.slices]})"
        )


def pipeline_stats(pipe: Any, run: Any) -> PipelineStats:
    """The PipelineStats of ``run``, a finished step (or grads) run of ``pipe`` in chained mode."""
    if not run.done():
        raise PipelineError(f"`{pipe.name}.stats(run)`: run {run.id} is {run.state}; wait for it first (`run.wait()`).")
    if run.mode == "fused":
        raise PipelineError(
            f"`{pipe.name}.stats(run)`: run {run.id} ran fused, as one executable, so it has no per-stage events. "
            f"Submit it chained: `pipe.submit_step(state, x, y, mode='chained')`."
        )
    S = pipe.S
    last_op = "W" if pipe.split_backward else "B"
    evs = []
    for e in run.events:
        m = _OP.match(e.node) if e.kind == "compute" else None
        if m:
            evs.append((m.group(1), int(m.group(2)), e))
    if not evs:
        raise PipelineError(f"`{pipe.name}.stats(run)`: run {run.id} ({run.name!r}) has no forward or backward nodes of this pipeline.")
    t0 = min(e.start for _, _, e in evs)
    t1 = max(e.end for _, _, e in evs)
    span = max(1, t1 - t0)
    ideal = replay(pipe.ops, S, forward=1.0 / pipe.chunks, backward=2.0 / pipe.chunks)
    theory = theory_bubble(pipe.schedule, S, pipe.M, pipe.chunks)
    reserved = run.plan.peak_bytes
    out = []
    for d in range(S):
        mine = [(k, j, e) for k, j, e in evs if j % S == d]
        busy = sum(e.end - e.start for _, _, e in mine)
        live = peak = 0
        for _, _, delta in sorted((e.end, e.seq, 1 if k == "F" else -1) for k, _, e in mine if k in ("F", last_op)):
            live += delta
            peak = max(peak, live)
        stages = tuple(st.index for st in pipe.stages if st.index % S == d)
        sl = pipe.stages[d].slice
        out.append(
            SliceStats(
                slice=sl.name,
                stages=stages,
                bubble=1 - busy / span,
                ideal_bubble=ideal.bubble[d],
                live=peak,
                ideal_live=ideal.live[d],
                live_bytes=peak * max(pipe.stages[j].stored_bytes for j in stages),
                reserved_bytes=max((reserved.get(dev.id, 0) for dev in sl.devices), default=0),
                busy_ns=busy,
            )
        )
    return PipelineStats(
        pipeline=pipe.name,
        schedule=pipe.schedule,
        stages=S,
        chunks=pipe.chunks,
        microbatches=pipe.M,
        remat=pipe.remat,
        span_ns=span,
        theory=theory,
        ideal=ideal,
        slices=tuple(out),
        run=run,
    )

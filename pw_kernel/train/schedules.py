"""Pipeline schedules: the order of forward and backward ops, and their replay on ideal devices.

An op is ``(kind, stage, microbatch)``:

- ``"F"``: the forward of a stage on a microbatch;
- ``"B"``: its backward, both gradients (for the input and for the weights),
  except under ``"zero_bubble"`` where it is the input gradient only;
- ``"W"``: under ``"zero_bubble"``, the weight gradient, which nothing
  downstream waits for, so it can fill what would otherwise be bubbles.

``stage`` is a *virtual* stage: with ``chunks=v`` (interleaved), there are
``S * v`` of them and virtual stage ``j`` runs on slice ``j % S``.

Every schedule is built per slice (the order that slice's device runs its ops,
as its paper gives it), then merged into one global order that respects the
dataflow: the order in which a pipelined step calls its nodes, which is the
order every island receives them.

- GPipe (Huang et al. 2019): all forwards, then all backwards.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021): stage i runs S-i-1 warm-up
  forwards, then alternates one forward and one backward, then drains. With
  fewer microbatches than stages the warm-up is cut to M forwards: GPipe's
  bubble, and no stage keeps more than M inputs.
- Interleaved 1F1B (Narayanan et al. 2021, §2.2): each slice holds v model
  chunks; microbatches go through the chunks in groups of S. The bubble
  shrinks by v.
- ZB-H1 (Qi et al. 2023): 1F1B with the backward split into B and W; stage i
  holds back i weight-gradient ops and runs them in the drain, where 1F1B
  idles. Same activation memory as 1F1B, a third of its bubble when
  F, B and W take equal time.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from .errors import PipelineError

Schedule = Literal["gpipe", "1f1b", "interleaved", "zero_bubble"]
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zero_bubble")
Op = tuple[str, int, int]  # (kind, virtual stage, microbatch)


def check_schedule(kind: str, stages: int, microbatches: int, chunks: int = 1, api: str = "pw.schedule_ops") -> None:
    """Raise PipelineError (naming ``api``) unless ``kind`` can run S stages, M microbatches, v chunks."""
    S, M, v = stages, microbatches, chunks
    if kind not in SCHEDULES:
        raise PipelineError(f"`{api}(schedule=...)` must be one of {', '.join(map(repr, SCHEDULES))}; got {kind!r}.")
    if kind != "interleaved" and v != 1:
        raise PipelineError(
            f"`{api}`: {v} model chunks per slice need schedule='interleaved'; schedule={kind!r} runs one "
            f"stage per slice. Pass as many stages as slices, or use schedule='interleaved'."
        )
    if kind == "zero_bubble" and M < S:
        # stage i holds back i weight-gradient ops for the drain; with M < S there is no steady
        # phase to hold them back from, and the paper's schedule (and bubble) is not defined
        raise PipelineError(
            f"`{api}(schedule='zero_bubble')` needs at least as many microbatches as stages "
            f"(M >= S), got M={M} for S={S}. Use microbatches>={S}, or schedule='1f1b'."
        )
    if kind == "interleaved" and M % S:
        raise PipelineError(
            f"`{api}(schedule='interleaved')` sends microbatches through the chunks in groups of S, so M must "
            f"be a multiple of the number of slices S; got M={M} for S={S}. Use microbatches={S * max(1, M // S)}."
        )


def schedule_ops(kind: Schedule, stages: int, microbatches: int, chunks: int = 1) -> list[Op]:
    """The global order of a schedule's ops (each slice's own order kept), for S slices and M microbatches.

    With ``chunks=v`` (interleaved only) stage numbers are virtual stages, ``0 .. S*v-1``.

    Example::

        >>> schedule_ops("gpipe", 2, 2)
        [('F', 0, 0), ('F', 0, 1), ('F', 1, 0), ('F', 1, 1), ('B', 1, 0), ('B', 0, 0), ('B', 1, 1), ('B', 0, 1)]
    """
    check_schedule(kind, stages, microbatches, chunks)
    S, M, v = stages, microbatches, chunks
    local = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved": _interleaved, "zero_bubble": _zb_h1}[kind](S, M, v)
    return _merge(local, S * v)


def _gpipe(S: int, M: int, v: int) -> list[list[Op]]:
    return [[("F", s, m) for m in range(M)] + [("B", s, m) for m in range(M)] for s in range(S)]


def _one_f_one_b(S: int, M: int, v: int) -> list[list[Op]]:
    local = []
    for s in range(S):
        warm = min(S - s - 1, M)
        ops: list[Op] = [("F", s, m) for m in range(warm)]
        for f in range(warm, M):
            ops += [("F", s, f), ("B", s, f - warm)]
        ops += [("B", s, m) for m in range(M - warm, M)]
        local.append(ops)
    return local


def _interleaved(S: int, M: int, v: int) -> list[list[Op]]:
    """Megatron-LM's interleaved 1F1B: the k-th forward (backward) of a slice picks its chunk and microbatch."""
    group = S * v

    def op(kind: str, d: int, k: int) -> Op:
        chunk = (k % group) // S
        if kind == "B":
            chunk = v - 1 - chunk
        return (kind, chunk * S + d, (k // group) * S + k % S)

    local = []
    total = M * v
    for d in range(S):
        warm = min((S - d - 1) * 2 + (v - 1) * S, total)
        ops = [op("F", d, k) for k in range(warm)]
        for k in range(total - warm):
            ops += [op("F", d, warm + k), op("B", d, k)]
        ops += [op("B", d, k) for k in range(total - warm, total)]
        local.append(ops)
    return local


def _zb_h1(S: int, M: int, v: int) -> list[list[Op]]:
    """ZB-H1: 1F1B whose stage i defers its first i weight-gradient ops to the drain."""
    local = []
    for s in range(S):
        warm = min(S - s - 1, M)
        ops: list[Op] = [("F", s, m) for m in range(warm)]
        f, b, w = warm, 0, 0
        for _ in range(s):  # F, B; W held back
            if f == M:
                break
            ops += [("F", s, f), ("B", s, b)]
            f, b = f + 1, b + 1
        while f < M:
            ops += [("F", s, f), ("B", s, b), ("W", s, w)]
            f, b, w = f + 1, b + 1, w + 1
        while b < M:
            ops += [("B", s, b), ("W", s, w)]
            b, w = b + 1, w + 1
        ops += [("W", s, m) for m in range(w, M)]
        local.append(ops)
    return local


def _merge(local: list[list[Op]], V: int) -> list[Op]:
    """One order of all ops that keeps each slice's order and every dependency (one op per slice per sweep)."""
    done: set[Op] = set()
    cursor = [0] * len(local)
    order: list[Op] = []
    total = sum(len(ops) for ops in local)

    def ready(op: Op) -> bool:
        k, s, m = op
        if k == "F":
            return s == 0 or ("F", s - 1, m) in done
        if k == "W":
            return ("B", s, m) in done
        return ("F", s, m) in done and (s == V - 1 or ("B", s + 1, m) in done)

    while len(order) < total:
        progressed = False
        for d, ops in enumerate(local):  # slices advance together, like ticks
            if cursor[d] < len(ops) and ready(ops[cursor[d]]):
                order.append(ops[cursor[d]])
                cursor[d] += 1
                progressed = True
        done.update(order)
        if not progressed:
            raise AssertionError(f"schedule deadlocked at {cursor}")  # a bug in the lists above
    return order


def theory_bubble(kind: Schedule, stages: int, microbatches: int, chunks: int = 1) -> float:
    """The paper's bubble: the fraction of a step each slice idles, with equal stage times.

    GPipe and 1F1B: (S-1)/(M+S-1). Interleaved with v chunks: (S-1)/(vM+S-1).
    ZB-H1 with F, B and W of equal time: (S-1)/(3M+S-1), a third of 1F1B's bubble time.

    Example::

        >>> theory_bubble("1f1b", 4, 8)
        0.2727272727272727
    """
    check_schedule(kind, stages, microbatches, chunks, api="pw.theory_bubble")
    S, M, v = stages, microbatches, chunks
    if kind == "interleaved":
        return (S - 1) / (v * M + S - 1)
    if kind == "zero_bubble":
        return (S - 1) / (3 * M + S - 1)
    return (S - 1) / (M + S - 1)


@dataclasses.dataclass(frozen=True)
class Replay:
    """A schedule played on ideal devices: every slice runs at once, ops take fixed times, transfers are free.

    ``span`` is the step's length, ``busy[d]`` slice d's compute time, ``bubble[d]``
    its idle fraction; ``live[d]`` the most microbatches whose stage inputs slice d
    keeps at once (forward done, last backward op not yet).
    """

    ops: tuple[Op, ...]
    ends: dict
    span: float
    busy: tuple[float, ...]
    bubble: tuple[float, ...]
    live: tuple[int, ...]

    @property
    def mean_bubble(self) -> float:
        return sum(self.bubble) / len(self.bubble)


def replay(ops: list[Op], slices: int, forward: float = 1.0, backward: float = 2.0, weight: float | None = None) -> Replay:
    """Play ``ops`` (a `schedule_ops` order) on ``slices`` ideal devices.

    A forward takes ``forward``, a full backward ``backward``; when the ops have
    W ops (zero_bubble), B takes ``backward - weight`` and W ``weight``
    (default: half the backward each). Virtual stage j runs on slice j % slices.

    Example::

        >>> r = replay(schedule_ops("1f1b", 4, 8), 4)
        >>> round(r.mean_bubble, 4)
        0.2727
    """
    split = any(k == "W" for k, _, _ in ops)
    w = (backward / 2 if weight is None else weight) if split else 0.0
    cost = {"F": forward, "B": backward - w, "W": w}
    V = 1 + max(s for _, s, _ in ops)
    ends: dict[Op, float] = {}
    free = [0.0] * slices
    busy = [0.0] * slices
    for op in ops:
        k, s, m = op
        if k == "F":
            ready = ends[("F", s - 1, m)] if s > 0 else 0.0
        elif k == "W":
            ready = ends[("B", s, m)]
        else:
            ready = max(ends[("F", s, m)], ends[("B", s + 1, m)] if s < V - 1 else 0.0)
        d = s % slices
        ends[op] = free[d] = max(free[d], ready) + cost[k]
        busy[d] += cost[k]
    span = max(ends.values())
    return Replay(
        ops=tuple(ops),
        ends=ends,
        span=span,
        busy=tuple(busy),
        bubble=tuple(1 - b / span for b in busy),
        live=tuple(peak_live(ops, slices, order=sorted(ops, key=lambda o: ends[o]))),
    )


def peak_live(ops: list[Op], slices: int, order: list[Op] | None = None) -> list[int]:
    """Per slice, the most microbatch-stage inputs held at once in ``order`` (default: ``ops``' own order).

    A stage keeps what its backward needs from its forward until its last backward
    op (W under zero_bubble, else B).
    """
    last = "W" if any(k == "W" for k, _, _ in ops) else "B"
    live = [0] * slices
    peak = [0] * slices
    for k, s, _ in order if order is not None else ops:
        d = s % slices
        if k == "F":
            live[d] += 1
            peak[d] = max(peak[d], live[d])
        elif k == last:
            live[d] -= 1
    return peak

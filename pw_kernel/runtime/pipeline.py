"""Pipelines: stages on slices, microbatches streamed through them, built as one program.

`pw.pipeline(stages, slices=..., microbatches=M, schedule="gpipe" | "1f1b")`
compiles, per stage i on slice i, a forward ``F{i}`` and a backward ``B{i}``
(`jax.vjp` of the stage). The backward recomputes the stage's forward from the
stage input it kept (GPipe's re-materialisation), so the residuals a stage
keeps are its inputs, on its own devices. The last stage's forward includes
the loss. Gradients are accumulated over microbatches inside the backward
nodes, then an optimizer step runs per stage. Activations and gradients
between stages move as explicit transfer nodes.

The schedule is the order in which the traced function calls the nodes, which
is the order every island receives them:
- GPipe: all forwards (microbatch-major), then all backwards.
- 1F1B: stage i runs S-i-1 warm-up forwards, then alternates one forward and
  one backward, then drains; so it keeps at most S microbatches' inputs alive.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .compiled import CompiledFunction
from .devices import VirtualSlice
from .errors import PathwaysError, PipelineError, SpecError
from .program import Program

Schedule = Literal["gpipe", "1f1b"]
Op = tuple[str, int, int]  # ("F" | "B", stage, microbatch)


def schedule_ops(kind: Schedule, stages: int, microbatches: int) -> list[Op]:
    """The global order of forward/backward ops for a schedule (each stage's local order kept).

    Example::

        >>> schedule_ops("gpipe", 2, 2)
        [('F', 0, 0), ('F', 0, 1), ('F', 1, 0), ('F', 1, 1), ('B', 1, 0), ('B', 0, 0), ('B', 1, 1), ('B', 0, 1)]
    """
    S, M = stages, microbatches
    if kind == "gpipe":
        local = [[("F", s, m) for m in range(M)] + [("B", s, m) for m in range(M)] for s in range(S)]
    elif kind == "1f1b":
        local = []
        for s in range(S):
            warm = min(S - s - 1, M)
            ops: list[Op] = [("F", s, m) for m in range(warm)]
            f, b = warm, 0
            while f < M:
                ops.append(("F", s, f))
                f += 1
                ops.append(("B", s, b))
                b += 1
            ops += [("B", s, m) for m in range(b, M)]
            local.append(ops)
    else:
        raise PipelineError(f"`pw.pipeline(schedule=...)` must be 'gpipe' or '1f1b'; got {kind!r}.")
    # Merge the per-stage lists into one order that respects the dataflow.
    done: set[Op] = set()
    cursor = [0] * S
    order: list[Op] = []

    def ready(op: Op) -> bool:
        k, s, m = op
        if k == "F":
            return s == 0 or ("F", s - 1, m) in done
        return ("F", s, m) in done and (s == S - 1 or ("B", s + 1, m) in done)

    while len(order) < 2 * S * M:
        progressed = False
        for s in range(S):  # one op per stage per sweep: stages advance together, like ticks
            if cursor[s] < len(local[s]) and ready(local[s][cursor[s]]):
                op = local[s][cursor[s]]
                cursor[s] += 1
                order.append(op)
                progressed = True
        done.update(order)
        if not progressed:
            raise AssertionError(f"schedule {kind} deadlocked at {cursor}")  # a bug in the lists above
    return order


@dataclasses.dataclass
class _Stage:
    index: int
    fn: Callable
    slice: VirtualSlice
    act_spec: P
    param_spec: Any
    fwd: CompiledFunction
    bwd_first: CompiledFunction
    bwd_acc: CompiledFunction
    update: CompiledFunction | None = None


class Pipeline:
    """A model split into stages on slices, trained with a pipelined schedule, as one pw program.

    Example::

        pipe = pw.pipeline([stage0, stage1], slices=[s0, s1], microbatches=8,
                           schedule="1f1b", loss=mse, learning_rate=0.1)
        params = pipe.place(params)                  # each stage's params onto its slice
        loss, grads = pipe.grads(params, x, y)       # futures
        params, loss = pipe.step(params, x, y)       # one SGD step, futures
    """

    def __init__(
        self,
        stages: Sequence[Callable],
        slices: Sequence[VirtualSlice],
        microbatches: int,
        schedule: Schedule,
        loss: Callable | None,
        learning_rate: float,
        batch_axis: str | None,
        param_specs: Sequence[Any] | None,
        name: str,
        controller: Callable[[], Any],
    ):
        S = len(stages)
        if S < 1:
            raise PipelineError("`pw.pipeline` needs at least one stage.")
        if len(slices) != S:
            raise PipelineError(
                f"`pw.pipeline`: {S} stages but {len(slices)} slices; stage i runs on slices[i], so pass one slice per stage."
            )
        if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
            raise PipelineError(f"`pw.pipeline(microbatches=...)` must be a positive int; got {microbatches!r}.")
        if schedule not in ("gpipe", "1f1b"):
            raise PipelineError(f"`pw.pipeline(schedule=...)` must be 'gpipe' or '1f1b'; got {schedule!r}.")
        if schedule == "1f1b" and microbatches < S:
            raise PipelineError(
                f"`pw.pipeline(schedule='1f1b')` needs at least as many microbatches as stages "
                f"(M >= S), got M={microbatches} for S={S}. Use microbatches>={S}, or schedule='gpipe'."
            )
        for s in slices:
            if not isinstance(s, VirtualSlice):
                raise PipelineError(f"`pw.pipeline(slices=...)` takes VirtualSlices from `pw.slice`; got {s!r}.")
            s.check_live("pw.pipeline")
        self.name = name
        self.S, self.M, self.schedule = S, microbatches, schedule
        self.loss_fn = loss or (lambda out, target: jnp.mean((out - target) ** 2))
        self.learning_rate = learning_rate
        self.ops = schedule_ops(schedule, S, microbatches)
        self.stages: list[_Stage] = []
        for i, (fn, s) in enumerate(zip(stages, slices)):
            axis = batch_axis if batch_axis in s.axis_names else None
            act = P(axis)
            pspec = None if param_specs is None else param_specs[i]
            self.stages.append(self._compile_stage(i, fn, s, act, pspec))
        self._controller = controller
        self._grads = Program(self._grads_fn, name=f"{name}.grads", controller=controller)
        self._step = Program(self._step_fn, name=f"{name}.step", controller=controller)
        self._forward = Program(self._forward_fn, name=f"{name}.forward", controller=controller)

    # ------------------------------------------------------------ building
    def _compile_stage(self, i: int, fn: Callable, s: VirtualSlice, act: P, pspec: Any) -> _Stage:
        last = i == self.S - 1
        loss_fn = self.loss_fn
        M = self.M

        if last:

            def fwd(p, x, t):
                return loss_fn(fn(p, x), t)

            def bwd_first(p, x, t):
                _, vjp = jax.vjp(lambda p_, x_: loss_fn(fn(p_, x_), t), p, x)
                return vjp(jnp.asarray(1.0 / M, dtype=jnp.result_type(float)))

            in_f = (pspec, act, act)
        else:

            def fwd(p, x):
                return fn(p, x)

            def bwd_first(p, x, dy):
                _, vjp = jax.vjp(fn, p, x)
                return vjp(dy)

            in_f = (pspec, act)

        def bwd_acc(p, x, dy_or_t, acc):
            dp, dx = bwd_first(p, x, dy_or_t)
            return jax.tree_util.tree_map(jnp.add, acc, dp), dx

        out_f = P() if last else act
        cf = lambda f, name, ins, outs: CompiledFunction(f, slice=s, in_specs=ins, out_specs=outs, name=name)  # noqa: E731
        return _Stage(
            index=i,
            fn=fn,
            slice=s,
            act_spec=act,
            param_spec=pspec,
            fwd=cf(fwd, f"F{i}", in_f, out_f),
            bwd_first=cf(bwd_first, f"B{i}", (pspec, act, act), (pspec, act)),
            bwd_acc=cf(bwd_acc, f"B{i}", (pspec, act, act, pspec), (pspec, act)),
        )

    def _split(self, x, what: str):
        B = x.shape[0]
        if B % self.M:
            raise PipelineError(
                f"`{self.name}`: the batch of {what} has {B} rows, which do not split into {self.M} equal "
                f"microbatches. Use a batch size that is a multiple of {self.M}."
            )
        mb = B // self.M
        return [x[m * mb : (m + 1) * mb] for m in range(self.M)]

    def _run_schedule(self, params, x, t):
        """Trace the forward and backward ops in schedule order; returns (loss, grads)."""
        S, M = self.S, self.M
        xs = self._split(x, "inputs")
        ts = self._split(t, "targets")
        stored: dict[tuple[int, int], Any] = {}  # (stage, mb) -> the stage input it keeps
        acts: dict[tuple[int, int], Any] = {}
        cots: dict[tuple[int, int], Any] = {}
        grads: list[Any] = [None] * S
        losses = []
        for kind, s, m in self.ops:
            st = self.stages[s]
            if kind == "F":
                inp = xs[m] if s == 0 else acts.pop((s - 1, m))
                stored[(s, m)] = inp
                if s == S - 1:
                    losses.append(st.fwd(params[s], inp, ts[m]))
                else:
                    acts[(s, m)] = st.fwd(params[s], inp)
            else:
                inp = stored.pop((s, m))
                dy = ts[m] if s == S - 1 else cots.pop((s, m))
                if grads[s] is None:
                    grads[s], dx = st.bwd_first(params[s], inp, dy)
                else:
                    grads[s], dx = st.bwd_acc(params[s], inp, dy, grads[s])
                if s > 0:
                    cots[(s - 1, m)] = dx
        loss = sum(losses[1:], losses[0]) / M
        return loss, grads

    def _grads_fn(self, params, x, t):
        return self._run_schedule(params, x, t)

    def _step_fn(self, params, x, t):
        loss, grads = self._run_schedule(params, x, t)
        lr = self.learning_rate
        new = []
        for st, p, g in zip(self.stages, params, grads):
            if st.update is None:
                st.update = CompiledFunction(
                    lambda p_, g_: jax.tree_util.tree_map(lambda a, b: a - lr * b, p_, g_),
                    slice=st.slice,
                    in_specs=(st.param_spec, st.param_spec),
                    out_specs=st.param_spec,
                    name=f"sgd{st.index}",
                )
            new.append(st.update(p, g))
        return new, loss

    def _forward_fn(self, params, x):
        outs = []
        for m, xm in enumerate(self._split(x, "inputs")):
            h = xm
            for st in self.stages[:-1]:
                h = st.fwd(params[st.index], h)
            outs.append(h)
        return outs

    # -------------------------------------------------------------- public
    def place(self, params: Sequence[Any]) -> list[Any]:
        """Put each stage's params on its slice (replicated unless ``param_specs`` say otherwise)."""
        self._check_len(params)
        placed = []
        for st, p in zip(self.stages, params):
            spec = st.param_spec
            if st.slice.remote:  # another host: an identity node there makes them live on its devices
                put = CompiledFunction(lambda q: q, slice=st.slice, in_specs=(spec,), out_specs=spec, name=f"place{st.index}")
                placed.append(Program(put, name=put.name, slice=st.slice, controller=self._controller)(p))
                continue
            if spec is None or isinstance(spec, P):
                sh = st.slice.sharding(spec or P())
                placed.append(jax.tree_util.tree_map(lambda a, sh=sh: jax.device_put(a, sh), p))
            else:
                placed.append(
                    jax.tree_util.tree_map(
                        lambda a, sp, s=st.slice: jax.device_put(a, s.sharding(sp or P())),
                        p,
                        spec,
                        is_leaf=lambda v: v is None or isinstance(v, P),
                    )
                )
        return placed

    def check_params(self, params: Sequence[Any]) -> None:
        """Raise PipelineError unless every stage's params live on that stage's slice."""
        self._check_len(params)
        for st, p in zip(self.stages, params):
            want = set(st.slice.devices)
            for leaf in jax.tree_util.tree_leaves(p):
                have = getattr(leaf, "sharding", None)
                devs = set(have.device_set) if have is not None else None
                if devs != want:
                    where = "the host" if devs is None else f"devices {sorted(d.id for d in devs)}"
                    raise PipelineError(
                        f"`{self.name}`: params of stage {st.index} live on {where}, but stage {st.index} runs "
                        f"on slice {st.slice.name!r} (devices {sorted(d.id for d in want)}). "
                        f"Place them first: `params = pipe.place(params)`."
                    )

    def _check_len(self, params) -> None:
        if len(params) != self.S:
            raise PipelineError(f"`{self.name}`: expected params for {self.S} stages (a list), got {len(params)}.")

    def check_shapes(self, params: Sequence[Any], x) -> None:
        """Raise PipelineError if a stage's output cannot feed the next stage (shape-only, nothing runs)."""
        self._check_len(params)
        mb = jax.ShapeDtypeStruct((x.shape[0] // self.M, *x.shape[1:]), x.dtype)
        h = mb
        for st in self.stages[:-1]:
            try:
                h_next = jax.eval_shape(st.fn, params[st.index], h)
            except Exception as e:
                prev = f"stage {st.index - 1} outputs" if st.index else "the microbatch is"
                raise PipelineError(
                    f"`{self.name}`: {prev} {h.dtype}{list(h.shape)}, which stage {st.index} cannot take: "
                    f"{type(e).__name__}: {e}"
                ) from None
            h = h_next
        last = self.stages[-1]
        try:
            jax.eval_shape(last.fn, params[last.index], h)
        except Exception as e:
            raise PipelineError(
                f"`{self.name}`: stage {last.index - 1} outputs {h.dtype}{list(h.shape)}, which stage "
                f"{last.index} cannot take: {type(e).__name__}: {e}"
            ) from None

    def _check(self, params, x) -> None:
        self.check_params(params)
        self.check_shapes(params, x)

    def grads(self, params, x, y):
        """Submit one pipelined forward+backward; returns futures ``(loss, grads per stage)``."""
        self._check(params, x)
        return self._grads(list(params), x, y)

    def step(self, params, x, y):
        """Submit one pipelined training step (SGD); returns futures ``(new params, loss)``."""
        self._check(params, x)
        return self._step(list(params), x, y)

    def forward(self, params, x):
        """Submit a pipelined forward pass over all but the loss stage; returns a list of microbatch futures."""
        self._check(params, x)
        return self._forward(list(params), x)

    def trace(self, params, x, y):
        """The ProgramGraph of one training step."""
        return self._step.trace(list(params), x, y)

    def submit_step(self, params, x, y, **kw):
        """Like `step`, returning the Run (for its events) instead of the futures."""
        self._check(params, x)
        return self._step.submit(list(params), x, y, **kw)

    def __repr__(self) -> str:
        slices = ", ".join(st.slice.name for st in self.stages)
        return f"<pw.Pipeline {self.name!r}: {self.S} stages on [{slices}], M={self.M}, {self.schedule}>"


def pipeline(
    stages: Sequence[Callable],
    slices: Sequence[VirtualSlice],
    microbatches: int,
    schedule: Schedule = "gpipe",
    *,
    loss: Callable | None = None,
    learning_rate: float = 0.1,
    batch_axis: str | None = "data",
    param_specs: Sequence[Any] | None = None,
    name: str = "pipeline",
    controller: Callable[[], Any],
) -> Pipeline:
    """Pipeline ``stages`` over ``slices`` with ``microbatches`` microbatches; see `Pipeline`.

    Each stage is ``stage(params, x) -> y``; the last stage's output goes to
    ``loss(y, target)`` (mean squared error by default). A slice whose mesh has
    an axis named ``batch_axis`` runs its stage data-parallel over it.

    Example::

        pipe = pw.pipeline([mlp, mlp, mlp, head], slices=[s0, s1, s2, s3],
                           microbatches=8, schedule="gpipe")
    """
    if not isinstance(stages, (list, tuple)):
        raise PipelineError(f"`pw.pipeline(stages=...)` must be a list of functions; got {type(stages).__name__}.")
    try:
        return Pipeline(
            stages, slices, microbatches, schedule, loss, learning_rate, batch_axis, param_specs, name, controller
        )
    except SpecError as e:
        raise PipelineError(str(e)) from None

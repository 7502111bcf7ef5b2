"""Pipelines: stages on slices, microbatches streamed through them, one training step as one program.

`pw.pipeline(stages, slices=..., microbatches=M, schedule=...)` checks its
arguments and builds a `Pipeline`, which puts the pieces together and is what
the user calls: its stages and their compiled nodes (`stages.py`), the
placement of its state on the slices (`state.py`), and the traced training
step (`step.py`), run as pw programs (``{name}.step``, ``{name}.grads``,
``{name}.forward``). Before submitting, each call checks the batch (declared
fields, a batch axis that splits into M microbatches and over the slices'
data axes), that the state lives on the stages' slices, and that each stage's
output can feed the next. The statistics of a finished step are `stats.py`'s.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from ..runtime import Program, SpecError, VirtualSlice
from ..runtime.extend import context_mesh_hint
from .errors import PipelineError
from .optimizer import WholeModelOptimizer, with_clip
from .schedules import Schedule, check_schedule, schedule_ops
from .stages import Stage, StageNodes
from .state import PipelineState, Placement
from .restore import abstract_pipeline_state, restore_pipeline
from .stats import PipelineStats, pipeline_stats
from .step import TrainingStep


class Pipeline:
    """A model split into stages on slices, trained with a pipelined schedule, as one pw program.

    Example::

        pipe = pw.pipeline([embed, block, block, head], slices=[s0, s1, s2, s3], microbatches=8,
                           schedule="1f1b", loss=xent, optimizer=optax.adamw(1e-3),
                           shared={"embed": (0, 3)})
        state = pipe.init(params, shared={"embed": E})   # onto the slices; adamw's state for the whole model
        state, loss = pipe.step(state, tokens, targets)  # one training step: futures, at once
        loss, (grads, shared_grads) = pipe.grads(state, tokens, targets)
    """

    def __init__(
        self,
        stages: Sequence[Callable],
        slices: Sequence[VirtualSlice],
        microbatches: int,
        schedule: Schedule,
        *,
        loss: Callable | None,
        optimizer: Any,
        learning_rate: float,
        clip_norm: float | None,
        remat: bool,
        shared: Mapping[str, Sequence[int]] | None,
        fields: Mapping[str, Sequence[int]] | None,
        batch_axis: str | None,
        param_specs: Sequence[Any] | None,
        name: str,
        controller: Callable[[], Any],
        donate: bool = True,
    ):
        api = "pw.pipeline"
        _check_args(stages, slices, microbatches, schedule, optimizer, clip_norm, param_specs, api=api)
        V, S = len(stages), len(slices)
        self.shared_users = self._users(shared, V, "shared")
        self.field_users = self._users(fields, V, "fields")
        clash = set(self.shared_users) & set(self.field_users)
        if clash:
            raise PipelineError(f"`{api}`: {sorted(clash)} named both as shared params and as batch fields; rename one.")
        self.name = name
        self.S, self.V, self.M, self.schedule = S, V, microbatches, schedule
        self.chunks = V // S
        self.loss_fn = loss  # None: mean squared error
        self._loss_without_weights = loss is None or _takes(loss, 2)  # loss(out, target) can be called
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self.remat = bool(remat)
        self.split_backward = schedule == "zero_bubble"
        self.ops = schedule_ops(schedule, S, microbatches, self.chunks)
        self.stages: list[Stage] = []
        for j, fn in enumerate(stages):
            if not callable(fn):
                raise PipelineError(f"`{api}(stages=...)`: stage {j} is {fn!r}, not a function `stage(params, x)`.")
            s = slices[j % S]
            axis = batch_axis if batch_axis in s.axis_names else None
            self.stages.append(
                Stage(
                    index=j,
                    fn=fn,
                    slice=s,
                    act_spec=P(axis),
                    param_spec=None if param_specs is None else param_specs[j],
                    shared=tuple(n for n, users in self.shared_users.items() if j in users),
                    fields=tuple(n for n, users in self.field_users.items() if j in users),
                )
            )
        self._controller = controller
        self._nodes = StageNodes(V, microbatches, loss, self.remat)
        # clip_norm= with an optimizer is optax.chain(optax.clip_by_global_norm(clip_norm), optimizer)
        whole = None if optimizer is None else WholeModelOptimizer(
            with_clip(optimizer, self.clip_norm), self.stages, self.shared_users, name=name, donate=donate)
        self._placement = Placement(self.stages, self.shared_users, whole, name=name, controller=controller)
        train = TrainingStep(
            self.stages, self._nodes, self._placement, self.ops, split_backward=self.split_backward,
            shared_users=self.shared_users, optimizer=whole, clip_norm=self.clip_norm,
        )
        self._grads = Program(train.grads, name=f"{name}.grads", controller=controller)
        self._step = Program(train.step, name=f"{name}.step", controller=controller)
        self._forward = Program(train.forward, name=f"{name}.forward", controller=controller)
        self._shapes_ok: set = set()  # `check_shapes` keys (what it reads, as shapes and dtypes) found to fit

    @staticmethod
    def _users(decl: Mapping[str, Sequence[int]] | None, V: int, what: str) -> dict[str, tuple[int, ...]]:
        if decl is None:
            return {}
        if not isinstance(decl, Mapping):
            raise PipelineError(
                f"`pw.pipeline({what}=...)` maps each name to the stages that use it, e.g. {{'embed': (0, {V - 1})}}; "
                f"got {decl!r}."
            )
        out = {}
        for name, users in decl.items():
            users = (users,) if isinstance(users, int) else tuple(users)
            if not isinstance(name, str) or not name.isidentifier():
                raise PipelineError(f"`pw.pipeline({what}=...)`: {name!r} must be a Python identifier (stages get it as a keyword).")
            bad = [u for u in users if not isinstance(u, int) or not 0 <= u < V]
            if bad or not users:
                raise PipelineError(
                    f"`pw.pipeline({what}=...)`: {name!r} is used by stages {list(users)}, but stages are numbered "
                    f"0..{V - 1}; name at least one of them."
                )
            out[name] = tuple(sorted(set(users)))
        return out

    # -------------------------------------------------------------- public
    def init(self, params: Sequence[Any], shared: Mapping[str, Any] | None = None) -> PipelineState:
        """Place each stage's params (and each copy of the shared params) on its slice; make the optimizer state there.

        Example::

            state = pipe.init([p0, p1, p2, p3], shared={"embed": E})
        """
        return self._placement.init(params, shared)

    def abstract_state(self, params: Sequence[Any], shared: Mapping[str, Any] | None = None) -> PipelineState:
        """The state `init` would make, as `jax.ShapeDtypeStruct`s with shardings on this pipeline's slices.

        Nothing is placed: ``params`` may themselves be abstract (anything with shape and
        dtype). The optimizer state's structure is `jax.eval_shape` of its init.

        Example::

            target = pipe.abstract_state(params, shared={"embed": E})
            target.opt_state         # optax's state for the whole model: ShapeDtypeStructs, each
                                     # on the slice of the parameter it mirrors
        """
        return abstract_pipeline_state(self, self._placement, params, shared)

    def restore(self, manager: Any, step: int | None = None, *, key: str | None = None) -> PipelineState:
        """The pipeline state saved at ``step`` (default: the latest), on this pipeline's own slices.

        Whatever slices saved it: the same stages on fewer or more slices, other mesh
        shapes, other ``param_specs``; the optimizer state comes back sharded like its
        params. ``key``: where the state sits in the saved tree, when it holds several.
        ``ckpt.restore(step, target={"state": pipe, ...})`` gives the same state, and the rest
        of the tree with it, as a data-parallel run restores its own.

        Example::

            ckpt.save(step, {"state": state, "step": step})
            ...                                         # a new kernel, other slices
            state = pipe.restore(ckpt)
            # or the whole tree at once:
            back = ckpt.restore(target={"state": pipe, "step": 0})
            state, start = back["state"], back["step"] + 1
        """
        return restore_pipeline(self, manager, step, key)

    def place(self, params: Sequence[Any]) -> list[Any]:
        """Put each stage's params on its slice (for a pipeline without shared params or optimizer); see `init`."""
        return self.init(params).params if not self.shared_users and self.optimizer is None else self._need_state("place")

    def _need_state(self, api: str):
        raise PipelineError(
            f"`{self.name}.{api}`: this pipeline has shared params or an optimizer, whose state `{self.name}.init(params, "
            f"shared=...)` makes; pass that PipelineState."
        )

    def _state(self, state_or_params: Any, api: str) -> tuple[PipelineState, bool]:
        if isinstance(state_or_params, PipelineState):
            return state_or_params, True
        if self.shared_users or self.optimizer is not None:
            self._need_state(api)
        if not isinstance(state_or_params, (list, tuple)):
            raise PipelineError(f"`{self.name}.{api}` takes the PipelineState from `{self.name}.init(...)`; got {type(state_or_params).__name__}.")
        return PipelineState(list(state_or_params), {}, None), False

    def check_params(self, state_or_params: Any) -> None:
        """Raise PipelineError unless every stage's params (and shared copies) live on that stage's slice."""
        state, _ = self._state(state_or_params, "check_params")
        self._placement.check(state)

    def _batch(self, api: str, x, y, weights, fields: dict) -> dict:
        """The batch as the step takes it; raise PipelineError unless it splits into M microbatches on every slice."""
        missing, extra = set(self.field_users) - set(fields), set(fields) - set(self.field_users)
        if missing or extra:
            raise PipelineError(
                f"`{self.name}.{api}`: batch fields {sorted(missing)} are declared in `pw.pipeline(fields=...)` but "
                f"not passed; {sorted(extra)} are passed but not declared. Pass each declared field as a keyword, "
                f"e.g. `{api}(state, x, y, positions=pos)`."
            )
        if weights is not None and self.loss_fn is None:
            raise PipelineError(
                f"`{self.name}.{api}(weights=...)` needs `pw.pipeline(loss=...)`: a loss(out, target, weights) that "
                f"returns the weighted mean over its microbatch, sum(w * l) / sum(w)."
            )
        if weights is None and not self._loss_without_weights:
            raise PipelineError(
                f"`{self.name}.{api}` calls `pw.pipeline(loss=...)` as loss(out, target) when no weights= is "
                f"passed, but {getattr(self.loss_fn, '__name__', 'the loss')}{_signature(self.loss_fn)} needs more. "
                f"Pass weights= (ones for a plain mean), or give the loss's weights a default (weights=None)."
            )
        batch = {"x": x, "y": y, "w": weights, "fields": dict(fields)}
        B = None
        parts = [("x", x), ("y", y), ("weights", weights)] + [(f"field {n!r}", v) for n, v in fields.items()]
        for what, tree in parts:
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
                shape = np.shape(leaf)
                where = what + jax.tree_util.keystr(path)
                if not shape or shape[0] % self.M:
                    raise PipelineError(
                        f"`{self.name}.{api}`: {where} has shape {list(shape)}, whose first (batch) axis does not split "
                        f"into {self.M} equal microbatches. Every leaf of the batch needs a leading batch axis that is a "
                        f"multiple of {self.M}."
                    )
                if B is not None and shape[0] != B:
                    raise PipelineError(
                        f"`{self.name}.{api}`: {where} has {shape[0]} rows but the batch has {B}; give every leaf the same batch size."
                    )
                B = shape[0]
        rows = (B or 0) // self.M
        for st in self.stages:  # jit, too, refuses a batch axis its mesh axis does not divide
            axis = st.act_spec[0] if len(st.act_spec) else None
            if axis is not None and rows % st.slice.mesh.shape[axis]:
                d = st.slice.mesh.shape[axis]
                raise PipelineError(
                    f"`{self.name}.{api}`: a batch of {B} makes microbatches of {rows} examples, which do not split over "
                    f"the {axis!r} axis ({d} devices) of slice {st.slice.name!r}, where stage {st.index} runs "
                    f"data-parallel. Use a batch that is a multiple of {self.M * d} (microbatches x {axis!r} axis), "
                    f"fewer microbatches, or slices without a {axis!r} axis."
                )
        return batch

    def check_shapes(self, state_or_params: Any, x, fields: Mapping[str, Any] | None = None) -> None:
        """Raise PipelineError if a stage's output cannot feed the next stage (shape-only, nothing runs)."""
        state, _ = self._state(state_or_params, "check_shapes")
        self._placement.check_len(state.params)
        fields = dict(fields or {})
        # Each step would trace every stage again (~0.1 s a step on the CPU): shapes that fit once fit again.
        leaves, tree = jax.tree_util.tree_flatten((state.params, state.shared, x, fields))
        key = (tree, tuple((getattr(a, "shape", None), str(getattr(a, "dtype", type(a)))) for a in leaves))
        if key in self._shapes_ok:
            return

        def mb(a):
            return jax.ShapeDtypeStruct((a.shape[0] // self.M, *a.shape[1:]), a.dtype)

        h = jax.tree_util.tree_map(mb, x)
        for st in self.stages:
            fl = {n: jax.tree_util.tree_map(mb, fields[n]) for n in st.fields if n in fields}
            try:
                with st.slice.tracing_mesh():
                    h_next = jax.eval_shape(lambda p, sh, x, fl: st.fn(p, x, **sh, **fl), state.params[st.index], self._placement.shared_of(state, st), h, fl)
            except Exception as e:
                prev = f"stage {st.index - 1} outputs" if st.index else "the microbatch is"
                desc = ", ".join(f"{a.dtype}{list(a.shape)}" for a in jax.tree_util.tree_leaves(h))
                raise PipelineError(
                    f"`{self.name}`: {prev} {desc}, which stage {st.index} cannot take: {type(e).__name__}: {e}"
                    f"{context_mesh_hint([st.slice])}"
                ) from None
            h = h_next
        if len(self._shapes_ok) > 64:
            self._shapes_ok.clear()
        self._shapes_ok.add(key)

    def _check(self, state: PipelineState, x, fields: dict) -> None:
        self.check_params(state)
        self.check_shapes(state, x, fields)

    def grads(self, state, x, y, *, weights=None, **fields):
        """Submit one pipelined forward+backward; returns futures ``(loss, grads)``.

        ``grads`` is ``(per-stage grads, {shared name: grad})`` for a PipelineState,
        as ``jax.value_and_grad(loss, argnums=(0, 1))`` of the unpipelined model would
        give; a list of per-stage grads when plain placed params were passed.
        """
        st, is_state = self._state(state, "grads")
        batch = self._batch("grads", x, y, weights, fields)
        self._check(st, x, fields)
        loss, (g, gsh) = self._grads(st, batch)
        return loss, ((g, gsh) if is_state else g)

    def step(self, state, x, y, *, weights=None, **fields):
        """Submit one pipelined training step; returns futures ``(new state, loss)``.

        Each step may read the previous step's futures: submitting many steps in a
        row waits for none of them.
        """
        st, is_state = self._state(state, "step")
        batch = self._batch("step", x, y, weights, fields)
        self._check(st, x, fields)
        new, loss = self._step(st, batch, np.float32(self.learning_rate))
        return (new if is_state else new.params), loss

    def forward(self, state, x, **fields):
        """Submit a pipelined forward pass (no loss); returns the last stage's output per microbatch (futures).

        The batch is cut into M microbatches when it divides, else run whole.
        """
        st, _ = self._state(state, "forward")
        self.check_params(st)
        return self._forward(st, x, dict(fields))

    def batch_placement(self) -> dict[str, Any]:
        """Where a step reads each part of its batch, as (slice, PartitionSpec): what `pw.prefetch` places.

        ``x`` goes to the first stage's slice, ``y`` and ``weights`` to the last's, each field to
        the first slice whose stages read it; the spec splits the batch axis over the slice's
        data axis where the stage runs data-parallel.

        Example::

            pipe.batch_placement()["x"]   # (VirtualSlice('slice0', ...), PartitionSpec('data',))
        """
        first, last = self.stages[0], self.stages[-1]
        fields: dict[str, tuple[VirtualSlice, P]] = {}
        for st in self.stages:
            for n in st.fields:
                fields.setdefault(n, (st.slice, st.act_spec))
        return {
            "x": (first.slice, first.act_spec),
            "y": (last.slice, last.act_spec),
            "weights": (last.slice, last.act_spec),
            "fields": fields,
        }

    def trace(self, state, x, y, *, weights=None, **fields):
        """The ProgramGraph of one training step."""
        st, _ = self._state(state, "trace")
        return self._step.trace(st, self._batch("trace", x, y, weights, fields), np.float32(self.learning_rate))

    def submit_step(self, state, x, y, *, weights=None, run_name: str | None = None, mode: str | None = None, **fields):
        """Like `step`, returning the Run (for its events; ``run.outputs`` is ``(new state, loss)``)."""
        st, _ = self._state(state, "submit_step")
        batch = self._batch("submit_step", x, y, weights, fields)
        self._check(st, x, fields)
        return self._step.submit(st, batch, np.float32(self.learning_rate), name=run_name, mode=mode)

    def memory(self, state, x, y, *, weights=None, **fields) -> dict[str, int]:
        """The memory one training step would reserve, per slice (the most on any of its devices), in bytes.

        Read off the traced step (nothing compiles or runs): the same estimate the
        controller admits runs by. ``remat=False`` shows here as the residuals kept.

        Example::

            pipe.memory(state, tokens, targets)   # {'slice0': 412160, ...}
        """
        peak = self._controller().plan(self.trace(state, x, y, weights=weights, **fields), "chained").peak_bytes
        out: dict[str, int] = {}
        for st in self.stages:
            out[st.slice.name] = max(out.get(st.slice.name, 0), max(peak.get(d.id, 0) for d in st.slice.devices))
        return out

    def stats(self, run) -> PipelineStats:
        """Bubble, live activations and the ideal-device replay of a finished step run; see `PipelineStats`."""
        return pipeline_stats(self, run)

    def __repr__(self) -> str:
        slices = ", ".join(dict.fromkeys(st.slice.name for st in self.stages))
        v = f" x{self.chunks} chunks" if self.chunks > 1 else ""
        return f"<pw.Pipeline {self.name!r}: {self.V} stages on [{slices}]{v}, M={self.M}, {self.schedule}>"


def pipeline(
    stages: Sequence[Callable],
    slices: Sequence[VirtualSlice],
    microbatches: int,
    schedule: Schedule = "gpipe",
    *,
    loss: Callable | None = None,
    optimizer: Any = None,
    learning_rate: float = 0.1,
    clip_norm: float | None = None,
    remat: bool = True,
    shared: Mapping[str, Sequence[int]] | None = None,
    fields: Mapping[str, Sequence[int]] | None = None,
    batch_axis: str | None = "data",
    param_specs: Sequence[Any] | None = None,
    name: str = "pipeline",
    donate: bool = True,
    controller: Callable[[], Any],
) -> Pipeline:
    """Pipeline ``stages`` over ``slices`` with ``microbatches`` microbatches; see `Pipeline`.

    - ``stages[j](params, x, **kw) -> y`` runs on ``slices[j % len(slices)]``;
      ``kw`` holds the shared params and batch fields stage j uses. The last
      stage's output goes to ``loss(y, target)`` (mean squared error by default),
      or ``loss(y, target, weights)`` when `step` gets ``weights=``: then the loss
      is the weighted mean over its microbatch and the pipeline weighs
      microbatches so the step's loss is the weighted mean over the whole batch.
    - ``schedule``: "gpipe", "1f1b", "interleaved" (``len(stages) = v * len(slices)``)
      or "zero_bubble" (ZB-H1).
    - ``optimizer``: any optax GradientTransformation, applied as on the whole model:
      ``tx.init(params)`` and ``tx.update(grads, state, params)`` over the list of stage
      params, or over ``(params, shared)`` with shared params, exactly as `init` got
      them (so masks and label trees are one fixed pytree of that structure, a
      global-norm clip takes every stage's gradients, ``optax.MultiSteps`` counts steps
      once). pw runs each slice's part of the update on that slice, the optimizer state
      of each parameter beside it; cross-stage reductions are small nodes of their own.
      Without it, SGD with ``learning_rate``.
    - ``clip_norm``: clip by the global norm of all stages' gradients; with
      ``optimizer=tx`` it is shorthand for ``optax.chain(optax.clip_by_global_norm(clip_norm), tx)``.
    - ``remat``: recompute each stage's forward in its backward (True) or keep its residuals (False).
    - ``shared={"embed": (0, 3)}``: params declared once and used by several
      stages (tied embeddings); their gradients are summed across those stages.
    - ``fields={"positions": (0, 1)}``: per-example batch inputs besides x, cut into
      microbatches and passed to those stages.
    - A slice whose mesh has an axis named ``batch_axis`` runs its stages data-parallel over it.
    - ``param_specs``: one PartitionSpec pytree (a prefix of the params) per stage, to shard
      its params, and the optimizer state with them, over the slice's other axes (tensor
      parallelism inside a stage); None replicates them.
    - ``donate``: a step's update donates the params, optimizer state and gradient sums it
      replaces (as a `jax.jit` step with ``donate_argnums``), so training holds one copy of
      them. The state passed to `step` is then used up: keep going with the one it returns
      (reading the old one raises, naming the step it went to; a checkpoint being written
      from it is waited for). ``donate=False`` keeps old states readable, at twice the memory.

    Example::

        pipe = pw.pipeline([mlp, mlp, mlp, head], slices=[s0, s1, s2, s3],
                           microbatches=8, schedule="1f1b", optimizer=optax.adam(1e-3))
    """
    if not isinstance(stages, (list, tuple)):
        raise PipelineError(f"`pw.pipeline(stages=...)` must be a list of functions; got {type(stages).__name__}.")
    if not isinstance(slices, (list, tuple)):
        raise PipelineError(f"`pw.pipeline(slices=...)` must be a list of slices; got {type(slices).__name__}.")
    try:
        return Pipeline(
            stages, slices, microbatches, schedule, loss=loss, optimizer=optimizer, learning_rate=learning_rate,
            clip_norm=clip_norm, remat=remat, shared=shared, fields=fields, batch_axis=batch_axis,
            param_specs=param_specs, name=name, controller=controller, donate=donate,
        )
    except SpecError as e:
        raise PipelineError(str(e)) from None


def _check_args(stages, slices, microbatches, schedule, optimizer, clip_norm, param_specs, *, api: str) -> None:
    """Raise PipelineError, naming ``api``, for arguments `Pipeline` cannot be built from."""
    V, S = len(stages), len(slices)
    if V < 1:
        raise PipelineError(f"`{api}` needs at least one stage.")
    if S < 1 or V % S:
        raise PipelineError(
            f"`{api}`: {V} stages but {S} slices; stage j runs on slices[j % S], so pass one slice per stage "
            f"(or, with schedule='interleaved', a number of stages that is a multiple of the slices)."
        )
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise PipelineError(f"`{api}(microbatches=...)` must be a positive int; got {microbatches!r}.")
    check_schedule(schedule, S, microbatches, V // S, api=api)
    if schedule == "interleaved" and V == S:
        raise PipelineError(
            f"`{api}(schedule='interleaved')` puts several model chunks on each slice: pass v * {S} stages "
            f"for {S} slices (v >= 2), e.g. {2 * S} stages. With one stage per slice use '1f1b'."
        )
    for s in slices:
        if not isinstance(s, VirtualSlice):
            raise PipelineError(f"`{api}(slices=...)` takes VirtualSlices from `pw.slice`; got {s!r}.")
        s.check_live(api)
    if optimizer is not None and not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))):
        raise PipelineError(
            f"`{api}(optimizer=...)` takes an optax GradientTransformation (with .init and .update), such as "
            f"optax.adamw(1e-3); got {optimizer!r}. Leave it out for plain SGD with learning_rate=."
        )
    if clip_norm is not None and not (isinstance(clip_norm, (int, float)) and clip_norm > 0):
        raise PipelineError(f"`{api}(clip_norm=...)` must be a positive number or None; got {clip_norm!r}.")
    if param_specs is not None and len(param_specs) != V:
        raise PipelineError(f"`{api}(param_specs=...)` needs one entry per stage ({V}); got {len(param_specs)}.")


def _signature(fn: Callable) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def _takes(fn: Callable, n: int) -> bool:
    """Whether ``fn`` can be called with ``n`` positional arguments (True when Python cannot tell)."""
    try:
        inspect.signature(fn).bind(*range(n))
    except TypeError:
        return False
    except ValueError:  # builtins without a signature
        return True
    return True


__all__ = ["Pipeline", "pipeline"]

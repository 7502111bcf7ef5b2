"""Pipelines: stages on slices, microbatches streamed through them, one training step as one program.

`pw.pipeline(stages, slices=..., microbatches=M, schedule=...)` compiles, per
stage j on slice j % S, a forward ``F{j}`` and a backward ``B{j}`` (`jax.vjp`
of the stage; under ``zero_bubble`` split into ``B{j}``, the input gradient,
and ``W{j}``, the weight gradient). The last stage's forward includes the loss.
Gradients are accumulated over microbatches inside the backward nodes; then
shared (tied) parameters' gradients are summed across the stages that use
them, an optional global-norm clip reduces across all stages, and an optimizer
step runs per stage. Activations and gradients between stages move as
explicit transfer nodes. The order in which the traced step calls its nodes is
the schedule (see `schedules.py`), which is the order every island receives
them.

With ``remat=True`` (the default) a backward recomputes its stage's forward
from the stage input it kept; with ``remat=False`` the forward also returns
the residuals its backward needs (`jax.vjp`'s, less those that are its own
inputs), which stay on the stage's devices until then: less compute, more
memory, as the run's memory estimate and `PipelineStats` show.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ..runtime import CompiledFunction, Program, SpecError, VirtualSlice, context_mesh_hint, nbytes_of
from .errors import PipelineError
from .schedules import Schedule, check_schedule, schedule_ops


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PipelineState:
    """What a pipeline trains, placed on its slices: per-stage params, shared params, optimizer state.

    ``params[j]`` lives on stage j's slice; ``shared[name]`` holds one copy per
    stage that uses ``name`` (in stage order, all equal); ``opt_state[j]`` is the
    optimizer's state for stage j's ``(params, shared copies)``, sharded like
    them. After `Pipeline.step` every leaf is a `pw.Future`.

    Example::

        state = pipe.init(params, shared={"embed": E})
        state, loss = pipe.step(state, tokens, targets)
        pw.get(state.shared["embed"][0])      # the trained embedding
    """

    params: list
    shared: dict
    opt_state: list | None

    def __repr__(self) -> str:
        shared = ", ".join(f"{k}: {len(v)} copies" for k, v in self.shared.items()) or "none"
        opt = "none" if self.opt_state is None else "per stage"
        return f"PipelineState({len(self.params)} stages; shared: {shared}; optimizer state: {opt})"


def _inexact(a: Any) -> bool:
    return jnp.issubdtype(getattr(a, "dtype", jnp.result_type(a)), jnp.inexact)


def _nbytes(tree: Any) -> int:
    return sum(nbytes_of(a.shape, a.dtype) for a in jax.tree_util.tree_leaves(tree))


def _zeros_cotangent(a: Any) -> Any:
    return np.zeros(a.shape, jax.dtypes.float0)


@dataclasses.dataclass
class _Stage:
    index: int
    fn: Callable
    slice: VirtualSlice
    act_spec: P
    param_spec: Any
    shared: tuple[str, ...]  # names of the shared params it uses
    fields: tuple[str, ...]  # names of the batch fields it reads
    stored_bytes: int = 0  # per microbatch, what the backward keeps (filled in at trace time)


class Pipeline:
    """A model split into stages on slices, trained with a pipelined schedule, as one pw program.

    Example::

        pipe = pw.pipeline([embed, block, block, head], slices=[s0, s1, s2, s3], microbatches=8,
                           schedule="1f1b", loss=xent, optimizer=optax.adamw(1e-3),
                           shared={"embed": (0, 3)})
        state = pipe.init(params, shared={"embed": E})   # onto the slices, optimizer state made there
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
    ):
        api = "pw.pipeline"
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
        self.stages: list[_Stage] = []
        for j, fn in enumerate(stages):
            if not callable(fn):
                raise PipelineError(f"`{api}(stages=...)`: stage {j} is {fn!r}, not a function `stage(params, x)`.")
            s = slices[j % S]
            axis = batch_axis if batch_axis in s.axis_names else None
            self.stages.append(
                _Stage(
                    index=j,
                    fn=fn,
                    slice=s,
                    act_spec=P(axis),
                    param_spec=None if param_specs is None else param_specs[j],
                    shared=tuple(n for n, users in self.shared_users.items() if j in users),
                    fields=tuple(n for n, users in self.field_users.items() if j in users),
                )
            )
        self._fns: dict[Any, CompiledFunction] = {}
        self._opt_specs: list[Any] | None = None
        self._controller = controller
        self._grads = Program(self._grads_fn, name=f"{name}.grads", controller=controller)
        self._step = Program(self._step_fn, name=f"{name}.step", controller=controller)
        self._forward = Program(self._forward_fn, name=f"{name}.forward", controller=controller)

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

    # ------------------------------------------------------------ compiled nodes
    def _fn(self, key: tuple, make: Callable[[], CompiledFunction]) -> CompiledFunction:
        f = self._fns.get(key)
        if f is None:
            f = self._fns[key] = make()
        return f

    def _apply(self, st: _Stage) -> Callable:
        """``(p, sh, x, fl, lo) -> output`` of stage ``st``; the last stage's is its share of the loss."""
        fn = st.fn
        if st.index < self.V - 1:
            return lambda p, sh, x, fl, lo: fn(p, x, **sh, **fl)
        loss_fn, M = self.loss_fn or _mse, self.M

        def last(p, sh, x, fl, lo):
            y = fn(p, x, **sh, **fl)
            t, w, total = lo
            if w is None:
                return jnp.asarray(loss_fn(y, t), jnp.float32) / M
            # the microbatch's weighted mean, weighed by its share of the batch's weight:
            # the sum over microbatches is the weighted mean over the whole batch
            share = sum(jnp.sum(a.astype(jnp.float32)) for a in jax.tree_util.tree_leaves(w)) / total
            return jnp.asarray(loss_fn(y, t, w), jnp.float32) * share

        return last

    def _vjp(self, st: _Stage, p, sh, x, fl, lo):
        """``(out, pullback)`` of the stage w.r.t. params, shared params and the inexact leaves of x."""
        apply = self._apply(st)
        leaves, tdef = jax.tree_util.tree_flatten(x)
        mask = [_inexact(a) for a in leaves]

        def f(p, sh, xd):
            it = iter(xd)
            return apply(p, sh, jax.tree_util.tree_unflatten(tdef, [next(it) if k else a for a, k in zip(leaves, mask)]), fl, lo)

        xd = [a for a, k in zip(leaves, mask) if k]
        if st.index == 0:  # nothing upstream wants the input's gradient (often token ids)
            out, pull = jax.vjp(lambda p, sh: f(p, sh, xd), p, sh)
        else:
            out, pull = jax.vjp(f, p, sh, xd)
        return out, pull

    @staticmethod
    def _cotangent(out, dy):
        """The full cotangent of ``out`` from ``dy``, the gradients of its inexact leaves only."""
        if dy is None:  # the last stage: its output is the loss
            return jnp.ones(out.shape, out.dtype)
        leaves, tdef = jax.tree_util.tree_flatten(out)
        it = iter(dy)
        return jax.tree_util.tree_unflatten(tdef, [next(it) if _inexact(a) else _zeros_cotangent(a) for a in leaves])

    def _forward_node(self, st: _Stage, args: tuple) -> CompiledFunction:
        act, ps = st.act_spec, st.param_spec
        lo_spec = None if st.index < self.V - 1 else (act, act, None)
        ins = (ps, None, act, act, lo_spec)
        if self.remat:
            out = P() if st.index == self.V - 1 else act
            return self._fn(("F", st.index), lambda: self._cf(st, self._apply(st), f"F{st.index}", ins, out))
        # keep the residuals: the forward returns them; which leaves are its own inputs is found by tracing once
        avals = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
        key = ("F", st.index, jax.tree_util.tree_structure(avals), tuple((a.shape, a.dtype) for a in jax.tree_util.tree_leaves(avals)))
        f = self._fns.get(key)
        if f is None:
            found = {}

            def fwd(p, sh, x, fl, lo):
                out, pull = self._vjp(st, p, sh, x, fl, lo)
                res, tdef = jax.tree_util.tree_flatten(pull)
                ins_ = jax.tree_util.tree_leaves((p, sh, x, fl, lo))
                recipe, kept = [], []
                for r in res:
                    i = next((i for i, a in enumerate(ins_) if a is r), None)
                    recipe.append(("in", i) if i is not None else ("res", len(kept)))
                    if i is None:
                        kept.append(r)
                found.update(tdef=tdef, recipe=recipe)
                return out, tuple(kept)

            with st.slice.tracing_mesh():
                shapes = jax.eval_shape(fwd, *avals)
            mb = self._mb_rows(args[2])
            axis_ok = st.act_spec != P()
            res_specs = tuple(st.act_spec if axis_ok and r.ndim and r.shape[0] == mb else P() for r in shapes[1])
            out_spec = (P() if st.index == self.V - 1 else act, res_specs)
            found["specs"] = res_specs
            f = self._cf(st, fwd, f"F{st.index}", ins, out_spec)
            f.residuals = found  # the backward rebuilds the pullback from these
            self._fns[key] = f
        return f

    @staticmethod
    def _mb_rows(x) -> int | None:
        leaves = [a for a in jax.tree_util.tree_leaves(x) if getattr(a, "ndim", 0)]
        return leaves[0].shape[0] if leaves else None

    def _backward_node(self, st: _Stage, part: str, first: bool, how: dict | None) -> CompiledFunction:
        """``part``: "full" (param grads + input grad), "input" (input grad only), "weight" (param grads only)."""
        j, last = st.index, st.index == self.V - 1
        act, ps = st.act_spec, st.param_spec
        key = ("B", j, part, first, id(how))

        def make():
            def bwd(p, sh, x, fl, lo, res, dy, *acc):
                if how is None:  # recompute the forward
                    out, pull = self._vjp(st, p, sh, x, fl, lo)
                else:  # rebuild the forward's pullback from its inputs and the residuals it kept
                    ins_ = jax.tree_util.tree_leaves((p, sh, x, fl, lo))
                    pull = jax.tree_util.tree_unflatten(how["tdef"], [ins_[i] if k == "in" else res[i] for k, i in how["recipe"]])
                    out = jax.eval_shape(self._apply(st), p, sh, x, fl, lo)
                g = pull(self._cotangent(out, dy))
                grads = (g[0], g[1])
                if acc:
                    grads = jax.tree_util.tree_map(jnp.add, acc[0], grads)
                dx = list(g[2]) if j > 0 else None
                if part == "input":
                    return dx
                if part == "weight" or j == 0:
                    return grads
                return grads, dx

            res_spec = None if how is None else how["specs"]
            lo_spec = None if not last else (act, act, None)
            g_spec = (ps, None)
            ins = (ps, None, act, act, lo_spec, res_spec, None if last else act) + (() if first else (g_spec,))
            if part == "input":
                outs = act
            elif part == "weight" or j == 0:
                outs = g_spec
            else:
                outs = (g_spec, act)
            name = f"W{j}" if part == "weight" else f"B{j}"
            return self._cf(st, bwd, name, ins, outs)

        return self._fn(key, make)

    def _zeros_node(self, st: _Stage) -> CompiledFunction:
        spec = (st.param_spec, None)
        return self._fn(("zeros", st.index), lambda: self._cf(
            st, lambda p, sh: jax.tree_util.tree_map(jnp.zeros_like, (p, sh)), f"zeros{st.index}", spec, spec))

    def _cf(self, st: _Stage, fn: Callable, name: str, ins: Any, outs: Any) -> CompiledFunction:
        return CompiledFunction(fn, slice=st.slice, in_specs=ins, out_specs=outs, name=name)

    def _splitter(self, s: VirtualSlice, act: P, with_total: bool) -> CompiledFunction:
        """One node that cuts a batch pytree into M microbatches on slice ``s`` (and sums the loss weights)."""
        M = self.M

        def split(tree):
            def part(a, m):
                n = a.shape[0] // M
                return a[m * n : (m + 1) * n]

            parts = tuple(jax.tree_util.tree_map(lambda a, m=m: part(a, m), tree) for m in range(M))
            if not with_total:
                return parts
            w = tree[1]
            total = sum(jnp.sum(a.astype(jnp.float32)) for a in jax.tree_util.tree_leaves(w)) if w is not None else None
            return parts, total

        outs = (act, None) if with_total else act
        return self._fn(("split", id(s), act, with_total), lambda: CompiledFunction(split, slice=s, in_specs=(act,), out_specs=outs, name="split"))

    # ------------------------------------------------------------ the step
    def _run_schedule(self, state: PipelineState, batch: dict):
        """Trace the ops in schedule order; returns (loss, per-stage (param grads, shared grads))."""
        V, M = self.V, self.M
        first, last = self.stages[0], self.stages[-1]
        xs = self._splitter(first.slice, first.act_spec, False)(batch["x"])
        (loss_parts, total) = self._splitter(last.slice, last.act_spec, True)((batch["y"], batch["w"]))
        fields: dict[int, list[dict]] = {}
        by_slice: dict[int, list] = {}
        for st in self.stages:
            if not st.fields:
                fields[st.index] = [{}] * M
                continue
            key = id(st.slice)
            if key not in by_slice:  # one split per slice for all the fields its stages read
                names = sorted({n for t in self.stages if t.slice is st.slice for n in t.fields})
                parts = self._splitter(st.slice, st.act_spec, False)({n: batch["fields"][n] for n in names})
                by_slice[key] = parts
            fields[st.index] = [{n: part[n] for n in st.fields} for part in by_slice[key]]
        acts: dict[tuple[int, int], Any] = {}
        cots: dict[tuple[int, int], Any] = {}
        stored: dict[tuple[int, int], list] = {}
        acc: list[Any] = [None] * V
        losses = []
        for kind, j, m in self.ops:
            st = self.stages[j]
            p, sh = state.params[j], self._shared_of(state, st)
            if kind == "F":
                x = xs[m] if j == 0 else acts.pop((j - 1, m))
                lo = (loss_parts[m][0], loss_parts[m][1], total) if j == V - 1 else None
                args = (p, sh, x, fields[j][m], lo)
                f = self._forward_node(st, args)
                out = f(*args)
                how = getattr(f, "residuals", None)
                y, res = (out, None) if how is None else out
                if not st.stored_bytes:
                    st.stored_bytes = _nbytes((x, fields[j][m], res))
                stored[(j, m)] = [x, fields[j][m], lo, res, None, how]
                if j == V - 1:
                    losses.append(y)
                else:
                    acts[(j, m)] = y
                continue
            keep = stored[(j, m)]
            x, fl, lo, res, dy, how = keep
            if kind == "B":
                dy = None if j == V - 1 else cots.pop((j, m))
                if self.split_backward:
                    keep[4] = dy  # the weight gradient (W) needs it too
                    if j > 0:
                        cots[(j - 1, m)] = self._backward_node(st, "input", True, how)(p, sh, x, fl, lo, res, dy)
                    continue
                del stored[(j, m)]
                part = "full"
            else:
                del stored[(j, m)]
                part = "weight"
            if acc[j] is None:  # accumulate from zeros: one backward executable per stage, not two
                acc[j] = self._zeros_node(st)(p, sh)
            out = self._backward_node(st, part, False, how)(p, sh, x, fl, lo, res, dy, acc[j])
            if part == "full" and j > 0:
                acc[j], cots[(j - 1, m)] = out
            else:
                acc[j] = out
        loss = sum(losses[1:], losses[0])
        return loss, acc

    def _shared_of(self, state: PipelineState, st: _Stage) -> dict:
        return {n: state.shared[n][self.shared_users[n].index(st.index)] for n in st.shared}

    def _tie(self, acc: list) -> dict:
        """Each shared param's gradient: the sum over the stages that use it, on the first one's slice."""
        totals = {}
        for name, users in self.shared_users.items():
            gs = tuple(acc[u][1][name] for u in users)
            if len(gs) == 1:
                totals[name] = gs[0]
                continue
            owner = self.stages[users[0]]
            tie = self._fn(("tie", name), lambda owner=owner, name=name: CompiledFunction(
                lambda gs: sum(gs[1:], gs[0]), slice=owner.slice, in_specs=(None,), out_specs=None, name=f"tie:{name}"))
            totals[name] = tie(gs)
        return totals

    def _global_norm(self, acc: list, totals: dict):
        """The norm of all gradients, across stages: a sum of squares per stage, then one reduction."""
        parts = []
        for st in self.stages:
            owned = {n: totals[n] for n in st.shared if self.shared_users[n][0] == st.index}
            sq = self._fn(("sq", st.index), lambda st=st: self._cf(
                st, lambda g, t: sum(jnp.sum(jnp.square(a.astype(jnp.float32))) for a in jax.tree_util.tree_leaves((g, t))),
                f"sqnorm{st.index}", (st.param_spec, None), P()))
            parts.append(sq(acc[st.index][0], owned))
        last = self.stages[-1]
        norm = self._fn(("norm",), lambda: self._cf(last, lambda qs: jnp.sqrt(sum(qs[1:], qs[0])), "global_norm", (None,), P()))
        return norm(tuple(parts))

    def _update_node(self, st: _Stage) -> CompiledFunction:
        opt, clip = self.optimizer, self.clip_norm

        def clipped(g, gnorm):
            if clip is None:
                return g
            # optax.clip_by_global_norm's formula, with the norm taken over every stage
            return jax.tree_util.tree_map(lambda t: jnp.where(gnorm < clip, t, t / gnorm.astype(t.dtype) * clip), g)

        def apply_updates(params, updates):  # optax.apply_updates
            return jax.tree_util.tree_map(lambda p, u: jnp.asarray(p + u).astype(jnp.asarray(p).dtype), params, updates)

        ps = st.param_spec
        if opt is None:

            def sgd(p, sh, gp, gsh, lr, gnorm):
                g = clipped((gp, gsh), gnorm)
                return apply_updates((p, sh), jax.tree_util.tree_map(lambda a: -lr * a, g))

            return self._fn(("sgd", st.index), lambda: self._cf(st, sgd, f"sgd{st.index}", (ps, None, ps, None, None, None), (ps, None)))
        spec = self._opt_specs[st.index]

        def update(p, sh, s, gp, gsh, gnorm):
            g = clipped((gp, gsh), gnorm)
            u, s2 = opt.update(g, s, (p, sh))
            new = apply_updates((p, sh), u)
            return new[0], new[1], s2

        return self._fn(("opt", st.index), lambda: self._cf(st, update, f"update{st.index}", (ps, None, spec, ps, None, None), (ps, None, spec)))

    def _grads_fn(self, state: PipelineState, batch: dict):
        loss, acc = self._run_schedule(state, batch)
        return loss, ([a[0] for a in acc], self._tie(acc))

    def _step_fn(self, state: PipelineState, batch: dict, lr):
        loss, acc = self._run_schedule(state, batch)
        totals = self._tie(acc)
        gnorm = self._global_norm(acc, totals) if self.clip_norm is not None else None
        params, copies, opt_state = [], {n: [] for n in self.shared_users}, []
        for st in self.stages:
            j = st.index
            p, sh = state.params[j], self._shared_of(state, st)
            gsh = {n: totals[n] for n in st.shared}
            f = self._update_node(st)
            if self.optimizer is None:
                new_p, new_sh = f(p, sh, acc[j][0], gsh, lr, gnorm)
            else:
                new_p, new_sh, s = f(p, sh, state.opt_state[j], acc[j][0], gsh, gnorm)
                opt_state.append(s)
            params.append(new_p)
            for n in st.shared:
                copies[n].append(new_sh[n])
        new = PipelineState(params, {n: tuple(c) for n, c in copies.items()}, opt_state if self.optimizer else None)
        return new, loss

    def _forward_fn(self, state: PipelineState, x, fields: dict):
        outs = []
        n = self._mb_rows(x) or 0
        M = self.M if n and n % self.M == 0 else 1
        rows = n // M
        cut = lambda tree, m: jax.tree_util.tree_map(lambda a: a[m * rows : (m + 1) * rows], tree)  # noqa: E731
        for m in range(M):
            h = cut(x, m)
            for st in self.stages:
                fl = {k: cut(fields[k], m) for k in st.fields}
                # a batch too small to split over the data axis (one prompt, say) runs replicated
                axis = st.act_spec[0] if len(st.act_spec) else None
                act = st.act_spec if axis is None or rows % st.slice.mesh.shape[axis] == 0 else P()
                apply = self._fn(("apply", st.index, act), lambda st=st, act=act: self._cf(
                    st, lambda p, sh, x, fl, fn=st.fn: fn(p, x, **sh, **fl), f"apply{st.index}",
                    (st.param_spec, None, act, act), act))
                h = apply(state.params[st.index], self._shared_of(state, st), h, fl)
            outs.append(h)
        return outs

    # -------------------------------------------------------------- public
    def init(self, params: Sequence[Any], shared: Mapping[str, Any] | None = None) -> PipelineState:
        """Place each stage's params (and each copy of the shared params) on its slice; make the optimizer state there.

        Example::

            state = pipe.init([p0, p1, p2, p3], shared={"embed": E})
        """
        self._check_len(params)
        shared = dict(shared or {})
        missing, extra = set(self.shared_users) - set(shared), set(shared) - set(self.shared_users)
        if missing or extra:
            raise PipelineError(
                f"`{self.name}.init(shared=...)` needs exactly the shared params declared in `pw.pipeline(shared=...)` "
                f"({sorted(self.shared_users)}); missing {sorted(missing)}, unexpected {sorted(extra)}."
            )
        for j, p in enumerate(params):
            for path, leaf in jax.tree_util.tree_leaves_with_path(p):
                if not _inexact(leaf):
                    raise PipelineError(
                        f"`{self.name}.init`: stage {j}'s parameter {jax.tree_util.keystr(path) or 'params'} is "
                        f"{jnp.result_type(leaf)}; parameters are trained, so they must be floating point. Pass "
                        f"integer inputs (token ids, positions) as the batch or as a batch field instead."
                    )
        placed = [self._put(st, p, st.param_spec) for st, p in zip(self.stages, params)]
        copies = {n: tuple(self._put(self.stages[u], shared[n], None) for u in users) for n, users in self.shared_users.items()}
        state = PipelineState(placed, copies, None)
        if self.optimizer is not None:
            opt_state, specs = [], []
            for st in self.stages:
                if st.slice.remote:
                    raise PipelineError(
                        f"`{self.name}`: an optimizer's state is made eagerly on each slice, which stage {st.index}'s "
                        f"remote slice {st.slice.name!r} does not allow yet. Use plain SGD (no optimizer=) there."
                    )
                s = self.optimizer.init((placed[st.index], self._shared_of(state, st)))
                here = set(st.slice.devices)
                s = jax.tree_util.tree_map(  # counters and other scalars start on the default device: move them
                    lambda a, st=st: a if set(a.sharding.device_set) == here else jax.device_put(a, st.slice.sharding(P())), s)
                opt_state.append(s)
                specs.append(jax.tree_util.tree_map(lambda a: a.sharding.spec, s))
            self._opt_specs = specs
            state.opt_state = opt_state
        return state

    def place(self, params: Sequence[Any]) -> list[Any]:
        """Put each stage's params on its slice (for a pipeline without shared params or optimizer); see `init`."""
        return self.init(params).params if not self.shared_users and self.optimizer is None else self._need_state("place")

    def _need_state(self, api: str):
        raise PipelineError(
            f"`{self.name}.{api}`: this pipeline has shared params or an optimizer, whose state `{self.name}.init(params, "
            f"shared=...)` makes; pass that PipelineState."
        )

    def _put(self, st: _Stage, p: Any, spec: Any) -> Any:
        if st.slice.remote:  # another host: an identity node there makes them live on its devices
            put = CompiledFunction(lambda q: q, slice=st.slice, in_specs=(spec,), out_specs=spec, name=f"place{st.index}")
            return Program(put, name=put.name, slice=st.slice, controller=self._controller)(p)
        if spec is None or isinstance(spec, P):
            sh = st.slice.sharding(spec or P())
            return jax.tree_util.tree_map(lambda a: jax.device_put(a, sh), p)
        return jax.tree_util.tree_map(
            lambda a, sp: jax.device_put(a, st.slice.sharding(sp or P())),
            p,
            spec,
            is_leaf=lambda v: v is None or isinstance(v, P),
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
        self._check_len(state.params)
        for st in self.stages:
            trees = [("params", state.params[st.index])] + [(f"shared {n!r}", v) for n, v in self._shared_of(state, st).items()]
            want = set(st.slice.devices)
            for what, tree in trees:
                for leaf in jax.tree_util.tree_leaves(tree):
                    if isinstance(leaf, jax.core.Tracer):
                        continue  # a step inside a program being traced: that program places its inputs
                    have = getattr(leaf, "sharding", None)
                    devs = set(have.device_set) if have is not None else None
                    if devs != want:
                        where = "the host" if devs is None else f"devices {sorted(d.id for d in devs)}"
                        raise PipelineError(
                            f"`{self.name}`: {what} of stage {st.index} live on {where}, but stage {st.index} runs "
                            f"on slice {st.slice.name!r} (devices {sorted(d.id for d in want)}). "
                            f"Place them first: `state = pipe.init(params)`."
                        )

    def _check_len(self, params) -> None:
        if not isinstance(params, (list, tuple)) or len(params) != self.V:
            n = len(params) if isinstance(params, (list, tuple)) else type(params).__name__
            raise PipelineError(f"`{self.name}`: expected params for {self.V} stages (a list), got {n}.")

    def _batch(self, api: str, x, y, weights, fields: dict) -> dict:
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
        self._check_len(state.params)
        fields = dict(fields or {})

        def mb(a):
            return jax.ShapeDtypeStruct((a.shape[0] // self.M, *a.shape[1:]), a.dtype)

        h = jax.tree_util.tree_map(mb, x)
        for st in self.stages:
            fl = {n: jax.tree_util.tree_map(mb, fields[n]) for n in st.fields if n in fields}
            try:
                with st.slice.tracing_mesh():
                    h_next = jax.eval_shape(lambda p, sh, x, fl: st.fn(p, x, **sh, **fl), state.params[st.index], self._shared_of(state, st), h, fl)
            except Exception as e:
                prev = f"stage {st.index - 1} outputs" if st.index else "the microbatch is"
                desc = ", ".join(f"{a.dtype}{list(a.shape)}" for a in jax.tree_util.tree_leaves(h))
                raise PipelineError(
                    f"`{self.name}`: {prev} {desc}, which stage {st.index} cannot take: {type(e).__name__}: {e}"
                    f"{context_mesh_hint([st.slice])}"
                ) from None
            h = h_next

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

    def stats(self, run) -> Any:
        """Bubble, live activations and the ideal-device replay of a finished step run; see `PipelineStats`."""
        from .stats import pipeline_stats

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
    - ``optimizer``: an optax GradientTransformation (its state lives per stage,
      sharded like the params; it sees stage j's ``(params, {shared name: value})``,
      so masks should be functions of the tree); without it, SGD with ``learning_rate``.
    - ``clip_norm``: clip by the global norm of all stages' gradients (a
      cross-stage reduction); an optax clip inside ``optimizer`` would see one stage only.
    - ``remat``: recompute each stage's forward in its backward (True) or keep its residuals (False).
    - ``shared={"embed": (0, 3)}``: params declared once and used by several
      stages (tied embeddings); their gradients are summed across those stages.
    - ``fields={"positions": (0, 1)}``: per-example batch inputs besides x, cut into
      microbatches and passed to those stages.
    - A slice whose mesh has an axis named ``batch_axis`` runs its stages data-parallel over it.
    - ``param_specs``: one PartitionSpec pytree (a prefix of the params) per stage, to shard
      its params, and the optimizer state with them, over the slice's other axes (tensor
      parallelism inside a stage); None replicates them.

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
            param_specs=param_specs, name=name, controller=controller,
        )
    except SpecError as e:
        raise PipelineError(str(e)) from None


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


def _mse(out, target):
    return jnp.mean((out - target) ** 2)


__all__ = ["Pipeline", "PipelineState", "pipeline"]

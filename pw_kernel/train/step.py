"""The traced training step: stage nodes called in schedule order, then gradients summed, clipped, applied.

`TrainingStep` holds the bodies of a pipeline's programs. A step cuts the
batch into microbatches on the slices that read it, then calls the stages'
forward and backward nodes in the order of the schedule (see
`schedules.py`), which is the order every island receives them; activations
and gradients between stages move as explicit transfer nodes. Gradients are
accumulated over microbatches inside the backward nodes; then shared (tied)
parameters' gradients are summed across the stages that use them, and the
optimizer runs on the whole model, split per slice (`optimizer.py`); without
one, plain SGD runs per stage after an optional global-norm clip across all
stages. The pipelined forward pass, with no loss,
runs the stages alone per microbatch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ..runtime import CompiledFunction
from ..runtime.extend import nbytes_of
from .schedules import Op
from .optimizer import WholeModelOptimizer, apply_updates
from .stages import Stage, StageNodes, microbatch_rows
from .state import PipelineState, Placement


class TrainingStep:
    """What one pipelined call traces: `step` (a training step), `grads` (its gradients) and `forward`."""

    def __init__(
        self,
        stages: Sequence[Stage],
        nodes: StageNodes,
        placement: Placement,
        ops: Sequence[Op],
        *,
        split_backward: bool,
        shared_users: Mapping[str, tuple[int, ...]],
        optimizer: WholeModelOptimizer | None,
        clip_norm: float | None,
    ):
        self.stages = stages
        self.nodes = nodes
        self.placement = placement
        self.ops = ops
        self.split_backward = split_backward
        self.shared_users = shared_users
        self.optimizer = optimizer
        self.clip_norm = clip_norm

    # ------------------------------------------------------------ the programs' bodies
    def grads(self, state: PipelineState, batch: dict):
        """``(loss, (per-stage param grads, {shared name: summed grad}))``."""
        loss, acc = self._run_schedule(state, batch)
        return loss, ([a[0] for a in acc], self._tie(acc))

    def step(self, state: PipelineState, batch: dict, lr):
        """``(new state, loss)``: the gradients, summed for shared params, then the optimizer (or SGD) applied."""
        loss, acc = self._run_schedule(state, batch)
        totals = self._tie(acc)
        new = self._sgd(state, acc, totals, lr) if self.optimizer is None else self._optimize(state, acc, totals)
        return new, loss  # the outputs are named after this line: new.params[0]['w'], ..., loss

    def _sgd(self, state: PipelineState, acc: list, totals: dict, lr) -> PipelineState:
        """Plain SGD per stage, after an optional clip by the global norm of every stage's gradients."""
        gnorm = self._global_norm(acc, totals) if self.clip_norm is not None else None
        params, copies = [], {n: [] for n in self.shared_users}
        for st in self.stages:
            j = st.index
            p, sh = state.params[j], self.placement.shared_of(state, st)
            new_p, new_sh = self._sgd_node(st)(p, sh, acc[j][0], {n: totals[n] for n in st.shared}, lr, gnorm)
            params.append(new_p)
            for n in st.shared:
                copies[n].append(new_sh[n])
        return PipelineState(params, {n: tuple(c) for n, c in copies.items()}, None)

    def _optimize(self, state: PipelineState, acc: list, totals: dict) -> PipelineState:
        """The optimizer on the whole model (split per slice, `optimizer.py`); shared params' new value sent to each user."""
        opt = self.optimizer
        owned = self.placement.owned(state)
        tree = opt.whole(state.params, owned)
        shapes = self.placement.abstract(state.params, owned)
        new_tree, opt_state = opt.apply(
            opt.whole([a[0] for a in acc], totals), state.opt_state, tree, opt.whole(shapes.params, self.placement.owned(shapes))
        )
        params, shared = opt.parts(new_tree)
        copies = {}
        for n, users in self.shared_users.items():
            old = state.shared[n]
            copies[n] = (shared[n],) + tuple(self._share_node(n, u)(shared[n], old[i + 1]) for i, u in enumerate(users[1:]))
        return PipelineState(params, copies, opt_state)

    def forward(self, state: PipelineState, x, fields: dict):
        """The last stage's output per microbatch (the batch whole when it does not split into M)."""
        outs = []
        n = microbatch_rows(x) or 0
        M = self.nodes.M if n and n % self.nodes.M == 0 else 1
        rows = n // M
        cut = lambda tree, m: jax.tree_util.tree_map(lambda a: a[m * rows : (m + 1) * rows], tree)
        for m in range(M):
            h = cut(x, m)
            for st in self.stages:
                fl = {k: cut(fields[k], m) for k in st.fields}
                # a batch too small to split over the data axis (one prompt, say) runs replicated
                axis = st.act_spec[0] if len(st.act_spec) else None
                act = st.act_spec if axis is None or rows % st.slice.mesh.shape[axis] == 0 else P()
                h = self.nodes.apply(st, act)(state.params[st.index], self.placement.shared_of(state, st), h, fl)
            outs.append(h)
        return outs

    # ------------------------------------------------------------ the schedule
    def _split_batch(self, batch: dict):
        """The batch cut into microbatches where it is read: x on the first stage, targets and weights on the last, fields per slice."""
        M = self.nodes.M
        first, last = self.stages[0], self.stages[-1]
        xs = self.nodes.splitter(first.slice, first.act_spec, False)(batch["x"])
        (loss_parts, total) = self.nodes.splitter(last.slice, last.act_spec, True)((batch["y"], batch["w"]))
        fields: dict[int, list[dict]] = {}
        by_slice: dict[int, list] = {}
        for st in self.stages:
            if not st.fields:
                fields[st.index] = [{}] * M
                continue
            key = id(st.slice)
            if key not in by_slice:  # one split per slice for all the fields its stages read
                names = sorted({n for t in self.stages if t.slice is st.slice for n in t.fields})
                parts = self.nodes.splitter(st.slice, st.act_spec, False)({n: batch["fields"][n] for n in names})
                by_slice[key] = parts
            fields[st.index] = [{n: part[n] for n in st.fields} for part in by_slice[key]]
        return xs, loss_parts, total, fields

    def _run_schedule(self, state: PipelineState, batch: dict):
        """Trace the ops in schedule order; returns (loss, per-stage (param grads, shared grads))."""
        V = len(self.stages)
        nodes = self.nodes
        xs, loss_parts, total, fields = self._split_batch(batch)
        acts: dict[tuple[int, int], Any] = {}
        cots: dict[tuple[int, int], Any] = {}
        stored: dict[tuple[int, int], list] = {}
        acc: list[Any] = [None] * V
        losses = []
        for kind, j, m in self.ops:
            st = self.stages[j]
            p, sh = state.params[j], self.placement.shared_of(state, st)
            if kind == "F":
                x = xs[m] if j == 0 else acts.pop((j - 1, m))
                lo = (loss_parts[m][0], loss_parts[m][1], total) if j == V - 1 else None
                args = (p, sh, x, fields[j][m], lo)
                f = nodes.forward(st, args)
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
                        cots[(j - 1, m)] = nodes.backward(st, "input", True, how)(p, sh, x, fl, lo, res, dy)
                    continue
                del stored[(j, m)]
                part = "full"
            else:
                del stored[(j, m)]
                part = "weight"
            if acc[j] is None:  # accumulate from zeros: one backward executable per stage, not two
                acc[j] = nodes.zeros(st)(p, sh)
            out = nodes.backward(st, part, False, how)(p, sh, x, fl, lo, res, dy, acc[j])
            if part == "full" and j > 0:
                acc[j], cots[(j - 1, m)] = out
            else:
                acc[j] = out
        loss = sum(losses[1:], losses[0])
        return loss, acc

    # ------------------------------------------------------------ after the schedule
    def _tie(self, acc: list) -> dict:
        """Each shared param's gradient: the sum over the stages that use it, on the first one's slice."""
        totals = {}
        for name, users in self.shared_users.items():
            gs = tuple(acc[u][1][name] for u in users)
            if len(gs) == 1:
                totals[name] = gs[0]
                continue
            owner = self.stages[users[0]]
            tie = self.nodes.cached(("tie", name), lambda owner=owner, name=name: CompiledFunction(
                lambda gs: sum(gs[1:], gs[0]), slice=owner.slice, in_specs=(None,), out_specs=P(), name=f"tie:{name}"))
            totals[name] = tie(gs)
        return totals

    def _global_norm(self, acc: list, totals: dict):
        """The norm of all gradients, across stages: a sum of squares per stage, then one reduction."""
        nodes = self.nodes
        parts = []
        for st in self.stages:
            owned = {n: totals[n] for n in st.shared if self.shared_users[n][0] == st.index}
            sq = nodes.cached(("sq", st.index), lambda st=st: nodes.compiled(
                st, lambda g, t: sum(jnp.sum(jnp.square(a.astype(jnp.float32))) for a in jax.tree_util.tree_leaves((g, t))),
                f"sqnorm{st.index}", (st.param_spec, None), P()))
            parts.append(sq(acc[st.index][0], owned))
        last = self.stages[-1]
        norm = nodes.cached(("norm",), lambda: nodes.compiled(last, lambda qs: jnp.sqrt(sum(qs[1:], qs[0])), "global_norm", (None,), P()))
        return norm(tuple(parts))

    def _sgd_node(self, st: Stage) -> CompiledFunction:
        """``sgd{j}``: stage j's params and shared copies, one SGD step on (clipped by the global norm if asked)."""
        clip = self.clip_norm

        def sgd(p, sh, gp, gsh, lr, gnorm):
            g = (gp, gsh)
            if clip is not None:  # optax.clip_by_global_norm's formula, with the norm taken over every stage
                g = jax.tree_util.tree_map(lambda t: jnp.where(gnorm < clip, t, t / gnorm.astype(t.dtype) * clip), g)
            return apply_updates((p, sh), jax.tree_util.tree_map(lambda a: -lr * a, g))

        ps = st.param_spec
        return self.nodes.cached(("sgd", st.index), lambda: self.nodes.compiled(
            st, sgd, f"sgd{st.index}", (ps, None, ps, None, None, None), st.grad_spec))

    def _share_node(self, name: str, user: int) -> CompiledFunction:
        """``share:{name}{k}``: a shared param's new value, copied to stage k's slice (which reads it next step)
        into the buffer of the copy it replaces (donated)."""
        st = self.stages[user]
        donate = (1,) if self.optimizer.donate else ()
        return self.nodes.cached(("share", name, user), lambda: CompiledFunction(
            lambda new, old: new, slice=st.slice, in_specs=(None, None), out_specs=P(), name=f"share:{name}{user}",
            donate_argnums=donate))


def _nbytes(tree: Any) -> int:
    return sum(nbytes_of(a.shape, a.dtype) for a in jax.tree_util.tree_leaves(tree))


__all__ = ["TrainingStep"]

"""Stages and their compiled nodes: a forward and a backward per stage, made once and cached.

A `Stage` says what stage j runs, on which slice, and how its inputs are
sharded. `StageNodes` compiles, per stage on its slice, a forward ``F{j}``
and a backward ``B{j}`` (`jax.vjp` of the stage; under ``zero_bubble`` split
into ``B{j}``, the input gradient, and ``W{j}``, the weight gradient). The
last stage's forward includes the loss. Gradients are accumulated over
microbatches inside the backward nodes, from a ``zeros{j}`` node.

With ``remat=True`` (the default) a backward recomputes its stage's forward
from the stage input it kept; with ``remat=False`` the forward also returns
the residuals its backward needs (`jax.vjp`'s, less those that are its own
inputs), which stay on the stage's devices until then: less compute, more
memory, as the run's memory estimate and `PipelineStats` show.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ..runtime import CompiledFunction, VirtualSlice

Part = Literal["full", "input", "weight"]  # of a backward: param grads + input grad, input grad only, param grads only


@dataclasses.dataclass
class Stage:
    """Stage ``index`` of a pipeline: its function, its slice, and the specs of what it takes."""

    index: int
    fn: Callable
    slice: VirtualSlice
    act_spec: P
    param_spec: Any
    shared: tuple[str, ...]  # names of the shared params it uses
    fields: tuple[str, ...]  # names of the batch fields it reads
    stored_bytes: int = 0  # per microbatch, what the backward keeps (filled in at trace time)

    @property
    def grad_spec(self) -> Any:
        """The specs of (its params' gradients, its shared params' gradients): where `init` places the
        params (replicated where no ``param_specs`` say otherwise). Declared, so that tracing a step
        never compiles to learn them and every executable compiles in the run, several at once."""
        return (P() if self.param_spec is None else self.param_spec, P())


def inexact(a: Any) -> bool:
    """Whether ``a`` is floating point (or complex): what has a gradient."""
    return jnp.issubdtype(getattr(a, "dtype", jnp.result_type(a)), jnp.inexact)


def microbatch_rows(x: Any) -> int | None:
    """The leading axis of the first leaf of ``x`` that has one."""
    leaves = [a for a in jax.tree_util.tree_leaves(x) if getattr(a, "ndim", 0)]
    return leaves[0].shape[0] if leaves else None


class StageNodes:
    """Every compiled node of one pipeline, made on first use and cached by key.

    The traced step calls ``forward``, ``backward`` and ``zeros`` per stage and
    microbatch; the nodes it builds itself (sums across stages, the optimizer
    update) share the cache through ``cached``.
    """

    def __init__(self, stages: int, microbatches: int, loss: Callable | None, remat: bool):
        self.V, self.M = stages, microbatches
        self.loss_fn = loss or _mse
        self.remat = remat
        self._fns: dict[Any, CompiledFunction] = {}

    def cached(self, key: tuple, make: Callable[[], CompiledFunction]) -> CompiledFunction:
        """The node under ``key``, made by ``make()`` the first time."""
        f = self._fns.get(key)
        if f is None:
            f = self._fns[key] = make()
        return f

    def compiled(self, st: Stage, fn: Callable, name: str, ins: Any, outs: Any) -> CompiledFunction:
        """``fn`` as a node on stage ``st``'s slice."""
        return CompiledFunction(fn, slice=st.slice, in_specs=ins, out_specs=outs, name=name)

    # ------------------------------------------------------------ the stage as a function
    def _apply(self, st: Stage) -> Callable:
        """``(p, sh, x, fl, lo) -> output`` of stage ``st``; the last stage's is its share of the loss."""
        fn = st.fn
        if st.index < self.V - 1:
            return lambda p, sh, x, fl, lo: fn(p, x, **sh, **fl)
        loss_fn, M = self.loss_fn, self.M

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

    def _vjp(self, st: Stage, p, sh, x, fl, lo):
        """``(out, pullback)`` of the stage w.r.t. params, shared params and the inexact leaves of x."""
        apply = self._apply(st)
        leaves, tdef = jax.tree_util.tree_flatten(x)
        mask = [inexact(a) for a in leaves]

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
        return jax.tree_util.tree_unflatten(tdef, [next(it) if inexact(a) else _zeros_cotangent(a) for a in leaves])

    # ------------------------------------------------------------ the nodes
    def forward(self, st: Stage, args: tuple) -> CompiledFunction:
        """``F{j}`` for these arguments; with ``remat=False`` it also returns the residuals (see ``.residuals``)."""
        act, ps = st.act_spec, st.param_spec
        lo_spec = None if st.index < self.V - 1 else (act, act, None)
        ins = (ps, None, act, act, lo_spec)
        if self.remat:
            out = P() if st.index == self.V - 1 else act
            return self.cached(("F", st.index), lambda: self.compiled(st, self._apply(st), f"F{st.index}", ins, out))
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
            mb = microbatch_rows(args[2])
            axis_ok = st.act_spec != P()
            res_specs = tuple(st.act_spec if axis_ok and r.ndim and r.shape[0] == mb else P() for r in shapes[1])
            out_spec = (P() if st.index == self.V - 1 else act, res_specs)
            found["specs"] = res_specs
            f = self.compiled(st, fwd, f"F{st.index}", ins, out_spec)
            f.residuals = found  # the backward rebuilds the pullback from these
            self._fns[key] = f
        return f

    def backward(self, st: Stage, part: Part, first: bool, how: dict | None) -> CompiledFunction:
        """``B{j}`` (or ``W{j}`` for ``part="weight"``); ``how``: the forward's residuals, None to recompute it."""
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
            g_spec = st.grad_spec
            ins = (ps, None, act, act, lo_spec, res_spec, None if last else act) + (() if first else (g_spec,))
            if part == "input":
                outs = act
            elif part == "weight" or j == 0:
                outs = g_spec
            else:
                outs = (g_spec, act)
            name = f"W{j}" if part == "weight" else f"B{j}"
            return self.compiled(st, bwd, name, ins, outs)

        return self.cached(key, make)

    def zeros(self, st: Stage) -> CompiledFunction:
        """``zeros{j}``: zero gradients for stage j's (params, shared params), to accumulate into."""
        return self.cached(("zeros", st.index), lambda: self.compiled(
            st, lambda p, sh: jax.tree_util.tree_map(jnp.zeros_like, (p, sh)), f"zeros{st.index}", (st.param_spec, None),
            st.grad_spec))

    def splitter(self, s: VirtualSlice, act: P, with_total: bool) -> CompiledFunction:
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

        outs = (act, P()) if with_total else act
        return self.cached(("split", id(s), act, with_total), lambda: CompiledFunction(split, slice=s, in_specs=(act,), out_specs=outs, name="split"))

    def apply(self, st: Stage, act: P) -> CompiledFunction:
        """``apply{j}``: the stage alone, no loss and no gradient (the pipelined forward pass)."""
        return self.cached(("apply", st.index, act), lambda: self.compiled(
            st, lambda p, sh, x, fl, fn=st.fn: fn(p, x, **sh, **fl), f"apply{st.index}",
            (st.param_spec, None, act, act), act))


def _zeros_cotangent(a: Any) -> Any:
    return np.zeros(a.shape, jax.dtypes.float0)


def _mse(out, target):
    return jnp.mean((out - target) ** 2)


__all__ = ["Stage", "StageNodes", "inexact", "microbatch_rows"]

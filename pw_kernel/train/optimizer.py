"""The user's optax transformation applied to the whole model, run per slice.

``optimizer=tx`` means what ``tx`` means on the unpipelined model: its state is
``tx.init(tree)`` and a step is ``tx.update(grads, state, tree)`` then
``optax.apply_updates``, where ``tree`` is the model's params as `Pipeline.init`
got them (the list of stage params, or ``(params, shared)`` with shared
params). So a global-norm clip inside a chain clips by the norm of every
stage's gradients, a mask or label tree is one fixed pytree over the whole
model, and ``optax.MultiSteps`` counts steps once.

Nothing of it runs in one place, though: the update is traced once with
`jax.make_jaxpr` and split by where each leaf lives (`partition.py`), so each
slice updates its own params and optimizer state, and what crosses slices (a
global norm's sum) is a small node of its own. Each leaf of the optimizer
state lives where the parameter it mirrors lives, sharded like it; a leaf
that mirrors none (a step count) lives on stage 0's slice and is sent, as a
scalar, to the slices that read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from ..runtime import CompiledFunction
from .errors import PipelineError
from .partition import R, Flat, Split
from .stages import Stage


def apply_updates(params: Any, updates: Any) -> Any:
    """`optax.apply_updates`: ``params + updates`` in each parameter's own dtype."""
    return jax.tree_util.tree_map(lambda p, u: jnp.asarray(p + u).astype(jnp.asarray(p).dtype), params, updates)


def with_clip(optimizer: Any, clip_norm: float | None) -> Any:
    """``optimizer`` after `optax.clip_by_global_norm(clip_norm)`: what ``clip_norm=`` is shorthand for."""
    if clip_norm is None or optimizer is None:
        return optimizer
    import optax  # the train extra; only a pipeline given both optimizer= and clip_norm= needs it

    return optax.chain(optax.clip_by_global_norm(clip_norm), optimizer)


@dataclasses.dataclass
class Layout:
    """How one model's optimizer runs: the state's placement and the update's split into nodes."""

    state: Any  # the optimizer state as ShapeDtypeStructs with their shardings
    state_def: Any
    n_params: int
    split: Split
    out_shardings: list[NamedSharding]  # of each update output: new params, then new state
    out_at: list[int]  # the slice location of each update output
    nodes: list[CompiledFunction] | None = None
    moves: dict[int, CompiledFunction] | None = None


class WholeModelOptimizer:
    """``tx`` on the whole model's params tree, placed and run per slice; see the module docstring.

    Example::

        opt = WholeModelOptimizer(tx, stages, {"embed": (0, 3)}, name="pipeline")
        state = opt.init(opt.whole(placed_params, placed_shared))
        new_tree, new_state = opt.apply(grads_tree, state, tree)   # inside the step's trace
    """

    def __init__(
        self, tx: Any, stages: Sequence[Stage], shared_users: Mapping[str, tuple[int, ...]], *, name: str, donate: bool = True
    ):
        self.tx = tx
        self.donate = donate
        self.stages = stages
        self.shared_users = shared_users
        self.name = name
        self.slices = list({id(st.slice): st.slice for st in stages}.values())
        self._loc = {id(s): k for k, s in enumerate(self.slices)}
        self._layouts: dict[Any, Layout] = {}

    # ------------------------------------------------------------ the whole tree
    def whole(self, params: Sequence[Any], shared: Mapping[str, Any]) -> Any:
        """The tree optax sees: the list of stage params, or ``(params, shared)`` when there are shared params."""
        return list(params) if not self.shared_users else (list(params), {n: shared[n] for n in self.shared_users})

    def parts(self, tree: Any) -> tuple[list, dict]:
        """``(params, shared)`` of a whole tree."""
        return (list(tree), {}) if not self.shared_users else (list(tree[0]), dict(tree[1]))

    def _locations(self) -> Any:
        """The whole tree's structure with, at each stage's (or shared param's) place, its slice's location."""
        stage_locs = [self._loc[id(st.slice)] for st in self.stages]
        shared = {n: stage_locs[users[0]] for n, users in self.shared_users.items()}
        return self.whole(stage_locs, shared)

    def _leaf_locations(self, tree: Any) -> list[int]:
        locs = self._locations()
        out: list[int] = []
        jax.tree_util.tree_map(lambda loc, sub: out.extend([loc] * len(jax.tree_util.tree_leaves(sub))), locs, tree)
        return out

    # ------------------------------------------------------------ placement of the state
    def layout(self, tree: Any) -> Layout:
        """The layout for a params tree of ShapeDtypeStructs carrying their shardings (cached)."""
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        key = (treedef, tuple((tuple(a.shape), jnp.dtype(a.dtype), a.sharding) for a in leaves))
        hit = self._layouts.get(key)
        if hit is None:
            hit = self._layouts[key] = self._make_layout(tree, leaves)
        return hit

    def _trace(self, plain: Any) -> tuple[Any, Any]:
        """The state's shapes and the update's jaxpr, with JAX's errors said in terms of the pipeline."""
        tx = self.tx

        def update(grads, state, params):
            updates, state = tx.update(grads, state, params)
            return apply_updates(params, updates), state

        what = "its state (tx.init)"
        try:
            state = jax.eval_shape(tx.init, plain)
            what = "its update (tx.update)"
            closed = jax.make_jaxpr(update)(plain, state, plain)
        except Exception as e:
            shape = "a list with one entry per stage" if not self.shared_users else "a tuple (params, shared)"
            raise PipelineError(
                f"`pw.pipeline(optimizer=...)` runs the optimizer on the whole model's params, the tree "
                f"`{self.name}.init` got: {shape}, here {jax.tree_util.tree_structure(plain)}. Making {what} "
                f"failed with {type(e).__name__}: {e}\nA mask or label tree (`mask=`, `optax.multi_transform`) "
                f"must have that structure, as for optax on the unpipelined model."
            ) from None
        return state, closed

    def _make_layout(self, tree: Any, leaves: list) -> Layout:
        plain = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(tuple(a.shape), a.dtype), tree)
        state_shapes, closed = self._trace(plain)
        flat = Flat(closed)
        p_locs = self._leaf_locations(tree)
        s_paths, state_def = jax.tree_util.tree_flatten_with_path(state_shapes)
        n_p, n_s = len(leaves), len(s_paths)
        # each state leaf goes where the parameter it mirrors is (the longest path suffix of the same shape)
        param_paths = [tuple(p) for p, _ in jax.tree_util.tree_flatten_with_path(plain)[0]]
        s_locs: list[int] = []
        s_shardings: list[Any] = []
        for path, leaf in s_paths:
            best, best_len = None, -1
            for i, pp in enumerate(param_paths):
                n = len(pp)
                if n > best_len and tuple(path[-n:]) == pp and tuple(leaf.shape) == tuple(leaves[i].shape):
                    best, best_len = i, n
            s_locs.append(R if best is None else p_locs[best])
            s_shardings.append(None if best is None else leaves[best].sharding)
        # a leaf that mirrors no parameter but is updated from one slice's values alone lives there
        for _ in range(3):
            split_homes = Split(flat, p_locs + s_locs + p_locs, [0] * len(flat.outs), 0).ref_home
            changed = False
            for i in range(n_s):
                r = flat.outs[n_p + i]
                if s_locs[i] == R and isinstance(r, int) and r >= flat.n_in and split_homes[r] >= 0:
                    s_locs[i], changed = split_homes[r], True
            if not changed:
                break
        s_at = [0 if loc == R else loc for loc in s_locs]  # counters and the like: on stage 0's slice
        s_shardings = [
            sh if sh is not None else NamedSharding(self.slices[at].mesh, P()) for sh, at in zip(s_shardings, s_at)
        ]
        split = Split(flat, p_locs + s_locs + p_locs, p_locs + s_at, 0)
        state = jax.tree_util.tree_unflatten(
            state_def,
            [jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype, sharding=sh) for (_, leaf), sh in zip(s_paths, s_shardings)],
        )
        return Layout(state, state_def, n_p, split, [a.sharding for a in leaves] + s_shardings, p_locs + s_at)

    def init(self, tree: Any) -> Any:
        """``tx.init(tree)`` for placed params, each state leaf moved where the layout puts it."""
        layout = self.layout(jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), tree))
        try:
            state = self.tx.init(tree)
        except Exception as e:
            raise PipelineError(
                f"`{self.name}.init`: the optimizer's init over the whole model failed with {type(e).__name__}: {e}"
            ) from None
        return jax.tree_util.tree_map(lambda a, want: jax.device_put(a, want.sharding), state, layout.state)

    # ------------------------------------------------------------ the update, inside the step's trace
    def apply(self, grads: Any, state: Any, tree: Any, shardings: Any) -> tuple[Any, Any]:
        """``(new params tree, new state)``: the update's nodes called in order (inside a program's trace).

        ``shardings``: the params tree as ShapeDtypeStructs with shardings (tracers carry none).
        """
        layout = self.layout(shardings)
        if layout.nodes is None:
            self._compile(layout)
        split = layout.split
        inputs = jax.tree_util.tree_leaves(grads) + jax.tree_util.tree_leaves(state) + jax.tree_util.tree_leaves(tree)
        outs = split.run(inputs, lambda gi, args: layout.nodes[gi](*args))
        for o, move in layout.moves.items():
            outs[o] = move(outs[o])
        new_tree = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(tree), outs[: layout.n_params])
        return new_tree, jax.tree_util.tree_unflatten(layout.state_def, outs[layout.n_params :])

    def _compile(self, layout: Layout) -> None:
        """A `CompiledFunction` per group, named ``update{slice}`` (``.k`` per level) or ``update:cross``."""
        split = layout.split
        flat = split.flat
        out_of: dict[int, int] = {}
        for o, r in enumerate(flat.outs):
            if isinstance(r, int):
                out_of.setdefault(r, o)
        per_home: dict[int, list[int]] = {}
        for gi, g in enumerate(split.groups):
            per_home.setdefault(g.home, []).append(gi)
        nodes = []
        for gi, g in enumerate(split.groups):
            loc = g.location(split.cross_at)
            s = self.slices[loc]
            specs = []
            for kind, r in g.outs:
                o = r if kind == "out" else out_of.get(r) if kind == "ref" else None
                sh = None if o is None else layout.out_shardings[o]
                specs.append(sh.spec if isinstance(sh, NamedSharding) and sh.mesh == s.mesh and o not in split.moves else None)
            base = "update:cross" if g.home < 0 else f"update{loc}"
            same = per_home[g.home]
            name = base if len(same) == 1 else f"{base}.{same.index(gi)}"
            donate = self._donations(split, gi, layout.n_params) if self.donate else ()
            nodes.append(CompiledFunction(g.fn, slice=s, in_specs=None, out_specs=tuple(specs), name=name, donate_argnums=donate))
        moves = {}
        for o in split.moves:
            loc = layout.out_at[o]
            sh = layout.out_shardings[o]
            spec = sh.spec if isinstance(sh, NamedSharding) else P()  # (one device's own: the whole value)
            moves[o] = CompiledFunction(lambda a: a, slice=self.slices[loc], in_specs=None, out_specs=spec, name=f"place{loc}")
        layout.nodes, layout.moves = nodes, moves

    @staticmethod
    def _donations(split: Split, gi: int, n_grads: int) -> tuple[int, ...]:
        """Arguments of group ``gi`` whose buffers its results may take: the params, optimizer state and
        gradients it reads last, as many of each shape and dtype as it returns (XLA reuses no more)."""
        flat, groups = split.flat, split.groups
        g = groups[gi]
        later = {r for h in groups[gi + 1 :] for kind, r, *_ in h.ins if kind == "ref"}
        passed = {r for r in flat.outs if isinstance(r, int)}
        free: dict[tuple, int] = {}
        for kind, r in g.outs:
            ref = flat.outs[r] if kind == "out" else r
            if kind != "packed" and isinstance(ref, int):
                a = flat.avals[ref]
                free[(a.shape, a.dtype)] = free.get((a.shape, a.dtype), 0) + 1
        # what the step replaces (params, state) first; the gradients where buffers of their shape remain
        order = sorted(range(len(g.ins)), key=lambda i: g.ins[i][0] != "ref" or g.ins[i][1] < n_grads)
        out = []
        for i in order:
            kind, r = g.ins[i][0], g.ins[i][1]
            if kind != "ref" or r >= flat.n_in or r in later or r in passed:
                continue
            a = flat.avals[r]
            if free.get((a.shape, a.dtype), 0) > 0:
                free[(a.shape, a.dtype)] -= 1
                out.append(i)
        return tuple(sorted(out))


__all__ = ["Layout", "WholeModelOptimizer", "apply_updates", "with_clip"]

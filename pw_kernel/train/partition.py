"""Split one traced function over several slices: a node per slice, small cross-slice nodes between them.

The whole-model optimizer (`optimizer.py`) traces ``tx.update`` once over every
parameter of the model with `jax.make_jaxpr`. This module cuts that jaxpr by
where each input lives, as Pathways runs a program: the equations that read
only one slice's values run there; an equation that combines several slices'
values (a global norm's sum, an all-finite check) is a *cross* equation and
runs in a small node of its own, with the scalars it needs packed into one
transfer per slice; equations that read neither (a step counter, a schedule)
are recomputed wherever they are needed instead of being sent around.

Nested ``jit`` calls and ``custom_jvp``/``custom_vjp`` calls are inlined, and a
``lax.cond`` (optax's ``MultiSteps`` and conditional wrappers branch on a
counter over the whole tree) becomes both branches and a ``select_n`` per
output, so each slice's part of either branch stays on that slice.

Levels order the nodes: an equation's level is the largest of its inputs'
levels, plus one where an input comes from another node. A node is the
equations of one home (a slice, or cross) at one level, so nodes form a DAG
and each runs as soon as what it reads was dispatched.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Literal

R = -1  # home of what reads no slice's value: recomputed where it is needed
CROSS = -2  # home of what combines several slices' values: a small node of its own


@dataclasses.dataclass(frozen=True)
class Const:
    """A literal or a captured constant inside the flattened program."""

    value: Any


@dataclasses.dataclass
class Op:
    """One step of the flattened program: a JAX equation, or a ``select_n`` standing for a ``cond``."""

    eqn: Any  # None for a select
    ins: list  # refs (ints) or Consts
    outs: list[int]


class Flat:
    """A jaxpr flattened into `Op`s over integer refs: inputs are refs ``0..n_in-1``."""

    def __init__(self, closed: Any):
        self.ops: list[Op] = []
        self.avals: list[Any] = []
        jaxpr = closed.jaxpr
        ins = [self._new(v.aval) for v in jaxpr.invars]
        self.n_in = len(ins)
        self.outs = self._inline(jaxpr, [Const(c) for c in closed.consts], ins)

    def _new(self, aval: Any) -> int:
        self.avals.append(aval)
        return len(self.avals) - 1

    def _inline(self, jaxpr: Any, consts: Sequence[Any], ins: Sequence[Any]) -> list:
        env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, ins))

        def read(v):
            return Const(v.val) if isinstance(v, Literal) else env[v]

        for eqn in jaxpr.eqns:
            args = [read(v) for v in eqn.invars]
            inner = _inlinable(eqn)
            if inner is not None:
                outs = self._inline(inner.jaxpr, [Const(c) for c in inner.consts], args)
            elif eqn.primitive.name == "cond" and not eqn.effects:
                # both branches, then pick: each slice's part of a branch stays on that slice
                index, operands = args[0], args[1:]
                results = [self._inline(b.jaxpr, [Const(c) for c in b.consts], operands) for b in eqn.params["branches"]]
                outs = []
                for k, v in enumerate(eqn.outvars):
                    r = self._new(v.aval)
                    self.ops.append(Op(None, [index] + [res[k] for res in results], [r]))
                    outs.append(r)
            else:
                outs = [self._new(v.aval) for v in eqn.outvars]
                self.ops.append(Op(eqn, args, outs))
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in jaxpr.outvars]

    def size(self, ref: Any) -> int:
        if isinstance(ref, Const):
            return int(getattr(ref.value, "size", 1))
        return math.prod(getattr(self.avals[ref], "shape", ()))


def _inlinable(eqn: Any) -> Any | None:
    """The ClosedJaxpr a call equation runs, when replaying it inline means the same (no effects)."""
    if eqn.effects:
        return None
    name = eqn.primitive.name
    if name in ("pjit", "jit"):
        return eqn.params.get("jaxpr")
    if name.startswith(("custom_jvp_call", "custom_vjp_call")):  # no differentiation here: the primal is it
        inner = eqn.params.get("call_jaxpr")
        return inner if hasattr(inner, "jaxpr") and hasattr(inner, "consts") else None
    return None


def _bind(eqn: Any, args: list) -> list:
    bind_params = eqn.primitive.get_bind_params(eqn.params)
    if isinstance(bind_params, tuple):  # (subfuns, params)
        subfuns, bind_params = bind_params
        out = eqn.primitive.bind(*subfuns, *args, **bind_params)
    else:
        out = eqn.primitive.bind(*args, **bind_params)
    return list(out) if eqn.primitive.multiple_results else [out]


def homes(flat: Flat, in_homes: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """Where each op runs and at which level; also each ref's home.

    ``in_homes[i]``: the slice (location index) input i lives on, or `R` for a small
    value that mirrors no slice's values (recomputed where read). Returns (op homes,
    op levels, ref homes).
    """
    n_in = flat.n_in
    ref_home = list(in_homes) + [R] * (len(flat.avals) - n_in)
    ref_level = [0] * len(flat.avals)
    op_home, op_level = [], []
    for op in flat.ops:
        places, cross, heavy = set(), False, False
        for r in op.ins:
            if isinstance(r, Const):
                continue
            h = ref_home[r]
            if h == CROSS:
                cross = True
            elif h != R:
                places.add(h)
                heavy = heavy or r < n_in or flat.size(r) > 1
        if len(places) > 1:
            home = CROSS
        elif places:
            # a scalar of one slice combined with a cross value (the next term of a global sum)
            # stays in the cross node; anything the size of a parameter goes to its slice
            small = not heavy and all(flat.size(o) <= 1 for o in op.outs)
            home = CROSS if cross and small else next(iter(places))
        else:
            home = CROSS if cross else R
        level = 0
        if home != R:
            for r in op.ins:
                if isinstance(r, Const) or r < n_in or ref_home[r] == R:
                    continue
                level = max(level, ref_level[r] + (ref_home[r] != home))
        op_home.append(home)
        op_level.append(level)
        for o in op.outs:
            ref_home[o], ref_level[o] = home, level
    return op_home, op_level, ref_home


@dataclasses.dataclass
class Group:
    """One node of the split program: the ops of one home at one level, and what flows in and out."""

    home: int
    level: int
    ops: list[int]  # op indices, its own and the recomputed ones it needs, in program order
    ins: list  # ("ref", r) or ("packed", refs, (group, result position)) per argument
    outs: list  # ("ref", r), ("out", program output index) or ("packed", refs) per result
    fn: Callable | None = None

    def location(self, cross_at: int) -> int:
        return cross_at if self.home == CROSS else self.home


class Split:
    """The groups of a flattened program for given input homes, in an order they can be called in.

    ``out_at[o]``: the location where program output o must end up. An output made
    at another location is listed in ``moves`` (output index -> where it is made),
    for the caller to move; an output that is an input unchanged is passed through.
    """

    def __init__(self, flat: Flat, in_homes: Sequence[int], out_at: Sequence[int], cross_at: int):
        self.flat = flat
        self.cross_at = cross_at
        op_home, op_level, self.ref_home = homes(flat, in_homes)
        producer = {o: k for k, op in enumerate(flat.ops) for o in op.outs}
        keyed: dict[tuple[int, int], list[int]] = {}
        for k, h in enumerate(op_home):
            if h != R:
                keyed.setdefault((h, op_level[k]), []).append(k)
        # outputs that are constants or recomputed values are made by a node where they go
        extra: dict[tuple[int, int], list[int]] = {}
        for o, r in enumerate(flat.outs):
            if isinstance(r, Const) or (r >= flat.n_in and op_home[producer[r]] == R):
                at = [key for key in keyed if key[0] == out_at[o]]
                key = max(at, key=lambda kk: kk[1]) if at else (out_at[o], 0)
                keyed.setdefault(key, [])
                extra.setdefault(key, []).append(o)
        order = sorted(keyed, key=lambda kk: (kk[1], kk[0] == CROSS, kk[0]))
        self.groups: list[Group] = []
        made_by: dict[int, int] = {}  # ref -> the group that makes it
        self.extra_at: dict[int, tuple[int, int]] = {}  # output index -> (group, result position)
        for key in order:
            own = keyed[key]
            needed = set(own)
            stack = [r for k in own for r in flat.ops[k].ins] + [flat.outs[o] for o in extra.get(key, [])]
            while stack:  # the recomputed ops these read, transitively
                r = stack.pop()
                if isinstance(r, Const) or r < flat.n_in:
                    continue
                k = producer[r]
                if op_home[k] == R and k not in needed:
                    needed.add(k)
                    stack.extend(flat.ops[k].ins)
            gi = len(self.groups)
            g = Group(key[0], key[1], sorted(needed), [], [])
            for o in extra.get(key, []):
                self.extra_at[o] = (gi, len(g.outs))
                g.outs.append(("out", o))
            for k in own:
                for r in flat.ops[k].outs:
                    made_by[r] = gi
            self.groups.append(g)
        self._wire(made_by, out_at)

    def _wire(self, made_by: dict[int, int], out_at: Sequence[int]) -> None:
        """Each group's arguments and results; scalars bound for other slices packed, one vector per dtype."""
        flat, groups, at = self.flat, self.groups, self.cross_at
        reads: list[list[int]] = []
        for g in groups:
            local = {r for k in g.ops for r in flat.ops[k].outs}
            seen: dict[int, None] = {}
            for k in g.ops:
                for r in flat.ops[k].ins:
                    if not isinstance(r, Const) and r not in local:
                        seen[r] = None
            reads.append(list(seen))
        wanted: dict[int, set[int]] = {}  # group -> its refs that others read
        for gi, rs in enumerate(reads):
            for r in rs:
                if r in made_by and made_by[r] != gi:
                    wanted.setdefault(made_by[r], set()).add(r)
        self.moves: dict[int, int] = {}
        program_outs = set()
        for o, r in enumerate(flat.outs):
            if not isinstance(r, Const) and r in made_by:
                program_outs.add(r)
                gi = made_by[r]
                wanted.setdefault(gi, set()).add(r)
                if groups[gi].location(at) != out_at[o]:
                    self.moves[o] = groups[gi].location(at)
        self.result_of: dict[int, tuple[int, int]] = {}  # ref -> (group, result position)
        packed_of: dict[int, tuple[int, int]] = {}
        for gi, g in enumerate(groups):
            here = g.location(at)
            by_dtype: dict[Any, list[int]] = {}
            for r in sorted(wanted.get(gi, ())):
                far = any(r in rs and groups[hj].location(at) != here for hj, rs in enumerate(reads))
                if far and r not in program_outs and flat.size(r) == 1:
                    by_dtype.setdefault(flat.avals[r].dtype, []).append(r)
                else:
                    self.result_of[r] = (gi, len(g.outs))
                    g.outs.append(("ref", r))
            for rs in by_dtype.values():
                for r in rs:
                    packed_of[r] = (gi, len(g.outs))
                g.outs.append(("packed", rs))
        for gi, g in enumerate(groups):
            packs: dict[tuple[int, int], None] = {}
            for r in reads[gi]:
                if r in packed_of:
                    packs[packed_of[r]] = None
                else:
                    g.ins.append(("ref", r))
            for pg, pos in packs:
                g.ins.append(("packed", groups[pg].outs[pos][1], (pg, pos)))
            g.fn = _group_fn(flat, g)

    def argument(self, item: tuple, inputs: Sequence[Any], results: list[tuple]) -> Any:
        """What an argument item stands for: a program input, or an earlier group's result."""
        if item[0] == "packed":
            gi, pos = item[2]
            return results[gi][pos]
        r = item[1]
        if r < self.flat.n_in:
            return inputs[r]
        gi, pos = self.result_of[r]
        return results[gi][pos]

    def output(self, o: int, inputs: Sequence[Any], results: list[tuple]) -> Any:
        """Program output ``o``: made by a group, or an input passed through."""
        if o in self.extra_at:
            gi, pos = self.extra_at[o]
            return results[gi][pos]
        r = self.flat.outs[o]
        if r < self.flat.n_in:
            return inputs[r]
        gi, pos = self.result_of[r]
        return results[gi][pos]

    def run(self, inputs: Sequence[Any], call: Callable[[int, list], tuple]) -> list:
        """Every program output, calling ``call(group index, arguments)`` for each group in order."""
        results: list[tuple] = []
        for gi, g in enumerate(self.groups):
            results.append(tuple(call(gi, [self.argument(item, inputs, results) for item in g.ins])))
        return [self.output(o, inputs, results) for o in range(len(self.flat.outs))]


def _group_fn(flat: Flat, g: Group) -> Callable:
    """A function of the group's arguments that replays its ops and returns its results."""
    ins, outs, ops = list(g.ins), list(g.outs), [flat.ops[k] for k in g.ops]

    def run(*args):
        env: dict[int, Any] = {}
        for item, a in zip(ins, args):
            if item[0] == "ref":
                env[item[1]] = a
            else:
                env.update((r, a[i]) for i, r in enumerate(item[1]))

        def read(r):
            return jnp.asarray(r.value) if isinstance(r, Const) else env[r]

        for op in ops:
            vals = [r.value if isinstance(r, Const) else env[r] for r in op.ins]
            res = [jax.lax.select_n(vals[0], *vals[1:])] if op.eqn is None else _bind(op.eqn, vals)
            env.update(zip(op.outs, res))
        out = []
        for kind, r in outs:
            if kind == "out":
                out.append(read(flat.outs[r]))
            elif kind == "ref":
                out.append(read(r))
            else:
                out.append(jnp.stack([read(x) for x in r]))
        return tuple(out)

    return run


__all__ = ["CROSS", "R", "Flat", "Group", "Split", "homes"]

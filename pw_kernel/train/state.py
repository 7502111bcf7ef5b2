"""A pipeline's state and where it lives: per-stage params, shared copies and optimizer state on the slices.

`PipelineState` is the pytree a pipeline trains. `Placement` puts it on the
stages' slices (`Pipeline.init`): each stage's params on its slice, sharded by
its ``param_specs``; one copy of each shared param per stage that uses it; the
optimizer's state made there, sharded like the params. It also checks that a
state passed to a step still lives where its stages run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ..runtime import CompiledFunction, Program
from .errors import PipelineError
from .optimizer import WholeModelOptimizer
from .stages import Stage, inexact


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PipelineState:
    """What a pipeline trains, placed on its slices: per-stage params, shared params, optimizer state.

    ``params[j]`` lives on stage j's slice; ``shared[name]`` holds one copy per
    stage that uses ``name`` (in stage order, all equal); ``opt_state`` is the
    optimizer's state for the whole model, ``tx.init(params)`` (``tx.init((params,
    shared))`` with shared params) as optax makes it, each leaf on the slice of the
    parameter it mirrors and sharded like it. After `Pipeline.step` every leaf is a
    `pw.Future`.

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
        opt = "none" if self.opt_state is None else "whole model"
        return f"PipelineState({len(self.params)} stages; shared: {shared}; optimizer state: {opt})"


class Placement:
    """Where a pipeline's state lives: puts it on the stages' slices and checks it is still there."""

    def __init__(
        self,
        stages: Sequence[Stage],
        shared_users: Mapping[str, tuple[int, ...]],
        optimizer: WholeModelOptimizer | None,
        *,
        name: str,
        controller: Callable[[], Any],
    ):
        self.stages = stages
        self.shared_users = shared_users
        self.optimizer = optimizer
        self.name = name
        self._controller = controller

    def shared_of(self, state: PipelineState, st: Stage) -> dict:
        """Stage ``st``'s copies of the shared params it uses, by name."""
        return {n: state.shared[n][self.shared_users[n].index(st.index)] for n in st.shared}

    def check_len(self, params: Any) -> None:
        """Raise PipelineError unless ``params`` is a list with one entry per stage."""
        V = len(self.stages)
        if not isinstance(params, (list, tuple)) or len(params) != V:
            n = len(params) if isinstance(params, (list, tuple)) else type(params).__name__
            raise PipelineError(f"`{self.name}`: expected params for {V} stages (a list), got {n}.")

    def init(self, params: Sequence[Any], shared: Mapping[str, Any] | None) -> PipelineState:
        """Place params and shared copies on the slices and make the optimizer state there; see `Pipeline.init`."""
        self.check_len(params)
        shared = dict(shared or {})
        missing, extra = set(self.shared_users) - set(shared), set(shared) - set(self.shared_users)
        if missing or extra:
            raise PipelineError(
                f"`{self.name}.init(shared=...)` needs exactly the shared params declared in `pw.pipeline(shared=...)` "
                f"({sorted(self.shared_users)}); missing {sorted(missing)}, unexpected {sorted(extra)}."
            )
        for j, p in enumerate(params):
            for path, leaf in jax.tree_util.tree_leaves_with_path(p):
                if not inexact(leaf):
                    raise PipelineError(
                        f"`{self.name}.init`: stage {j}'s parameter {jax.tree_util.keystr(path) or 'params'} is "
                        f"{jnp.result_type(leaf)}; parameters are trained, so they must be floating point. Pass "
                        f"integer inputs (token ids, positions) as the batch or as a batch field instead."
                    )
        placed = [self._put(st, p, st.param_spec) for st, p in zip(self.stages, params)]
        copies = {n: tuple(self._put(self.stages[u], shared[n], None) for u in users) for n, users in self.shared_users.items()}
        state = PipelineState(placed, copies, None)
        if self.optimizer is not None:
            state.opt_state = self._init_optimizer(state)
        return state

    def _init_optimizer(self, state: PipelineState) -> Any:
        """The optimizer's state for the whole model, each leaf placed where its parameter lives."""
        for st in self.stages:
            if st.slice.remote:
                raise PipelineError(
                    f"`{self.name}`: an optimizer's state is made eagerly on each slice, which stage {st.index}'s "
                    f"remote slice {st.slice.name!r} does not allow yet. Use plain SGD (no optimizer=) there."
                )
        return self.optimizer.init(self.optimizer.whole(state.params, self.owned(state)))

    def owned(self, state: PipelineState) -> dict:
        """Each shared param's first copy: the one on its first user's slice, which the optimizer updates."""
        return {n: copies[0] for n, copies in state.shared.items()}

    def abstract(self, params: Sequence[Any], shared: Mapping[str, Any] | None) -> PipelineState:
        """Params and shared copies of these shapes as ShapeDtypeStructs on the stages' slices (no optimizer state)."""

        def on(st, tree, spec):
            def one(a, sp=None):
                return jax.ShapeDtypeStruct(tuple(a.shape), a.dtype, sharding=st.slice.sharding(sp or P()))

            if spec is None or isinstance(spec, P):
                return jax.tree_util.tree_map(lambda a: one(a, spec), tree)
            return jax.tree_util.tree_map(one, tree, spec, is_leaf=lambda v: v is None or isinstance(v, P))

        shared = dict(shared or {})
        p_abs = [on(st, p, st.param_spec) for st, p in zip(self.stages, params)]
        copies = {n: tuple(on(self.stages[u], shared[n], None) for u in users) for n, users in self.shared_users.items()}
        return PipelineState(p_abs, copies, None)

    def _put(self, st: Stage, p: Any, spec: Any) -> Any:
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

    def check(self, state: PipelineState) -> None:
        """Raise PipelineError unless every stage's params (and shared copies) live on that stage's slice."""
        self.check_len(state.params)
        for st in self.stages:
            trees = [("params", state.params[st.index])] + [(f"shared {n!r}", v) for n, v in self.shared_of(state, st).items()]
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


__all__ = ["PipelineState", "Placement"]

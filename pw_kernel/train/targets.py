"""Where a `pw.prefetch` batch goes: over a slice's data axis, as a sharding says, or to a pipeline's stages.

A `BatchTarget` turns a host batch (a pytree of numpy arrays) into the same
pytree placed on devices: each leaf split over the target's data axis (a
slice), placed with the given sharding, or, for a pipeline, its inputs and
fields on the slices of the stages that read them and its targets on the last
stage's slice. It checks that every leaf fits its sharding first and says which
axis and which sizes would. Slices on a remote island get their leaves from the
host through the island's actor (an identity node there, as `pipe.init` places
parameters), never through local devices.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P, Sharding

from ..runtime import VirtualSlice, compiled, controller, slice as make_slice
from .errors import PrefetchError

AUTO = "auto"  # the default data axis: "data" when the slice has one, else its first axis


@dataclasses.dataclass(frozen=True)
class Part:
    """The leaves of a batch that go to one mesh: their positions in the flat batch and their shardings."""

    slice: VirtualSlice | None  # None: a mesh of the notebook's own that no pw slice covers
    leaves: tuple[int, ...]
    shardings: tuple[NamedSharding, ...]

    @property
    def remote(self) -> bool:
        return self.slice is not None and self.slice.remote

    @property
    def island(self) -> int | None:
        """The island its devices belong to (where the timeline draws its transfer)."""
        if self.slice is not None:
            return self.slice.island.id
        dev = next(iter(self.shardings[0].device_set))
        return next((i.id for i in controller().islands if dev in i.devices), None)

    @property
    def where(self) -> str:
        return self.slice.name if self.slice is not None else f"mesh {dict(self.shardings[0].mesh.shape)}"

    def program_slice(self) -> VirtualSlice:
        """The pw slice an input node of these leaves runs on (the notebook's mesh is adopted as one)."""
        return self.slice if self.slice is not None else make_slice(mesh=self.shardings[0].mesh)


class BatchTarget:
    """How batches are placed for one `pw.prefetch`: per leaf a sharding, grouped by the slice it lands on."""

    def __init__(self, to: Any, axis: str | None = AUTO):
        self.to = to
        self.axis = axis
        self.multiple = int(getattr(to, "M", 1)) if is_pipeline(to) else 1  # a pipeline cuts M microbatches
        self._plans: dict[Any, tuple[list[Part], list[NamedSharding]]] = {}
        self._put: dict[Any, Any] = {}  # (slice id, specs) -> identity node placing leaves on a remote slice
        self.describe = _describe(to)
        if not (isinstance(to, (VirtualSlice, Sharding)) or is_pipeline(to) or _is_sharding_tree(to)):
            raise PrefetchError(
                f"`pw.prefetch(to=...)` takes a slice (`pw.slice(...)`), a `jax.sharding.NamedSharding` (or a "
                f"pytree of them matching the batch) or a pipeline (`pw.pipeline(...)`); got {to!r}."
            )
        if isinstance(to, VirtualSlice):
            self.axis = _data_axis(to, axis)

    # ------------------------------------------------------------------ where each leaf goes
    def plan(self, batch: Any) -> tuple[list[Any], Any, list[Part], list[NamedSharding]]:
        """(flat leaves, treedef, parts by slice, sharding per leaf) of ``batch``."""
        leaves, treedef = jax.tree_util.tree_flatten(batch)
        shapes = tuple(np.shape(x) for x in leaves)
        key = (treedef, shapes)
        hit = self._plans.get(key)
        if hit is None:
            shardings = self._shardings(batch, treedef, shapes)
            by_slice: dict[Any, tuple[VirtualSlice | None, list[int]]] = {}
            for i, sh in enumerate(shardings):
                s = self._slice_of(sh)
                by_slice.setdefault(id(s) if s is not None else sh.mesh, (s, []))[1].append(i)
            parts = [Part(s, tuple(ix), tuple(shardings[i] for i in ix)) for s, ix in by_slice.values()]
            hit = self._plans[key] = (parts, shardings)
        return leaves, treedef, *hit

    def _shardings(self, batch: Any, treedef: Any, shapes: tuple) -> list[NamedSharding]:
        to = self.to
        if isinstance(to, VirtualSlice):
            return [_on(to, P(self.axis) if self.axis else P(), shape) for shape in shapes]
        if isinstance(to, Sharding):
            return [_named(to) for _ in shapes]
        if is_pipeline(to):
            return self._pipeline_shardings(batch, treedef, shapes)
        try:  # a pytree of shardings, a prefix of the batch's structure
            full = jax.tree_util.tree_map(
                lambda sh, sub: jax.tree_util.tree_map(lambda _: sh, sub), to, batch,
                is_leaf=lambda x: isinstance(x, Sharding),
            )
        except (ValueError, TypeError) as e:
            raise PrefetchError(
                f"`pw.prefetch(to=...)`: the shardings' structure {jax.tree_util.tree_structure(to, is_leaf=_is_sh)} "
                f"does not match the batch's {treedef}: {e}. Give one sharding per part of the batch, or one for all."
            ) from None
        return [_named(sh) for sh in jax.tree_util.tree_leaves(full, is_leaf=_is_sh)]

    def _pipeline_shardings(self, batch: Any, treedef: Any, shapes: tuple) -> list[NamedSharding]:
        """x (and fields) where the stages that read them run, targets and weights on the last stage's slice."""
        where = self.to.batch_placement()
        if isinstance(batch, Mapping):
            names = {"x": "x", "inputs": "x", "y": "y", "targets": "y", "weights": "weights"}
            fields = where["fields"]
            unknown = [k for k in batch if k not in names and k not in fields]
            if unknown:
                raise PrefetchError(
                    f"`pw.prefetch(to={self.describe})`: the batch has keys {unknown}, which the pipeline neither "
                    f"takes (x, y, weights) nor declares as fields ({sorted(fields)}). Declare them with "
                    f"`pw.pipeline(fields=...)`, or drop them from the batch."
                )
            role = {k: where[names[k]] if k in names else fields[k] for k in batch}
            spec_tree = {k: role[k] for k in batch}
        elif isinstance(batch, (tuple, list)) and 2 <= len(batch) <= 3:
            spec_tree = type(batch)([where["x"], where["y"], where["weights"]][: len(batch)])
        else:
            raise PrefetchError(
                f"`pw.prefetch(to={self.describe})` needs batches a step takes: (x, y), (x, y, weights) or a dict "
                f"with 'x', 'y' and declared fields; got a {type(batch).__name__}."
            )
        per_leaf = jax.tree_util.tree_map(
            lambda sp, sub: jax.tree_util.tree_map(lambda _: sp, sub), spec_tree, batch,
            is_leaf=lambda v: isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], VirtualSlice),
        )
        pairs = jax.tree_util.tree_leaves(per_leaf, is_leaf=lambda v: isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], VirtualSlice))
        return [_on(s, spec, shape) for (s, spec), shape in zip(pairs, shapes)]

    def _slice_of(self, sh: NamedSharding) -> VirtualSlice | None:
        """The pw slice whose mesh a sharding is on, if any."""
        if isinstance(self.to, VirtualSlice):
            return self.to
        if is_pipeline(self.to):
            for s, _ in (v for k, v in self.to.batch_placement().items() if k != "fields"):
                if s.mesh == sh.mesh:
                    return s
            for s, _ in self.to.batch_placement()["fields"].values():
                if s.mesh == sh.mesh:
                    return s
        for s in controller().resources.slices:
            if not s.released and s.mesh == sh.mesh:
                return s
        return None

    # ------------------------------------------------------------------ placing
    def check(self, leaves: list[Any], shardings: list[NamedSharding], treedef: Any, k: int) -> None:
        """Raise PrefetchError unless every leaf splits evenly as its sharding says."""
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(jax.tree_util.tree_unflatten(treedef, leaves))[0]]
        for leaf, sh, path in zip(leaves, shardings, paths):
            shape = np.shape(leaf)
            spec = tuple(sh.spec)
            if len(spec) > len(shape):
                raise PrefetchError(
                    f"`pw.prefetch(to={self.describe})`: batch {k}: {what(path)} has shape {shape} (rank "
                    f"{len(shape)}), but its sharding {sh.spec} splits {len(spec)} axes. Give it a leading batch axis."
                )
            for dim, entry in enumerate(spec):
                if entry is None:
                    continue
                axes = entry if isinstance(entry, tuple) else (entry,)
                size = math.prod(sh.mesh.shape[a] for a in axes)
                need = size * (self.multiple if dim == 0 else 1)
                if shape[dim] % need:
                    lo = max(need, shape[dim] // need * need)
                    why = f"{self.multiple} microbatches x " if need != size else ""
                    fix = f"Batch to such a size (grain: `.batch({lo}, drop_remainder=True)`)" if dim == 0 else "Reshape it"
                    raise PrefetchError(
                        f"`pw.prefetch(to={self.describe})`: batch {k}: {what(path)} has shape {shape}; its axis "
                        f"{dim} ({shape[dim]}) does not split over {why}mesh axis {'/'.join(axes)!r} ({size} "
                        f"devices). Sizes that would: multiples of {need}, e.g. {lo} or {lo + need}. {fix}, or "
                        f"place it elsewhere with `to=`."
                    )

    def place(self, leaves: list[Any], parts: list[Part]) -> list[Any]:
        """The leaves on their devices: `jax.device_put` here, an identity node on a remote island."""
        out: list[Any] = [None] * len(leaves)
        for part in parts:
            host = [leaves[i] for i in part.leaves]
            if part.remote:
                placed = self._remote_put(part)(host)
                placed = list(placed) if isinstance(placed, (list, tuple)) else [placed]
            else:
                placed = jax.device_put(host, list(part.shardings))
            for i, a in zip(part.leaves, placed):
                out[i] = a
        return out

    def _remote_put(self, part: Part):
        """An identity node on the remote slice: the host's leaves go to the island's actor directly."""
        specs = tuple(sh.spec for sh in part.shardings)
        key = (id(part.slice), specs)
        fn = self._put.get(key)
        if fn is None:
            fn = self._put[key] = compiled(
                lambda xs: list(xs), slice=part.slice, in_specs=(list(specs),), out_specs=list(specs), name="place batch",
            )
        return fn


def what(path: str) -> str:
    """A leaf's name in messages: ``leaf [0]['tokens']``, or the batch itself."""
    return f"leaf {path}" if path else "the batch"


def is_pipeline(x: Any) -> bool:
    """Whether ``x`` is a `pw.Pipeline` (known by what it does: this module is below pipeline.py)."""
    return callable(getattr(x, "batch_placement", None))


def _is_sh(x: Any) -> bool:
    return isinstance(x, Sharding)


def _is_sharding_tree(x: Any) -> bool:
    leaves = jax.tree_util.tree_leaves(x, is_leaf=_is_sh)
    return bool(leaves) and all(isinstance(v, Sharding) for v in leaves)


def _named(sh: Sharding) -> NamedSharding:
    if not isinstance(sh, NamedSharding):
        raise PrefetchError(
            f"`pw.prefetch(to=...)` places with a `jax.sharding.NamedSharding` (a mesh and a PartitionSpec); got "
            f"{type(sh).__name__}. Use `s.sharding('data')` of a slice, or `NamedSharding(mesh, P('data'))`."
        )
    return sh


def _on(s: VirtualSlice, spec: P, shape: tuple) -> NamedSharding:
    """``spec`` on slice ``s`` for a leaf of ``shape``: a scalar is replicated, a longer spec cut to its rank."""
    entries = tuple(spec)[: len(shape)]
    return NamedSharding(s.mesh, P(*entries))


def _data_axis(s: VirtualSlice, axis: str | None) -> str | None:
    if axis is None:
        return None
    if axis == AUTO:
        return "data" if "data" in s.axis_names else s.axis_names[0]
    if axis not in s.axis_names:
        raise PrefetchError(
            f"`pw.prefetch(axis={axis!r})`: slice {s.name!r} has axes {s.axis_names}; split the batch over one of "
            f"those, or pass axis=None to replicate it."
        )
    return axis


def _describe(to: Any) -> str:
    if isinstance(to, VirtualSlice):
        return f"slice {to.name!r}"
    if is_pipeline(to):
        return f"pipeline {getattr(to, 'name', '?')!r}"
    if isinstance(to, NamedSharding):
        return f"NamedSharding({to.spec}, mesh {dict(to.mesh.shape)})"
    return type(to).__name__


def placed_nbytes(leaves: list[Any]) -> int:
    """Bytes of a batch's host leaves."""
    return int(sum(np.asarray(x).nbytes if not hasattr(x, "nbytes") else x.nbytes for x in leaves))


__all__ = ["AUTO", "BatchTarget", "Part", "placed_nbytes"]

"""ProgramGraph: the dataflow DAG of a traced program, known before anything runs.

Nodes are compiled-function calls, glue (plain jnp ops placed on a slice) and
transfers (values moving between slices). Every value carries shape, dtype and
sharding; edges are values flowing from a producer to a consumer. The
pictures (`to_dot`, the SVG and HTML reprs) are drawn by `pw_kernel.widgets.graph`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Literal

import numpy as np
from jax.sharding import NamedSharding, Sharding

from .devices import Island, VirtualSlice

Shape = tuple[int, ...]
NodeKind = Literal["compute", "glue", "transfer"]
ValueOrigin = Literal["input", "const", "node"]


def describe_sharding(sharding: Sharding | None) -> str:
    """A short human string for a sharding: ``P('data', None) on a`` style."""
    if sharding is None:
        return "host"
    if isinstance(sharding, NamedSharding):
        spec = ", ".join(repr(s) for s in sharding.spec)
        return f"P({spec}) on {dict(sharding.mesh.shape)}"
    ids = sorted(d.id for d in sharding.device_set)
    return f"{type(sharding).__name__}{ids}"


@dataclasses.dataclass(frozen=True, eq=False)
class Value:
    """One array flowing through the program: shape, dtype and sharding before it exists."""

    id: int
    shape: Shape
    dtype: np.dtype
    sharding: Sharding | None  # None: a host (numpy) value not yet on any device
    origin: ValueOrigin
    producer: int | None = None  # node id when origin == "node"
    slice: VirtualSlice | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def type_str(self) -> str:
        """``f32[2,4]`` style, as in jaxprs."""
        return f"{np.dtype(self.dtype).name}[{','.join(map(str, self.shape))}]"


@dataclasses.dataclass(eq=False)
class Node:
    """A unit of scheduling: runs on one slice's devices (a transfer: from one slice to another)."""

    id: int
    name: str
    kind: NodeKind
    slice: VirtualSlice | None
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    fn: Any = dataclasses.field(repr=False, default=None)  # flat arrays -> list of arrays
    src_slice: VirtualSlice | None = None  # transfers only; None means from the host
    primitives: tuple[str, ...] = ()  # glue: the jnp ops it fuses
    source: tuple[str, int] | None = None  # (file, line) of the user code that made it
    stack: tuple[tuple[str, int], ...] = ()  # every user frame, innermost first
    host_callbacks: bool = False  # runs Python host callbacks (XLA:CPU runs those on the dispatching thread)

    @property
    def island(self) -> Island | None:
        return self.slice.island if self.slice is not None else None

    @property
    def devices(self) -> tuple:
        devs = tuple(self.slice.devices) if self.slice is not None else ()
        if self.src_slice is not None:
            devs = tuple(dict.fromkeys(self.src_slice.devices + devs))
        return devs

    @property
    def cross_island(self) -> bool:
        return (
            self.kind == "transfer"
            and self.src_slice is not None
            and self.slice is not None
            and self.src_slice.island.id != self.slice.island.id
        )


@dataclasses.dataclass(frozen=True)
class Edge:
    """A value flowing from ``src`` (node id, or None for a program input) to node ``dst``."""

    src: int | None
    dst: int
    value: Value

    @property
    def shape(self) -> Shape:
        return self.value.shape

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype

    @property
    def sharding(self) -> Sharding | None:
        return self.value.sharding


class ProgramGraph:
    """The traced dataflow DAG of one program for one input signature.

    Example::

        g = step.trace(x)
        [n.name for n in g.nodes]      # ['a', 'b', 'c', 'a:1']
        g.to_dot()                     # graphviz source
    """

    def __init__(
        self,
        name: str,
        nodes: list[Node],
        values: list[Value],
        inputs: tuple[int, ...],
        outputs: tuple[int, ...],
        out_tree: Any,
        consts: dict[int, Any],
        jaxpr: Any,
        default_slice: VirtualSlice | None,
    ):
        self.name = name
        self.nodes = nodes
        self.values = values
        self.inputs = inputs
        self.outputs = outputs
        self.out_tree = out_tree
        self.consts = consts
        self.jaxpr = jaxpr  # JAX's own ClosedJaxpr of the whole program
        self.default_slice = default_slice
        self._plans: dict[str, Any] = {}

    @property
    def edges(self) -> list[Edge]:
        out = []
        for node in self.nodes:
            for vid in node.inputs:
                v = self.values[vid]
                out.append(Edge(v.producer, node.id, v))
        return out

    @functools.cached_property
    def slices(self) -> tuple[VirtualSlice, ...]:
        """The slices the program's nodes run on, in order of first use."""
        seen: dict[int, VirtualSlice] = {}
        for n in self.nodes:
            for s in (n.src_slice, n.slice):
                if s is not None:
                    seen.setdefault(id(s), s)
        return tuple(seen.values())

    def kinds(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.kind] = counts.get(n.kind, 0) + 1
        return counts

    def to_dot(self) -> str:
        """Graphviz source: nodes coloured by slice, transfers as diamonds, edges labelled with shape and dtype."""
        from ..widgets.graph import graph_dot  # the runtime holds data; the views draw it (no notebook stack needed)

        return graph_dot(self)

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {kind}" for kind, k in self.kinds().items())
        slices = ", ".join(s.name for s in self.slices)
        return f"ProgramGraph {self.name!r}: {len(self.nodes)} nodes ({kinds}) on slices [{slices}]"

    def __repr__(self) -> str:
        lines = [self.summary()]
        for n in self.nodes:
            ins = ", ".join(self.values[i].type_str for i in n.inputs)
            outs = ", ".join(self.values[i].type_str for i in n.outputs)
            where = n.slice.name if n.slice is not None else "?"
            at = "" if n.kind == "transfer" else f" [{where}]"
            lines.append(f"  {n.id:3d} {n.kind:8s} {n.name}{at} ({ins}) -> ({outs})")
        return "\n".join(lines)

    def _repr_svg_(self) -> str | None:
        from ..widgets.graph import repr_svg  # graphviz `dot` in a subprocess; None without it

        return repr_svg(self)

    def _repr_html_(self) -> str:
        from ..widgets.graph import graph_html  # summary + inline SVG, or the install hint + DOT source

        return graph_html(self)

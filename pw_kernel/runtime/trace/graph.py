"""ProgramGraph: the dataflow DAG of a traced program, known before anything runs.

Nodes are compiled-function calls, glue (plain jnp ops placed on a slice) and
transfers (values moving between slices). Every value carries shape, dtype and
sharding; edges are values flowing from a producer to a consumer; outputs
carry the names the program returns them as (`ProgramGraph.output_names`).
The pictures (`to_dot`, the SVG and HTML reprs, the notebook widget) are drawn
by `pw_kernel.widgets.graph`, imported only when a picture is asked for.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, Literal

import jax
import numpy as np
from jax.sharding import NamedSharding, Sharding

from ..devices import Island, VirtualSlice
from .names import program_output_names

Shape = tuple[int, ...]
NodeKind = Literal["compute", "glue", "transfer", "input"]  # input: a batch taken from a feed at run time
ValueOrigin = Literal["input", "const", "node"]


def as_dtype(dtype: Any) -> Any:
    """``np.dtype(dtype)``, except that JAX's extended dtypes (typed PRNG keys, ``key<fry>``) pass as they are.

    Example: ``as_dtype("float32")`` is ``np.dtype("float32")``; ``as_dtype(jax.random.key(0).dtype)`` is ``key<fry>``.
    """
    try:
        return _DTYPES[dtype]
    except (KeyError, TypeError):  # not seen yet, or not hashable
        pass
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        out = dtype  # numpy cannot interpret it; it knows its own itemsize and name
    else:
        out = np.dtype(dtype)
    try:
        _DTYPES[dtype] = out
    except TypeError:
        pass
    return out


#: dtypes seen by `as_dtype` (every value of every traced program asks: `issubdtype` is slow).
_DTYPES: dict[Any, Any] = {}


@functools.lru_cache(maxsize=4096)
def _type_str(dtype: Any, shape: Shape) -> str:
    return f"{dtype.name}[{','.join(map(str, shape))}]"


def nbytes_of(shape: Sequence[int], dtype: Any) -> int:
    """Bytes of an array of this shape and dtype (a typed key counts its key data)."""
    return math.prod(shape) * as_dtype(dtype).itemsize


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
    dtype: Any  # an np.dtype, or a JAX extended dtype (typed PRNG keys)
    sharding: Sharding | None  # None: a host (numpy) value not yet on any device
    origin: ValueOrigin
    producer: int | None = None  # node id when origin == "node"
    slice: VirtualSlice | None = None

    @property
    def nbytes(self) -> int:
        return nbytes_of(self.shape, self.dtype)

    @property
    def type_str(self) -> str:
        """``f32[2,4]`` style, as in jaxprs."""
        try:
            return _type_str(self.dtype, self.shape)
        except TypeError:  # an unhashable dtype
            return f"{self.dtype.name}[{','.join(map(str, self.shape))}]"


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
    donated: tuple[int, ...] = ()  # positions in ``inputs`` whose buffers its outputs may reuse (donate_argnums)

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

    @functools.cached_property
    def output_names(self) -> tuple[str, ...]:
        """A name per (flat) output, for pictures: what the program returns it as.

        ``return y, z`` gives ``('y', 'z')`` (the names in the function's return
        statement, read from its source); a returned dict or dataclass gives its
        keys or fields (``('loss', "params['w']")``); anything else
        ``output 0``, ``output 1``, ...
        """
        return program_output_names(self.out_tree, len(self.outputs), self.jaxpr)

    @property
    def edges(self) -> list[Edge]:
        out = []
        for node in self.nodes:
            for vid in node.inputs:
                v = self.values[vid]
                out.append(Edge(v.producer, node.id, v))
        return out

    @functools.cached_property
    def output_values(self) -> tuple[Value, ...]:
        """The `Value` of each (flat) output: what a run's futures are made from, once per graph."""
        return tuple(self.values[v] for v in self.outputs)

    @functools.cached_property
    def one_leaf(self) -> bool:
        """Whether the program returns one array, not a tree (most calls): its output is its one future."""
        return self.out_tree == jax.tree_util.tree_structure(0)

    @functools.cached_property
    def donated_inputs(self) -> dict[int, str]:
        """Program input position -> the node that donates it (`pw.compiled(donate_argnums=...)`)."""
        pos = {vid: i for i, vid in enumerate(self.inputs)}
        out: dict[int, str] = {}
        for n in self.nodes:
            for p in n.donated:
                if n.inputs[p] in pos:
                    out.setdefault(pos[n.inputs[p]], n.name)
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

"""ProgramGraph: the dataflow DAG of a traced program, known before anything runs.

Nodes are compiled-function calls, glue (plain jnp ops placed on a slice) and
transfers (values moving between slices). Every value carries shape, dtype and
sharding; edges are values flowing from a producer to a consumer.
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


#: Slice colours, shared by the graph and the widgets (a colour per slice, in order of first use).
SLICE_PALETTE = ("#8ecae6", "#ffb703", "#90be6d", "#f4a3c0", "#b8a1e3", "#f9844a", "#4cc9f0", "#d9d9d9")
CROSS_ISLAND_COLOUR = "#d62828"


def _q(text: str) -> str:
    """A DOT quoted string holding ``text`` literally (no graphviz escape such as ``\\n`` survives)."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _lines(*parts: str) -> str:
    """A quoted multi-line DOT label: each part escaped, joined by graphviz's own line break."""
    return '"' + "\\n".join(_q(p)[1:-1] for p in parts) + '"'


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _slice_desc(s: VirtualSlice | None) -> str:
    if s is None:
        return "host"
    mesh = " x ".join(f"{k}={v}" for k, v in dict(s.mesh.shape).items())
    ids = ",".join(str(d.id) for d in s.devices)
    return f"slice {s.name} ({mesh}; devices {ids}; island {s.island.id})"


def _value_desc(v: Value) -> str:
    return f"{v.type_str} {describe_sharding(v.sharding)}"



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
        """Graphviz source: nodes coloured by slice, transfers as diamonds (cross-island ones red),
        edges labelled with shape and dtype, tooltips with shardings, devices and source lines."""
        fill = {id(s): SLICE_PALETTE[k % len(SLICE_PALETTE)] for k, s in enumerate(self.slices)}
        values = self.values
        out = [
            f"digraph {_q(self.name)} {{",
            '  rankdir=TB; bgcolor="#ffffff"; nodesep=0.3; ranksep=0.35;',
            '  node [fontname="Helvetica", fontsize=11, style=filled, penwidth=1];',
            '  edge [fontname="Helvetica", fontsize=9, color="#555555", fontcolor="#333333"];',
        ]
        for k, vid in enumerate(self.inputs):
            v = values[vid]
            out.append(
                f'  in{vid} [label={_q(f"input {k}: {v.type_str}")}, shape=plaintext, style="", '
                f"tooltip={_q(_value_desc(v))}];"
            )
        for n in self.nodes:
            ins = ", ".join(values[i].type_str for i in n.inputs)
            outs = ", ".join(values[i].type_str for i in n.outputs)
            where = f"\nsource: {n.source[0]}, line {n.source[1]}" if n.source else ""
            if n.kind == "transfer":
                src = n.src_slice.name if n.src_slice is not None else "host"
                dst = n.slice.name if n.slice is not None else "host"
                cross = n.cross_island
                label = _lines(f"{src} → {dst}", "cross-island") if cross else _q(f"{src} → {dst}")
                nbytes = sum(values[i].nbytes for i in n.outputs)
                tip = (
                    f"{n.name}: transfer{' across islands' if cross else ''}, {_fmt_bytes(nbytes)}\n"
                    f"from {_slice_desc(n.src_slice)}\nto {_slice_desc(n.slice)}\n{ins} -> {outs}{where}"
                )
                colour = CROSS_ISLAND_COLOUR if cross else "#555555"
                out.append(
                    f'  n{n.id} [label={label}, shape=diamond, fillcolor="#f2f2f2", color={_q(colour)}, '
                    f"penwidth={2 if cross else 1}, tooltip={_q(tip)}];"
                )
                continue
            slice_name = n.slice.name if n.slice is not None else "?"
            colour = fill.get(id(n.slice), "#ffffff")
            label = _lines(n.name, f"[{slice_name}]")
            if n.kind == "glue":
                tip = f"glue on {_slice_desc(n.slice)}\nops: {', '.join(n.primitives[:8])}\n{ins} -> {outs}{where}"
                shape = 'shape=box, style="rounded,filled"'
            else:
                tip = f"{n.name}: compiled function on {_slice_desc(n.slice)}\n{ins} -> {outs}{where}"
                shape = "shape=box"
            out.append(f"  n{n.id} [label={label}, {shape}, fillcolor={_q(colour)}, tooltip={_q(tip)}];")
        for node in self.nodes:
            for vid in node.inputs:
                v = values[vid]
                if v.origin == "const":
                    continue
                src = f"in{vid}" if v.producer is None else f"n{v.producer}"
                out.append(f"  {src} -> n{node.id} [label={_q(v.type_str)}, tooltip={_q(_value_desc(v))}];")
        for k, vid in enumerate(self.outputs):
            v = values[vid]
            out.append(
                f'  out{k} [label={_q(f"output {k}: {v.type_str}")}, shape=plaintext, style="", '
                f"tooltip={_q(_value_desc(v))}];"
            )
            if v.origin != "const":
                src = f"in{vid}" if v.producer is None else f"n{v.producer}"
                out.append(f"  {src} -> out{k} [label={_q(v.type_str)}];")
        out.append("}")
        return "\n".join(out)

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

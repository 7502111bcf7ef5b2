"""The program graph as graphviz DOT source, written from the graph's public structure.

`graph_dot` writes the picture from the graph's nodes, values, slices and
output names:

* every slice is a box (a DOT cluster) labelled with its name, mesh and
  devices; its compute nodes (boxes) and glue (rounded boxes) sit inside,
  filled with the slice's colour; transfers (diamonds, cross-island ones
  outlined red) sit between the boxes;
* a pipeline (the same compiled functions called once per microbatch on two
  or more slices, see `pipeline_rows`) is drawn as a grid: one row per slice,
  top to bottom in stage order, each row in the order its nodes are
  dispatched, so microbatches run left to right and the picture reads like
  the schedule;
* edges are labelled with shape and dtype; inputs and outputs carry the
  names the program gives them (`ProgramGraph.output_names`); hover tooltips
  hold shardings, devices and the user's source line.

Every user string is escaped for DOT (`quote`; graphviz escapes it again for
SVG). Laying the source out is `pw_kernel.widgets.graph`'s job.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any

from ..runtime.extend import describe_sharding
from ._html import CROSS_ISLAND, SLICE_PALETTE, fmt_bytes

FONT_SIZE = 12  # points, at zoom 1; the views never shrink a graph below what keeps this readable


def quote(text: str) -> str:
    """A DOT quoted string holding ``text`` literally (no graphviz escape such as ``\\n`` survives)."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _lines(*parts: str) -> str:
    """A quoted multi-line DOT label: each part escaped, joined by graphviz's own line break."""
    return '"' + "\\n".join(quote(p)[1:-1] for p in parts) + '"'


def _mesh_desc(s: Any) -> str:
    return " x ".join(f"{k}={v}" for k, v in dict(s.mesh.shape).items())


def _slice_desc(s: Any) -> str:
    if s is None:
        return "host"
    ids = ",".join(str(d.id) for d in s.devices)
    return f"slice {s.name} ({_mesh_desc(s)}; devices {ids}; island {s.island.id})"


def _value_desc(v: Any) -> str:
    return f"{v.type_str} {describe_sharding(v.sharding)}"


def _tint(colour: str, amount: float = 0.86) -> str:
    """``colour`` (#rrggbb) mixed with white: the background of its slice's box."""
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in rgb)


_CALL_SUFFIX = re.compile(r":\d+$")  # tracing names the k-th call of `f` "f:k"


@dataclasses.dataclass(frozen=True)
class PipelineRows:
    """How a pipeline graph is drawn: its slices as rows, top to bottom, each row's node ids in dispatch order."""

    slices: tuple[Any, ...]
    rows: tuple[tuple[int, ...], ...]
    microbatches: int  # the most calls of one function on one slice


@dataclasses.dataclass(frozen=True)
class Arc:
    """An edge `graph.graph_svg` draws itself, above a pipeline row: DOT ids of its ends, its tooltip."""

    src: str
    dst: str
    tip: str
    faint: bool  # a parameter read: lighter


def pipeline_rows(graph: Any) -> PipelineRows | None:
    """The rows of a pipeline's grid, or None when the graph is not a pipeline.

    A pipeline, in graph terms: on at least two slices, one compiled function
    is called several times on *independent* data (no call feeds the next, as
    microbatches do not), e.g. ``F0, F0:1`` on one slice and ``F1, F1:1`` on
    another. A chain that calls the same functions in turn (each call feeding
    the next) is not one, nor is a program on one slice. Rows are ordered by
    the slices' first such call (stage order); within a row, nodes keep the
    order the controller dispatches them in.
    """
    nodes = [n for n in graph.nodes if n.kind != "transfer" and n.slice is not None]
    if len(nodes) < 4:
        return None
    by_family: dict[tuple[str, int], list[int]] = {}
    for n in nodes:
        by_family.setdefault((_CALL_SUFFIX.sub("", n.name), id(n.slice)), []).append(n.id)
    repeated = {k: ids for k, ids in by_family.items() if len(ids) >= 2}
    if len({slice_id for _, slice_id in repeated}) < 2:
        return None
    ancestors = _ancestors(graph)
    first_stream: dict[int, int] = {}  # slice id -> node id of its first independent repeated call
    most = 1
    for (_, slice_id), ids in repeated.items():
        if any(ancestors[a] >> b & 1 for a, b in zip(ids[1:], ids)):  # some call feeds the next: a chain
            continue
        first_stream[slice_id] = min(first_stream.get(slice_id, ids[0]), ids[0])
        most = max(most, len(ids))
    if len(first_stream) < 2:
        return None
    by_slice: dict[int, list[int]] = {}
    slice_of: dict[int, Any] = {}
    for n in nodes:
        by_slice.setdefault(id(n.slice), []).append(n.id)
        slice_of[id(n.slice)] = n.slice
    order = sorted(by_slice, key=lambda k: (k not in first_stream, first_stream.get(k, by_slice[k][0])))
    return PipelineRows(tuple(slice_of[k] for k in order), tuple(tuple(by_slice[k]) for k in order), most)


def _ancestors(graph: Any) -> list[int]:
    """Per node id, a bitset (a Python int) of the node ids it depends on (nodes are in topological order)."""
    values = graph.values
    out: list[int] = [0] * len(graph.nodes)
    for n in graph.nodes:
        acc = 0
        for vid in n.inputs:
            p = values[vid].producer
            if p is not None:
                acc |= out[p] | (1 << p)
        out[n.id] = acc
    return out


def graph_dot(graph: Any) -> str:
    """Graphviz source of a ProgramGraph (what `ProgramGraph.to_dot` returns).

    A box per slice around its nodes (coloured by slice), transfers as
    diamonds between them (cross-island ones red), edges labelled with shape
    and dtype, inputs and outputs with their names, tooltips with shardings,
    devices and source lines; a pipeline as a grid of slices x microbatches
    (`pipeline_rows`), whose edges keep shape and dtype in their tooltips.

    Example::

        print(graph_dot(step.trace(x)))    # digraph "step" { ... }
    """
    return write_dot(graph, pipeline_rows(graph), posts=True)


@dataclasses.dataclass
class _Dot:
    """What the pieces of one DOT source share: the graph, its grid (or None), and where each node is drawn."""

    graph: Any
    grid: PipelineRows | None
    fill: dict[int, str]  # id() of a slice -> its colour
    home: dict[str, int] = dataclasses.field(default_factory=dict)  # DOT node -> id() of the slice box it is in
    neighbours: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # consecutive in a grid's row


def write_dot(graph: Any, grid: PipelineRows | None, posts: bool, arcs: list[Arc] | None = None) -> str:
    """`graph_dot`'s body, with the hints `graph.graph_svg` varies when a grid's rows come out of order.

    In a grid: ``posts`` hints the rows' order with one invisible post per row;
    a list ``arcs`` takes the edges that stay inside one row without joining
    neighbours in it (a stage's parameters, activations kept for the backward),
    which `graph.graph_svg` draws as arcs above the row instead of giving them to dot:
    routed by dot, they bend the rows out of line.
    """
    palette = SLICE_PALETTE
    d = _Dot(graph, grid, {id(s): palette[k % len(palette)] for k, s in enumerate(graph.slices)})
    out = _dot_header(graph.name, grid is not None)
    out += _input_nodes(d)
    for n in graph.nodes:
        out.append(_transfer_node(d, n) if n.kind == "transfer" else _compute_node(d, n))
    out += _output_nodes(d)
    out += _slice_boxes(d, posts)
    out += [e for e in _edges(d, arcs) if e is not None]
    out.append("}")
    return "\n".join(out)


def _dot_header(name: str, grid: bool) -> list[str]:
    return [
        f"digraph {quote(name)} {{",
        (
            f'  graph [rankdir={"LR" if grid else "TB"}, bgcolor="#ffffff", nodesep=0.25, '
            f'ranksep={0.3 if grid else 0.35}, fontname="Helvetica", fontsize={FONT_SIZE}, newrank=true];'
        ),
        f'  node [fontname="Helvetica", fontsize={FONT_SIZE}, style=filled, penwidth=1, height=0.3, margin="0.1,0.04"];',
        f'  edge [fontname="Helvetica", fontsize={FONT_SIZE - 2}, color="#555555", fontcolor="#333333", arrowsize=0.7];',
    ]


def _input_nodes(d: _Dot) -> list[str]:
    """The program's inputs; in a grid, one read by a single stage only (its parameters) goes in that row."""
    values = d.graph.values
    consumers: dict[int, list[Any]] = {}
    for n in d.graph.nodes:
        for vid in n.inputs:
            consumers.setdefault(vid, []).append(n)
    out = []
    for k, vid in enumerate(d.graph.inputs):
        v = values[vid]
        out.append(
            f'  in{vid} [label={quote(f"input {k}: {v.type_str}")}, shape=plaintext, style="", '
            f"tooltip={quote(f'input {k}: {_value_desc(v)}')}];"
        )
        users = {id(n.slice) if n.kind != "transfer" else None for n in consumers.get(vid, [])}
        if d.grid and len(users) == 1 and None not in users:  # a stage's own input (its parameters): in its row
            d.home[f"in{vid}"] = users.pop()
    return out


def _signature(d: _Dot, n: Any) -> tuple[str, str, str]:
    """A node's input types, output types, and its source line (for tooltips)."""
    values = d.graph.values
    ins = ", ".join(values[i].type_str for i in n.inputs)
    outs = ", ".join(values[i].type_str for i in n.outputs)
    where = f"\nsource: {n.source[0]}, line {n.source[1]}" if n.source else ""
    return ins, outs, where


def _transfer_node(d: _Dot, n: Any) -> str:
    """A transfer: a diamond between the boxes (outlined red across islands); in a grid, a small mark."""
    ins, outs, where = _signature(d, n)
    src = n.src_slice.name if n.src_slice is not None else "host"
    dst = n.slice.name if n.slice is not None else "host"
    cross = n.cross_island
    label = _lines(f"{src} → {dst}", "cross-island") if cross else quote(f"{src} → {dst}")
    if d.grid:  # between two rows, whose boxes say which slices they are: a small mark (hover for more)
        label = '"", width=0.22, height=0.22, fixedsize=true'
    nbytes = sum(d.graph.values[i].nbytes for i in n.outputs)
    tip = (
        f"{n.name}: transfer{' across islands' if cross else ''}, {fmt_bytes(nbytes)}\n"
        f"from {_slice_desc(n.src_slice)}\nto {_slice_desc(n.slice)}\n{ins} -> {outs}{where}"
    )
    colour = CROSS_ISLAND if cross else "#555555"
    if d.grid and n.slice is not None:  # in the row it delivers to, so what reads it stays in that row
        d.home[f"n{n.id}"] = id(n.slice)
    return (
        f'  n{n.id} [label={label}, shape=diamond, fillcolor="#f2f2f2", color={quote(colour)}, '
        f"penwidth={2 if cross else 1}, tooltip={quote(tip)}];"
    )


def _compute_node(d: _Dot, n: Any) -> str:
    """A compiled function (a box) or glue (a rounded box), filled with its slice's colour, in its slice's box."""
    ins, outs, where = _signature(d, n)
    slice_name = n.slice.name if n.slice is not None else "?"
    label = quote(n.name) if d.grid else _lines(n.name, f"[{slice_name}]")  # a grid's rows name their slices
    if n.kind == "glue":
        tip = f"glue on {_slice_desc(n.slice)}\nops: {', '.join(n.primitives[:8])}\n{ins} -> {outs}{where}"
        shape = 'shape=box, style="rounded,filled"'
    else:
        tip = f"{n.name}: compiled function on {_slice_desc(n.slice)}\n{ins} -> {outs}{where}"
        shape = "shape=box"
    colour = d.fill.get(id(n.slice), "#ffffff")
    if n.slice is not None:
        d.home[f"n{n.id}"] = id(n.slice)
    return f"  n{n.id} [label={label}, {shape}, fillcolor={quote(colour)}, tooltip={quote(tip)}];"


def _output_nodes(d: _Dot) -> list[str]:
    """The program's outputs, with the names it gives them; in a grid, at the end of their producer's row."""
    values = d.graph.values
    names = _output_names(d.graph)
    out = []
    for k, vid in enumerate(d.graph.outputs):
        v = values[vid]
        out.append(
            f'  out{k} [label={quote(f"{names[k]}: {v.type_str}")}, shape=plaintext, style="", '
            f"tooltip={quote(f'output {k} ({names[k]}): {_value_desc(v)}')}];"
        )
        p = d.graph.nodes[v.producer] if v.producer is not None else None
        if d.grid and p is not None and p.kind != "transfer" and p.slice is not None:
            d.home[f"out{k}"] = id(p.slice)
    return out


def _slice_boxes(d: _Dot, posts: bool) -> list[str]:
    """The slices' boxes; in a pipeline grid each box is a row: inputs, nodes in dispatch order, outputs."""
    slices = list(d.grid.slices) if d.grid else list(d.graph.slices)
    members: dict[int, list[str]] = {}
    for key, sid in d.home.items():
        members.setdefault(sid, []).append(key)
    out = []
    for k, s in enumerate(slices):
        keys = members.get(id(s), [])
        if not keys:
            continue
        colour = d.fill.get(id(s), "#d9d9d9")
        ndev = len(s.devices)
        label = (
            f"slice {s.name}  ·  {_mesh_desc(s)}  ·  {ndev} device{'s' if ndev != 1 else ''} "
            f"[{','.join(str(dev.id) for dev in s.devices)}]  ·  island {s.island.id}"
        )
        out.append(
            f"  subgraph cluster_{k} {{ label={quote(label)}; tooltip={quote(_slice_desc(s))}; labeljust=l; "
            f'style="rounded,filled"; fillcolor={quote(_tint(colour))}; color={quote(colour)}; penwidth=1.5;'
            + (f" margin={2 * FONT_SIZE};" if d.grid else "")  # room above the row for its arcs
        )
        out.append(f"    {'; '.join(keys)};")
        if d.grid:
            out += _row(d, k, keys, posts)
        out.append("  }")
    if d.grid and posts:  # the posts are the out-edges of one invisible root, in stage order (ordering=out)
        names = [f"row{k}" for k, s in enumerate(slices) if members.get(id(s))]
        out.append('  rows [style=invis, shape=point, width=0, height=0, label="", ordering=out];')
        out.append("  " + " ".join(f"rows -> {p} [style=invis];" for p in names))
        out.append(f"  {{ rank=same; {'; '.join(names)}; }}")
    return out


def _row(d: _Dot, k: int, keys: list[str], posts: bool) -> list[str]:
    """Inside row ``k`` of a grid: its nodes in dispatch order on one line, inputs first, outputs last."""
    out = []
    row = sorted((key for key in keys if key.startswith("n")), key=lambda key: int(key[1:]))
    d.neighbours.update(itertools.pairwise(row))
    if len(row) > 1:  # keeps the row in dispatch order, left to right, on one line
        out.append(f"    {' -> '.join(row)} [style=invis, weight=8];")
        out.append("    " + " ".join(f"{key} [group=row{k}];" for key in row))
    # the row's inputs at its start, its outputs in one column at its end
    outs = [key for key in keys if key.startswith("out")]
    for key in keys:
        if key.startswith("in"):
            out.append(f"    {key} -> {row[0]} [style=invis];")
    for key in outs:
        out.append(f"    {row[-1]} -> {key} [style=invis];")
    if outs:
        out.append(f"    {{ rank=same; {'; '.join(outs)}; }}")
    if posts:  # an invisible post at the row's start, one per row
        out.append(
            f'    row{k} [style=invis, shape=point, width=0, height=0, label=""]; row{k} -> {row[0]} [style=invis];'
        )
    return out


def _edges(d: _Dot, arcs: list[Arc] | None) -> list[str | None]:
    """Every data edge (constants excepted), as `_edge` writes it."""
    values = d.graph.values
    edges = []
    for node in d.graph.nodes:
        for vid in node.inputs:
            v = values[vid]
            if v.origin == "const":
                continue
            edges.append(_edge(d, f"in{vid}" if v.producer is None else f"n{v.producer}", f"n{node.id}", v, arcs))
    for k, vid in enumerate(d.graph.outputs):
        v = values[vid]
        if v.origin != "const":
            edges.append(_edge(d, f"in{vid}" if v.producer is None else f"n{v.producer}", f"out{k}", v, arcs))
    return edges


def _edge(d: _Dot, src: str, dst: str, v: Any, arcs: list[Arc] | None) -> str | None:
    """One edge's DOT line; None when ``arcs`` takes it (an edge inside a grid's row, drawn as an arc)."""
    if not d.grid:  # (an output's edge keeps its label in the edge's own SVG group: no tooltip, as before)
        tip = "" if dst.startswith("out") else f", tooltip={quote(_value_desc(v))}"
        return f"  {src} -> {dst} [label={quote(v.type_str)}{tip}];"
    home = d.home
    param = src.startswith("in") and src in home  # a stage's own input (its parameters): feeds most of its row
    in_row = home.get(src, 0) == home.get(dst, 1) and (src, dst) not in d.neighbours and not dst.startswith("out")
    if arcs is not None and (param or in_row):
        arcs.append(Arc(src, dst, _value_desc(v), faint=param))
        return None
    if param:
        how = ', color="#c0c0c0", constraint=false, weight=0'
    elif in_row:  # its line stays straight, the edge bends
        how = ", weight=0"
    else:
        how = ""
    return f"  {src} -> {dst} [tooltip={quote(_value_desc(v))}{how}];"


def _output_names(graph: Any) -> list[str]:
    names = getattr(graph, "output_names", None)
    if names is None or len(names) != len(graph.outputs):
        return [f"output {k}" for k in range(len(graph.outputs))]
    return [str(n) for n in names]


__all__ = ["FONT_SIZE", "Arc", "PipelineRows", "graph_dot", "pipeline_rows", "quote", "write_dot"]

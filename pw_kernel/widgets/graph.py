"""The program graph as a picture: DOT source, laid out into SVG by graphviz (through the ``graphviz`` package).

`graph_dot` writes the picture from the graph's public structure (nodes,
values, slices, output names):

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

Every user string is escaped for DOT (and graphviz escapes it again for SVG).
Layout goes through the ``graphviz`` Python package, which runs the ``dot``
binary; without the package, or without ``dot``, `graph_html` shows what to
install plus the DOT source, which any graphviz viewer opens.

`ProgramGraph.to_dot`, ``_repr_svg_`` and ``_repr_html_`` delegate here, so
this module imports neither anywidget nor IPython: the runtime's graph must
draw itself with only jax and numpy installed. In a notebook the graph shows
as `GraphWidget` (zoom, pan, search; `pw_kernel.widgets.graph_widget`),
imported only when displayed.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import itertools
import re
import shutil
import threading
from typing import Any

from ..runtime import describe_sharding
from .errors import GraphvizError
from . import _html

DOT_TIMEOUT = 30.0  # seconds; large graphs take dot a while, a hung dot must not hang the kernel
FONT_SIZE = 12  # points, at zoom 1; the views never shrink a graph below what keeps this readable
INSTALL_HINT = (
    "Install graphviz: `apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` (macOS), "
    "`conda install graphviz`, or run ./scripts/setup.sh."
)
PACKAGE_HINT = (
    "Install the `graphviz` Python package (`pip install graphviz`, or `pip install 'pw_kernel[notebook]'`), "
    "which lays graphs out with graphviz's `dot` binary (`apt-get install graphviz`, `brew install graphviz`, "
    "`conda install graphviz`, or ./scripts/setup.sh installs both)."
)


def _q(text: str) -> str:
    """A DOT quoted string holding ``text`` literally (no graphviz escape such as ``\\n`` survives)."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _lines(*parts: str) -> str:
    """A quoted multi-line DOT label: each part escaped, joined by graphviz's own line break."""
    return '"' + "\\n".join(_q(p)[1:-1] for p in parts) + '"'


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


# ------------------------------------------------------------------ pipelines
_CALL_SUFFIX = re.compile(r":\d+$")  # tracing names the k-th call of `f` "f:k"


@dataclasses.dataclass(frozen=True)
class PipelineRows:
    """How a pipeline graph is drawn: its slices as rows, top to bottom, each row's node ids in dispatch order."""

    slices: tuple[Any, ...]
    rows: tuple[tuple[int, ...], ...]
    microbatches: int  # the most calls of one function on one slice


@dataclasses.dataclass(frozen=True)
class Arc:
    """An edge `graph_svg` draws itself, above a pipeline row: DOT ids of its ends, its tooltip."""

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


# ------------------------------------------------------------------------ DOT
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
    return _dot(graph, pipeline_rows(graph), posts=True)


def _dot(graph: Any, grid: PipelineRows | None, posts: bool, arcs: list[Arc] | None = None) -> str:
    """`graph_dot`'s body.

    In a grid: ``posts`` hints the rows' order with one invisible post per row;
    a list ``arcs`` takes the edges that stay inside one row without joining
    neighbours in it (a stage's parameters, activations kept for the backward),
    which `graph_svg` draws as arcs above the row instead of giving them to dot:
    routed by dot, they bend the rows out of line.
    """
    palette = _html.SLICE_PALETTE
    fill = {id(s): palette[k % len(palette)] for k, s in enumerate(graph.slices)}
    values = graph.values
    out = [
        f"digraph {_q(graph.name)} {{",
        (
            f'  graph [rankdir={"LR" if grid else "TB"}, bgcolor="#ffffff", nodesep=0.25, '
            f'ranksep={0.3 if grid else 0.35}, fontname="Helvetica", fontsize={FONT_SIZE}, newrank=true];'
        ),
        f'  node [fontname="Helvetica", fontsize={FONT_SIZE}, style=filled, penwidth=1, height=0.3, margin="0.1,0.04"];',
        f'  edge [fontname="Helvetica", fontsize={FONT_SIZE - 2}, color="#555555", fontcolor="#333333", arrowsize=0.7];',
    ]
    out_names = _output_names(graph)
    slices = list(grid.slices) if grid else list(graph.slices)
    home: dict[str, int] = {}  # DOT node -> id() of the slice whose box it is drawn in (absent: between boxes)
    consumers: dict[int, list[Any]] = {}
    for n in graph.nodes:
        for vid in n.inputs:
            consumers.setdefault(vid, []).append(n)

    for k, vid in enumerate(graph.inputs):
        v = values[vid]
        out.append(
            f'  in{vid} [label={_q(f"input {k}: {v.type_str}")}, shape=plaintext, style="", '
            f"tooltip={_q(f'input {k}: {_value_desc(v)}')}];"
        )
        users = {id(n.slice) if n.kind != "transfer" else None for n in consumers.get(vid, [])}
        if grid and len(users) == 1 and None not in users:  # a stage's own input (its parameters): in its row
            home[f"in{vid}"] = users.pop()
    for n in graph.nodes:
        ins = ", ".join(values[i].type_str for i in n.inputs)
        outs = ", ".join(values[i].type_str for i in n.outputs)
        where = f"\nsource: {n.source[0]}, line {n.source[1]}" if n.source else ""
        if n.kind == "transfer":
            src = n.src_slice.name if n.src_slice is not None else "host"
            dst = n.slice.name if n.slice is not None else "host"
            cross = n.cross_island
            label = _lines(f"{src} → {dst}", "cross-island") if cross else _q(f"{src} → {dst}")
            if grid:  # between two rows, whose boxes say which slices they are: a small mark (hover for more)
                label = '"", width=0.22, height=0.22, fixedsize=true'
            nbytes = sum(values[i].nbytes for i in n.outputs)
            tip = (
                f"{n.name}: transfer{' across islands' if cross else ''}, {_html.fmt_bytes(nbytes)}\n"
                f"from {_slice_desc(n.src_slice)}\nto {_slice_desc(n.slice)}\n{ins} -> {outs}{where}"
            )
            colour = _html.CROSS_ISLAND if cross else "#555555"
            if grid and n.slice is not None:  # in the row it delivers to, so what reads it stays in that row
                home[f"n{n.id}"] = id(n.slice)
            out.append(
                f'  n{n.id} [label={label}, shape=diamond, fillcolor="#f2f2f2", color={_q(colour)}, '
                f"penwidth={2 if cross else 1}, tooltip={_q(tip)}];"
            )
            continue
        slice_name = n.slice.name if n.slice is not None else "?"
        label = _q(n.name) if grid else _lines(n.name, f"[{slice_name}]")  # a grid's rows name their slices
        if n.kind == "glue":
            tip = f"glue on {_slice_desc(n.slice)}\nops: {', '.join(n.primitives[:8])}\n{ins} -> {outs}{where}"
            shape = 'shape=box, style="rounded,filled"'
        else:
            tip = f"{n.name}: compiled function on {_slice_desc(n.slice)}\n{ins} -> {outs}{where}"
            shape = "shape=box"
        colour = fill.get(id(n.slice), "#ffffff")
        out.append(f"  n{n.id} [label={label}, {shape}, fillcolor={_q(colour)}, tooltip={_q(tip)}];")
        if n.slice is not None:
            home[f"n{n.id}"] = id(n.slice)
    for k, vid in enumerate(graph.outputs):
        v = values[vid]
        out.append(
            f'  out{k} [label={_q(f"{out_names[k]}: {v.type_str}")}, shape=plaintext, style="", '
            f"tooltip={_q(f'output {k} ({out_names[k]}): {_value_desc(v)}')}];"
        )
        p = graph.nodes[v.producer] if v.producer is not None else None
        if grid and p is not None and p.kind != "transfer" and p.slice is not None:
            home[f"out{k}"] = id(p.slice)

    # the slices' boxes; in a pipeline grid each box is a row: inputs, nodes in dispatch order, outputs
    members: dict[int, list[str]] = {}
    neighbours: set[tuple[str, str]] = set()  # consecutive in a row
    for key, sid in home.items():
        members.setdefault(sid, []).append(key)
    for k, s in enumerate(slices):
        keys = members.get(id(s), [])
        if not keys:
            continue
        colour = fill.get(id(s), "#d9d9d9")
        ndev = len(s.devices)
        label = (
            f"slice {s.name}  ·  {_mesh_desc(s)}  ·  {ndev} device{'s' if ndev != 1 else ''} "
            f"[{','.join(str(d.id) for d in s.devices)}]  ·  island {s.island.id}"
        )
        out.append(
            f"  subgraph cluster_{k} {{ label={_q(label)}; tooltip={_q(_slice_desc(s))}; labeljust=l; "
            f'style="rounded,filled"; fillcolor={_q(_tint(colour))}; color={_q(colour)}; penwidth=1.5;'
            + (f" margin={2 * FONT_SIZE};" if grid else "")  # room above the row for its arcs
        )
        out.append(f"    {'; '.join(keys)};")
        if grid:
            row = sorted((key for key in keys if key.startswith("n")), key=lambda key: int(key[1:]))
            neighbours.update(itertools.pairwise(row))
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
        out.append("  }")
    if grid and posts:  # the posts are the out-edges of one invisible root, in stage order (ordering=out)
        posts = [f"row{k}" for k, s in enumerate(slices) if members.get(id(s))]
        out.append('  rows [style=invis, shape=point, width=0, height=0, label="", ordering=out];')
        out.append("  " + " ".join(f"rows -> {p} [style=invis];" for p in posts))
        out.append(f"  {{ rank=same; {'; '.join(posts)}; }}")

    def edge(src: str, dst: str, v: Any) -> str | None:
        if not grid:  # (an output's edge keeps its label in the edge's own SVG group: no tooltip, as before)
            tip = "" if dst.startswith("out") else f", tooltip={_q(_value_desc(v))}"
            return f"  {src} -> {dst} [label={_q(v.type_str)}{tip}];"
        param = src.startswith("in") and src in home  # a stage's own input (its parameters): feeds most of its row
        in_row = home.get(src, 0) == home.get(dst, 1) and (src, dst) not in neighbours and not dst.startswith("out")
        if arcs is not None and (param or in_row):
            arcs.append(Arc(src, dst, _value_desc(v), faint=param))
            return None
        if param:
            how = ', color="#c0c0c0", constraint=false, weight=0'
        elif in_row:  # its line stays straight, the edge bends
            how = ", weight=0"
        else:
            how = ""
        return f"  {src} -> {dst} [tooltip={_q(_value_desc(v))}{how}];"

    edges = []
    for node in graph.nodes:
        for vid in node.inputs:
            v = values[vid]
            if v.origin == "const":
                continue
            edges.append(edge(f"in{vid}" if v.producer is None else f"n{v.producer}", f"n{node.id}", v))
    for k, vid in enumerate(graph.outputs):
        v = values[vid]
        if v.origin != "const":
            edges.append(edge(f"in{vid}" if v.producer is None else f"n{v.producer}", f"out{k}", v))
    out += [e for e in edges if e is not None]
    out.append("}")
    return "\n".join(out)


def _output_names(graph: Any) -> list[str]:
    names = getattr(graph, "output_names", None)
    if names is None or len(names) != len(graph.outputs):
        return [f"output {k}" for k in range(len(graph.outputs))]
    return [str(n) for n in names]


# ------------------------------------------------------------------- layout
def dot_binary() -> str | None:
    """The path of graphviz's ``dot``, or None."""
    return shutil.which("dot")


def _graphviz_package() -> Any:
    """The ``graphviz`` Python package, or None when it is not installed."""
    try:
        import graphviz
    except ImportError:
        return None
    return graphviz


@functools.lru_cache(maxsize=64)
def _layout(source: str) -> str:
    gv = _graphviz_package()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["svg"] = gv.Source(source).pipe(format="svg", encoding="utf-8", quiet=True)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    # the package's pipe() has no timeout: wait for it on a helper thread, so a hung dot cannot hang the kernel
    worker = threading.Thread(target=work, name="pw-graphviz", daemon=True)
    worker.start()
    worker.join(DOT_TIMEOUT)
    if worker.is_alive():
        raise GraphvizError(
            f"`graph_svg`: graphviz `dot` took longer than {DOT_TIMEOUT:.0f} s to lay the graph out. "
            f"The DOT source:\n{source}",
            source,
        )
    err = box.get("error")
    if isinstance(err, gv.ExecutableNotFound):
        raise GraphvizError(f"`graph_svg`: could not run graphviz `dot`: {err}. {INSTALL_HINT}", source) from None
    if isinstance(err, gv.CalledProcessError):
        stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else str(err.stderr or "")
        raise GraphvizError(
            f"`graph_svg`: graphviz `dot` failed (exit {err.returncode}): {stderr.strip()}\nThe DOT source:\n{source}",
            source,
        ) from None
    if err is not None:
        raise GraphvizError(
            f"`graph_svg`: graphviz could not lay the graph out: {err!r}\nThe DOT source:\n{source}", source
        )
    svg = box["svg"]
    start = svg.find("<svg")
    svg = svg[start:] if start >= 0 else svg
    # at its own size wherever it is inlined: notebook CSS shrinks SVGs to the output's width (tiny text)
    return svg.replace("<svg ", '<svg class="pw-graph-drawing jp-mod-unconfined" style="max-width:none" ', 1)


def dot_to_svg(source: str) -> str:
    """Lay out DOT source with graphviz (the ``graphviz`` package running ``dot``).

    Raises GraphvizError (holding the source) when the package or ``dot`` is missing, or dot fails.
    """
    if _graphviz_package() is None:
        raise GraphvizError(
            "`graph_svg`: the `graphviz` Python package is not installed, so the program graph cannot be laid "
            f"out. {PACKAGE_HINT} Meanwhile, the DOT source (paste it into any graphviz viewer):\n{source}",
            source,
        )
    if dot_binary() is None:
        raise GraphvizError(
            "`graph_svg`: graphviz's `dot` binary was not found on PATH, so the program graph cannot be laid "
            f"out. {INSTALL_HINT} Meanwhile, the DOT source (paste it into any graphviz viewer):\n{source}",
            source,
        )
    return _layout(source)


def graph_svg(graph: Any) -> str:
    """The program graph as an SVG string (``<svg ...>``), laid out by graphviz.

    Raises GraphvizError, whose message says what to install and includes
    the DOT source, when the ``graphviz`` package or ``dot`` is missing.

    A pipeline's rows should read top to bottom in stage order, which dot
    does not promise (it orders boxes to cut crossings): the layout is
    checked, and laid out once more with other hints when the order came out
    wrong (the first layout is kept when none is right).

    Example::

        svg = graph_svg(step.trace(x))
        IPython.display.SVG(svg)
    """
    grid = pipeline_rows(graph)
    if grid is None:
        return dot_to_svg(_dot(graph, None, posts=False))
    arcs: list[Arc] = []
    svg = dot_to_svg(_dot(graph, grid, posts=True, arcs=arcs))
    if not _rows_in_order(svg, len(grid.rows)):
        again = dot_to_svg(_dot(graph, grid, posts=False, arcs=[]))
        svg = again if _rows_in_order(again, len(grid.rows)) else svg
    return _draw_arcs(svg, arcs)


_NUM = r"-?[\d.]+(?:e-?\d+)?"


def _boxes(svg: str) -> dict[str, tuple[float, float, float, float]]:
    """Each drawn node's and cluster's box (x0, y0, x1, y1) in graphviz's SVG, by DOT id / cluster name."""
    out = {}
    for part in re.split(r'<g id="(?:node|clust)\d+" class="(?:node|cluster)">', svg)[1:]:
        part = part.split("<!--", 1)[0]
        title = re.search(r"<title>([^<]*)</title>", part)
        if title is None:
            continue
        pts = re.findall(rf"({_NUM}),({_NUM})", " ".join(re.findall(r'(?:points|d)="([^"]*)"', part)))
        if not pts:  # a plaintext node: its text, about 0.6 em a character wide
            t = re.search(rf'<text text-anchor="middle" x="({_NUM})" y="({_NUM})"[^>]*>([^<]*)</text>', part)
            if t is None:
                continue
            x, y, w = float(t.group(1)), float(t.group(2)), 0.3 * FONT_SIZE * len(html.unescape(t.group(3)))
            out[title.group(1)] = (x - w, y - FONT_SIZE, x + w, y + 3)
            continue
        xs, ys = [float(a) for a, _ in pts], [float(b) for _, b in pts]
        out[title.group(1)] = (min(xs), min(ys), max(xs), max(ys))
    return out


def _draw_arcs(svg: str, arcs: list[Arc]) -> str:
    """``svg`` with ``arcs`` drawn in, under the nodes: from one node over the top of a later one in its row."""
    if not arcs:
        return svg
    boxes = _boxes(svg)
    parts = ['<g id="pw-arcs" class="pw-arcs">']
    for a in arcs:
        s, d = boxes.get(a.src), boxes.get(a.dst)
        if s is None or d is None:
            continue
        if a.src.startswith("in"):  # an input at the row's start: leave from its right end
            x1, y1 = s[2] + 2, (s[1] + s[3]) / 2
        else:
            x1, y1 = (s[0] + s[2]) / 2 + 4, s[1]
        x2, y2 = (d[0] + d[2]) / 2 - 4, d[1] - 1
        lift = min(12 + 0.06 * abs(x2 - x1), 2.2 * FONT_SIZE)  # longer reads arc higher, inside the row's box
        top = min(y1, y2) - lift
        colour = "#c0c0c0" if a.faint else "#8a8a8a"
        tip = _html.esc(f"{a.src} -> {a.dst}: {a.tip}")
        parts.append(
            f'<g class="edge pw-arc"><title>{tip}</title>'
            f'<path fill="none" stroke="{colour}" d="M{x1:.1f},{y1:.1f}C{x1 + (x2 - x1) / 4:.1f},{top:.1f} '
            f'{x2 - (x2 - x1) / 4:.1f},{top:.1f} {x2:.1f},{y2 - 5:.1f}"/>'
            f'<polygon fill="{colour}" stroke="{colour}" points="{x2 - 2.5:.1f},{y2 - 5:.1f} {x2 + 2.5:.1f},{y2 - 5:.1f} '
            f'{x2:.1f},{y2:.1f}"/></g>'
        )
    parts.append("</g>")
    # after the boxes and under the nodes and edges, inside the graph's own group (its transform applies)
    at = min((i for i in (svg.find('<g id="node'), svg.find('<g id="edge')) if i >= 0), default=-1)
    if at < 0:
        return svg
    at = svg.rfind("<!--", 0, at) if svg.rfind("<!--", 0, at) > svg.rfind("</g>", 0, at) else at
    return svg[:at] + "".join(parts) + "\n" + svg[at:]


def _rows_in_order(svg: str, n: int) -> bool:
    """Whether the boxes ``cluster_0 .. cluster_{n-1}`` of a laid-out grid sit top to bottom in that order."""
    tops = []
    for k in range(n):
        m = re.search(rf"<title>cluster_{k}</title>.*?(?:points|d)=\"M?(-?[\d.]+),(-?[\d.]+)", svg, re.DOTALL)
        if m is None:
            return True  # not a layout this check understands: keep it
        tops.append(float(m.group(2)))
    return tops == sorted(tops)


def repr_svg(graph: Any) -> str | None:
    """For ``ProgramGraph._repr_svg_``: the SVG, or None without graphviz (so the HTML repr shows the message)."""
    try:
        return graph_svg(graph)
    except GraphvizError:
        return None


def _summary(graph: Any) -> str:
    return graph.summary() if hasattr(graph, "summary") else str(getattr(graph, "name", "program graph"))


def graph_html(graph: Any) -> str:
    """For ``ProgramGraph._repr_html_``: a summary line and the SVG, or what to install and the DOT source.

    The SVG keeps its own size (text stays readable however large the graph)
    in a box that scrolls both ways; no script, so nbconvert, GitHub and an
    untrusted notebook show it as it is. `GraphWidget` adds zoom, pan and search.
    """
    head = f'<div style="margin-bottom:4px"><b>{_html.esc(_summary(graph))}</b></div>'
    try:
        svg = graph_svg(graph)
    except GraphvizError as e:
        return _html.page(head + _missing_html(e), "pw-graph")
    body = (
        '<div class="pw-graph-svg" style="overflow:auto;max-height:720px;max-width:100%;'
        f'border:1px solid #e0e0e0">{svg}</div>'
    )
    return _html.page(head + body, "pw-graph")


def display_graph(graph: Any) -> None:
    """Show the graph in a notebook (``ProgramGraph._ipython_display_``): `GraphWidget` when anywidget is there.

    The widget zooms, pans and searches; its mimebundle carries `graph_html` too,
    so nbconvert and untrusted notebooks show the static picture. Without
    anywidget, or without graphviz, the static HTML is shown on its own.
    """
    from IPython.display import display

    try:
        from .graph_widget import GraphWidget
    except ImportError:  # anywidget or ipywidgets missing: the picture without the controls
        GraphWidget = None
    if GraphWidget is not None:
        try:
            widget = GraphWidget(graph)
        except GraphvizError:
            widget = None
        if widget is not None:
            widget._ipython_display_()
            return
    display({"text/plain": repr(graph), "text/html": graph_html(graph)}, raw=True)


def _missing_html(e: GraphvizError) -> str:
    msg = str(e).split(" Meanwhile,")[0].split("\nThe DOT source")[0]
    return (
        f'<div style="color:#8a4b00">{_html.esc(msg)}</div>'
        f'<details open><summary>DOT source</summary><pre style="font-size:11px">{_html.esc(e.dot)}</pre></details>'
    )


__all__ = [
    "GraphvizError",
    "PipelineRows",
    "display_graph",
    "dot_binary",
    "dot_to_svg",
    "graph_dot",
    "graph_html",
    "graph_svg",
    "pipeline_rows",
    "repr_svg",
]

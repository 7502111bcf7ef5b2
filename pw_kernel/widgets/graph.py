"""The program graph as a picture: DOT source, and SVG laid out by graphviz's ``dot`` binary (a subprocess).

`graph_dot` writes the picture from the graph's public structure (nodes,
values, slices): compute nodes as boxes and glue as rounded boxes, coloured
by slice; transfers as diamonds, cross-island ones outlined red; edges
labelled with shape and dtype; hover tooltips with shardings, devices and
the user's source line. Every user string is escaped for DOT (and graphviz
escapes it again for SVG). Without ``dot`` you get a message that says how
to install it, plus the DOT source, which any graphviz viewer opens.

`ProgramGraph.to_dot`, ``_repr_svg_`` and ``_repr_html_`` delegate here, so
this module imports neither anywidget nor IPython: the runtime's graph must
draw itself with only jax and numpy installed.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from typing import Any

from ..runtime import GraphvizError, describe_sharding
from . import _html

DOT_TIMEOUT = 30.0  # seconds; large graphs take dot a while, a hung dot must not hang the kernel
INSTALL_HINT = (
    "Install graphviz: `apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` (macOS), "
    "`conda install graphviz`, or run ./scripts/setup.sh."
)


def _q(text: str) -> str:
    """A DOT quoted string holding ``text`` literally (no graphviz escape such as ``\\n`` survives)."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _lines(*parts: str) -> str:
    """A quoted multi-line DOT label: each part escaped, joined by graphviz's own line break."""
    return '"' + "\\n".join(_q(p)[1:-1] for p in parts) + '"'


def _slice_desc(s: Any) -> str:
    if s is None:
        return "host"
    mesh = " x ".join(f"{k}={v}" for k, v in dict(s.mesh.shape).items())
    ids = ",".join(str(d.id) for d in s.devices)
    return f"slice {s.name} ({mesh}; devices {ids}; island {s.island.id})"


def _value_desc(v: Any) -> str:
    return f"{v.type_str} {describe_sharding(v.sharding)}"


def graph_dot(graph: Any) -> str:
    """Graphviz source of a ProgramGraph (what `ProgramGraph.to_dot` returns).

    Nodes are coloured by slice, transfers are diamonds (cross-island ones red),
    edges are labelled with shape and dtype, tooltips hold shardings, devices
    and source lines.

    Example::

        print(graph_dot(step.trace(x)))    # digraph "step" { ... }
    """
    palette = _html.SLICE_PALETTE
    fill = {id(s): palette[k % len(palette)] for k, s in enumerate(graph.slices)}
    values = graph.values
    out = [
        f"digraph {_q(graph.name)} {{",
        '  rankdir=TB; bgcolor="#ffffff"; nodesep=0.3; ranksep=0.35;',
        '  node [fontname="Helvetica", fontsize=11, style=filled, penwidth=1];',
        '  edge [fontname="Helvetica", fontsize=9, color="#555555", fontcolor="#333333"];',
    ]
    for k, vid in enumerate(graph.inputs):
        v = values[vid]
        out.append(
            f'  in{vid} [label={_q(f"input {k}: {v.type_str}")}, shape=plaintext, style="", '
            f"tooltip={_q(_value_desc(v))}];"
        )
    for n in graph.nodes:
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
                f"{n.name}: transfer{' across islands' if cross else ''}, {_html.fmt_bytes(nbytes)}\n"
                f"from {_slice_desc(n.src_slice)}\nto {_slice_desc(n.slice)}\n{ins} -> {outs}{where}"
            )
            colour = _html.CROSS_ISLAND if cross else "#555555"
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
    for node in graph.nodes:
        for vid in node.inputs:
            v = values[vid]
            if v.origin == "const":
                continue
            src = f"in{vid}" if v.producer is None else f"n{v.producer}"
            out.append(f"  {src} -> n{node.id} [label={_q(v.type_str)}, tooltip={_q(_value_desc(v))}];")
    for k, vid in enumerate(graph.outputs):
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


def dot_binary() -> str | None:
    """The path of graphviz's ``dot``, or None."""
    return shutil.which("dot")


@functools.lru_cache(maxsize=64)
def _layout(source: str, exe: str) -> str:
    try:
        proc = subprocess.run([exe, "-Tsvg"], input=source, capture_output=True, text=True, timeout=DOT_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise GraphvizError(
            f"`graph_svg`: graphviz `dot` took longer than {DOT_TIMEOUT:.0f} s to lay the graph out. "
            f"The DOT source:\n{source}",
            source,
        ) from None
    except OSError as e:
        raise GraphvizError(f"`graph_svg`: could not run graphviz `dot` ({exe}): {e}. {INSTALL_HINT}", source) from None
    if proc.returncode != 0:
        raise GraphvizError(
            f"`graph_svg`: graphviz `dot` failed (exit {proc.returncode}): {proc.stderr.strip()}\n"
            f"The DOT source:\n{source}",
            source,
        )
    svg = proc.stdout
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def dot_to_svg(source: str) -> str:
    """Lay out DOT source with ``dot -Tsvg``; raises GraphvizError (with the source) when dot is missing or fails."""
    exe = dot_binary()
    if exe is None:
        raise GraphvizError(
            "`graph_svg`: graphviz's `dot` binary was not found on PATH, so the program graph cannot be laid "
            f"out. {INSTALL_HINT} Meanwhile, the DOT source (paste it into any graphviz viewer):\n{source}",
            source,
        )
    return _layout(source, exe)


def graph_svg(graph: Any) -> str:
    """The program graph as an SVG string (``<svg ...>``), laid out by ``dot``.

    Raises GraphvizError, whose message says how to install graphviz and
    includes the DOT source, when ``dot`` is missing.

    Example::

        svg = graph_svg(step.trace(x))
        IPython.display.SVG(svg)
    """
    return dot_to_svg(graph_dot(graph))


def repr_svg(graph: Any) -> str | None:
    """For ``ProgramGraph._repr_svg_``: the SVG, or None without ``dot`` (so the HTML repr shows the message)."""
    try:
        return graph_svg(graph)
    except GraphvizError:
        return None


def graph_html(graph: Any) -> str:
    """For ``ProgramGraph._repr_html_``: a summary line and the SVG, or the install message and the DOT source."""
    summary = graph.summary() if hasattr(graph, "summary") else str(getattr(graph, "name", "program graph"))
    head = f'<div style="margin-bottom:4px"><b>{_html.esc(summary)}</b></div>'
    try:
        svg = graph_svg(graph)
        body = f'<div class="pw-graph-svg" style="overflow:auto;max-height:720px">{svg}</div>'
    except GraphvizError as e:
        msg = str(e).split(" Meanwhile,")[0].split("\nThe DOT source")[0]
        body = (
            f'<div style="color:#8a4b00">{_html.esc(msg)}</div>'
            f'<details open><summary>DOT source</summary><pre style="font-size:11px">{_html.esc(e.dot)}</pre></details>'
        )
    return _html.page(head + body, "pw-graph")


__all__ = ["GraphvizError", "dot_binary", "dot_to_svg", "graph_dot", "graph_html", "graph_svg", "repr_svg"]

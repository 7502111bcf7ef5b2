"""The run lifecycle as a picture, drawn from `pw_kernel.runtime.TRANSITIONS` itself.

``python -m pw_kernel.widgets.lifecycle docs`` writes ``docs/lifecycle.dot``
and ``docs/lifecycle.svg`` (docs/architecture.md shows the SVG; a test checks
that the DOT file is what the table draws today, so the picture cannot drift).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..runtime.extend import FINAL, transition_edges
from ._html import state_colour
from .dot import quote
from .graph import dot_to_svg


def lifecycle_dot() -> str:
    """DOT source of the run lifecycle: states as nodes, one edge per (state, event) of the table.

    Example::

        print(lifecycle_dot())   # digraph "run lifecycle" { ... }
    """
    edges = transition_edges()
    states = list(dict.fromkeys([s for a, _, b in edges for s in (a, b)]))
    out = [
        f"digraph {quote('run lifecycle')} {{",
        '  rankdir=LR; bgcolor="#ffffff"; nodesep=0.4; ranksep=0.9;',
        '  node [fontname="Helvetica", fontsize=12, style=filled, shape=box, penwidth=1];',
        '  edge [fontname="Helvetica", fontsize=10, color="#555555", fontcolor="#333333"];',
    ]
    for s in states:
        shape = ", peripheries=2" if s in FINAL else ""
        out.append(f"  {quote(s)} [fillcolor={quote(state_colour(s))}, fontcolor=\"#ffffff\"{shape}];")
    for a, event, b in edges:
        style = ', style=dashed, color="#999999", fontcolor="#777777"' if a in FINAL else ""
        out.append(f"  {quote(a)} -> {quote(b)} [label={quote(event)}{style}];")
    out.append("}")
    return "\n".join(out) + "\n"


def write(folder: str | Path) -> tuple[Path, Path]:
    """Write ``lifecycle.dot`` and ``lifecycle.svg`` into ``folder``; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dot = lifecycle_dot()
    dot_path, svg_path = folder / "lifecycle.dot", folder / "lifecycle.svg"
    dot_path.write_text(dot)
    svg_path.write_text(dot_to_svg(dot))
    return dot_path, svg_path


if __name__ == "__main__":
    for p in write(sys.argv[1] if len(sys.argv) > 1 else "docs"):
        print(p)

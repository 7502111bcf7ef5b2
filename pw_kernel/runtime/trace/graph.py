"""ProgramGraph: the dataflow DAG of a traced program, known before anything runs.

Nodes are compiled-function calls, glue (plain jnp ops placed on a slice) and
transfers (values moving between slices). Every value carries shape, dtype and
sharding; edges are values flowing from a producer to a consumer; outputs
carry the names the program returns them as (`ProgramGraph.output_names`).
The pictures (`to_dot`, the SVG and HTML reprs, the notebook widget) are drawn
by `pw_kernel.widgets.graph`, imported only when a picture is asked for.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import linecache
import math
import os
from collections.abc import Sequence
from typing import Any, Literal

import jax
import numpy as np
from jax.sharding import NamedSharding, Sharding

from ..devices import Island, VirtualSlice

Shape = tuple[int, ...]
NodeKind = Literal["compute", "glue", "transfer"]
ValueOrigin = Literal["input", "const", "node"]


def as_dtype(dtype: Any) -> Any:
    """``np.dtype(dtype)``, except that JAX's extended dtypes (typed PRNG keys, ``key<fry>``) pass as they are.

    Example: ``as_dtype("float32")`` is ``np.dtype("float32")``; ``as_dtype(jax.random.key(0).dtype)`` is ``key<fry>``.
    """
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return dtype  # numpy cannot interpret it; it knows its own itemsize and name
    return np.dtype(dtype)


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
        try:
            returned = _returned_expr(self.jaxpr)
        except Exception:  # noqa: BLE001 - the source moved or cannot be read: names from the structure only
            returned = None
        return output_names(self.out_tree, len(self.outputs), returned)

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


# ------------------------------------------------------------ output names
_TRACING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tracing.py")
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def output_names(out_tree: Any, n: int, returned: ast.expr | None = None) -> tuple[str, ...]:
    """Names for the ``n`` flat outputs of a pytree ``out_tree``, given the expression the function returned.

    Example::

        output_names(tree_structure((1, {"w": 2})), 2, ast.parse("y, p").body[0].value)  # ('y', "p['w']")
    """
    fallback = tuple(f"output {k}" for k in range(n))
    try:
        tree = jax.tree_util.tree_unflatten(out_tree, list(range(n)))
        flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    except Exception:  # noqa: BLE001 - a custom pytree whose unflatten checks its leaves, say
        return fallback
    if [leaf for _, leaf in flat] != list(range(n)):
        return fallback
    paths = [tuple(path) for path, _ in flat]
    names = _names_from_source(paths, returned) if returned is not None else None
    if names is None:
        names = [_path_name(p) for p in paths]
    return tuple(name if name else fallback[k] for k, name in enumerate(names))


def _path_name(path: tuple) -> str | None:
    """``params['w']`` for a path that starts at a dict key or attribute; None for plain positions."""
    if not path:
        return None
    head, rest = path[0], path[1:]
    if isinstance(head, jax.tree_util.DictKey) and isinstance(head.key, str):
        return head.key + jax.tree_util.keystr(rest)
    if isinstance(head, jax.tree_util.GetAttrKey):
        return head.name + jax.tree_util.keystr(rest)
    return None


def _names_from_source(paths: Sequence[tuple], returned: ast.expr) -> list[str | None] | None:
    """The variable names of ``return y, z`` (or ``return y``) put on the outputs' paths; None if they do not fit."""
    if isinstance(returned, (ast.Tuple, ast.List)):
        elts = returned.elts
        if any(isinstance(e, ast.Starred) for e in elts):
            return None
        out: list[str | None] = []
        for path in paths:
            if not path or not isinstance(path[0], jax.tree_util.SequenceKey) or path[0].idx >= len(elts):
                return None
            name = _expr_name(elts[path[0].idx])
            out.append(None if name is None else name + jax.tree_util.keystr(path[1:]))
        return out
    name = _expr_name(returned)
    if name is None:
        return None
    return [name + jax.tree_util.keystr(path) for path in paths]


def _expr_name(e: ast.expr) -> str | None:
    """``y``, ``self.w``, ``x['k']`` for names, attributes and constant subscripts; None for any other expression."""
    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Attribute):
        base = _expr_name(e.value)
        return None if base is None else f"{base}.{e.attr}"
    if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant):
        base = _expr_name(e.value)
        return None if base is None else f"{base}[{e.slice.value!r}]"
    return None


def _returned_expr(closed_jaxpr: Any) -> ast.expr | None:
    """What the traced program function returns, read from its source; None when that is unknown or ambiguous.

    JAX's own record of where each equation was made (its traceback) holds the
    frame of the program's function: the one the tracer called. Its source
    (through `linecache`, so notebook cells work too) gives the return statements.
    """
    eqns = getattr(getattr(closed_jaxpr, "jaxpr", None), "eqns", None) or ()
    for eqn in eqns:
        tb = getattr(eqn.source_info, "traceback", None)
        frames = list(tb.frames) if tb is not None else []
        for k in range(len(frames) - 1, 0, -1):
            if frames[k].file_name == _TRACING and frames[k - 1].file_name != _TRACING:
                f = frames[k - 1]
                return _function_return(f.file_name, f.line_num, f.function_name.rsplit(".", 1)[-1])
    return None


def _function_return(filename: str, line: int, name: str) -> ast.expr | None:
    tree = _parse(filename)
    if tree is None:
        return None
    fn = None
    for node in ast.walk(tree):  # the innermost function called `name` around `line`
        if not isinstance(node, _FUNCTIONS) or not node.lineno <= line <= (node.end_lineno or node.lineno):
            continue
        if (node.name if not isinstance(node, ast.Lambda) else "<lambda>") != name:
            continue
        if fn is None or (node.lineno, node.col_offset) > (fn.lineno, fn.col_offset):
            fn = node
    if fn is None:
        return None
    if isinstance(fn, ast.Lambda):
        return fn.body
    returns = [r.value for r in _own_returns(fn.body) if r.value is not None]
    if not returns:
        return None
    first = ast.dump(returns[0])
    return returns[0] if all(ast.dump(r) == first for r in returns[1:]) else None


def _own_returns(body: list[ast.stmt]) -> list[ast.Return]:
    """The return statements of a function body, not those of functions or classes defined inside it."""
    out: list[ast.Return] = []
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return):
            out.append(node)
        elif not isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return out


def _parse(filename: str) -> ast.Module | None:
    source = "".join(linecache.getlines(filename))
    return _parse_source(source) if source else None


@functools.lru_cache(maxsize=32)
def _parse_source(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None

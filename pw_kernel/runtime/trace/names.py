"""Names for a program's outputs: what its function returns them as, read from its source.

``return y, z`` names the outputs ``y`` and ``z``; a returned dict or dataclass
names them by key or field; anything else is ``output 0``, ``output 1``, ...
(`ProgramGraph.output_names` shows them in pictures).
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
from collections.abc import Sequence
from typing import Any

import jax

# The frame that calls the program's function is tracing.py's (`_Tracer.call_flat`).
_TRACING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tracing.py")
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def program_output_names(out_tree: Any, n: int, closed_jaxpr: Any) -> tuple[str, ...]:
    """Names for a traced program's ``n`` flat outputs: from its return statement where the source says, else from
    the structure (`output_names`)."""
    try:
        returned = returned_expr(closed_jaxpr)
    except Exception:  # noqa: BLE001 - the source moved or cannot be read: names from the structure only
        returned = None
    return output_names(out_tree, n, returned)


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


def returned_expr(closed_jaxpr: Any) -> ast.expr | None:
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

"""A `%%pathways` cell as a program: the names it reads and assigns, and the function it becomes.

The cell is parsed with `ast` (never regular expressions). Names read before
the cell assigns them are its inputs; names it assigns at cell level are its
outputs. The cell body becomes the body of ::

    def __pw_cell(<array inputs>):
        <constant inputs the cell also rebinds> = ...
        <cell body>                 # a trailing expression becomes __pw_result__
        return locals()

compiled under the cell's own filename, so JAX's source information and
tracebacks point at the cell's lines (the `%%pathways` line is line 1).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import types
from collections.abc import Callable, Iterable
from typing import Any

from .errors import CellError

#: The name the cell's trailing expression is bound to inside the program.
RESULT = "__pw_result__"

_CONSTS = "__pw_consts"
_LOCALS = "__pw_locals"


@dataclasses.dataclass(frozen=True)
class CellAnalysis:
    """What a cell reads and assigns, in the order it does so."""

    tree: ast.Module
    #: Names read before the cell assigns them: name -> line of that first read.
    reads: dict[str, int]
    #: Names assigned at cell level, in order of first assignment.
    stores: tuple[str, ...]
    #: The last statement is an expression: its value is the cell's result.
    has_result: bool

    def unknown(self, namespace: dict[str, Any]) -> dict[str, int]:
        """Names read before any assignment that exist neither in ``namespace``, the cell, nor builtins."""
        return {
            n: line
            for n, line in self.reads.items()
            if n not in namespace and n not in self.stores and not hasattr(builtins, n)
        }


# ----------------------------------------------------------------- analysis
class _Scope(ast.NodeVisitor):
    """Collects the names one scope loads and stores; nested scopes contribute their free names as loads."""

    def __init__(self) -> None:
        self.loads: dict[str, int] = {}
        self.stores: dict[str, None] = {}
        self.globals: set[str] = set()
        self.nonlocals: set[str] = set()

    def load(self, name: str, line: int) -> None:
        self.loads.setdefault(name, line)

    def store(self, name: str) -> None:
        self.stores.setdefault(name, None)

    def visit_all(self, nodes: Iterable[ast.AST | None]) -> None:
        for n in nodes:
            if n is not None:
                self.visit(n)

    # -- names
    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store):
            self.store(node.id)
        else:  # Load, and Del (which needs the name bound)
            self.load(node.id, node.lineno)

    # -- evaluation order: the value before the target
    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        self.visit_all(node.targets)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit_all([node.value, node.target])

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self.load(node.target.id, node.lineno)
            self.visit(node.value)
            self.store(node.target.id)
        else:
            self.visit(node.value)
            self.visit(node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self.store(node.target.id)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self.visit(node.target)
        self.visit_all(node.body)
        self.visit_all(node.orelse)

    visit_AsyncFor = visit_For

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        self.visit_all([node.type])
        if node.name:
            self.store(node.name)
        self.visit_all(node.body)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name == "*":
                raise CellError(
                    "`from ... import *` cannot be part of a program; import names explicitly.", node.lineno
                )
            self.store(alias.asname or alias.name.split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_Global(self, node: ast.Global) -> None:
        self.globals.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.nonlocals.update(node.names)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        self.generic_visit(node)
        if node.name:
            self.store(node.name)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self.store(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        self.generic_visit(node)
        if node.rest:
            self.store(node.rest)

    # -- nested scopes: evaluated parts here, free names of the body as loads here
    def _arguments(self, args: ast.arguments) -> list[str]:
        self.visit_all(args.defaults)
        self.visit_all(args.kw_defaults)
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        params += [a for a in (args.vararg, args.kwarg) if a is not None]
        return [a.arg for a in params]

    def _nested(self, params: Iterable[str], body: Iterable[ast.AST], line: int) -> None:
        inner = _Scope()
        for p in params:
            inner.store(p)
        inner.visit_all(body)
        local = set(inner.stores) - inner.nonlocals - inner.globals
        for name in list(inner.loads) + sorted(inner.nonlocals):
            if name not in local and name not in inner.globals:
                self.load(name, inner.loads.get(name, line))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.visit_all(node.decorator_list)
        params = self._arguments(node.args)
        annotations = [a.annotation for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
        self.visit_all([*annotations, node.returns])
        self.store(node.name)
        self._nested(params, node.body, node.lineno)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        params = self._arguments(node.args)
        self._nested(params, [node.body], node.lineno)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.visit_all(node.decorator_list)
        self.visit_all(node.bases)
        self.visit_all(node.keywords)
        self.store(node.name)
        self._nested((), node.body, node.lineno)

    def _comprehension(self, node, elements: list[ast.AST]) -> None:
        gens = node.generators
        self.visit(gens[0].iter)  # the first iterable is evaluated in the enclosing scope
        inner = _Scope()
        for k, g in enumerate(gens):
            if k:
                inner.visit(g.iter)
            inner.visit(g.target)
            inner.visit_all(g.ifs)
        inner.visit_all(elements)
        targets: set[str] = set()
        for g in gens:
            targets.update(n.id for n in ast.walk(g.target) if isinstance(n, ast.Name))
        for name, line in inner.loads.items():
            if name not in targets:
                self.load(name, line)
        for name in inner.stores:  # walrus targets bind in the enclosing scope
            if name not in targets:
                self.store(name)

    def visit_ListComp(self, node: ast.ListComp) -> None:
        self._comprehension(node, [node.elt])

    visit_SetComp = visit_ListComp
    visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node: ast.DictComp) -> None:
        self._comprehension(node, [node.key, node.value])


class _CellScope(_Scope):
    """The cell's own scope: order matters (a read before any assignment is an input)."""

    def __init__(self) -> None:
        super().__init__()
        self.bound: set[str] = set()
        self.reads: dict[str, int] = {}

    def load(self, name: str, line: int) -> None:
        super().load(name, line)
        if name not in self.bound:
            self.reads.setdefault(name, line)

    def store(self, name: str) -> None:
        super().store(name)
        self.bound.add(name)

    def visit_Global(self, node: ast.Global) -> None:
        raise CellError(
            f"`global {', '.join(node.names)}` cannot be used in a program cell: every name the cell assigns "
            f"is already bound in the notebook's namespace when the cell finishes.",
            node.lineno,
        )

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        raise CellError("`nonlocal` at cell level has no enclosing function to refer to.", node.lineno)

    def _not_in_program(self, node: ast.AST, what: str) -> None:
        raise CellError(
            f"`{what}` at cell level cannot be part of a program: the cell body is traced once into a dataflow "
            f"graph. Compute values, and use `--block` or `fut.result()` to wait for them.",
            node.lineno,
        )

    def visit_Return(self, node: ast.Return) -> None:
        self._not_in_program(node, "return")

    def visit_Yield(self, node: ast.Yield) -> None:
        self._not_in_program(node, "yield")

    visit_YieldFrom = visit_Yield

    def visit_Await(self, node: ast.Await) -> None:
        self._not_in_program(node, "await")


def analyze(source: str, filename: str = "<cell>", first_line: int = 2) -> CellAnalysis:
    """Parse a cell body whose first line is line ``first_line`` of the cell (after the `%%pathways` line).

    Raises SyntaxError (with the cell's line numbers) or CellError.

    Example::

        a = analyze("x = step(x)\\ny = x + 1\\n")
        a.reads, a.stores        # ({'step': 2, 'x': 2}, ('x', 'y'))
    """
    padded = "\n" * (first_line - 1) + source
    tree = ast.parse(padded, filename=filename, mode="exec")
    scope = _CellScope()
    scope.visit_all(tree.body)
    has_result = bool(tree.body) and isinstance(tree.body[-1], ast.Expr)
    return CellAnalysis(tree=tree, reads=dict(scope.reads), stores=tuple(scope.stores), has_result=has_result)


# ---------------------------------------------------------------- building
def build_function(
    analysis: CellAnalysis,
    *,
    params: list[str],
    constants: dict[str, Any],
    filename: str,
    namespace: dict[str, Any],
) -> Callable[..., dict[str, Any]]:
    """The cell as ``fn(*params) -> {name: value}`` of every name it binds, with globals ``namespace``.

    ``constants`` are non-array inputs the cell also assigns (so they are locals
    of the function); every other name the cell reads is looked up in
    ``namespace`` when the function runs.
    """
    for name in [*params, *constants]:
        if not name.isidentifier():  # they come from ast.Name ids; guard the template anyway
            raise CellError(f"{name!r} is not a Python identifier.")
    template = (
        f"def __pw_make({_CONSTS}, {_LOCALS}):\n"
        f"    def __pw_cell({', '.join(params)}):\n"
        f"        pass\n"
        f"    return __pw_cell\n"
    )
    module = ast.parse(template, filename=filename)
    maker = module.body[0]
    inner = maker.body[0]
    assert isinstance(maker, ast.FunctionDef) and isinstance(inner, ast.FunctionDef)

    body = [_copy(stmt) for stmt in analysis.tree.body]
    if analysis.has_result:
        last = body[-1]
        assign = ast.Assign(targets=[ast.Name(RESULT, ast.Store())], value=last.value)
        body[-1] = ast.copy_location(assign, last)
    prologue = [ast.parse(f"{name} = {_CONSTS}[{name!r}]").body[0] for name in constants]
    ret = ast.parse(f"return {_LOCALS}()").body[0]
    # Generated code sits on the `%%pathways` line (line 1); the functions span the whole cell.
    cell_nodes = {id(n) for stmt in body for n in ast.walk(stmt)}
    inner.body = [*prologue, *body, ret]
    for node in ast.walk(module):
        if id(node) not in cell_nodes and hasattr(node, "lineno"):
            node.lineno = node.end_lineno = 1
            node.col_offset = node.end_col_offset = 0
    maker.end_lineno = inner.end_lineno = max((getattr(n, "end_lineno", 1) or 1 for n in body), default=1)
    ast.fix_missing_locations(module)  # the `__pw_result__ = ...` target takes its statement's position

    code = compile(module, filename, "exec", dont_inherit=True)
    make_code = next(c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == maker.name)
    # The cell body runs as `<module>` code, as a normal cell does: tracebacks read "Cell In[N], line L"
    # and IPython (via `executing`) finds the statement in the cell's source to show it in context.
    consts = tuple(
        _renamed(c, "<module>") if isinstance(c, types.CodeType) and c.co_name == "__pw_cell" else c
        for c in make_code.co_consts
    )
    make_code = make_code.replace(co_consts=consts)
    # Globals are the live user namespace, so helpers, slices and constants resolve as in a normal cell.
    make = types.FunctionType(make_code, namespace, maker.name)
    return make(dict(constants), builtins.locals)


def _renamed(code: types.CodeType, name: str) -> types.CodeType:
    if hasattr(code, "co_qualname"):  # Python >= 3.11
        return code.replace(co_name=name, co_qualname=name)
    return code.replace(co_name=name)


def _copy(node: ast.AST) -> ast.AST:
    import copy

    return copy.deepcopy(node)

"""The layout shows the architecture: counted from the project's own imports and definitions.

Each rule is what a newcomer relies on when reading the tree: no import circle,
a runtime that draws nothing, one public face for everything above it, small
files and functions, errors in errors modules.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "pw_kernel"
RUNTIME = PKG / "runtime"


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PKG.rglob("*.py")}


def _type_only(tree: ast.AST) -> set[int]:
    return {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for n in ast.walk(block)
    }


def _imports(mod: str) -> set[str]:
    """The pw_kernel modules ``mod`` imports anywhere (function bodies too), type-only imports excepted."""
    path = MODULES[mod]
    tree = ast.parse(path.read_text())
    skip = _type_only(tree)
    here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args:
            # importlib.import_module(".magics", __name__): a lazy import is still an import
            arg = node.args[0]
            if not isinstance(arg, ast.Constant):
                continue
            name = arg.value
            targets = [".".join(here + [name.lstrip(".")]) if name.startswith(".") else name]
        else:
            continue
        for t in targets:
            while t and t not in MODULES and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in MODULES and t != mod:
                out.add(t)
    # Importing a module runs its packages' __init__ first (a module's own packages are already running).
    for t in list(out):
        parts = t.split(".")
        for k in range(1, len(parts)):
            parent = ".".join(parts[:k])
            if parent in MODULES and not mod.startswith(parent + ".") and parent != mod:
                out.add(parent)
    return out


GRAPH = {m: _imports(m) for m in MODULES}


def _circles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_anywhere_in_the_package():
    circles = _circles()
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def test_the_runtime_imports_no_view_and_no_layer_above_it():
    above = ("pw_kernel.widgets", "pw_kernel.magics", "pw_kernel.train", "pw_kernel.demo")
    offenders = sorted(
        f"{m} imports {t}" for m, ts in GRAPH.items() if m.startswith("pw_kernel.runtime") for t in ts
        if t.startswith(above) or t == "pw_kernel"
    )
    assert not offenders, "\n".join(offenders)


def test_only_the_runtime_imports_its_implementation_modules():
    """The training layer, the notebook front, the views and the benchmarks use the face, `pw_kernel.runtime`."""
    offenders = sorted(
        f"{m} imports {t}" for m, ts in GRAPH.items() if not m.startswith("pw_kernel.runtime")
        for t in ts if t.startswith("pw_kernel.runtime.")
    )
    for path in [*(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.module if isinstance(node, ast.ImportFrom) else None
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [name or ""]
            offenders += [f"{path.relative_to(ROOT)} imports {n}" for n in names if n.startswith("pw_kernel.runtime.")]
    assert not offenders, "\n".join(offenders)


def test_the_runtime_face_exports_at_most_60_names_and_defines_nothing():
    import pw_kernel.runtime as rt

    assert len(rt.__all__) <= 60, len(rt.__all__)
    tree = ast.parse((RUNTIME / "__init__.py").read_text())
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
    assert defined == [], "the face re-exports only"
    public = {n for n in vars(rt) if not n.startswith("_") and not isinstance(getattr(rt, n), type(rt))}
    assert public - {"annotations"} == set(rt.__all__)


def test_no_function_over_100_lines_and_no_file_over_700():
    long_files, long_functions = [], []
    for mod, path in MODULES.items():
        text = path.read_text()
        if len(text.splitlines()) > 700:
            long_files.append(f"{mod}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 100:
                    long_functions.append(f"{mod}.{node.name}: {n} lines")
    for path in (PKG / "widgets" / "static").glob("*.js"):
        n = len(path.read_text().splitlines())
        if n > 700:
            long_files.append(f"{path.name}: {n} lines")
    assert not long_files and not long_functions, "\n".join(long_files + long_functions)


def test_every_error_class_lives_in_an_errors_module():
    outside = []
    for mod, path in MODULES.items():
        if mod.rsplit(".", 1)[-1] == "errors":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                ast.unparse(b).endswith(("Error", "Exception", "Warning")) for b in node.bases
            ):
                outside.append(f"{mod}.{node.name}")
    assert not outside, "\n".join(outside)


def test_each_subpackage_says_what_it_owns():
    for init in PKG.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 12, f"{init.relative_to(ROOT)} needs a docstring saying what it owns"


def test_nothing_writes_another_class_private_fields():
    """``x._field = ...`` only on ``self`` (or a class's own instances inside that class)."""
    offenders = []
    for mod, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            )
            for t in targets:
                for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if (isinstance(el, ast.Attribute) and el.attr.startswith("_") and not el.attr.endswith("_")
                            and not (isinstance(el.value, ast.Name) and el.value.id in ("self", "cls"))):
                        offenders.append(f"{mod}:{node.lineno}: {ast.unparse(el)}")
    assert not offenders, "\n".join(offenders)

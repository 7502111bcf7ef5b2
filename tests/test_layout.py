"""The layout shows the architecture: counted from the project's own imports and definitions.

Each rule is what a newcomer relies on when reading the tree: no import circle,
a runtime that draws nothing, two public faces for everything above it (the
users' and `extend`, the layers'), a package whose `dir` is its documented API,
small files and functions, errors in errors modules.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "pw_kernel"
RUNTIME = PKG / "runtime"
#: The runtime's public faces: its users' names, and `extend` with the names only the layers above need.
FACES = ("pw_kernel.runtime", "pw_kernel.runtime.extend")


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PKG.rglob("*.py")}


def _rebound(package: str) -> set[str]:
    """Names a package's ``__init__`` binds to something imported from elsewhere (``runtime.devices`` is
    the function from ``api``, not the ``devices`` module): ``from package import name`` gets that."""
    path = MODULES.get(package)
    if path is None or path.name != "__init__.py":
        return set()
    return {
        a.asname or a.name
        for n in ast.parse(path.read_text()).body if isinstance(n, ast.ImportFrom) and n.module
        for a in n.names
    }


def _type_only(tree: ast.AST) -> set[int]:
    return {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for n in ast.walk(block)
    }


def _imports(mod: str, type_only: bool = False) -> set[str]:
    """The pw_kernel modules ``mod`` imports anywhere (function bodies too); type-only imports with ``type_only``."""
    path = MODULES[mod]
    tree = ast.parse(path.read_text())
    skip = set() if type_only else _type_only(tree)
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
            rebound = _rebound(target)
            targets = [target] + [f"{target}.{a.name}" for a in node.names if a.name not in rebound]
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


def _circles(graph: dict[str, set[str]] | None = None) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), of `GRAPH` unless ``graph`` is given."""
    graph = GRAPH if graph is None else graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_anywhere_in_the_package_counting_every_import():
    """No circle, counting function-local and `TYPE_CHECKING` imports too: a package's face names its
    modules for type checkers (and imports them lazily), so its modules import each other directly, never
    their own package's face; below the controller nothing imports it (the dispatcher and completion
    report through `exec/port.py`, a future knows its run only as a `Producer`)."""
    circles = _circles({m: _imports(m, type_only=True) for m in MODULES})
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def test_nothing_below_the_controller_imports_it():
    """Only what sits above the controller imports it, even for types: the faces, the entry calls (`api.py`)
    and `program.py`, whose programs submit to it. Execution reports up through the port; runs and futures
    get a `RunLink` and a `Producer`."""
    above = {"pw_kernel.runtime.exec.controller", "pw_kernel.runtime.api", "pw_kernel.runtime.extend",
             "pw_kernel.runtime.program"}
    offenders = sorted(
        m for m in MODULES if m.startswith("pw_kernel.runtime.") and m not in above
        and "pw_kernel.runtime.exec.controller" in _imports(m, type_only=True)
    )
    assert not offenders, offenders


def test_the_architecture_notes_name_every_runtime_module():
    """docs/architecture.md says what each module of the runtime owns: a module missing there fails."""
    notes = (ROOT / "docs" / "architecture.md").read_text()
    layers = notes[notes.index("## Layers"):notes.index("## Data flows one way")]
    missing = sorted(
        str(p.relative_to(RUNTIME)) for p in RUNTIME.rglob("*.py")
        if p.name != "__init__.py" and p.name not in layers
    )
    assert not missing, f"docs/architecture.md's Layers section does not name: {missing}"


def test_the_notebook_front_uses_only_the_faces_of_the_views_and_the_training_layer():
    """`pw_kernel.magics` draws nothing: it decides which view to show when, and imports the views and the
    training layer through their faces (`pw_kernel.widgets`, `pw_kernel.train`), never one of their modules
    and no private (``_``) module anywhere, type-only imports included."""
    offenders = sorted(
        f"{m} imports {t}" for m in MODULES if m.startswith("pw_kernel.magics")
        for t in _imports(m, type_only=True)
        if t.startswith(("pw_kernel.widgets.", "pw_kernel.train.")) or any(p.startswith("_") for p in t.split("."))
    )
    assert not offenders, "\n".join(offenders)


def test_the_runtime_imports_no_view_and_no_layer_above_it():
    above = ("pw_kernel.widgets", "pw_kernel.magics", "pw_kernel.train", "pw_kernel.demo")
    offenders = sorted(
        f"{m} imports {t}" for m, ts in GRAPH.items() if m.startswith("pw_kernel.runtime") for t in ts
        if t.startswith(above) or t == "pw_kernel"
    )
    assert not offenders, "\n".join(offenders)


def _implementation(target: str) -> bool:
    return target.startswith("pw_kernel.runtime.") and not any(
        target == face or target.startswith(face + ".") for face in FACES[1:]
    )


def test_only_the_runtime_imports_its_implementation_modules():
    """The training layer, the notebook front, the views and the benchmarks use the faces:
    `pw_kernel.runtime`, and `pw_kernel.runtime.extend` for what users do not need."""
    offenders = sorted(
        f"{m} imports {t}" for m, ts in GRAPH.items() if not m.startswith("pw_kernel.runtime")
        for t in ts if _implementation(t)
    )
    for path in [*(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.module if isinstance(node, ast.ImportFrom) else None
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [name or ""]
            offenders += [f"{path.relative_to(ROOT)} imports {n}" for n in names if _implementation(n)]
    assert not offenders, "\n".join(offenders)


def test_the_runtime_faces_export_at_most_60_names_and_define_nothing():
    import importlib

    for face, path in zip(FACES, (RUNTIME / "__init__.py", RUNTIME / "extend.py")):
        mod = importlib.import_module(face)
        assert len(mod.__all__) <= 60, (face, len(mod.__all__))
        tree = ast.parse(path.read_text())
        defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
        assert defined == [], f"{face} re-exports only"
        public = {n for n in vars(mod) if not n.startswith("_") and not isinstance(getattr(mod, n), type(mod))}
        assert public - {"annotations"} == set(mod.__all__), face
    import pw_kernel.runtime as rt
    import pw_kernel.runtime.extend as ext

    assert not set(rt.__all__) & set(ext.__all__), "a name is the users' or the layers', not both"


def _readme_api() -> list[str]:
    """The names the README's "API" section lists: each bullet starts with `pw.NAME`."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## API\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, "README.md needs a `## API` section"
    return re.findall(r"^- `pw\.(\w+)", section.group(1), re.M)


def test_dir_pw_is_the_documented_api():
    """`dir(pw)` lists exactly the README's "API" section (at most 64 names): no helper, no submodule."""
    import pw_kernel as pw

    public = [n for n in dir(pw) if not n.startswith("_")]
    listed = _readme_api()
    assert len(listed) == len(set(listed)), "a name listed twice in the README's API section"
    assert sorted(public) == sorted(pw.__all__)
    assert len(public) <= 64, len(public)
    unlisted, absent = sorted(set(public) - set(listed)), sorted(set(listed) - set(public))
    assert not unlisted, f"in dir(pw), not in the README's API section: {unlisted}"
    assert not absent, f"in the README's API section, not in dir(pw): {absent}"
    for name in public:
        getattr(pw, name)  # the lazy views too
    assert callable(pw.load_ipython_extension) and callable(pw.unload_ipython_extension)  # IPython's entry points


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

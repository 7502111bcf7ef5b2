"""The layout shows the architecture: counted from the project's own imports and definitions.

Each rule is what a newcomer relies on when reading the tree: no import circle,
a runtime that draws nothing, two public faces for everything above it (the
users' and `extend`, the layers'), a package whose `dir` is its documented API,
small files and functions, errors in errors modules; and tests that count and
order instead of timing (the machines they run on are shared and noisy).
"""

from __future__ import annotations

import ast
import pathlib
import re
import textwrap

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


# ------------------------------------------------------------------ tests count and order; they do not time
#: A reading of a clock.
_CLOCK = re.compile(r"^(time\.)?(time|monotonic|perf_counter|process_time)(_ns)?$")
#: A name, attribute or key that says it holds a duration: device_time_s, median_ms, elapsed, took, dt, drawMs.
_DURATION = re.compile(r"(^|_)(elapsed|took|duration|latency|dt|wall)$|_(ms|time_s)$|^ms$|[a-z]Ms$")
#: A page script that keeps a time: performance.now(), or what a timeline redraw returns (its milliseconds).
_JS_TIMING = re.compile(r"performance\.now\(\)|(=|push\()\s*[\w.]*\.redraw\(\)")


def _timed(node: ast.AST, tainted: set[str]) -> bool:
    """Whether ``node`` reads a clock or a duration, or a name assigned from one."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and _CLOCK.match(ast.unparse(n.func)):
            return True
        if isinstance(n, ast.Name) and (n.id in tainted or _DURATION.search(n.id)):
            return True
        if isinstance(n, ast.Attribute) and _DURATION.search(n.attr):
            return True
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and _DURATION.search(str(n.slice.value)):
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and _JS_TIMING.search(n.value):
            return True
    return False


def _number(node: ast.AST) -> bool:
    """A number written out, other than 0 (``> 0`` says a time was taken, not how long it took)."""
    try:
        v = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v != 0


def _is_sleep(stmt: ast.stmt) -> ast.Call | None:
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    return call if isinstance(call, ast.Call) and ast.unparse(call.func) in ("time.sleep", "sleep") else None


def _wall_clock_thresholds(scope: ast.AST, code_string: bool = False) -> list[str]:
    """In one test (or a string of code it runs): an assert that holds a time against a number, a sleep
    for a measured time, a sleep right before an assert, or code that is only a sleep."""
    tainted: set[str] = set()
    assigns = [n for n in ast.walk(scope) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value]
    for _ in range(4):  # (names assigned from names assigned from a clock)
        for a in assigns:
            if _timed(a.value, tainted):
                targets = a.targets if isinstance(a, ast.Assign) else [a.target]
                tainted |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    found = []
    for a in ast.walk(scope):
        if isinstance(a, ast.Assert):
            for c in ast.walk(a.test):
                if isinstance(c, ast.Compare):
                    ops = [c.left, *c.comparators]
                    if any(_timed(o, tainted) for o in ops) and any(_number(o) for o in ops):
                        found.append(f"line {c.lineno}: {ast.unparse(c)}")
        for body in (getattr(a, f, None) for f in ("body", "orelse", "finalbody")):
            for i, stmt in enumerate(body if isinstance(body, list) else []):
                sleep = _is_sleep(stmt)
                if sleep is not None and any(_timed(x, tainted) for x in sleep.args):
                    found.append(f"line {stmt.lineno}: {ast.unparse(stmt)}: a sleep for a measured time")
                elif sleep is not None and i + 1 < len(body) and isinstance(body[i + 1], ast.Assert):
                    found.append(f"line {stmt.lineno}: {ast.unparse(stmt)}, then an assert")
    if code_string and len(scope.body) == 1 and _is_sleep(scope.body[0]):
        found.append(f"a cell that only sleeps: {ast.unparse(scope.body[0])}")
    return found


def _scopes(tree: ast.Module):
    """Each top-level function and method, the module's other statements, and every string that is code."""
    for node in tree.body:
        for d in [node, *(node.body if isinstance(node, ast.ClassDef) else [])]:
            if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield d, False
    yield ast.Module([n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))], []), False
    for s in ast.walk(tree):
        if isinstance(s, ast.Constant) and isinstance(s.value, str) and ("\n" in s.value or "sleep(" in s.value):
            try:
                yield ast.parse(textwrap.dedent(s.value)), True
            except (SyntaxError, ValueError):
                pass


_OLD_THRESHOLDS = [  # what the rule is for: each was in tests/ once, and could fail on a busy machine
    """
def test(page):
    stats = page.evaluate("() => { const zoomed = tl.redraw(); return {zoomed}; }")
    assert stats["zoomed"] < 100
""",
    """
def test(link):
    used = {c["name"]: c["device_time_s"] for c in link.call("clients")}
    ratio = used["heavy"] / used["light"]
    assert 1.4 < ratio < 3.0
""",
    """
def test(run):
    left, since = run.time_left, time.monotonic()
    run.wait()
    actual = time.monotonic() - since
    assert 0.1 < left / actual < 10
""",
    '''
CODE = """
t = me().device_time_s
f(a).result()
node_s = me().device_time_s - t
run = chain.submit(a)
time.sleep(4 * node_s)
run.cancel()
"""
''',
    """
def test(k):
    settle = k.run("time.sleep(0.5)")
""",
    """
def test(w):
    time.sleep(0.5)
    assert w.done()
""",
]
_HANG_GUARD = """
def test(run):
    deadline = time.monotonic() + 60
    while not run.done():
        assert time.monotonic() < deadline, "never finished"
        time.sleep(0.01)
"""


def _flagged(source: str) -> list[str]:
    return [f for scope, code in _scopes(ast.parse(source)) for f in _wall_clock_thresholds(scope, code)]


def test_no_wall_clock_thresholds():
    """The machines tests run on are shared and noisy: a test counts events or compares orders. A time may stop a
    wait that would hang (``assert time.monotonic() < deadline``); how long something takes is a benchmark's."""
    assert all(_flagged(old) for old in _OLD_THRESHOLDS), [old for old in _OLD_THRESHOLDS if not _flagged(old)]
    assert not _flagged(_HANG_GUARD)
    found = [
        f"{path.name} {f}"
        for path in sorted((ROOT / "tests").glob("*.py")) if path.name != "test_layout.py"
        for f in _flagged(path.read_text())
    ]
    assert not found, "a test holds a measured time against a number, or sleeps and then expects:\n" + "\n".join(found)

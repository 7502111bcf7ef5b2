"""The walk of one warm call through pw_kernel: which files and functions `f(x).result()` crosses.

    python benchmarks/call_walk.py [--cell] [--show] [--json out.json] [--quick]

Follows one warm one-node call (`f(x).result()` on a compiled function) with
`sys.setprofile` on the calling thread, keeping only pw_kernel's own frames:

* calls: pw_kernel function calls made; functions: distinct ones; files: distinct files;
* returns to a file left: how often control comes back into a file it had gone
  down out of (controller -> dispatcher -> lifecycle -> runahead -> lifecycle
  counts once, for the lifecycle);
* upward calls: calls from a module into one it does not import, directly or
  through others (every import counted, as `tests/test_layout.py` draws the
  tree): a dispatcher calling the controller back, a lifecycle calling the
  run-ahead gate it was handed. A walk with none goes down the import tree
  and comes back only by returning: down and back once. The one way up that
  is designed, and not counted, is the controller's effect applier that
  execution's `Port` was handed (`exec/port.py` -> `Controller._apply`): a
  report's effects are carried out in one place (docs/architecture.md).

``--cell`` follows a rerun ``%%pathways --block`` cell instead (needs IPython).
``--show`` prints the file sequence and each upward call. ``--quick`` changes
nothing (one call is all it follows); the suite runs it and checks that the
warm call makes no upward call. The architecture notes (docs/architecture.md)
quote the figures before and after the one-way execution layer.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import common

ROOT = str(Path(__file__).resolve().parents[1] / "pw_kernel")


def walk(fn) -> list[tuple[str, str, str]]:
    """(event, file, function) of every pw_kernel frame's call and return while ``fn()`` runs."""
    seen: list[tuple[str, str, str]] = []

    def prof(frame, event, arg):
        if event in ("call", "return"):
            f = frame.f_code.co_filename
            if f.startswith(ROOT):
                seen.append((event, os.path.relpath(f, ROOT), frame.f_code.co_name))

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def _imports() -> dict[str, set[str]]:
    """file (relative to pw_kernel/) -> the files it imports, directly or through others (every import)."""
    sys.path.insert(0, str(Path(ROOT).parent / "tests"))
    import test_layout  # the tree as the layout test draws it

    graph = {m: test_layout._imports(m, type_only=True) for m in test_layout.MODULES}
    rel = {m: os.path.relpath(p, ROOT) for m, p in test_layout.MODULES.items()}
    closure: dict[str, set[str]] = {}
    for m in graph:
        seen, todo = set(), [m]
        while todo:
            for n in graph[todo.pop()]:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        closure[rel[m]] = {rel[n] for n in seen}
    return closure


def figures(seen: list[tuple[str, str, str]]) -> dict:
    calls = [(f, n) for e, f, n in seen if e == "call"]
    imports = _imports()
    upward = []
    stack: list[tuple[str, str]] = []
    for event, f, name in seen:
        if event == "call":
            designed = (stack and stack[-1][0].endswith("exec/port.py") and f.endswith("exec/controller.py")
                        and name == "_apply")  # (the applier the port was handed: see the module's docstring)
            if stack and stack[-1][0] != f and f not in imports.get(stack[-1][0], ()) and not designed:
                upward.append(f"{stack[-1][0]}:{stack[-1][1]} -> {f}:{name}")
            stack.append((f, name))
        elif stack:
            stack.pop()
    # The file the walk is in at each step: each call enters its file, each return goes back to the caller's.
    stack: list[str] = []
    path: list[str] = []
    for event, f, _ in seen:
        if event == "call":
            stack.append(f)
        elif stack:
            stack.pop()
        here = stack[-1] if stack else "<caller>"
        if not path or path[-1] != here:
            path.append(here)
    left: set[str] = set()
    returns = 0
    for prev, here in zip(path, path[1:]):
        left.add(prev)
        if here in left and here != "<caller>":
            returns += 1
    return {
        "calls": len(calls),
        "functions": len(set(calls)),
        "files": len({f for f, _ in calls}),
        "returns_to_a_file_left": returns,
        "upward_calls": upward,
        "path": path,
    }


def warm_call() -> dict:
    import jax
    import jax.numpy as jnp

    import pw_kernel as pw

    s = pw.slice(1, name="s")
    f = pw.compiled(lambda x: x * 2, slice=s, name="f")
    x = jax.device_put(jnp.ones(4), s.sharding())
    for _ in range(50):  # warm: traced, compiled, every cache filled
        f(x).result()
    return figures(walk(lambda: f(x).result()))


def rerun_cell() -> dict:
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "pw_kernel")
    ip.run_cell(
        "import jax.numpy as jnp\nimport pw_kernel as pw\n"
        "s = pw.slice(2, name='s')\nf = pw.compiled(lambda x: x * 2, slice=s, name='f')\nv = jnp.ones(4)"
    )
    cell = "y = f(v) + 1\n"
    for _ in range(3):
        ip.run_cell_magic("pathways", "--block", cell)
    return figures(walk(lambda: ip.run_cell_magic("pathways", "--block", cell)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", action="store_true", help="a rerun %%%%pathways --block cell instead of f(x).result()")
    ap.add_argument("--show", action="store_true", help="print the files in the order the walk visits them")
    ap.add_argument("--json", default=None, help="write results here")
    ap.add_argument("--quick", action="store_true", help="the same (it follows one call)")
    args = ap.parse_args()
    out = rerun_cell() if args.cell else warm_call()
    common.write_json(args.json, {"benchmark": "call_walk", "machine": common.machine(), "cell": args.cell, **out})
    what = "a rerun %%pathways --block cell" if args.cell else "a warm f(x).result()"
    print(f"{what}: {out['files']} files, {out['functions']} functions, {out['calls']} calls, "
          f"{out['returns_to_a_file_left']} returns to a file it had left, {len(out['upward_calls'])} upward calls")
    if args.show:
        print(" -> ".join(out["path"]))
        for up in out["upward_calls"]:
            print("  upward:", up)


if __name__ == "__main__":
    main()

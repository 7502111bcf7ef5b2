"""`%%pathways`: a cell traced into a program, submitted, its outputs bound at once; shown, and waited for.

`cell.py` says what the cell reads and assigns and builds its function; this
module makes that function a `Program`, submits it, binds the names, shows the
run (live in a kernel) and, with ``--block``, waits for it (`live.wait_for`).
"""

from __future__ import annotations

import ast
import functools
import keyword
import sys
from typing import Any

import jax
import numpy as np
from IPython.core.error import UsageError

from ..runtime import Future, PathwaysError, Program, TracingError, VirtualSlice, controller, get
from ..widgets import WithText, describe_outputs, graph_view, run_view, timeline_view
from .cell import RESULT, analyze, build_function
from .cell_cache import CellCache, CellTrace, fresh, rebindable
from .ctrl_c import ctrl_c_message
from .errors import CellError
from .live import LiveDisplays, Progress, in_kernel, update_display, wait_for, widgets_here
from .reporting import FailureReporter
from .tracebacks import Presenter

CELL_DOC = """Run the cell as a dataflow program: ``%%pathways [options]`` then the program body.

The cell is the body of an implicit ``@pw.program``. Names it reads from the
notebook that hold arrays or futures are traced inputs; other names it reads
(compiled functions, slices, ints, helper functions) are constants. Names it
assigns are outputs: bound to ``pw.Future`` s at once (to arrays with
``--block``). Python ``for`` loops over ranges unroll; ``print`` runs at trace
time. A later cell can read the futures of an earlier one without waiting.

Example::

    %%pathways --name step
    x = a(v)
    y = b(x)
    z = a(c(x))

is the Python::

    @pw.program(name="step")        # + slice=, mode=, tenant= from the options
    def step(v):                     # v: the arrays/futures the cell reads
        x = a(v)
        y = b(x)
        z = a(c(x))
        return {"x": x, "y": y, "z": z}

    run = step.submit(v)             # returns at once
    x, y, z = (run.outputs[k] for k in ("x", "y", "z"))   # pw.Futures
    # --block [--timeout S]:   run.wait(S); x, y, z = pw.get((x, y, z))
    # --out r:                 r = run
    # --graph:                 display(step.trace(v))     (graphviz dot)
    # --timeline:              display(run.events as a timeline)

A cell run again unchanged reuses its trace and plan, as ``step.submit(v)``
called again does: it is traced again when its text or options change, an
input's shape, dtype, sharding or slice changes, or a name it reads (also through
a helper function) holds something else; ``print`` runs when it is traced.

A trailing expression is the cell's result. Errors while tracing point at the
cell line; a run that fails later is reported after the next cell you execute,
and its futures raise the error. Ctrl-C while blocking cancels the run.
"""

#: Values a cell traces as program inputs (other leaves are constants).
_ARRAYS = (Future, jax.Array, np.ndarray, np.generic)


class CellMagic:
    """Runs `%%pathways` cells in ``shell``: errors through ``presenter``, failures to ``reporter``, views live."""

    def __init__(self, shell: Any, presenter: Presenter, reporter: FailureReporter, live: LiveDisplays):
        self.shell = shell
        self.presenter = presenter
        self.reporter = reporter
        self.live = live
        self.cache = CellCache()  # traces of cells run before, reused when run again unchanged

    def run(self, args, line: str, cell: str):
        """The cell with its parsed options ``args``: binds its outputs; returns its result (arrays with --block)."""
        ns = self.shell.user_ns
        _check_options(args)
        slice_ = self._find_slice(args.slice) if args.slice else None
        number = self.presenter.cell_number()
        name = args.name or f"In[{number}]"
        entry = self._reusable(line, cell, slice_)
        if entry is None:
            entry = self._traced(args, line, cell, number, name, slice_)
        else:  # the graph's source lines point at the first run's code: they read as this cell now
            self.presenter.add_cell_file(entry.filename, number)
        prog, traces = entry.program, entry.traces
        inputs = [ns[n] for n in entry.params]
        try:
            graph = prog.trace(*inputs)  # (the one trace, or the cache's graph): submitted as it is
            source_map = self.presenter.source_map(graph) | self.presenter.fused_source_map(graph, entry.filename, number)
            # Its error, if it fails, shows this cell's lines, wherever it is raised later.
            on_error = functools.partial(self.presenter.presentable, relabel=False)
            run, tree = prog.call_run(*inputs, name=name, source_map=source_map, on_error=on_error, graph=graph)
            graph = run.graph  # (with donated inputs pw still reads kept: the graph that runs)
        except PathwaysError as e:
            self.cache.put(line, cell, None)
            if isinstance(e, TracingError) and e.args and isinstance(e.args[0], str):
                e.args = (e.args[0].replace("`@pw.program(slice=s)`", "`%%pathways --slice NAME`"), *e.args[1:])
            raise self.presenter.presentable(e) from e.__cause__
        except BaseException:
            self.cache.put(line, cell, None)
            raise
        bound = _values_to_bind(entry, graph, traced=entry.traces != traces)
        self.cache.put(line, cell, entry if entry.key is not None else None)

        try:
            outputs = dict(tree)
            side = {k: _unwrapped_name(v) for k, v in bound.items()}
            result = outputs.pop(RESULT, side.pop(RESULT, None))
            ns.update(side)
            ns.update(outputs)
            if args.out:
                ns[args.out] = run
            return self._show_and_wait(run, graph, outputs, result, args)
        except KeyboardInterrupt as e:
            if run.cancel():
                print(ctrl_c_message([run]), file=sys.stderr)
            raise self.presenter.presentable(e) from None

    def _reusable(self, line: str, cell: str, slice_) -> CellTrace | None:
        """This text's last trace when nothing it depends on changed (see `cell_cache`), else None.

        ``slice_``: where ``--slice`` puts this run's glue (a notebook variable may name another slice now).
        """
        entry = self.cache.get(line, cell)
        if entry is None or entry.key is None or entry.program.slice is not slice_:
            return None
        ns = self.shell.user_ns
        if self.cache.key(entry.reads, _traced_names(entry.reads, ns), ns, controller()) != entry.key:
            return None
        return entry

    def _traced(self, args, line: str, cell: str, number: int, name: str, slice_) -> CellTrace:
        """The cell compiled into a new `Program` (traced when first called), with its key for later runs."""
        ns = self.shell.user_ns
        fn, params, out_names, filename, reads = self._compile(f"%%pathways {line}".rstrip(), cell, number)
        # The names the cell binds to plain Python values (not program outputs), filled in while it is traced.
        python_values: dict[str, Any] = {}

        def cell_program(*inputs):
            outs, side = _split_outputs(fn(*inputs), out_names)
            python_values.clear()
            python_values.update(side)
            entry.traces += 1
            return outs

        tenant = args.tenant or "default"
        prog = Program(cell_program, name=name, slice=slice_, mode=args.mode, tenant=tenant, controller=controller)
        key = self.cache.key(reads, params, ns, controller())  # before the trace: it may change what it reads
        entry = CellTrace(key, prog, params, filename, python_values, reads)
        return entry

    def _find_slice(self, name: str):
        live = list(controller().status().slices)
        for s in live:
            if s.name == name:
                return s
        value = self.shell.user_ns.get(name)
        if isinstance(value, VirtualSlice):
            if value.released:
                raise UsageError(
                    f"`%%pathways --slice {name}`: slice {value.name!r} was released. Ask for a new one with "
                    f"`{name} = pw.slice({value.size}, ...)`."
                )
            return value
        have = ", ".join(f"{s.name!r} ({s.size} devices)" for s in live) or "none yet"
        raise UsageError(
            f"`%%pathways --slice {name}`: no live slice named {name!r}. Live slices: {have}. "
            f"Create one with `pw.slice(n, name={name!r})`, or pass a variable that holds a slice."
        )

    def _compile(self, header: str, cell: str, number: int):
        """The cell as a function of its traced inputs: (fn, input names, output names, filename, names read)."""
        ip = self.shell
        ns = ip.user_ns
        # Leading blank lines: IPython's transforms drop them, so count them into the first line number.
        lines = cell.splitlines(keepends=True)
        skip = 0
        while skip < len(lines) and not lines[skip].strip():
            skip += 1
        body = "".join(lines[skip:])
        try:
            ast.parse(body)
        except SyntaxError:
            body = ip.transform_cell(body)  # IPython syntax (`!cmd`, `%magic`) becomes Python
        # Tracebacks and JAX's source info read the cell from linecache under IPython's name for it; the
        # `%%pathways` line is a comment there so that the text parses (tracebacks then show whole cells).
        text = f"# {header}\n" + "\n" * skip + body
        filename = ip.compile.cache(text, number, raw_code=f"{header}\n{cell}")
        self.presenter.add_cell_file(filename, number)
        try:
            analysis = analyze(body, filename, 2 + skip)
        except CellError as e:
            where = f" (cell line {e.line})" if e.line else ""
            raise UsageError(f"`%%pathways`{where}: {e}") from None
        if not analysis.stores and not analysis.has_result:
            raise UsageError(
                "`%%pathways`: the cell assigns no names and ends in no expression, so its program would have no "
                "outputs. Assign what you want to keep (`y = f(x)`), or end the cell with the value to show."
            )
        unknown = analysis.unknown(ns)
        if unknown:
            listed = ", ".join(f"`{n}` (line {ln})" for n, ln in unknown.items())
            raise UsageError(
                f"`%%pathways`: the cell reads {listed} before assigning it, and no such name exists in the "
                f"notebook. Define it in an earlier cell, or assign it in this cell before it is read."
            )
        params = _traced_names(analysis.reads, ns)
        constants = {n: ns[n] for n in analysis.reads if n in ns and n not in params and n in analysis.stores}
        fn = build_function(analysis, params=params, constants=constants, filename=filename, namespace=ns)
        return fn, params, [*analysis.stores, RESULT], filename, list(analysis.reads)

    def _show_and_wait(self, run, graph, outputs: dict[str, Any], result, args):
        """Display the run (and its graph and timeline), then with ``--block`` wait and bind arrays."""
        from IPython.display import display as ipy_display

        leaves = {k: jax.tree_util.tree_leaves(v) for k, v in outputs.items()}
        live = in_kernel(self.shell)
        widgets = widgets_here(self.shell)  # in a notebook: live widgets; elsewhere: text/HTML views
        if args.graph:
            ipy_display(graph if widgets else graph_view(graph))
        # With --block a failure is raised in this cell with its traceback: the run's view names it in one line.
        condense = self.presenter.headline if args.block else self.presenter.condense
        renders, run_widget = _renders(run, leaves, condense, widgets, args.timeline)
        if live:  # a view that updates itself shows a failure that comes before the cell ends
            self.reporter.shown_in_cell(run)
        handles = []
        if live or not args.block:  # a terminal can't update a display: there a blocking cell shows it once, at the end
            handles = [(ipy_display(render(), display_id=True), render) for render in renders]
        if live:
            for handle, render in handles:
                self.live.watch(run, handle, render)
        if not args.block:
            return result

        progress = Progress(live, handles[0] if handles else None, self.presenter.condense)
        wait_for([run], args.timeout, "%%pathways --block", progress, self.presenter.presentable)
        values = get(outputs) if run.state == "done" else None
        if values is not None:  # the names are bound to arrays now, and the views say so
            leaves.update({k: jax.tree_util.tree_leaves(v) for k, v in values.items()})
            if run_widget is not None:
                run_widget.outputs = describe_outputs(leaves)
        if live:  # the final state, also when the run took less than a refresh
            self.live.unwatch(run)  # a refresh under way ends first: what is drawn here is the last word
            for handle, render in handles:
                update_display(handle, render())
        else:
            for render in renders:
                ipy_display(render())
        if values is None:
            self.reporter.mark_reported(run)
            raise self.presenter.presentable(run.error)
        self.shell.user_ns.update(values)
        return get(result) if result is not None else None


def _traced_names(reads: list[str], ns: dict) -> list[str]:
    """Of the names a cell reads, those bound to arrays or futures: its program's traced inputs, in order."""
    return [n for n in reads if n in ns and _is_traced(ns[n])]


def _values_to_bind(entry: CellTrace, graph, traced: bool) -> dict[str, Any]:
    """The plain Python values this run of the cell binds: as its trace made them (``traced``), else copies of
    what the trace of ``graph`` made, as a new run of the cell would make them. A trace whose values a later
    run could not bind again (`rebindable`) makes the cell uncacheable."""
    made = entry.bound.get(graph)
    if not traced and made is not None:
        return {k: fresh(v) for k, v in made.items()}
    if entry.key is not None and not rebindable(entry.python_values):
        entry.key = None
    if entry.key is not None:  # a pristine copy for the runs that reuse this graph
        entry.bound[graph] = {k: fresh(v) for k, v in entry.python_values.items()}
    return dict(entry.python_values)


def _renders(run, leaves: dict[str, list[Any]], condense, widgets: bool, timeline: bool):
    """How to draw the run (and its timeline with ``timeline``): live widgets, else text/HTML views."""
    run_widget = None
    if widgets:
        from ..widgets import RunWidget
        from ..widgets import timeline as timeline_widget

        run_widget = RunWidget(run, leaves, condense=condense)
        timeline_view_ = timeline_widget([run]) if timeline else None

        def render_run():
            return WithText(run_widget, run_view(run, leaves, condense=condense))

        def render_timeline():
            return timeline_view_
    else:

        def render_run():
            return run_view(run, leaves, condense=condense)

        def render_timeline():
            return timeline_view(run.events, title=f"run {run.id} {run.name!r}", runs=[run])

    return ([render_run, render_timeline] if timeline else [render_run]), run_widget


def _check_options(args) -> None:
    if args.timeout is not None:
        if not args.block:
            raise UsageError("`%%pathways --timeout S` limits how long `--block` waits; add `--block`.")
        if not args.timeout > 0:
            raise UsageError(
                f"`%%pathways --timeout {args.timeout}`: the timeout must be a positive number of seconds."
            )
    if args.out is not None and (not args.out.isidentifier() or keyword.iskeyword(args.out)):
        raise UsageError(f"`%%pathways --out {args.out}`: {args.out!r} is not a valid variable name.")


def _is_traced(value: Any) -> bool:
    """Arrays and futures (and pytrees made only of them and hashable constants) are traced inputs.

    Any registered pytree counts: lists and dicts, and also optax states, a `pw.PipelineState`,
    dataclasses registered with JAX.
    """
    if isinstance(value, _ARRAYS):
        return True
    leaves, treedef = jax.tree_util.tree_flatten(value)
    if jax.tree_util.treedef_is_leaf(treedef) or not any(isinstance(x, _ARRAYS) for x in leaves):
        return False
    for x in leaves:
        if not isinstance(x, _ARRAYS):
            try:
                hash(x)
            except TypeError:
                return False
    return True


def _unwrapped_name(value: Any) -> Any:
    """Functions and classes the cell defines get the qualified name they would have in a normal cell."""
    qualname = getattr(value, "__qualname__", None)
    prefix = "__pw_make.<locals>.__pw_cell.<locals>."
    if isinstance(qualname, str) and qualname.startswith(prefix):
        try:
            value.__qualname__ = qualname[len(prefix) :]
        except (AttributeError, TypeError):
            pass
    return value


def _split_outputs(env: dict[str, Any], names: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Names bound to traced values become program outputs; the rest are plain Python values."""
    outs: dict[str, Any] = {}
    side: dict[str, Any] = {}
    for name in names:
        if name not in env:
            continue
        value = env[name]
        leaves = jax.tree_util.tree_leaves(value)
        traced = [isinstance(x, jax.core.Tracer) for x in leaves]
        if leaves and any(traced):
            if not all(isinstance(x, (jax.core.Tracer, jax.Array)) for x in leaves):
                raise TypeError(
                    f"`%%pathways`: `{name}` mixes values computed by the program with Python values "
                    f"({type(value).__name__} with leaves {[type(x).__name__ for x in leaves]}). A cell's outputs "
                    f"are arrays, or lists / tuples / dicts of arrays; bind Python values to another name."
                )
            outs[name] = value
        else:
            side[name] = value
    return outs, side

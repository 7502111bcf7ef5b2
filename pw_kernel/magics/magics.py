"""The `%%pathways` cell magic and the `%pathways` line magics."""

from __future__ import annotations

import ast
import functools
import keyword
import linecache
import sys
import sysconfig
import threading
import time
import types
from pathlib import Path
from typing import Any

import jax
import numpy as np
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, output_can_be_silenced
from IPython.core.magic_arguments import argument, kwds, magic_arguments, parse_argstring

import pw_kernel as pw

from . import display
from .cell import RESULT, CellError, analyze, build_function
from .reporting import FailureReporter

#: Blocking waits show progress once they have lasted this long (seconds).
PROGRESS_AFTER_S = 2.0
#: How often that progress is refreshed (seconds).
PROGRESS_EVERY_S = 1.0
#: How often a blocking wait checks for completion and refreshes progress (seconds).
POLL_S = 0.2
#: How often live displays of runs are refreshed in a kernel (seconds).
LIVE_PERIOD_S = 0.25

_LIB_DIRS = tuple(
    {
        str(Path(p).resolve())
        for p in (
            *(sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")),
            Path(pw.__file__).parent,
            Path(jax.__file__).parent,
        )
        if p
    }
)


#: Values a cell traces as program inputs (other leaves are constants).
_ARRAYS = (pw.Future, jax.Array, np.ndarray, np.generic)


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


def _widgets():
    """The widgets module when anywidget is installed, else None (the text/HTML views stand in)."""
    try:
        import anywidget  # noqa: F401

        from .. import widgets
    except ImportError:
        return None
    return widgets


def _update(handle, obj) -> None:
    """Replace what ``handle`` shows with ``obj``, in place.

    `DisplayHandle.update` hands an object with ``_ipython_display_`` (our widgets) to that method,
    which displays it anew in whatever cell is running now; its mimebundle, sent by display id, updates
    the original display instead.
    """
    if hasattr(obj, "_ipython_display_") and hasattr(obj, "_repr_mimebundle_"):
        bundle = obj._repr_mimebundle_()
        if bundle is not None:
            data, metadata = bundle
            handle.update(data, metadata=metadata, raw=True)
        return
    handle.update(obj)


class _LiveDisplays:
    """Refreshes the displays of unfinished runs from one background thread (in a kernel only)."""

    def __init__(self, period: float = LIVE_PERIOD_S):
        self.period = period
        self._items: list[list[Any]] = []  # [run, handle, render, last_key]
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, run, handle, render) -> None:
        with self._cond:
            if self._closed:
                return
            self._items.append([run, handle, render, (run.state, run.nodes_done)])
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="pw-live-displays", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                items = list(self._items)
            finished = []
            for item in items:
                run, handle, render, last = item
                key = (run.state, run.nodes_done)
                if key != last:
                    try:
                        _update(handle, render())
                    except Exception:  # the front-end went away: stop refreshing this one
                        finished.append(item)
                        continue
                    item[3] = key
                if run.done() and key == item[3]:
                    finished.append(item)
            with self._cond:
                for item in finished:
                    if item in self._items:
                        self._items.remove(item)
                self._cond.wait(self.period)


class _Progress:
    """Progress of a blocking wait: a refreshed display in a kernel, a rewritten stderr line in a terminal."""

    def __init__(self, in_kernel: bool, handle: tuple[Any, Any] | None = None, condense=str):
        self.in_kernel = in_kernel
        self.condense = condense
        self.handle = handle  # (DisplayHandle, render) of the run's own display, when it has one
        self.own = None  # else a display of the run being waited for, made on the first refresh
        self.line_open = False

    def show(self, run) -> None:
        if not self.in_kernel:
            print("\r" + display.progress_line(run), end="", file=sys.stderr, flush=True)
            self.line_open = True
            return
        if self.handle is not None:  # the run's own display: refresh it (elapsed time, nodes done)
            handle, render = self.handle
            _update(handle, render())
            return
        view = display.run_view(run, condense=self.condense)
        if self.own is None:
            from IPython.display import display as ipy_display

            self.own = ipy_display(view, display_id=True)
        else:
            self.own.update(view)

    def close(self) -> None:
        if self.line_open:
            print(file=sys.stderr, flush=True)
            self.line_open = False


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

A trailing expression is the cell's result. Errors while tracing point at the
cell line; a run that fails later is reported after the next cell you execute,
and its futures raise the error. Ctrl-C while blocking cancels the run.
"""

LINE_DOC = """Inspect and control the controller: ``%pathways COMMAND [RUN]``.

Commands, and the Python each one is::

    %pathways status        print(pw.controller().status())        # islands, slices, runs
    %pathways devices       pw.islands(); pw.devices()              # devices and their slices
    %pathways timeline      pw.controller().events.query()          # every node event so far
    %pathways graph NAME    pw.controller().runs[...].graph         # a run's (or a pw.Program's) graph
    %pathways wait [RUN]    pw.controller().run(RUN).wait()         # all unfinished runs without RUN
    %pathways cancel RUN    pw.controller().run(RUN).cancel()
    %pathways reset         pw.controller().cancel_all(); [s.release() for s in slices]

RUN is a run id, a run name (``--name`` of a cell, ``In[5]`` by default), or a
variable holding a Run (``--out``) or a Future. Ctrl-C during ``wait`` cancels
what it waits for.
"""

_COMMANDS = ("status", "devices", "timeline", "graph", "wait", "cancel", "reset")


@magics_class
class PathwaysMagics(Magics):
    """`%%pathways` (a cell as a program) and `%pathways` (status, devices, timeline, graph, wait, cancel, reset)."""

    def __init__(self, shell):
        super().__init__(shell)
        self.reporter = FailureReporter(shell, condense=self._condense)
        self.live = _LiveDisplays()
        self._cell_files: dict[str, int] = {}  # filenames this magic compiled -> execution count

    def close(self) -> None:
        self.live.close()

    # ------------------------------------------------------------ %%pathways
    @magic_arguments(name="%pathways")
    @kwds(description=CELL_DOC)
    @argument("--name", metavar="NAME", help="name of the program and its run (default: In[N])")
    @argument("--slice", metavar="NAME", help="slice (name or variable) for glue ops that read no device value")
    @argument("--block", action="store_true", help="wait for the run; bind arrays instead of futures")
    @argument("--timeout", type=float, metavar="S", help="with --block: give up waiting after S seconds")
    @argument("--graph", action="store_true", help="show the program graph")
    @argument("--timeline", action="store_true", help="show this run on a timeline")
    @argument("--out", metavar="VAR", help="bind the Run to VAR")
    @argument("--mode", choices=("fused", "chained", "auto"), help="execution mode (default: auto)")
    @argument("--tenant", metavar="NAME", help="tenant for multi-tenant scheduling (default: 'default')")
    @output_can_be_silenced
    @cell_magic("pathways")
    def pathways_cell(self, line: str, cell: str):
        args = self._parse(self.pathways_cell, line, "%%pathways")
        return self._run_cell(args, line, cell)

    # ------------------------------------------------------------- %pathways
    @magic_arguments(name="pathways")
    @kwds(description=LINE_DOC)
    @argument("command", choices=_COMMANDS, help="what to do")
    @argument("target", nargs="?", metavar="RUN", help="run id or name (graph: a run or a pw.Program variable)")
    @line_magic("pathways")
    def pathways_line(self, line: str):
        args = self._parse(self.pathways_line, line, "%pathways")
        return getattr(self, f"_cmd_{args.command}")(args.target)

    # ---------------------------------------------------------------- parsing
    def _parse(self, fn, line: str, magic: str):
        try:
            return parse_argstring(fn, line)
        except UsageError as e:
            usage = " ".join(fn.parser.format_usage().replace("::", "").split())
            raise UsageError(f"`{magic} {line.strip()}`: {e}\nUsage: {usage}\nSee `{magic}?` for details.") from None

    def _find_slice(self, name: str):
        c = pw.controller()
        live = list(c.status().slices)
        for s in live:
            if s.name == name:
                return s
        value = self.shell.user_ns.get(name)
        if isinstance(value, pw.VirtualSlice):
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

    # ------------------------------------------------------------ cell magic
    def _run_cell(self, args, line: str, cell: str):
        ip = self.shell
        ns = ip.user_ns
        if args.timeout is not None:
            if not args.block:
                raise UsageError("`%%pathways --timeout S` limits how long `--block` waits; add `--block`.")
            if not args.timeout > 0:
                raise UsageError(
                    f"`%%pathways --timeout {args.timeout}`: the timeout must be a positive number of seconds."
                )
        if args.out is not None and (not args.out.isidentifier() or keyword.iskeyword(args.out)):
            raise UsageError(f"`%%pathways --out {args.out}`: {args.out!r} is not a valid variable name.")
        slice_ = self._find_slice(args.slice) if args.slice else None

        number = self._cell_number()
        name = args.name or f"In[{number}]"
        fn, params, out_names, filename = self._compile_cell(f"%%pathways {line}".rstrip(), cell, number)
        # The names the cell binds to plain Python values (not program outputs), filled in while it is traced.
        python_values: dict[str, Any] = {}

        def cell_program(*inputs):
            outs, side = _split_outputs(fn(*inputs), out_names)
            python_values.clear()
            python_values.update(side)
            return outs

        prog = pw.program(cell_program, name=name, slice=slice_, mode=args.mode, tenant=args.tenant or "default")
        inputs = [ns[n] for n in params]
        try:
            graph = prog.trace(*inputs)
            source_map = {**self._source_map(graph), **self._fused_source_map(graph, filename, number)}
            run = prog.submit(*inputs, name=name, source_map=source_map, _claim=True)
            self._present_run_errors(run)
        except pw.PathwaysError as e:
            if isinstance(e, pw.TracingError) and e.args and isinstance(e.args[0], str):
                e.args = (e.args[0].replace("`@pw.program(slice=s)`", "`%%pathways --slice NAME`"), *e.args[1:])
            raise self._presentable(e) from e.__cause__

        try:
            outputs = dict(run.outputs)
            side = {k: _unwrapped_name(v) for k, v in python_values.items()}
            result = outputs.pop(RESULT, side.pop(RESULT, None))
            ns.update(side)
            ns.update(outputs)
            if args.out:
                ns[args.out] = run
            return self._show_and_wait(run, graph, outputs, result, args)
        except KeyboardInterrupt as e:
            if run.cancel():
                print(f"pw_kernel: Ctrl-C cancelled run {run.id} ({run.name!r}).", file=sys.stderr)
            raise self._presentable(e) from None

    def _compile_cell(self, header: str, cell: str, number: int):
        """The cell as a function of its traced inputs: (fn, input names, output names, filename)."""
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
        self._cell_files[filename] = number
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
        params = [n for n in analysis.reads if n in ns and _is_traced(ns[n])]
        constants = {n: ns[n] for n in analysis.reads if n in ns and n not in params and n in analysis.stores}
        fn = build_function(analysis, params=params, constants=constants, filename=filename, namespace=ns)
        return fn, params, [*analysis.stores, RESULT], filename

    def _show_and_wait(self, run, graph, outputs: dict[str, Any], result, args):
        """Display the run (and its graph and timeline), then with ``--block`` wait and bind arrays."""
        from IPython.display import display as ipy_display

        leaves = {k: jax.tree_util.tree_leaves(v) for k, v in outputs.items()}
        live = self._in_kernel()
        widgets = _widgets() if live else None  # in a notebook: live widgets; elsewhere: text/HTML views
        if args.graph:
            ipy_display(graph if widgets else display.graph_view(graph))

        # With --block a failure is raised in this cell with its traceback: the run's view names it in one line.
        condense = self._headline if args.block else self._condense
        if widgets:
            run_widget = widgets.RunWidget(run, leaves, condense=condense)
            timeline_widget = widgets.timeline([run]) if args.timeline else None

            def render_run():
                return display.WithText(run_widget, display.run_view(run, leaves, condense=condense))

            def render_timeline():
                return timeline_widget
        else:

            def render_run():
                return display.run_view(run, leaves, condense=condense)

            def render_timeline():
                return display.timeline_view(run.events, title=f"run {run.id} {run.name!r}")

        renders = [render_run, render_timeline] if args.timeline else [render_run]
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

        progress = _Progress(self._in_kernel(), handles[0] if handles else None, self._condense)
        self._wait([run], args.timeout, "%%pathways --block", progress)
        values = pw.get(outputs) if run.state == "done" else None
        if values is not None:  # the names are bound to arrays now, and the views say so
            leaves.update({k: jax.tree_util.tree_leaves(v) for k, v in values.items()})
            if widgets:
                run_widget.outputs = display.describe_outputs(leaves)
        if not live:
            for render in renders:
                ipy_display(render())
        for handle, render in handles:  # the final state, also when the run took less than a refresh
            _update(handle, render())
        if values is None:
            self.reporter.mark_reported(run)
            raise self._presentable(run.error)
        self.shell.user_ns.update(values)
        return pw.get(result) if result is not None else None

    # --------------------------------------------------------------- waiting
    def _wait(self, runs: list[Any], timeout: float | None, api: str, progress: _Progress | None = None) -> None:
        """Block until ``runs`` are final, showing progress after a while; Ctrl-C cancels them."""
        progress = progress or _Progress(self._in_kernel(), condense=self._condense)
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        next_progress = start + PROGRESS_AFTER_S
        try:
            for run in runs:
                while True:
                    now = time.monotonic()
                    step = POLL_S if deadline is None else min(POLL_S, max(deadline - now, 0.0))
                    try:
                        run.wait(step)
                        break
                    except pw.TimeoutError:
                        pass
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        raise self._presentable(self._timeout_error(api, timeout, run, runs))
                    if now >= next_progress:
                        progress.show(run)
                        next_progress = now + PROGRESS_EVERY_S
        except KeyboardInterrupt as e:
            for r in runs:
                r.cancel()  # Run.wait already cancelled the one it was waiting for
            progress.close()
            for r in runs:
                if r.state == "cancelled":
                    done, total = r.progress
                    dropped = total - r.nodes_dispatched
                    print(
                        f"pw_kernel: Ctrl-C cancelled run {r.id} ({r.name!r}): {done} of {total} nodes had "
                        f"finished; {dropped} not yet dispatched were dropped.",
                        file=sys.stderr,
                    )
            raise self._presentable(e) from None
        finally:
            progress.close()

    @staticmethod
    def _timeout_error(api: str, timeout: float, run, runs) -> pw.TimeoutError:
        names = ", ".join(repr(r.name) for r in runs if not r.done())
        return pw.TimeoutError(
            f"`{api} --timeout {timeout:g}`: run {run.id} ({run.name!r}) is still {run.state} after {timeout:g} s "
            f"({run.nodes_done}/{run.nodes_total} nodes done). It keeps running ({names}); its outputs are bound "
            f"to futures. Wait with `%pathways wait {run.id}`, or cancel with `%pathways cancel {run.id}`."
        )

    # ------------------------------------------------------------ line magic
    def _cmd_status(self, target):
        c = pw.controller()
        return display.status_view(c.status(), list(c.runs))

    def _cmd_devices(self, target):
        c = pw.controller()
        widgets = _widgets() if self._in_kernel() else None
        if widgets:
            return widgets.show_mesh(c)
        return display.devices_view(list(c.islands), list(c.status().slices))

    def _cmd_timeline(self, target):
        c = pw.controller()
        runs = self._find_runs(target, "timeline") if target is not None else None
        widgets = _widgets() if self._in_kernel() else None
        if widgets:
            return widgets.timeline(runs)
        if runs is not None:
            return display.timeline_view([e for r in runs for e in r.events], title=f"runs {[r.id for r in runs]}")
        return display.timeline_view(list(c.events.nodes), title="all runs")

    def _cmd_graph(self, target):
        if target is None:
            raise UsageError("`%pathways graph NAME`: name a run (id or name) or a variable holding a pw.Program.")
        value = self.shell.user_ns.get(target)
        if isinstance(value, pw.ProgramGraph):
            return self._graph(value)
        if isinstance(value, pw.Program):
            graphs = value.graphs
            if not graphs:
                raise UsageError(
                    f"`%pathways graph {target}`: program {value.name!r} has not been traced yet. Call it (or "
                    f"`{target}.trace(*args)`) first."
                )
            return self._graph(graphs[-1])
        run = self._find_runs(target, "graph")[-1]
        return self._graph(run.graph)

    def _graph(self, graph):
        # In a notebook the graph shows itself (SVG via graphviz `dot`); elsewhere, a text/HTML view.
        return graph if self._in_kernel() and _widgets() else display.graph_view(graph)

    def _cmd_wait(self, target):
        c = pw.controller()
        runs = self._find_runs(target, "wait") if target is not None else [r for r in c.runs if not r.done()]
        if not runs:
            return display.message_view("pw_kernel: no unfinished runs to wait for.")
        self._wait(runs, None, api="%pathways wait")
        failed = [r for r in runs if r.state == "failed"]
        if len(runs) > 1:
            view = display.status_view(c.status(), list(c.runs))
        else:
            view = display.run_view(runs[0], condense=self._condense)
        if failed:
            from IPython.display import display as ipy_display

            ipy_display(view)
            self.reporter.mark_reported(failed[0])
            raise self._presentable(failed[0].error)
        return view

    def _cmd_cancel(self, target):
        if target is None:
            raise UsageError("`%pathways cancel RUN`: name the run (id or name); `%pathways reset` cancels everything.")
        runs = self._find_runs(target, "cancel")
        cancelled = [r for r in runs if r.cancel()]
        if not cancelled:
            states = ", ".join(f"run {r.id} is {r.state}" for r in runs)
            return display.message_view(f"pw_kernel: nothing to cancel ({states}).")
        done = "; ".join(
            f"run {r.id} ({r.name!r}) cancelled at {r.nodes_done}/{r.nodes_total} nodes" for r in cancelled
        )
        return display.message_view(f"pw_kernel: {done}.")

    def _cmd_reset(self, target):
        if target is not None:
            raise UsageError("`%pathways reset` takes no argument: it cancels every run and releases every slice.")
        c = pw.controller()
        n = c.cancel_all()
        slices = list(c.status().slices)
        for s in slices:
            s.release()
        names = ", ".join(repr(s.name) for s in slices) or "none"
        return display.message_view(
            f"pw_kernel: cancelled {n} runs and released {len(slices)} slices ({names}). "
            f"Create slices and compiled functions again with `pw.slice(...)` and `pw.compiled(...)`."
        )

    def _find_runs(self, target: str, cmd: str) -> list[Any]:
        c = pw.controller()
        value = self.shell.user_ns.get(target)
        if isinstance(value, pw.Run):
            return [value]
        if isinstance(value, pw.Future):
            return [value.run]
        if target.lstrip("-").isdigit():
            try:
                return [c.run(int(target))]
            except pw.PathwaysError as e:
                raise UsageError(f"`%pathways {cmd} {target}`: {e}") from None
        runs = [r for r in c.runs if r.name == target or r.graph.name == target]
        if not runs:
            recent = ", ".join(f"{r.id} ({r.name!r})" for r in c.runs[-8:]) or "none yet"
            raise UsageError(
                f"`%pathways {cmd} {target}`: no run named {target!r} and no variable holding a Run or Future. "
                f"Recent runs: {recent}."
            )
        if cmd == "cancel":
            return [r for r in runs if not r.done()] or runs[-1:]
        return runs[-1:]

    # ------------------------------------------------------- presentation
    def _cell_number(self) -> int:
        """The execution count of the cell being run (its ``In[N]``)."""
        files = getattr(self.shell.compile, "_filename_map", {})
        frame = sys._getframe(1)
        while frame is not None:  # the frame running the cell's code: IPython compiled it under In[N]'s name
            n = files.get(frame.f_code.co_filename)
            if n is not None:
                return n
            frame = frame.f_back
        # Called from Python (`ip.run_cell_magic`): IPython >= 9 counts the cell before running it.
        import IPython

        return self.shell.execution_count - (1 if IPython.version_info >= (9,) else 0)

    def _in_kernel(self) -> bool:
        return getattr(self.shell, "kernel", None) is not None

    def _cell_label(self, filename: str) -> str | None:
        n = self._cell_files.get(filename)
        if n is None:
            n = getattr(self.shell.compile, "_filename_map", {}).get(filename)
        return None if n is None else f"Cell In[{n}]"

    def _where(self, filename: str, line: int) -> str:
        label = self._cell_label(filename) or filename
        text = linecache.getline(filename, line).strip()
        return f"{label}, line {line}" + (f": {text}" if text else "")

    def _condense(self, text: str) -> str:
        return self._relabel(display.condense_frames(text, self._is_user_file, self._cell_label))

    def _relabel(self, text: str) -> str:
        """``text`` with every cell's temporary filename read as ``Cell In[N]`` (frames and "at ..." lines)."""
        files = {**getattr(self.shell.compile, "_filename_map", {}), **self._cell_files}
        for fname in files:
            if fname in text:
                text = text.replace(fname, self._cell_label(fname) or fname)
        return text

    def _headline(self, text: str) -> str:
        """An error in one line, for a view shown above the same error's traceback."""
        return display.error_headline(self._condense(text)) + " (the traceback is below)"

    def _source_map(self, graph) -> dict[str, str]:
        return {n.name: self._where(*n.source) for n in graph.nodes if n.source is not None}

    def _fused_source_map(self, graph, filename: str, number: int) -> dict[str, str]:
        """A fused run is one executable (step ``NAME[fused]``): its failure can only point at the cell's lines."""
        lines = sorted({n.source[1] for n in graph.nodes if n.source is not None and n.source[0] == filename})
        span = f"line {lines[0]}" if len(lines) == 1 else f"lines {lines[0]}-{lines[-1]}" if lines else "the cell"
        where = f"Cell In[{number}], {span} (fused into one executable; `--mode chained` shows the failing line)"
        return {f"{graph.name}[fused]": where}

    def _is_user_file(self, filename: str) -> bool:
        if self._cell_label(filename) is not None:
            return True
        if filename.startswith("<"):
            return False
        try:
            path = str(Path(filename).resolve())
        except OSError:
            return False
        return not path.startswith(_LIB_DIRS) and "/IPython/" not in path

    def _presentable(self, err: BaseException, relabel: bool = True) -> BaseException:
        """``err`` for the notebook: cell filenames read ``Cell In[N]``; its traceback shows only user frames.

        The traceback is chosen when IPython displays the error, so a run's error
        raised later by ``fut.result()`` shows that cell's line, not the runtime's.
        """
        if relabel and err.args and isinstance(err.args[0], str):
            err.args = (self._relabel(err.args[0]), *err.args[1:])
        if getattr(err, "_render_traceback_", None) is None:
            err._render_traceback_ = functools.partial(
                _render_user_traceback, self.shell, err, self._is_user_file, self._condense
            )
        return err

    def _present_run_errors(self, run) -> None:
        """When ``run`` fails, make its error display without the runtime's frames (wherever it is raised)."""

        def on_done(_fut, run=run):
            if run.error is not None:
                self._presentable(run.error, relabel=False)

        for fut in run.futures:  # the first to fail carries the run's error; the others may succeed first
            fut.add_done_callback(on_done)


def _render_user_traceback(shell, err: BaseException, is_user, condense) -> list[str]:
    """IPython's rendering of ``err`` with only the user's frames and no chained runtime exceptions."""
    tb = _user_traceback(err, is_user)
    saved = (err.args, err.__cause__, err.__context__, err.__suppress_context__)
    try:
        if err.args and isinstance(err.args[0], str):
            err.args = (condense(err.args[0]), *err.args[1:])
        if tb is None:  # nothing of the user's to show: the message says where (`at Cell In[N], line L`)
            return [f"{type(err).__name__}: {err}" if str(err) else type(err).__name__]
        err.__cause__ = err.__context__ = None
        err.__suppress_context__ = True
        return shell.InteractiveTB.structured_traceback(type(err), err, tb, tb_offset=0)
    finally:
        err.args, err.__cause__, err.__context__, err.__suppress_context__ = saved


def _user_traceback(err: BaseException, is_user) -> types.TracebackType | None:
    """A traceback of only the user's frames, from the deepest exception in the chain that has any."""
    best: list[types.TracebackType] = []
    seen: set[int] = set()
    stack = [err]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        entries = []
        tb = e.__traceback__
        while tb is not None:
            nxt = tb.tb_next
            calls_magic = nxt is not None and nxt.tb_frame.f_code.co_name in ("run_cell_magic", "run_line_magic")
            if is_user(tb.tb_frame.f_code.co_filename) and not calls_magic:  # a magic's own line says nothing
                entries.append(tb)
            tb = nxt
        if entries:
            best = entries
        for nxt in (e.__context__, e.__cause__):
            if nxt is not None:
                stack.append(nxt)
    new = None
    for t in reversed(best):
        new = types.TracebackType(new, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return new

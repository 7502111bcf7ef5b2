"""The notebook front through a real IPython shell: `%load_ext pw_kernel`, `%%pathways`, `%pathways`."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import jax
import numpy as np
import cells
from fresh_python import run_python
import pytest

import pw_kernel as pw

IPython = pytest.importorskip("IPython")
from IPython.core.error import UsageError  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

SETUP = (
    """
import jax.numpy as jnp
import pw_kernel as pw

s = pw.slice(2, name="s")
a = pw.compiled(lambda x: x * 2, slice=s, name="a")
b = pw.compiled(lambda x: x + 1, slice=s, name="b")
c = pw.compiled(lambda x: x / 2, slice=s, name="c")
v = jnp.array([1.0, 2.0])
"""
    + cells.GATED
)


class Cell:
    """What one executed cell showed: stdout, stderr, rich outputs, its error."""

    def __init__(self, number, result, cap):
        self.number = number
        self.result = result
        self.error = result.error_in_exec or result.error_before_exec
        self.stdout = cap.stdout
        self.stderr = cap.stderr
        self.outputs = [o.data for o in cap.outputs]
        self.text = cap.stdout + "\n".join(o.get("text/plain", "") for o in self.outputs)
        self.html = "\n".join(o.get("text/html", "") for o in self.outputs)


class Notebook:
    def __init__(self, ip):
        self.ip = ip

    @property
    def ns(self):
        return self.ip.user_ns

    def execute(self, source: str) -> Cell:
        number = self.ip.execution_count
        with capture_output() as cap:
            result = self.ip.run_cell(source, store_history=True)
        return Cell(number, result, cap)

    def run(self, source: str) -> Cell:
        cell = self.execute(source)
        if cell.error is not None:
            raise AssertionError(f"cell failed: {cell.error!r}\n{source}\n--- output:\n{cell.stdout}\n{cell.stderr}")
        return cell

    def fail(self, source: str) -> Cell:
        cell = self.execute(source)
        assert cell.error is not None, f"cell should have failed:\n{source}\n--- output:\n{cell.text}"
        return cell


@pytest.fixture(scope="module")
def ip(tmp_path_factory):
    os.environ.setdefault("IPYTHONDIR", str(tmp_path_factory.mktemp("ipython")))
    from IPython.testing.globalipapp import get_ipython

    shell = get_ipython()
    types = shell.display_formatter.active_types
    shell.display_formatter.active_types = [*types, "text/html"]  # as a notebook front-end would ask
    shell.run_line_magic("load_ext", "pw_kernel")
    yield shell
    shell.run_line_magic("unload_ext", "pw_kernel")
    shell.display_formatter.active_types = types


@pytest.fixture
def nb(ip, ctl):
    """A notebook on a fresh controller, with the setup cell executed."""
    ip.reset()
    notebook = Notebook(ip)
    notebook.run(SETUP)
    yield notebook
    gate = ip.user_ns.get("gate")
    if gate is not None:
        gate.set()  # never leave device work waiting on a gate


#: A traceback frame (as IPython shows them) inside pw_kernel or JAX, not the user's code. The messages of
#: errors raised in a `pure_callback` quote the callback's own traceback, in Python's format, which differs.
RUNTIME_FRAME = re.compile(r"File \S*(pw_kernel|jax)/\S+\.py:\d+")


# ------------------------------------------------------------------ loading
def test_load_ext_registers_the_magics_and_unload_removes_them(ip):
    assert ip.find_cell_magic("pathways") is not None
    assert ip.find_line_magic("pathways") is not None

    ip.run_line_magic("unload_ext", "pw_kernel")
    try:
        assert ip.find_cell_magic("pathways") is None
        assert ip.find_line_magic("pathways") is None
        with pytest.raises(UsageError, match=re.escape("Cell magic `%%pathways` not found")):
            ip.run_cell_magic("pathways", "", "y = 1\n")
        hooks = [getattr(cb, "__self__", None) for cb in ip.events.callbacks["post_run_cell"]]
        assert not any(type(h).__name__ == "FailureReporter" for h in hooks)
        assert _ctrl_c_hooks(ip) == {"pre_run_cell": 0, "post_run_cell": 0}
        assert KeyboardInterrupt not in ip.custom_exceptions
    finally:
        ip.run_line_magic("load_ext", "pw_kernel")
    assert ip.find_cell_magic("pathways") is not None
    assert _ctrl_c_hooks(ip) == {"pre_run_cell": 1, "post_run_cell": 1}
    assert KeyboardInterrupt in ip.custom_exceptions


def test_the_fronts_exception_handlers_join_one_set_before_and_give_it_back(ip):
    # Ctrl-C (cancel the cell's runs) and pw_kernel's errors (shown at the user's lines) each add
    # their exceptions to IPython's one custom handler and pass every other one on.
    saved = ip.custom_exceptions, ip.CustomTB
    seen = []
    ip.run_line_magic("unload_ext", "pw_kernel")
    try:
        ip.set_custom_exc((ValueError,), lambda shell, etype, value, tb, tb_offset=None: seen.append(value))
        theirs = ip.CustomTB
        ip.run_line_magic("load_ext", "pw_kernel")
        assert ip.custom_exceptions == (ValueError, KeyboardInterrupt, pw.PathwaysError)
        with capture_output() as cap:
            ip.run_cell("raise ValueError('theirs')")
            ip.run_cell("import pw_kernel as pw; pw.slice(0)")
        assert [str(e) for e in seen] == ["theirs"]
        assert "SliceError" in cap.stdout and not RUNTIME_FRAME.search(cap.stdout), cap.stdout
        ip.run_line_magic("unload_ext", "pw_kernel")
        assert ip.custom_exceptions == (ValueError,) and ip.CustomTB is theirs
    finally:
        ip.custom_exceptions, ip.CustomTB = saved
        ip.run_line_magic("load_ext", "pw_kernel")


def _ctrl_c_hooks(ip) -> dict[str, int]:
    """How many of the hooks that make Ctrl-C cancel a cell's runs are registered, per event."""
    owners = {event: [type(getattr(cb, "__self__", None)).__name__ for cb in ip.events.callbacks[event]]
              for event in ("pre_run_cell", "post_run_cell")}
    return {event: names.count("CellInterrupts") for event, names in owners.items()}


def test_loading_outside_ipython_is_a_clear_error():
    with pytest.raises(RuntimeError, match=re.escape("needs an IPython shell; got None")):
        pw.load_ipython_extension(None)


def test_import_pw_kernel_does_not_import_ipython():
    code = "import sys, pw_kernel, pw_kernel.magics; assert 'IPython' not in sys.modules, 'IPython imported'"
    run_python(code, timeout=60)


def test_magic_docstrings_show_the_python_they_expand_to(ip):
    cell_doc = ip.find_cell_magic("pathways").__doc__
    assert "@pw.program(name=\"step\")" in cell_doc
    assert "run = step.submit(v)" in cell_doc
    assert "%%pathways [--name NAME] [--slice NAME] [--block] [--timeout S]" in cell_doc
    line_doc = ip.find_line_magic("pathways").__doc__
    for python in ("pw.controller().status()", "pw.controller().run(RUN).wait()", "pw.controller().cancel_all()"):
        assert python in line_doc


# ------------------------------------------------------------ %%pathways
def test_the_papers_example_as_a_cell_returns_futures_at_once(nb):
    cell = nb.run(
        """%%pathways --name f
x = a(v)
y = b(x)
z = a(c(x))
"""
    )
    y, z = nb.ns["y"], nb.ns["z"]
    assert isinstance(y, pw.Future) and isinstance(z, pw.Future) and isinstance(nb.ns["x"], pw.Future)
    assert (y.shape, y.dtype) == ((2,), np.float32)  # known before anything ran
    np.testing.assert_allclose(pw.get(y), [3.0, 5.0])
    np.testing.assert_allclose(pw.get(z), [2.0, 4.0])
    run = pw.controller().runs[-1]
    assert run.name == "f"
    assert len(run.graph.inputs) == 1  # only `v` is traced; a, b, c are constants
    assert f"run {run.id} 'f'" in cell.text
    assert "<code>f</code>" in cell.html


def test_block_binds_arrays_and_a_trailing_expression_is_the_cells_result(nb):
    cell = nb.run(
        """%%pathways --block
y = b(a(v))
y * 10
"""
    )
    assert isinstance(nb.ns["y"], jax.Array)
    np.testing.assert_allclose(nb.ns["y"], [3.0, 5.0])
    np.testing.assert_allclose(cell.result.result, [30.0, 50.0])
    assert pw.controller().runs[-1].state == "done"
    assert "y = Array float32[2]" in cell.text and "Future" not in cell.text  # the view says what y is now


def test_loops_augmented_assignment_unpacking_helpers_and_print_work_in_a_cell(nb):
    nb.run(
        """
def double_then_inc(t):
    return b(a(t))
"""
    )
    cell = nb.run(
        """%%pathways --block
x = v
for i in range(3):
    x = double_then_inc(x)
x += 1
def halve(t):
    return c(t)
lo, hi = halve(x), a(x)
print("tracing", x.shape, x.dtype)
"""
    )
    expected = np.array([1.0, 2.0])
    for _ in range(3):
        expected = expected * 2 + 1
    expected = expected + 1
    np.testing.assert_allclose(nb.ns["x"], expected)
    np.testing.assert_allclose(nb.ns["lo"], expected / 2)
    np.testing.assert_allclose(nb.ns["hi"], expected * 2)
    assert nb.ns["i"] == 2  # plain Python values the cell binds are bound as they are
    assert nb.ns["halve"].__qualname__ == "halve"  # as if defined in a normal cell
    assert "tracing (2,) float32" in cell.stdout  # print runs once, at trace time


def test_rebinding_an_input_reads_the_old_value_and_binds_the_new_one(nb):
    nb.run("x = jnp.array([1.0, 3.0])\nsteps = 0")
    cell = """%%pathways
x = a(x)
steps = steps + 1
"""
    nb.run(cell)
    nb.run(cell)
    np.testing.assert_allclose(nb.ns["x"].result(), [4.0, 12.0])
    assert nb.ns["steps"] == 2


def test_pytrees_of_arrays_are_traced_inputs_and_outputs(nb):
    nb.run("params = {'w': jnp.array([2.0, 2.0]), 'b': jnp.array([1.0, 1.0])}")
    nb.run(
        """%%pathways --block
h = a(v) * params["w"] + params["b"]
pair = (h, b(h))
"""
    )
    run = pw.controller().runs[-1]
    assert len(run.graph.inputs) == 3  # v, params["b"], params["w"]
    np.testing.assert_allclose(nb.ns["pair"][1], [6.0, 10.0])


def test_registered_pytrees_are_traced_and_programs_called_in_a_cell_join_it(nb):
    nb.run(
        """
import dataclasses

@jax.tree_util.register_dataclass
@dataclasses.dataclass
class State:            # how optax states, flax structs and pw.PipelineState reach a cell
    w: jax.Array
    step: jax.Array

@pw.program
def update(st, x):
    return State(st.w - 0.5 * a(x), st.step + 1)

state = State(jnp.array([4.0, 4.0]), jnp.array(0))
"""
    )
    runs = len(pw.controller().runs)
    nb.run(
        """%%pathways --block
for _ in range(3):
    state = update(state, v)   # a program called in a cell is part of the cell's program
"""
    )
    assert len(pw.controller().runs) == runs + 1
    # its arrays are the program's inputs (v, w, step), not constants baked into the executables
    assert len(pw.controller().runs[-1].graph.inputs) == 3
    state = nb.ns["state"]
    assert type(state).__name__ == "State" and int(state.step) == 3
    np.testing.assert_allclose(np.asarray(state.w), [1.0, -2.0])  # 4 - 3 * 0.5 * 2v


def test_a_later_cell_reads_futures_of_an_earlier_one_without_waiting(nb):
    nb.run(
        """%%pathways --name producer
h = held(v)
"""
    )
    producer = pw.controller().runs[-1]
    nb.run(
        """%%pathways --name consumer
out = b(h) * 2
"""
    )
    consumer = pw.controller().runs[-1]
    # The consumer cell returned while its input is still being computed.
    assert not producer.done() and not consumer.done()
    assert isinstance(nb.ns["out"], pw.Future) and nb.ns["out"].shape == (2,)
    nb.ns["gate"].set()
    np.testing.assert_allclose(nb.ns["out"].result(timeout=20), [4.0, 6.0])
    assert consumer.state == "done"


def test_slice_option_places_glue_that_reads_no_device_value(nb):
    nb.run("mine = pw.slice(2, name='glue-here')")
    nb.run(
        """%%pathways --slice glue-here --block
ones = jnp.ones(4) * 3
"""
    )
    graph = pw.controller().runs[-1].graph
    assert {n.slice.name for n in graph.nodes} == {"glue-here"}
    nb.run(
        """%%pathways --slice mine --block
twos = jnp.ones(4) * 2
"""
    )
    np.testing.assert_allclose(nb.ns["twos"], [2.0] * 4)


def test_out_mode_tenant_and_name_options(nb):
    nb.run(
        """%%pathways --out r --mode chained --tenant alice --name step
y = b(a(v))
"""
    )
    r = nb.ns["r"]
    assert isinstance(r, pw.Run)
    assert (r.name, r.mode, r.tenant) == ("step", "chained", "alice")
    assert r.wait(20).state == "done"


def test_graph_and_timeline_options_display_the_program_and_its_run(nb):
    cell = nb.run(
        """%%pathways --block --graph --timeline --mode chained --name shown
y = b(a(v))
"""
    )
    assert "ProgramGraph 'shown'" in cell.text
    if pw.widgets.graph.dot_binary() is not None:
        assert "<svg" in cell.html
    else:
        assert "digraph" in cell.html
    assert "node events" in cell.text and "<svg" in cell.html  # the timeline


# ---------------------------------------------------------------- mistakes
@pytest.mark.parametrize(
    "options, message",
    [
        ("--mode fast", "argument --mode: invalid choice: 'fast'"),
        ("--slice nowhere", "no live slice named 'nowhere'. Live slices: 's' (2 devices), 'one' (1 devices)"),
        ("--timeout 5", "`%%pathways --timeout S` limits how long `--block` waits; add `--block`."),
        ("--block --timeout 0", "the timeout must be a positive number of seconds"),
        ("--out 2x", "'2x' is not a valid variable name"),
        ("--bogus", "unrecognized arguments: --bogus"),
    ],
)
def test_bad_options_are_usage_errors(nb, options, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        nb.ip.run_cell_magic("pathways", options, "y = a(v)\n")


def test_a_name_that_exists_nowhere_is_a_usage_error_naming_it(nb):
    cell = nb.fail(
        """%%pathways
x = a(v)
y = b(nope)
"""
    )
    assert isinstance(cell.error, UsageError)
    assert "the cell reads `nope` (line 3) before assigning it" in str(cell.error)
    assert "y" not in nb.ns


@pytest.mark.parametrize("cell", ["pass\n", "\n", "# only a comment\n"])
def test_a_cell_without_outputs_is_a_usage_error(nb, cell):
    with pytest.raises(UsageError, match=re.escape("the cell assigns no names and ends in no expression")):
        nb.ip.run_cell_magic("pathways", "", cell)
    assert nb.run("%%pathways --block\ny = a(v)\n") and list(np.asarray(nb.ns["y"])) == [2.0, 4.0]


def test_a_released_slice_is_a_usage_error(nb):
    nb.run("gone = pw.slice(1, name='gone'); gone.release()")
    with pytest.raises(UsageError, match=re.escape("slice 'gone' was released")):
        nb.ip.run_cell_magic("pathways", "--slice gone", "y = jnp.ones(2)\n")


def test_return_at_cell_level_is_a_usage_error(nb):
    cell = nb.fail("%%pathways\ny = a(v)\nreturn y\n")
    assert isinstance(cell.error, UsageError)
    assert "(cell line 3): `return` at cell level cannot be part of a program" in str(cell.error)


def test_a_syntax_error_points_at_the_cell_line(nb):
    cell = nb.fail("%%pathways\ny = a(v)\nz = (y +\n")
    assert isinstance(cell.error, SyntaxError)
    assert cell.error.lineno == 3


def test_a_tracing_error_points_at_the_cell_line_not_the_runtime(nb):
    cell = nb.fail(
        """%%pathways
x = a(v)
bad = jnp.ones(3) + x
"""
    )
    assert isinstance(cell.error, pw.TracingError)
    assert f"at Cell In[{cell.number}], line 3:\n    bad = jnp.ones(3) + x" in str(cell.error)
    shown = cell.stdout
    assert f"Cell In[{cell.number}], line 3" in shown and "----> 3 bad = jnp.ones(3) + x" in shown
    assert not RUNTIME_FRAME.search(shown), shown


def test_a_wrong_shape_into_a_compiled_step_in_a_plain_cell_points_at_the_users_call_and_line(nb):
    nb.run(
        """def loss(w, x):
    return jnp.sum(x @ w)

step = pw.compiled(loss, slice=s, name="step")
"""
    )
    defined = nb.ip.execution_count - 1
    cell = nb.fail(
        """w = jnp.ones((4, 3))
x = jnp.ones((5, 5))
out = step(w, x)
"""
    )
    assert isinstance(cell.error, pw.TracingError)
    assert f"at Cell In[{defined}], line 2:\n    return jnp.sum(x @ w)" in str(cell.error)
    shown = cell.stdout
    # the user's call first, then the line of theirs it failed in; none of pw_kernel's or JAX's frames
    call, line = shown.index(f"Cell In[{cell.number}], line 3"), shown.index(f"Cell In[{defined}], line 2, in loss")
    assert call < line and "----> 3 out = step(w, x)" in shown
    assert not RUNTIME_FRAME.search(shown) and "ipykernel" not in shown and "ipython-input" not in shown, shown


def test_an_error_inside_a_library_names_the_users_line_first_and_the_librarys_below_it(nb):
    optax = pytest.importorskip("optax")
    nb.run(
        """import numpy as np, optax

def layer(p, x):
    return jnp.tanh(x @ p)

def xent(logits, target):
    return optax.softmax_cross_entropy(logits, target).mean()

halves = pw.slice(1, name="h0"), pw.slice(1, name="h1")
pipe = pw.pipeline([layer, layer], halves, microbatches=2, loss=xent)
state = pipe.init([np.full((8, 8), 0.1, np.float32)] * 2)
"""
    )
    defined = nb.ip.execution_count - 1
    cell = nb.fail("state, loss = pipe.step(state, np.ones((4, 8), np.float32), np.ones((4, 5), np.float32))\n")
    message = str(cell.error)
    user = message.index(f"at Cell In[{defined}], line 7:\n    return optax.softmax_cross_entropy(logits, target).mean()")
    library = message.index(f"in {os.path.dirname(optax.__file__)}")
    assert user < library, message
    shown = cell.stdout
    assert f"Cell In[{cell.number}], line 1" in shown and f"Cell In[{defined}], line 7, in xent" in shown
    assert not RUNTIME_FRAME.search(shown), shown


def test_glue_with_nowhere_to_run_suggests_the_slice_option(nb):
    cell = nb.fail("%%pathways\nz = jnp.ones(3)\n")
    assert isinstance(cell.error, pw.TracingError)
    assert "Pass a slice: `%%pathways --slice NAME`" in str(cell.error)
    assert f"at Cell In[{cell.number}], line 2:\n    z = jnp.ones(3)" in str(cell.error)
    assert "run_cell_magic" not in cell.stdout  # no frame: the message says where


def test_python_control_flow_on_device_values_says_what_to_do(nb):
    cell = nb.fail(
        """%%pathways
x = a(v)
if x.sum() > 0:
    x = b(x)
"""
    )
    assert isinstance(cell.error, pw.ControlFlowError)
    assert f"at Cell In[{cell.number}], line 3" in str(cell.error)
    assert "jax.lax.cond" in str(cell.error)


# ----------------------------------------------------------------- failures
def test_a_run_failing_later_is_reported_once_after_the_next_cell(nb):
    submitted = nb.run(
        """%%pathways --name sensor --mode chained
x = a(v)
y = broken(x)
"""
    )
    run = pw.controller().runs[-1]
    nb.ns["gate"].set()
    assert run.wait(20).state == "failed"

    report = nb.run("1 + 1")  # the user moved on
    assert f"run {run.id} 'sensor' failed after the cell that submitted it had returned" in report.text
    assert f"at Cell In[{submitted.number}], line 3: y = broken(x)" in report.text
    assert "ValueError: the sensor returned garbage" in report.text
    assert re.search(r"Cell In\[\d+\], line \d+, in _broken", report.text)  # the user's frame of the callback
    assert "dispatch.py" not in report.text and "pjit.py" not in report.text  # not the runtime's or JAX's
    assert "pw-err" in report.html

    assert "sensor" not in nb.run("2 + 2").text  # once

    shown = nb.fail("y.result()")  # its futures raise the error too
    assert isinstance(shown.error, pw.NodeError)
    assert f"Cell In[{submitted.number}], line 3: y = broken(x)" in str(shown.error)
    assert "----> 1 y.result()" in shown.stdout
    assert not RUNTIME_FRAME.search(shown.stdout), shown.stdout
    assert "dispatch.py" not in shown.stdout and "in _broken" in shown.stdout


def test_a_failure_the_user_read_in_the_cell_is_not_reported_again(nb):
    nb.ns["gate"].set()
    cell = nb.run(
        """%%pathways --name sensor --mode chained
x = a(v)
y = broken(x)
"""
    )
    read = nb.run("err = y.exception(timeout=20)\nprint(type(err).__name__)")
    assert "NodeError" in read.stdout and "failed after the cell" not in read.text
    caught = nb.run(
        """%%pathways --name sensor2 --mode chained
z = broken(a(v))
"""
    )
    handled = nb.run("try:\n    z.result(timeout=20)\nexcept pw.NodeError as e:\n    print('handled', e.node)")
    assert "handled broken" in handled.stdout and "failed after the cell" not in handled.text
    assert "failed after the cell" not in nb.run("1 + 1").text
    assert cell.number < caught.number


def test_a_program_defined_in_a_cell_that_fails_later_points_at_its_cell(nb):
    defined = nb.run(
        """@pw.program
def sense(v):
    x = a(v)
    return broken(x)

out = sense(v)
"""
    )
    nb.ns["gate"].set()
    assert nb.ns["out"].run.wait(20).state == "failed"
    report = nb.run("1 + 1")
    assert f"at Cell In[{defined.number}], line 4" in report.text, report.text
    assert ".py, line 4" not in report.text  # not the cell's temporary file


def test_a_failure_raised_by_block_is_not_reported_again(nb, caplog):
    nb.ns["gate"].set()
    cell = nb.fail(
        """%%pathways --block --mode chained
x = a(v)
y = broken(x)
"""
    )
    assert isinstance(cell.error, pw.NodeError)
    assert f"Cell In[{cell.number}], line 3: y = broken(x)" in str(cell.error)
    assert not RUNTIME_FRAME.search(cell.stdout), cell.stdout
    assert "failed after the cell" not in nb.run("1 + 1").text
    # shown once: the cell's error has the traceback, the run's view only names it, JAX logs nothing
    assert "failed: a host callback raised: Traceback" in str(cell.error) and "CpuCallback" not in str(cell.error)
    shown = "\n".join(o.get("text/plain", "") for o in cell.outputs)  # the run's view, not the error
    assert "ValueError: the sensor returned garbage (the traceback is below)" in shown
    assert "in _broken" not in shown and "Traceback" not in shown
    assert "callback failed" not in cell.stderr + caplog.text  # JAX's own log line of the callback's traceback


def test_a_failure_in_a_fused_run_points_at_the_cells_lines(nb):
    nb.ns["gate"].set()
    cell = nb.fail("%%pathways --block --mode fused\nx = held(v)\ny = broken(x)\n")
    assert isinstance(cell.error, pw.NodeError)
    assert f"Cell In[{cell.number}], lines 2-3 (fused into one executable" in str(cell.error)


def test_block_with_timeout_gives_up_waiting_and_leaves_futures_bound(nb):
    cell = nb.fail(
        """%%pathways --block --timeout 0.3
y = held(v)
"""
    )
    assert isinstance(cell.error, pw.TimeoutError)
    assert "is still running after 0.3 s" in str(cell.error)
    assert isinstance(nb.ns["y"], pw.Future)
    nb.ns["gate"].set()
    np.testing.assert_allclose(nb.ns["y"].result(timeout=20), [1.0, 2.0])


def test_blocking_shows_progress_after_a_while(nb, monkeypatch):
    from pw_kernel.magics import live

    monkeypatch.setattr(live, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(live, "PROGRESS_EVERY_S", 0.0)
    shown = threading.Event()
    real = live.progress_line

    def progress_line(run):
        shown.set()
        return real(run)

    monkeypatch.setattr(live, "progress_line", progress_line)
    # The device work finishes once progress has been shown.
    releaser = threading.Thread(target=lambda: shown.wait(20) and nb.ns["gate"].set())
    releaser.start()
    cell = nb.run(
        """%%pathways --block --name slowpoke
y = held(v)
"""
    )
    releaser.join()
    assert re.search(r"pw_kernel: run \d+ 'slowpoke' running \d+/\d+ nodes, [\d.]+ s", cell.stderr)


def test_ctrl_c_while_blocking_cancels_the_run(nb, monkeypatch):
    from pw_kernel.magics import live

    monkeypatch.setattr(live, "PROGRESS_AFTER_S", 0.0)
    shown = threading.Event()
    monkeypatch.setattr(live, "progress_line", lambda run: shown.set() or "")
    # Ctrl-C (a real SIGINT, as a terminal sends it) arrives from elsewhere while the cell is blocked in its
    # wait on the run (the first progress line marks that moment): the wait must not need to wake up on its own.
    main = threading.main_thread().ident
    ctrl_c = threading.Thread(target=lambda: shown.wait(20) and signal.pthread_kill(main, signal.SIGINT))
    ctrl_c.start()
    cell = nb.fail(
        """%%pathways --block --mode chained --name interrupted
x = held(v)
y = b(x)
"""
    )
    ctrl_c.join()
    assert isinstance(cell.error, KeyboardInterrupt)
    run = pw.controller().runs[-1]
    assert run.state == "cancelled"
    assert f"pw_kernel: Ctrl-C cancelled run {run.id} ('interrupted')" in cell.stderr
    with pytest.raises(pw.CancelledError):
        nb.ns["y"].result()
    nb.ns["gate"].set()
    assert nb.run("%%pathways --block\nz = b(v)\n").error is None  # the shell stays usable
    np.testing.assert_allclose(nb.ns["z"], [2.0, 3.0])


def test_ctrl_c_in_a_plain_loop_cancels_only_the_runs_that_cell_submitted(nb):
    nb.run("earlier = held(v)\nsubmitted = threading.Event()")  # an earlier cell's run, waiting at the gate
    mark = pw.controller().runs[-1].id
    others = []

    def person():  # meanwhile another thread submits a run; then Ctrl-C (a real SIGINT) reaches the loop
        if nb.ns["submitted"].wait(30):
            others.append(nb.ns["held"](nb.ns["v"]))
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    ctrl_c = threading.Thread(target=person)
    ctrl_c.start()
    cell = nb.fail(
        """for i in range(100_000):
    y = held(v)
    if i == 40:
        submitted.set()
    if i >= 40:
        time.sleep(0.01)  # the loop goes on slowly: Ctrl-C lands while it runs
"""
    )
    ctrl_c.join()
    assert isinstance(cell.error, KeyboardInterrupt)
    c = pw.controller()
    other = others[0].run
    mine = [r for r in c.runs if r.id > mark and r is not other]
    assert len(mine) > 40 and all(r.state == "cancelled" for r in mine)
    assert f"pw_kernel: Ctrl-C cancelled {len(mine)} runs (ids " in cell.stderr
    assert "'held'" in cell.stderr
    # The earlier cell's run and the other thread's are left alone: they finish once the gate opens.
    earlier = nb.ns["earlier"]
    assert not earlier.done() and other.state in ("queued", "running")
    nb.ns["gate"].set()
    np.testing.assert_allclose(earlier.result(timeout=30), [1.0, 2.0])
    np.testing.assert_allclose(others[0].result(timeout=30), [1.0, 2.0])


def test_a_cell_that_fails_otherwise_than_by_ctrl_c_cancels_nothing(nb):
    nb.fail("z = held(v)\nw = held(v)\nraise ValueError('not a Ctrl-C')")
    assert not nb.ns["z"].done() and not nb.ns["w"].done()
    nb.ns["gate"].set()
    np.testing.assert_allclose(nb.ns["w"].result(timeout=30), [1.0, 2.0])


# -------------------------------------------------------------- %pathways
def test_status_shows_islands_slices_and_runs_with_state_and_progress(nb):
    cell = nb.run('%%pathways --block --name "<b>bold</b>"\ny = a(v)\n')
    assert "&lt;b&gt;bold&lt;/b&gt;" in cell.html and "<b>bold</b>" not in cell.html
    view = nb.ip.run_line_magic("pathways", "status")
    text, html = repr(view), view._repr_html_()
    assert "VirtualSlice('s', mesh={'d': 2}" in text and "<b>bold</b>" in text and "done" in text
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold</b>" not in html  # user strings are escaped
    assert "<code>s</code>" in html and re.search(r"</span></span> (\d+)/\1<", html)


def test_status_lists_the_recent_runs_and_counts_the_rest(nb):
    for k in range(14):
        nb.run(f"%%pathways --block --name quick{k}\ny = a(v)\n")
    view = nb.ip.run_line_magic("pathways", "status")
    text, html = repr(view), view._repr_html_()
    assert "quick13" in text and "quick4" in text and "quick3 " not in text  # the last ten
    assert "... and 4 earlier finished runs" in text and "... and 4 earlier finished runs" in html
    assert html.count("<code>quick") == 10


def test_status_keeps_every_run_in_flight_however_old():
    from pw_kernel.runtime.extend import Status
    from pw_kernel.runtime.exec.controller import RunSummary

    runs = [RunSummary(0, "slow", "running", 1, 4)] + [RunSummary(i, f"r{i}", "done", 1, 1) for i in range(1, 30)]
    status = Status(islands=(), slices=(), runs=tuple(runs), inflight={}, policy="fifo")
    shown, hidden = status.recent_runs(recent=10)
    assert [r.name for r in shown] == ["slow", *[f"r{i}" for i in range(20, 30)]] and hidden == 19


def test_devices_shows_every_device_and_the_slices_on_it(nb):
    view = nb.ip.run_line_magic("pathways", "devices")
    assert "island 0 (cpu, 8 devices)" in repr(view)
    assert len(re.findall(r"cpu:\d+ ", repr(view))) == 8
    assert "slices: s" in repr(view) and "slices: one" in repr(view)
    assert "<code>s</code>" in view._repr_html_()


def test_timeline_shows_the_node_events_of_all_runs(nb):
    nb.run("%%pathways --block --mode chained --name first\ny = b(a(v))\n")
    nb.run("%%pathways --block --mode chained --name second\nz = c(v)\n")
    view = nb.ip.run_line_magic("pathways", "timeline")
    text = repr(view)
    assert "first" in text and "second" in text and "all runs" in text
    assert "<svg" in view._repr_html_()
    just_second = repr(nb.ip.run_line_magic("pathways", "timeline second"))
    assert "second" in just_second and "first" not in just_second


def test_graph_finds_a_run_by_name_or_id_or_a_program_variable(nb):
    nb.run("%%pathways --name paper\nx = a(v)\ny = b(x)\nz = a(c(x))\n")
    run = pw.controller().runs[-1]
    for target in ("paper", str(run.id)):
        assert "ProgramGraph 'paper'" in repr(nb.ip.run_line_magic("pathways", f"graph {target}"))
    nb.run("@pw.program\ndef f(t):\n    return b(t)\n_ = f(v)")
    assert "ProgramGraph 'f'" in repr(nb.ip.run_line_magic("pathways", "graph f"))
    with pytest.raises(UsageError, match=re.escape("no run named 'nothing'")):
        nb.ip.run_line_magic("pathways", "graph nothing")


def test_wait_blocks_until_runs_finish_and_raises_a_failure(nb, monkeypatch):
    from pw_kernel.magics import live

    nb.run("%%pathways --name later\ny = held(v)\n")
    later = pw.controller().runs[-1]
    assert not later.done()
    # The device work finishes only while `%pathways wait` is blocked on it (its progress line marks that moment).
    monkeypatch.setattr(live, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(live, "progress_line", lambda run: nb.ns["gate"].set() or "")
    view = nb.ip.run_line_magic("pathways", "wait later")
    assert later.state == "done" and "'later': done" in repr(view)
    # Held until `wait` blocks too: a run that failed before the next cell was shown in its own cell already.
    nb.ns["gate"].clear()
    nb.run("%%pathways --name doomed --mode chained\ny = broken(held(v))\n")
    cell = nb.fail("%pathways wait")
    assert isinstance(cell.error, pw.NodeError) and "doomed" in str(cell.error)
    assert "failed after the cell" not in nb.run("1 + 1").text  # `wait` showed it already


def test_cancel_and_reset(nb):
    nb.run("%%pathways --name stuck\ny = held(v)\n")
    view = nb.ip.run_line_magic("pathways", "cancel stuck")
    assert re.search(r"run \d+ \('stuck'\) cancelled", repr(view))
    with pytest.raises(pw.CancelledError):
        nb.ns["y"].result()
    nb.run("%%pathways --name stuck2\ny = held(v)\n")
    view = nb.ip.run_line_magic("pathways", "reset")
    assert "cancelled 1 runs and released 2 slices ('s', 'one')" in repr(view)
    assert nb.ns["s"].released and pw.controller().runs[-1].state == "cancelled"


def test_story_tells_a_cancelled_runs_transitions_and_their_causes(nb):
    nb.run("%%pathways --name stuck\ny = held(v)\n")
    stuck, deadline = pw.controller().runs[-1], time.monotonic() + 60
    while stuck.state != "running":  # (then held there by its gate; cancelled while queued, it would say "queued")
        assert time.monotonic() < deadline, stuck.state
        time.sleep(0.005)
    nb.ip.run_line_magic("pathways", "cancel stuck")
    view = nb.ip.run_line_magic("pathways", "story stuck")
    text, html = repr(view), view._repr_html_()
    assert re.search(r"story of run \d+ \('stuck'\)", text)
    lines = text.splitlines()
    assert any(re.search(r"\bnew\s+(queued|running)\b", line) for line in lines)
    cancel = next(line for line in lines if re.search(r"running\s+cancelled\s+cancel\s+cancel-\d+", line))
    assert "MainThread" in cancel  # the thread that brought the stimulus: this notebook's
    assert "<table>" in html and "cancel-" in html
    run = pw.controller().runs[-1]
    with pw.controller().lock:  # (a node it had on the device may be reported meanwhile: a row more in both)
        by_name = nb.ip.run_line_magic("pathways", "story stuck").text
        assert nb.ip.run_line_magic("pathways", f"story {run.id}").text == by_name  # by id too
    assert "<table>" in run.story()._repr_html_()  # as `run.story()` shows itself in a notebook


@pytest.mark.parametrize(
    "line, message",
    [
        ("", "the following arguments are required: command"),
        ("story", "`%pathways story RUN`: name the run"),
        ("explode", "invalid choice: 'explode'"),
        ("graph", "`%pathways graph NAME`: name a run"),
        ("cancel", "`%pathways cancel RUN`: name the run"),
        ("wait 999", "No run with id 999"),
    ],
)
def test_line_magic_mistakes_are_usage_errors(nb, line, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        nb.ip.run_line_magic("pathways", line)


def test_a_cell_reads_an_array_on_the_notebooks_own_mesh(nb):
    nb.run(
        """from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((4,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
m = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("i")))
"""
    )
    nb.run("%%pathways --block\nz = jnp.sin(m) * 2\n")
    np.testing.assert_allclose(nb.ns["z"], np.sin(np.arange(8.0)) * 2, rtol=1e-6)
    assert nb.ns["z"].sharding == nb.ns["m"].sharding


def test_status_lists_checkpoints_and_a_failed_save_is_reported_once_after_the_next_cell(nb, tmp_path):
    pytest.importorskip("orbax.checkpoint")
    nb.ns["ckdir"] = str(tmp_path / "ck")
    nb.run(
        """import jax, jax.numpy as jnp
ckpt = pw.CheckpointManager(ckdir)
w = pw.compiled(lambda t: t + 1, slice=pw.slice(1))(jnp.zeros(3))
ckpt.save(1, {"w": w})
ckpt.wait_until_finished()

def offline(t):
    gate.wait(60)  # the disk fails once the status below was read
    raise ValueError("disk controller offline")

bad = pw.compiled(lambda t: jax.pure_callback(offline, jax.ShapeDtypeStruct(t.shape, t.dtype), t), slice=pw.slice(1))(w)
ckpt.save(2, {"w": bad})
"""
    )
    status = nb.run("%pathways status")
    assert "checkpoints in " in status.text and "last finished: step 1" in status.text
    assert "checkpoint of step 2" not in status.text
    # the user moves on; the save fails meanwhile and is reported after this cell
    report = nb.run("import time\ngate.set()\nwhile ckpt.in_progress:\n    time.sleep(0.01)")
    text = report.text
    assert "checkpoint of step 2" in text and "disk controller offline" in text
    assert "the last finished checkpoint (step 1) is intact" in text
    assert "checkpoint of step 2" not in nb.run("2 + 2").text  # once
    nb.run("ckpt.close()")

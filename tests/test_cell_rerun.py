"""A `%%pathways` cell run again unchanged reuses its trace and plan; anything it depends on that changed traces again."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw
from test_magics import Notebook, ip  # noqa: F401 - ip: the shell fixture

pytest.importorskip("IPython")

SETUP = """
import numpy as np, jax, jax.numpy as jnp
import pw_kernel as pw
s = pw.slice(2, mesh={"d": 2}, name="s")
step = pw.compiled(lambda w, x: w + x, slice=s, name="step")
lr = 1.0
def scaled(t):
    return t * lr
w = jax.device_put(jnp.zeros(4), s.sharding())  # on the slice, as the results will be
x = jax.device_put(jnp.ones(4), s.sharding())
"""

LOOP = """%%pathways --block
print("traced")
for _ in range(5):
    w = step(w, scaled(x))
"""


@pytest.fixture
def nb(ip, ctl):  # noqa: F811 - the shell fixture
    ip.reset()
    notebook = Notebook(ip)
    notebook.run(SETUP)
    return notebook


def graphs():
    return [r.graph for r in pw.controller().runs]


def test_a_rerun_of_an_unchanged_cell_reuses_its_trace_and_its_results_go_on(nb):
    first = nb.run(LOOP)
    assert "traced" in first.stdout
    again = nb.run(LOOP)  # w is now the first run's result: same shape, dtype, sharding, slice
    assert "traced" not in again.stdout  # Python in the cell runs when it is traced, as in a @pw.program
    g = graphs()
    assert g[-1] is g[-2] and len(g[-1].nodes) >= 5
    np.testing.assert_allclose(nb.ns["w"], [10.0] * 4)  # both runs happened, each on the other's output
    assert pw.controller().runs[-1].name != pw.controller().runs[-2].name  # each run named after its own cell


@pytest.mark.parametrize(
    ("args", "value"),
    [("w, x", 1.0), ("fut, x", 2.0), ("n, x", 2.0), ("t['a'], t['b']", 1.0)],
    ids=["arrays", "future", "numpy", "tree"],
)
def test_a_cell_is_traced_once_on_its_first_run(nb, args, value):
    """The cell's body runs once: the trace that finds its graph is the trace its run is submitted with."""
    nb.run("fut = step(w, x)\nn = np.ones(4, np.float32)\nt = {'a': w, 'b': fut}")
    for options in ("", " --block"):
        first = nb.run(f'%%pathways{options}\nprint("tracing")\nz = step({args})\n')
        assert first.stdout.count("tracing") == 1, first.stdout
    np.testing.assert_allclose(nb.ns["z"], [value] * 4)


def test_a_cells_run_asks_its_programs_trace_cache_once(nb, monkeypatch):
    """The graph the cell shows and binds is the run's own (`run.graph`): not looked up again beside it."""
    asked = []
    trace = pw.Program._trace
    monkeypatch.setattr(pw.Program, "_trace", lambda self, *a, **k: asked.append(self.name) or trace(self, *a, **k))
    for _ in range(2):  # its first run, then a rerun of the same text
        nb.run("%%pathways --block --name once\nz = step(w, x)\n")
    assert asked == ["once", "once"]
    assert pw.controller().runs[-1].graph is pw.controller().runs[-2].graph


def test_a_changed_global_read_by_a_helper_function_traces_again(nb):
    nb.run(LOOP)
    nb.run("lr = 2.0")  # read by `scaled`, not by the cell: baked into the trace as a constant
    again = nb.run(LOOP)
    assert "traced" in again.stdout
    g = graphs()
    assert g[-1] is not g[-2]
    np.testing.assert_allclose(nb.ns["w"], [5.0 + 10.0] * 4)


def test_a_changed_constant_read_by_the_cell_traces_again(nb):
    cell = "%%pathways --block\nfor _ in range(n):\n    w = step(w, x)\n"
    nb.run("n = 2")
    nb.run(cell)
    nb.run(cell)
    nb.run("n = 3")
    nb.run(cell)
    g = graphs()
    assert g[-3] is g[-2] and g[-1] is not g[-2]
    assert [len(gr.nodes) for gr in g[-3:]] == [2, 2, 3]
    np.testing.assert_allclose(nb.ns["w"], [7.0] * 4)


def test_an_input_of_another_shape_traces_again_and_the_old_shape_reuses_its_own_trace(nb):
    cell = "%%pathways --block\ny = step(v, v)\n"
    nb.run("v = jnp.ones(4)")
    nb.run(cell)
    nb.run("v = jnp.ones(8)")
    nb.run(cell)
    assert nb.ns["y"].shape == (8,)
    nb.run("v = jnp.full(4, 3.0)")
    nb.run(cell)
    g = graphs()
    assert g[-2] is not g[-3] and g[-1] is g[-3]
    np.testing.assert_allclose(nb.ns["y"], [6.0] * 4)


def test_a_redefined_compiled_function_traces_again(nb):
    nb.run(LOOP)
    nb.run('step = pw.compiled(lambda w, x: w - x, slice=s, name="step")')
    again = nb.run(LOOP)
    assert "traced" in again.stdout and graphs()[-1] is not graphs()[-2]
    np.testing.assert_allclose(nb.ns["w"], [0.0] * 4)  # 5 steps up, then 5 down


def test_a_numpy_constant_changed_in_place_traces_again(nb):
    nb.run("offset = np.ones(4, np.float32)\ndef shifted(t):\n    return t + offset\n")
    cell = "%%pathways --block\ny = step(shifted(x), x)\n"
    nb.run(cell)
    nb.run("offset[:] = 5")  # the same object, changed: the helper bakes its new content
    nb.run(cell)
    assert graphs()[-1] is not graphs()[-2]
    np.testing.assert_allclose(nb.ns["y"], [7.0] * 4)


def test_a_value_whose_changes_cannot_be_seen_traces_every_time(nb):
    nb.run("class Knobs:\n    def __init__(self):\n        self.k = 1.0\nknobs = Knobs()\n")
    cell = "%%pathways --block\ny = step(x * knobs.k, x)\n"
    nb.run(cell)
    nb.run("knobs.k = 3.0")
    nb.run(cell)
    assert graphs()[-1] is not graphs()[-2]
    np.testing.assert_allclose(nb.ns["y"], [4.0] * 4)


def test_a_rerun_of_a_loop_reading_a_feed_takes_the_next_batches_at_run_time(nb):
    nb.run(
        "def source():\n"
        "    for i in range(40):\n"
        "        yield np.full((4,), i, np.float32)\n"
        "batches = pw.prefetch(source(), to=s, name='batches')\n"
    )
    cell = "%%pathways --block\nfor _ in range(10):\n    w = step(w, next(batches))\n"
    for _ in range(3):  # the first run's result is sharded as the batches are: the second traces again
        nb.run(cell)
    assert graphs()[-1] is graphs()[-2]
    assert nb.ns["batches"].taken == 30  # none taken while tracing, 10 by each run
    np.testing.assert_allclose(nb.ns["w"], [float(sum(range(30)))] * 4)


def test_a_released_slice_is_not_reused_the_cell_says_so(nb):
    cell = "%%pathways\ny = step(x, x)\n"
    nb.run(cell)
    nb.run("s.release()")
    failed = nb.fail(cell)
    assert "released" in str(failed.error)


def test_a_slice_option_naming_a_variable_that_now_holds_another_slice_traces_again(nb):
    nb.run("a, b = pw.slice(2, name='a'), pw.slice(2, name='b')\ncur = a")
    cell = "%%pathways --slice cur --block\ny = jnp.ones(4) * 2\n"
    nb.run(cell)
    assert {d.id for d in nb.ns["y"].sharding.device_set} == {d.id for d in nb.ns["a"].devices}
    nb.run("cur = b")
    nb.run(cell)  # the same text: its glue goes where `cur` points now
    assert {d.id for d in nb.ns["y"].sharding.device_set} == {d.id for d in nb.ns["b"].devices}


def test_a_program_traced_on_arrays_reuses_its_graph_for_futures_of_the_same_signature(ctl):
    s = pw.slice(2, mesh={"d": 2}, name="s")
    f = pw.compiled(lambda v: v * 2, slice=s, name="f")
    p = pw.program(lambda v: f(v))
    x = jax.device_put(jnp.ones(4), s.sharding())
    g1 = p.trace(x)
    y = p(x)
    assert p.trace(y) is g1 and p.cache_size == 1
    np.testing.assert_allclose(p(y).result(), [4.0] * 4)


def test_value_keys_see_what_a_trace_would_bake():
    from pw_kernel.magics.cell_cache import value_key
    from pw_kernel.magics.errors import Uncacheable

    assert value_key({"lr": 0.1, "n": [1, 2]}) == value_key({"lr": 0.1, "n": [1, 2]})
    assert value_key({"lr": 0.1}) != value_key({"lr": 0.2})
    assert value_key(0.0) != value_key(-0.0)  # equal floats that bake different constants
    assert value_key(1) != value_key(True)
    a = np.zeros(3)
    k = value_key(a)
    a[0] = 1
    assert value_key(a) != k
    with pytest.raises(Uncacheable, match="may change without the cell seeing it"):
        value_key(object())


def test_plain_python_values_a_reused_trace_binds_are_new_each_run(nb):
    cell = "%%pathways --block\nnotes = ['run']\ny = step(x, x)\n"
    nb.run(cell)
    nb.ns["notes"].append("changed by the user")
    nb.run(cell)
    assert graphs()[-1] is graphs()[-2]
    assert nb.ns["notes"] == ["run"]  # a new list, as a new run of the cell makes


def test_a_cell_that_makes_an_object_of_a_user_class_is_traced_every_time(nb):
    nb.run("class Box:\n    pass\n")
    cell = "%%pathways --block\nbox = Box()\ny = step(x, x)\n"
    nb.run(cell)
    first = nb.ns["box"]
    nb.run(cell)
    assert graphs()[-1] is not graphs()[-2] and nb.ns["box"] is not first


def test_a_python_value_the_trace_computed_matches_the_signature_the_run_reused(nb):
    cell = "%%pathways --block\nn = v.shape[0]\ny = step(v, v)\n"
    for size in (4, 8, 4):
        nb.run(f"v = jax.device_put(jnp.ones({size}), s.sharding())")
        nb.run(cell)
        assert nb.ns["n"] == size and nb.ns["y"].shape == (size,)
    g = graphs()
    assert g[-1] is g[-3] and g[-2] is not g[-1]


def test_a_global_read_by_a_method_of_a_notebook_class_traces_again_when_it_changes(nb):
    nb.run("scale = 2.0\nclass Net:\n    @staticmethod\n    def apply(t):\n        return step(t, t) * scale\n")
    cell = "%%pathways --block\ny = Net.apply(x)\n"
    nb.run(cell)
    nb.run(cell)
    assert graphs()[-1] is graphs()[-2]
    nb.run("scale = 5.0")
    nb.run(cell)
    assert graphs()[-1] is not graphs()[-2]
    np.testing.assert_allclose(nb.ns["y"], [10.0] * 4)


def test_a_jitted_helper_is_keyed_by_what_its_function_reads(nb):
    nb.run("shift = 1.0\n@jax.jit\ndef shifted(t):\n    return t + shift\n")
    cell = "%%pathways --block\ny = step(shifted(x), x)\n"
    nb.run(cell)
    nb.run(cell)
    assert graphs()[-1] is graphs()[-2]
    nb.run("@jax.jit\ndef shifted(t):\n    return t + 10.0\n")  # redefined: another function
    nb.run(cell)
    assert graphs()[-1] is not graphs()[-2]
    np.testing.assert_allclose(nb.ns["y"], [12.0] * 4)

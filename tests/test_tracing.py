"""Tracing programs into ProgramGraphs with JAX's own tracing."""

from __future__ import annotations

import re
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pw_kernel as pw


@pytest.fixture
def two(ctl):
    s1 = pw.slice(2, mesh={"data": 2}, name="s1")
    s2 = pw.slice(4, mesh={"data": 2, "model": 2}, name="s2")
    return s1, s2


def test_edges_carry_shape_dtype_and_sharding_before_running(two):
    s1, s2 = two
    enc = pw.compiled(lambda x: jnp.tanh(x), slice=s1, in_specs=P("data"), out_specs=P("data"), name="enc")
    dec = pw.compiled(lambda x: x.sum(0), slice=s2, in_specs=P("data", "model"), out_specs=P("model"), name="dec")

    @pw.program
    def p(x):
        return dec(enc(x) * 3)

    g = p.trace(np.ones((4, 6), np.float32))
    assert g.kinds() == {"transfer": 2, "compute": 2, "glue": 1}
    assert pw.controller().runs == []  # tracing submits nothing
    for e in g.edges:
        assert e.shape and e.dtype == np.float32
        # a numpy input is a host value until its transfer node; everything else is placed
        assert (e.sharding is None) == (e.value.origin == "input")
    (out,) = [g.values[v] for v in g.outputs]
    assert out.shape == (6,) and out.sharding.spec == P("model") and out.slice is s2
    glue = [n for n in g.nodes if n.kind == "glue"][0]
    assert glue.slice is s1 and glue.primitives == ("mul",)


def test_adjacent_glue_ops_fuse_into_one_node(two):
    s1, _ = two
    f = pw.compiled(lambda x: x + 1, slice=s1, name="f")

    @pw.program
    def p(x):
        y = f(x)
        y = jnp.sin(y) * 2 + jnp.cos(y)  # four jnp ops, one glue node
        return f(y)

    g = p.trace(jnp.ones(4))
    glue = [n for n in g.nodes if n.kind == "glue"]
    assert len(glue) == 1 and set(glue[0].primitives) == {"sin", "mul", "cos", "add"}
    x = np.ones(4, np.float32)
    expect = np.sin(x + 1) * 2 + np.cos(x + 1) + 1
    np.testing.assert_allclose(np.asarray(p(jnp.ones(4)).result()), expect, rtol=1e-6)


def test_traces_are_cached_per_signature(two):
    s1, _ = two
    f = pw.compiled(lambda x: x * 2, slice=s1, name="f")
    calls = []

    @pw.program
    def p(x, k):
        calls.append(1)  # runs only while tracing
        for _ in range(k):  # Python loops unroll at trace time
            x = f(x)
        return x

    g1 = p.trace(jnp.ones(4), 3)
    g2 = p.trace(jnp.zeros(4), 3)
    assert g1 is g2 and len(calls) == 1
    assert len([n for n in g1.nodes if n.kind == "compute"]) == 3
    g3 = p.trace(jnp.ones(8), 3)  # new shape: new trace
    g4 = p.trace(jnp.ones(4), 2)  # new constant: new trace
    assert len({id(g1), id(g3), id(g4)}) == 3 and p.cache_size == 3
    np.testing.assert_array_equal(np.asarray(p(jnp.ones(4), 3).result()), [8.0] * 4)
    assert len(calls) == 3


def test_data_dependent_branch_says_why_and_what_to_do(two):
    s1, _ = two
    f = pw.compiled(lambda x: x * 2, slice=s1, name="f")

    @pw.program
    def p(x):
        y = f(x)
        if y.sum() > 0:
            return y
        return -y

    with pytest.raises(pw.ControlFlowError) as info:
        p(jnp.ones(4))
    msg = str(info.value)
    assert "Python control flow depends on a value computed on devices" in msg
    assert "if y.sum() > 0:" in msg  # points at the user's line
    assert "jax.lax.cond" in msg
    assert f(jnp.ones(4)).result().shape == (4,)  # the controller is still fine


def test_untraceable_function_is_a_tracing_error(two):
    s1, _ = two

    @pw.program(slice=s1)
    def p(x):
        return x @ jnp.ones((3, 3))  # shapes (4,) @ (3, 3) do not match

    with pytest.raises(pw.TracingError, match=re.escape("`pw.program` 'p' could not be traced: TypeError")):
        p(jnp.ones(4))


@pytest.mark.parametrize(
    "use, jax_error",
    [
        (lambda x: x * float(x[0]), "ConcretizationTypeError"),
        (lambda x: jnp.asarray(np.asarray(x)), "TracerArrayConversionError"),
        (lambda x: jnp.stack([x for _ in range(x[0].astype(jnp.int32))]), "TracerIntegerConversionError"),
    ],
    ids=["float", "np.asarray", "range"],
)
def test_a_concrete_value_needed_at_trace_time_says_what_to_do(two, use, jax_error):
    s1, _ = two

    @pw.program(slice=s1)
    def p(x):
        return use(x)

    prefix = f"`pw.program` 'p' needs a concrete value where it only has a traced one ({jax_error})."
    with pytest.raises(pw.TracingError, match=re.escape(prefix)) as info:
        p(jnp.ones(4))
    assert "Use jnp operations on the array instead" in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__  # JAX's frames hidden


def test_non_array_outputs_are_refused(two):
    s1, _ = two

    @pw.program(slice=s1)
    def p(x):
        return "done"

    with pytest.raises(pw.TracingError, match="must return arrays"):
        p(jnp.ones(4))


def test_indivisible_shape_for_a_spec(two):
    _, s2 = two
    f = pw.compiled(lambda x: x, slice=s2, in_specs=P("data"), name="f")

    @pw.program
    def p(x):
        return f(x)

    with pytest.raises(pw.SpecError, match="does not fit the PartitionSpec") as info:
        p(jnp.ones(3))
    assert "return f(x)" in str(info.value) and "multiples of the mesh axes" in str(info.value)


def test_glue_without_any_slice_needs_one(ctl):
    @pw.program
    def p(x):
        return x + 1

    with pytest.raises(pw.TracingError, match=re.escape("Pass a slice: `@pw.program(slice=s)`")):
        p(np.ones(3))
    s = pw.slice(1)
    q = pw.program(lambda x: x + 1, slice=s, name="q")
    np.testing.assert_array_equal(np.asarray(q(np.ones(3)).result()), [2.0] * 3)


def test_resharding_inside_a_slice_is_an_explicit_node(two):
    _, s2 = two
    rows = pw.compiled(lambda x: x * 2, slice=s2, in_specs=P("data"), out_specs=P("data"), name="rows")
    cols = pw.compiled(lambda x: x + 1, slice=s2, in_specs=P(None, "model"), out_specs=P(None, "model"), name="cols")

    @pw.program
    def p(x):
        return cols(rows(x))

    x = jax.device_put(jnp.ones((4, 4)), NamedSharding(s2.mesh, P("data")))
    g = p.trace(x)
    assert [n.name for n in g.nodes] == ["rows", "reshard s2->s2", "cols"]
    out = p.submit(x, mode="chained").outputs.result()
    np.testing.assert_array_equal(np.asarray(out), np.full((4, 4), 3.0))
    assert out.sharding.spec == P(None, "model")


def test_to_dot_is_valid_graphviz(two):
    s1, s2 = two
    a = pw.compiled(lambda x: x * 2, slice=s1, name="a")
    b = pw.compiled(lambda x: x + 1, slice=s2, name='b"quoted"')

    @pw.program
    def p(v):
        return b(a(v) + 1)

    dot = p.trace(jnp.ones(4)).to_dot()
    assert dot.startswith('digraph "p" {') and "shape=diamond" in dot and "float32[4]" in dot
    assert 'b\\"quoted\\"' in dot
    dot_bin = shutil.which("dot")
    assert dot_bin, "graphviz `dot` is installed by scripts/setup.sh"
    svg = subprocess.run([dot_bin, "-Tsvg"], input=dot, capture_output=True, text=True, check=True).stdout
    assert "<svg" in svg and "s1 → s2" in svg


def test_compiled_functions_created_inside_a_program_are_nodes(two):
    s1, _ = two

    @pw.program
    def p(x):
        ones = jnp.ones(4)  # glue before any compiled call: placed on the first compute slice
        return pw.compiled(lambda v: v * 5, slice=s1, name="made_here")(ones) + x

    g = p.trace(jnp.ones(4))
    assert [n.name for n in g.nodes if n.kind == "compute"] == ["made_here"]
    np.testing.assert_array_equal(np.asarray(p(jnp.ones(4)).result()), [6.0] * 4)


def test_a_program_called_inside_a_program_becomes_part_of_it(two):
    # as a jax.jit called inside a jax.jit: one graph, one run, the inner program's nodes inlined
    s1, s2 = two
    f = pw.compiled(lambda x: x * 2, slice=s1, name="f")
    g = pw.compiled(lambda x: x - 1, slice=s2, name="g")

    @pw.program
    def inner(x):
        return g(f(x) + 1)

    @pw.program
    def outer(x):
        y = inner(x)
        return inner(y), f(np.float32(3.0))  # a compiled call on a constant is a node here too

    graph = outer.trace(jnp.ones(4))
    assert [n.name for n in graph.nodes if n.kind == "compute"] == ["f", "g", "f:1", "g:1", "f:2"]
    runs = len(pw.controller().runs)
    y, z = outer(jnp.ones(4))
    np.testing.assert_allclose(np.asarray(y.result()), np.full(4, 4.0))  # inner(x) = 2x: inner(inner(1))
    assert float(z.result()) == 6.0 and len(pw.controller().runs) == runs + 1

    @pw.program
    def submits(x):
        return inner.submit(x).outputs

    with pytest.raises(pw.ArgumentError, match=re.escape("`inner.submit` was called while another program is being traced")):
        submits.trace(jnp.ones(4))

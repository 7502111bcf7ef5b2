"""pw computes what plain JAX computes, with the shardings JAX would choose.

Each test writes one computation both ways, in today's JAX style, and compares
the values and the shardings.
"""

from __future__ import annotations

import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pw_kernel as pw
from pw_kernel.runtime.extend import hold


def same(got, want):
    """Equal values and equal shardings, leaf by leaf (and the same pytree structure)."""
    got, want = pw.get(got), want
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)
        assert g.sharding.is_equivalent_to(w.sharding, g.ndim), (g.sharding, w.sharding)


def test_out_specs_given_as_a_list_like_jit_out_shardings(ctl):
    s = pw.slice(2, mesh={"d": 2})
    fn = lambda x: [x * 2, x + 1]  # noqa: E731
    x = jnp.arange(4.0)
    f = pw.compiled(fn, slice=s, in_specs=[P("d")], out_specs=[P("d"), P()])
    want = jax.jit(fn, in_shardings=[s.sharding("d")], out_shardings=[s.sharding("d"), s.sharding()])(x)
    same(f(x), want)


def test_a_slice_made_from_the_notebooks_mesh_combines_with_its_arrays(ctl):
    mesh = jax.make_mesh((2, 4), ("x", "y"))  # Explicit axes, as jax.make_mesh gives in JAX 0.10
    s = pw.slice(mesh=mesh, name="nb")
    assert s.mesh is mesh and s.size == 8 and tuple(s.mesh.axis_types) == tuple(mesh.axis_types)
    x = jax.device_put(jnp.arange(16.0).reshape(8, 2), jax.sharding.NamedSharding(mesh, P("x")))
    f = pw.compiled(lambda v: v * 2, slice=s, in_specs=P("x"), out_specs=P("x"), name="double")
    want = jax.jit(lambda v: v * 2, out_shardings=jax.sharding.NamedSharding(mesh, P("x")))(x)
    got = f(x)
    same(got, want)
    same(pw.get(got) + x, want + x)  # a pw result and a notebook array on the same mesh combine


def test_slices_with_explicit_axes(ctl):
    Explicit = jax.sharding.AxisType.Explicit
    s = pw.slice(4, mesh={"a": 2, "b": 2}, axis_types=Explicit)
    assert tuple(s.mesh.axis_types) == (Explicit, Explicit)
    t = pw.slice(2, mesh={"d": 2})
    assert tuple(t.mesh.axis_types) == (jax.sharding.AxisType.Auto,)  # the default stays Auto
    with pytest.raises(pw.SliceError, match="takes a jax.sharding.AxisType, or one per mesh axis"):
        pw.slice(4, mesh={"a": 2, "b": 2}, axis_types=("Explicit",))
    with pytest.raises(pw.SliceError, match="a slice made from a Mesh has its devices"):
        pw.slice(4, mesh=jax.make_mesh((2, 4), ("x", "y")))


# ----------------------------------------------------------------- glue: plain jnp between compiled calls
def _two_inputs(s):
    a = pw.compiled(lambda x: x, slice=s, in_specs=P("a", None), out_specs=P("a", None), name="rows")
    b = pw.compiled(lambda x: x, slice=s, in_specs=P(None, "b"), out_specs=P(None, "b"), name="cols")
    x, y = jnp.arange(64.0).reshape(8, 8), jnp.ones((8, 8))
    xs, ys = jax.device_put(x, s.sharding("a", None)), jax.device_put(y, s.sharding(None, "b"))
    return a, b, x, y, xs, ys


def test_glue_outputs_are_sharded_as_jax_propagates(ctl):
    s = pw.slice(8, mesh={"a": 2, "b": 4})
    rows, cols, x, y, xs, ys = _two_inputs(s)
    f = pw.program(lambda x, y: jnp.dot(rows(x), cols(y)))
    same(f(x, y), jax.jit(jnp.dot)(xs, ys))  # P('a', 'b'), not the first input's P('a', None)


def test_a_sharding_constraint_in_glue_is_kept(ctl):
    s = pw.slice(8, mesh={"a": 2, "b": 4})
    rows, _, x, _, xs, _ = _two_inputs(s)

    def body(v):
        return jax.lax.with_sharding_constraint(v * 2, s.sharding("a", "b"))

    same(pw.program(lambda v: body(rows(v)))(x), jax.jit(body)(xs))


def test_a_nested_jits_out_shardings_are_kept(ctl):
    s = pw.slice(8, mesh={"a": 2, "b": 4})
    rows, _, x, _, xs, _ = _two_inputs(s)
    inner = jax.jit(lambda v: v + 1, out_shardings=s.sharding(None, "b"))
    same(pw.program(lambda v: inner(rows(v)))(x), jax.jit(inner)(xs))


def test_shard_map_out_specs_are_kept(ctl):
    s = pw.slice(8, mesh={"a": 2, "b": 4})
    whole = pw.compiled(lambda x: x, slice=s, in_specs=P(), out_specs=P(), name="whole")
    x = jnp.arange(64.0).reshape(8, 8)
    sm = jax.shard_map(lambda v: v * 2, mesh=s.mesh, in_specs=P("a", None), out_specs=P("a", None))
    same(pw.program(lambda v: sm(whole(v)))(x), jax.jit(sm)(jax.device_put(x, s.sharding())))


def test_an_array_on_a_mesh_no_slice_covers_is_adopted(ctl):
    mesh = jax.make_mesh((4,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    x = jax.device_put(jnp.arange(8.0), jax.sharding.NamedSharding(mesh, P("i")))
    f = pw.program(lambda v: jnp.sin(v) * 2)  # no pw.compiled call, no slice given: x's own mesh is used
    same(f(x), jax.jit(lambda v: jnp.sin(v) * 2)(x))
    adopted = [s for s in pw.controller().resources.slices if s.mesh == mesh]
    assert len(adopted) == 1
    same(f(x), jax.jit(lambda v: jnp.sin(v) * 2)(x))  # traced again: the same slice, not a second one
    assert len([s for s in pw.controller().resources.slices if s.mesh == mesh]) == 1


def test_code_under_jax_set_mesh_on_a_slice_made_from_that_mesh(ctl):
    mesh = jax.make_mesh((2, 4), ("x", "y"))  # Explicit axes
    s = pw.slice(mesh=mesh)
    with jax.set_mesh(mesh):  # today's JAX style: the mesh is the context, shard_map needs no mesh=
        dot = pw.compiled(lambda a, b: a @ b, slice=s, in_specs=(P("x", None), P(None, "y")), out_specs=P("x", "y"))
        a, b = jnp.arange(64.0).reshape(8, 8), jnp.ones((8, 8))
        want = jax.jit(lambda a, b: a @ b, out_shardings=s.sharding("x", "y"))(
            jax.device_put(a, s.sharding("x", None)), jax.device_put(b, s.sharding(None, "y"))
        )
        same(dot(a, b), want)
        sm = jax.shard_map(lambda v: v * 2, in_specs=P("x"), out_specs=P("x"))
        f = pw.compiled(sm, slice=s, in_specs=P("x"), out_specs=P("x"))
        x = jnp.arange(8.0)
        same(f(x), jax.jit(sm, out_shardings=s.sharding("x"))(jax.device_put(x, s.sharding("x"))))


# ----------------------------------------------------------------- every case, Auto and Explicit, with and without set_mesh
def _case_glue_dot(s, mesh, ctx):
    rows = pw.compiled(lambda x: x, slice=s, in_specs=P("a", None), out_specs=P("a", None), name="rows")
    cols = pw.compiled(lambda x: x, slice=s, in_specs=P(None, "b"), out_specs=P(None, "b"), name="cols")
    x, y = jnp.arange(64.0).reshape(8, 8), jnp.ones((8, 8))
    want = jax.jit(jnp.dot)(jax.device_put(x, s.sharding("a", None)), jax.device_put(y, s.sharding(None, "b")))
    return pw.program(lambda x, y: jnp.dot(rows(x), cols(y)))(x, y), want


def _case_constraint(s, mesh, ctx):
    rows = pw.compiled(lambda x: x, slice=s, in_specs=P("a", None), out_specs=P("a", None), name="rows")
    target = P("a", "b") if ctx else s.sharding("a", "b")  # under set_mesh a bare spec is enough
    explicit = mesh.axis_types[0] == jax.sharding.AxisType.Explicit
    constrain = jax.sharding.reshard if explicit else jax.lax.with_sharding_constraint  # as JAX asks

    def body(v):
        return constrain(v * 2, target)

    x = jnp.arange(64.0).reshape(8, 8)
    return pw.program(lambda v: body(rows(v)))(x), jax.jit(body)(jax.device_put(x, s.sharding("a", None)))


def _case_nested_jit(s, mesh, ctx):
    rows = pw.compiled(lambda x: x, slice=s, in_specs=P("a", None), out_specs=P("a", None), name="rows")
    inner = jax.jit(lambda v: v + 1, out_shardings=P(None, "b") if ctx else s.sharding(None, "b"))
    x = jnp.arange(64.0).reshape(8, 8)
    return pw.program(lambda v: inner(rows(v)))(x), jax.jit(inner)(jax.device_put(x, s.sharding("a", None)))


def _case_shard_map(s, mesh, ctx):
    # With Explicit axes shard_map's in_specs must be the argument's sharding (JAX reshards only Auto ones).
    spec = P("a", None) if mesh.axis_types[0] == jax.sharding.AxisType.Explicit else P()
    first = pw.compiled(lambda x: x, slice=s, in_specs=spec, out_specs=spec, name="first")
    kw = {} if ctx else {"mesh": mesh}  # under set_mesh, shard_map takes the context's mesh
    sm = jax.shard_map(lambda v: v * 2, in_specs=P("a", None), out_specs=P("a", None), **kw)
    x = jnp.arange(64.0).reshape(8, 8)
    return pw.program(lambda v: sm(first(v)))(x), jax.jit(sm)(jax.device_put(x, s.sharding(*spec)))


def _case_compiled_without_out_specs(s, mesh, ctx):
    fn = lambda v: jnp.sin(v).T * 2  # noqa: E731 - XLA propagates P('a', 'b') to P('b', 'a')
    f = pw.compiled(fn, slice=s, in_specs=P("a", "b"))
    x = jnp.arange(64.0).reshape(8, 8)
    return f(x), jax.jit(fn, in_shardings=s.sharding("a", "b"))(jax.device_put(x, s.sharding("a", "b")))


CASES = [_case_glue_dot, _case_constraint, _case_nested_jit, _case_shard_map, _case_compiled_without_out_specs]


@pytest.mark.parametrize("set_mesh", [False, True], ids=["no-context", "set_mesh"])
@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
@pytest.mark.parametrize("case", CASES, ids=lambda f: f.__name__[len("_case_") :])
def test_pw_gives_what_plain_jax_gives(ctl, case, axis_type, set_mesh):
    t = getattr(jax.sharding.AxisType, axis_type)
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(t, t))
    s = pw.slice(mesh=mesh)
    if not set_mesh:
        got, want = case(s, mesh, False)
    else:
        with jax.set_mesh(mesh):
            got, want = case(s, mesh, True)
    same(got, want)


def test_code_under_set_mesh_on_a_slice_of_another_mesh_says_what_to_do(ctl):
    mesh = jax.make_mesh((2, 4), ("x", "y"))
    s = pw.slice(4, mesh={"x": 4}, name="other")
    with jax.set_mesh(mesh):
        sm = jax.shard_map(lambda v: v * 2, in_specs=P("x"), out_specs=P("x"))  # takes the context's mesh
        f = pw.compiled(sm, slice=s, in_specs=P("x"), out_specs=P("x"))
        with pytest.raises(pw.TracingError) as err:
            f(jnp.arange(8.0))
    msg = str(err.value)
    assert "runs under `jax.set_mesh` with the mesh (x: 2, y: 4; Explicit, Explicit)" in msg, msg
    assert "slice(s) 'other' (x: 4; Auto)" in msg and "`pw.slice(mesh=m)`" in msg


def test_a_training_step_written_for_jax_jit_runs_with_jaxs_shardings(ctl):
    # Today's JAX style: Explicit axes, jax.set_mesh, shardings in the types, optax. The step is
    # handed to pw.compiled as it was to jax.jit, with no specs: arguments keep their shardings.
    optax = pytest.importorskip("optax")
    Explicit = jax.sharding.AxisType.Explicit
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(Explicit, Explicit))
    with jax.set_mesh(mesh):
        k1, k2 = jax.random.split(jax.random.key(0))
        params = {
            "w1": jax.random.normal(k1, (16, 32), out_sharding=P(None, "model")) * 0.1,
            "w2": jax.random.normal(k2, (32, 4), out_sharding=P("model", None)) * 0.1,
        }
        rng = np.random.default_rng(0)
        x = jax.device_put(rng.normal(size=(64, 16)).astype(np.float32), P("data", None))
        y = jax.device_put(rng.normal(size=(64, 4)).astype(np.float32), P("data", None))
        opt = optax.adamw(1e-2)

        def loss_fn(p, x, y):
            h = jax.nn.relu(x @ p["w1"])
            return jnp.mean((jnp.matmul(h, p["w2"], out_sharding=P("data", None)) - y) ** 2)

        def train_step(p, o, x, y):
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            updates, o = opt.update(g, o, p)
            return optax.apply_updates(p, updates), o, loss

        want = (params, opt.init(params))
        for _ in range(5):
            *want, want_loss = jax.jit(train_step)(*want, x, y)

        step = pw.compiled(train_step, slice=pw.slice(mesh=mesh))

        @pw.program(mode="chained")
        def five(p, o, x, y):
            for _ in range(5):
                p, o, loss = step(p, o, x, y)
            return p, o, loss

        run = five.submit(params, opt.init(params), x, y)
        got_p, got_o, got_loss = run.outputs
        same((got_p, got_o, got_loss), (*want, want_loss))
        assert [n.kind for n in run.graph.nodes] == ["compute"] * 5  # no transfer: nothing was resharded


def test_typed_prng_keys_flow_through_a_program_as_through_jit(ctl):
    # jax.random.key (not the legacy uint32 PRNGKey) is how today's JAX code carries randomness
    a, b = pw.slice(4, mesh={"data": 4}, name="a"), pw.slice(2, mesh={"data": 2}, name="b")
    noise = pw.compiled(lambda k, x: x + jax.random.normal(k, x.shape), slice=a, name="noise")
    drop = pw.compiled(lambda k, x: jnp.where(jax.random.bernoulli(k, 0.5, x.shape), x, 0.0), slice=b, name="drop")

    def plain(key, x):
        k1, k2 = jax.random.split(key)  # glue: plain jax between the compiled calls
        return drop(k2, noise(k1, x)), k2

    x = jnp.arange(32.0).reshape(8, 4)
    key = jax.random.key(7)
    y, k2 = pw.program(plain, name="keys")(key, x)
    assert k2.dtype == key.dtype and k2.shape == ()  # a future of a key knows it is one
    k1_want, k2_want = jax.random.split(key)
    y_want = jnp.where(jax.random.bernoulli(k2_want, 0.5, x.shape), x + jax.random.normal(k1_want, x.shape), 0.0)
    np.testing.assert_allclose(np.asarray(y.result()), np.asarray(y_want), rtol=1e-6)
    np.testing.assert_array_equal(jax.random.key_data(k2.result()), jax.random.key_data(k2_want))
    graph = pw.program(plain, name="keys").trace(key, x)
    assert "key<fry>[]" in repr(graph)  # the listing names the key type, as a jaxpr does
    # a key per example, split along the batch axis with the batch: each shard gets its examples' keys
    keys = jax.device_put(jax.random.split(key, 8), a.sharding("data"))
    per_example = pw.compiled(jax.vmap(lambda k, r: r + jax.random.normal(k, r.shape)), slice=a)
    want = jax.jit(jax.vmap(lambda k, r: r + jax.random.normal(k, r.shape)))(keys, x)
    same(per_example(keys, jax.device_put(x, a.sharding("data"))), want)


def test_a_function_that_ignores_its_input_still_runs_on_an_explicit_slice(ctl):
    # jnp.zeros_like(p) uses only p's type: jit alone prunes p, runs on one device and refuses the mesh
    # (JAX asks for jax.set_mesh); a pw node always runs on its slice
    s = pw.slice(2, mesh={"data": 2}, axis_types=jax.sharding.AxisType.Explicit)
    p = jax.device_put(np.ones((4, 4), np.float32), s.sharding())
    with jax.set_mesh(s.mesh):
        want = jax.jit(jnp.zeros_like)(p)
    for mode in ("chained", "fused"):
        zeros = pw.compiled(jnp.zeros_like, slice=s, name="zeros")
        same(pw.program(lambda p, zeros=zeros: zeros(p), mode=mode, name=f"zeros {mode}")(p), want)


def test_bare_partition_specs_in_a_compiled_function_mean_its_slices_axes(ctl):
    # Explicit-axes code as written under jax.set_mesh(m), compiled for a slice made without m in context
    mesh = jax.make_mesh((2, 4), ("x", "y"))
    s = pw.slice(mesh=mesh)

    def f(a, b):
        c = jnp.matmul(a, b, out_sharding=P("x", "y"))
        return jax.sharding.reshard(c * 2, P(None, "y"))

    a = jax.device_put(jnp.arange(64.0).reshape(8, 8), jax.sharding.NamedSharding(mesh, P("x", None)))
    b = jax.device_put(jnp.ones((8, 8)), jax.sharding.NamedSharding(mesh, P(None, "y")))
    with jax.set_mesh(mesh):
        want = jax.jit(f)(a, b)
    same(pw.compiled(f, slice=s)(a, b), want)


@pytest.mark.parametrize("axis_type", [jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit])
def test_static_arguments_as_jax_jit_takes_them(ctl, axis_type):
    s = pw.slice(2, mesh={"d": 2}, axis_types=axis_type)

    def layers(x, n, *, scale=1.0):  # Python control flow on n: n must be static
        for _ in range(n):
            x = jnp.tanh(x) * 2
        return x * scale

    x = jax.device_put(jnp.arange(4.0), s.sharding("d"))
    step = pw.compiled(layers, slice=s, static_argnums=1, static_argnames="scale")
    ref = jax.jit(layers, static_argnums=1, static_argnames="scale")
    same(step(x, 3, scale=0.5), ref(x, 3, scale=0.5))

    @pw.program
    def deeper(x):
        return step(step(x, 1), 2, scale=2.0)

    same(deeper(x), ref(ref(x, 1), 2, scale=2.0))
    # in_specs cover the other arguments, as jit's in_shardings do
    sharded = pw.compiled(layers, slice=s, static_argnums=(1,), in_specs=(P("d"),))
    want = jax.jit(layers, static_argnums=(1,), in_shardings=(s.sharding("d"),))
    same(sharded(x, 2), want(x, 2))


def test_jit_options_it_does_not_take_are_refused_with_what_to_do(ctl):
    s = pw.slice(2)
    with pytest.raises(pw.ArgumentError, match="got 'backend', which it does not take. It takes slice, in_specs"):
        pw.compiled(lambda x: x * 2, slice=s, backend="cpu")
    with pytest.raises(pw.ArgumentError, match=r"static_argnums=...\)` takes ints, as jax.jit does; got 'n'"):
        pw.compiled(lambda x, n: x * n, slice=s, static_argnums="n")


SPEC_TREES = [  # (in_specs, out_specs) as a user writes them; None leaves left to JAX
    (None, P("model", None)),
    (None, (P("model", None), None)),
    (None, (P(None, "model"), P("model", None), None)),
    (None, {"a": P("model", None), "b": None, "c": P("data", "model")}),
    (None, [P("model", None, None), None]),
    ((P("model", None), None), None),
    ((P("model", None), None), (P("data", None), None)),
    ((P(None, "model"), P("data", None)), (None, P("model", None))),
]


@pytest.mark.parametrize("in_specs,out_specs", SPEC_TREES, ids=[f"{i}->{o}" for i, o in SPEC_TREES])
def test_every_spec_comes_back_as_jax_jit_gives_it(ctl, in_specs, out_specs):
    # trailing Nones kept, with None siblings in the tree: code that compares specs, as JAX's docs do, works
    s = pw.slice(4, mesh={"model": 2, "data": 2})
    sharding = lambda t: None if t is None else s.sharding(t)  # noqa: E731
    is_spec = lambda v: v is None or isinstance(v, P)  # noqa: E731

    def f(x, y):
        rank3, outs = (x * y)[None].repeat(2, 0), iter([x * 2, x + y, x - y])
        return jax.tree.map(lambda sp: rank3 if sp is not None and len(sp) == 3 else next(outs), out_specs, is_leaf=is_spec)

    x, y = jnp.arange(32.0).reshape(4, 8), jnp.ones((4, 8))
    if in_specs is not None:
        x, y = (jax.device_put(a, sharding(sp) or s.sharding()) for a, sp in zip((x, y), in_specs))
    else:
        x, y = (jax.device_put(a, s.sharding()) for a in (x, y))
    got = pw.get(pw.compiled(f, slice=s, in_specs=in_specs, out_specs=out_specs)(x, y))
    want = jax.jit(
        f,
        in_shardings=None if in_specs is None else jax.tree.map(sharding, in_specs, is_leaf=is_spec),
        out_shardings=jax.tree.map(sharding, out_specs, is_leaf=is_spec),
    )(x, y)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.sharding.spec == b.sharding.spec, (a.sharding.spec, b.sharding.spec)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_donation_as_jax_jit_has_it_reuses_the_buffer_and_says_where_it_went(ctl):
    s = pw.slice(2, mesh={"d": 2})
    double = pw.compiled(lambda x: x * 2, slice=s, donate_argnums=0, name="double")
    bump = pw.compiled(lambda x, *, by: x + by, slice=s, donate_argnames="x", name="bump")
    x = jax.device_put(jnp.arange(8.0), s.sharding("d"))
    y = double(x)
    np.testing.assert_array_equal(np.asarray(y.result()), np.arange(8.0) * 2)
    assert x.is_deleted()  # as jax.jit(donate_argnums=0) leaves it
    z = bump(y, by=1.0)
    np.testing.assert_array_equal(np.asarray(z.result()), np.arange(8.0) * 2 + 1)
    # the future given up is never read by accident: each reader is told where it went
    with pytest.raises(pw.ArgumentError, match=re.escape("was donated to run") + ".*node 'bump'"):
        y.result()
    with pytest.raises(pw.ArgumentError, match="input 0 .* was donated to run .*Use the values that run returned"):
        double(y)


def test_a_donated_value_read_later_in_the_program_is_refused_naming_the_reader(ctl):
    s = pw.slice(2, mesh={"d": 2})
    add = pw.compiled(lambda a, b: a + b, slice=s, name="add")
    scale = pw.compiled(lambda a: a * 3, slice=s, donate_argnums=0, name="scale")
    x = jax.device_put(jnp.ones(8), s.sharding("d"))

    @pw.program
    def reads_it_after(v):
        h = add(v, v)
        return scale(h), add(h, h)

    msg = "`pw.compiled(donate_argnums=...)` 'scale': its argument 0 (float32[8]) is donated, but `add` (line"
    with pytest.raises(pw.ArgumentError, match=re.escape(msg) + ".*reads it afterwards.*pass a copy"):
        reads_it_after(x)

    @pw.program
    def returns_it(v):
        h = add(v, v)
        return scale(h), h

    with pytest.raises(pw.ArgumentError, match=re.escape("but the program's caller (the program returns it")):
        returns_it(x)

    @pw.program
    def fine(v):
        h = add(v, v)
        return scale(h)

    graph = fine.trace(x)
    assert [n.donated for n in graph.nodes] == [(), (0,)]
    # the donated intermediate's buffer holds the output: the run allocates one buffer, not two
    plan = pw.controller().plan(graph, "chained")
    assert plan.peak_bytes == {d.id: 4 * 8 // 2 for d in s.devices}
    np.testing.assert_array_equal(np.asarray(fine(x).result()), np.full(8, 6.0))
    assert not x.is_deleted()  # only what the program made was donated


def test_an_input_pw_still_reads_is_not_donated(ctl):
    # a checkpoint still to write it, or an earlier run that reads it: the donating run leaves it alone (a copy)
    s = pw.slice(2, mesh={"d": 2})
    double = pw.compiled(lambda x: x * 2, slice=s, donate_argnums=0, name="double")
    x = jax.device_put(jnp.arange(8.0), s.sharding("d"))
    held = hold({"x": x})
    y = double(x)
    assert not x.is_deleted() and pw.controller().runs[-1].graph.nodes[0].donated == ()
    held.release()
    np.testing.assert_array_equal(np.asarray(x), np.arange(8.0))
    y.run.wait()  # the run that read it (without donating) is over too
    y2 = double(x)  # nobody else reads it now: donated
    np.testing.assert_array_equal(np.asarray(y2.result()), np.arange(8.0) * 2)
    assert x.is_deleted()
    np.testing.assert_array_equal(np.asarray(y.result()), np.arange(8.0) * 2)


def test_thousands_of_calls_on_one_array_without_waiting_then_a_donation(ctl):
    # a user's loop that never waits: every call reads x; the donating call after them gets x's buffer
    # only once XLA has run every earlier read (as jax.jit orders it), and each result is right
    s = pw.slice(1, name="loop")
    inc = pw.compiled(lambda x: x + 1, slice=s, name="inc")
    consume = pw.compiled(lambda x: x * 10, slice=s, donate_argnums=0, name="consume")
    x = jax.device_put(jnp.arange(4.0), s.sharding(None))
    ys = [inc(x) for _ in range(2000)]
    z = consume(x)
    np.testing.assert_array_equal(np.asarray(z.result()), np.arange(4.0) * 10)
    for y in ys[::97] + ys[-1:]:
        np.testing.assert_array_equal(np.asarray(y.result()), np.arange(4.0) + 1)


def test_a_training_loop_that_donates_its_state_and_never_waits_trains_as_jax_does(ctl):
    # A user's optax-style loop: each step donates the state the last one returned, and nothing waits.
    # A step is often dispatched (taking its input's buffers) before the one before it is completed:
    # completion then finds that run's outputs donated, as jax.jit leaves them, which is no failure.
    s = pw.slice(1, name="train")

    def step(w, m, x):
        g = jnp.tanh(x @ w) @ w.T - x
        m = 0.9 * m + (x.T @ g) / x.shape[0]
        return w - 0.01 * m, m, jnp.mean(g * g)

    train = pw.compiled(step, slice=s, donate_argnums=(0, 1), name="train")
    plain = jax.jit(step, donate_argnums=(0, 1))
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(128, 128)).astype(np.float32) / 12
    xs = [rng.normal(size=(64, 128)).astype(np.float32) for _ in range(8)]
    w, m = jnp.asarray(w0), jnp.zeros((128, 128))
    pw_losses = []
    for i in range(120):
        w, m, loss = train(w, m, xs[i % 8])
        pw_losses.append(loss)
    jw, jm = jnp.asarray(w0), jnp.zeros((128, 128))
    jax_losses = []
    for i in range(120):
        jw, jm, loss = plain(jw, jm, xs[i % 8])
        jax_losses.append(loss)
    np.testing.assert_allclose([float(v) for v in pw.get(pw_losses)], [float(v) for v in jax_losses], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(w.result()), np.asarray(jw), rtol=1e-6)
    assert {r.state for r in pw.controller().runs} == {"done"}


def test_what_pw_still_reads_is_one_record_per_run_in_flight_and_none_once_they_end():
    # a value's readers were once noted per value and pruned by scanning them all (quadratic in a
    # loop of unwaited calls); now a run not yet final is one record, whatever it reads, and a run
    # that would donate asks the live ones only
    from pw_kernel.runtime import donation

    s = pw.slice(1, name="reads")
    inc = pw.compiled(lambda t: jax.tree.map(lambda v: v + 1, t), slice=s, name="inc")
    x = {f"p{i}": jnp.ones(3) for i in range(50)}
    outs = [inc(x) for _ in range(2000)]
    in_flight = sum(1 for r in pw.controller().runs if not r.done())
    assert donation.readers() <= in_flight + 1  # (+1: one may be noted between the two counts)
    pw.controller().wait_all()
    assert donation.readers() == 0
    assert jnp.array_equal(pw.get(outs[-1])["p7"], jnp.full(3, 2.0))


def test_the_first_donation_in_a_process_of_a_finished_future_is_still_named():
    # a finished future passed on is read as its array; donated, it is the future that says where it went
    from fresh_python import run_python

    out = run_python(textwrap.dedent("""
        import jax, jax.numpy as jnp, pw_kernel as pw
        s = pw.slice(1)
        inc = pw.compiled(lambda x: x + 1, slice=s, name="inc")
        consume = pw.compiled(lambda x: x * 10, slice=s, donate_argnums=0, name="consume")
        y = inc(jnp.arange(4.0))
        y.result()
        print(consume(y).result().tolist())
        try:
            y.result()
        except pw.ArgumentError as e:
            print("refused:", e)
    """))
    assert "[10.0, 20.0, 30.0, 40.0]" in out
    assert "refused: `Future.result`: output 0 of run" in out and "was donated to run" in out

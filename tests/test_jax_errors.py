"""Every entry of the JAX error table still matches the error JAX really raises.

pw tells some JAX errors apart by their class or by the words of their message
(`pw_kernel/runtime/trace/jax_errors.py`). Each entry has a trigger here: the
real JAX call a program makes when it hits that error. A JAX upgrade that
renames a class or rewords a message fails the test named after its entry.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pw_kernel.runtime.trace.jax_errors import TABLE, classify

X = jax.ShapeDtypeStruct((4,), jnp.float32)


def _branch_on_a_traced_value():
    jax.make_jaxpr(lambda x: x if x.sum() > 0 else -x)(X)


def _float_of_a_traced_value():
    jax.make_jaxpr(lambda x: x * float(x[0]))(X)


def _numpy_array_of_a_traced_value():
    jax.make_jaxpr(lambda x: np.asarray(x))(X)


def _range_over_a_traced_value():
    jax.make_jaxpr(lambda x: [x for _ in range(x[0].astype(jnp.int32))])(X)


def _spec_that_does_not_divide_the_shape(axis_type):
    # A `pw.compiled` call inside a program: a nested jit with in_shardings, traced with a (3,) value.
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",), axis_types=(axis_type,))
    f = jax.jit(lambda x: x * 2, in_shardings=NamedSharding(mesh, P("data")))
    jax.make_jaxpr(f)(jax.ShapeDtypeStruct((3,), jnp.float32))


def _a_string_returned():
    jax.make_jaxpr(lambda x: {"status": "ok"})(X)


# Each entry's triggers: the JAX calls that raise its error (one per way a program gets there).
TRIGGERS = {
    "control_flow": [_branch_on_a_traced_value],
    "concrete_value": [_float_of_a_traced_value],
    "array_conversion": [_numpy_array_of_a_traced_value],
    "integer_conversion": [_range_over_a_traced_value],
    "indivisible_sharding": [  # pw slices have Auto axes unless made with Explicit ones
        functools.partial(_spec_that_does_not_divide_the_shape, AxisType.Auto),
        functools.partial(_spec_that_does_not_divide_the_shape, AxisType.Explicit),
    ],
    "non_array_output": [_a_string_returned],
}


def test_every_entry_has_a_trigger_and_a_name_of_its_own():
    names = [kind.name for kind in TABLE]
    assert len(names) == len(set(names))
    assert set(names) == set(TRIGGERS)
    assert all(TRIGGERS[name] for name in names)


@pytest.mark.parametrize("kind", TABLE, ids=[kind.name for kind in TABLE])
def test_the_real_jax_error_still_matches_its_entry(kind):
    for trigger in TRIGGERS[kind.name]:
        with pytest.raises(Exception) as info:
            trigger()
        err = info.value
        if kind.types:
            assert isinstance(err, kind.types), f"JAX now raises {type(err).__name__}: {err}"
        if kind.fragments:
            assert any(f in str(err) for f in kind.fragments), f"JAX's message changed: {err}"
        assert classify(err) is kind  # and no entry before it takes the error
        pw_err = kind.error(err, "`pw.program` 'p'", "")
        assert isinstance(pw_err, kind.becomes)
        assert str(pw_err).startswith("`pw.program` 'p'") and str(pw_err).endswith(kind.hint)


def test_an_error_no_entry_knows_is_left_unclassified():
    with pytest.raises(TypeError) as info:
        jax.make_jaxpr(lambda x: x @ jnp.ones((3, 3)))(X)  # shapes (4,) @ (3, 3)
    assert classify(info.value) is None

"""pw computes what plain JAX computes, with the shardings JAX would choose.

Each test writes one computation both ways, in today's JAX style, and compares
the values and the shardings.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pw_kernel as pw


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

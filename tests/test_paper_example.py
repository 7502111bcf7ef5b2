"""The paper's example program (Pathways §4.2): f(v) = (b(a(v)), a(c(a(v))))."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw


def make_abc(slices):
    sa, sb, sc = slices
    a = pw.compiled(lambda x: x * 2, slice=sa, name="a")
    b = pw.compiled(lambda x: x + 1, slice=sb, name="b")
    c = pw.compiled(lambda x: x / 2, slice=sc, name="c")

    @pw.program
    def f(v):
        x = a(v)
        y = b(x)
        z = a(c(x))
        return (y, z)

    return f


V = jnp.array([1.0, 2.0])


def check(f, mode=None):
    y, z = pw.get(f.submit(V, mode=mode).outputs)
    np.testing.assert_array_equal(np.asarray(y), [3.0, 5.0])
    np.testing.assert_array_equal(np.asarray(z), [2.0, 4.0])


@pytest.mark.parametrize("mode", ["auto", "chained", "fused"])
def test_one_slice(ctl, mode):
    s = pw.slice(2, name="s")
    f = make_abc([s, s, s])
    check(f, mode)
    g = f.trace(V)
    assert [n.name for n in g.nodes if n.kind == "compute"] == ["a", "b", "c", "a:1"]


def test_three_slices(ctl):
    slices = [pw.slice(2, name=n) for n in ("sa", "sb", "sc")]
    f = make_abc(slices)
    check(f)
    g = f.trace(V)
    moves = [(n.src_slice.name, n.slice.name) for n in g.nodes if n.kind == "transfer" and n.src_slice is not None]
    assert moves == [("sa", "sb"), ("sa", "sc"), ("sc", "sa")]
    assert not any(n.cross_island for n in g.nodes)
    with pytest.raises(pw.FusedModeError, match="runs on 3 slices|run on 3 slices"):
        f.submit(V, mode="fused")
    assert f.submit(V, mode="auto").mode == "chained"


def test_two_islands(ctl2):
    sa = pw.slice(2, name="sa", island=0)
    sb = pw.slice(2, name="sb", island=1)
    f = make_abc([sa, sb, sa])
    check(f)
    g = f.trace(V)
    cross = [n for n in g.nodes if n.cross_island]
    assert [(n.src_slice.island.id, n.slice.island.id) for n in cross] == [(0, 1)]
    run = pw.controller().runs[-1]
    islands_used = {e.island for e in run.events}
    assert islands_used == {0, 1}

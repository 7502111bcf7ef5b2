"""Islands, virtual slices and the resource manager."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pw_kernel as pw


def test_eight_simulated_devices_in_one_island_by_default(ctl):
    assert len(pw.devices()) == 8
    (island,) = pw.islands()
    assert island.platform == "cpu"
    assert [d.id for d in island.devices] == list(range(8))


def test_two_islands_of_four(ctl2):
    islands = pw.islands()
    assert [[d.id for d in i.devices] for i in islands] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_explicit_islands():
    try:
        pw.init(islands=[[0, 1], [2, 3, 4, 5, 6, 7]])
        assert [len(i.devices) for i in pw.islands()] == [2, 6]
        with pytest.raises(pw.SliceError, match=re.escape("island 0 has only 2 devices")):
            pw.slice(3, island=0)
    finally:
        pw.shutdown()


@pytest.mark.parametrize(
    "islands, message",
    [
        (3, "splits each platform's devices into 3 equal islands, but cpu has 8 devices"),
        ([[0, 1], [1, 2]], "puts device 1 in two islands"),
        ([[0, 99]], "names device id 99"),
        (0, "must be a positive int"),
    ],
)
def test_bad_island_configuration(islands, message):
    with pytest.raises(pw.SliceError, match=re.escape(message)):
        pw.init(islands=islands)
    pw.shutdown()


def test_slice_has_a_named_mesh(ctl):
    s = pw.slice(4, mesh={"data": 2, "model": 2}, name="a")
    assert s.name == "a"
    assert dict(s.mesh.shape) == {"data": 2, "model": 2}
    assert len(s.devices) == 4 and s.island.id == 0
    sh = s.sharding("data", None)
    assert isinstance(sh, NamedSharding) and sh.spec == P("data", None)
    x = jax.device_put(jnp.ones((4, 4)), sh)
    assert {d.id for d in x.sharding.device_set} == {d.id for d in s.devices}


def test_placement_is_one_to_one_while_devices_are_free(ctl):
    slices = [pw.slice(2) for _ in range(4)]
    used = [d.id for s in slices for d in s.devices]
    assert sorted(used) == list(range(8))  # no device shared while free ones remain
    assert all(ctl.resources.load(d) == 1 for d in ctl.devices)


def test_oversubscription_balances_load(ctl):
    for _ in range(6):
        pw.slice(4)
    loads = [ctl.resources.load(d) for d in ctl.devices]
    assert loads == [3] * 8  # 24 device-slots spread evenly over 8 devices


def test_load_balancing_prefers_the_less_loaded_island(ctl2):
    a = pw.slice(4)
    b = pw.slice(4)
    assert {a.island.id, b.island.id} == {0, 1}
    pw.slice(2, island=1)  # island 1 now carries more load than island 0
    d = pw.slice(2)
    assert d.island.id == 0
    e = pw.slice(2, island=0)
    assert not set(d.devices) & set(e.devices)  # least-loaded devices first


def test_release_returns_devices_and_allows_the_name_again(ctl):
    s = pw.slice(8, name="all")
    s.release()
    assert s.released and all(ctl.resources.load(d) == 0 for d in ctl.devices)
    again = pw.slice(8, name="all")  # the name is free again: remapped onto the same devices
    assert again.devices == s.devices
    with pytest.raises(pw.SliceReleasedError, match=re.escape("slice 'all' was released")):
        s.sharding()
    with pytest.raises(pw.SliceReleasedError, match="was released"):
        pw.compiled(lambda x: x, slice=s)


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((16,), {}, "`pw.slice(16)`: no island has 16 devices"),
        ((4,), {"mesh": {"data": 3}}, "the mesh has 3 devices, not 4"),
        ((4,), {"mesh": {"data": 2, "model": 3}}, "the mesh has 2 x 3 = 6 devices, not 4"),
        ((2,), {"island": 7}, "`pw.slice(island=7)`: no such island"),
        ((0,), {}, "needs a positive int number of devices; got 0"),
        ((2.5,), {}, "got 2.5"),
        ((2,), {"mesh": ["data"]}, "must be a dict of axis name to size"),
    ],
)
def test_impossible_slice_requests_are_clear(ctl, args, kwargs, message):
    with pytest.raises(pw.SliceError, match=re.escape(message)):
        pw.slice(*args, **kwargs)
    assert pw.slice(2).size == 2  # the resource manager is still usable


def test_duplicate_live_name_is_refused(ctl):
    pw.slice(2, name="x")
    with pytest.raises(pw.SliceError, match=re.escape("a live slice already has that name")):
        pw.slice(2, name="x")


def test_unknown_mesh_axis_in_a_spec(ctl):
    s = pw.slice(2, mesh={"data": 2}, name="s")
    with pytest.raises(pw.SpecError, match=re.escape("names mesh axis 'model', but slice 's' has axes ('data',)")):
        s.sharding("model")
    with pytest.raises(pw.SpecError, match=re.escape("names mesh axis 'batch'")):
        pw.compiled(lambda x: x, slice=s, in_specs=P("batch"))


def test_sharded_value_round_trips(ctl):
    s = pw.slice(4, mesh={"data": 4})
    x = np.arange(16.0).reshape(8, 2)
    y = jax.device_put(x, s.sharding("data"))
    assert len(y.addressable_shards) == 4
    np.testing.assert_array_equal(np.asarray(y), x)


def test_a_device_count_asked_in_xla_flags_but_not_granted_is_explained(ctl, monkeypatch):
    from pw_kernel.runtime.config import device_flags_ignored

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    msg = device_flags_ignored(jax.devices())
    assert "XLA_FLAGS asks for 4 CPU devices, but JAX started with 8" in msg
    assert "jax.config.update('jax_num_cpu_devices', 4)" in msg and "--devices 4" in msg
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert device_flags_ignored(jax.devices()) is None

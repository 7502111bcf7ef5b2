"""A notebook's controller over a 3-node Ray cluster (a head and two workers, each a real raylet, all on
127.0.0.1): one island per node, programs across them, and a host that dies under queued runs.

The cluster is the module's (starting one takes ~15 s here); the islands are a fresh controller's, one set
per device count, made in the order the tests need them (a killed node stays killed for the tests after).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw
from ray_cluster import LOOPBACK, add_node_back, alive_nodes, kill_node, local_cluster
from remote_islands import kill_islands
from test_paper_example import make_abc

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.system, pytest.mark.ray, pytest.mark.timeout(300)]

#: The lost host's runs must fail within this many seconds of the kill (a hang guard; the figure is printed).
LOST_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def lc():
    with local_cluster(nodes=3, devices_per_node=2) as cluster:
        yield cluster


class Fleet:
    """The current controller's Ray islands, one per node, with ``devices`` devices each (a new count: a new
    controller, the old islands' actors killed)."""

    def __init__(self, lc) -> None:
        self.lc, self.devices, self.islands = lc, None, []

    def of(self, devices: int) -> list:
        if devices != self.devices:
            self.close()
            pw.init(pw.Config(validate=True))
            self.islands = pw.add_ray_islands(self.lc.address, devices_per_island=devices)
            self.devices = devices
        return self.islands

    def on_node(self, k: int):
        (isl,) = [i for i in self.islands if i.remote.info["node_id"] == self.lc.node_id(k)]
        return isl

    def close(self) -> None:
        if self.devices is not None:
            kill_islands(ray, pw.controller())
            self.devices = None


@pytest.fixture(scope="module")
def fleet(lc):
    f = Fleet(lc)
    yield f
    f.close()


def test_a_ray_process_does_not_build_the_iri_grammar_on_import():
    """Every Ray node's agents and workers import Ray, and Ray imports jsonschema: with rfc3987-syntax installed
    (Jupyter's dependencies bring it) each of them spent ~2 s of CPU building its Earley parser, and a local
    Ray node took ~14 s to start instead of ~4. scripts/setup.sh removes it."""
    code = "import sys, ray, jsonschema; print(sorted(m for m in sys.modules if m.startswith(('rfc3987', 'lark'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]", f"imported with Ray: {out.stdout.strip()}; run ./scripts/setup.sh"


def test_every_node_and_this_driver_are_on_the_loopback(lc):
    nodes = alive_nodes()
    assert len(nodes) == 3
    assert [n["NodeManagerAddress"] for n in nodes] == [LOOPBACK] * 3
    assert lc.address.startswith(f"{LOOPBACK}:")
    assert ray.util.get_node_ip_address() == LOOPBACK  # this process joined as a driver on 127.0.0.1 too
    assert sorted(n["NodeID"] for n in nodes) == sorted(lc.node_id(k) for k in range(3))


@pytest.mark.parametrize("devices", [1, 2])
def test_one_island_per_node_each_with_its_own_devices_and_a_program_across_two(fleet, lc, devices):
    islands = fleet.of(devices)
    infos = [i.remote.info for i in islands]
    assert sorted(i["node_id"] for i in infos) == sorted(lc.node_id(k) for k in range(3))  # one per node
    assert len({i["pid"] for i in infos}) == 3 and {i["node_ip"] for i in infos} == {LOOPBACK}
    for isl in islands:  # each actor has exactly its node's devices, and says it runs on that node
        assert isl.size == devices and isl.remote.info["devices"] == list(range(devices))
        assert ray.get(isl.remote.actor.describe.remote(), timeout=60)["node_id"] == isl.remote.info["node_id"]
    a, b = fleet.on_node(0), fleet.on_node(1)
    sa = pw.slice(devices, island=a.id)
    f = make_abc([sa, pw.slice(devices, island=b.id), sa])
    y, z = f(jnp.array([1.0, 2.0]))
    np.testing.assert_array_equal(np.asarray(y.result(timeout=120)), [3.0, 5.0])
    np.testing.assert_array_equal(np.asarray(z.result(timeout=120)), [2.0, 4.0])
    moves = [e for e in y.run.events if e.kind == "transfer" and e.src_island is not None]
    assert [(e.src_island, e.island) for e in moves] == [(a.id, b.id)]  # node 0's actor to node 1's


def lost_message(exc: BaseException) -> str | None:
    """The message of the `IslandLostError` behind ``exc`` (itself, a run's error caused by it, or a run that read
    such a run's output: its ``root``), else None."""
    e: BaseException | None = exc
    while e is not None:
        if isinstance(e, pw.IslandLostError):
            return str(e)
        e = e.__cause__ or getattr(e, "root", None)
    return None


def test_a_lost_host_fails_the_runs_on_its_island_naming_it_and_the_others_go_on(fleet, lc, capsys):
    islands = fleet.of(2)
    doomed, a, b = fleet.on_node(2), fleet.on_node(0), fleet.on_node(1)
    # `n` steps of a 256x256 matmul: one step to compile and load it there, then runs of seconds each, so all
    # of the queued ones are still there (running or waiting in the actor's mailbox) when the host dies
    slow = pw.compiled(lambda x, n: jax.lax.fori_loop(0, n, lambda i, v: jnp.tanh(v @ v), x),
                       slice=pw.slice(2, island=doomed.id), name="slow")
    sa = pw.slice(2, island=a.id)
    ab = make_abc([sa, pw.slice(2, island=b.id), sa])
    x = jnp.eye(256) * 0.01
    slow(x, jnp.int32(1)).result(timeout=120)  # compiled and loaded there: what follows is queued work
    pw.get(ab(jnp.array([1.0, 2.0])), timeout=120)

    host = lc.node_id(2)
    assert doomed.remote.info["node_id"] == host
    queued = [slow(x, jnp.int32(20_000)) for _ in range(4)]
    at = kill_node(lc, 2)
    others = [ab(jnp.array([1.0, float(k)])) for k in range(3)]  # submitted after the kill: they go on
    seconds = []
    for fut in queued:
        with pytest.raises(Exception) as info:  # noqa: PT011 - which class depends on where the run was
            fut.result(timeout=max(0.1, at + LOST_WITHIN_S - time.monotonic()))
        seconds.append(time.monotonic() - at)
        message = lost_message(info.value)
        assert message is not None, info.value  # an IslandLostError, or a run's error caused by one
        assert f"island {doomed.id} (Ray actor on" in message
        assert f"node {LOOPBACK} ({host})" in message  # the host: its address and Ray node id
    with capsys.disabled():
        print(f"\n  lost host: its {len(queued)} queued runs failed {min(seconds):.2f}-{max(seconds):.2f} s after the kill")
    for k, (y, z) in enumerate(others):
        np.testing.assert_array_equal(np.asarray(y.result(timeout=120)), [3.0, 2.0 * k + 1.0])
        np.testing.assert_array_equal(np.asarray(z.result(timeout=120)), [2.0, 2.0 * k])
    assert [i.lost for i in pw.islands() if i.remote is not None] == [i is doomed for i in islands]
    assert "lost" in repr(doomed)
    with pytest.raises(pw.IslandLostError, match=re.escape(f"island {doomed.id} (Ray actor on")):
        slow(x, jnp.int32(1))  # a new call on the lost island is refused at once
    with pytest.raises(pw.IslandLostError, match=re.escape(f"island {doomed.id}")):
        pw.slice(2, island=doomed.id)
    # Ray's own view of the host comes from its health checks, which may lag pw's (the island is lost as soon
    # as its actor's connection fails: its runs failed within a tenth of a second): waited for, bounded.
    deadline = time.monotonic() + 60
    while len(alive_nodes()) != 2:
        assert time.monotonic() < deadline, alive_nodes()
        time.sleep(0.1)


def test_a_node_added_back_becomes_a_new_island(fleet, lc):
    fleet.of(2)
    k = add_node_back(lc)
    (fresh,) = pw.add_ray_islands(lc.address, devices_per_island=2)  # only the node without a live island
    assert fresh.remote.info["node_id"] == lc.node_id(k) and fresh.size == 2
    sa = pw.slice(2, island=fleet.on_node(0).id)
    f = make_abc([sa, pw.slice(2, island=fresh.id), sa])
    y, z = f(jnp.array([1.0, 2.0]))
    np.testing.assert_array_equal(np.asarray(y.result(timeout=120)), [3.0, 5.0])
    np.testing.assert_array_equal(np.asarray(z.result(timeout=120)), [2.0, 4.0])
    fleet.islands.append(fresh)


def layer(p, x):
    return jnp.tanh(x @ p)


def test_elastic_retry_goes_on_with_the_islands_that_remain_when_a_host_dies(fleet, lc):
    fleet.of(2)
    k = len(lc.nodes) - 1  # the node added back: its island is the second stage's until it dies
    far, near, spare = fleet.on_node(k), fleet.on_node(0), fleet.on_node(1)
    rng = np.random.default_rng(0)
    params = [rng.normal(size=(8, 8)).astype(np.float32) / 3 for _ in range(2)]
    batches = [(rng.normal(size=(8, 8)).astype(np.float32), rng.normal(size=(8, 8)).astype(np.float32))
               for _ in range(4)]
    retries, homes = [], []

    def train(slices_now, kill_at=None):
        pipe = pw.pipeline([layer, layer], slices=slices_now(), microbatches=4, schedule="1f1b")
        state, losses = pipe.init(params), []
        for step, (x, y) in enumerate(batches):
            state, loss = pipe.step(state, x, y)
            if step == kill_at and not retries:
                kill_node(lc, k)  # the second stage's host dies mid-training
            losses.append(float(loss.result(timeout=120)))
        return losses

    def on_what_remains():
        second = spare if far.lost else far
        homes.append(second.id)
        return [pw.slice(2, mesh={"data": 2}, island=near.id), pw.slice(2, mesh={"data": 2}, island=second.id)]

    got = pw.elastic_retry(train, on_retry=lambda n, e: retries.append(e))(on_what_remains, kill_at=1)
    assert len(retries) == 1 and lost_message(retries[0]) is not None, retries
    assert not near.lost and not spare.lost  # (a transfer from the dead island to them failed: they did not)
    assert homes == [far.id, spare.id] and far.lost
    want = train(lambda: [pw.slice(2, mesh={"data": 2}), pw.slice(2, mesh={"data": 2})])  # local, uninterrupted
    np.testing.assert_allclose(got, want, rtol=1e-5)

"""Islands on other hosts: a local Ray cluster with two actor processes of 4 simulated CPU devices each.

The notebook's controller stays the single controller: it traces, schedules and dispatches to the
remote islands, whose values stay there behind handles until asked for.
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import re
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw
from pw_kernel.runtime import IslandOutput
from remote_islands import kill_islands
from test_paper_example import make_abc

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@pytest.fixture
def remote(ray_cluster):
    """A fresh controller (keeping no finished outputs) with two remote islands of 4 devices."""
    c = pw.init(pw.Config(keep_outputs=0, validate=True))
    islands = pw.add_ray_islands(count=2, devices_per_island=4)
    yield islands
    kill_islands(ray, c)


def buffers(island) -> int:
    gc.collect()
    return ray.get(island.remote.actor.stats.remote())["buffers"]


def buffers_settle(island, want: int, within_s: float = 30.0) -> int:
    """The island's buffer count once frees have arrived: they travel on the island's mailbox thread,
    not in order with this thread's actor calls, so a count read right after ``del`` may predate them."""
    deadline = time.monotonic() + within_s
    while (n := buffers(island)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


def paper_example(sa, sb):
    return make_abc([sa, sb, sa])  # a and c on sa, b on sb


def test_the_paper_example_across_two_remote_islands(remote):
    i0, i1 = remote
    assert [i.size for i in remote] == [4, 4] and i0.remote.info["pid"] != i1.remote.info["pid"]
    f = paper_example(pw.slice(2, island=i0.id), pw.slice(2, island=i1.id))
    y, z = f(jnp.array([1.0, 2.0]))
    np.testing.assert_array_equal(np.asarray(y.result(timeout=120)), [3.0, 5.0])
    np.testing.assert_array_equal(np.asarray(z.result(timeout=120)), [2.0, 4.0])
    run = y.run
    assert {e.island for e in run.events} == {i0.id, i1.id}
    moves = [e for e in run.events if e.kind == "transfer" and e.src_island is not None]
    assert [(e.src_island, e.island) for e in moves] == [(i0.id, i1.id)]
    for e in run.events:  # remote times, corrected to this process's clock
        assert e.end >= e.start >= e.dispatch
    # the same program on local islands gives the same answer
    local = paper_example(pw.slice(2), pw.slice(2))
    for got, want in zip(pw.get((y, z)), pw.get(local(jnp.array([1.0, 2.0])))):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_small_output_comes_back_with_its_call_and_a_big_one_is_asked_for(remote):
    i0, _ = remote
    s = pw.slice(1, island=i0.id)
    f = pw.compiled(lambda x: (x.sum(), x * 2), slice=s)  # a loss-sized output and a 64 KiB one
    link = i0.remote.link
    asked = []
    request = link.request
    link.request = lambda method, *args: (asked.append(method), request(method, *args))[1]
    try:
        loss, big = f(jnp.ones(16 * 1024))
        assert float(loss.result(timeout=120)) == 16 * 1024.0
        assert "get" not in asked  # it came with the run's reply
        assert np.asarray(big.result(timeout=120))[0] == 2.0
        assert asked.count("get") == 1
    finally:
        del link.request


def test_values_stay_remote_until_asked_and_handles_are_freed(remote):
    i0, _ = remote
    s = pw.slice(4, mesh={"d": 4}, island=i0.id)
    f = pw.compiled(lambda x: jnp.sin(x) * 2, slice=s, in_specs=jax.sharding.PartitionSpec("d"),
                    out_specs=jax.sharding.PartitionSpec("d"), name="f")
    before = buffers(i0)
    fut = f(np.arange(8, dtype=np.float32))
    fut.run.wait(120)
    assert type(concurrent.futures.Future.result(fut)).__name__ == "RemoteArray"  # the controller holds a handle, not the bytes
    np.testing.assert_allclose(np.asarray(fut.result()), np.sin(np.arange(8)) * 2, rtol=1e-6)
    assert buffers(i0) > before
    del fut
    assert buffers_settle(i0, before) == before


def test_a_two_stage_pipeline_across_the_islands_matches_local(remote):
    i0, i1 = remote
    W = 8

    def layer(p, x):
        return jnp.tanh(x @ p)

    rng = np.random.default_rng(0)
    params = [rng.normal(size=(W, W)).astype(np.float32) / 3 for _ in range(2)]
    x = rng.normal(size=(8, W)).astype(np.float32)
    y = rng.normal(size=(8, W)).astype(np.float32)
    results = []
    for slices in ([pw.slice(2, mesh={"data": 2}, island=i0.id), pw.slice(2, mesh={"data": 2}, island=i1.id)],
                   [pw.slice(2, mesh={"data": 2}), pw.slice(2, mesh={"data": 2})]):
        pipe = pw.pipeline([layer, layer], slices=slices, microbatches=4, schedule="1f1b")
        loss, grads = pw.get(pipe.grads(pipe.place(params), x, y), timeout=240)
        results.append((float(loss), [np.asarray(g) for g in grads]))
    (rl, rg), (ll, lg) = results
    np.testing.assert_allclose(rl, ll, rtol=1e-5)
    for a, b in zip(rg, lg):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_typed_prng_keys_travel_to_remote_islands_and_back(remote):
    # numpy cannot hold a jax.random.key: it crosses processes as its key data and is wrapped again
    i0, i1 = remote
    a, b = pw.slice(4, mesh={"d": 4}, island=i0.id), pw.slice(2, island=i1.id)
    noise = pw.compiled(lambda k, x: x + jax.random.normal(k, x.shape), slice=a, name="noise")
    fold = pw.compiled(lambda k: jax.random.fold_in(k, 1), slice=b, name="fold")

    def plain(key, x, noise=noise, fold=fold):
        k1, k2 = jax.random.split(key)
        return noise(k1, x), fold(k2)  # keys cross to the islands, between them, and back

    key, x = jax.random.key(5), jnp.ones((8, 2))
    y, k = pw.program(plain, name="remote keys")(key, x)
    want_y, want_k = jax.jit(lambda key, x: plain(key, x, noise=lambda k, v: v + jax.random.normal(k, v.shape),
                                                   fold=lambda k: jax.random.fold_in(k, 1)))(key, x)
    np.testing.assert_allclose(np.asarray(y.result(timeout=120)), np.asarray(want_y), rtol=1e-6)
    assert k.result(timeout=120).dtype == key.dtype
    np.testing.assert_array_equal(jax.random.key_data(k.result()), jax.random.key_data(want_k))


def test_a_stage_that_prints_runs_on_a_ray_island_and_its_lines_come_back_marked_with_the_island(remote, capsys):
    i0, _ = remote
    far = pw.slice(2, mesh={"d": 2}, island=i0.id, name="far")

    def say(v):
        logging.getLogger("stage").warning("logged %s", v)

    def stage(x):
        jax.debug.print("x = {}", x.sum())
        return x * 2

    def quiet_stage(x):
        jax.debug.callback(say, x.sum())
        return x + 1

    loud = pw.compiled(stage, slice=far, name="loud")
    fut = loud(jnp.arange(4.0))  # exported nodes cannot call the host: this one went as pickled Python
    np.testing.assert_array_equal(np.asarray(fut.result(timeout=120)), [0.0, 2.0, 4.0, 6.0])
    log = pw.controller().events
    assert [tuple(o) for o in log.outputs] == [(fut.run.id, "loud", i0.id, "stdout", "x = 6.0\n")]
    assert f"[island {i0.id}] x = 6.0\n" in capsys.readouterr().out  # no notebook: this process's stdout
    taken: list = []
    stop = log.subscribe(taken.append, kinds=("output",))  # a subscriber that takes outputs: nothing echoed
    try:
        again = pw.compiled(quiet_stage, slice=far, name="quiet")(jnp.arange(4.0))
        np.testing.assert_array_equal(np.asarray(again.result(timeout=120)), [1.0, 2.0, 3.0, 4.0])
    finally:
        stop()
    assert all(isinstance(o, IslandOutput) for o in taken)
    assert [(o.node, o.stream, o.text) for o in taken] == [("quiet", "stderr", "WARNING:stage:logged 6.0\n")]
    assert "logged" not in "".join(capsys.readouterr())  # taken: not echoed


def test_a_host_callback_that_cannot_travel_is_refused_at_submit_and_one_that_raises_fails_its_node(remote):
    i0, _ = remote
    far = pw.slice(2, island=i0.id, name="far")
    held = threading.Lock()

    def locked(x):
        jax.debug.callback(lambda v: held, x.sum())  # a lock cannot be pickled to the island
        return x * 2

    with pytest.raises(pw.SliceError, match=r"node 'locked' .* calls the host .* cannot be pickled: .*lock"):
        pw.compiled(locked, slice=far, name="locked")(jnp.ones(4))

    def boom(v):
        raise ValueError(f"bad value {v}")

    def raising(x):
        jax.debug.callback(boom, x.sum())
        return x * 2

    with pytest.raises(pw.NodeError, match=r"node 'raising' .* a host callback raised:(.|\n)*ValueError: bad value 4.0"):
        pw.compiled(raising, slice=far, name="raising")(jnp.ones(4)).result(timeout=120)
    quiet = pw.compiled(lambda x: x * 2, slice=far, name="quiet")  # the controller and the island go on
    np.testing.assert_allclose(np.asarray(quiet(jnp.ones(4)).result(timeout=120)), 2.0)


def test_a_dead_actor_fails_only_its_runs_and_the_island_can_be_added_again(remote):
    i0, i1 = remote
    s0, s1 = pw.slice(2, island=i0.id), pw.slice(2, island=i1.id)
    f0 = pw.compiled(lambda x: x + 1, slice=s0, name="f0")
    f1 = pw.compiled(lambda x: x * 3, slice=s1, name="f1")
    np.testing.assert_array_equal(np.asarray(f0(jnp.ones(2)).result(timeout=120)), [2.0, 2.0])
    ray.kill(i0.remote.actor)
    lost = f0(jnp.ones(2))
    with pytest.raises(pw.NodeError, match=re.escape(f"island {i0.id} (Ray actor on")) as info:
        lost.result(timeout=120)
    assert isinstance(info.value.__cause__, pw.IslandLostError)
    np.testing.assert_array_equal(np.asarray(f1(jnp.ones(2)).result(timeout=120)), [3.0, 3.0])
    with pytest.raises(pw.IslandLostError, match=re.escape(f"island {i0.id} (Ray actor on")):
        f0(jnp.ones(2))
    (again,) = pw.add_ray_islands(count=1, devices_per_island=4)
    g = pw.compiled(lambda x: x - 1, slice=pw.slice(2, island=again.id), name="g")
    np.testing.assert_array_equal(np.asarray(g(jnp.ones(2)).result(timeout=120)), [0.0, 0.0])
    ray.kill(again.remote.actor)


def run_calls(island) -> int:
    return ray.get(island.remote.actor.stats.remote())["run_calls"]


def test_consecutive_nodes_of_a_run_on_one_island_travel_in_one_actor_call(remote):
    i0, _ = remote
    s = pw.slice(2, island=i0.id)
    fs = [pw.compiled(lambda x, i=i: x * 2 + i, slice=s, name=f"op{i}") for i in range(6)]

    @pw.program
    def chain(v):
        for f in fs:
            v = f(v)
        return v

    want = np.ones(2, np.float32)
    for i in range(6):
        want = want * 2 + i
    chain.submit(jnp.ones(2), mode="chained").wait(120)  # ships the six executables; the actor compiles them
    before = run_calls(i0)
    run = chain.submit(jnp.ones(2), mode="chained")
    np.testing.assert_array_equal(np.asarray(run.outputs.result(timeout=120)), want)
    assert run_calls(i0) == before + 1  # six nodes, one actor call
    nodes = [e for e in run.events if e.kind == "compute"]
    assert len(nodes) == 6
    for a, b in zip(nodes, nodes[1:]):  # each node still has its own times, from the actor's clock
        assert a.end <= b.start and b.end >= b.start


def test_a_transfer_to_a_remote_island_does_not_hold_up_local_dispatch(remote):
    i0, _ = remote
    local_a, local_b = pw.slice(2), pw.slice(2)
    far = pw.slice(2, island=i0.id)
    slow = pw.compiled(lambda x: jax.lax.fori_loop(0, 300, lambda i, a: jnp.tanh(a @ a), x), slice=local_a, name="slow")
    use = pw.compiled(lambda x: x[:1, :1] + 1, slice=far, name="use")
    quick = pw.compiled(lambda x: x + 1, slice=local_b, name="quick")
    big = jnp.full((512, 512), 1e-3)
    ship = pw.program(lambda x: use(slow(x)), name="ship")
    pw.get(ship(big), timeout=120), quick(jnp.ones(2)).result(timeout=60)  # compile and load first

    shipped = ship.submit(big, mode="chained")  # the transfer needs `slow`'s value: ~0.5 s away
    done = quick(jnp.ones(2))
    done.result(timeout=60)
    shipped.wait(120)
    (slow_ev,) = [e for e in shipped.events if e.node == "slow"]
    (quick_ev,) = [e for e in done.run.events if e.node == "quick"]
    # Dispatching the transfer waited for nothing: the quick call behind it was dispatched during
    # `slow` (the transfer's wait for `slow`'s value and its serialising are the island mailbox's).
    assert quick_ev.dispatch < slow_ev.end, (quick_ev, slow_ev)


def test_prefetch_sends_batches_from_the_host_to_the_islands_actor(remote):
    i0, i1 = remote
    s = pw.slice(4, mesh={"data": 4}, island=i0.id)
    total = pw.compiled(lambda x: x.sum(), slice=s)
    source = (np.full((8, 2), k, np.float32) for k in range(4))
    local_before = len(jax.live_arrays())
    got = []
    for x in pw.prefetch(source, to=s, name="remote-feed"):
        assert isinstance(x, pw.Future) and x.slice is s and x.sharding.spec == jax.sharding.PartitionSpec("data")
        got.append(float(total(x).result()))
    assert got == [16.0 * k for k in range(4)]
    assert len(jax.live_arrays()) <= local_before  # nothing was placed on local devices on the way
    runs = [r for r in pw.controller().runs if r.name == "place batch"]
    moved = [e for r in runs for e in r.events if e.kind == "transfer"]
    assert len(runs) == 4 and all(e.src_island is None and e.island == s.island.id for e in moved)


def _boom(v):
    raise ValueError(f"bad value {v}")


def test_a_value_moved_from_a_failed_node_to_a_host_that_died_leaves_no_unhandled_error(remote):
    """A host dies while a run that moves a value to it is queued, and the node that makes that value failed:
    the read for the move is answered (the source holds no such value) rather than raised, so Ray finds no
    error nobody read and prints nothing; the run fails with its node's error."""
    i0, i1 = remote
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    ray_log = logging.getLogger("ray._private.worker")
    ray_log.addHandler(handler)

    def failing(x):
        jax.debug.callback(_boom, x.sum())
        return x * 2

    first = pw.compiled(failing, slice=pw.slice(2, island=i0.id), name="failing")
    then = pw.compiled(lambda x: x + 1, slice=pw.slice(2, island=i1.id), name="then")

    @pw.program
    def step(x):
        return then(first(x))

    try:
        ray.kill(i1.remote.actor)  # (no island is told: the run's move to it is sent as if it were alive)
        with pytest.raises(pw.NodeError):
            step(jnp.ones(4)).result(timeout=120)
        gc.collect()  # (Ray reports an error nobody read as its last ref is dropped)
    finally:
        ray_log.removeHandler(handler)
    assert not [m for m in seen if "Unhandled error" in m], seen


def test_after_ray_shutdown_a_ray_island_is_lost_and_no_new_ray_starts(remote):
    """A late call on a Ray island (a run, a read, a free) after ``ray.shutdown()`` fails as the island's
    loss; none of them starts a new Ray in this process (Ray's own calls would: its auto-init)."""
    from pw_kernel.runtime.extend import init_ray
    from ray_cluster import SESSION_RAY

    i0, _ = remote
    f = pw.compiled(lambda x: x + 1, slice=pw.slice(2, island=i0.id), name="f")
    held = f(jnp.ones(4))
    np.testing.assert_array_equal(np.asarray(held.result(timeout=120)), [2.0] * 4)
    ray.shutdown()
    try:
        with pytest.raises(pw.NodeError, match=r"ray.shutdown\(\)") as info:
            f(jnp.ones(4)).result(timeout=120)
        assert isinstance(info.value.__cause__, pw.IslandLostError)
        with pytest.raises(pw.IslandLostError, match=rf"island {i0.id} .*is gone"):
            f(jnp.ones(4))
        del held  # (the island is lost: its buffer's free is not sent)
        gc.collect()
        assert not ray.is_initialized()
    finally:
        init_ray("local", **SESSION_RAY)  # (the session's Ray, for the tests after this one)


def test_a_stopped_watch_of_the_ray_nodes_has_ended_and_adds_no_island(ray_cluster):
    """The service's watcher of its Ray nodes (`serve --ray`): it adds an island on a node that has none; once
    stopped it has ended and adds nothing, though the stopping service let its islands go (every node looks
    unserved then), so no Ray call of its races the ``ray.shutdown()`` that may follow."""
    from pw_kernel.service.ray_nodes import RayNodes

    ctrl = pw.init(pw.Config(keep_outputs=0))
    nodes = RayNodes(ctrl, devices_per_island=1).start()
    try:
        deadline = time.monotonic() + 120
        while not [i for i in ctrl.islands if i.remote is not None] and time.monotonic() < deadline:
            time.sleep(0.1)
        (island,) = [i for i in ctrl.islands if i.remote is not None]
        assert island.remote.info["node_id"] == ray.get_runtime_context().get_node_id()
    finally:
        nodes.stop()
    assert not nodes._thread.is_alive()
    island.remote.alive = False  # (as `Service.stop` lets it go)
    assert nodes.look() == ([], []) and [i for i in ctrl.islands if i.remote is not None] == [island]
    kill_islands(ray, ctrl)

"""`pw.prefetch`: batches placed ahead on a thread of their own, errors at the step that needs them, nothing
leaked when a loop is left, checkpoints at the consumer's position, input nodes inside traced programs."""

from __future__ import annotations

import gc
import re
import sys
import textwrap
import threading
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pw_kernel as pw
from fresh_python import run_python
from pw_kernel.train.prefetch import MAX_READERS
from test_magics import Notebook, ip  # noqa: F401 - ip: the shell fixture
from test_pipeline import mlp_layer, mlp_params, W


def counted(n, shape=(8, 3), read=None, fail_at=None):
    """A generator of ``n`` batches full of their index; ``read`` records each one it gives."""
    for i in range(n):
        if i == fail_at:
            raise ValueError(f"record {i} is corrupt")
        if read is not None:
            read.append(i)
        yield np.full(shape, i, np.float32)


def threads_of(name: str) -> list[threading.Thread]:
    """A prefetch's placer (``pw-prefetch-NAME``) and readers (``pw-prefetch-NAME-read``)."""
    return [t for t in threading.enumerate() if t.name in (f"pw-prefetch-{name}", f"pw-prefetch-{name}-read")]


def prefetch_threads(it) -> list[threading.Thread]:
    return threads_of(it.name)


def settle(name: str) -> None:
    for t in threads_of(name):
        t.join(10)
    gc.collect()


class Reads:
    """Counts the reads of a source that are in flight at once, and the threads that make them.

    Each read waits for ``release`` (a hang guard of 30 s aside); ``both`` is set once two
    reads wait at the same time.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most = 0
        self.started: list[int] = []
        self.threads: set[str] = set()
        self.release = threading.Event()
        self.both = threading.Event()

    def read(self, i):
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.started.append(int(i))
            self.threads.add(threading.current_thread().name)
            if self.in_flight >= 2:
                self.both.set()
        self.release.wait(30)
        with self.lock:
            self.in_flight -= 1
        return np.full((2,), i, np.float32)


# ------------------------------------------------------------------ placing
def test_batches_come_in_order_split_over_the_slices_data_axis(ctl):
    s = pw.slice(4, mesh={"data": 4}, name="a")
    total = pw.compiled(lambda x: x.sum(), slice=s)
    got = []
    for x in pw.prefetch(counted(5), to=s):
        assert isinstance(x, jax.Array) and x.sharding == s.sharding("data")
        got.append(float(total(x).result()))
    assert got == [24.0 * i for i in range(5)]


def test_a_slice_without_a_data_axis_splits_over_its_first_and_axis_none_replicates(ctl):
    s = pw.slice(2, mesh={"rows": 2}, name="r")
    assert next(pw.prefetch(counted(2), to=s)).sharding.spec == P("rows")
    assert next(pw.prefetch(counted(2), to=s, axis=None)).sharding.spec == P()
    with pytest.raises(pw.PrefetchError, match=re.escape("slice 'r' has axes ('rows',)")):
        pw.prefetch(counted(2), to=s, axis="data")


def test_a_sharding_or_a_tree_of_them_places_each_part(ctl):
    a = pw.slice(2, mesh={"data": 2}, name="a")
    b = pw.slice(2, mesh={"data": 2}, name="b")
    pairs = ((np.ones((4, 2), np.float32), np.arange(4)) for _ in range(2))
    x, y = next(pw.prefetch(pairs, to=(a.sharding("data"), b.sharding())))
    assert x.sharding == a.sharding("data") and y.sharding == b.sharding()
    np.testing.assert_array_equal(np.asarray(y), np.arange(4))
    z = next(pw.prefetch(counted(1, shape=(3, 4)), to=NamedSharding(a.mesh, P(None, "data"))))
    assert z.sharding == NamedSharding(a.mesh, P(None, "data"))


def test_the_load_and_the_placing_of_each_batch_are_on_the_timeline(ctl):
    s = pw.slice(2, mesh={"data": 2}, name="a")
    it = pw.prefetch(counted(3), to=s, name="feed")
    assert len(list(it)) == 3
    evs = [e for e in ctl.events.nodes if e.program == "feed"]
    loads = [e for e in evs if e.kind == "input"]
    places = [e for e in evs if e.kind == "transfer"]
    assert [e.node for e in loads] == [f"load batch {k}" for k in range(3)]
    assert [e.node for e in places] == [f"place batch {k}" for k in range(3)]
    assert all(e.src_island is None and e.island == s.island.id for e in places)  # host -> the slice's island
    assert all(e.nbytes == 8 * 3 * 4 for e in places)
    for ld, pl in zip(loads, places):
        assert ld.start <= ld.end <= pl.start <= pl.end


def test_batches_are_placed_at_most_depth_ahead_of_the_loop(ctl):
    s = pw.slice(2, mesh={"data": 2}, name="a")
    read: list[int] = []
    gate = threading.Event()

    def source():
        for i in range(10):
            read.append(i)
            if i == 3:  # the taken batch and 3 ahead are read: the worker must now stop
                gate.set()
            yield np.full((2,), i, np.float32)

    it = pw.prefetch(source(), to=s, depth=3)
    next(it)
    gate.wait(10)
    settle_until = lambda: len(read)  # noqa: E731 - the worker stops at depth: nothing more is read
    for t in prefetch_threads(it):
        t.join(0.3)
    assert settle_until() == 4  # the batch taken, and 3 ahead of it
    it.close()


# ------------------------------------------------------------------ a pipeline
def test_a_pipeline_gets_x_on_its_first_slice_and_y_on_its_last_and_trains_as_without_prefetch(ctl):
    slices = [pw.slice(2, mesh={"data": 2}, name=f"p{j}") for j in range(2)]
    pipe = pw.pipeline([mlp_layer] * 2, slices=slices, microbatches=2, learning_rate=0.1)
    rng = np.random.default_rng(0)
    data = [(rng.normal(size=(8, W)).astype(np.float32), rng.normal(size=(8, W)).astype(np.float32)) for _ in range(4)]
    ref = pipe.init(mlp_params(2))
    for x, y in data:
        ref, ref_loss = pipe.step(ref, x, y)
    state = pipe.init(mlp_params(2))
    for x, y in pw.prefetch(data, to=pipe):
        assert set(x.sharding.device_set) == set(slices[0].devices) and x.sharding.spec == P("data")
        assert set(y.sharding.device_set) == set(slices[1].devices)
        state, loss = pipe.step(state, x, y)
    np.testing.assert_allclose(loss.result(), ref_loss.result(), rtol=1e-6)


def test_a_pipeline_batch_that_does_not_split_into_microbatches_says_which_sizes_would(ctl):
    slices = [pw.slice(2, mesh={"data": 2}, name=f"p{j}") for j in range(2)]
    pipe = pw.pipeline([mlp_layer] * 2, slices=slices, microbatches=2)
    it = pw.prefetch([(np.ones((6, W), np.float32), np.ones((6, W), np.float32))], to=pipe)
    msg = ("batch 0: leaf [0] has shape (6, 16); its axis 0 (6) does not split over 2 microbatches x mesh axis "
           "'data' (2 devices). Sizes that would: multiples of 4, e.g. 4 or 8.")
    with pytest.raises(pw.PrefetchError, match=re.escape(msg)):
        next(it)


# ------------------------------------------------------------------ errors and the end
def test_the_end_of_the_source_ends_the_loop(ctl):
    s = pw.slice(2, mesh={"data": 2}, name="a")
    it = pw.prefetch(counted(3), to=s)
    assert len(list(it)) == 3
    assert list(it) == []  # and stays ended


def test_a_source_error_names_the_batch_and_shows_its_traceback_once(ctl):
    s = pw.slice(2, mesh={"data": 2}, name="a")
    it = pw.prefetch(counted(10, fail_at=3), to=s, name="feed")
    got = [next(it) for _ in range(3)]
    assert len(got) == 3
    with pytest.raises(pw.PrefetchError) as err:
        next(it)
    assert "`feed`: the source raised ValueError while reading batch 3 (batches 0-2 were read before it)" in str(err.value)
    cause = err.value.__cause__
    assert isinstance(cause, ValueError) and str(cause) == "record 3 is corrupt"
    assert "counted" in "".join(traceback.format_tb(cause.__traceback__))  # the source's own frame
    with pytest.raises(StopIteration):  # raised once; the loop then ends
        next(it)


def test_a_batch_that_does_not_fit_the_sharding_says_which_axis_and_sizes_would(ctl):
    s = pw.slice(4, mesh={"data": 4}, name="a")
    it = pw.prefetch(counted(2, shape=(6, 3)), to=s)
    msg = ("`pw.prefetch(to=slice 'a')`: batch 0: the batch has shape (6, 3); its axis 0 (6) does not split over "
           "mesh axis 'data' (4 devices). Sizes that would: multiples of 4, e.g. 4 or 8.")
    with pytest.raises(pw.PrefetchError, match=re.escape(msg)):
        next(it)


def test_bad_arguments_are_clear(ctl):
    s = pw.slice(2, mesh={"data": 2}, name="a")
    with pytest.raises(pw.PrefetchError, match=re.escape("`pw.prefetch(depth=...)` must be an int >= 1")):
        pw.prefetch(counted(1), to=s, depth=0)
    with pytest.raises(pw.PrefetchError, match=re.escape("needs an iterable of batches (a grain dataset")):
        pw.prefetch(3, to=s)
    with pytest.raises(pw.PrefetchError, match=re.escape("`pw.prefetch(to=...)` takes a slice")):
        pw.prefetch(counted(1), to="gpu")


# ------------------------------------------------------------------ leaving a loop early
def test_a_script_that_ends_with_a_prefetch_still_loading_exits_cleanly():
    # The loop stops early and the script ends with the iterator still referenced: its thread
    # is stopped and joined at exit, not torn down inside the source's or JAX's code.
    out = run_python(textwrap.dedent("""
        import time, numpy as np, pw_kernel as pw
        s = pw.slice(4, mesh={"data": 4})
        def slow():
            for i in range(1000):
                time.sleep(0.01)
                yield np.full((256, 1024), i, np.float32)
        batches = pw.prefetch(slow(), to=s, depth=4)
        for _, x in zip(range(3), batches):
            pass
        print("left the loop at", int(x[0, 0]))
    """))
    assert "left the loop at 2" in out


def test_leaving_a_loop_early_stops_the_thread_and_frees_the_placed_batches(ctl):
    s = pw.slice(2, mesh={"data": 2}, name="a")
    gc.collect()
    before = len(jax.live_arrays())
    for k, batch in enumerate(pw.prefetch(counted(100, shape=(64, 64)), to=s, name="early")):
        if k == 2:
            break
    del batch  # the loop's own variable: the one batch the user still holds
    settle("early")
    assert not [t for t in threading.enumerate() if t.name == "pw-prefetch-early"]
    assert len(jax.live_arrays()) == before


def test_an_exception_in_the_loop_body_leaks_nothing(ctl):
    s = pw.slice(2, mesh={"data": 2}, name="a")
    gc.collect()
    before = len(jax.live_arrays())
    with pytest.raises(KeyboardInterrupt):
        for batch in pw.prefetch(counted(100, shape=(64, 64)), to=s, name="interrupted"):
            raise KeyboardInterrupt
    del batch
    settle("interrupted")
    assert not [t for t in threading.enumerate() if t.name == "pw-prefetch-interrupted"]
    assert len(jax.live_arrays()) == before


def test_ctrl_c_while_waiting_for_a_batch_stops_the_thread(ctl):
    import _thread

    s = pw.slice(2, mesh={"data": 2}, name="a")
    waiting, release = threading.Event(), threading.Event()

    def slow():
        yield np.zeros(2, np.float32)
        waiting.set()
        release.wait(30)
        yield np.ones(2, np.float32)

    def interrupt_when_waiting():
        waiting.wait(30)
        main = threading.main_thread().ident
        for _ in range(3000):  # Ctrl-C once the main thread waits for the batch, not before
            frame = sys._current_frames().get(main)
            while frame is not None and frame.f_code.co_name != "_peek":
                frame = frame.f_back
            if frame is not None:
                break
            time.sleep(0.01)
        _thread.interrupt_main()

    it = pw.prefetch(slow(), to=s, name="slow")
    next(it)
    threading.Thread(target=interrupt_when_waiting).start()
    with pytest.raises(KeyboardInterrupt):
        next(it)
    release.set()
    settle("slow")
    assert not [t for t in threading.enumerate() if t.name == "pw-prefetch-slow"]
    with pytest.raises(pw.PrefetchError, match="from a source that cannot go back"):
        next(it)  # the batch it had read is gone with the thread


def test_close_and_with_stop_the_thread(ctl):
    s = pw.slice(2, mesh={"data": 2}, name="a")
    with pw.prefetch(counted(50), to=s, name="ctx") as it:
        next(it)
    settle("ctx")
    assert not prefetch_threads(it)


# ------------------------------------------------------------------ checkpoints
def test_a_grain_map_dataset_is_read_by_the_prefetch_threads_alone(ctl):
    # Iterated as it is, a MapDataset starts 16 reader threads that fight the controller for the
    # interpreter; pw.prefetch reads it by index on a few threads of its own and asks grain for none.
    grain = pytest.importorskip("grain")
    s = pw.slice(2, mesh={"data": 2}, name="dp")
    rows = np.arange(64, dtype=np.float32).reshape(16, 4)
    before = {t.ident for t in threading.enumerate()}
    with pw.prefetch(grain.MapDataset.source(rows).batch(4, drop_remainder=True), to=s, name="own") as it:
        got = [np.asarray(next(it))]
        started = [t.name for t in threading.enumerate() if t.ident not in before]
        got += [np.asarray(b) for b in it]
    np.testing.assert_array_equal(np.concatenate(got), rows)
    # the placer and at most MAX_READERS readers (depth 2: 2), nothing of grain's
    assert set(started) <= {"pw-prefetch-own", "pw-prefetch-own-read"}, started
    assert len(started) <= 1 + MAX_READERS, started
    ds = grain.MapDataset.source(rows).batch(4).to_iter_dataset(grain.ReadOptions(num_threads=2))
    with pw.prefetch(ds, to=s) as it:  # an IterDataset is read as it was made, threads and all
        assert len([np.asarray(b) for b in it]) == 4


def test_map_dataset_reads_overlap_before_the_loop_takes_a_batch_and_never_use_more_than_two_threads(ctl):
    # Reads that wait on storage overlap: two are in flight at once while the loop has taken nothing.
    grain = pytest.importorskip("grain")
    s = pw.slice(2, mesh={"data": 2}, name="a")
    reads = Reads()
    it = pw.prefetch(grain.MapDataset.range(12).map(reads.read), to=s, depth=6, name="overlap")
    assert reads.both.wait(30), reads.started  # a hang guard only: one reader alone never gets here
    assert it.taken == 0 and sorted(reads.started) == [0, 1]
    reads.release.set()
    assert [float(np.asarray(b)[0]) for b in it] == list(range(12))  # in order, whichever read finished first
    # depth 6 lets 6 reads start, but no more than MAX_READERS threads ever read: a CPU-bound
    # source is not read by more threads than that, and grain starts none of its own
    assert reads.most == MAX_READERS == 2
    assert reads.threads == {"pw-prefetch-overlap-read"}
    assert sorted(reads.started) == list(range(12))  # each record read once


def test_map_dataset_reads_stay_within_depth_of_the_loop(ctl):
    grain = pytest.importorskip("grain")
    s = pw.slice(2, mesh={"data": 2}, name="a")
    reads = Reads()
    reads.release.set()
    it = pw.prefetch(grain.MapDataset.range(50).map(reads.read), to=s, depth=1, name="one")
    assert float(np.asarray(next(it))[0]) == 0
    for t in prefetch_threads(it):
        t.join(0.3)  # a pause for reads that should not happen: with depth 1, one batch ahead
    assert reads.started == [0, 1] and reads.most == 1
    assert float(np.asarray(next(it))[0]) == 1
    it.close()
    settle("one")
    assert not prefetch_threads(it)


def test_a_generator_is_read_ahead_while_a_batch_is_being_placed(ctl, monkeypatch):
    # One thread reads, another places: reading batch 1 does not wait for batch 0's transfer.
    from pw_kernel.train import targets

    s = pw.slice(2, mesh={"data": 2}, name="a")
    placing, placed = threading.Event(), threading.Event()
    place = targets.BatchTarget.place

    def slow_place(self, leaves, parts):
        placing.set()
        placed.wait(30)
        return place(self, leaves, parts)

    monkeypatch.setattr(targets.BatchTarget, "place", slow_place)
    read: list[int] = []
    two_read = threading.Event()

    def source():
        for i in range(5):
            read.append(i)
            if len(read) == 2:
                two_read.set()
            yield np.full((2,), i, np.float32)

    it = pw.prefetch(source(), to=s, depth=2, name="gen")
    assert placing.wait(30) and two_read.wait(30)  # hang guards only: batch 1 is read while batch 0 is placed
    assert it.taken == 0 and read == [0, 1]
    placed.set()
    assert [float(np.asarray(b)[0]) for b in it] == [0, 1, 2, 3, 4]


def test_a_map_dataset_error_comes_after_the_batches_before_it_though_read_at_once(ctl):
    grain = pytest.importorskip("grain")
    s = pw.slice(2, mesh={"data": 2}, name="a")

    def read(i):
        if i == 3:
            raise ValueError(f"record {i} is corrupt")
        return np.full((2,), i, np.float32)

    it = pw.prefetch(grain.MapDataset.range(10).map(read), to=s, depth=4, name="bad")
    assert [float(np.asarray(next(it))[0]) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(pw.PrefetchError, match=re.escape("`bad`: the source raised ValueError while reading batch 3")):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    settle("bad")
    assert not prefetch_threads(it)


def test_a_filtered_map_dataset_gives_grains_batches_and_states(ctl):
    # Records a filter drops give no batch, and each position is the one grain's own iterator
    # saves ({"next_index": i}): a checkpoint saved either way restores.
    grain = pytest.importorskip("grain")
    s = pw.slice(2, mesh={"data": 2}, name="a")
    ds = grain.MapDataset.range(20).filter(lambda i: i % 3 == 0).map(lambda i: np.full((2,), i, np.int32))
    theirs = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0)))
    want = [(int(b[0]), theirs.get_state()) for b in theirs]
    it = pw.prefetch(ds, to=s, depth=3)
    got = []
    for b in it:
        got.append((int(np.asarray(b)[0]), it.get_state()["source"]))
    assert got == want
    back = pw.prefetch(ds, to=s)
    back.set_state({"pw_prefetch": 1, "batches": 2, "source": want[1][1]})
    assert [int(np.asarray(b)[0]) for b in back] == [i for i, _ in want[2:]]


def test_a_grain_source_resumes_in_a_fresh_process_at_the_batch_the_loop_had_reached(tmp_path):
    pytest.importorskip("grain")
    common = """
        import numpy as np, grain, pw_kernel as pw
        s = pw.slice(2, mesh={"data": 2})
        ds = grain.MapDataset.range(100).map(lambda i: np.full((2,), i, np.int32)).batch(4)
        ckpt = pw.CheckpointManager(%r)
    """ % str(tmp_path / "ck")
    first = run_python(textwrap.dedent(common + """
        it = pw.prefetch(ds, to=s, depth=3)
        for _ in range(3):
            next(it)
        ckpt.save(3, {"data": it, "step": 3})   # the worker has read 3 more ahead by now
        print([int(np.asarray(next(it))[0, 0]) for _ in range(2)])
        ckpt.wait_until_finished()
    """))
    second = run_python(textwrap.dedent(common + """
        it = pw.prefetch(ds, to=s)
        back = ckpt.restore(target={"data": it, "step": None})
        print([int(np.asarray(next(back["data"]))[0, 0]) for _ in range(2)])
    """))
    assert first.split() == second.split() == ["[12,", "16]"]


def test_set_state_goes_back_and_a_generator_cannot_be_checkpointed(ctl, tmp_path):
    grain = pytest.importorskip("grain")
    s = pw.slice(2, mesh={"data": 2}, name="a")
    it = pw.prefetch(grain.MapDataset.range(20).batch(2), to=s)
    next(it)
    st = it.get_state()
    after = [np.asarray(next(it)) for _ in range(3)]
    it.set_state(st)
    np.testing.assert_array_equal(np.asarray([np.asarray(next(it)) for _ in range(3)]), np.asarray(after))
    ckpt = pw.CheckpointManager(tmp_path / "ck")
    with pytest.raises(pw.CheckpointError, match="cannot be checkpointed: its source, a generator, cannot say where"):
        ckpt.save(1, {"data": pw.prefetch(counted(3), to=s)})
    ckpt.close()


# ------------------------------------------------------------------ inside traced programs
def test_next_inside_a_program_is_an_input_node_read_at_run_time_not_at_trace_time(ctl):
    s = pw.slice(2, mesh={"data": 2}, name="a")
    f = pw.compiled(lambda w, x: w + x.sum(), slice=s)
    read: list[int] = []
    batches = pw.prefetch(counted(100, shape=(2,), read=read), to=s, depth=2)

    @pw.program
    def loop(w):
        for _ in range(50):
            w = f(w, next(batches))
        return w

    w0 = jax.device_put(np.float32(0), s.sharding())
    graph = loop.trace(w0)
    assert [n.kind for n in graph.nodes].count("input") == 50
    assert batches.taken == 0 and len(read) <= 3  # what the worker placed ahead; the trace took none
    out = loop(w0).result()
    assert float(out) == 2 * sum(range(50)) and batches.taken == 50
    out = loop(jnp.float32(0)).result()  # the cached trace takes the next 50
    assert float(out) == 2 * sum(range(50, 100)) and batches.taken == 100


def test_a_program_that_reads_past_the_end_fails_saying_so(ctl):
    s = pw.slice(2, mesh={"data": 2}, name="a")
    batches = pw.prefetch(counted(3, shape=(2,)), to=s, name="short")

    @pw.program
    def loop():
        return [next(batches) * 1 for _ in range(5)]

    with pytest.raises(pw.NodeError, match=re.escape("`short`: the program reads batch 3, but the source ended after 3")):
        pw.get(loop())


def test_reading_inside_a_compiled_function_or_iterating_forever_in_a_trace_is_an_error(ctl, monkeypatch):
    s = pw.slice(2, mesh={"data": 2}, name="a")
    batches = pw.prefetch(counted(10, shape=(2,)), to=s, name="b")
    inner = pw.compiled(lambda w: w + next(batches), slice=s)
    with pytest.raises(pw.TracingError, match="reads a data iterator .* inside a `pw.compiled` function"):
        pw.program(lambda w: inner(w))(jnp.zeros(2))

    @pw.program
    def bounded():
        return [x * 1 for _, x in zip(range(3), batches)]

    assert len(pw.get(bounded())) == 3 and batches.taken == 3

    @pw.program
    def forever():
        return [x for x in batches]

    from pw_kernel.runtime.trace import feeds

    monkeypatch.setattr(feeds, "MAX_READS", 20)  # 10,000 by default: fewer, so the test traces fewer
    with pytest.raises(pw.TracingError, match=re.escape("a `for batch in batches` loop in a traced program never ends")):
        forever()


def test_a_50_step_loop_in_a_cell_takes_50_batches_at_run_time_and_tracing_takes_none(ip, ctl):
    ip.reset()
    nb = Notebook(ip)
    nb.run(
        """
import numpy as np, jax.numpy as jnp
import pw_kernel as pw
s = pw.slice(2, mesh={"data": 2}, name="s")
f = pw.compiled(lambda w, x: w + x.sum(), slice=s, name="f")
def source():
    for i in range(60):
        yield np.full((2,), i, np.float32)
batches = pw.prefetch(source(), to=s, name="batches")
w = jnp.float32(0)
"""
    )
    cell = nb.run(
        """%%pathways --block --graph
for i in range(50):
    w = f(w, next(batches))
print("taken while tracing:", batches.taken)
"""
    )
    assert "taken while tracing: 0" in cell.stdout
    assert nb.ns["batches"].taken == 50
    assert float(nb.ns["w"]) == 2 * sum(range(50))
    run = pw.controller().runs[-1]
    assert sum(1 for n in run.graph.nodes if n.kind == "input") == 50


# ------------------------------------------------------------------ the timeline
def test_the_timeline_draws_loads_on_an_input_lane_and_opens_on_the_latest_activity(ctl):
    from timeline_events import chained_layers, node

    from pw_kernel.widgets.timeline_widget import TimelineWidget

    s = pw.slice(2, mesh={"data": 2}, name="a")
    list(pw.prefetch(counted(3), to=s, name="feed"))
    feed = [e for e in ctl.events.nodes if e.program == "feed"]
    tl = TimelineWidget(events=feed, live=False)
    lanes = {x["key"]: x for x in tl.lanes}
    assert lanes["input"]["label"] == "input: load" and lanes["input"]["kind"] == "host"
    assert lanes[f"xfer:None:{s.island.id}"]["label"] == f"host → island {s.island.id}"
    assert {x["kind"] for x in tl.lanes} == {"host", "transfer"}  # loading and placing occupy no device lane
    # an hour of idling between two bursts: the picture opens on the second
    old = [node(k, "early", k * 1_000_000, (k + 1) * 1_000_000) for k in range(3)]
    later = chained_layers(4, t0=3_600_000_000_000)
    tl = TimelineWidget(events=old + later, live=False)
    assert tl.recent_t0 == later[0].start
    page = tl.static_html()
    assert "3 earlier events before an idle gap not drawn" in page and ">early<" not in page


def test_show_pipeline_gives_each_schedule_a_timeline_of_its_own(ctl):
    pytest.importorskip("ipywidgets")
    slices = [pw.slice(2, mesh={"data": 2}, name=f"p{j}") for j in range(2)]
    pipes = {k: pw.pipeline([mlp_layer] * 2, slices=slices, microbatches=2, schedule=k, name=k) for k in ("gpipe", "1f1b")}
    x = np.ones((8, W), np.float32)
    stats = []
    for p in pipes.values():
        params = p.place(mlp_params(2))
        stats.append(p.stats(p.submit_step(params, x, x, mode="chained").wait()))
    view = pw.show_pipeline(stats)
    timelines = view.children[0].children
    assert [t.title.split(":")[0] for t in timelines] == ["gpipe.step", "1f1b.step"]
    for t, st in zip(timelines, stats):  # each one the events of its own step only
        assert {r["id"] for r in t.runs} == {st.run.id}
    html = view._repr_mimebundle_()[0]["text/html"]
    assert html.count("pw-timeline") >= 2 and "bubble ideal" in html

"""One completer: every node is completed once, whichever thread gets to it (`exec/completion.py`'s table).

The watcher thread, a caller waiting on a future, a streaming caller, the dispatcher thread and a
lone call's own thread all may complete nodes; each claims what it completes first. Counted here
by the node events the completer emits (one per completion, on the completing thread) and by the
lifecycle's counts: never by the clock.
"""

from __future__ import annotations

import collections
import random
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw


class Completions:
    """Every node event emitted, by node (``seq``), with the thread that completed it."""

    def __init__(self, ctl):
        self.by_seq: dict[int, list[str]] = collections.defaultdict(list)
        self.order: list = []  # (seq, run id), in emission order
        self._lock = threading.Lock()
        self.unsubscribe = ctl.events.subscribe(self._on, kinds=("node",))

    def _on(self, ev) -> None:
        if ev.kind == "compile":
            return
        with self._lock:
            self.by_seq[ev.seq].append(threading.current_thread().name)
            self.order.append((ev.seq, ev.run_id))

    def threads(self) -> collections.Counter:
        return collections.Counter(name for names in self.by_seq.values() for name in names)


def assert_each_node_completed_once(ctl, seen: Completions, runs) -> None:
    """Every run final, each of its nodes completed exactly once; the lifecycle's counts agree."""
    for run in runs:
        run.wait(120)
    twice = {seq: names for seq, names in seen.by_seq.items() if len(names) != 1}
    assert not twice, f"nodes completed more than once: {twice}"
    for run in runs:
        assert run.state == "done", run
        nodes = [e for e in run.events if e.kind != "compile"]
        assert run.nodes_done == run.nodes_dispatched == run.nodes_total == len(nodes), run
        assert len({e.seq for e in nodes}) == len(nodes)
        assert all(e.seq in seen.by_seq for e in nodes)
    life = ctl.lifecycle
    with ctl.lock:
        assert life.dispatched == life.completed  # per island: every node sent was reported finished once
        assert not any(life.inflight)
    assert sum(len(names) for names in seen.by_seq.values()) == sum(run.nodes_total for run in runs)


def test_the_watcher_and_waiting_callers_racing_complete_each_node_once(ctl):
    # Threads call tiny steps (computed inside their call: their own thread completes them), bigger
    # ones (handed over: the caller's wait or the watcher completes them), chained programs (the
    # dispatcher thread's), and wait at once, after a while around the watcher's lone-call delay
    # (5 ms), or never (the watcher, or whoever claims next, completes them).
    s1, s2 = pw.slice(1, name="a"), pw.slice(1, name="b")
    tiny = {s: pw.compiled(lambda v: v + 1, slice=s, name=f"tiny_{s.name}") for s in (s1, s2)}
    big = {s: pw.compiled(lambda m: jnp.tanh(m @ m) + 1, slice=s, name=f"big_{s.name}") for s in (s1, s2)}

    @pw.program
    def chain(v):
        for _ in range(6):
            v = tiny[s1](v) * 1.0
        return v

    v0 = {s: jax.device_put(jnp.zeros(8), s.sharding()) for s in (s1, s2)}
    m0 = {s: jax.device_put(jnp.eye(96) * 0.5, s.sharding()) for s in (s1, s2)}
    for s in (s1, s2):  # compiled first: later calls take the paths the test is about
        tiny[s](v0[s]).result()
        big[s](m0[s]).result()
    chain.submit(v0[s1], mode="chained").wait(60)
    seen = Completions(ctl)
    runs: list = []
    runs_lock = threading.Lock()
    errors: list[BaseException] = []

    def caller(k: int) -> None:
        rng = random.Random(k)
        s = (s1, s2)[k % 2]
        v = v0[s]
        try:
            for i in range(100):
                pick = rng.random()
                if pick < 0.4:
                    fut = tiny[s](v)
                    v = fut  # a stream: each call reads the last one's output
                elif pick < 0.8:
                    fut = big[s](m0[s])
                else:
                    fut = chain.submit(v0[s1], mode="chained").outputs
                with runs_lock:
                    runs.append(fut.run)
                how = rng.random()
                if how < 0.4:
                    fut.result()
                elif how < 0.7:
                    threading.Event().wait(rng.random() * 0.008)  # around the watcher's lone delay
                    fut.result()
                # else: nobody waits on it here
            np.testing.assert_array_equal(np.asarray(pw.get(v)).shape, (8,))
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    seen.unsubscribe()
    assert_each_node_completed_once(ctl, seen, runs)
    assert len(runs) == 400
    assert len(seen.threads()) >= 2  # (the callers' own, and the threads they hand nodes to)


def grinder(s):
    """A node that computes for ~0.1 s after its call returns (XLA:CPU runs it asynchronously)."""
    return pw.compiled(lambda a: jax.lax.fori_loop(0, 200, lambda i, b: jnp.tanh(b @ b), a), slice=s, name="grind")


def test_a_caller_waiting_while_the_watcher_completes_its_node_gets_it_and_the_node_completes_once(ctl):
    s = pw.slice(1, name="s")
    grind = grinder(s)
    x = jax.device_put(jnp.full((256, 256), 1e-3), s.sharding())
    want = np.asarray(grind(x).result())  # (compiled first)
    seen = Completions(ctl)
    fut = grind(x)  # a lone call: its caller's to complete, but it does not wait for 5 ms: the watcher claims it
    claimed = threading.Event()
    for _ in range(30_000):
        with ctl.lock:
            if not ctl.completion.claimable():  # (sent: claimed, by the watcher, the only one asking)
                claimed.set()
        if claimed.wait(0.001):
            break
    assert claimed.is_set()
    np.testing.assert_array_equal(np.asarray(fut.result()), want)  # the watcher holds it: this waits for its value
    seen.unsubscribe()
    assert_each_node_completed_once(ctl, seen, [fut.run])
    assert seen.threads() == {"pw-watcher": 1}


def test_a_caller_waiting_at_once_completes_its_node_itself_and_the_watcher_leaves_it(ctl, monkeypatch):
    from pw_kernel.runtime.exec import completion

    monkeypatch.setattr(completion, "_LONE_S", 60.0)  # the watcher leaves a lone call's node to its caller
    s = pw.slice(1, name="s")
    grind = grinder(s)
    x = jax.device_put(jnp.full((256, 256), 1e-3), s.sharding())
    want = np.asarray(grind(x).result())
    seen = Completions(ctl)
    futs = []
    for _ in range(3):
        futs.append(grind(x))  # a lone call, still computing when it returns: its node waits, pending
        np.testing.assert_array_equal(np.asarray(futs[-1].result()), want)  # claimed and completed here
    seen.unsubscribe()
    assert_each_node_completed_once(ctl, seen, [f.run for f in futs])
    assert seen.threads() == {"MainThread": 3}


def test_a_streamed_chain_completes_in_order_each_node_once(ctl):
    s = pw.slice(1, name="s")
    inc = pw.compiled(lambda v: v + 1, slice=s, name="inc")
    grind = pw.compiled(lambda v: jnp.tanh(v @ v) * 0 + v[0, 0] + 1, slice=s, name="grind")
    v = jax.device_put(jnp.zeros(4), s.sharding())
    m = jax.device_put(jnp.zeros((128, 128)), s.sharding())
    inc(v).result()
    grind(m).result()
    seen = Completions(ctl)
    runs = []
    x, y = v, m
    for i in range(300):
        if i % 3 == 2:
            y = grind(y)  # computing past its call: handed over, completed by the next call or the watcher
            runs.append(y.run)
        else:
            x = inc(x)  # each reads the last one's output
            runs.append(x.run)
    np.testing.assert_array_equal(np.asarray(x.result()), np.full(4, 200.0))
    assert float(np.asarray(y.result())[0, 0]) == 100.0
    seen.unsubscribe()
    assert_each_node_completed_once(ctl, seen, runs)
    # Completed in dispatch order: node numbers and runs both come out as they were sent.
    seqs = [seq for seq, _ in seen.order]
    assert seqs == sorted(seqs)
    ids = [run_id for _, run_id in seen.order]
    assert ids == sorted(ids) and list(dict.fromkeys(ids)) == [run.id for run in runs]


@pytest.mark.parametrize("nodes", [1, 60])
def test_nodes_computed_inside_their_call_are_completed_on_the_calling_thread_once(ctl, nodes):
    # A lone call whose nodes computed by the time its call returned: its own thread completes
    # them, in the same lock hold, or (still computing) leaves them to be completed once later.
    # Only once nothing sent before is pending: a run dispatched inline for over 1 ms has handed
    # its first nodes over, and its last must not be completed before them.
    s = pw.slice(1, name="s")
    inc = pw.compiled(lambda v: v + 1, slice=s, name="inc")

    @pw.program
    def many(v):
        for _ in range(nodes):
            v = inc(v)
        return v

    x = jax.device_put(jnp.zeros(4), s.sharding())
    many.submit(x, mode="chained").wait(60)
    seen = Completions(ctl)
    outs = [many.submit(x, mode="chained").outputs for _ in range(50)]
    for out in outs:
        np.testing.assert_array_equal(np.asarray(out.result()), np.full(4, float(nodes)))
    runs = [out.run for out in outs]
    seen.unsubscribe()
    assert_each_node_completed_once(ctl, seen, runs)
    seqs = [seq for seq, _ in seen.order]
    assert seqs == sorted(seqs)  # in dispatch order
    assert set(seen.threads()) <= {"MainThread", "pw-watcher", "pw-dispatcher"}


def test_a_call_computed_inside_its_call_waits_for_nodes_sent_before_it_to_be_completed_first(ctl, monkeypatch):
    from pw_kernel.runtime.exec import completion

    monkeypatch.setattr(completion, "_LONE_S", 60.0)  # nobody takes the cancelled run's node meanwhile
    s1, s2 = pw.slice(1, name="s1"), pw.slice(1, name="s2")
    grind = grinder(s1)
    inc = pw.compiled(lambda v: v + 1, slice=s2, name="inc")
    x = jax.device_put(jnp.full((256, 256), 1e-3), s1.sharding())
    v = jax.device_put(jnp.zeros(4), s2.sharding())
    grind(x).result()
    inc(v).result()
    seen = Completions(ctl)
    slow = grind(x)
    slow.run.cancel()  # final, and out of the queue, but its node still computes: pending, not completed
    fast = inc(v)  # alone in the queue, computed inside its call: yet the node sent before it is pending
    np.testing.assert_array_equal(np.asarray(fast.result()), np.ones(4))  # completes both, in order
    slow.run.wait(60)
    seen.unsubscribe()
    assert [seq for seq, _ in seen.order] == sorted(seen.by_seq) and len(seen.order) == 2
    assert [run_id for _, run_id in seen.order] == [slow.run.id, fast.run.id]
    assert slow.run.nodes_done == slow.run.nodes_dispatched == 1 and fast.run.state == "done"
    with ctl.lock:
        assert ctl.lifecycle.dispatched == ctl.lifecycle.completed and not any(ctl.lifecycle.inflight)

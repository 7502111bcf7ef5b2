"""The event log: timing invariants, subscribers and Chrome trace export."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np

import pw_kernel as pw


def run_some(n_runs=6, tag=""):
    s0 = pw.slice(2, name=f"s0{tag}", island=0)
    s1 = pw.slice(2, name=f"s1{tag}", island=1)
    f = pw.compiled(lambda x: jnp.tanh(x @ x.T), slice=s0, name="f")
    g = pw.compiled(lambda x: x.sum(0), slice=s1, name="g")

    @pw.program
    def p(x):
        return g(f(x) + 1)

    x = jax.device_put(jnp.ones((64, 64)), s0.sharding())
    futs = [p(x) for _ in range(n_runs)]
    pw.get(futs)
    return futs


def test_every_node_is_recorded_with_consistent_times(ctl2):
    futs = run_some()
    log = pw.controller().events
    events = [e for e in log.query() if e.kind != "compile"]
    runs = {f.run.id for f in futs}
    assert {e.run_id for e in events} == runs
    assert len(events) == sum(f.run.nodes_total for f in futs)
    # Compiling is its own event, on no device, once per executable: the first run pays for it.
    compiles = log.query(kind="compile")
    assert {e.run_id for e in compiles} == {futs[0].run.id} and not any(e.devices for e in compiles)
    assert {e.node for e in compiles} >= {"compile f", "compile g"} and all(e.end > e.start for e in compiles)
    assert futs[0].run.compile_time > 0 and futs[-1].run.compile_time == 0
    for e in events:
        assert e.end >= e.start >= e.dispatch >= 0
        assert e.program == "p" and e.kind in ("compute", "glue", "transfer") and e.devices
        assert e.island in (0, 1) and e.nbytes > 0
    for ev in log.query(kind="transfer"):
        if ev.src_island is not None and ev.src_island != ev.island:
            assert ev.node == "transfer s0->s1"
    # no overlapping bars on one device
    for d in range(8):
        mine = sorted(log.query(device=d), key=lambda e: e.start)
        for a, b in zip(mine, mine[1:]):
            assert b.start >= a.end, (a, b)
    assert log.query(run=futs[0].run.id) == futs[0].run.events


def test_subscribers_see_nodes_and_run_transitions(ctl2):
    seen = []
    unsubscribe = pw.controller().events.subscribe(seen.append)
    futs = run_some(2)
    for f in futs:
        f.run.wait(30)
    unsubscribe()
    states = [(e.run_id, e.state) for e in seen if isinstance(e, pw.RunEvent)]
    for f in futs:
        rid = f.run.id
        assert [s for r, s in states if r == rid] == ["queued", "running", "done"]
    nodes = [e for e in seen if isinstance(e, pw.NodeEvent)]
    assert len(nodes) == sum(len(f.run.events) for f in futs)  # every node, and each first-call compile
    assert sum(e.kind != "compile" for e in nodes) == sum(f.run.nodes_total for f in futs)
    run_some(1, tag="again")
    assert len([e for e in seen if isinstance(e, pw.NodeEvent)]) == len(nodes)  # unsubscribed


def test_a_lone_call_is_queued_running_and_done_for_readers_and_subscribers(ctl):
    # A warm lone call runs whole at submit and is reported in one transition: it still reads as
    # three run events, after its node event, in the log and to subscribers alike.
    s = pw.slice(1)
    f = pw.compiled(lambda x: x + 1, slice=s, name="inc")
    x = jnp.ones(4)
    f(x).result()  # compiles (on the dispatcher thread)
    seen = []
    unsubscribe = ctl.events.subscribe(seen.append)
    y = f(x)
    unsubscribe()
    rid = y.run.id
    assert y.run.state == "done" and y.done()  # ran inside the call
    logged = [(e.state, e.time) for e in ctl.events.runs if e.run_id == rid]
    told = [e.state if isinstance(e, pw.RunEvent) else "node" for e in seen if e.run_id == rid]
    assert [state for state, _ in logged] == ["queued", "running", "done"]
    assert told == ["node", "queued", "running", "done"]
    (node,) = y.run.events
    assert logged[0][1] >= node.end >= node.start >= node.dispatch  # stamped when reported


def test_a_broken_subscriber_is_dropped_and_the_controller_goes_on(ctl, caplog):
    calls = []

    def broken(ev):
        calls.append(ev)
        raise RuntimeError("view crashed")

    pw.controller().events.subscribe(broken)
    s = pw.slice(1)
    f = pw.compiled(lambda x: x + 1, slice=s, name="f")
    out = f(jnp.ones(2))
    out.run.wait(30)
    np.testing.assert_array_equal(np.asarray(out.result()), [2.0, 2.0])
    assert len(calls) == 1  # unsubscribed after its first failure
    assert "event subscriber" in caplog.text and "view crashed" in caplog.text
    np.testing.assert_array_equal(np.asarray(f(jnp.ones(2)).result(timeout=30)), [2.0, 2.0])


def test_chrome_trace_json_for_perfetto(ctl2, tmp_path):
    futs = run_some(3)
    log = pw.controller().events
    path = log.to_perfetto(tmp_path / "trace.json")
    trace = json.loads(open(path).read())
    events = trace["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == sum(len(e.devices) for e in log.query())
    for e in xs:
        assert {"name", "cat", "pid", "tid", "ts", "dur", "args"} <= set(e) and e["dur"] >= 0
        assert e["args"]["program"] == "p"
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {0: "island 0 (cpu)", 1: "island 1 (cpu)"}
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(x["pid"], x["tid"]) for x in xs} <= threads
    assert trace["displayTimeUnit"] == "ms" and futs

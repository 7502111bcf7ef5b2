"""Widgets on the Python side: trait state, mimebundles, static HTML fallbacks, live batching, the program graph.

What a person sees in a real browser is tested in test_browser_widgets.py.
"""

from __future__ import annotations

import json
import re
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import pw_kernel as pw
from pw_kernel.runtime import NodeEvent
from pw_kernel.runtime.extend import busy_time

pytest.importorskip("anywidget")

from pw_kernel.widgets import (  # noqa: E402
    GraphvizError,
    MeshWidget,
    RunWidget,
    TimelineWidget,
    graph_dot,
    graph_html,
    graph_svg,
    repr_svg,
    show_mesh,
    timeline,
)
from pw_kernel.widgets import graph as graph_mod  # noqa: E402
from pw_kernel.widgets._base import Ticker  # noqa: E402
from pw_kernel.widgets.timeline_encoder import NONE, EventEncoder, busy_union  # noqa: E402
from fresh_python import run_python

HOSTILE = "<img src=x onerror=alert(1)>"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def wait_until(cond, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def bundle(widget):
    data, _meta = widget._repr_mimebundle_()
    return data


def from_front_end(widget, content, buffers=()):
    """Deliver ``content`` to ``widget`` as its front-end's custom message arrives: through its comm."""
    widget.comm.handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": list(buffers)})


def two_slice_program(tag=""):
    a = pw.slice(4, mesh={"data": 2, "model": 2}, name=f"a{tag}", island=0)
    b = pw.slice(4, mesh={"stage": 4}, name=f"b{tag}", island=1)
    f = pw.compiled(lambda v: jnp.tanh(v @ v.T), slice=a, in_specs=P("data", None), out_specs=P("data", None), name="f")
    g = pw.compiled(lambda v: v * 2.0, slice=b, in_specs=P("stage", None), out_specs=P("stage", None), name="g")

    @pw.program
    def step(v):
        return g(f(v) + 1.0)

    x = jax.device_put(jnp.ones((8, 8)), a.sharding("data", None))
    return a, b, step, x


# ------------------------------------------------------------------ imports
def test_runtime_import_does_not_pull_in_the_notebook_stack():
    code = (
        "import sys, pw_kernel, pw_kernel.widgets\n"
        "from pw_kernel.widgets import graph_svg, graph_html\n"
        "bad = [m for m in ('anywidget', 'ipywidgets', 'traitlets', 'IPython') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "from pw_kernel.widgets import TimelineWidget\n"
        "assert 'anywidget' in sys.modules\n"
    )
    run_python(code)


def test_the_runtime_draws_its_graph_with_the_notebook_stack_blocked():
    """The graph's DOT, SVG and HTML reprs are lazy hooks into the views, which need only jax and numpy."""
    code = (
        "import sys\n"
        "for m in ('IPython', 'anywidget', 'ipywidgets', 'traitlets'):\n"
        "    sys.modules[m] = None  # importing them raises ImportError\n"
        "import pw_kernel.runtime as rt\n"
        "import jax.numpy as jnp\n"
        "s = rt.controller().slice(2, name='s')\n"
        "f = rt.compiled(lambda v: v + 1, slice=s, name='f')\n"
        "g = rt.program(lambda v: f(v), name='p').trace(jnp.ones(4))\n"
        "assert g.to_dot().startswith('digraph \"p\"'), g.to_dot()\n"
        "assert 'ProgramGraph &#x27;p&#x27;' in g._repr_html_()\n"
        "svg = g._repr_svg_()\n"
        "assert svg is None or svg.startswith('<svg')\n"
        "rt.shutdown()\n"
    )
    run_python(code)


def test_widgets_package_exports_functions_not_modules():
    import pw_kernel.widgets as w

    assert callable(w.timeline) and w.timeline.__name__ == "timeline"
    assert isinstance(w.TimelineWidget, type) and isinstance(w.MeshWidget, type)
    with pytest.raises(AttributeError):
        w.no_such_thing  # noqa: B018


# --------------------------------------------------------------------- mesh
def test_mesh_of_a_slice(ctl2):
    a = pw.slice(4, mesh={"data": 2, "model": 2}, name="a", island=0)
    m = show_mesh(a)
    assert isinstance(m, MeshWidget)
    assert m.kind == "mesh"
    assert m.axis_names == ["data", "model"] and m.axis_sizes == [2, 2]
    assert m.device_ids == [d.id for d in a.devices]
    (facet,) = m.mesh_facets
    assert (facet["rows"], facet["cols"]) == (2, 2)
    assert facet["row_labels"] == ["data=0", "data=1"] and facet["col_labels"] == ["model=0", "model=1"]
    assert [c["device"] for c in facet["cells"]] == m.device_ids
    colours = [m.devices[str(d)]["colour"] for d in m.device_ids]
    assert len(set(colours)) == 4
    assert m.devices[str(m.device_ids[3])]["coords"] == "data=1, model=1"
    assert "slice 'a'" in m.title and "island 0" in m.title
    data = bundle(m)
    assert data[WIDGET_MIME]["model_id"] == m.model_id
    html = data["text/html"]
    assert html.count('class="pw-mesh-cell"') == 4
    assert "data=1" in html and "model=1" in html
    assert data["text/plain"].startswith("MeshWidget(mesh data=2 × model=2")


def test_array_sharding_replicas_and_index_ranges(ctl2):
    a = pw.slice(4, mesh={"data": 2, "model": 2}, name="a", island=0)
    x = jax.device_put(jnp.arange(64.0).reshape(8, 8), a.sharding("data", None))
    m = show_mesh(x, name="x")
    assert m.kind == "array"
    arr = m.array
    assert arr["type"] == "f32[8,8]" and arr["spec"] == "P('data', None)"
    assert arr["summary"] == "2 shards on 4 devices, each replicated ×2"
    tiles = arr["facets"][0]["tiles"]
    ids = m.device_ids
    assert [(t["index"], t["devices"], t["shard"]) for t in tiles] == [
        ("[0:4, 0:8]", ids[:2], "f32[4,8]"),
        ("[4:8, 0:8]", ids[2:], "f32[4,8]"),
    ]
    html = m.static_html()
    assert html.count('class="pw-tile"') == 2 and "×2" in html
    assert "x[0:4, 0:8]" in html and "replicated ×2" in html


def _check_layout_against_jax(arr, state):
    """Every tile's devices hold exactly that tile's index range, and every device appears once."""
    shape = arr.shape
    held = {}
    for dev, index in arr.sharding.devices_indices_map(shape).items():
        held[dev.id] = "[" + ", ".join(f"{a}:{b}" for a, b, _ in (s.indices(n) for s, n in zip(index, shape))) + "]"
    seen = []
    for facet in state["facets"]:
        for t in facet["tiles"]:
            for d in t["devices"]:
                assert held[d] == (t["index"] if shape else "[]"), (d, t)
                seen.append(d)
    assert sorted(seen) == sorted(held)


@pytest.mark.parametrize(
    "shape, mesh_shape, spec, n_facets",
    [
        ((16,), (8,), P("a"), 1),
        ((8, 4), (4, 2), P("a", "b"), 1),
        ((8, 4), (4, 2), P(None, "b"), 1),
        ((4, 8, 6), (2, 4), P("a", "b", None), 2),
        ((4, 8, 8, 4), (2, 2, 2), P("a", "b", None, "c"), 4),
        ((4, 2, 4, 4), (2, 2, 2), P(("a", "b"), None, "c", None), 4),
        ((4, 4), (2, 2, 2), P(), 1),
    ],
)
def test_array_layouts_of_any_rank_match_jax(ctl, shape, mesh_shape, spec, n_facets):
    names = ("a", "b", "c")[: len(mesh_shape)]
    mesh = Mesh(np.array(jax.devices()[: int(np.prod(mesh_shape))]).reshape(mesh_shape), names)
    arr = jax.device_put(jnp.zeros(shape), NamedSharding(mesh, spec))
    m = show_mesh(arr)
    assert len(m.array["facets"]) == n_facets
    assert m.axis_names == list(names) and m.axis_sizes == list(mesh_shape)
    assert len(m.mesh_facets) == (mesh_shape[0] if len(mesh_shape) == 3 else 1)
    _check_layout_against_jax(arr, m.array)
    html = m.static_html()
    assert html.count('class="pw-tile"') == sum(len(f["tiles"]) for f in m.array["facets"])


def test_four_dimensional_facets_are_labelled_by_leading_ranges(ctl):
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("x", "y", "z"))
    z = jax.device_put(jnp.zeros((4, 8, 8, 4)), NamedSharding(mesh, P("x", "y", None, "z")))
    m = show_mesh(z, name="z")
    labels = [f["label"] for f in m.array["facets"]]
    assert labels == ["z[0:2, 0:4, :, :]", "z[0:2, 4:8, :, :]", "z[2:4, 0:4, :, :]", "z[2:4, 4:8, :, :]"]
    assert [f["label"] for f in m.mesh_facets] == ["x=0", "x=1"]
    assert m.array["summary"] == "8 shards, one per device"


def test_fully_replicated_single_device_future_and_sharding(ctl2):
    a, _, step, x = two_slice_program()
    rep = jax.device_put(jnp.ones((4, 4)), a.sharding())
    assert show_mesh(rep).array["summary"] == "fully replicated on 4 devices"
    one = jax.device_put(jnp.ones(3), jax.devices()[5])
    m = show_mesh(one)
    assert m.array["summary"] == "on a single device" and m.device_ids == [5] and m.axis_names == ["devices"]
    fut = step(x)  # a Future: shape and sharding known before anything ran
    mf = show_mesh(fut)
    assert mf.kind == "array" and mf.array["type"] == "f32[8,8]" and mf.axis_names == ["stage"]
    # labelled with the name the notebook gave it, or neutrally
    assert (mf.array["name"], m.array["name"], show_mesh(fut, name="y").array["name"]) == ("fut", "one", "y")
    assert pw.show_mesh(one).array["name"] == "one" and show_mesh(jnp.ones(8)).array["name"] == "array"
    fut.result(30)
    ms = show_mesh(a.sharding("data", "model"), shape=(8, 8))
    assert ms.array["summary"] == "4 shards, one per device"
    with pytest.raises(TypeError, match=re.escape("needs the array's shape too")):
        show_mesh(a.sharding("data"))


def test_mesh_rejects_what_it_cannot_draw_with_a_hint(ctl):
    with pytest.raises(TypeError, match="put it on devices first"):
        show_mesh(np.ones((2, 2)))
    with pytest.raises(TypeError, match=re.escape("got builtins.str")):
        show_mesh("a")


def test_plain_jax_mesh_and_devices_overview(ctl2):
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    m = show_mesh(mesh)
    assert m.kind == "mesh" and m.axis_sizes == [2, 4] and m.device_ids == list(range(8))
    a = pw.slice(4, mesh={"data": 2, "model": 2}, name=HOSTILE, island=0)
    over = show_mesh()
    assert over.kind == "devices"
    assert [i["devices"] for i in over.islands] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [s["name"] for s in over.slices] == [HOSTILE]
    assert over.slices[0]["devices"] == [d.id for d in a.devices]
    html = over.static_html()
    assert html.count('class="pw-mesh-cell"') == 8
    assert HOSTILE not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert show_mesh(pw.controller()).islands == over.islands
    assert show_mesh(pw.islands()[1]).device_ids == [4, 5, 6, 7]


# ----------------------------------------------------------------- timeline
def test_timeline_lanes_are_the_devices_and_it_shows_a_run(ctl2):
    tl = timeline()
    assert isinstance(tl, TimelineWidget) and tl.live
    assert [lane["label"] for lane in tl.lanes] == [f"cpu:{d}" for d in range(8)]
    assert {lane["island"] for lane in tl.lanes} == {0, 1}
    a, b, step, x = two_slice_program()
    run = step.submit(x)
    run.wait(30)
    wait_until(lambda: tl.n_events == len(run.events), what="the run's events on the timeline")
    assert [r["id"] for r in tl.runs] == [run.id]
    wait_until(lambda: tl.runs[0]["state"] == "done", what="the run's final state")
    events = tl.events
    assert len(events) == len(run.events)  # each node, and the first call's compiles on the host lane
    assert {e["node"] for e in events} >= {"f", "g", "compile f"}
    assert sum(e["kind"] != "compile" for e in events) == run.nodes_total
    assert all(e["program"] == "step" and e["end"] >= e["start"] for e in events)
    cross = [lane for lane in tl.lanes if lane["kind"] == "transfer" and lane["cross"]]
    assert [lane["label"] for lane in cross] == ["island 0 → island 1"]
    f_ev = next(e for e in events if e["node"] == "f")
    assert f_ev["lanes"] == [f"dev:{d.id}" for d in a.devices]
    assert f_ev["shapes"] == "float32[8,8] -> float32[8,8]"
    util = tl.utilization()
    assert all(0.0 <= u <= 1.0 for u in util.values()) and util["cpu:0"] > 0
    assert tl.n_chunks >= 1
    tl.close()


def test_timeline_pushes_binary_chunks_that_decode_to_the_events(ctl2):
    tl = timeline()
    sent = []
    tl.send = lambda content, buffers=None: sent.append((content, buffers))
    _, _, step, x = two_slice_program()
    runs = [step.submit(x) for _ in range(3)]
    for r in runs:
        r.wait(30)
    total = sum(len(r.events) for r in runs)
    wait_until(lambda: tl.n_events == total, what="every event pushed")
    chunks = [(c, b) for c, b in sent if c["type"] == "chunk"]
    assert chunks and [c["seq0"] for c, _ in chunks] == list(range(len(chunks)))
    strings, starts, runs_seen = [], [], []
    for c, (f64, u32, bars) in chunks:
        assert c["str0"] == len(strings)
        strings += c["strings"]
        f = np.frombuffer(f64, np.float64).reshape(-1, 3)
        u = np.frombuffer(u32, np.uint32).reshape(-1, 7)
        assert len(f) == len(u) == c["n_ev"]
        starts += f[:, 0].tolist()
        runs_seen += u[:, 0].tolist()
        assert len(np.frombuffer(bars, np.uint32)) == 2 * c["n_bars"]
    assert len(starts) == total and sorted(set(runs_seen)) == sorted(r.id for r in runs)
    assert {"f", "g", "step"} <= set(strings)
    # a front-end that missed everything asks for it, and gets one consolidated chunk
    sent.clear()
    from_front_end(tl, {"type": "sync", "have": 0})
    (content, buffers), *_ = sent
    assert content["seq0"] == 0 and content["seq1"] == tl.n_chunks and content["n_ev"] == total
    assert len(buffers) == 3
    tl.close()


def test_initial_state_travels_in_the_base_trait(ctl2):
    _, _, step, x = two_slice_program()
    step.submit(x).wait(30)
    tl = timeline()  # created after the run: everything is in the snapshot
    base = tl.get_state("_base")["_base"]  # what a front-end gets with the widget's state
    assert base["seq0"] == 0 and base["seq1"] == tl.n_chunks == 1 and base["n_ev"] == tl.n_events > 0
    assert len(base["f64"]) == 3 * 8 * base["n_ev"] and len(base["u32"]) == 7 * 4 * base["n_ev"]
    assert base["strings"] and all(isinstance(s, str) for s in base["strings"])
    tl.close()


def test_a_burst_of_events_reaches_the_front_end_as_one_push(ctl2):
    """However many events arrive between two ticks, the front-end gets one chunk holding them all."""
    log = pw.controller().events
    tl = timeline()
    sent = []
    tl.send = lambda content, buffers=None: sent.append(content)
    with tl.paused():  # the whole burst is buffered before the ticker can push any of it
        for n in range(1000):  # a firehose of events from "controller threads"
            ev = NodeEvent(n, 99, "firehose", "default", f"n{n}", "compute", (n % 8,), 0, None, log.now(), 4, "f32[1]")
            ev.end = ev.start + 1000
            log.emit_node(ev)
        assert sent == []
    wait_until(lambda: tl.n_events == 1000, what="the burst on the timeline")
    assert [c["n_ev"] for c in sent if c["type"] == "chunk"] == [1000]
    tl.close()


class FakeClock:
    """Monotonic time that passes only when the ticker sleeps, so what the ticker does cannot depend on load."""

    def __init__(self):
        self.now = 1000.0
        self.slept = []

    def time(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def test_the_ticker_ticks_a_widget_at_most_once_a_period_however_often_it_is_poked():
    clock = FakeClock()
    ticker = Ticker(period=0.1, clock=clock.time, sleep=clock.sleep)
    ticks = []

    class Widget:
        def _tick(self, now):
            ticks.append(now)

    widget = Widget()
    ticker.add(widget)
    deadline = time.monotonic() + 30
    while len(ticks) < 10:  # poke as a firehose of events does, far more often than once a period
        assert time.monotonic() < deadline, "the ticker stopped ticking"
        ticker.poke()
        time.sleep(0.001)
    ticker.discard(widget)
    assert np.allclose(np.diff(ticks), 0.1)  # ten ticks a second at most, on the ticker's clock
    assert np.allclose(clock.slept, 0.1)  # and it waited out each period rather than ticking early


def test_subscriber_callback_only_buffers(ctl2):
    """The callback runs on controller threads: it must queue the event and touch no widget state."""
    log = pw.controller().events
    tl = timeline()
    before = tl.n_events
    sent, changed = [], []
    tl.send = lambda content, buffers=None: sent.append(content)
    tl.observe(lambda change: changed.append(change["name"]))
    with tl.paused():  # the ticker stays off: whatever reached the front-end meanwhile, the callback sent
        for n in range(1000):  # the log calls the widget's callback on this thread, as a controller thread would
            ev = NodeEvent(n, 1, "p", "default", f"n{n}", "compute", (0,), 0, None, log.now(), 4, "f32[1]")
            ev.end = ev.start + 10
            log.emit_node(ev)
        assert sent == [] and changed == []  # pushing to the front-end is the ticker's job, on its own clock
    wait_until(lambda: tl.n_events == before + 1000, what="the buffered events on the timeline")
    tl.close()


def test_timeline_of_given_runs_snapshots_and_stop(ctl2):
    _, _, step, x = two_slice_program()
    r1, r2 = step.submit(x), step.submit(x)
    r1.wait(30), r2.wait(30)
    only = timeline(r2, live=False)
    assert not only.live and {e["run"] for e in only.events} == {r2.id}
    assert only.title == f"timeline of run {r2.id}"
    both = timeline([r1.id, r2.id])
    assert {e["run"] for e in both.events} == {r1.id, r2.id}
    both.stop()
    step.submit(x).wait(30)  # its events are emitted before wait() returns
    both.flush()  # a stopped timeline no longer listens: nothing was buffered to push
    assert {e["run"] for e in both.events} == {r1.id, r2.id} and not both.live
    everything = timeline(live=False)
    assert everything.n_events == len(pw.controller().events.nodes)


def test_timeline_static_html_and_perfetto(ctl2, tmp_path):
    _, _, step, x = two_slice_program()
    step.submit(x, name=HOSTILE).wait(30)
    tl = timeline(live=False)
    data = bundle(tl)
    assert set(data) == {"text/plain", "text/html", WIDGET_MIME}
    html = data["text/html"]
    assert "<svg" in html and "cpu:7" in html and "island 0 → island 1" in html
    assert HOSTILE not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert re.search(r"\d+%", html)  # utilization per lane
    path = tl.to_perfetto(tmp_path / "trace.json")
    trace = json.loads(open(path).read())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert xs and all(e["dur"] >= 0 for e in xs)
    own = tl.to_chrome_trace()
    assert {e["name"] for e in own["traceEvents"] if e["ph"] == "X"} >= {"f", "g"}
    # one trace writer: the log's bars are the widget's, which adds a lane per transfer path
    bars = {(e["name"], e["ts"], e["dur"]) for e in own["traceEvents"] if e["ph"] == "X"}
    log_trace = pw.controller().events.to_chrome_trace()
    assert {(e["name"], e["ts"], e["dur"]) for e in log_trace["traceEvents"] if e["ph"] == "X"} <= bars
    threads = {e["args"]["name"] for e in own["traceEvents"] if e["name"] == "thread_name"}
    assert {"cpu:0", "island 0 → island 1"} <= threads
    empty = timeline(events=[], live=False)
    assert "no node events yet" in empty.static_html()


def test_encoder_and_busy_union():
    class Ev:
        def __init__(self, start, end, devices, kind="compute", src=None, island=0, error=None):
            self.start, self.end, self.devices, self.kind = start, end, devices, kind
            self.src_island, self.island, self.error = src, island, error
            self.run_id, self.node, self.program, self.tenant, self.shapes, self.nbytes = 7, "n", "p", "t", "s", 16

    enc = EventEncoder([(0, "cpu:0", 0), (1, "cpu:1", 0)])
    chunk = enc.encode([Ev(0, 10, (0,)), Ev(5, 20, (0,)), Ev(30, 40, (0, 1), "transfer", src=1, error="Boom")])
    assert chunk.measures.shape == (3, 3) and chunk.ids.shape == (3, 7)
    assert chunk.ids[0, 5] == NONE and enc.strings[chunk.ids[2, 5]] == "Boom"
    assert [x["label"] for x in enc.lanes] == ["cpu:0", "cpu:1", "island 1 → island 0"]
    assert chunk.bars.tolist() == [[0, 0], [1, 0], [2, 2], [2, 0], [2, 1]]
    measures, _, bars, _ = enc.arrays()
    assert busy_union(measures, bars, 0) == 30.0 == busy_time([0, 5, 30], [10, 20, 40])  # [0, 20] and [30, 40]
    assert busy_union(measures, bars, 1) == 10.0
    assert busy_union(measures, bars, 0, 5, 35) == 20.0
    assert enc.encode([]) is None


# ---------------------------------------------------------------------- run
def test_run_widget_says_what_it_is_compiling(ctl2):
    def deep(x):  # hundreds of ops: XLA takes a while, as with a real model's first step
        for i in range(300):
            x = jnp.sin(x) * 1.001 + i
        return x

    # One step in flight, and each executable compiled as its step comes up (not ahead, with
    # `held`'s): `deep` is not even compiled while `held` runs.
    pw.init(pw.Config(max_inflight=1, compile_threads=1))
    c = pw.controller()
    shown = []  # what the widget shows once its ticker looks while the compile event is out

    def on_event(ev):
        if getattr(ev, "kind", None) == "compile" and ev.node == "compile deep" and widgets:
            w = widgets[0]
            w.flush()  # what the widgets' ticker does every half second meanwhile
            shown.append((w.compiling, w.static_html()))

    widgets = []
    unsubscribe = c.events.subscribe(on_event)
    s = pw.slice(2, name="c")
    gate = threading.Event()
    held = pw.compiled(lambda x: jax.pure_callback(lambda a: gate.wait(30) and a, jax.ShapeDtypeStruct((4,), jnp.float32), x),
                       slice=s, out_specs=P(), name="held")
    f = pw.compiled(deep, slice=s, out_specs=P(), name="deep")
    # `held` stays in flight until the gate opens, so `deep` compiles only after the widget exists
    run = pw.program(lambda x: f(held(x)), name="first_call", mode="chained").submit(jnp.ones(4))
    widgets.append(RunWidget(run))
    gate.set()
    run.wait()
    unsubscribe()
    [(compiling, html)] = shown
    assert compiling == "deep" and "compiling deep" in html
    w = widgets[0]
    wait_until(lambda: w.state == "done", what="the widget to reach done")
    assert w.compiling == "" and "compiling" not in w.static_html()


def test_run_widget_follows_a_run_to_done(ctl2):
    _, _, step, x = two_slice_program()
    run = step.submit(x)
    w = RunWidget(run, {"y": run.outputs, "pair": (run.outputs, run.outputs)})
    assert w.outputs[0] == {
        "name": "y",
        "kind": "Future",
        "type": "float32[8,8]",
        "sharding": "P('stage', None) on {'stage': 4}",
    }
    assert w.outputs[1]["type"] == "2 x float32[8,8]"  # a repeated type once, with its count
    assert w.outputs[1]["sharding"] == "P('stage', None) on {'stage': 4}"
    many = RunWidget(run, {"losses": [run.outputs] * 30, "mixed": [jnp.ones(()), jnp.ones(2), jnp.ones(3), jnp.ones(4), jnp.ones(5)]})
    assert many.outputs[0]["type"] == "30 x float32[8,8]"
    assert many.outputs[1]["type"] == "float32[], float32[2], float32[3], float32[4], ... (5 in all)"
    wait_until(lambda: w.state == "done", what="the widget to reach done")
    assert (w.done, w.total) == (run.nodes_total, run.nodes_total)
    assert w.run_id == run.id and w.name == "step" and w.program == "step" and w.error == ""
    assert w.elapsed > 0 and w.tenant == "default"
    assert len(w.lanes) == 8 and len(w.bars) % 4 == 0 and len(w.bars) > 0
    data = bundle(w)
    assert (
        WIDGET_MIME in data
        and "done" in data["text/html"]
        and f"{run.nodes_total}/{run.nodes_total} nodes" in data["text/html"]
    )
    assert repr(w).startswith(f"RunWidget(run {run.id} 'step': done")
    assert "<code>y</code>" in data["text/html"] and "P(&#x27;stage&#x27;, None)" in data["text/html"]


def _boom(v):
    raise ValueError("\n".join(f"line {k}" for k in range(40)) + f"\nboom {HOSTILE}")


def test_run_widget_error_and_hostile_name_are_escaped(ctl):
    s = pw.slice(1, name="s")
    bad = pw.compiled(
        lambda v: jax.pure_callback(_boom, jax.ShapeDtypeStruct(v.shape, v.dtype), v), slice=s, name="bad"
    )

    @pw.program
    def p(v):
        return bad(v)

    run = p.submit(jnp.ones(4), name=HOSTILE)
    run.wait(30)
    assert run.state == "failed"
    w = RunWidget(run)
    assert w.name == HOSTILE and w.state == "failed"
    assert w.error.startswith("NodeError: node 'bad'") and "more lines" in w.error  # a long error is cut ...
    assert f"boom {HOSTILE}" in w.error.splitlines()[-2]  # ... to its head and its last lines (the cause)
    html = w.static_html()
    assert HOSTILE not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "pw-run-error" in html


def gated_program(gate):
    """A program whose second node waits (on the host) for ``gate``: its run stays running until we say."""
    one = pw.slice(1, name="one")
    first = pw.compiled(lambda v: v + 1, slice=one, name="first")

    def held(v):
        gate.wait(30)
        return v

    hold = pw.compiled(
        lambda v: jax.pure_callback(held, jax.ShapeDtypeStruct(v.shape, v.dtype), v), slice=one, name="hold"
    )

    @pw.program
    def p(v):
        return hold(first(v))

    return p


def test_run_widget_is_live_and_refreshes_its_static_picture_when_final(ctl, monkeypatch):
    import threading

    import IPython.display

    published = []  # every re-published display, in order

    class Handle:
        def update(self, data, **kwargs):
            published.append(data)

    def pictures(kind):
        return [u for u in published if f"pw-static {kind}" in u["text/html"]]

    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: Handle())
    gate = threading.Event()
    p = gated_program(gate)
    quick = pw.compiled(lambda v: v * 3, slice=pw.controller().resources.get("one"), name="quick")
    tl = timeline()
    before = quick(jnp.ones(4)).run  # finishes: its bars appear while the gated run below still runs
    run = p.submit(jnp.ones(4))
    w = RunWidget(run)
    w._ipython_display_()
    tl_run = timeline(run)
    tl_run._ipython_display_()
    before.wait(30)
    # The run is held at its second node until the gate opens: it shows as running everywhere.
    wait_until(lambda: w.state == "running", what="the widget to show the run running")
    wait_until(lambda: tl.n_events >= len(before.events), what="the finished run's bars")
    wait_until(lambda: {r["id"]: r["state"] for r in tl.runs}.get(run.id) == "running", what="the run on the timeline")
    assert w.done < w.total and "running" in w.static_html() and run.state == "running"
    assert not published  # nothing is final, so nothing is re-published
    gate.set()
    wait_until(lambda: pictures("pw-run"), what="the run's display to be re-published")
    (final,) = pictures("pw-run")  # once, with the final state
    assert "done" in final["text/html"] and WIDGET_MIME in final
    assert w.state == "done" and w.done == w.total
    # A timeline of given runs stops following once they are final; its final picture is out before `live` drops.
    wait_until(lambda: not tl_run.live, what="the run's timeline to stop following")
    (picture,) = pictures("pw-timeline")
    assert f"{len(run.events)} events" in picture["text/html"] and "live (static snapshot)" not in picture["text/html"]
    assert tl_run.n_events == len(run.events) and tl.live
    wait_until(lambda: tl.n_events == len(before.events) + len(run.events), what="every bar")
    tl.close()
    tl_run.close()


# -------------------------------------------------------------------- graph
@pytest.mark.skipif(graph_mod.dot_binary() is None, reason="graphviz `dot` is installed by scripts/setup.sh")
def test_graph_svg_of_a_known_program(ctl2):
    _, _, step, x = two_slice_program()
    g = step.trace(x)
    svg = graph_svg(g)
    assert svg.startswith("<svg")
    texts = [t.replace("&#45;", "-") for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]
    assert {"f", "g", "[a]", "[b]", "a → b", "cross-island"} <= set(texts)
    assert "float32[8,8]" in texts  # edges carry shape and dtype
    assert svg.count('class="node"') == len(g.nodes) + len(g.inputs) + len(g.outputs)
    assert "polygon" in svg and "#d62828" in svg  # the cross-island transfer is a red diamond
    assert repr_svg(g) == svg
    assert svg in graph_html(g)


def test_graph_escapes_hostile_names(ctl2):
    s = pw.slice(2, name='s"\\n<b>', island=0)
    f = pw.compiled(lambda v: v + 1, slice=s, name=HOSTILE)

    @pw.program
    def p(v):
        return f(v)

    g = p.trace(jnp.ones(4))
    dot = graph_dot(g)
    assert '"<img src=x onerror=alert(1)>\\n[s\\"\\\\n<b>]"' in dot
    if graph_mod.dot_binary() is not None:
        svg = graph_svg(g)
        assert "<img" not in svg and "&lt;img src=x onerror=alert(1)&gt;" in svg


def test_without_dot_a_clear_message_and_the_dot_source(ctl2, monkeypatch):
    _, _, step, x = two_slice_program()
    g = step.trace(x)
    monkeypatch.setattr(graph_mod, "dot_binary", lambda: None)
    with pytest.raises(GraphvizError, match=re.escape("graphviz's `dot` binary was not found")) as info:
        graph_svg(g)
    assert "apt-get install graphviz" in str(info.value) and info.value.dot.startswith('digraph "step"')
    assert info.value.dot in str(info.value)
    assert repr_svg(g) is None
    html = graph_html(g)
    assert "not found" in html and "<pre" in html and "digraph &quot;step&quot;" in html


# ---------------------------------------------------------------- nbconvert
def test_nbconvert_html_shows_the_static_pictures_not_loading_widget(ctl2):
    nbformat = pytest.importorskip("nbformat")
    nbconvert = pytest.importorskip("nbconvert")
    a, _, step, x = two_slice_program()
    run = step.submit(x, name=HOSTILE)
    run.wait(30)
    widgets = [show_mesh(a), show_mesh(x), timeline(live=False), RunWidget(run)]
    nb = nbformat.v4.new_notebook()
    for w in widgets:
        cell = nbformat.v4.new_code_cell("w")
        cell.outputs = [nbformat.v4.new_output("display_data", data=bundle(w))]
        nb.cells.append(cell)
    html, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    for cls in ("pw-static pw-mesh", "pw-static pw-timeline", "pw-static pw-run"):
        assert cls in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img src=x" not in html
    assert html.count('class="pw-tile"') == 2


def test_long_one_dimensional_mesh_wraps_and_many_tiles_stay_narrow():
    from pw_kernel.widgets.mesh import array_layout, mesh_facets

    class Dev:
        def __init__(self, i):
            self.id, self.platform = i, "tpu"

    grid = np.array([Dev(i) for i in range(40)], dtype=object)
    (facet,), coords = mesh_facets(["chips"], grid)
    assert (facet["rows"], facet["cols"]) == (3, 16)
    assert facet["row_labels"] == ["chips=0+", "chips=16+", "chips=32+"]
    assert facet["cells"][-1] == {"r": 2, "c": 7, "device": 39} and coords[39] == "chips=39"
    from pw_kernel.widgets import _html

    devices = {
        str(i): {"id": i, "label": f"tpu:{i}", "short": "tpu", "colour": "#1f77b4", "coords": ""} for i in range(40)
    }
    assert _html.mesh_facets_html([facet], devices).count('class="pw-mesh-cell"') == 40

    mesh = Mesh(np.array(jax.devices()), ("d",))
    layout = array_layout((4096,), np.float32, NamedSharding(mesh, P("d")), "x", list(range(8)))
    assert sum(t["w"] for t in layout["facets"][0]["tiles"]) <= 720


def test_remote_islands_show_the_device_ids_their_events_use(ctl2):
    class FakeRemote:  # what `pw.add_ray_islands` registers, without Ray: no run goes there
        info = {"devices": [0, 1], "platform": "gpu", "host": "far", "pid": 42}
        island = None

        def check(self, api):
            pass

    (isl,) = pw.controller().add_remote_islands([FakeRemote()])
    s = pw.slice(2, mesh={"m": 2}, name="r", island=isl.id)
    ids = [1000 * (isl.id + 1), 1000 * (isl.id + 1) + 1]
    m = show_mesh(s)
    assert m.device_ids == ids and [m.devices[str(i)]["label"] for i in ids] == [f"gpu:0@{isl.id}", f"gpu:1@{isl.id}"]
    over = show_mesh()
    assert over.islands[-1]["devices"] == ids and over.slices[-1]["devices"] == ids
    tl = timeline(live=False)
    assert [lane["key"] for lane in tl.lanes][-2:] == [f"dev:{i}" for i in ids]
    assert tl.lanes[-1]["label"] == f"gpu:1@{isl.id}"


def test_every_static_picture_escapes_and_front_ends_never_parse_html():
    from pathlib import Path

    import pw_kernel.widgets as w

    script = "<script>alert('pw')</script>"
    pw.init(pw.Config(islands=2, validate=True))
    try:
        s = pw.slice(2, mesh={HOSTILE: 2}, name=script, island=0)
        f = pw.compiled(lambda v: v + 1, slice=s, name=HOSTILE)
        prog = pw.program(lambda v: f(v), name=script)
        run = prog.submit(jax.device_put(jnp.ones(4), s.sharding()), name=HOSTILE, tenant=script)
        run.wait(30)
        x = jax.device_put(jnp.ones((4, 4)), s.sharding(HOSTILE))
        pictures = {
            "mesh": show_mesh(s).static_html(),
            "array": show_mesh(x, name=script).static_html(),
            "devices": show_mesh().static_html(),
            "timeline": timeline(live=False).static_html(),
            "timeline-tenant": timeline(live=False, color_by="tenant").static_html(),
            "run": RunWidget(run).static_html(),
            "graph": graph_html(prog.trace(jax.device_put(jnp.ones(4), s.sharding()))),
        }
    finally:
        pw.shutdown()
    for name, html in pictures.items():
        assert HOSTILE not in html and script not in html and "<script" not in html.lower(), name
        assert "&lt;" in html, name  # the names are there, as text
    for js in (Path(w.__file__).parent / "static").glob("*.js"):
        src = js.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "eval(", "new Function", "document.write"):
            assert sink not in src, (js.name, sink)

"""The program graph as a picture that scales: slices as boxes, pipelines as a grid, named outputs, zoom and pan.

Python side: the DOT `graph_dot` writes, the SVG graphviz lays out (through the
``graphviz`` package), the names outputs get, what a notebook displays. Browser
side: ``static/graph.js`` mounted on its own in Chromium with a stand-in model
(as test_browser_timeline_js.py does), fed with a real graph's SVG.
"""

from __future__ import annotations

import re
import sys
import threading

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pw_kernel as pw
from pw_kernel.widgets import graph as graph_mod
from pw_kernel.widgets.dot import FONT_SIZE, graph_dot, pipeline_rows
from pw_kernel.widgets.esm import STATIC, esm_source
from pw_kernel.widgets.graph import GraphvizError, clear_layout_cache, graph_html, graph_svg, layout_available

HOSTILE = "<img src=x onerror=alert(1)>"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
needs_dot = pytest.mark.skipif(
    not layout_available(),
    reason="graphviz (`dot` and the Python package) is installed by scripts/setup.sh",
)


# ------------------------------------------------------------------ programs
def tutorial_pipeline(M=2, S=4, schedule="gpipe"):
    """Tutorial 04's model: S tanh layers, one per slice of 2 devices, M microbatches."""
    W, B = 32, 16
    slices = [pw.slice(2, mesh={"data": 2}, name=f"stage{i}") for i in range(S)]

    def layer(p, x):
        return jnp.tanh(x @ p["w"] + p["b"])

    rng = np.random.default_rng(0)
    params = [{"w": rng.standard_normal((W, W), dtype=np.float32), "b": np.zeros(W, np.float32)} for _ in range(S)]
    X = rng.standard_normal((B, W), dtype=np.float32)
    pipe = pw.pipeline([layer] * S, slices=slices, microbatches=M, schedule=schedule, name="small")
    return pipe.trace(pipe.place(params), X, X), slices


def paper_program():
    """The Pathways paper's example: y on slice a, z through slice b and back."""
    a = pw.slice(4, mesh={"data": 2, "model": 2}, name="a", island=0)
    b = pw.slice(4, mesh={"stage": 4}, name="b", island=1)
    pa = pw.compiled(lambda x: x * 2, slice=a, name="a")
    pb = pw.compiled(lambda x: x + 1, slice=a, name="b")
    pc = pw.compiled(lambda x: x / 2, slice=b, name="c")

    @pw.program
    def paper(v):
        x = pa(v)
        y = pb(x)
        z = pa(pc(x))
        return y, z

    return paper.trace(jnp.arange(8.0))


def clusters_of(dot: str) -> dict[str, set[str]]:
    """DOT node ids per cluster, read back from `graph_dot`'s output."""
    out = {}
    for m in re.finditer(r"subgraph (cluster_\d+) \{ label=\"((?:[^\"\\]|\\.)*)\";(.*?)\n  \}", dot, flags=re.DOTALL):
        body = m.group(3)
        members = set(
            re.findall(r"^    ((?:n|in|out)\d+(?:; (?:n|in|out)\d+)*);$", body, flags=re.MULTILINE)[0].split("; ")
        )
        out[m.group(2)] = members
    return out


def node_positions(svg: str) -> dict[str, tuple[float, float]]:
    """Where graphviz drew every labelled node's (first) label line, by DOT id (``n12``, ``in3``, ``out0``)."""
    pos = {}
    for chunk in svg.split('<g id="node')[1:]:
        chunk = chunk.split("<!--")[0]  # up to the next element's comment
        title = re.search(r"<title>([^<]*)</title>", chunk).group(1)
        text = re.search(r'<text[^>]*x="(-?[\d.]+)" y="(-?[\d.]+)"', chunk)
        if text:
            pos[title] = (float(text.group(1)), float(text.group(2)))
    return pos


# -------------------------------------------------------- clusters per slice
def test_every_slice_is_a_box_labelled_with_its_mesh_and_devices_and_transfers_sit_between(ctl2):
    g = paper_program()
    dot = graph_dot(g)
    boxes = clusters_of(dot)
    assert len(boxes) == 2
    a_label = next(k for k in boxes if k.startswith("slice a"))
    b_label = next(k for k in boxes if k.startswith("slice b"))
    assert "data=2 x model=2" in a_label and "[0,1,2,3]" in a_label and "island 0" in a_label
    assert "stage=4" in b_label and "[4,5,6,7]" in b_label
    by_slice = {s.name: {f"n{n.id}" for n in g.nodes if n.kind != "transfer" and n.slice is s} for s in g.slices}
    assert boxes[a_label] == by_slice["a"] and boxes[b_label] == by_slice["b"]
    transfers = {f"n{n.id}" for n in g.nodes if n.kind == "transfer"}
    assert len(transfers) == 3 and not transfers & (boxes[a_label] | boxes[b_label])  # between the boxes
    assert "rankdir=TB" in dot  # not a pipeline: the usual top-down layout


@needs_dot
def test_the_boxes_are_drawn(ctl2):
    svg = graph_svg(paper_program())
    assert svg.count('class="cluster"') == 2
    assert "slice a" in svg and "slice b" in svg


# ------------------------------------------------------------------ pipelines
def test_the_tutorial_pipeline_is_a_grid_one_row_per_slice_microbatches_in_order(ctl):
    g, slices = tutorial_pipeline(M=4)
    rows = pipeline_rows(g)
    assert rows is not None and rows.microbatches == 4
    assert [s.name for s in rows.slices] == ["stage0", "stage1", "stage2", "stage3"]  # stage order, not first use
    for j, row in enumerate(rows.rows):
        names = [g.nodes[i].name for i in row]
        fwd = [n for n in names if re.fullmatch(rf"F{j}(:\d+)?", n)]
        bwd = [n for n in names if re.fullmatch(rf"B{j}(:\d+)?", n)]
        assert fwd == [f"F{j}"] + [f"F{j}:{m}" for m in range(1, 4)]  # microbatches left to right
        assert bwd == [f"B{j}"] + [f"B{j}:{m}" for m in range(1, 4)]
        assert all(g.nodes[i].slice is slices[j] for i in row)
    dot = graph_dot(g)
    assert "rankdir=LR" in dot
    visible = [e for e in re.findall(r"^  \w+ -> \w+ \[.*\];$", dot, flags=re.MULTILINE) if "style=invis" not in e]
    assert len(visible) == sum(1 for n in g.nodes for v in n.inputs) + len(g.outputs)  # the DOT has every edge
    boxes = clusters_of(dot)
    assert len(boxes) == 4
    for s, label in zip(slices, sorted(boxes)):
        assert label.startswith(f"slice {s.name}")
        ids = {f"n{n.id}" for n in g.nodes if n.kind != "transfer" and n.slice is s}
        assert ids <= boxes[label]


@needs_dot
@pytest.mark.parametrize("schedule, M, S", [("gpipe", 4, 4), ("gpipe", 8, 3), ("1f1b", 4, 4), ("zero_bubble", 8, 2)])
def test_the_pipeline_grid_as_laid_out(ctl, schedule, M, S):
    g, _ = tutorial_pipeline(M=M, S=S, schedule=schedule)
    svg = graph_svg(g)
    pos = node_positions(svg)
    rows = pipeline_rows(g)
    ys = []
    for row in rows.rows:
        line = [pos[f"n{i}"] for i in row]
        assert max(y for _, y in line) - min(y for _, y in line) < 1.0  # each row is one straight line
        xs = [x for x, _ in line]
        assert xs == sorted(xs)  # in dispatch order: microbatch 0, 1, 2, ... left to right
        ys.append(line[0][1])
    assert ys == sorted(ys)  # stage 0 on top, the last stage at the bottom
    assert svg.count('class="cluster"') == S
    # reads within a row (a stage's parameters, activations kept for the backward) are arcs above it
    arcs = svg.count('class="edge pw-arc"')
    drawn_by_dot = len(re.findall(r'<g id="edge\d+" class="edge">', svg))
    every_edge = sum(1 for n in g.nodes for v in n.inputs if g.values[v].origin != "const") + len(g.outputs)
    assert arcs > 0 and arcs + drawn_by_dot == every_edge
    # text at its own readable size, however large the graph
    sizes = {float(s) for s in re.findall(r'font-size="([\d.]+)"', svg)}
    assert min(sizes) >= FONT_SIZE - 2


@pytest.mark.parametrize("schedule", ["1f1b", "zero_bubble"])
def test_other_schedules_are_grids_too(ctl, schedule):
    g, slices = tutorial_pipeline(M=4, schedule=schedule)
    rows = pipeline_rows(g)
    assert [s.name for s in rows.slices] == [s.name for s in slices]
    for j, row in enumerate(rows.rows):
        fwd = [g.nodes[i].name for i in row if re.fullmatch(rf"F{j}(:\d+)?", g.nodes[i].name)]
        assert fwd == [f"F{j}"] + [f"F{j}:{m}" for m in range(1, 4)]


def test_a_chain_that_calls_the_same_functions_in_turn_is_not_a_pipeline(ctl2):
    a = pw.slice(4, mesh={"data": 4}, name="a", island=0)
    b = pw.slice(4, mesh={"data": 4}, name="b", island=1)
    fa = pw.compiled(lambda v: jnp.tanh(v), slice=a, in_specs=P("data"), out_specs=P("data"), name="stage_a")
    fb = pw.compiled(lambda v: v * 2, slice=b, in_specs=P("data"), out_specs=P("data"), name="stage_b")

    @pw.program
    def step(v):
        for _ in range(6):
            v = fb(fa(v))
        return v

    g = step.trace(jnp.ones(8))
    assert pipeline_rows(g) is None  # each call feeds the next
    dot = graph_dot(g)
    assert "rankdir=TB" in dot and len(clusters_of(dot)) == 2
    assert 'label="float32[8]"' in dot  # edges keep their shape and dtype

    @pw.program
    def one_slice(xs):
        return [fa(x) for x in xs]

    assert pipeline_rows(one_slice.trace([jnp.ones(8)] * 4)) is None  # microbatches on one slice: no grid


# ------------------------------------------------------------- output names
def test_output_nodes_carry_the_names_the_program_returns(ctl2):
    g = paper_program()
    assert g.output_names == ("y", "z")
    dot = graph_dot(g)
    assert 'label="y: float32[8]"' in dot and 'label="z: float32[8]"' in dot
    assert "output 0:" not in dot


def test_output_names_from_dict_keys_nested_structures_and_fallbacks(ctl):
    s = pw.slice(2, name="s")
    f = pw.compiled(lambda v: v + 1, slice=s, name="f")

    @pw.program
    def as_dict(v):
        return {"loss": f(v), "params": {"w": f(v), "b": f(v)}}

    assert as_dict.trace(jnp.ones(4)).output_names == ("loss", "params['b']", "params['w']")

    @pw.program
    def nested(v):
        state = {"w": f(v), "b": f(v)}
        loss = f(v)
        return state, loss

    assert nested.trace(jnp.ones(4)).output_names == ("state['b']", "state['w']", "loss")

    @pw.program
    def branches(v, flag=True):
        a, b = f(v), f(v)
        if flag:
            return a, b
        return b, a  # two returns that disagree: no names from the source

    assert branches.trace(jnp.ones(4)).output_names == ("output 0", "output 1")
    assert pw.program(lambda v: f(v), name="lam").trace(jnp.ones(4)).output_names == ("output 0",)
    assert pw.program(lambda v: (f(v), v), name="lam2").trace(jnp.ones(4)).output_names == ("output 0", "v")


def test_pipeline_outputs_are_named_by_the_step_it_returns(ctl):
    g, _ = tutorial_pipeline(M=2)
    names = g.output_names
    assert names[-1] == "loss" and "new.params[0]['w']" in names
    assert len(set(names)) == len(names) == len(g.outputs)


# ---------------------------------------------------------------- rendering
@needs_dot
def test_layout_goes_through_the_graphviz_package(ctl, monkeypatch):
    import graphviz

    calls = []
    real = graphviz.Source.pipe

    def spy(self, *args, **kwargs):
        calls.append(kwargs.get("format"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(graphviz.Source, "pipe", spy)
    clear_layout_cache()
    g = pw.program(lambda v: pw.compiled(lambda x: x * 3, slice=pw.slice(1, name="one"), name="k")(v), name="p")
    svg = graph_svg(g.trace(jnp.ones(3)))
    assert svg.startswith("<svg") and calls == ["svg"]
    assert not hasattr(graph_mod, "subprocess")  # no hand-written `dot` calls left


def test_without_the_graphviz_package_a_clear_message_and_the_dot_source(ctl, monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)  # importing it raises ImportError
    clear_layout_cache()
    s = pw.slice(1, name="one")
    g = pw.program(lambda v: pw.compiled(lambda x: x + 1, slice=s, name="inc")(v), name="p").trace(jnp.ones(3))
    with pytest.raises(GraphvizError, match=re.escape("the `graphviz` Python package is not installed")) as info:
        graph_svg(g)
    assert "pip install graphviz" in str(info.value) and "apt-get install graphviz" in str(info.value)
    assert info.value.dot.startswith('digraph "p"')
    assert g._repr_svg_() is None
    html = g._repr_html_()
    assert "pip install graphviz" in html and "<pre" in html and "digraph &quot;p&quot;" in html


def test_a_layout_that_takes_too_long_is_given_up_with_the_dot_source(ctl, monkeypatch):
    graphviz = pytest.importorskip("graphviz")
    done = threading.Event()

    def slow(self, *args, **kwargs):  # a dot that finishes only after the test has seen the timeout
        done.wait(60)
        return "<svg></svg>"

    monkeypatch.setattr(graphviz.Source, "pipe", slow)
    monkeypatch.setattr(graph_mod, "DOT_TIMEOUT", 0.1)
    monkeypatch.setattr(graph_mod, "dot_binary", lambda: "/usr/bin/dot")
    clear_layout_cache()
    try:
        with pytest.raises(GraphvizError, match="took longer than") as info:
            graph_mod.dot_to_svg('digraph "slow" { a -> b }')
    finally:
        done.set()
    assert 'digraph "slow"' in info.value.dot


@needs_dot
def test_hostile_names_stay_text_in_the_grid_too(ctl):
    s0, s1 = pw.slice(1, name=f"s0{HOSTILE}"), pw.slice(1, name="s1")
    f0 = pw.compiled(lambda v: v + 1, slice=s0, name=HOSTILE)
    f1 = pw.compiled(lambda v: v * 2, slice=s1, name='q"\\n')

    @pw.program
    def p(xs):
        return [f1(f0(x)) for x in xs]

    g = p.trace([jnp.ones(4)] * 3)
    assert pipeline_rows(g) is not None
    svg = graph_svg(g)
    html = graph_html(g)
    for text in (svg, html):
        assert "<img" not in text and "&lt;img src=x onerror=alert(1)&gt;" in text


# ------------------------------------------------------------ notebook view
@needs_dot
def test_static_html_keeps_the_svg_at_its_own_size(ctl2):
    html = graph_html(paper_program())
    assert "<script" not in html.lower()
    svg_tag = re.search(r"<svg [^>]*>", html).group(0)
    assert "jp-mod-unconfined" in svg_tag and "max-width:none" in svg_tag  # JupyterLab shrinks SVGs otherwise
    assert 'class="pw-graph-svg" style="overflow:auto' in html  # scrolls both ways


@needs_dot
def test_in_a_notebook_the_graph_is_a_zoomable_widget_with_the_static_picture_beside(ctl2, monkeypatch):
    pytest.importorskip("anywidget")
    import IPython.display

    from pw_kernel.widgets.graph_widget import GraphWidget

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: shown.append((a, k)))
    g = paper_program()
    g._ipython_display_()
    ((args, kwargs),) = shown
    data = args[0]
    assert WIDGET_MIME in data and kwargs.get("raw")
    assert "pw-graph-svg" in data["text/html"] and "<svg" in data["text/html"]  # nbconvert, GitHub, untrusted
    assert "ProgramGraph 'paper'" in data["text/plain"]
    w = GraphWidget(g)
    assert w.svg.startswith("<svg") and w.svg == graph_svg(g)
    assert w.title.startswith("ProgramGraph 'paper'")
    state = w.get_state()  # what the front-end gets: static/graph.js (after the prelude) and graph.css
    assert "pw-gv-viewport" in state["_esm"] and "pw-gv-stage" in state["_css"]
    w.close()


def test_without_anywidget_the_notebook_shows_the_static_picture(ctl2, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: shown.append((a, k)))
    monkeypatch.setitem(sys.modules, "pw_kernel.widgets.graph_widget", None)  # as if anywidget were missing
    paper_program()._ipython_display_()
    ((args, _),) = shown
    assert set(args[0]) == {"text/plain", "text/html"} and "pw-static pw-graph" in args[0]["text/html"]


def test_without_graphviz_the_notebook_shows_what_to_install(ctl2, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: shown.append((a, k)))
    monkeypatch.setitem(sys.modules, "graphviz", None)
    clear_layout_cache()
    paper_program()._ipython_display_()
    ((args, _),) = shown
    assert WIDGET_MIME not in args[0]  # no widget without a picture
    assert "pip install graphviz" in args[0]["text/html"] and "digraph &quot;paper&quot;" in args[0]["text/html"]


def test_the_front_end_uses_no_html_sinks():
    src = esm_source("graph")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "eval(", "new Function", "document.write"):
        assert sink not in src, sink
    assert "DOMParser" in src and "image/svg+xml" in src  # the SVG is parsed as XML


# -------------------------------------------------------------- in Chromium


@pytest.fixture(scope="module")
def page():
    from chromium import CHROMIUM, available, widget_page

    if not available():
        pytest.skip(f"no Chromium at {CHROMIUM} (scripts/setup.sh installs Debian's chromium)")
    pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    css = (STATIC / "widgets.css").read_text() + (STATIC / "graph.css").read_text()
    with widget_page(css, viewport={"width": 1000, "height": 800}) as pg:
        yield pg


def _transform(page):
    return page.evaluate("() => window.w.root.querySelector('.pw-gv-stage').style.transform")


def _scale(t: str) -> float:
    return float(re.search(r"scale\(([\d.e-]+)\)", t).group(1))


def _translate(t: str) -> tuple[float, float]:
    x, y = re.search(r"translate\((-?[\d.e-]+)px, (-?[\d.e-]+)px\)", t).groups()
    return float(x), float(y)


@needs_dot
def test_wheel_zooms_drag_pans_buttons_reset_and_search_highlights(page):
    pw.init(pw.Config(validate=True))
    try:
        g, _ = tutorial_pipeline(M=4)
        f0 = sum(1 for n in g.nodes if re.fullmatch(r"F0(:\d+)?", n.name))
        st = {"svg": graph_svg(g), "title": g.summary(), "height": 500, "min_start_zoom": 0.7}
    finally:
        pw.shutdown()
    page.evaluate("async ([src, st]) => { window.w = await mount(src, st, '900px'); }", [esm_source("graph"), st])
    root = page.locator(".pw-graph-view")
    assert root.locator("svg g.node").count() == int(root.get_attribute("data-nodes")) > 40
    start = _transform(page)
    assert _scale(start) >= 0.7  # a wide graph starts readable, not squeezed to the output's width
    box = page.locator(".pw-gv-viewport").bounding_box()
    assert 100 < box["height"] <= 502
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(cx, cy)
    page.mouse.wheel(0, -400)  # wheel up: zoom in around the cursor
    page.wait_for_function("(t) => window.w.root.querySelector('.pw-gv-stage').style.transform !== t", arg=start)
    zoomed = _transform(page)
    assert _scale(zoomed) > _scale(start) * 1.5
    page.mouse.wheel(0, 800)
    page.wait_for_function("(t) => window.w.root.querySelector('.pw-gv-stage').style.transform !== t", arg=zoomed)
    assert _scale(_transform(page)) < _scale(zoomed)
    # drag pans by exactly the distance moved
    before = _translate(_transform(page))
    page.mouse.move(cx, cy)
    page.mouse.down()
    page.mouse.move(cx - 120, cy - 40, steps=4)
    page.mouse.up()
    after = _translate(_transform(page))
    assert after[0] == pytest.approx(before[0] - 120, abs=1) and after[1] == pytest.approx(before[1] - 40, abs=1)
    # 1:1 resets to natural size at the top left; fit shows it all
    page.locator(".pw-gv-reset").click()
    assert _transform(page) == "translate(0px, 0px) scale(1)"
    page.locator(".pw-gv-fit").click()
    fitted = page.evaluate("() => window.w.root.querySelector('.pw-gv-stage svg').getBoundingClientRect().width")
    assert fitted <= box["width"] + 1
    # search: the matching nodes are marked, the rest dimmed; Enter centres the next one
    page.locator(".pw-gv-search").fill("F0")
    assert root.get_attribute("data-hits") == str(f0) and root.locator("g.node.pw-gv-hit").count() == f0
    page.locator(".pw-gv-search").press("Enter")
    assert page.locator(".pw-gv-count").inner_text() == f"1 of {f0}"
    assert root.locator("g.node.pw-gv-current").count() == 1
    page.locator(".pw-gv-search").press("Escape")
    assert root.get_attribute("data-hits") == "0" and root.locator("g.node.pw-gv-hit").count() == 0
    page.evaluate("() => window.w.cleanup()")
    assert page.locator(".pw-graph-view").count() == 0


@needs_dot
def test_hostile_names_in_the_widget_stay_text(page):
    pw.init(pw.Config(validate=True))
    try:
        s = pw.slice(1, name="s")
        f = pw.compiled(lambda v: v + 1, slice=s, name=HOSTILE)
        g = pw.program(lambda v: f(v), name=HOSTILE).trace(jnp.ones(4))
        st = {"svg": graph_svg(g), "title": g.summary(), "height": 400, "min_start_zoom": 0.7}
    finally:
        pw.shutdown()
    page.evaluate("async ([src, st]) => { window.w = await mount(src, st, '900px'); }", [esm_source("graph"), st])
    root = page.locator(".pw-graph-view").last
    assert HOSTILE in root.locator(".pw-gv-title").inner_text()
    assert HOSTILE in " ".join(root.locator("g.node text").all_text_contents())
    assert page.locator("img").count() == 0 and page.dialogs == []
    page.evaluate("() => window.w.cleanup()")

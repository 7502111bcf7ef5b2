"""What the timeline and the run widget's mini timeline tell a reader, on the Python side.

Lane names in `Timeline.utilization()`, and the static pictures (what a saved notebook, nbconvert or
GitHub shows): a legend entry for every look a bar can have, back-to-back bars kept apart, a time axis
that starts at "0 ns" and never repeats a label, a labelled mini timeline. The live front-ends are
checked in test_browser_timeline_js.py.
"""

from __future__ import annotations

import html
import itertools
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import pw_kernel as pw
from timeline_events import chained_layers, node

pytest.importorskip("anywidget")

from pw_kernel.widgets import RunWidget, TimelineWidget, _html, static_timeline

HOSTILE = "<img src=x onerror=alert(1)>"
BLUE = _html.RUN_PALETTE[0]  # the first run's colour


def two_island_program():
    a = pw.slice(4, mesh={"data": 4}, name="a", island=0)
    b = pw.slice(4, mesh={"data": 4}, name="b", island=1)
    f = pw.compiled(lambda v: jnp.tanh(v @ v.T), slice=a, in_specs=P("data", None), out_specs=P("data", None), name="f")
    g = pw.compiled(lambda v: v * 2.0, slice=b, in_specs=P("data", None), out_specs=P("data", None), name="g")

    @pw.program
    def step(v):
        return g(f(v) + 1.0)

    return step, jax.device_put(jnp.ones((8, 8)), a.sharding("data", None))


def legend_of(page: str) -> str:
    """The static legend's text."""
    block = re.search(r'<div class="pw-legend".*?</div>', page, flags=re.DOTALL).group(0)
    return html.unescape(re.sub(r"<[^>]+>", "", block))


def axis_of(page: str) -> list[str]:
    """The static picture's tick labels, left to right."""
    return [html.unescape(t) for t in re.findall(r'<text [^>]*text-anchor="middle" fill="#555">([^<]*)</text>', page)]


# ---------------------------------------------------------------- utilization
def test_utilization_is_keyed_by_the_lane_names_the_timeline_shows(ctl2):
    step, x = two_island_program()
    step.submit(x).wait(30)
    tl = pw.timeline(live=False)
    util = tl.utilization()
    assert set(util) == {lane["label"] for lane in tl.lanes}
    assert not [k for k in util if k.startswith(("dev:", "xfer:")) or k == "host"], util
    assert util["cpu:0"] > 0 and util["host work"] > 0  # f ran on device 0; its first call compiled
    assert "island 0 → island 1" in util
    busiest = sorted(util.items(), key=lambda kv: -kv[1])[:4]  # the quickstart's cell reads as lane names
    assert all(not name.startswith("dev:") for name, _ in busiest)


def test_lanes_that_share_a_label_are_told_apart():
    from pw_kernel.widgets.timeline_encoder import lane_names

    lanes = [
        {"key": "dev:0", "label": "gpu"},
        {"key": "dev:1", "label": "gpu"},
        {"key": "xfer:0:1", "label": "island 0 → island 1"},
    ]
    assert lane_names(lanes) == ["gpu [dev:0]", "gpu [dev:1]", "island 0 → island 1"]
    tl = TimelineWidget(events=chained_layers(devices=(0, 1)), live=False)
    assert list(tl.utilization()) == ["device 0", "device 1"]
    assert TimelineWidget(events=[], live=False).utilization() == {}


# ---------------------------------------------------------------- static picture
def test_static_legend_explains_compile_bars(ctl2):
    step, x = two_island_program()
    step.submit(x).wait(30)  # the first call compiles f and g: bars on the host lane
    page = pw.timeline(live=False).static_html()
    legend = legend_of(page)
    assert "host: compile, checkpoint" in legend and "transfer" in legend and "cross-island transfer" in legend
    assert 'id="pw-tl-hatch"' in page and "url(#pw-tl-hatch)" in page  # the compile bars' own look
    # a timeline without compiles does not list them
    assert "compile" not in legend_of(TimelineWidget(events=chained_layers(), live=False).static_html())


def test_static_legend_explains_merged_transfer_strips():
    evs = chained_layers(6, devices=(0, 1))
    for k in range(400):  # short transfers much closer together than a pixel: a strip, not 400 boxes
        t = 5_000_000_000 + k * 15_000
        evs.append(node(100 + k, "transfer", t, t + 5_000, (0,), "transfer", island=0, src=0))
        evs.append(node(600 + k, "transfer", t, t + 5_000, (1,), "transfer", island=1, src=0))
    page = TimelineWidget(events=evs, live=False).static_html()
    legend = legend_of(page)
    assert "transfers merged at this scale" in legend and "cross-island transfers merged" in legend, legend
    assert "compile" not in legend
    # two transfers wide enough to see are two boxes, and nothing merged is listed
    two = [
        node(0, "transfer", 0, 1_000_000, (0,), "transfer", src=1),
        node(1, "transfer", 1_000_000, 2_000_000, (0,), "transfer", src=1),
    ]
    page = TimelineWidget(events=two, live=False).static_html()
    assert "merged" not in legend_of(page)
    assert len(re.findall(r'fill="#e9e9e9" stroke="#d62828"', page)) == 2  # on the island 1 → island 0 lane


def test_static_picture_shows_six_chained_layers_as_six_bars():
    tl = TimelineWidget(events=chained_layers(6), live=False)
    page = tl.static_html()
    rects = re.findall(r'<rect x="(\d+)" y="(\d+)" width="(\d+)" height="\d+" fill="' + BLUE + '"/>', page)
    rows: dict[str, list[tuple[int, int]]] = {}
    for x, y, w in rects:
        rows.setdefault(y, []).append((int(x), int(w)))
    assert len(rows) == 4 and all(len(bars) == 6 for bars in rows.values()), rows
    for bars in rows.values():
        # each ends a pixel before the next begins: a visible gap, not one long bar
        assert all(x + w + 1 == nx for (x, w), (nx, _) in itertools.pairwise(bars)), bars


def test_static_picture_still_merges_bars_thinner_than_a_pixel():
    tiny = [node(k, "tick", k * 1_000, (k + 1) * 1_000) for k in range(5_000)]  # 5000 back-to-back 1 µs bars
    page = TimelineWidget(events=tiny, live=False).static_html()
    assert len(re.findall(f'fill="{BLUE}"', page)) == 1


def test_static_axis_starts_at_0_ns_and_never_repeats_a_label():
    labels = axis_of(TimelineWidget(events=chained_layers(6), live=False).static_html())
    assert labels[0] == "0 ns" and len(labels) >= 3
    assert len(set(labels)) == len(labels), labels


def test_axis_labels_stay_distinct_zoomed_far_in():
    from pw_kernel.widgets.timeline_html import axis_labels

    # a 1 µs window 14.1 ms into a run: ticks 100 ns apart
    ticks = [14_100_000 + k * 100 for k in range(10)]
    labels = axis_labels(ticks, 100)
    assert len(set(labels)) == len(labels), labels
    assert labels[:2] == ["14.1000 ms", "14.1001 ms"]
    assert axis_labels([0, 500_000, 1_000_000], 500_000) == ["0 ns", "0.5 ms", "1.0 ms"]
    assert axis_labels([-2e9, 0, 2e9], 2e9) == ["-2 s", "0 ns", "2 s"]


def test_static_picture_keeps_names_as_text():
    tl = TimelineWidget(events=[node(0, HOSTILE, 0, 1_000)], live=False, title=HOSTILE)
    page = tl.static_html()
    assert HOSTILE not in page and html.escape(HOSTILE) in page


# ---------------------------------------------------------------- run widget
def test_run_widget_static_picture_labels_its_mini_timeline(ctl2):
    step, x = two_island_program()
    run = step.submit(x)
    run.wait(30)
    w = RunWidget(run)
    page = w.static_html()
    assert "this run&#x27;s nodes on each device over time:" in page
    assert "compute" in page
    labels = [html.unescape(t) for t in re.findall(r'<text class="pw-run-mini-label"[^>]*>([^<]*)</text>', page)]
    assert labels == list(w.lanes) == [f"cpu:{d}" for d in range(8)]  # a name per device row
    scale = re.findall(r'<text class="pw-run-mini-scale"[^>]*>([^<]*)</text>', page)
    assert scale[0] == "0 ns" and re.fullmatch(r"[\d.]+ (ns|µs|ms|s)", scale[1]), scale


def test_mini_timeline_names_only_the_ends_when_rows_are_thin():
    names = [f"dev{k}" for k in range(32)] + [HOSTILE]
    events = [node(0, "f", 0, 1_000_000, (0,)), node(1, "t", 500_000, 2_000_000, (32,), "transfer", src=0)]
    page = static_timeline(events, mini=True, devices=[(k, name, 0) for k, name in enumerate(names)])
    labels = [html.unescape(t) for t in re.findall(r'<text class="pw-run-mini-label"[^>]*>([^<]*)</text>', page)]
    assert labels == ["dev0", HOSTILE] and HOSTILE not in page
    assert "transfer" in page and "glue" not in page  # the colour key lists what is drawn
    scale = re.findall(r'<text class="pw-run-mini-scale"[^>]*>([^<]*)</text>', page)
    assert scale == ["0 ns", "2 ms"]  # from the first node's start to the last one's end
    assert static_timeline([], mini=True) == "" and static_timeline([], mini=True, devices=[(0, "cpu:0", 0)]) == ""


def test_every_static_timeline_is_drawn_by_the_one_renderer(ctl2):
    """The timeline widget, the run widget and the notebook's text views draw the same picture of one run."""
    from pw_kernel.widgets import run_view, timeline_view

    step, x = two_island_program()
    run = step.submit(x, name=HOSTILE)
    run.wait(30)
    widget = pw.timeline(run, live=False).static_html()
    view = timeline_view(run.events, title=f"timeline of run {run.id}", runs=[run])._repr_html_()
    for page in (widget, view):
        assert 'class="pw-legend"' in page and "island 0 → island 1" in page and "cpu:4" in page
        assert f"run {run.id} {html.escape(HOSTILE)}" in page and HOSTILE not in page
    assert axis_of(widget) == axis_of(view)
    mini = RunWidget(run).static_html()
    text_mini = run_view(run)._repr_html_()
    for page in (mini, text_mini):
        assert "pw-run-mini-caption" in page and 'class="pw-run-mini-label"' in page and "cpu:0" in page


def test_a_checkpoint_save_is_a_bar_on_the_host_lane_with_its_bytes(ctl, tmp_path):
    pytest.importorskip("orbax.checkpoint")
    s = pw.slice(2, mesh={"d": 2})
    w = pw.compiled(lambda a: a * 2, slice=s)(jnp.ones((256, 256)))
    ckpt = pw.CheckpointManager(tmp_path / "ck")
    ckpt.save(7, {"w": w})
    ckpt.wait_until_finished()
    ckpt.close()
    tl = pw.timeline(live=False)
    (bar,) = [e for e in tl.events if e["node"] == "save step 7"]
    assert bar["kind"] == "checkpoint" and bar["lanes"] == ["host"] and bar["nbytes"] == 256 * 256 * 4
    assert bar["end"] > bar["start"] and bar["program"] == "checkpoint"
    assert tl.utilization()["host work"] > 0

"""The widgets in a real JupyterLab, driven through Debian's Chromium with Playwright.

The suite starts JupyterLab on a free localhost port with a random token and a
kernel that has 8 simulated CPU devices, opens a notebook that uses every
widget, runs all cells and checks what a person sees: mesh cells are the
devices, timeline lanes are the devices, bars appear while a run executes and
grow in number, hover tooltips, the program graph's SVG, a hostile run name
shown as text. Screenshots go to ``artifacts/browser/`` and the README's
pictures to ``artifacts/screenshots/`` (both git-ignored), so the suite leaves
the checkout as it found it; ``scripts/screenshots.sh`` refreshes the README's
own pictures in ``docs/screenshots/`` (``PW_SCREENSHOTS_DIR``).

Runs whenever ``/usr/bin/chromium`` (or ``$PW_CHROMIUM``), Playwright and
JupyterLab are installed (``scripts/setup.sh`` installs them).
"""

from __future__ import annotations

import html
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from chromium import CHROMIUM, CHROMIUM_ARGS, available

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts" / "browser"
REPO = Path(__file__).resolve().parent.parent
HOSTILE = "<img src=x onerror=alert(1)>"

if not available():
    pytest.skip(f"no Chromium at {CHROMIUM} (scripts/setup.sh installs Debian's chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="pip install playwright (the browser itself is Debian's chromium)")
pytest.importorskip("jupyterlab", reason="pip install jupyterlab")
pytest.importorskip("anywidget", reason="pip install anywidget")

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

pytestmark = [pytest.mark.timeout(280), pytest.mark.slow]

# The notebook under test: every widget, a run long enough to watch, a hostile name.
CELLS = [
    # 0: set-up
    """import json, time
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import pw_kernel as pw
from pw_kernel.widgets import RunWidget, graph_html, graph_svg, show_mesh, timeline
from IPython.display import HTML, SVG

pw.init(pw.Config(islands=2))
a = pw.slice(4, mesh={"data": 2, "model": 2}, name="a", island=0)
b = pw.slice(4, mesh={"stage": 4}, name="b", island=1)
print("PWTEST " + json.dumps({"devices": [d.id for d in jax.devices()],
                              "a": [d.id for d in a.devices], "b": [d.id for d in b.devices]}))""",
    # 1: the mesh of a slice
    "show_mesh(a)",
    # 2: a 2-D array over it: rows split on "data", replicated over "model"
    """x = jax.device_put(jnp.arange(64.0).reshape(8, 8), a.sharding("data", None))
show_mesh(x, name="x")""",
    # 3: a 4-D array over a 3-D mesh (beyond jax.debug.visualize_array_sharding)
    """mesh3 = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("x", "y", "z"))
z = jax.device_put(jnp.zeros((4, 8, 8, 4)), NamedSharding(mesh3, P("x", "y", None, "z")))
show_mesh(z, name="z")""",
    # 4: every device
    "show_mesh()",
    # 5: the live timeline (it starts with the events of a quick run made just before)
    """quick = pw.compiled(lambda v: v + 1.0, slice=a, name="quick")
quick_run = quick(x).run
quick_run.wait(60)
print(f"PWQUICK {len(quick_run.events)}")  # its nodes and its compile
tl = timeline()
tl""",
    # 6: a run of 24 compute nodes (~0.45 s each) and 24 cross-island transfers, to watch live
    """def make_stage(iters):
    def stage(v):
        return jax.lax.fori_loop(0, iters, lambda i, v: jnp.tanh(v @ v * 0.01), v)
    return stage

probe = jax.jit(make_stage(10))
v = jnp.ones((256, 256)) * 0.01
probe(v).block_until_ready()
t = time.perf_counter(); probe(v).block_until_ready(); dt = time.perf_counter() - t
# ~0.45 s a node: the run lasts ~11 s, so its second half outlasts the cells after cell 10 (which compile and
# trace) and the kernel is seen idle while bars still arrive, on a loaded machine too
ITERS = int(min(max(10 * 0.45 / dt, 5), 20000))

stage_a = pw.compiled(make_stage(ITERS), slice=a, in_specs=P("data", None), out_specs=P("data", None), name="stage_a")
stage_b = pw.compiled(make_stage(ITERS), slice=b, in_specs=P("stage", None), out_specs=P("stage", None), name="stage_b")

@pw.program
def step(v):
    for _ in range(12):
        v = stage_b(stage_a(v))
    return v

v0 = jax.device_put(jnp.ones((256, 256)) * 0.01, a.sharding("data", None))
g = step.trace(v0)
run = step.submit(v0)
RunWidget(run)""",
    # 7: a hostile run name
    """hostile = "<img src=x onerror=alert(1)>"
double = pw.compiled(lambda v: v * 2.0, slice=b, name="double")

@pw.program(name=hostile)
def evil(v):
    return double(v)

bad = evil.submit(jnp.ones((8, 8)), name=hostile)
RunWidget(bad)""",
    # 8: the program graph as image/svg+xml (what `ProgramGraph._repr_svg_` gives)
    "SVG(graph_svg(g))",
    # 9: ... and as HTML with the SVG inline (what `ProgramGraph._repr_html_` gives)
    "HTML(graph_html(g))",
    # 10: the kernel busy for the first half of the run (widgets stay live), idle for the second half
    "while run.progress[0] < run.progress[1] // 2 and not run.done():\n    time.sleep(0.05)",
    # 11: a timeline made after a run: its data is in its initial state
    "timeline(quick_run, live=False)",
    # 12-14: the README's pictures, of a finished run and of the paper's example
    "timeline(run)  # live: it fills in as the run goes, while the kernel is idle",
    """pa = pw.compiled(lambda x: x * 2, slice=a, name="a")
pb = pw.compiled(lambda x: x + 1, slice=a, name="b")
pc = pw.compiled(lambda x: x / 2, slice=b, name="c")

@pw.program
def paper(v):
    x = pa(v)
    y = pb(x)
    z = pa(pc(x))
    return y, z

paper.trace(jnp.arange(8.0))""",
    # the live metrics plot: 200 steps' losses (one run: the live timeline above keeps its legend) logged
    # from futures with pw.log, drawn as they resolve
    """plot_step = pw.compiled(lambda w: (w * 0.99 + 0.01, jnp.mean(w)), slice=a, name="plot_step")
@pw.program
def train200(w):
    losses = []
    for _ in range(200):
        w, loss = plot_step(w)
        losses.append(loss)
    return w, losses
plot = pw.log.plot(["loss"])
wl, losses = train200(jax.device_put(jnp.zeros(8), a.sharding()))
for i, loss in enumerate(losses):
    pw.log({"loss": loss}, step=i)
plot""",
]
METRICS_CELL = len(CELLS) - 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on localhost with the test notebook and an 8-device kernel; yields (base url, token)."""
    import nbformat

    root = tmp_path_factory.mktemp("lab")
    home = tmp_path_factory.mktemp("jupyter-home")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "pwtest", "display_name": "pw_kernel widgets test", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nbformat.write(nb, root / "widgets.ipynb")

    device_env = {
        "PW_NUM_CPU_DEVICES": "8",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    kernel_dir = home / "data" / "kernels" / "pwtest"
    kernel_dir.mkdir(parents=True)
    (kernel_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "pw_kernel widgets test",
                "language": "python",
                "env": device_env,
            }
        )
    )
    settings = home / "lab-settings"
    for name, value in {
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    }.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(value))

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PW_", "JAX_", "XLA_", "JUPYTER"))}
    env.update(device_env)
    env.update(
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
        IPYTHONDIR=str(home / "ipython"),
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    token = secrets.token_hex(16)
    port = _free_port()
    log = open(home / "jupyterlab.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.extension_manager=readonly",
            "--ServerApp.shutdown_no_activity_timeout=600",
            *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    try:
        while True:  # the server is a separate process: poll its REST API until it answers
            if proc.poll() is not None:
                pytest.fail(
                    f"JupyterLab exited with {proc.returncode}:\n{(home / 'jupyterlab.log').read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not start in 90 s:\n{(home / 'jupyterlab.log').read_text()[-3000:]}")
            time.sleep(0.25)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(home / "jupyterlab.log", ARTIFACTS / "jupyterlab.log")


@pytest.fixture(scope="module")
def page(lab, tmp_path_factory):
    """Chromium (fresh profile) with the notebook open, every cell run; console errors are collected."""
    base, token = lab
    profile = tmp_path_factory.mktemp("chromium-profile")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1600},
        )
        ctx.set_default_timeout(60_000)
        pg = ctx.new_page()
        pg.dialogs = []
        pg.errors = []
        pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
        pg.on("pageerror", lambda e: pg.errors.append(f"pageerror: {e}"))
        pg.on("console", lambda m: m.type == "error" and pg.errors.append(f"console: {m.text}"))
        pg.goto(f"{base}/lab/tree/widgets.ipynb?reset&token={token}")
        pg.wait_for_function(
            "() => window.jupyterapp && window.jupyterapp.shell.currentWidget "
            "&& window.jupyterapp.shell.currentWidget.sessionContext"
        )
        pg.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        pg.evaluate(
            """async () => {
                const nb = window.jupyterapp.shell.currentWidget;
                await nb.sessionContext.ready;
                // The widget manager asks the kernel for its widgets when it connects; a shell request that
                // queued behind our cells would hold every widget view back until the last cell ends.
                await nb.sessionContext.session.kernel.requestCommInfo({target_name: 'jupyter.widget'});
                // not awaited: it resolves only when the last cell has run, and we watch the cells as they run
                window.jupyterapp.commands.execute('notebook:run-all-cells');
            }"""
        )
        try:
            yield pg
        finally:
            try:
                pg.screenshot(path=str(ARTIFACTS / "notebook.png"), full_page=True)
            finally:
                (ARTIFACTS / "console.txt").write_text("\n".join(pg.errors))
                ctx.close()


def _cell_output(page: Page, k: int):
    return page.locator(".jp-Notebook .jp-CodeCell").nth(k).locator(".jp-OutputArea")


def _shot(locator, name: str) -> None:
    locator.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def _setup_info(page: Page) -> dict:
    out = _cell_output(page, 0)
    expect(out).to_contain_text("PWTEST", timeout=120_000)
    text = out.inner_text()
    return json.loads(re.search(r"PWTEST (\{.*\})", text).group(1))


def test_timeline_lanes_are_the_devices_and_bars_grow_while_the_run_executes(page):
    info = _setup_info(page)
    tl = _cell_output(page, 5).locator(".pw-timeline")
    expect(tl).to_be_visible(timeout=120_000)
    labels = tl.locator(".pw-tl-lane-label[data-kind='device']")
    expect(labels).to_have_count(8)
    assert labels.all_inner_texts() == [f"cpu:{d}" for d in info["devices"]]
    run = _cell_output(page, 6).locator(".pw-run")
    expect(run).to_be_visible(timeout=120_000)
    # What a person would see, sampled in the page every 50 ms: events drawn, the run's state, the kernel's.
    page.evaluate(
        """([tl, run]) => {
            window.pwSamples = [];
            window.pwSampler = setInterval(() => {
                const kernel = document.querySelector('.jp-Notebook-ExecutionIndicator');
                window.pwSamples.push({events: +tl.dataset.events, drawn: +tl.dataset.barsInView,
                                       run: run.dataset.state, kernel: kernel ? kernel.dataset.status : '?'});
            }, 50);
        }""",
        [tl.element_handle(), run.element_handle()],
    )
    expect(run).to_have_attribute("data-state", "running", timeout=120_000)
    _shot(tl, "timeline_running")
    expect(run).to_have_attribute("data-state", "done", timeout=120_000)
    samples = page.evaluate("() => { clearInterval(window.pwSampler); return window.pwSamples; }")
    running = [s for s in samples if s["run"] == "running"]
    counts = [s["events"] for s in running]
    assert counts == sorted(counts), "the number of bars never goes down"
    grew = [b for a, b in zip(running, running[1:]) if b["events"] > a["events"]]
    assert len(grew) >= 3, f"bars should appear in several batches while the run executes: {counts}"
    assert all(s["drawn"] > 0 for s in grew)
    kernels = {s["kernel"] for s in grew}
    assert {"busy", "idle"} <= kernels, f"bars should arrive while the kernel is busy and while it is idle: {kernels}"
    # every node of the run (and of the quick run before it) is on the timeline
    total = int(re.search(r"(\d+)/(\d+) nodes", run.locator(".pw-run-count").inner_text()).group(2))
    quick = int(re.search(r"PWQUICK (\d+)", _cell_output(page, 5).inner_text()).group(1))
    expect(tl).to_have_attribute("data-events", re.compile(r"\d+"))
    page.wait_for_function(f"(tl) => +tl.dataset.events >= {total + quick}", arg=tl.element_handle(), timeout=30_000)
    # cross-island transfers got their own lanes, marked
    xfer = tl.locator(".pw-tl-lane-label[data-kind='transfer']")
    expect(xfer.first).to_be_visible()
    assert "island 0 → island 1" in xfer.all_inner_texts()
    expect(tl.locator(".pw-tl-stats")).to_contain_text("events")
    utils = tl.locator(".pw-tl-lane-util").all_inner_texts()
    assert any(u.strip() not in ("", "0%") for u in utils[:4])
    _shot(tl, "timeline_done")


def test_mesh_of_a_slice_shows_its_devices_with_axis_names(page):
    info = _setup_info(page)
    assert len(info["devices"]) == 8
    mesh = _cell_output(page, 1).locator(".pw-mesh")
    expect(mesh).to_be_visible()
    cells = mesh.locator(".pw-mesh-cell")
    expect(cells).to_have_count(4)
    shown = [int(c.get_attribute("data-device")) for c in cells.all()]
    assert shown == info["a"]
    assert [c.locator("b").inner_text() for c in cells.all()] == [str(d) for d in info["a"]]
    axes = mesh.locator(".pw-axis").all_inner_texts()
    assert {"data=0", "data=1", "model=0", "model=1"} <= set(axes)
    _shot(mesh, "mesh_slice")


def test_array_shards_replicas_and_hover(page):
    info = _setup_info(page)
    mesh = _cell_output(page, 2).locator(".pw-mesh")
    tiles = mesh.locator(".pw-tile")
    expect(tiles).to_have_count(2)
    a = info["a"]
    # rows split over "data", replicated over "model": two shards, each on two devices
    assert [t.get_attribute("data-devices") for t in tiles.all()] == [f"{a[0]},{a[1]}", f"{a[2]},{a[3]}"]
    expect(mesh.locator(".pw-tile .pw-rep")).to_have_count(2)
    expect(mesh.locator(".pw-tile .pw-rep").first).to_have_text("×2")
    tiles.first.hover()
    tip = mesh.locator(".pw-tip")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text("x[0:4, 0:8]")
    expect(tip).to_contain_text("shard f32[4,8]")
    expect(tip).to_contain_text("replicated on 2 devices")
    # the mesh cells of the hovered shard's devices light up
    expect(mesh.locator(".pw-mesh-cell.pw-hl")).to_have_count(2)
    _shot(mesh, "mesh_array_2d")


def test_four_dimensional_array_over_a_three_dimensional_mesh_is_faceted(page):
    mesh = _cell_output(page, 3).locator(".pw-mesh")
    expect(mesh.locator(".pw-mesh-facet")).to_have_count(2)  # the 3-D mesh: one 2x2 facet per x
    expect(mesh.locator(".pw-mesh-cell")).to_have_count(8)
    expect(mesh.locator(".pw-array-facet")).to_have_count(4)  # dims 0 and 1 split in 2: four facets
    tiles = mesh.locator(".pw-tile")
    expect(tiles).to_have_count(8)
    expect(mesh.locator(".pw-rep")).to_have_count(0)
    assert sorted(int(t.get_attribute("data-devices")) for t in tiles.all()) == list(range(8))
    labels = mesh.locator(".pw-array-facet .pw-facet-label").all_inner_texts()
    assert labels[0] == "z[0:2, 0:4, :, :]"
    tiles.last.hover()
    expect(mesh.locator(".pw-tip")).to_contain_text("z[2:4, 4:8, 0:8, 2:4]")
    _shot(mesh, "mesh_array_4d")


def test_all_devices_by_island(page):
    mesh = _cell_output(page, 4).locator(".pw-mesh")
    expect(mesh.locator(".pw-island")).to_have_count(2)
    expect(mesh.locator(".pw-mesh-cell")).to_have_count(8)
    expect(mesh.locator(".pw-island").first.locator(".pw-chip")).to_have_count(4)  # slice a on each of its devices
    _shot(mesh, "mesh_devices")


def test_timeline_hover_tooltip_and_zoom(page):
    tl = _cell_output(page, 5).locator(".pw-timeline")
    run = _cell_output(page, 6).locator(".pw-run")
    expect(run).to_have_attribute("data-state", "done", timeout=120_000)
    canvas = tl.locator("canvas")
    canvas.scroll_into_view_if_needed()
    cbox = canvas.bounding_box()
    lane = tl.locator(".pw-tl-lane-label[data-kind='device']").first.bounding_box()
    y = lane["y"] + lane["height"] / 2 - cbox["y"]
    tip = tl.locator(".pw-tip")
    for x in range(4, int(cbox["width"]) - 4, 5):  # move along device 0's lane like a person would
        canvas.hover(position={"x": x, "y": y})
        if tip.is_visible():
            break
    expect(tip).to_be_visible()
    text = tip.inner_text()
    assert re.search(r"^(stage_[ab]|quick|transfer|reshard).*\((compute|transfer)\)$", text, flags=re.M), text
    assert re.search(r"^run \d+ · (quick|step)$", text, flags=re.M), text
    assert re.search(r"^duration [\d.]+ (ns|µs|ms|s) · starts at ", text, flags=re.M), text
    assert re.search(r"^float32\[[\d,]+\] -> float32\[[\d,]+\]$", text, flags=re.M), text
    _shot(tl, "timeline_tooltip")
    # the wheel zooms in around the cursor: the window shrinks
    before = tl.locator(".pw-tl-stats").inner_text()
    span_before = re.search(r"in view ([\d.]+ \S+)", before).group(1)
    canvas.hover(position={"x": cbox["width"] / 2, "y": y})
    page.mouse.wheel(0, -600)
    expect(tl.locator(".pw-tl-stats")).not_to_contain_text(f"in view {span_before}")
    _shot(tl, "timeline_zoomed")


def test_run_widget_shows_progress_and_hostile_names_as_text(page):
    run = _cell_output(page, 6).locator(".pw-run")
    expect(run).to_have_attribute("data-state", "done", timeout=120_000)
    expect(run.locator(".pw-run-name")).to_have_text("step")
    count = run.locator(".pw-run-count").inner_text()
    done, total = map(int, re.search(r"(\d+)/(\d+) nodes", count).groups())
    assert done == total > 24
    _shot(run, "run_done")
    bad = _cell_output(page, 7).locator(".pw-run")
    expect(bad.locator(".pw-run-name")).to_have_text(HOSTILE)
    expect(bad).to_have_attribute("data-state", "done", timeout=120_000)
    tl = _cell_output(page, 5).locator(".pw-timeline")
    expect(tl.locator(".pw-tl-legend")).to_contain_text(HOSTILE)
    assert page.locator("img[src='x']").count() == 0
    assert page.dialogs == []
    _shot(bad, "run_hostile")


def test_the_metrics_plot_draws_every_logged_step(page):
    out = _cell_output(page, METRICS_CELL)
    line = out.locator(".pw-metrics polyline.pw-metric-line")
    expect(out.locator(".pw-metric-head")).to_contain_text("at step 199", timeout=120_000)
    assert len(line.get_attribute("points").split()) == 200  # every step, as its future resolved
    expect(out.locator(".pw-metric-head b")).to_have_text("loss")
    _shot(out, "metrics_plot")


def _check_graph_text(texts: str, edges: str) -> None:
    assert texts.count("stage_a") == 12 and texts.count("stage_b") == 12, texts
    assert "[a]" in texts and "[b]" in texts
    assert "a → b" in texts and "cross-island" in texts
    assert "float32[256,256]" in edges


def test_program_graph_svg_holds_the_program_nodes(page):
    # image/svg+xml: JupyterLab shows it as an <img> of the SVG; read the SVG the browser was given
    out = _cell_output(page, 8)
    img = out.locator(".jp-RenderedSVG img")
    expect(img).to_be_visible(timeout=120_000)
    page.wait_for_function("(img) => img.complete && img.naturalWidth > 100", arg=img.element_handle())
    src = img.get_attribute("src")
    svg = urllib.parse.unquote(src.split(",", 1)[1])
    groups = {
        kind: " ".join(re.findall(rf'<g id="{kind}\d+" class="{kind}">.*?</g>', svg, flags=re.S))
        for kind in ("node", "edge")
    }
    nodes, edges = (" ".join(re.findall(r"<text[^>]*>([^<]*)</text>", groups[k])) for k in ("node", "edge"))
    _check_graph_text(html.unescape(nodes), html.unescape(edges))
    _shot(out, "graph_svg")
    # text/html: the same SVG inline; its node labels are DOM text
    out = _cell_output(page, 9)
    svg = out.locator(".pw-graph-svg svg")
    expect(svg).to_be_visible()
    _check_graph_text(
        " ".join(svg.locator("g.node text").all_text_contents()),
        " ".join(svg.locator("g.edge text").all_text_contents()),
    )
    _shot(out, "graph_html")


def test_a_timeline_made_after_a_run_shows_it_and_no_static_fallback_is_used(page):
    snap = _cell_output(page, 11).locator(".pw-timeline")
    expect(snap).to_be_visible(timeout=120_000)
    quick = re.search(r"PWQUICK (\d+)", _cell_output(page, 5).inner_text()).group(1)
    expect(snap).to_have_attribute("data-events", quick)
    expect(snap.locator(".pw-tl-live")).to_be_hidden()
    expect(snap.locator(".pw-tl-legend")).to_contain_text("quick")
    assert page.locator(".pw-static:not(.pw-graph)").count() == 0  # JupyterLab shows the widgets, not fallbacks
    _shot(snap, "timeline_snapshot")


#: The README's widget pictures: (README file name, cell, what to shoot in its output), taken by each run of this
#: test from real JupyterLab; scripts/screenshots.sh takes them into the repository's docs/screenshots.
README_SHOTS = [
    ("mesh.png", 2, ".pw-mesh"),
    ("run.png", 6, ".pw-run"),
    ("timeline.png", 12, ".pw-timeline"),
    ("graph.png", 13, ".jp-OutputArea-output"),
]
#: Where they are written: git-ignored artifacts/ unless ``PW_SCREENSHOTS_DIR`` (relative to the repository, or
#: absolute) says otherwise, so running the suite changes no file in the checkout.
SCREENSHOTS = REPO / os.environ.get("PW_SCREENSHOTS_DIR", "artifacts/screenshots")


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG file, read from its header."""
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_the_readme_pictures_are_taken_from_these_widgets(page):
    readme = (REPO / "README.md").read_text()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for name, _, _ in README_SHOTS:  # a stale picture must not pass for a new one
        (SCREENSHOTS / name).unlink(missing_ok=True)
    expect(_cell_output(page, 6).locator(".pw-run")).to_have_attribute("data-state", "done", timeout=120_000)
    for name, cell, selector in README_SHOTS:
        assert f"docs/screenshots/{name}" in readme, f"README.md should show docs/screenshots/{name}"
        target = _cell_output(page, cell).locator(selector).first
        expect(target).to_be_visible(timeout=120_000)
        fit = target.get_by_role("button", name="fit")
        if fit.count():  # the whole graph (or timeline) in view
            fit.first.click()
        target.screenshot(path=str(SCREENSHOTS / name))
    # the timeline shows the whole finished run: 24 compute bars and its transfers
    tl = _cell_output(page, 12).locator(".pw-timeline")
    page.wait_for_function("(tl) => +tl.dataset.events > 48", arg=tl.element_handle(), timeout=30_000)
    expect(tl.locator(".pw-tl-legend")).to_contain_text("step")
    tl.screenshot(path=str(SCREENSHOTS / "timeline.png"))  # again, now that every bar is in
    for name, _, _ in README_SHOTS:
        width, height = _png_size(SCREENSHOTS / name)
        assert width >= 200 and height >= 60, (name, width, height)  # the widget, not an empty output


def test_what_a_newcomer_reads_in_jupyterlab(page):
    # the live timeline of the finished run: its axis starts at 0 ns, its legend explains every mark,
    # and back-to-back bars on a device are told apart
    tl = _cell_output(page, 12).locator(".pw-timeline")
    page.wait_for_function("(tl) => +tl.dataset.events > 48", arg=tl.element_handle(), timeout=30_000)
    assert tl.get_attribute("data-axis").split(" | ")[0] == "0 ns"
    legend = tl.locator(".pw-tl-legend").inner_text()
    for entry in ("host: compile, checkpoint", "transfer", "cross-island transfer"):
        assert entry in legend, legend
    # the run widget's mini timeline says what it shows and names its rows
    run = _cell_output(page, 6).locator(".pw-run")
    expect(run.locator(".pw-run-mini-caption")).to_contain_text("on each device over time")
    expect(run.locator(".pw-run-mini-labels")).to_contain_text("cpu:")
    # the program graph: outputs carry the names the program returns; wheel zooms, search finds nodes
    view = _cell_output(page, 13).locator(".pw-graph-view")
    expect(view).to_be_visible()
    texts = " ".join(view.locator("g.node text").all_text_contents())
    assert "y: float32[8]" in texts and "z: float32[8]" in texts, texts
    before = float(view.get_attribute("data-zoom"))
    view.locator(".pw-gv-viewport").hover()
    page.mouse.wheel(0, -400)
    page.wait_for_function(f"(v) => +v.dataset.zoom > {before}", arg=view.element_handle(), timeout=10_000)
    view.locator("input").fill("cross-island")
    page.wait_for_function("(v) => +v.dataset.hits === 2", arg=view.element_handle(), timeout=10_000)


def _run_new_cell(page: Page, code: str):
    """Add a cell below the last one, type ``code`` into it and run it, as a person does; its output area."""
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    n = cells.count()
    cells.last.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")  # command mode: a new cell below
    expect(cells).to_have_count(n + 1)
    cells.last.locator(".cm-content").click()
    page.keyboard.insert_text(code)
    page.keyboard.press("Shift+Enter")
    return _cell_output(page, n)


def test_a_profiles_timeline_shows_each_devices_xla_ops_under_its_nodes(page):
    # typed in after the notebook ran and the tests above read it (its live timelines would show these runs too)
    expect(_cell_output(page, 6).locator(".pw-run")).to_have_attribute("data-state", "done", timeout=120_000)
    out = _run_new_cell(
        page,
        'step_b = pw.compiled(lambda v: jnp.tanh(v @ v.T) @ v, slice=a, name="matmuls")\n'
        'vb = jax.device_put(jnp.ones((256, 256)) * 0.01, a.sharding("data", None))\n'
        "step_b(vb).result()\n"
        "with pw.profile() as prof:\n"
        "    step_b(vb).result()\n"
        "\n"
        "pw.timeline(prof)",
    )
    tl = out.locator(".pw-timeline")
    ops_lane = tl.locator(".pw-tl-lane-label[data-kind='ops']").first
    expect(ops_lane).to_contain_text("· XLA ops", timeout=120_000)
    labels = tl.locator(".pw-tl-lane-label").all_inner_texts()
    k = labels.index(ops_lane.inner_text())
    assert labels[k - 1] + " · XLA ops" == labels[k]  # right under its device's lane
    canvas = tl.locator("canvas")
    canvas.scroll_into_view_if_needed()
    cbox = canvas.bounding_box()
    lane = ops_lane.bounding_box()
    y = lane["y"] + lane["height"] / 2 - cbox["y"]
    tip = tl.locator(".pw-tip")
    for x in range(2, int(cbox["width"]) - 2, 3):  # along the ops lane, as a person would
        canvas.hover(position={"x": x, "y": y})
        if tip.is_visible() and "(op)" in tip.inner_text():
            break
    text = tip.inner_text()
    assert re.search(r"^\S+  \(op\)$", text, flags=re.M), text  # the op's name, its kind of event
    assert re.search(r"^run \d+ · jit_matmuls$", text, flags=re.M), text  # the HLO module: the node's executable
    assert re.search(r"^(fusion|op|copy|collective|custom-call) in matmuls$", text, flags=re.M), text
    _shot(tl, "profile_ops")


def test_no_widget_errors_in_the_console(page):
    # Run last (file order): every widget rendered without a JavaScript error.
    expect(_cell_output(page, 11).locator(".pw-timeline")).to_be_visible(timeout=120_000)
    ours = [e for e in page.errors if re.search(r"anywidget|pw-|timeline|mesh\.js|run\.js", e)]
    assert ours == []

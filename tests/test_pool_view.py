"""The whole pool in view: `pw.pool()`, the service's dashboard (`serve --dashboard PORT`) and `%pathways clients`.

The system tests start a service process with a dashboard on a free port and two client processes, "trainer"
and "evaluator", each running compiled calls on a slice of the service's two devices; this process then reads
the pool as a third client (`pw.pool()`), and opens the dashboard and the widget in headless Chromium, checking
what they show by their elements, not their pixels. The quick tests need no process: the pool record's rings stay
bounded, its shares add up, and `%pathways clients` is a table in a real IPython shell. Times appear only as hang
guards.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import jax.numpy as jnp
import pytest

import pw_kernel as pw
from pw_kernel.service.memory import Buffers
from pw_kernel.service.pool import PoolRecord, pool_data

HANG_S = 120  # a guard against hangs only
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PW_NUM_CPU_DEVICES": "8", "PW_VALIDATE": "0"}
system = pytest.mark.system

# A client ("a notebook"): connects under ARGS[0], runs a few compiled calls on a slice of ARGS[1] devices, keeps
# its last value (an array held in the service), says so, then stays connected until told to go.
CLIENT = """
import json, sys
import jax.numpy as jnp, numpy as np
import pw_kernel as pw
name, n, weight = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
pw.connect(sys.argv[4], name=name, weight=weight)
s = pw.slice(n, mesh={"d": n})
step = pw.compiled(lambda x: jnp.tanh(x @ x.T) @ x, slice=s)
y = jnp.ones((64, 64)) / 64
for _ in range(6):
    y = step(y)
total = float(np.asarray(y.result()).sum())
print(json.dumps({"ready": name, "total": total}), flush=True)
sys.stdin.readline()
pw.disconnect()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _written_by(path: Path, pid: int) -> bool:
    try:
        return json.loads(path.read_text())["pid"] == pid
    except (OSError, ValueError, KeyError):
        return False


@pytest.fixture(scope="module")
def pool_service(tmp_path_factory):
    """A service process of two devices with a dashboard, and two clients that ran and stay connected."""
    d = tmp_path_factory.mktemp("pool")
    path, port = d / "conn.json", _free_port()
    log = open(d / "service.log", "w")  # noqa: SIM115 - the service writes there as long as it runs
    svc = subprocess.Popen(
        [sys.executable, "-m", "pw_kernel", "serve", "--connection-file", str(path), "--devices", "2",
         "--dashboard", str(port), "--exit-with", str(os.getpid())],
        stdout=log, stderr=subprocess.STDOUT, env=ENV,
    )
    clients = []
    try:
        deadline = time.monotonic() + HANG_S
        while not _written_by(path, svc.pid):
            assert svc.poll() is None, (d / "service.log").read_text()
            assert time.monotonic() < deadline, "the service did not write its connection file"
            time.sleep(0.05)
        for name, n, weight in (("trainer", 2, 2.0), ("evaluator", 1, 1.0)):
            clients.append(subprocess.Popen(
                [sys.executable, "-c", CLIENT, name, str(n), str(weight), str(path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
            ))
        for c in clients:
            line = c.stdout.readline()  # (blocks until the client ran its calls; a failure closes its stdout)
            assert line, c.stderr.read()[-3000:]
            assert json.loads(line)["ready"]
        yield types.SimpleNamespace(path=str(path), port=port, log=d / "service.log")
    finally:
        for c in clients:
            if c.poll() is None:
                c.stdin.write("\n")
                c.stdin.flush()
        for c in clients:
            c.communicate(timeout=HANG_S)
        svc.send_signal(signal.SIGTERM)
        svc.wait(HANG_S)
        log.close()


@pytest.fixture(scope="module")
def observed(pool_service):
    """This process as a third client of the service: its `pw.pool()` widget, refreshed once."""
    pw.init(pw.Config(validate=False))
    pw.connect(pool_service.path, name="observer")
    widget = pw.pool(window_s=600)
    try:
        yield widget
    finally:
        widget.close()
        pw.disconnect()
        pw.shutdown()


def _by_name(data: dict) -> dict:
    return {c["name"]: c for c in data["clients"]}


@system
def test_the_pool_lists_both_clients_nodes_their_device_time_and_the_memory_they_hold(pool_service, observed):
    data = observed.refresh()
    clients = _by_name(data)
    assert {"trainer", "evaluator", "observer"} <= set(clients)
    assert clients["observer"]["you"] and not clients["trainer"]["you"]
    assert [d["id"] for d in data["devices"]] == [0, 1]
    spans = data["spans"]
    for name in ("trainer", "evaluator"):
        k = list(clients).index(name)
        mine = [i for i, c in enumerate(spans["client"]) if c == k]
        assert len(mine) >= 6, (name, len(mine))  # six calls each, on one or two devices
        assert sum(spans["end"][i] - spans["start"][i] for i in mine) > 0
        assert clients[name]["device_time_s"] > 0
        assert clients[name]["connected"] and clients[name]["queued"] == 0  # (all its runs finished)
    trainer_devices = {spans["device"][i] for i, c in enumerate(spans["client"]) if c == list(clients).index("trainer")}
    assert trainer_devices == {0, 1}
    assert clients["trainer"]["weight"] == 2.0 and clients["evaluator"]["weight"] == 1.0
    assert clients["trainer"]["memory_bytes"] > 0  # its last value (64 x 64 float32) and more stay in the service
    assert clients["trainer"]["colour"] != clients["evaluator"]["colour"]
    assert data["recorded"] >= len(spans["start"])
    json.dumps(data)  # (the dashboard serves it as it is)


def _dashboard_get(port: int, path: str, host: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if host is not None:
        req.add_header("Host", host)
    try:
        with urllib.request.urlopen(req, timeout=HANG_S) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@system
def test_the_dashboard_serves_the_same_data_and_only_to_this_host(pool_service):
    code, body = _dashboard_get(pool_service.port, "/pool.json?since=0")
    assert code == 200
    assert {"trainer", "evaluator"} <= set(_by_name(json.loads(body)))
    assert _dashboard_get(pool_service.port, "/pool.json", host=f"evil.example:{pool_service.port}")[0] == 403
    assert _dashboard_get(pool_service.port, "/pool.json?since=soon")[0] == 400
    assert "Dashboard: http://127.0.0.1:" in pool_service.log.read_text()  # (where `serve` said it is)


def _chromium():
    chromium = pytest.importorskip("chromium")
    if not chromium.available():
        pytest.skip(f"no Chromium at {chromium.CHROMIUM}")
    pytest.importorskip("playwright.sync_api", reason="pip install playwright (the browser is Debian's chromium)")
    return chromium


# The legend's clients with bars in view: {name: bars}, once both clients have some.
BOTH_DRAWN = """() => {
  const items = [...document.querySelectorAll('.pw-pool-client')];
  const bars = Object.fromEntries(items.map((e) => [e.dataset.client, Number(e.dataset.bars)]));
  return bars.trainer > 0 && bars.evaluator > 0 ? bars : null;
}"""


def _check_drawn(page) -> None:
    bars = page.wait_for_function(BOTH_DRAWN, timeout=HANG_S * 1000).json_value()
    assert bars["trainer"] >= 6 and bars["evaluator"] >= 6
    root = page.locator(".pw-pool")
    assert root.get_attribute("data-device-lanes") == "2"
    assert int(root.get_attribute("data-bars-in-view")) >= 12
    rows = page.locator("table.pw-pool-table tbody tr")
    assert {rows.nth(i).get_attribute("data-client") for i in range(rows.count())} >= {"trainer", "evaluator"}
    legend = page.locator('.pw-pool-client[data-client="trainer"]').inner_text()
    assert "trainer" in legend and "weight 2" in legend


@system
def test_the_dashboard_page_draws_both_clients_bars_in_chromium(pool_service):
    chromium = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium.CHROMIUM, headless=True, args=chromium.CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"http://127.0.0.1:{pool_service.port}/?window=600")
            _check_drawn(page)
            assert not page.locator(".pw-pool-error").inner_text()
            assert not errors, errors
        finally:
            browser.close()


@system
def test_the_pool_widget_draws_the_same_in_chromium(observed):
    chromium = _chromium()
    from pw_kernel.widgets.esm import esm_source
    from pw_kernel.widgets.pool import pool_css

    observed.refresh()
    state = {k: getattr(observed, k) for k in ("data", "palette", "window_s", "title", "live", "error")}
    with chromium.widget_page(pool_css()) as page:
        page.evaluate("async ([src, st]) => { window.w = await mount(src, st, '900px'); }", [esm_source("pool"), state])
        _check_drawn(page)
        assert "pool of the Pathways service" in observed.static_html()


# ------------------------------------------------------------------ quick: no process of its own
def test_the_pool_record_keeps_a_bounded_ring_and_its_shares_add_up():
    record = PoolRecord(epoch_ns=0, spans=1_000, sample_ns=1_000, samples=10)
    for k in range(50_000):  # device 0 always busy, alternately for two clients; device 1 idle
        record.add(0, k * 100, (k + 1) * 100, "a" if k % 2 else "b")
    assert len(record.spans) == 1_000 and record.recorded == 50_000
    assert record.spans[-1] == (0, 4_999_900, 5_000_000, "a")
    starts, shares = record.shares(now_ns=5_000_000)
    assert len(starts) == 10 and starts[-1] == 4_999_000  # the last whole windows only, as many as kept
    assert all(abs(a + b - 1.0) < 1e-9 for a, b in zip(shares["a"], shares["b"]))  # one device, busy throughout
    assert len(record.spans_since(-1_000)) == 11  # those that end in the last microsecond of activity
    record.add(0, 10_000_000, 10_000_100, "a")
    starts, shares = record.shares(now_ns=10_001_000)
    assert len(starts) == 10 and set(shares) == {"a"}  # windows left behind are forgotten ...
    assert len(record._windows) <= 10  # ... not only left out


def test_pool_data_counts_memory_queues_and_clients_gone():
    record = PoolRecord(epoch_ns=0)
    record.add(0, 1_000, 5_000, "alice")
    record.add(1, 2_000, 3_000, "bob")  # bob has gone: his bars stay, named
    x = jnp.zeros((256,), jnp.float32)
    buffers = Buffers()
    buffers.update({1: x, 2: x, 3: jnp.ones(8)})
    alice = types.SimpleNamespace(
        tenant="alice", weight=2.0, live={object(), object()}, buffers=buffers, memory=None,
        device_ns=4_000, runs=3, nodes=3, pid=11,
    )
    devices = [types.SimpleNamespace(id=0, platform="cpu"), types.SimpleNamespace(id=1, platform="cpu")]
    data = pool_data(record, [alice], devices, since_ns=0, you=alice)
    clients = _by_name(data)
    assert clients["alice"]["queued"] == 2 and clients["alice"]["you"]
    assert clients["alice"]["memory_bytes"] == 256 * 4 + 8 * 4  # x, under two handles, counted once
    buffers.pop(1)
    assert buffers.held.total == 256 * 4 + 8 * 4  # ... and held while a handle holds it
    buffers.pop(2)
    assert buffers.held.total == 8 * 4
    assert clients["bob"]["connected"] is False
    assert data["spans"]["client"] == [0, 1] and data["latest_ns"] == 5_000
    assert [d["label"] for d in data["devices"]] == ["cpu:0", "cpu:1"]
    json.dumps(data)


@pytest.fixture
def shell_and_service(tmp_path):
    pytest.importorskip("IPython")
    pytest.importorskip("zmq")
    from IPython.testing.globalipapp import get_ipython

    from pw_kernel.service.server import Service

    os.environ.setdefault("IPYTHONDIR", str(tmp_path / "ipython"))
    shell = get_ipython()
    types_before = shell.display_formatter.active_types
    shell.display_formatter.active_types = [*types_before, "text/html"]  # as a notebook front-end asks
    loaded = "pw_kernel" in shell.extension_manager.loaded
    if not loaded:
        shell.run_line_magic("load_ext", "pw_kernel")
    pw.init(pw.Config(validate=True))
    svc = Service(str(tmp_path / "svc.json"))
    try:
        yield shell, svc
    finally:
        pw.disconnect()
        svc.stop()
        pw.shutdown()
        shell.display_formatter.active_types = types_before
        if not loaded:
            shell.run_line_magic("unload_ext", "pw_kernel")


def test_pathways_clients_is_a_table_in_a_notebook_and_aligned_text_in_a_terminal(shell_and_service):
    from IPython.utils.capture import capture_output

    shell, svc = shell_and_service
    pw.connect(svc.path, name="<b>alice</b>", weight=2)
    with capture_output() as cap:
        result = shell.run_cell("%pathways clients", store_history=True)
    assert result.error_in_exec is None and result.error_before_exec is None
    assert "pw_kernel service clients" in cap.stdout  # (a terminal's shell prints the text)
    out, _ = shell.display_formatter.format(result.result)  # what a notebook's front-end is sent
    page = out["text/html"]
    assert "<table>" in page and "<th>client</th>" in page and "<th>weight</th>" in page
    assert "<td>&lt;b&gt;alice&lt;/b&gt;</td>" in page and "<b>alice</b>" not in page  # a name is text
    lines = out["text/plain"].splitlines()
    assert lines[0] == "pw_kernel service clients (1; * is this kernel):"
    header, row = lines[1], lines[2]
    assert row.startswith("*") and "<b>alice</b>" in row
    assert header.index("weight") == row.index("2 ")  # columns line up

"""Security: no network port is opened, user strings are escaped in every HTML rendering,
widget front-ends never evaluate strings from the kernel."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp

import pw_kernel as pw
from fresh_python import run_python

HOSTILE = "<img src=x onerror=alert(1)>"
SCRIPT = "<script>alert('pw')</script>"


def test_the_extension_opens_no_network_port():
    code = r"""
import os, psutil
from IPython.core.interactiveshell import InteractiveShell
me = psutil.Process(os.getpid())
def listening():
    return sorted((c.laddr.ip, c.laddr.port) for c in me.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN)
before = listening()
ip = InteractiveShell.instance()
for cell in [
    "%load_ext pw_kernel",
    "import jax.numpy as jnp, pw_kernel as pw\ns = pw.slice(2, name='s')\nf = pw.compiled(lambda x: x * 2, slice=s)\nv = jnp.ones(2)",
    "%%pathways --block --graph --timeline\ny = f(f(v))",
    "%pathways status",
    "%pathways timeline",
]:
    assert ip.run_cell(cell).success, cell
after = listening()
remote = [c for c in me.net_connections(kind="inet") if c.raddr]
print(before, after, len(remote))
assert after == before == [], (before, after)
assert remote == [], remote
"""
    run_python(code, timeout=180)


def hostile_run(ctl):
    s = pw.slice(1, name=HOSTILE)
    bad = pw.compiled(
        lambda x: jax.pure_callback(_raise_hostile, jax.ShapeDtypeStruct(x.shape, x.dtype), x), slice=s, name=SCRIPT
    )
    ok = pw.compiled(lambda x: x + 1, slice=s, name=HOSTILE)
    good = pw.program(lambda x: ok(x), name=HOSTILE).submit(jnp.ones(2), tenant=SCRIPT)
    failed = pw.program(lambda x: bad(x), name=SCRIPT).submit(jnp.ones(2), name=HOSTILE)
    good.wait(30)
    failed.wait(30)
    assert failed.state == "failed" and HOSTILE in str(failed.error)
    return good, failed


def _raise_hostile(x):
    raise ValueError(HOSTILE + SCRIPT)


def test_every_text_html_rendering_escapes_user_strings(ctl):
    from pw_kernel import widgets

    good, failed = hostile_run(ctl)
    c = pw.controller()
    views = {
        "run": widgets.run_view(failed, {HOSTILE: failed.futures}),
        "run-ok": widgets.run_view(good),
        "failure": widgets.failure_view(failed),
        "timeline": widgets.timeline_view(c.events.query(), title=HOSTILE),
        "status": widgets.status_view(c.status(), c.runs),
        "devices": widgets.devices_view(c.islands, c.resources.slices),
        "graph": widgets.graph_view(good.graph),
        "message": widgets.message_view(HOSTILE),
    }
    for name, view in views.items():
        html = view._repr_html_()
        assert HOSTILE not in html and SCRIPT not in html, name
        assert "<script" not in html.lower(), name
    assert "&lt;img src=x onerror=alert(1)&gt;" in views["failure"]._repr_html_()
    # the program graph's own HTML and its DOT source quote names safely
    assert HOSTILE not in good.graph._repr_html_()
    dot = good.graph.to_dot()
    assert '"' + HOSTILE.replace('"', '\\"') in dot or HOSTILE in dot  # a quoted DOT string, rendered as text


def test_the_chrome_trace_is_json_with_names_as_data(ctl, tmp_path):
    hostile_run(ctl)
    path = pw.controller().events.to_perfetto(tmp_path / "t.json")
    trace = json.loads(Path(path).read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert HOSTILE in names  # kept verbatim as a JSON string value, for Perfetto to show as text

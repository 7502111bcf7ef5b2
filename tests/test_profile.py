"""`pw.profile`: XLA's ops during a window, on pw's clock, inside the nodes they ran in."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw
from pw_kernel.runtime.profiling import KEEP_OWN_DIRS


def layer(p, x):
    return jnp.tanh(x @ p)


def profiled_pipeline_step(tmp_path):
    """A 2-stage 1F1B pipeline's second step (its first compiled everything), profiled."""
    s0, s1 = pw.slice(2, mesh={"data": 2}, name="s0"), pw.slice(2, mesh={"data": 2}, name="s1")
    pipe = pw.pipeline([layer, layer], [s0, s1], microbatches=2, schedule="1f1b")
    rng = np.random.default_rng(0)
    state = pipe.init([rng.normal(size=(32, 32)).astype(np.float32) * 0.1 for _ in range(2)])
    x = rng.normal(size=(8, 32)).astype(np.float32)
    y = np.zeros((8, 32), np.float32)
    state, loss = pipe.step(state, x, y)
    loss.result()
    with pw.profile(tmp_path / "trace") as prof:
        state, loss = pipe.step(state, x, y)
        loss.run.wait()  # the whole step: its updates run after the loss is known
    return prof, loss.run


def test_a_profiled_pipeline_step_has_each_stages_xla_ops_inside_its_nodes(ctl, tmp_path):
    prof, run = profiled_pipeline_step(tmp_path)
    compute = [ev for ev in prof.nodes if ev.kind == "compute" and ev.run_id == run.id]
    assert compute and prof.ops
    for node in compute:  # every stage's forward, backward and update ran XLA ops, each inside it
        ops = prof.ops_of(node)
        assert ops, f"no op inside {node.node}"
        for op in ops:
            assert node.start <= op.start <= op.end <= node.end and set(op.devices) <= set(node.devices)
            assert op.run_id == node.run_id and op.program.startswith("jit")
    kinds = {op.shapes.split(" in ")[0] for op in prof.ops}
    assert kinds & {"fusion", "op", "copy", "collective"}
    name, count, ms = prof.summary(1)[0]
    assert count >= 1 and ms > 0 and name == prof.summary()[0][0]
    assert re.match(r"<pw.Profile: \d+ nodes, \d+ XLA ops", repr(prof))
    assert list((tmp_path / "trace").rglob("*.xplane.pb"))  # TensorBoard's profile plugin reads the same folder


def test_the_exported_trace_nests_ops_in_nodes_on_one_clock(ctl, tmp_path):
    prof, _ = profiled_pipeline_step(tmp_path)
    trace = json.loads((tmp_path / "step.json").read_text()) if prof.export(tmp_path / "step.json") else None
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    nodes = [e for e in events if e["cat"] in ("compute", "glue", "transfer")]
    ops = [e for e in events if e["cat"] == "op"]
    assert nodes and ops
    nested = 0
    for op in ops:
        around = [n for n in nodes if (n["pid"], n["tid"]) == (op["pid"], op["tid"])
                  and n["ts"] <= op["ts"] and op["ts"] + op["dur"] <= n["ts"] + n["dur"] + 1e-3]
        nested += bool(around)
    assert nested == len(ops)  # every op on its device's track, inside a node (Perfetto draws it nested)


def test_the_timeline_of_a_profile_has_a_lane_of_ops_under_each_device(ctl, tmp_path):
    pytest.importorskip("anywidget")
    prof, _ = profiled_pipeline_step(tmp_path)
    tl = pw.timeline(prof)
    kinds = [lane["kind"] for lane in tl.lanes]
    assert "ops" in kinds
    page = tl.static_html()
    for dev in {d for op in prof.ops for d in op.devices}:
        label = next(lane["label"] for lane in tl.lanes if lane["kind"] == "ops" and lane["device"] == dev)
        assert label.endswith(" · XLA ops") and label in page


def test_profile_says_what_it_takes(ctl):
    with pytest.raises(pw.ArgumentError, match=r"`pw.profile\(logdir=...\)` takes a folder path or None; got int"):
        pw.profile(3)
    prof = pw.profile()
    with prof:
        pass
    assert prof.ops == [] or all(op.run_id == -1 for op in prof.ops)
    with pytest.raises(pw.ArgumentError, match="a node's name or a NodeEvent"):
        prof.ops_of(3)
    with pw.profile():
        with pytest.raises(pw.PathwaysError, match=r"JAX's profiler is already tracing"):
            pw.profile().__enter__()
    with pytest.raises(ZeroDivisionError), pw.profile():  # the block's own error comes out, not the profile's
        1 / 0


def test_a_profile_in_a_loop_keeps_a_few_temporary_folders_and_none_after_exit(tmp_path):
    # A notebook that profiles every 100th step of a long run: JAX's trace is a few MiB a window.
    script = tmp_path / "loop.py"
    script.write_text(
        "import os, pw_kernel as pw\n"
        "from pw_kernel.runtime import profiling\n"
        "seen = []\n"
        "for _ in range(profiling.KEEP_OWN_DIRS + 3):\n"
        "    with pw.profile() as prof:\n"
        "        pass\n"
        "    seen.append(prof.logdir)\n"
        "print(repr(seen))\n"
        "print(repr([p for p in seen if os.path.isdir(p)]))\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PW_NUM_CPU_DEVICES": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    seen, kept = (eval(line) for line in out.stdout.strip().splitlines()[-2:])
    assert len(set(seen)) == KEEP_OWN_DIRS + 3
    assert kept == seen[-KEEP_OWN_DIRS:]  # the newest, for TensorBoard, while the process lives
    assert not [p for p in seen if os.path.exists(p)]  # and none once it has exited

"""Island logs in the cell: what a stage prints on a Ray island shows in the cell that submitted its run.

A real "Python 3 (Pathways)" kernel (jupyter_client, as in test_kernel.py) joins the test session's
Ray cluster and adds one island; the stage's `jax.debug.print` runs there, after its cell has
finished and while another cell runs, and its line must land in the first cell's output.
"""

from __future__ import annotations

import pytest

pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")
ray = pytest.importorskip("ray")

from test_kernel import Kernel, install, kernel_env  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

SETUP = """
import os, time
import jax, jax.numpy as jnp, numpy as np, ray
import pw_kernel as pw

(isl,) = pw.add_ray_islands({address!r}, count=1, devices_per_island=1)
GO = {go!r}

def wait_for_go(x):  # holds the node on the island until the test's later cell says go (a hang guard: 60 s)
    deadline = time.monotonic() + 60
    while not os.path.exists(GO) and time.monotonic() < deadline:
        time.sleep(0.01)
    return x

def stage(x):
    y = jax.pure_callback(wait_for_go, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    jax.debug.print("stage saw {{}}", y.sum())
    return y * 2

loud = pw.compiled(stage, slice=pw.slice(1, island=isl.id, name="far"), name="loud")
"""


@pytest.fixture
def kernel(ray_cluster, tmp_path_factory):
    prefix = tmp_path_factory.mktemp("jupyter")
    proc = install(prefix)
    assert proc.returncode == 0, proc.stderr
    k = Kernel(prefix / "share" / "jupyter" / "kernels", "pathways", kernel_env(tmp_path_factory.mktemp("kernel")))
    yield k
    try:
        k.execute("actor = isl.remote.actor\npw.shutdown()\nray.kill(actor)", timeout=60)
    finally:
        k.shutdown()


def stream_text(messages: list[dict]) -> str:
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")


def test_a_remote_stage_print_appears_in_the_cell_that_submitted_its_run_marked_with_the_island(kernel, tmp_path):
    address = ray.get_runtime_context().gcs_address
    go = tmp_path / "go"
    kernel.run(SETUP.format(address=address, go=str(go)), timeout=180)
    island = kernel.run("print(isl.id)").stdout.strip()
    submitted = kernel.run("y = loud(jnp.arange(4.0))")  # returns at once: the node waits on the island
    assert "stage saw" not in submitted.stdout
    later = kernel.submit(f"open({str(go)!r}, 'w').close()\nprint(np.asarray(y.result(timeout=120)))")
    reply = kernel.finish(later, timeout=120)
    assert reply.status == "ok", reply.traceback
    assert "[0. 2. 4. 6.]" in reply.stdout
    first = submitted.messages[0]["parent_header"]["msg_id"]
    line = kernel.wait_for(
        lambda m: m["msg_type"] == "stream" and m["parent_header"].get("msg_id") == first, timeout=60
    )
    assert line["content"] == {"name": "stdout", "text": f"[island {island}] stage saw 6.0\n"}
    assert "stage saw" not in stream_text(reply.messages)  # not in the cell running when it came

"""The tutorial notebooks, executed top to bottom on the "Python 3 (Pathways)" kernel; any error fails.

Each runs twice: on the default 8 simulated devices, and as a one-GPU host sees it
(``PW_NUM_CPU_DEVICES=1`` in the environment that starts the kernel), where a cell asking JAX for
its devices sees one. No test asserts how long a notebook takes (the machines are shared): a
generous timeout per cell only guards against a hang. The stored notebooks carry no outputs, so
the repository never holds stale results.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from jupyter_client import KernelManager  # noqa: E402
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from conftest import SUITE_XLA_FLAGS  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
TUTORIALS = [
    "01_quickstart.ipynb",
    "02_meshes_and_sharding.ipynb",
    "03_async_dataflow.ipynb",
    "04_pipelines.ipynb",
    "05_multi_tenancy.ipynb",
    "06_palm_pipeline.ipynb",
    "07_checkpoint_resume.ipynb",
    "08_flax_and_inside_a_run.ipynb",
    "09_one_pool_many_notebooks.ipynb",
    "10_one_pool_across_hosts.ipynb",
]
CELL_TIMEOUT_S = 300  # a hang guard, not a speed test (the slowest cell takes ~30 s here)
IOPUB_TIMEOUT_S = 120  # how long a cell's outputs may trail its reply (a hang guard too)
#: The last cell, added while executing: what JAX in the kernel sees.
PROBE = "import jax as _jax; print(f'devices in this kernel: {len(_jax.devices())}')"  # (one write: one stream message)

pytestmark = pytest.mark.timeout(1200)  # kernel start-up (up to 90 s) plus the notebook, guarding a hang


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory) -> Path:
    prefix = tmp_path_factory.mktemp("jupyter")
    proc = subprocess.run(
        [sys.executable, "-m", "pw_kernel", "install", "--prefix", str(prefix)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return prefix / "share" / "jupyter" / "kernels"


_executed: dict[tuple[Path, int | None], object] = {}


def execute(path: Path, kernel_dir: Path, tmp_path: Path, devices: int | None = None):
    """The notebook with its outputs, executed once per test session (``devices``: PW_NUM_CPU_DEVICES, if set)."""
    if (path, devices) not in _executed:
        _executed[path, devices] = _execute(path, kernel_dir, tmp_path, devices)
    return _executed[path, devices]


def _execute(path: Path, kernel_dir: Path, tmp_path: Path, devices: int | None):
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PW_", "JAX_", "XLA_"))}
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = SUITE_XLA_FLAGS  # (how it compiles: no device count)
    env["IPYTHONDIR"] = str(tmp_path / "ipython")
    if devices is not None:  # the environment that starts Jupyter, as a user sets it
        env["PW_NUM_CPU_DEVICES"] = str(devices)
    km = KernelManager(kernel_name="pathways", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]))
    client = nbclient.NotebookClient(
        nb,
        km=km,
        timeout=CELL_TIMEOUT_S,
        startup_timeout=90,
        # nbclient waits 4 s after a cell's reply for its outputs, then drops them without an error: on a loaded
        # CI machine a cell's print went missing that way. Wait as a browser would, and say so if it is ever lost.
        iopub_timeout=IOPUB_TIMEOUT_S,
        raise_on_iopub_timeout=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    try:
        client.execute(env=env)  # the kernel's environment: otherwise the kernelspec supplies the devices
    except (nbclient.exceptions.CellTimeoutError, nbclient.exceptions.DeadKernelError) as e:
        raise AssertionError(f"{path.name}: {e}\n{kernel_stacks(km)}") from e
    finally:
        if km.has_kernel:  # a kernel manager we made is ours to stop (nbclient leaves one it was given running)
            km.shutdown_kernel(now=True)
    seen = outputs_text(nb.cells.pop())
    assert f"devices in this kernel: {devices or 8}" in seen, seen
    return nb


def kernel_stacks(km) -> str:
    """Where a hung kernel's threads (and its child processes') are, as py-spy sees them: what a cell's
    timeout reports, so that a hang on a CI machine says where it hung."""
    spy = shutil.which("py-spy", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    proc = getattr(km.provisioner, "process", None) if km.has_kernel else None
    if spy is None or proc is None:
        return "(no stacks: py-spy is not installed, or the kernel is gone)"
    import psutil

    try:
        pids = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        return "(no stacks: the kernel is gone)"
    out = []
    for pid in pids:
        try:
            dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
            out.append(f"--- pid {pid}\n{dump.stdout}{dump.stderr}")
        except (OSError, subprocess.SubprocessError) as e:
            out.append(f"--- pid {pid}: py-spy failed: {e}")
    return "\n".join(out)


def outputs_text(cell) -> str:
    """A cell's outputs as a reader sees them: a stream's consecutive outputs run together, the rest a line each.

    The kernel flushes a stream on a timer, so one `print` can arrive as two outputs (ipykernel's flush
    thread ran between its writes); JupyterLab shows them as one, and a newline between them would break
    the line the assertions look for in two (seen: "restored step" and " 35 | stage 3's params: ...").
    """
    parts: list[list] = []  # [stream name or None, text]
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            if parts and parts[-1][0] == out["name"]:
                parts[-1][1] += out["text"]
            else:
                parts.append([out["name"], out["text"]])
        elif "data" in out:
            parts.append([None, out["data"].get("text/plain", "")])
            parts.append([None, out["data"].get("text/html", "")])
    return "\n".join(text for _, text in parts)


def by_first_line(nb) -> dict[str, str]:
    """Each code cell's outputs as text, keyed by the cell's first source line."""
    return {cell.source.splitlines()[0]: outputs_text(cell) for cell in nb.cells if cell.cell_type == "code"}


def outputs_report(nb) -> str:
    """Each code cell's first line, its outputs' kinds and first words, and when its reply and idle came: what an
    assertion on the outputs prints when a line is missing (was the cell run, did its output arrive, under which)."""
    rows = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        ex = cell.metadata.get("execution", {})
        outs = [f"{o['output_type']}: {outputs_text({'outputs': [o]})[:60]!r}" for o in cell.get("outputs", [])]
        rows.append(f"{cell.source.splitlines()[0][:50]!r} reply {ex.get('shell.execute_reply')} idle "
                    f"{ex.get('iopub.status.idle')}: {outs}")
    return "\n".join(rows)


def test_every_tutorial_is_there():
    # tutorials are numbered; a notebook of the user's own saved beside them (Untitled.ipynb) is not one
    assert sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")) == TUTORIALS


@pytest.mark.parametrize("name", TUTORIALS)
def test_notebook_is_stored_clean(name):
    """No outputs or execution counts (nothing stale), the Pathways kernel, and the paper cited."""
    raw = json.loads((NOTEBOOKS / name).read_text())
    assert raw["metadata"]["kernelspec"]["name"] == "pathways"
    code = [c for c in raw["cells"] if c["cell_type"] == "code"]
    clear = "strip them: .venv/bin/python scripts/run_notebooks.py --clear"
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code), f"outputs stored; {clear}"
    assert "widgets" not in raw["metadata"], f"widget state stored; {clear}"
    assert "".join(code[0]["source"]).strip() == "%load_ext pw_kernel"
    prose = "".join("".join(c["source"]) for c in raw["cells"] if c["cell_type"] == "markdown")
    assert re.search(r"§[2-5]", prose), "each notebook names the sections of the Pathways paper it teaches"


@pytest.mark.parametrize("devices", [None, 1], ids=["8 devices", "1 device"])
@pytest.mark.parametrize("name", TUTORIALS)
def test_notebook_runs_without_errors(name, devices, kernel_dir, tmp_path):
    nb = execute(NOTEBOOKS / name, kernel_dir, tmp_path, devices)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not any(o["output_type"] == "error" for o in cell.outputs), outputs_text(cell)
            # Nor an error logged on the side: an exception in a thread, or one Ray found nobody read
            stderr = "".join(o["text"] for o in cell.outputs if o.get("name") == "stderr")
            assert not re.search(r"Traceback|Unhandled error|Exception in thread", stderr), stderr[-3000:]


def test_quickstart_shows_futures_results_graph_and_status(kernel_dir, tmp_path):
    nb = execute(NOTEBOOKS / "01_quickstart.ipynb", kernel_dir, tmp_path)
    by_source = by_first_line(nb)
    assert "Island(id=0, platform='cpu', devices=[0,1,2,3,4,5,6,7])" in by_source["import jax"]
    assert "run 0 'f'" in by_source["%%pathways --name f"]
    assert re.search(r"\(2,\),\s+dtype\('float32'\),\s+NamedSharding", by_source["y.shape, y.dtype, y.sharding"])
    got = by_source["pw.get((y, z))   # ([3., 5.], [2., 4.])"]
    assert "Array([3., 5.], dtype=float32), Array([2., 4.], dtype=float32)" in got
    block = by_source["%%pathways --block --graph"]
    assert "Array([120., 200.], dtype=float32)" in block and "ProgramGraph" in block
    assert "runs: 2 done" in by_source["%pathways status"]
    assert "ProgramGraph 'f'" in by_source["%pathways graph f"]
    live = by_source["%%pathways --name layers --mode chained --timeline --out run"]
    assert "run 2 'layers'" in live and "TimelineWidget('timeline of run 2'" in live
    assert "RunWidget(run 2 'layers': done, 8/8 nodes" in by_source["from pw_kernel.widgets import RunWidget"]
    assert "TimelineWidget('timeline'" in by_source["tl = pw.timeline()"]
    trace = by_source["import getpass"]  # (the temp folder is every user's on a shared host: this user's own name)
    assert "Chrome trace written to" in trace and f"pw_quickstart_trace-{getpass.getuser()}.json" in trace, trace


def test_what_a_tutorial_leaves_in_the_temp_folder_is_named_for_its_user():
    """The temp folder is every user's on a shared host (a group's GPU box, one pool): a fixed name there that
    one user's run made stops the next user's (PermissionError; tutorial 07's checkpoints are kept at a fixed
    place so that a restarted kernel finds them), so each such name carries the user's."""
    for name in TUTORIALS:
        for cell in nbformat.read(NOTEBOOKS / name, as_version=4).cells:
            for line in cell.source.splitlines():
                if "gettempdir()" in line:
                    assert "getpass.getuser()" in line, f"{name}: {line.strip()}"


def test_meshes_notebook_shows_shardings_and_transfers(kernel_dir, tmp_path):
    text = "\n".join(by_first_line(execute(NOTEBOOKS / "02_meshes_and_sharding.ipynb", kernel_dir, tmp_path)).values())
    assert "P(('data', 'model'), None)" in text and "both layouts compute x @ w" in text
    assert "transfer dp->mp" in text and "reshard dp->dp" in text
    assert re.search(r"\(2048, 2048\)\s+16\s", text)  # the cost table reached the largest size
    assert "('transfer left->right', 'transfer', True)" in text  # the hop between islands


def test_async_notebook_measures_dispatch_and_handles_failures(kernel_dir, tmp_path):
    text = "\n".join(by_first_line(execute(NOTEBOOKS / "03_async_dataflow.ipynb", kernel_dir, tmp_path)).values())
    for row in ("JAX op-by-op", "pw op-by-op, wait each", "pw chained", "pw fused"):
        assert re.search(rf"{re.escape(row)}\s+[\d.]+\s+[\d.]+x", text), row
    assert "nodes were dispatched before their predecessor ended" in text
    assert "bad: NodeError in node 'require_finite'" in text and "after_bad: InputFailedError" in text
    assert "TracingError" in text and "CancelledError" in text


def test_pipelines_notebook_matches_the_unpipelined_model(kernel_dir, tmp_path):
    text = "\n".join(by_first_line(execute(NOTEBOOKS / "04_pipelines.ipynb", kernel_dir, tmp_path)).values())
    assert text.count("gradients match") == 2
    assert "1f1b" in text and "[4, 3, 2, 1] / [4, 3, 2, 1]" in text  # 1F1B's live activations, measured
    assert "25 steps submitted in" in text


def test_palm_notebook_trains_a_language_model_pipelined(kernel_dir, tmp_path):
    nb = execute(NOTEBOOKS / "06_palm_pipeline.ipynb", kernel_dir, tmp_path)
    text = "\n".join(by_first_line(nb).values())
    assert "all gradients match" in text and "copies equal: True" in text, outputs_report(nb)
    assert "20 steps in" in text and "largest relative difference over 20 steps" in text
    fed = re.search(r"^(\d+) batches taken, (\d+) placed ahead; (\d+) of them placed while the devices computed", text, re.M)
    assert fed and int(fed[1]) == 20 and int(fed[3]) > 0, text[-2000:]  # grain through pw.prefetch, overlapping
    assert "input: load" in text and "host → island 0" in text  # the timeline's input and transfer lanes
    for name, theory in (("1F1B", "0.429"), ("interleaved v=2", "0.273"), ("ZB-H1", "0.200")):
        assert re.search(rf"{re.escape(name)}\s+bubble: theory {theory}, ideal devices {theory}", text), name
    assert "remat=False (keeps residuals)" in text
    assert "bubble ideal" in text  # the pipeline view's table
    samples = re.findall(r"^'(Beautiful is|Errors should|Now is better)[^\n]*'$", text, re.M)
    assert len(samples) == 3, text[-600:]


def test_multi_tenancy_notebook_measures_shares(kernel_dir, tmp_path):
    text = "\n".join(by_first_line(execute(NOTEBOOKS / "05_multi_tenancy.ipynb", kernel_dir, tmp_path)).values())
    assert "Jain's fairness index with equal weights" in text
    assert "all finished" in text and "shared devices: [0, 1]" in text
    assert "interactive (D): 2 nodes" in text


def test_checkpoint_notebook_resumes_on_another_layout_and_outlives_a_lost_island(kernel_dir, tmp_path):
    text = "\n".join(by_first_line(execute(NOTEBOOKS / "07_checkpoint_resume.ipynb", kernel_dir, tmp_path)).values())
    assert "checkpoints kept: [25, 30, 35]" in text and "restore will start at step 35" in text
    restored = "restored step 35 | stage 3's params: P(None, 'model') on devices [4, 5, 6, 7]"
    assert restored in text, [t for t in text.splitlines() if t.startswith(("restored", "its AdamW", "restore will"))]
    diff = re.search(r"steps 36-39 after the restart: largest relative difference from the uninterrupted run (\S+)",
                     text)
    assert diff is not None and float(diff.group(1)) < 1e-5, text[-600:]
    if "Ray is not installed" not in text:
        # The loss is named wherever it was seen first: the failed node, or a later call on the island (`fetch`: ...).
        assert re.search(r"trained to step 19 after 1 retry: IslandLostError: (`\w+`: )?island 1 ", text), text[-600:]
        assert "lost))" in text and "checkpoints: [0, 5, 10, 15]" in text  # the island says so; saves went on
        # the island wrote its stage's leaves itself; after it was lost, everything is local
        assert "step 5 (stage 1 on the island): ['data', 'island_0', 'state'] | step 15 (all local): ['data', 'state']" in text


def test_checkpoint_notebook_resumes_in_a_fresh_kernel(kernel_dir, tmp_path):
    """Section 2 of tutorial 07, alone in a new kernel after the whole notebook ran: a real restart."""
    execute(NOTEBOOKS / "07_checkpoint_resume.ipynb", kernel_dir, tmp_path)  # trains and saves (once per session)
    nb = nbformat.read(NOTEBOOKS / "07_checkpoint_resume.ipynb", as_version=4)
    start = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("## 2."))
    end = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("## 3."))
    nb.cells = nb.cells[start:end]
    path = tmp_path / "07_after_restart.ipynb"
    nbformat.write(nb, path)
    text = "\n".join(by_first_line(_execute(path, kernel_dir, tmp_path, None)).values())
    restored = "restored step 35 | stage 3's params: P(None, 'model') on devices [4, 5, 6, 7]"
    assert restored in text, [t for t in text.splitlines() if t.startswith(("restored", "its AdamW", "restore will"))]
    diff = re.search(r"largest relative difference from the uninterrupted run (\S+)", text)
    assert diff is not None and float(diff.group(1)) < 1e-5, text[-600:]

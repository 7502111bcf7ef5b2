"""The tutorial notebooks, executed top to bottom on the "Python 3 (Pathways)" kernel; any error fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from jupyter_client import KernelManager  # noqa: E402
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

pytestmark = pytest.mark.timeout(240)


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


_executed: dict[Path, object] = {}


def execute(path: Path, kernel_dir: Path, tmp_path: Path):
    """The notebook with its outputs, executed once per test session."""
    if path not in _executed:
        _executed[path] = _execute(path, kernel_dir, tmp_path)
    return _executed[path]


def _execute(path: Path, kernel_dir: Path, tmp_path: Path):
    nb = nbformat.read(path, as_version=4)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PW_", "JAX_", "XLA_"))}
    env["JAX_PLATFORMS"] = "cpu"
    env["IPYTHONDIR"] = str(tmp_path / "ipython")
    km = KernelManager(kernel_name="pathways", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]))
    client = nbclient.NotebookClient(
        nb, km=km, timeout=120, startup_timeout=90, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute(env=env)  # the kernel's environment: the kernelspec must supply the devices
    return nb


def outputs_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
            parts.append(out["data"].get("text/html", ""))
    return "\n".join(parts)


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_runs_without_errors(path, kernel_dir, tmp_path):
    nb = execute(path, kernel_dir, tmp_path)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not any(o["output_type"] == "error" for o in cell.outputs), outputs_text(cell)


def test_quickstart_shows_futures_results_graph_and_status(kernel_dir, tmp_path):
    nb = execute(NOTEBOOKS / "01_quickstart.ipynb", kernel_dir, tmp_path)
    by_source = {cell.source.splitlines()[0]: outputs_text(cell) for cell in nb.cells if cell.cell_type == "code"}
    assert "Island(id=0, platform='cpu', devices=[0,1,2,3,4,5,6,7])" in by_source["import jax"]
    assert "run 0 'f'" in by_source["%%pathways --name f"]
    assert re.search(r"\(2,\),\s+dtype\('float32'\),\s+NamedSharding", by_source["y.shape, y.dtype, y.sharding"])
    got = by_source["pw.get((y, z))   # ([3., 5.], [2., 4.])"]
    assert "Array([3., 5.], dtype=float32), Array([2., 4.], dtype=float32)" in got
    block = by_source["%%pathways --block --graph"]
    assert "Array([120., 200.], dtype=float32)" in block and "ProgramGraph" in block
    assert "runs: 2 done" in by_source["%pathways status"]
    assert "ProgramGraph 'f'" in by_source["%pathways graph f"]

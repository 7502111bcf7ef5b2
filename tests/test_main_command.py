"""The README's main command, `./scripts/run.sh`, as a new user meets it: JupyterLab on the tutorials.

It serves the user's own copies of the tutorials with the "Python 3 (Pathways)" kernel as the
one each notebook asks for and the default for new ones, and saving a notebook with its outputs
(what autosave does) leaves the checkout clean.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("jupyterlab")

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str, data: dict | None = None, method: str = "GET"):
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def _git_status(path: str) -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--", path], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


def test_run_sh_opens_copies_of_the_tutorials_in_the_pathways_kernel_and_leaves_the_checkout_clean(tmp_path):
    home, ws = tmp_path / "home", tmp_path / "workspace"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PW_", "JAX_", "XLA_", "JUPYTER"))}
    env.update(
        HOME=str(home), PW_WORKSPACE=str(ws), JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "lab-workspaces"), IPYTHONDIR=str(home / "ipython"),
    )
    token, port = secrets.token_hex(16), _free_port()
    args = ["--no-browser", "--ServerApp.ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}"]
    before = _git_status("notebooks")
    log = open(tmp_path / "run.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(["./scripts/run.sh", *args], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # set-up checks, the kernel install, JupyterLab's start
        while True:
            assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            try:
                specs = _get(f"{base}/api/kernelspecs", token)
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "run.log").read_text()[-3000:]
                time.sleep(1)
        tutorials = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
        listed = sorted(c["name"] for c in _get(f"{base}/api/contents", token)["content"] if c["type"] == "notebook")
        assert listed == tutorials and sorted(p.name for p in ws.glob("*.ipynb")) == tutorials
        # The kernel each tutorial asks for is there (JupyterLab asks "Select Kernel" only when it is not),
        # and new notebooks get it too.
        assert specs["default"] == "pathways" and "pathways" in specs["kernelspecs"]
        for name in tutorials:
            nb = _get(f"{base}/api/contents/{name}", token)["content"]
            assert nb["metadata"]["kernelspec"]["name"] == "pathways", name
        # What autosave does after a cell ran: the notebook written back with an output.
        nb = _get(f"{base}/api/contents/{tutorials[0]}", token)["content"]
        cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
        cell["execution_count"] = 1
        _get(f"{base}/api/contents/{tutorials[0]}", token, {"type": "notebook", "content": nb}, "PUT")
        assert '"ran\\n"' in (ws / tutorials[0]).read_text()
        assert _git_status("notebooks") == before  # the tracked tutorials are untouched
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()

"""The README's main command, `./scripts/run.sh`, as a new user meets it: JupyterLab on the tutorials.

The command runs exactly as the README writes it (`./scripts/run.sh --no-browser --port N`, no
variables of ours), as root and as an ordinary user, in a checkout of its own (the scripts and
tutorials copied, the environment shared), so the default `workspace/` is the one made. It serves
the user's copies of the tutorials with the "Python 3 (Pathways)" kernel as the one each notebook
asks for and the default for new ones, and saving a notebook with its outputs (what autosave does)
leaves the tracked tutorials clean.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
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


def _checkout(user: str | None) -> Path:
    """A checkout of the repository as a user has one: scripts and tutorials, the environment set up."""
    root = Path(tempfile.mkdtemp(prefix="pw-checkout-"))
    root.chmod(0o755)  # (an ordinary user reaches it)
    for d in ("scripts", "notebooks"):
        shutil.copytree(REPO / d, root / d)
    for f in (".venv", "pyproject.toml", "pw_kernel", "README.md"):
        (root / f).symlink_to(REPO / f)
    (root / "home").mkdir()
    if user is not None:
        shutil.chown(root, user)
        for p in root.rglob("*"):
            if not p.is_symlink():
                shutil.chown(p, user)
    return root


AS = [pytest.param(None, id="as-root" if os.geteuid() == 0 else "as-this-user")]
# An ordinary user runs the environment's programs only where every folder above the checkout lets
# others through (a clone inside a private temporary folder does not: jupyter then finds no `lab`).
_REACHABLE = all(os.stat(p).st_mode & 0o001 for p in (REPO, *REPO.parents))
if os.geteuid() == 0:
    AS.append(pytest.param("nobody", id="as-an-ordinary-user", marks=pytest.mark.skipif(
        not _REACHABLE, reason=f"{REPO} sits in a folder other users cannot enter")))


@pytest.fixture
def environment_kernel():
    """The kernelspec in the shared environment, put back afterwards: run.sh in the checkout writes its own
    there (naming the checkout's path to the environment, which goes with the checkout)."""
    where = REPO / ".venv" / "share" / "jupyter" / "kernels" / "pathways"
    saved = {p.name: p.read_bytes() for p in where.iterdir()} if where.is_dir() else None
    yield
    if saved is None:
        shutil.rmtree(where, ignore_errors=True)
        return
    where.mkdir(parents=True, exist_ok=True)
    for p in where.iterdir():
        if p.name not in saved:
            p.unlink()
    for name, data in saved.items():
        (where / name).write_bytes(data)


@pytest.mark.parametrize("user", AS)
def test_run_sh_as_the_readme_writes_it_opens_copies_of_the_tutorials_in_the_pathways_kernel(user, environment_kernel):
    root = _checkout(user)
    home, ws = root / "home", root / "workspace"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PW_", "JAX_", "XLA_", "JUPYTER", "IPYTHON", "XDG_"))}
    env.update(HOME=str(home))
    port = _free_port()
    cmd = ["./scripts/run.sh", "--no-browser", "--port", str(port)]  # the README's words
    if user is not None:
        # An ordinary uid; it may read what root installed (the environment's interpreter can live in
        # root's home), and nothing more: JupyterLab and run.sh see a user who is not root.
        uid = pwd.getpwnam(user).pw_uid
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={pwd.getpwnam(user).pw_gid}", "--clear-groups",
               "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", "--", *cmd]
    log_path = root / "run.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240  # set-up checks, the kernel install, JupyterLab's start
        while True:
            text = log_path.read_text()
            assert proc.poll() is None, text[-3000:]
            m = re.search(r"http://(?:localhost|127\.0\.0\.1):(\d+)/lab\?token=([0-9a-f]+)", text)
            if m:
                base, token = f"http://127.0.0.1:{m.group(1)}", m.group(2)
                try:
                    specs = _get(f"{base}/api/kernelspecs", token)
                    break
                except OSError:
                    pass
            assert time.monotonic() < deadline, text[-3000:]
            time.sleep(1)
        assert m.group(1) == str(port), text[-3000:]
        assert "One of export, import or list" not in text and "unrecognized arguments" not in text
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
        assert (root / "notebooks" / tutorials[0]).read_bytes() == (REPO / "notebooks" / tutorials[0]).read_bytes()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(root, ignore_errors=True)

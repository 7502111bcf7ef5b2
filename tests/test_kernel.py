"""The "Python 3 (Pathways)" kernel, through a real Jupyter kernel process and jupyter_client.

Every call has a timeout; kernels are installed into a temporary directory.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import cells
import pytest

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

from jupyter_client import KernelManager  # noqa: E402
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from conftest import SUITE_XLA_FLAGS  # noqa: E402

pytestmark = pytest.mark.timeout(180)

#: A traceback frame (as IPython shows them) inside pw_kernel or JAX rather than the user's code.
RUNTIME_FRAME = re.compile(r"(pw_kernel|jax)/\S+\.py:\d+")
ANSI = re.compile(r"\x1b\[[0-9;]*m")

GATED = (
    """
import jax.numpy as jnp
import pw_kernel as pw

s = pw.slice(2, name="s")
b = pw.compiled(lambda x: x + 1, slice=s, name="b")
v = jnp.array([1.0, 2.0])
"""
    + cells.GATED
)


def kernel_env(tmp: Path) -> dict[str, str]:
    """The test process's environment without its device settings: the kernelspec must provide them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PW_", "JAX_", "XLA_"))}
    env["JAX_PLATFORMS"] = "cpu"  # these tests are about simulated CPU devices, also on a GPU machine
    env["XLA_FLAGS"] = SUITE_XLA_FLAGS  # (how it compiles: no device count)
    env["IPYTHONDIR"] = str(tmp / "ipython")
    return env


def install(prefix: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pw_kernel", "install", "--prefix", str(prefix), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


class Reply:
    """What one execute request produced."""

    def __init__(self, reply: dict, messages: list[dict]):
        self.status = reply["content"]["status"]
        self.ename = reply["content"].get("ename")
        self.traceback = ANSI.sub("", "\n".join(reply["content"].get("traceback", [])))
        self.messages = messages
        streams = [m["content"] for m in messages if m["msg_type"] == "stream"]
        self.stdout = "".join(s["text"] for s in streams if s["name"] == "stdout")
        self.stderr = "".join(s["text"] for s in streams if s["name"] == "stderr")
        data = [m["content"]["data"] for m in messages if m["msg_type"] in ("display_data", "execute_result")]
        self.text = self.stdout + "\n".join(d.get("text/plain", "") for d in data)
        self.html = "\n".join(d.get("text/html", "") for d in data)


class Kernel:
    """A running kernel and a client that keeps IOPub messages it has not been asked about yet."""

    def __init__(self, kernel_dir: Path, name: str, env: dict[str, str]):
        self.km = KernelManager(kernel_name=name, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]))
        self.km.start_kernel(env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=90)
        self.backlog: list[dict] = []

    def _messages(self, deadline: float):
        while self.backlog:
            yield self.backlog.pop(0)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no matching message from the kernel in time")
            try:
                yield self.kc.get_iopub_msg(timeout=left)
            except queue.Empty:
                raise TimeoutError("no matching message from the kernel in time") from None

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float = 30) -> dict:
        """The next IOPub message satisfying ``predicate``; others stay for later."""
        skipped = []
        try:
            for m in self._messages(time.monotonic() + timeout):
                if predicate(m):
                    return m
                skipped.append(m)
        finally:
            self.backlog[:0] = skipped
        raise AssertionError("unreachable")

    def submit(self, code: str) -> str:
        return self.kc.execute(code)

    def finish(self, msg_id: str, timeout: float = 60) -> Reply:
        mine, others = [], []
        for m in self._messages(time.monotonic() + timeout):
            if m["parent_header"].get("msg_id") != msg_id:
                others.append(m)
                continue
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                break
            mine.append(m)
        self.backlog[:0] = others
        deadline = time.monotonic() + timeout
        while True:
            reply = self.kc.get_shell_msg(timeout=max(deadline - time.monotonic(), 0.1))
            if reply["parent_header"].get("msg_id") == msg_id:
                return Reply(reply, mine)

    def execute(self, code: str, timeout: float = 60) -> Reply:
        return self.finish(self.submit(code), timeout)

    def run(self, code: str, timeout: float = 60) -> Reply:
        reply = self.execute(code, timeout)
        assert reply.status == "ok", f"cell failed: {reply.ename}\n{code}\n{reply.traceback}\n{reply.stderr}"
        return reply

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def display_update(text: str) -> Callable[[dict], bool]:
    return lambda m: m["msg_type"] == "update_display_data" and text in m["content"]["data"].get("text/plain", "")


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory) -> Path:
    prefix = tmp_path_factory.mktemp("jupyter")
    proc = install(prefix)
    assert proc.returncode == 0, proc.stderr
    assert "Installed kernelspec 'pathways' (8 CPU devices)" in proc.stdout
    return prefix / "share" / "jupyter" / "kernels"


@pytest.fixture(scope="module")
def kernel(kernel_dir, tmp_path_factory):
    k = Kernel(kernel_dir, "pathways", kernel_env(tmp_path_factory.mktemp("kernel")))
    yield k
    k.shutdown()


@pytest.fixture
def gated(kernel):
    """The kernel with fresh slices and gated device functions; the gate is opened afterwards."""
    kernel.run("import pw_kernel as pw\npw.init()")  # fresh slices for each test
    kernel.run(GATED)
    yield kernel
    kernel.run("gate.set(); pw.controller().wait_all(timeout=30)")


@pytest.fixture
def open_gate(gated, tmp_path) -> Iterator[Callable[[], None]]:
    """Opens the kernel's `gate` from this process, through a named pipe: also while the kernel is idle or busy."""
    pipe = tmp_path / "gate"
    os.mkfifo(pipe)
    gated.run(
        "def _open_gate_when_told(path):\n"
        "    with open(path) as pipe:\n"
        "        pipe.read()  # returns once the test has written and closed its end\n"
        "    gate.set()\n"
        f"threading.Thread(target=_open_gate_when_told, args=({str(pipe)!r},), daemon=True).start()"
    )
    told = []

    def open_it() -> None:
        if not told:
            told.append(True)
            with open(pipe, "w") as w:  # waits for the kernel's reader, which is already started
                w.write("open")

    yield open_it
    open_it()  # leave no reader thread behind in the kernel


# ------------------------------------------------------------------ install
def test_install_writes_the_python3_pathways_kernelspec(kernel_dir):
    spec = json.loads((kernel_dir / "pathways" / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (Pathways)"
    assert spec["argv"][:3] == [sys.executable, "-m", "ipykernel_launcher"]
    assert any("load_ipython_extension" in a for a in spec["argv"])
    # the count is a default the environment that starts Jupyter may override, not the kernel's environment
    assert "env" not in spec and any("setdefault('PW_NUM_CPU_DEVICES', '8')" in a for a in spec["argv"])


def test_install_rejects_a_device_count_below_one(tmp_path):
    proc = install(tmp_path, "--devices", "0")
    assert proc.returncode == 2
    assert "--devices must be at least 1; got 0." in proc.stderr


# ------------------------------------------------------------------- kernel
def test_the_pathways_kernel_has_8_devices_and_the_magics_loaded(kernel):
    reply = kernel.run("import jax\nprint(len(jax.devices()), jax.devices()[0].platform)")
    assert reply.stdout.strip() == "8 cpu"
    kernel.run("import jax.numpy as jnp\nimport pw_kernel as pw\nwide = pw.slice(8, name='wide')")
    reply = kernel.run("%%pathways --block --slice wide\nw = jnp.arange(8.0) * 2\nw.sum()")  # no %load_ext
    assert "Array(56., dtype=float32)" in reply.text
    # a tutorial's own `%load_ext pw_kernel`, written for any kernel, says nothing here
    reply = kernel.run("%load_ext pw_kernel")
    assert reply.text.strip() == "" and "already loaded" not in reply.stdout + reply.stderr


def test_a_devices_option_sets_the_simulated_device_count(tmp_path):
    proc = install(tmp_path, "--devices", "4", "--name", "pathways4", "--display-name", "Pathways x4")
    assert proc.returncode == 0, proc.stderr
    k = Kernel(tmp_path / "share" / "jupyter" / "kernels", "pathways4", kernel_env(tmp_path))
    try:
        assert k.run("import jax; print(len(jax.devices()))").stdout.strip() == "4"
    finally:
        k.shutdown()


def test_the_environment_that_starts_jupyter_chooses_a_one_device_host(kernel_dir, tmp_path):
    # What a one-GPU host looks like, on any machine: `PW_NUM_CPU_DEVICES=1 jupyter lab`.
    k = Kernel(kernel_dir, "pathways", {**kernel_env(tmp_path), "PW_NUM_CPU_DEVICES": "1"})
    try:
        assert k.run("import jax; print(len(jax.devices()))").stdout.strip() == "1"
        k.run("import jax.numpy as jnp\nimport pw_kernel as pw\ns = pw.slice(1, name='s')\nv = jnp.arange(4.0)")
        reply = k.run("%%pathways --block --slice s\ny = v * 2\ny.sum()")
        assert "Array(12., dtype=float32)" in reply.text
    finally:
        k.shutdown()


def test_a_first_cell_may_still_choose_the_device_count(kernel_dir, tmp_path):
    k = Kernel(kernel_dir, "pathways", kernel_env(tmp_path))  # the extension is loaded; JAX has not started
    try:
        reply = k.run("import jax\njax.config.update('jax_num_cpu_devices', 4)\nprint(len(jax.devices()))")
        assert reply.stdout.strip() == "4"
        k.run("import pw_kernel as pw\ns = pw.slice(4, name='s')\nv = jax.numpy.arange(4.0)")
        reply = k.run("%%pathways --block --slice s\ny = v * 2\n")
        final = [m["content"]["data"]["text/plain"] for m in reply.messages if m["msg_type"] == "update_display_data"]
        assert "y = Array float32[4]" in final[-1]  # bound to an array now, and the run's view says so
    finally:
        k.shutdown()


def test_futures_resolve_while_the_kernel_is_idle(gated, open_gate):
    k = gated
    submitted = k.run("%%pathways --name idle\ny = held(v)\n")
    assert "run" in submitted.text and "'idle'" in submitted.text  # the cell returned with the run pending
    assert k.run("print(y.done())").stdout.strip() == "False"
    k.run("t_idle = time.time()")
    # The kernel is idle (its reply came): the device work finishes now, and the run's display updates itself.
    open_gate()
    update = k.wait_for(display_update("'idle': done"), timeout=30)
    assert "y = Future float32[2]" in update["content"]["data"]["text/plain"]
    reply = k.run("print(y.done(), t_idle < y.run.finished_at < time.time(), y.result())")
    assert reply.stdout.strip() == "True True [1. 2.]"


def test_a_run_failing_while_idle_is_reported_once_at_the_next_cell(gated, open_gate):
    k = gated
    k.run("%%pathways --name sensor --mode chained\nx = b(v)\ny = broken(x)\n")
    n = int(k.run("print(pw.controller().runs[-1].id)").stdout)
    open_gate()  # while the kernel is idle
    k.wait_for(display_update("'sensor': failed"), timeout=30)

    report = k.run("1 + 1")
    assert f"pw_kernel: run {n} 'sensor' failed after the cell that submitted it had returned" in report.text
    assert re.search(r"at Cell In\[\d+\], line 3: y = broken\(x\)", report.text)
    assert "ValueError: the sensor returned garbage" in report.text
    assert re.search(r"Cell In\[\d+\], line \d+, in _broken", report.text)
    assert "dispatch.py" not in report.text
    assert "pw-err" in report.html

    assert "failed after" not in k.run("2 + 2").text  # reported once

    shown = k.execute("y.result()")  # the futures raise the error too
    assert shown.status == "error" and shown.ename == "NodeError"
    assert "----> 1 y.result()" in shown.traceback
    assert not RUNTIME_FRAME.search(shown.traceback.split("NodeError:")[0]), shown.traceback


def _widget_errors(messages, run_name: str) -> list[str]:
    """The errors run widgets showed for the run named ``run_name``, from their state updates."""
    states = [m["content"]["data"].get("state", {}) for m in messages if m["msg_type"] in ("comm_open", "comm_msg")]
    return [st["error"] for st in states if f"{run_name!r})" in st.get("error", "")]


def test_a_failing_cell_shows_its_error_once_and_condensed(gated):
    k = gated
    k.run("gate.set()")
    # a run whose widget shows its failure: the error there is condensed to the user's frames
    quick = k.run("%%pathways --mode chained --name quick\nx = b(v)\ny = broken(x)\n")
    if not _widget_errors(quick.messages, "quick"):  # the widget's own sync may follow the reply
        quick.messages.append(k.wait_for(lambda m: bool(_widget_errors([m], "quick")), timeout=30))
    error = _widget_errors(quick.messages, "quick")[-1]
    assert "ValueError: the sensor returned garbage" in error and re.search(r"Cell In\[\d+\], line \d+, in _broken", error)
    assert not re.search(r"threading\.py|dispatch\.py|callback\.py|CpuCallback", error), error
    # ... and reported at most once more: after the next cell if it failed after its own cell had ended
    assert (quick.text + k.run("1 + 1").text + k.run("2 + 2").text).count("'quick' failed after the cell") <= 1

    # with --block the cell raises the traceback; the run widget names the error in one line, JAX logs nothing
    reply = k.execute("%%pathways --block --mode chained --name once\nx = b(v)\ny = broken(x)\n")
    assert reply.status == "error" and reply.ename == "NodeError"
    assert reply.traceback.count("ValueError: the sensor returned garbage") == 1
    assert "CpuCallback" not in reply.traceback
    assert "callback failed" not in reply.stderr and "Traceback" not in reply.stderr
    updates = [m["content"]["data"]["text/plain"] for m in reply.messages if m["msg_type"] == "update_display_data"]
    updates = [u for u in updates if "'once'" in u]  # not a late refresh of the run before
    assert "the sensor returned garbage (the traceback is below)" in updates[-1], updates
    if not _widget_errors(reply.messages, "once"):
        reply.messages.append(k.wait_for(lambda m: bool(_widget_errors([m], "once")), timeout=30))
    error = _widget_errors(reply.messages, "once")[-1]
    assert error.endswith("ValueError: the sensor returned garbage (the traceback is below)") and "\n" not in error


def test_a_timeline_cell_updates_in_place_and_never_shows_up_in_a_later_cell(gated, open_gate):
    k = gated
    first = k.run("%%pathways --timeline --name tl\nx = held(v)\n")
    assert sum(m["msg_type"] == "display_data" for m in first.messages) == 2  # the run and its timeline
    later = k.submit("1 + 1")  # the run finishes while this cell is the latest one
    open_gate()
    seen = []
    k.wait_for(lambda m: seen.append(m) or display_update("'tl': done")(m), timeout=30)
    reply = k.finish(later)
    # until the live displays have dropped the run's views (after drawing its final state): no refresh is left
    settle = k.run(
        "_live = get_ipython().magics_manager.registry['PathwaysMagics'].live\n"
        "_deadline = time.monotonic() + 30  # (a hang guard)\n"
        "while _live._shown:\n"
        "    assert time.monotonic() < _deadline, 'a finished run is still refreshed'\n"
        "    time.sleep(0.01)\n"
    )
    assert settle.status == "ok", settle.traceback
    shown_later = [m for m in seen + reply.messages + settle.messages + k.backlog if m["msg_type"] == "display_data"]
    assert shown_later == [], [m["content"]["data"].get("text/plain") for m in shown_later]


def test_a_long_blocking_cell_refreshes_its_runs_display(gated, open_gate):
    k = gated
    k.run("import pw_kernel.magics.live as m\nsaved = m.PROGRESS_AFTER_S, m.PROGRESS_EVERY_S")
    k.run("m.PROGRESS_AFTER_S = m.PROGRESS_EVERY_S = 0.0  # instead of after ~2 s, every 1 s")
    try:
        msg_id = k.submit("%%pathways --block --name patient\ny = held(v)\ny")
        seen = set()
        while len(seen) < 2:  # state changes alone would give one 'running' display; elapsed time ticks
            update = k.wait_for(display_update("'patient': running"), timeout=30)
            seen.add(update["content"]["data"]["text/plain"])
        open_gate()  # only now can the cell finish: the refreshes above came while it was blocked
        reply = k.finish(msg_id)
        assert reply.status == "ok" and "Array([1., 2.], dtype=float32)" in reply.text
    finally:
        k.run("m.PROGRESS_AFTER_S, m.PROGRESS_EVERY_S = saved")


def test_ctrl_c_cancels_a_blocking_run_and_the_kernel_stays_usable(gated):
    k = gated
    msg_id = k.submit("%%pathways --block --mode chained --name long\ny = v\nfor i in range(5):\n    y = held(y)\n")
    k.wait_for(lambda m: m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "display_data", timeout=60)
    k.km.interrupt_kernel()
    reply = k.finish(msg_id, timeout=30)
    assert reply.status == "error" and reply.ename == "KeyboardInterrupt"
    assert re.search(r"pw_kernel: Ctrl-C cancelled run \d+ \('long'\)", reply.stderr)
    assert not RUNTIME_FRAME.search(reply.traceback), reply.traceback

    state = k.run("r = pw.controller().runs[-1]\nprint(r.name, r.state)")
    assert state.stdout.strip() == "long cancelled"
    k.run("gate.set()")  # let the device work already dispatched drain
    again = k.run("%%pathways --block\nz = b(v)\nz")
    assert "Array([2., 3.], dtype=float32)" in again.text


def ctrl_c_in_a_loop(k, body: str, after: int):
    """Run a plain loop of ``body`` in a cell; once ``after`` calls are queued and it goes on, press Ctrl-C.

    Returns the cell's reply.
    """
    msg_id = k.submit(
        "for i in range(100_000):\n"
        f"    {body}\n"
        f"    if i == {after}:\n"
        "        print('dozens queued', flush=True)\n"
        f"    if i >= {after}:\n"
        "        time.sleep(0.02)  # the loop goes on: the person presses Ctrl-C while it runs\n"
    )
    k.wait_for(
        lambda m: m["parent_header"].get("msg_id") == msg_id
        and m["msg_type"] == "stream"
        and "dozens queued" in m["content"]["text"],
        timeout=120,
    )
    k.km.interrupt_kernel()
    return k.finish(msg_id, timeout=60)


def test_ctrl_c_in_a_plain_loop_cancels_the_runs_that_cell_submitted_and_no_others(gated):
    k = gated
    k.run("earlier = [held(v), held(v)]\nmark = pw.controller().runs[-1].id")  # an earlier cell's runs, gated
    reply = ctrl_c_in_a_loop(k, "y = held(v)", after=60)
    assert reply.status == "error" and reply.ename == "KeyboardInterrupt"
    cancelled = re.search(r"pw_kernel: Ctrl-C cancelled (\d+) runs \(ids \d+-\d+: 'held'\): ", reply.stderr)
    assert cancelled, reply.stderr
    assert not RUNTIME_FRAME.search(reply.traceback), reply.traceback
    n = int(cancelled.group(1))
    assert n > 60

    after = k.run(
        "mine = [r for r in pw.controller().runs if r.id > mark]\n"
        "print(len(mine), sorted({r.state for r in mine}), [f.done() for f in earlier])"
    )
    assert after.stdout.strip() == f"{n} ['cancelled'] [False, False]"  # none queued or running; earlier ones wait
    k.run("gate.set()")
    done = k.run("print([f.result(timeout=30).tolist() for f in earlier])")
    assert done.stdout.strip() == "[[1.0, 2.0], [1.0, 2.0]]"


def test_load_ext_in_a_plain_kernel_whose_jax_has_one_device_says_how_to_get_more(tmp_path):
    spec_dir = tmp_path / "kernels" / "plain"
    spec_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec_dir / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "plain", "language": "python"}))
    k = Kernel(tmp_path / "kernels", "plain", kernel_env(tmp_path))
    try:
        assert k.run("import jax; print(len(jax.devices()))").stdout.strip() == "1"
        reply = k.run("%load_ext pw_kernel")
        assert "JAX already started with a single CPU device" in reply.stderr
        assert "python -m pw_kernel install --user" in reply.stderr
        assert "MeshWidget(1 device in 1 island" in k.run("%pathways devices").text  # and the extension still works
    finally:
        k.shutdown()


def test_a_kernel_restart_with_runs_in_flight_comes_back_clean(kernel_dir, tmp_path):
    k = Kernel(kernel_dir, "pathways", kernel_env(tmp_path))
    try:
        k.run(GATED)
        k.run("%%pathways --name in_flight\nh = held(v)\n")
        k.km.restart_kernel(now=True)
        k.kc.wait_for_ready(timeout=90)
        k.backlog.clear()
        reply = k.run(
            "import pw_kernel as pw, jax.numpy as jnp\n"
            "print(len(pw.devices()), len(pw.controller().runs))\n"
            "s = pw.slice(2)\n"
            "print(pw.compiled(lambda x: x * 3, slice=s)(jnp.ones(2)).result(timeout=30))"
        )
        assert reply.stdout.split("\n")[:2] == ["8 0", "[3. 3.]"]
        k.run("%%pathways --block\ny = pw.compiled(lambda x: x + 1, slice=s)(jnp.ones(2))\n")
    finally:
        k.shutdown()


def test_ctrl_c_in_a_plain_loop_of_pipeline_steps_leaves_nothing_running(kernel):
    # A researcher's loop of `pipe.step` calls, interrupted: the steps still queued are cancelled
    # and the cell says so; nothing of that cell runs on afterwards.
    kernel.run(
        "import time\nimport jax, jax.numpy as jnp, numpy as np\nimport pw_kernel as pw\npw.init()\n"
        "slices = [pw.slice(1, name=f'p{i}') for i in range(2)]\n"
        "layer = lambda p, x: jnp.tanh(x @ p['w'])\n"
        "pipe = pw.pipeline([layer, layer], slices=slices, microbatches=2, schedule='1f1b', name='loop')\n"
        "state = pipe.init([{'w': np.eye(64, dtype=np.float32)}] * 2)\n"
        "x = np.ones((8, 64), np.float32)\n"
        "state, loss = pipe.step(state, x, x); loss.result()\n"
        "mark = pw.controller().runs[-1].id"
    )
    reply = ctrl_c_in_a_loop(kernel, "state, loss = pipe.step(state, x, x)", after=40)
    assert reply.status == "error" and reply.ename == "KeyboardInterrupt"
    said = re.search(r"pw_kernel: Ctrl-C cancelled (\d+) runs? ", reply.stderr)
    assert said, reply.stderr
    after = kernel.run(
        "pw.controller().wait_all(timeout=60)\n"
        "mine = [r for r in pw.controller().runs if r.id > mark]\n"
        "print(sorted({r.state for r in mine}), sum(r.state == 'cancelled' for r in mine))"
    )
    states, n = after.stdout.strip().rsplit(" ", 1)
    assert int(n) == int(said.group(1)) >= 1 and "'queued'" not in states and "'running'" not in states

"""The pool for a group on one box: clients that never open an accelerator, data placed in the service once,
and a memory share per client.

The quick tests run a service object and its client in this process (as tests/test_service_layer.py);
the ones marked ``system`` start a service process and client processes with a bare environment, as a
user's terminal and notebooks would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw
from pw_kernel.service import stats, unkeep

HANG_S = 120  # only stops a wait that would hang: no test asserts on time


def _slice():
    n = min(2, len(jax.devices()))  # (1 on a one-device host: the service has what this process has)
    return pw.slice(n, mesh={"data": n}), n


def test_a_dataset_placed_with_device_put_crosses_once(service):
    pw.connect(service.path, name="trainer")
    s, n = _slice()
    X = jax.device_put(jnp.arange(16.0 * n).reshape(8 * n, 2), s.sharding("data"))  # the README's way
    w = pw.put(jnp.ones(2), s.sharding())
    step = pw.compiled(lambda w, X: w * 0.5 + X.mean(axis=0), slice=s)
    before = stats()["puts"]
    for _ in range(20):
        w = step(w, X)
    want = np.ones(2)
    for _ in range(20):
        want = want * 0.5 + np.asarray(X).mean(axis=0)
    np.testing.assert_allclose(np.asarray(w.result()), want, rtol=1e-6)
    assert stats()["puts"] - before == 1  # X, once; w lives there from the start
    # A numpy array may change between calls: it is sent each time (the count above can fail).
    Xn = np.asarray(X)
    before = stats()["puts"]
    for _ in range(5):
        w = step(w, Xn)
    w.result()
    assert stats()["puts"] - before == 5


def test_put_places_an_array_in_the_service_and_keep_takes_placed_arrays(service):
    pw.connect(service.path, name="alice")
    s, n = _slice()
    data = np.arange(8.0 * n, dtype=np.float32).reshape(4 * n, 2)
    X = pw.put(data, s.sharding("data"))
    assert isinstance(X, pw.RemoteArray) and X.shape == data.shape and X.slice is s
    np.testing.assert_array_equal(np.asarray(X), data)
    total = pw.compiled(lambda X: X.sum(), slice=s)
    assert float(total(X).result()) == data.sum()
    Y = jax.device_put(jnp.asarray(data) * 2, s.sharding("data"))  # placed the jax way: keep sends it once
    pw.keep("data", {"X": X, "Y": Y, "n": 3})
    back = pw.kept("data")
    np.testing.assert_array_equal(np.asarray(back["X"]), data)
    np.testing.assert_array_equal(np.asarray(back["Y"]), data * 2)
    assert back["n"] == 3
    assert jax.devices()[0].platform == "cpu"  # (on a local sharding, pw.put is jax.device_put)
    local = pw.put(data, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    assert isinstance(local, jax.Array)
    with pytest.raises(pw.ArgumentError, match=r"pw.put\(x, sharding\)` takes a jax Sharding"):
        pw.put(data, "data")
    unkeep("data")


def test_a_client_over_its_memory_share_is_refused_and_goes_on(service):
    with pytest.raises(pw.ArgumentError, match=r"pw.connect\(memory=...\)` takes bytes per device.*'lots'"):
        pw.connect(service.path, memory="lots")
    pw.connect(service.path, name="evaluator", memory="64KiB")
    s = pw.slice(1)
    small = pw.compiled(lambda x: x + 1, slice=s)
    big = pw.compiled(lambda x: jnp.zeros(32 * 1024, jnp.float32) + x, slice=s)  # 128 KiB out
    y = small(jnp.zeros(1024, jnp.float32))  # 4 KiB: within the share
    assert float(y.result()[0]) == 1.0
    with pytest.raises(pw.AdmissionError, match=r"client 'evaluator' may hold 64 KiB on each service device"):
        big(jnp.float32(1)).result()
    with pytest.raises(pw.AdmissionError, match=r"memory="):
        pw.put(np.zeros(64 * 1024, np.float32), s.sharding())
    assert float(small(y).result()[0]) == 2.0  # the client goes on
    held = stats()["held_bytes"]
    assert max(held.values()) <= 64 * 1024, held


def test_a_loop_that_donates_its_state_is_charged_one_copy_of_it_however_far_it_runs_ahead(service):
    """Each step donates the state it is given: steps queued ahead of the devices, and the recent ones whose
    futures this client still holds, hold one copy of the state between them, not one each."""
    pw.connect(service.path, name="trainer", memory="64KiB")
    step = pw.compiled(lambda st: jax.tree.map(lambda v: v * 0.5, st), slice=pw.slice(1), donate_argnums=0)
    state = {f"w{i}": jnp.ones(1024, jnp.float32) for i in range(4)}  # 16 KiB
    for _ in range(20):  # (20 steps' outputs would be 320 KiB, counted one each)
        state = step(state)
    assert float(state["w0"].result()[0]) == 0.5**20
    held = stats()["held_bytes"]
    assert max(held.values()) <= 2 * 16 * 1024, held


# ------------------------------------------------------------------ processes, as a group uses them
BARE = {k: v for k, v in os.environ.items()
        if not k.startswith(("JAX_", "PW_", "XLA_")) and k not in ("CUDA_VISIBLE_DEVICES",)}


def _service(path, log, devices: int) -> subprocess.Popen:
    from test_service import _start_service

    env = {**BARE, "JAX_PLATFORMS": "cpu", "PW_NUM_CPU_DEVICES": str(devices)}
    return _start_service(path, log, env=env)


def _client(code: str, path, env=None) -> dict:
    prelude = f"import json, sys, numpy as np\nCONN = {str(path)!r}\n"
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          env=env or BARE, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.system
@pytest.mark.parametrize("devices", [8, 3])
def test_a_client_with_no_jax_environment_is_cpu_only_with_the_services_count(tmp_path, devices):
    svc = _service(tmp_path / "conn.json", tmp_path / "log", devices)
    try:
        got = _client(
            """
            import pw_kernel as pw, jax, jax.numpy as jnp
            pw.connect(CONN, name="nb")
            s = pw.slice(2, mesh={"d": 2})
            y = pw.compiled(lambda x: x * 2, slice=s)(jnp.arange(4.0))
            print(json.dumps({"platforms": jax.config.jax_platforms, "kinds": sorted({d.platform for d in jax.devices()}),
                              "n": len(jax.devices()), "remote": s.island.remote is not None,
                              "y": np.asarray(y.result()).tolist()}))
            """,
            tmp_path / "conn.json",
        )
    finally:
        svc.send_signal(signal.SIGTERM)
        svc.wait(HANG_S)
    assert got == {"platforms": "cpu", "kinds": ["cpu"], "n": devices, "remote": True, "y": [0.0, 2.0, 4.0, 6.0]}


@pytest.mark.system
def test_a_client_whose_jax_started_with_too_few_devices_is_told_to_restart(tmp_path):
    svc = _service(tmp_path / "conn.json", tmp_path / "log", 4)
    try:
        got = _client(
            """
            import jax
            jax.config.update("jax_num_cpu_devices", 2); jax.devices()   # JAX started before pw.connect
            import pw_kernel as pw
            try:
                pw.connect(CONN)
            except pw.PathwaysError as e:
                print(json.dumps({"error": str(e)}))
            """,
            tmp_path / "conn.json",
        )
    finally:
        svc.send_signal(signal.SIGTERM)
        svc.wait(HANG_S)
    assert "the service has 4 devices" in got["error"] and "Restart the kernel" in got["error"]


@pytest.mark.system
def test_a_client_over_its_share_is_refused_while_another_trains_on(tmp_path):
    conn = tmp_path / "conn.json"
    svc = _service(conn, tmp_path / "log", 2)
    trainer = subprocess.Popen([sys.executable, "-c", f"CONN = {str(conn)!r}\n" + textwrap.dedent("""
        import json, sys, numpy as np, jax.numpy as jnp
        import pw_kernel as pw
        pw.connect(CONN, name="trainer")
        s = pw.slice(1)
        step = pw.compiled(lambda w: w * 0.999 + 0.001, slice=s)
        w = step(jnp.ones(256 * 1024, jnp.float32))   # 1 MiB held
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(200):
            w = step(w)
        print(json.dumps({"w": float(np.asarray(w.result())[0])}))
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=BARE)
    try:
        assert trainer.stdout.readline().strip() == "ready", trainer.stderr.read()[-3000:]
        trainer.stdin.write("go\n")
        trainer.stdin.flush()
        got = _client(
            """
            import pw_kernel as pw, jax.numpy as jnp
            pw.connect(CONN, name="evaluator", memory="256KiB")
            s = pw.slice(1)
            try:
                pw.compiled(lambda x: jnp.zeros(128 * 1024, jnp.float32) + x, slice=s)(jnp.float32(1)).result()
                error = None
            except pw.AdmissionError as e:
                error = str(e)
            ok = float(pw.compiled(lambda x: x + 1, slice=s)(jnp.zeros(4)).result()[0])
            print(json.dumps({"error": error, "ok": ok}))
            """,
            conn,
        )
        out, err = trainer.communicate(timeout=HANG_S)
        assert trainer.returncode == 0, err[-3000:]
    finally:
        trainer.kill()
        svc.send_signal(signal.SIGTERM)
        svc.wait(HANG_S)
    assert "client 'evaluator' may hold 256 KiB" in got["error"] and got["ok"] == 1.0
    w = 1.0
    for _ in range(201):
        w = w * 0.999 + 0.001
    assert json.loads(out.strip().splitlines()[-1])["w"] == pytest.approx(w, rel=1e-5)


def _readme_example(name: str) -> str:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    tail = text.split(f"<!-- example: {name} -->\n```python\n", 1)[1]
    return tail.split("\n```", 1)[0] + "\n"


@pytest.mark.system
def test_the_readmes_two_notebook_example_runs_as_written(tmp_path):
    # As a user runs it: `.venv/bin/pw-serve` in a terminal (this environment's), then the notebooks' cells
    # in fresh processes with no JAX settings, on the default connection file.
    from pathlib import Path

    env = {**BARE, "JUPYTER_RUNTIME_DIR": str(tmp_path)}
    log = open(tmp_path / "service.log", "w")  # noqa: SIM115 - the service writes there while it runs
    svc = subprocess.Popen([str(Path(sys.executable).parent / "pw-serve")], stdout=log, stderr=subprocess.STDOUT,
                           env={**env, "PW_NUM_CPU_DEVICES": "8"})
    conn = tmp_path / "pw-service.json"
    try:
        from test_service import _written_by

        import time

        deadline = time.monotonic() + HANG_S
        while not _written_by(conn, svc.pid):
            assert svc.poll() is None and time.monotonic() < deadline, (tmp_path / "service.log").read_text()
            time.sleep(0.05)

        def run(*cells: str) -> subprocess.Popen:
            code = "".join(_readme_example(c) for c in cells)
            return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env)

        def out(p: subprocess.Popen) -> str:
            stdout, stderr = p.communicate(timeout=HANG_S)
            assert p.returncode == 0, stderr[-3000:]
            return stdout

        a, b = run("notebook-a", "notebook-a-train"), run("notebook-b")
        trained, evaluated = out(a), out(b)
        again = out(run("notebook-a", "notebook-a-again"))
    finally:
        svc.send_signal(signal.SIGTERM)
        svc.wait(HANG_S)
    last = float(trained.split("step 200: loss ")[1].split()[0])
    nxt = float(again.split("step 201: loss ")[1].split()[0])
    assert 0 <= nxt <= last < 1.0, (trained, again)  # gradient descent on a least-squares loss goes on down
    assert evaluated.startswith("score ") and "eval 1.0" in evaluated, evaluated

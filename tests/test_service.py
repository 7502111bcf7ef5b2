"""Many notebooks, one pool of devices: a service process and client processes, as two notebooks use them.

One service (``python -m pw_kernel serve``, 8 simulated CPU devices) runs for the module; each test's
clients are fresh Python processes, as a user's kernels would be. Times appear only as hang guards.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cells import run_cell

import pw_kernel as pw
from pw_kernel.service import protocol

pytest.importorskip("zmq")
pytest.importorskip("jupyter_client")

ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PW_NUM_CPU_DEVICES": "8", "PW_VALIDATE": "0"}
HANG_S = 120  # a guard against hangs only


def _start_service(path, log_path, *args: str, env: dict | None = None) -> subprocess.Popen:
    log = open(log_path, "w")  # noqa: SIM115 - the service writes its log there for as long as it runs
    proc = subprocess.Popen(
        [sys.executable, "-m", "pw_kernel", "serve", "--connection-file", str(path), *args,
         *(() if "--exit-with" in args else ("--exit-with", str(os.getpid())))],
        stdout=log, stderr=subprocess.STDOUT, env=ENV if env is None else env,
    )
    deadline = time.monotonic() + HANG_S
    while not _written_by(path, proc.pid):  # (a stale file of a killed service may be there before)
        assert proc.poll() is None, Path(log_path).read_text()
        assert time.monotonic() < deadline, "the service did not write its connection file"
        time.sleep(0.05)
    return proc


def _written_by(path, pid: int) -> bool:
    try:
        return json.loads(Path(path).read_text())["pid"] == pid
    except (OSError, ValueError, KeyError):
        return False


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The service process and its connection file."""
    d = tmp_path_factory.mktemp("service")
    path, log_path = d / "conn.json", d / "service.log"
    proc = _start_service(path, log_path)
    yield str(path), log_path
    proc.send_signal(signal.SIGTERM)
    proc.wait(HANG_S)


def notebook(code: str, service_path: str, *args: str) -> subprocess.Popen:
    """A client process ("a notebook") running ``code`` with ``CONN`` (the connection file) and ``ARGS`` defined."""
    prelude = (
        "import sys, time, numpy as np, jax, jax.numpy as jnp\nimport pw_kernel as pw\n"
        f"CONN = {service_path!r}\nARGS = sys.argv[1:]\n"
    )
    body = "\n".join(textwrap.dedent(part) for part in code.split("\0"))
    return subprocess.Popen(
        [sys.executable, "-c", prelude + body, *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )


def finish(proc: subprocess.Popen) -> dict:
    """Wait for a notebook; the JSON it printed last."""
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def observer(service_path: str):
    """A bare client of the service (no controller): for asking what it holds."""
    from pw_kernel.service import wire
    from pw_kernel.service.link import ServiceLink

    path, info = wire.read_connection_file(service_path, "test")
    link = ServiceLink(path, info)
    link.hello("observer", 1.0, timeout=HANG_S)
    return link


def test_the_connection_file_is_the_users_alone_and_a_client_runs_programs_there(service):
    path, _ = service
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    info = json.loads(Path(path).read_text())
    assert {"transport", "ip", "port", "key", "signature_scheme"} <= set(info)

    nb = notebook(
        """
        import json
        pw.connect(CONN, name="alice")
        s = pw.slice(4, mesh={"d": 4})
        double = pw.compiled(lambda x: x * 2, slice=s, in_specs=jax.sharding.PartitionSpec("d"))

        @pw.program
        def step(v):
            return double(double(v) + 1)

        y = step(jnp.arange(8.0))                  # a future at once; the value stays in the service
        t = pw.slice(4)                            # the other four devices
        z = pw.compiled(lambda v: v - 1, slice=t)(y)
        import pw_kernel.service
        print(json.dumps({
            "z": np.asarray(z.result()).tolist(),
            "service_slices": pw_kernel.service.stats()["slices"],
            "island_remote": s.remote,
            "value": np.asarray(y.result()).tolist(),
            "clients": [c.name for c in pw.clients()],
        }))
        """,
        path,
    )
    got = finish(nb)
    assert got["island_remote"] is True
    assert got["value"] == [(2 * x + 1) * 2 for x in range(8)]
    assert got["clients"] == ["alice"]
    assert got["z"] == [(2 * x + 1) * 2 - 1 for x in range(8)]
    assert [0, 1, 2, 3] in got["service_slices"] and [4, 5, 6, 7] in got["service_slices"]


def test_a_message_without_the_key_is_refused_and_logged_and_handles_are_per_client(service):
    import zmq
    from jupyter_client.session import Session

    from pw_kernel.service import wire

    path, log_path = service
    info = json.loads(Path(path).read_text())
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(f"tcp://{info['ip']}:{info['port']}")
    ident = sock.identity or b"mallory"
    hello = protocol.Request(1, protocol.Hello(protocol.PROTOCOL_VERSION, "mallory", 1.0, 1, ident, ident))
    forged = wire.Messages({**info, "key": "not-the-key"}, "mallory")
    sock.send_multipart(forged.pack(hello))  # signed with another key
    jupyters = {"id": 1, "method": "hello", "args": ("mallory", 1.0, 1)}
    Session(key=b"not-the-key", signature_scheme="hmac-sha256").send(sock, "request", jupyters)  # Jupyter's, forged
    sock.send_multipart([b"<IDS|MSG>", b"", b"{}", b"{}", b"{}", b"{}"])  # unsigned
    # A message signed with the key, heard once (a ping: answered), then replayed (refused)
    ping = wire.Messages(info, "eve").pack(protocol.Ping())
    sock.send_multipart(ping)
    assert sock.poll(HANG_S * 1000), "the service did not answer a signed ping"
    sock.recv_multipart()
    sock.send_multipart(ping)

    link = observer(path)
    try:
        deadline = time.monotonic() + HANG_S
        # the three forged messages and the replay: refused, and counted
        while link.call(protocol.Stats(), timeout=HANG_S)["refused"] < 4:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # (the socket thread refuses a message instead of answering it: by now an answer would be here)
        assert sock.poll(0) == 0, "the service answered a message it refused"
        ctx.destroy(linger=0)
        assert "mallory" not in [c["name"] for c in link.call(protocol.Clients(), timeout=HANG_S)]
        with pytest.raises(pw.PathwaysError, match="no buffer 1 for this client"):  # handles name one's own arrays
            link.call(protocol.Get(1), timeout=HANG_S)
    finally:
        link.call(protocol.Bye(), timeout=HANG_S)
        link.close()
    said = Path(log_path).read_text()
    assert "refused a message" in said and "Invalid Signature" in said and "Duplicate Signature" in said


TRAIN = """
    import json
    pw.connect(CONN, name="trainer")               # first: slices made from now on are the service's
    P = jax.sharding.PartitionSpec
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
    s = pw.slice(2, mesh={"d": 2})

    @pw.compiled(slice=s)
    def train(w, x, y):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - 0.05 * g, loss

    def three_steps():
        state = {"w": jnp.zeros((4, 1)), "step": 0}
        for i in range(3):
            w, loss = train(state["w"], x, y)
            state = {"w": w, "step": i + 1}
        return state
"""


def test_kept_state_survives_a_client_restart_and_training_goes_on_exactly(service):
    path, _ = service
    first = notebook(
        TRAIN + "\0" + """
        state = three_steps()
        pw.keep("state", state)                    # pinned in the service under a name
        w4, loss4 = train(state["w"], x, y)        # what an uninterrupted run does next
        print(json.dumps({"loss4": float(loss4.result())}))
        """,
        path,
    )
    uninterrupted = finish(first)  # the process ends: its unkept arrays are freed, "state" stays

    second = notebook(  # a new kernel: nothing of the first one's but the kept name
        TRAIN + "\0" + """
        names = pw.kept()
        state = pw.kept("state", slice=s)
        w4, loss4 = train(state["w"], x, y)
        print(json.dumps({"names": names, "step": state["step"], "loss4": float(loss4.result()),
                          "kind": type(state["w"]).__name__}))
        """,
        path,
    )
    resumed = finish(second)
    assert "state" in resumed["names"]
    assert resumed["step"] == 3 and resumed["kind"] == "RemoteArray"
    assert resumed["loss4"] == uninterrupted["loss4"]



def test_a_checkpoint_of_arrays_in_the_service_is_written_there_and_restored_there(service, tmp_path):
    path, _ = service
    ck = str(tmp_path / "ck")
    first = notebook(
        TRAIN + "\0" + """
        state = three_steps()
        ckpt = pw.CheckpointManager(ARGS[0])
        ckpt.save(3, {"state": state})              # the service writes its arrays' shards itself
        ckpt.wait_until_finished()
        w4, loss4 = train(state["w"], x, y)
        print(json.dumps({"loss4": float(loss4.result())}))
        """,
        path, ck,
    )
    uninterrupted = finish(first)
    # The arrays' item is the service's own (written there by pw's island writer, not fetched here first).
    assert "island_0" in [p.name for p in (tmp_path / "ck" / "3").iterdir()]

    second = notebook(
        TRAIN + "\0" + """
        ckpt = pw.CheckpointManager(ARGS[0])
        target = {"state": {"w": train(jnp.zeros((4, 1)), x, y)[0], "step": 0}}   # where it goes: the service
        got = ckpt.restore(3, target=target)["state"]
        w4, loss4 = train(got["w"], x, y)
        print(json.dumps({"step": got["step"], "loss4": float(loss4.result()),
                          "where": type(got["w"].remote_array() if hasattr(got["w"], "remote_array")
                                        else got["w"]).__name__}))
        """,
        path, ck,
    )
    resumed = finish(second)
    assert resumed["step"] == 3 and resumed["where"] == "RemoteArray"
    assert resumed["loss4"] == uninterrupted["loss4"]



def test_pw_init_after_connect_keeps_the_connection(service):
    path, _ = service
    nb = notebook(
        """
        import json
        pw.connect(CONN, name="reinit")
        pw.init(pw.Config(run_ahead_s=0.05))        # a new controller: still a client of the service
        s = pw.slice(2, mesh={"d": 2})
        f = pw.compiled(lambda x: x * 3.0, slice=s)
        y = f(jnp.arange(4.0))
        print(json.dumps({"remote": s.island.remote is not None, "y": np.asarray(y.result()).tolist(),
                          "runs": next(c.runs for c in pw.clients() if c.you)}))
        """,
        path,
    )
    got = finish(nb)
    assert got == {"remote": True, "y": [0.0, 3.0, 6.0, 9.0], "runs": 1}


SATURATE = """
    import json, os
    pw.connect(CONN, name=ARGS[0], weight=float(ARGS[1]))
    s = pw.slice(1)
    f = pw.compiled(lambda a: jnp.tanh(a @ a) * 0.5, slice=s)
    a = f(jnp.eye(768) * 0.1)
    a.result()                                     # compiled and warm
    print("ready", flush=True)
    while not os.path.exists(ARGS[2]):
        time.sleep(0.01)
    for _ in range(int(ARGS[3])):
        a = f(a)                                   # queued in the service, nothing waits here
    a.result()
    print(json.dumps({c.name: c.nodes for c in pw.clients()}))
    sys.stdin.readline()                           # connected until the test has read the counts
"""


def test_two_clients_with_weights_1_and_4_run_about_4_of_the_heavy_ones_nodes_per_light_one(service, tmp_path):
    # Counted in nodes, not timed. Both clients run the same node; fair share charges each node's measured
    # device time (a running mean, noisy on a busy machine) over its client's weight, so the heavy client runs
    # about four nodes for each of the light one's. The counts say "weighted" (~30 light nodes by the heavy
    # one's 120th) against "equal" (~120) and "starved" (0) with room for that noise; the device-time shares
    # themselves, to 5% at weights 2:1, are benchmarks/service.py's.
    path, _ = service
    go = str(tmp_path / "go")
    light = notebook(SATURATE, path, "light", "1", go, "240")
    heavy = notebook(SATURATE, path, "heavy", "4", go, "120")
    for nb in (light, heavy):
        assert nb.stdout.readline().strip() == "ready", nb.stderr.read()[-3000:]
    link = observer(path)
    try:
        clients = {c["name"]: c for c in link.call(protocol.Clients(), timeout=HANG_S)}
        assert (clients["light"]["weight"], clients["heavy"]["weight"]) == (1.0, 4.0), clients
        before = {k: c["nodes"] for k, c in clients.items()}
        open(go, "w").close()
        deadline = time.monotonic() + HANG_S
        while True:  # the light client's count when the heavy one's last node is counted (read every ms or so)
            clients = {c["name"]: c for c in link.call(protocol.Clients(), timeout=HANG_S)}
            ran = {k: clients[k]["nodes"] - before[k] for k in ("light", "heavy")}
            if ran["heavy"] == 120:
                break
            assert time.monotonic() < deadline, ran
            time.sleep(0.002)
    finally:
        link.call(protocol.Bye(), timeout=HANG_S)
        link.close()
    print(f"nodes run by the heavy client's 120th: {ran}")
    at_end = {"heavy": finish(heavy)["heavy"], "light": finish(light)["light"]}
    assert {k: at_end[k] - before[k] for k in at_end} == {"heavy": 120, "light": 240}, (before, at_end)
    assert 5 <= ran["light"] <= 60, ran


def test_a_killed_client_has_its_queued_runs_cancelled_and_its_buffers_freed(service):
    path, log_path = service
    link = observer(path)
    try:
        before = link.call(protocol.Stats(), timeout=HANG_S)
        doomed = notebook(
            """
            pw.connect(CONN, name="doomed")
            s = pw.slice(1)
            grow = pw.compiled(lambda x: jnp.broadcast_to(x, (1024, 1024)) + 0.0, slice=s)
            held = [grow(jnp.float32(i)) for i in range(8)]        # 32 MiB in the service
            slow = pw.compiled(lambda a: jnp.tanh(a @ a) * 0.5, slice=s)
            a = held[0]
            for _ in range(200):                                    # seconds of queued work
                a = slow(a)
            held[-1].result()
            from pw_kernel.service import stats
            while stats()["live_runs"] < 100:                   # (the dispatcher thread sends them)
                time.sleep(0.01)
            print("queued", flush=True)
            time.sleep(600)
            """,
            path,
        )
        assert doomed.stdout.readline().strip() == "queued", doomed.stderr.read()[-3000:]
        during = link.call(protocol.Stats(), timeout=HANG_S)
        assert during["live_bytes"] >= before["live_bytes"] + 32 * 2**20
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(HANG_S)
        killed_at = time.monotonic()
        deadline = killed_at + HANG_S
        while True:
            st = link.call(protocol.Stats(), timeout=HANG_S)
            names = [c["name"] for c in link.call(protocol.Clients(), timeout=HANG_S)]
            if "doomed" not in names and st["live_runs"] == 0 and st["live_bytes"] <= before["live_bytes"]:
                break
            assert time.monotonic() < deadline, (names, st)
            time.sleep(0.1)
        print(f"a killed client's runs and buffers were gone after {time.monotonic() - killed_at:.1f} s")
    finally:
        link.call(protocol.Bye(), timeout=HANG_S)
        link.close()
    dropped = [line for line in Path(log_path).read_text().splitlines() if "'doomed' dropped" in line]
    assert dropped and "runs cancelled" in dropped[0] and " 0 runs cancelled" not in dropped[0], dropped
    # Dropped when its connection closed (its sockets, probed, were gone), not heartbeats later.
    assert "connection closed:" in dropped[0] and "heartbeats" not in dropped[0], dropped


def test_one_clients_first_call_compiling_does_not_hold_up_another_clients_calls(service):
    # A notebook starts a model (its first step compiles in the service for a second or so); another
    # notebook's calls go on meanwhile, each answered while that compile still runs.
    path, _ = service
    calling = notebook(
        """
        import json
        from pw_kernel.service import stats
        pw.connect(CONN, name="calling")
        inc = pw.compiled(lambda x: x + 1.0, slice=pw.slice(1), name="inc")
        y = inc(jnp.zeros(4))
        y.result()
        print("ready", flush=True)
        deadline = time.monotonic() + 120
        while not stats()["compiling"]:             # until the service compiles the other notebook's step
            assert time.monotonic() < deadline, "no compile seen"
            time.sleep(0.001)
        calls = 0
        while stats()["compiling"] and calls < 20:  # calls answered while it compiles
            inc(y).result()
            calls += 1
        print(json.dumps({"calls": calls}))
        """,
        path,
    )
    assert calling.stdout.readline().strip() == "ready", calling.stderr.read()[-3000:]
    compiling = notebook(
        """
        import json
        pw.connect(CONN, name="compiling")
        def deep(x):
            for i in range(500):
                x = jnp.sin(x) * 1.001 + i
            return x
        step = pw.compiled(deep, slice=pw.slice(1), name="deep")
        print(json.dumps({"y": float(step(jnp.ones(4)).result()[0])}))
        """,
        path,
    )
    got = finish(calling)
    finish(compiling)
    # A call was answered and the compile still ran after it. Compiled on the dispatcher thread, the first
    # call after it began waited for the whole compile: the loop then stopped after that one call.
    assert got["calls"] >= 2, got


def test_a_service_that_dies_leaves_its_clients_a_clear_error_and_a_way_back(tmp_path):
    path, log_path = tmp_path / "conn.json", tmp_path / "service.log"
    first = _start_service(path, log_path)
    nb = notebook(
        """
        import json
        pw.connect(CONN)
        s = pw.slice(2)
        f = pw.compiled(lambda x: x + 1, slice=s)
        f(jnp.zeros(4)).result()
        print("connected", flush=True)
        input()                                    # the service is killed meanwhile
        try:
            f(jnp.zeros(4)).result()
        except pw.PathwaysError as e:
            error = f"{type(e).__name__}: {e}"
        input()                                    # a new service runs
        pw.connect(CONN)
        s = pw.slice(2)
        f = pw.compiled(lambda x: x + 1, slice=s)
        print(json.dumps({"error": error, "again": np.asarray(f(jnp.zeros(4)).result()).tolist()}))
        """,
        str(path),
    )
    second = None
    try:
        assert nb.stdout.readline().strip() == "connected", nb.stderr.read()[-3000:]
        first.send_signal(signal.SIGKILL)
        first.wait(HANG_S)
        nb.stdin.write("\n")
        nb.stdin.flush()
        second = _start_service(path, log_path)
        nb.stdin.write("\n")
        nb.stdin.flush()
        got = finish(nb)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(HANG_S)
    print(got["error"])
    assert got["again"] == [1.0, 1.0, 1.0, 1.0]
    assert got["error"].startswith("IslandLostError") and "pw.connect()" in got["error"], got["error"]


def test_a_service_started_for_a_script_stops_when_that_script_is_killed(tmp_path):
    """`--exit-with PID`: a benchmark or test killed at its timeout takes the service it started with it."""
    script = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    path, log_path = tmp_path / "conn.json", tmp_path / "service.log"
    try:
        svc = _start_service(path, log_path, "--exit-with", str(script.pid))
        assert svc.poll() is None  # (running while the script runs)
    finally:
        script.kill()
        script.wait()
    assert svc.wait(HANG_S) == 0, log_path.read_text()[-3000:]
    assert not path.exists()  # stopped as on SIGTERM: its connection file removed
    assert f"process {script.pid} ended (--exit-with): stopping" in log_path.read_text()
    # a pid that runs no process: refused at once, saying so
    gone = subprocess.run([sys.executable, "-m", "pw_kernel", "serve", "--connection-file", str(path),
                           "--exit-with", str(script.pid)], capture_output=True, text=True, env=ENV, timeout=HANG_S)
    assert gone.returncode == 2 and f"--exit-with: no process {script.pid} is running" in gone.stderr, gone.stderr


def _cell(kc, code: str) -> str:
    return run_cell(kc, code, HANG_S)


def test_a_pathways_kernel_restarted_mid_training_goes_on_from_the_kept_state(service):
    """Two real notebook kernels' worth: the installed "Python 3 (Pathways)" kernel, restarted in between."""
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import NoSuchKernel

    path, _ = service
    km = KernelManager(kernel_name="pathways")
    try:
        km.kernel_spec  # noqa: B018 - (the lookup: is it installed here?)
    except NoSuchKernel:
        pytest.skip('the "Python 3 (Pathways)" kernel is not installed (python -m pw_kernel install --sys-prefix)')
    setup = "import numpy as np, jax, jax.numpy as jnp\nimport pw_kernel as pw\n"
    setup += textwrap.dedent(TRAIN).replace("CONN", repr(path))
    km.start_kernel(env={k: v for k, v in ENV.items() if not k.startswith(("PW_", "XLA_"))})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=HANG_S)
        _cell(kc, setup)
        # A stage that prints, run in the service: its line is in this cell, marked with the island.
        said = _cell(kc, """
            loud = pw.compiled(lambda v: (jax.debug.print("kernel saw {}", v.sum()), v + 1)[1], slice=s, name="loud")
            print(np.asarray(loud(jnp.ones(3)).result()), s.island.id)
        """).splitlines()
        assert said[0] == f"[island {said[1].split()[-1]}] kernel saw 3.0" and said[1].startswith("[2. 2. 2.]"), said
        _cell(kc, """
            state = {"w": jnp.zeros((4, 1)), "step": 0}
            for i in range(3):
                w, loss = train(state["w"], x, y)
                state = {"w": w, "step": i + 1}
            pw.keep("kernel-state", state)
        """)
        expected = _cell(kc, 'print(float(train(state["w"], x, y)[1].result()))').strip()
        km.restart_kernel(now=True)                # everything in the kernel is gone
        kc.wait_for_ready(timeout=HANG_S)
        _cell(kc, setup)
        got = _cell(kc, """
            state = pw.kept("kernel-state", slice=s)
            print(state["step"], float(train(state["w"], x, y)[1].result()))
        """).split()
        assert got == ["3", expected]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_pathways_magics_cells_and_pipelines_work_unchanged_through_the_service(service):
    path, _ = service
    nb = notebook(
        """
        import json
        from IPython.testing.globalipapp import get_ipython
        ip = get_ipython()
        ip.run_line_magic("load_ext", "pw_kernel")
        shown = [ip.run_line_magic("pathways", f"connect {CONN}")]
        shown.append(ip.run_line_magic("pathways", "clients"))

        def pipeline_loss():                       # a 2-stage GPipe step, on wherever pw.slice puts slices
            stage = lambda p, x: jnp.tanh(x @ p["w"])
            slices = [pw.slice(2, mesh={"data": 2}) for _ in range(2)]
            pipe = pw.pipeline([stage] * 2, slices=slices, microbatches=2, learning_rate=0.1,
                               loss=lambda out, y: jnp.mean((out - y) ** 2))
            state = pipe.init([{"w": jnp.eye(4) * 0.5} for _ in range(2)])
            state, loss = pipe.step(state, np.ones((4, 4), np.float32), np.zeros((4, 4), np.float32))
            return float(loss.result()), slices[0].remote

        s = pw.slice(2, mesh={"d": 2})
        ip.user_ns.update(jnp=jnp, x=jnp.arange(4.0), f=pw.compiled(lambda v: v * 3, slice=s))
        ip.run_cell_magic("pathways", "--block", "y = f(x) + 1")
        served = pipeline_loss()
        shown.append(ip.run_line_magic("pathways", "disconnect"))
        print(json.dumps([repr(v) for v in shown] + [np.asarray(ip.user_ns["y"]).tolist(), served, pipeline_loss()]))
        """,
        path,
    )
    connected, listed, gone, cell, served, local = finish(nb)
    assert cell == [1.0, 4.0, 7.0, 10.0]
    assert served[1] is True and local[1] is False and served[0] == local[0]  # the same step, here or there
    assert "island" in connected and "pw.slice(n)" in connected
    header, row = listed.splitlines()[1:3]  # the clients as a table: a header, then this kernel's row
    assert "* is this kernel" in listed and header.split()[:2] == ["client", "weight"] and row.split()[:3][2] == "1"
    assert "disconnected" in gone


def test_the_service_process_keeps_what_lives_long_out_of_the_collectors_full_passes():
    # A full collection walks the whole heap with the GIL held (70-300 ms in a loaded service: no request
    # read, no node dispatched meanwhile). What survives one is frozen; a dropped client's leftovers,
    # frozen or not, go at the next full walk of everything, as do cycles that died frozen once the frozen
    # objects have grown by half.
    code = """
import gc, json, weakref
from pw_kernel.service.clients import Heap

class Node:
    pass

heap = Heap()
at_start = gc.get_freeze_count()
a = Node(); a.me = a                      # a cycle that lives on
gc.collect(); heap.tick()                 # a full pass, then the heartbeat freezes what survived it
frozen = gc.get_freeze_count()
gone = weakref.ref(a); del a              # now garbage, but frozen: a full pass does not see it
gc.collect(); hidden = gone() is not None
heap.collect_soon(); heap.tick()          # a client dropped: everything walked
refrozen = gc.get_freeze_count()
# A client that never leaves: cycles that died frozen go once the frozen objects grow by half.
junk = [Node() for _ in range(refrozen)]  # as many objects again as are frozen, each a cycle
for n in junk:
    n.me = n
gc.collect(); heap.tick()                 # frozen (they were not yet, so this tick walks nothing)
walks = heap.walks
dead = weakref.ref(junk[0]); del junk, n
gc.collect(); hidden_again = dead() is not None
heap.tick()                               # the frozen objects doubled since the last walk: everything walked
print(json.dumps({"at_start": at_start, "frozen": frozen, "hidden": hidden, "collected": gone() is None,
                  "refrozen": refrozen, "hidden_again": hidden_again, "walked": heap.walks - walks,
                  "collected_again": dead() is None, "after": gc.get_freeze_count()}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["at_start"] > 1000  # the interpreter's own state, frozen at start
    assert got["frozen"] > got["at_start"]
    assert got["hidden"] and got["collected"]
    assert got["refrozen"] > 1000
    assert got["hidden_again"] and got["walked"] == 1 and got["collected_again"]
    assert got["after"] < 1.5 * got["refrozen"]  # what is frozen stays within REWALK_GROWTH of what lives


def test_bad_input_and_a_stale_connection_file_say_what_to_do(tmp_path):
    import re

    import pw_kernel as pw

    with pytest.raises(pw.ArgumentError, match=re.escape("`pw.connect(weight=...)` must be a positive number")):
        pw.connect(weight=0)
    with pytest.raises(pw.PathwaysError, match=re.escape("no Pathways service connection file at")):
        pw.connect(str(tmp_path / "nope.json"))
    stale = tmp_path / "stale.json"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale.write_text(json.dumps({"transport": "tcp", "ip": "127.0.0.1", "port": 1, "key": "k",
                                 "signature_scheme": "hmac-sha256", "pid": dead.pid}))
    with pytest.raises(pw.PathwaysError, match=re.escape(f"(pid {dead.pid}) is no longer running")):
        pw.connect(str(stale))
    with pytest.raises(pw.PathwaysError, match=re.escape("`pw.keep` needs a connection to a Pathways service")):
        pw.keep("state", {"w": 1.0})
    # (A process may serve and be a client of its own service: tests/test_service_layer.py.)


def test_a_cancel_and_a_priority_reach_the_nodes_the_service_has_queued(service):
    path, _ = service
    nb = notebook(
        """
        import json
        pw.connect(CONN, name="urgent")
        s = pw.slice(1)
        f = pw.compiled(lambda a: jnp.tanh(a @ a) * 0.5, slice=s)
        a = f(jnp.eye(1024) * 0.1)
        a.result()

        @pw.program
        def chain(a):
            for _ in range(40):
                a = f(a)
            return a

        chain.submit(a, mode="chained").wait()           # compiled and warm
        me = lambda: next(c for c in pw.clients() if c.you)
        out = {}

        def in_the_service(runs):                         # until the service has counted one more run of ours
            deadline = time.monotonic() + 120             # (a hang guard)
            while me().runs == runs:
                assert time.monotonic() < deadline, "the service never got the run"
                time.sleep(0.001)

        # Cancel: a program's 40 nodes go to the service in one burst; a cancel drops those still queued there.
        before = me()
        run = chain.submit(a, mode="chained")
        in_the_service(before.runs)
        run.cancel()
        f(a).result()                                     # after what the service still had of it
        out["cancelled_ran"] = me().nodes - before.nodes - 1

        # Priority: an urgent call passes this client's own work queued at the service before it.
        before = me()
        backlog = chain.submit(a, mode="chained")
        in_the_service(before.runs)
        f.program.submit(a, priority=10).wait()
        out["ran_when_urgent_done"] = me().nodes - before.nodes
        backlog.wait()
        print(json.dumps(out))
        """,
        path,
    )
    got = finish(nb)
    # Without the cancel reaching the service, all 40 run (they were sent); with it, only those before it.
    assert got["cancelled_ran"] < 40, got
    # Without the priority, the urgent call runs after the 40-node backlog (41 nodes done); with it, first (1).
    assert got["ran_when_urgent_done"] < 40, got


def test_pw_profile_in_a_client_shows_the_services_xla_ops_inside_its_nodes(service):
    path, _ = service
    nb = notebook(
        """
        import json
        pw.connect(CONN, name="profiler")
        s = pw.slice(1)
        f = pw.compiled(lambda a: jnp.tanh(a @ a) * 0.5, slice=s, name="mm")
        a = f(jnp.eye(256) * 0.1)
        a.result()
        with pw.profile() as prof:
            b = f(a)
            b.result()
        run = b.run
        mine = [op for op in prof.ops if op.run_id == run.id]
        remote_devices = {d for n in prof.nodes if n.run_id == run.id for d in n.devices}
        print(json.dumps({"ops": len(mine), "in": sorted({op.shapes.split(" in ")[-1] for op in mine}),
                          "devices": sorted({d for op in mine for d in op.devices}),
                          "node_devices": sorted(remote_devices), "island": s.island.id,
                          "inside": all(n.start - 50_000 <= op.start and op.end <= n.end + 50_000
                                        for op in mine for n in prof.nodes if n.run_id == run.id)}))
        """,
        path,
    )
    got = finish(nb)
    assert got["ops"] > 0 and got["in"] == ["mm"], got
    assert got["devices"] == got["node_devices"] and all(d >= 1000 for d in got["devices"]), got  # the service's
    assert got["inside"], got


def test_what_a_stage_prints_in_the_service_comes_back_to_the_client_whose_run_it_was(service):
    # Two notebooks run stages that print (jax.debug.print, a callback that prints and logs) while the
    # service interleaves their nodes: each gets its own lines, in order, marked with the island.
    path, _ = service
    code = """
        import json, logging
        name = ARGS[0]
        pw.connect(CONN, name=name)
        lines = []
        pw.controller().events.subscribe(lambda out: lines.append((out.island, out.stream, out.text)), kinds=("output",))

        def note(total):
            logging.getLogger("stage").warning("%s logged %d", name, int(total))

        def stage(x):
            jax.debug.print(name + " saw {}", x.sum().astype(jnp.int32))
            jax.debug.callback(note, x.sum())
            return x + 1

        s = pw.slice(2, mesh={"d": 2})
        f = pw.compiled(stage, slice=s, name="stage")
        x = jnp.zeros(4)
        for _ in range(12):
            x = f(x)                                  # queued together: the service runs them among the other's
        x.result()

        def bad(v):
            raise ValueError(name + " refuses")

        boom = pw.compiled(lambda x: (jax.debug.callback(bad, x.sum()), x * 2)[1], slice=s, name="boom")
        try:
            boom(x).result()
            error = None
        except Exception as e:
            error = str(e)
        print(json.dumps({"lines": lines, "island": s.island.id, "error": error}))
        """
    a, b = notebook(code, path, "ann"), notebook(code, path, "bob")
    for got, me, other in ((finish(a), "ann", "bob"), (finish(b), "bob", "ann")):
        said = [(stream, text.strip()) for island, stream, text in got["lines"]]
        assert all(island == got["island"] for island, _, _ in got["lines"]), got
        printed = [text for stream, text in said if stream == "stdout"]
        assert printed == [f"{me} saw {4 * k}" for k in range(12)], said
        logged = [text for stream, text in said if stream == "stderr"]
        assert len(logged) == 12 and all(f"{me} logged" in t for t in logged), said
        assert not any(other in text for _, text in said), said
        # A callback that raised failed its node with its traceback, and the client's run with it.
        assert got["error"] and f"ValueError: {me} refuses" in got["error"], got["error"]

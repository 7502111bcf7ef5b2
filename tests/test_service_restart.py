"""A restart that loses nothing: kept trees on the service's disk, and a notebook that goes on after a restart.

Services are ``python -m pw_kernel serve --state DIR`` processes, killed with SIGKILL (no goodbye, no
cleanup) and started again on the same connection file and state folder; clients are fresh Python
processes, as a user's kernels are. Times appear only as hang guards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

pytestmark = pytest.mark.system

pytest.importorskip("zmq")
pytest.importorskip("orbax.checkpoint")

DEVICES = 4
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PW_NUM_CPU_DEVICES": str(DEVICES), "PW_VALIDATE": "0"}
HANG_S = 120  # a guard against hangs only


def start_service(path: Path, state: Path, log_path: Path) -> subprocess.Popen:
    """``python -m pw_kernel serve`` on ``path``, its kept trees in ``state``; returns once it wrote the file."""
    log = open(log_path, "a")  # noqa: SIM115 - the service writes its log there for as long as it runs
    proc = subprocess.Popen(
        [sys.executable, "-m", "pw_kernel", "serve", "--connection-file", str(path), "--state", str(state),
         "--exit-with", str(os.getpid())],
        stdout=log, stderr=subprocess.STDOUT, env=ENV,
    )
    deadline = time.monotonic() + HANG_S
    while not _written_by(path, proc.pid):  # (the file of the killed service is still there before)
        assert proc.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, "the service did not write its connection file"
        time.sleep(0.05)
    return proc


def _written_by(path: Path, pid: int) -> bool:
    try:
        return json.loads(path.read_text())["pid"] == pid
    except (OSError, ValueError, KeyError):
        return False


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(HANG_S)


def stop(*procs) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(HANG_S)


def notebook(code: str, conn: Path) -> subprocess.Popen:
    """A client process ("a notebook") running ``code`` with ``CONN`` (the connection file) defined."""
    prelude = (
        "import json, numpy as np, jax, jax.numpy as jnp\nfrom jax.sharding import PartitionSpec as P\n"
        f"import pw_kernel as pw\nCONN = {str(conn)!r}\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )


def said(proc: subprocess.Popen) -> str:
    """The next line a notebook prints (it waits at ``input()`` after it)."""
    line = proc.stdout.readline().strip()
    assert line, proc.stderr.read()[-3000:]
    return line


def go_on(proc: subprocess.Popen) -> None:
    proc.stdin.write("\n")
    proc.stdin.flush()


def finish(proc: subprocess.Popen) -> dict:
    """Wait for a notebook; the JSON it printed last."""
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_a_kept_tree_survives_a_sigkill_of_the_service_and_a_new_client_gets_it_back(tmp_path):
    conn, state, log = tmp_path / "conn.json", tmp_path / "state", tmp_path / "service.log"
    keeper = first = second = None
    try:
        first = start_service(conn, state, log)
        keeper = notebook(
            """
            pw.connect(CONN, name="keeper")
            s = pw.slice(2, mesh={"d": 2})
            w = pw.compiled(lambda x: x * 2, slice=s, in_specs=P("d"), out_specs=P("d"))(jnp.arange(8.0))
            b = pw.compiled(lambda x: x + 1, slice=pw.slice(1))(jnp.ones((2, 3), jnp.int32))
            pw.keep("state", {"w": w, "b": b, "lr": 0.5, "tag": "run-1", "steps": [3, w]})
            print("kept", flush=True)
            input()
            """,
            conn,
        )
        assert said(keeper) == "kept"
        kill(first)  # at once: the keep had returned, so the tree is on disk whole
        stop(keeper)
        second = start_service(conn, state, log)
        got = finish(notebook(
            """
            pw.connect(CONN, name="later")
            t = pw.kept("state")
            w = t["w"]
            s = pw.slice(2, mesh={"d": 2})
            doubled = pw.compiled(lambda x: x * 2, slice=s, in_specs=P("d"))(w)  # (runs on its two devices there)
            print(json.dumps({
                "names": pw.kept(), "w": np.asarray(w).tolist(), "b": np.asarray(t["b"]).tolist(),
                "b_dtype": str(np.asarray(t["b"]).dtype), "lr": t["lr"], "tag": t["tag"],
                "steps": [t["steps"][0], np.asarray(t["steps"][1]).tolist()], "spec": list(w.sharding.spec),
                "mesh": dict(w.sharding.mesh.shape), "doubled": np.asarray(doubled.result()).tolist(),
            }))
            """,
            conn,
        ))
    finally:
        stop(keeper, first, second)
    assert got["names"] == ["state"]
    np.testing.assert_array_equal(got["w"], np.arange(8.0) * 2)
    np.testing.assert_array_equal(got["b"], np.full((2, 3), 2))
    assert got["b_dtype"] == "int32"
    assert (got["lr"], got["tag"]) == (0.5, "run-1")
    assert got["steps"][0] == 3
    np.testing.assert_array_equal(got["steps"][1], np.arange(8.0) * 2)
    assert got["spec"] == ["d"] and got["mesh"] == {"d": 2}
    np.testing.assert_array_equal(got["doubled"], np.arange(8.0) * 4)


def test_after_a_restart_the_old_notebook_goes_on_and_old_arrays_say_what_to_rerun(tmp_path):
    conn, state, log = tmp_path / "conn.json", tmp_path / "state", tmp_path / "service.log"
    nb = first = second = None
    try:
        first = start_service(conn, state, log)
        nb = notebook(
            """
            pw.connect(CONN, name="nb")
            s = pw.slice(2, mesh={"d": 2}, name="train")
            f = pw.compiled(lambda x: x * 3, slice=s, in_specs=P("d"), out_specs=P("d"))
            old = f(jnp.arange(4.0))
            old.remote_array().block_until_ready()            # computed there; never fetched here
            pw.keep("mark", {"m": f(jnp.ones(4))})
            before = np.asarray(f(jnp.arange(4.0)).result()).tolist()
            print("ready", flush=True)
            input()                                           # the service is killed and started again
            out = {"before": before}
            pw.connect(CONN, name="nb")                       # the same island, on the new service
            out["again"] = np.asarray(f(jnp.arange(4.0) + 1).result()).tolist()
            g = pw.compiled(lambda x: x - 1, slice=s)         # a new function on the old slice object
            out["new_fn"] = np.asarray(g(jnp.zeros(2)).result()).tolist()
            out["same_island"] = pw.slice(1).island.id == s.island.id
            for what, use in (("fetch", lambda: old.result()), ("call", lambda: f(old).result())):
                try:
                    use()
                    out[what] = "no error"
                except pw.PathwaysError as e:
                    out[what] = f"{type(e).__name__}: {e}"
            out["still"] = np.asarray(f(jnp.ones(4)).result()).tolist()  # (an old array's error harms nothing)
            out["kept"] = np.asarray(pw.kept("mark")["m"]).tolist()
            print(json.dumps(out))
            """,
            conn,
        )
        assert said(nb) == "ready"
        kill(first)
        second = start_service(conn, state, log)
        go_on(nb)
        got = finish(nb)
    finally:
        stop(nb, first, second)
    assert got["before"] == [0.0, 3.0, 6.0, 9.0]
    assert got["again"] == [3.0, 6.0, 9.0, 12.0]  # the old function object, on the old slice object
    assert got["new_fn"] == [-1.0, -1.0] and got["same_island"]
    assert got["kept"] == got["still"] == [3.0, 3.0, 3.0, 3.0]
    assert got["fetch"].startswith("IslandLostError: Fetching it"), got["fetch"]
    assert "IslandLostError: A call with it" in got["call"], got["call"]  # (the node's error: a NodeError says which)
    for what in ("fetch", "call"):
        message = got[what]
        assert f"before its process restarted (pid {first.pid} -> {second.pid}" in message, message
        assert "Re-run the cell that made it" in message and "pw.kept(name)" in message, message
        assert "['mark']" in message, message  # the kept names, to get back


def test_unkeep_removes_the_tree_from_disk_and_a_restart_does_not_bring_it_back(tmp_path):
    """`pw_kernel.service.unkeep` (`pw.unkeep` where exported): gone from the folder, and after a restart."""
    conn, state, log = tmp_path / "conn.json", tmp_path / "state", tmp_path / "service.log"
    nb = first = second = None
    try:
        first = start_service(conn, state, log)
        nb = notebook(
            """
            pw.connect(CONN)
            x = pw.compiled(lambda v: v + 1, slice=pw.slice(1))(jnp.zeros(3))
            pw.keep("gone", {"x": x})
            pw.keep("stays", [x, 7])
            pw.keep("stays", [x, 8])                           # kept again: replaces it, on disk too
            from pw_kernel.service import unkeep
            print(json.dumps({"unkept": unkeep("gone"), "again": unkeep("gone")}))
            input()
            """,
            conn,
        )
        got = json.loads(said(nb))
        assert got == {"unkept": True, "again": False}
        on_disk = sorted(p.name for p in state.glob("*/*"))
        kill(first)
        stop(nb)
        second = start_service(conn, state, log)
        after = finish(notebook('pw.connect(CONN); t = pw.kept("stays")\nprint(json.dumps([pw.kept(), t[1]]))', conn))
    finally:
        stop(nb, first, second)
    assert on_disk == ["k-stays"]
    assert after == [["stays"], 8]
    assert [len(list(p.iterdir())) for p in state.glob("*/k-stays")] == [1]  # one version of it, the newest


_SAVER = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pw_kernel.service.clients import Kept
from pw_kernel.service.store import KeptStore

store = KeptStore.open(sys.argv[1], jax.devices())
sharding = NamedSharding(Mesh(np.array(jax.devices()[:2]), ("d",)), PartitionSpec("d"))
for i in range(1, 10_000):
    leaves = [("a", jax.device_put(jnp.full((256, 1024), float(i)), sharding), (256, 1024), "float32",
               ((2,), ("d",), (0, 1)), ("d",)) for _ in range(4)] + [("c", i)]
    print(i, flush=True)
    store.save("me", "tree", Kept(leaves, b"", "saver"))
"""


def test_a_service_killed_while_writing_leaves_a_whole_tree_or_the_one_before(tmp_path):
    """Saves in a loop, killed with SIGKILL mid-way: what comes back is one version whole, never a mix."""
    from pw_kernel.service.store import KeptStore

    saver = subprocess.Popen([sys.executable, "-c", _SAVER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             env=ENV)
    try:
        for _ in range(6):  # (the sixth save has just begun)
            started = int(saver.stdout.readline())
        kill(saver)
    finally:
        stop(saver)
    kept = KeptStore.open(str(tmp_path), jax.devices()).restore()[("me", "tree")]
    version = kept.leaves[-1][1]
    assert version in (started - 1, started), (version, started)
    for leaf in kept.leaves[:-1]:
        np.testing.assert_array_equal(np.asarray(leaf[1]), np.full((256, 1024), float(version)))
        assert leaf[1].sharding.spec == PartitionSpec("d") and len(leaf[1].sharding.device_set) == 2
    leftovers = [p.name for p in tmp_path.rglob("*") if p.name.startswith((".tmp-", ".trash-"))]
    assert leftovers == []  # (what the kill left was deleted when the store was read)


def test_a_kept_prng_key_and_a_bfloat16_leaf_come_back_as_they_were(tmp_path):
    from pw_kernel.service.clients import Kept
    from pw_kernel.service.store import KeptStore

    devices = jax.devices()
    one = NamedSharding(Mesh(np.array(devices[1:2]), ("x",)), PartitionSpec())
    key = jax.device_put(jax.random.key(7), one)
    half = jax.device_put(jnp.linspace(0, 1, 6, dtype=jnp.bfloat16), one)
    where = ((1,), ("x",), (0,))
    leaves = [("a", key, (), "key<fry>", where, ()), ("a", half, (6,), "bfloat16", where, ())]
    KeptStore.open(str(tmp_path), devices).save("me", "k", Kept(leaves, b"td", "me"))
    back = KeptStore.open(str(tmp_path), devices).restore()[("me", "k")]
    assert back.treedef == b"td" and back.by == "me"
    k2, h2 = back.leaves[0][1], back.leaves[1][1]
    assert jax.dtypes.issubdtype(k2.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(k2), jax.random.key_data(key))
    assert h2.dtype == jnp.bfloat16 and {d.id for d in h2.devices()} == {devices[1].id}
    np.testing.assert_array_equal(np.asarray(h2, np.float32), np.asarray(half, np.float32))

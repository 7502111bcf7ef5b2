"""The Pathways service over a Ray cluster (issue 50): a pipeline across two hosts, island-to-island transfer,
a client's call on a Ray node's island, a host killed. Every ratio is measured in one run, interleaved.

    python benchmarks/cluster.py [--stage-ms 20] [--mib 64] [--rounds 5] [--json out.json] [--quick]

Starts a local 3-node Ray cluster (`ray.cluster_utils.Cluster`: a head and two worker nodes, each a
raylet of its own, all on 127.0.0.1, small object stores, a node declared dead after ~1.5 s of missed
health checks; Ray's default takes ~15 s), a service over it (``python -m pw_kernel serve --ray ADDRESS
--ray-devices 2``: each node's 2 simulated CPU devices an island) and a one-host service without Ray
(row 3's baseline). This process is a Ray driver (the raw Ray side of row 2, killing a node) and a
client of the Ray service (``pw.connect``); row 3's callers and row 4's losing client are subprocesses.
"Hosts" are Ray nodes: on this machine they share its cores.

1. **Pipeline across two hosts.** A 2-stage pipeline (each stage ``--reps`` tanh(x @ x) of
   ``--n`` x ``--n`` float32, sized so one stage takes ~``--stage-ms`` here), ``--steps`` steps
   submitted ahead and waited at the end, through the service: the stages on the two worker nodes'
   islands, against both stages on one node's island (two 1-device slices of it). The service has one
   island per Ray node, so "one host" is one island's two devices. Target: >= 0.9x the steps/s.
2. **Island-to-island transfer** of ``--mib`` MiB between the two worker nodes: a waited tiny call on
   node B's island reading a value computed on node A's (the service moves it, through Ray's object
   store), less the same call on a value already on B; against raw Ray's put + get: an actor on A
   ``ray.put``-ting its array (made before the clock starts) and an actor on B ``ray.get``-ting it,
   chained by Ray, less a no-op call of B. Target: >= 0.8x the bandwidth.
3. **A waited tiny call** (``x + 1`` on float32[16] living in the service) on a Ray node's island of
   the Ray service, against the same call on the service's own island of a one-host service (each from
   a client process of its own, rounds interleaved). Target: <= 1.5x.
4. **A host killed** (SIGKILL of worker node B's raylet and processes) while another client has runs
   queued on its island: this client's next call on node A's island, beyond an idle call, against
   the run-ahead bound (``pw.Config().run_ahead_s``) plus one of the lost client's nodes (target <= 1x),
   and the seconds from the kill until the lost client's every run has failed (target <= 10 s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
from service import Proc, stop_service

sys.path.insert(0, str(common.ROOT / "tests"))
import ray_cluster  # noqa: E402 - the test clusters' way to kill a node, shared

LOOPBACK = "127.0.0.1"
#: Ray's health check as tests/ray_cluster.py sets it: a dead node is declared after 3 missed checks of
#: 0.5 s (~1.5 s); Ray's default (5 missed checks of 3 s) takes ~15 s.
FAST_NODE_DEATH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}

#: Row 3's client: connects, waits for a number of calls on stdin, prints their seconds as JSON.
CALLER = r"""
import json, sys, time
import pw_kernel as pw
import jax.numpy as jnp
conn, where = sys.argv[1], sys.argv[2]
pw.connect(conn, name="caller-" + where)
if where == "own":
    s = pw.slice(1)
else:
    isl = next(i for i in pw.islands() if i.remote is not None and i.remote.info.get("node_id") == where)
    s = pw.slice(1, island=isl.id)
f = pw.compiled(lambda x: x + 1, slice=s, name="tiny")
xs = f(jnp.ones(16, jnp.float32))
for _ in range(5):
    f(xs).result()
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "exit":
        break
    took, inside = [], []
    for _ in range(int(line)):
        t = time.perf_counter_ns()
        y = f(xs)
        y.result()
        took.append((time.perf_counter_ns() - t) / 1e9)
        try:  # (the service stamps when the call arrived and when its controller had the result)
            arrived, done = y.remote_array().timing()
            inside.append((done - arrived) / 1e9)
        except Exception:
            pass
    print("t " + json.dumps([took, inside]), flush=True)
pw.disconnect()
"""

#: Row 4's losing client: queues matmul runs on the island of the node that will be killed, prints "queued",
#: (after "go" on stdin), then waits for each and prints "lost <monotonic of the last failure> <failed> <completed>".
LOSER = r"""
import sys, time
import pw_kernel as pw
import jax.numpy as jnp
conn, node, size, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pw.connect(conn, name="loser")
isl = next(i for i in pw.islands() if i.remote is not None and i.remote.info.get("node_id") == node)
s = pw.slice(1, island=isl.id)
f = pw.compiled(lambda a: jnp.tanh(a @ a) * 0.5, slice=s, name="matmul")
a0 = f(jnp.eye(size, dtype=jnp.float32) * 0.1)
a0.result()
print("ready", flush=True)
sys.stdin.readline()  # "go"
used = lambda: next(c.device_time_s for c in pw.clients() if c.you)
t, d = time.perf_counter(), used()
for _ in range(5):
    f(a0).result()
print("node", (time.perf_counter() - t) / 5, (used() - d) / 5, flush=True)  # waited calls; device time
outs = [f(a0) for _ in range(runs)]
print("queued", flush=True)
failed = done = 0
last = None
for o in outs:
    try:
        o.result(timeout=120)
        done += 1
    except Exception as e:
        failed += 1
        last = time.monotonic()
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
print("why", why if failed else "-", flush=True)
print("lost", last if last is not None else "none", failed, done, flush=True)
sys.stdin.readline()
"""


class Cluster:
    """A head and ``workers`` worker nodes on 127.0.0.1 (Ray's own multi-node harness), this process a driver."""

    def __init__(self, workers: int, store_mib: int):
        import ray
        from ray._common.utils import reset_ray_address
        from ray.cluster_utils import Cluster as RayCluster

        from pw_kernel.runtime.extend import init_ray

        args = {"node_ip_address": LOOPBACK, "num_cpus": 1, "object_store_memory": store_mib * 2**20}
        self.cluster = RayCluster(initialize_head=True, head_node_args={
            **args, "resources": {"node-0": 1}, "include_dashboard": False, "_system_config": FAST_NODE_DEATH})
        reset_ray_address()  # (the address is this benchmark's alone: no bare ray.init() elsewhere joins it)
        self.nodes = [self.cluster.head_node]
        for k in range(1, workers + 1):
            self.nodes.append(self.cluster.add_node(**args, resources={f"node-{k}": 1}))
        self.cluster.wait_for_nodes()
        self.address = self.cluster.address
        init_ray(self.address, log_to_driver=False)
        self.ray = ray

    def kill(self, k: int) -> float:
        """SIGKILL worker node ``k``'s raylet and processes, as a host dies; `time.monotonic()` just before.

        Its workers too, at once: a worker whose raylet died goes on with its current call, and on this
        machine it takes a core the other "hosts" share (a dead host's processes take nothing)."""
        at = time.monotonic()
        ray_cluster.kill_processes(self.cluster, self.nodes[k])
        self.nodes[k] = None
        return at

    def shutdown(self) -> None:
        self.ray.shutdown()
        self.cluster.shutdown()


def start_service(conn: Path, log: Path, env: dict, *extra: str) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "pw_kernel", "serve", "--connection-file", str(conn),
                                 "--state", str(conn.with_suffix(".state")), "--exit-with", str(os.getpid()),
                                 *extra],
                                stdout=out, stderr=subprocess.STDOUT, cwd=common.ROOT, env=env)


def wait_service(proc: subprocess.Popen, conn: Path, log: Path, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = json.loads(conn.read_text())
            if info["pid"] == proc.pid:
                return info
        except (OSError, ValueError, KeyError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the service did not start (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def calibrate(n: int, stage_ms: float) -> tuple[int, float]:
    """How many tanh(x @ x) of n x n make one stage of ~stage_ms here (jax.jit on this process's CPU); (reps, ms)."""
    import jax
    import jax.numpy as jnp

    x = jnp.eye(n, dtype=jnp.float32) * 0.1
    one = jax.jit(lambda a: jnp.tanh(a @ a) * 0.5)
    one(x).block_until_ready()
    ms = 1e3 * statistics.median(common.timed(lambda: one(x).block_until_ready(), 10, min_window_s=0.2))
    reps = max(1, round(stage_ms / ms))
    return reps, reps * ms


def pipeline(args, ray_islands: dict) -> dict:
    """Row 1: steps/s of a 2-stage pipeline, stages on two nodes' islands / both on one node's island."""
    import jax.numpy as jnp

    import pw_kernel as pw

    reps, local_ms = calibrate(args.n, args.stage_ms)
    a, b = ray_islands[1], ray_islands[2]
    layouts = {"two hosts": (pw.slice(1, island=a.id), pw.slice(1, island=b.id))}
    s0, s1 = pw.slice(1, island=a.id), pw.slice(1, island=a.id)
    if s0.devices == s1.devices:
        raise RuntimeError(f"two 1-device slices of island {a.id} share a device: {s0.devices}")
    layouts["one host"] = (s0, s1)

    def stage(x):
        for _ in range(reps):
            x = jnp.tanh(x @ x) * 0.5
        return x

    progs, inputs = {}, {}
    for name, (sa, sb) in layouts.items():
        st1 = pw.compiled(stage, slice=sa, name="stage1")
        st2 = pw.compiled(stage, slice=sb, name="stage2")

        @pw.program(name="pipe")
        def pipe(x, st1=st1, st2=st2):
            return st2(st1(x))

        x0 = pw.compiled(lambda x: x * 1.0, slice=sa, name="input")(jnp.eye(args.n, dtype=jnp.float32) * 0.1)
        pipe.submit(x0, mode="chained").outputs.result()  # compiled, shipped
        progs[name], inputs[name] = pipe, x0
    # a stage's time on a node's island: a chain of 8 stages there, waited, less one
    st = pw.compiled(stage, slice=layouts["one host"][0], name="stage")

    @pw.program(name="chain")
    def chain(x, k=8):
        for _ in range(k):
            x = st(x)
        return x

    x0 = inputs["one host"]
    chain.submit(x0, mode="chained").outputs.result()
    chain8 = statistics.median(common.timed(lambda: chain.submit(x0, mode="chained").outputs.result(), 3))
    stage_ms = chain8 / 8 * 1e3

    def steps(name: str) -> None:
        runs = [progs[name].submit(inputs[name], mode="chained") for _ in range(args.steps)]
        for r in runs:
            r.wait()

    samples = common.interleaved({k: (lambda k=k: steps(k)) for k in progs}, args.rounds, warmup=1, min_window_s=0)
    rate = {k: args.steps / statistics.median(v) for k, v in samples.items()}
    return {"n": args.n, "reps": reps, "stage_ms_local": local_ms, "stage_ms_island": stage_ms,
            "steps": args.steps, "rounds": len(samples["one host"]), "steps_per_s": rate,
            "samples_s": samples, "ratio": rate["two hosts"] / rate["one host"],
            "activation_mib": args.n * args.n * 4 / 2**20}


def transfer(args, ray_islands: dict, node_ids: dict) -> dict:
    """Row 2: seconds to move ``--mib`` MiB from node A's island to node B's (through the service), and raw Ray's."""
    import jax.numpy as jnp
    import numpy as np
    import ray

    import pw_kernel as pw

    n = args.mib * 2**20 // 4
    sa, sb = pw.slice(1, island=ray_islands[1].id), pw.slice(1, island=ray_islands[2].id)
    make_a = pw.compiled(lambda s: jnp.full((n,), s, jnp.float32), slice=sa, name="make")
    make_b = pw.compiled(lambda s: jnp.full((n,), s, jnp.float32), slice=sb, name="make")
    probe_a = pw.compiled(lambda x: x[:1], slice=sa, name="probe")
    use_b = pw.compiled(lambda x: x[:1], slice=sb, name="use")

    @ray.remote(num_cpus=0)
    class Side:
        def make(self, n: int, s: float) -> int:
            self.value = np.full(n, s, np.float32)  # (made before the clock starts, as pw's is computed first)
            return self.value.nbytes

        def put(self) -> list:
            return [ray.put(self.value)]  # (in a list: the ref itself, owned here, goes back)

        def fetch(self, refs: list) -> int:
            return ray.get(refs[0]).nbytes

        def noop(self) -> int:
            return 0

    ra = Side.options(resources={"node-1": 0.01}).remote()
    rb = Side.options(resources={"node-2": 0.01}).remote()

    def pw_round(r: int) -> dict:
        xa, xb = make_a(jnp.float32(r)), make_b(jnp.float32(r))
        probe_a(xa).result(), use_b(xb).result()  # both computed: what follows times the move alone
        t = time.perf_counter()
        use_b(xb).result()  # the same call without a move first (after it, the moved copy's free would follow)
        here = time.perf_counter() - t
        t = time.perf_counter()
        got = use_b(xa).result()  # the service moves xa to B (Ray's object store), then the tiny call
        move = time.perf_counter() - t
        assert float(np.asarray(got)[0]) == r
        del xa, xb
        return {"with": move, "without": here, "transfer": move - here}

    def ray_round(r: int) -> dict:
        ray.get(ra.make.remote(n, float(r)))
        ray.get([ra.noop.remote(), rb.noop.remote()])
        t = time.perf_counter()
        ray.get(rb.noop.remote())
        here = time.perf_counter() - t
        # The target's "put + get": A puts its array in its store, B gets it; chained by Ray as the service's
        # two calls are (B's call reads A's reply, the ref, without a round trip through this process).
        t = time.perf_counter()
        nbytes = ray.get(rb.fetch.remote(ra.put.remote()))
        move = time.perf_counter() - t
        assert nbytes == n * 4
        return {"with": move, "without": here, "transfer": move - here}

    modes = {"pw": pw_round, "ray": ray_round}
    for fn in modes.values():  # compiles, warms the object stores
        fn(-1)
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.transfer_rounds):
        order = list(modes)[r % 2:] + list(modes)[: r % 2]
        for m in order:
            rows[m].append(modes[m](r))
    for a in (ra, rb):
        ray.kill(a)
    nbytes = n * 4
    out = {"mib": args.mib, "rounds": args.transfer_rounds, "samples": rows}
    for m in modes:
        s = statistics.median(x["transfer"] for x in rows[m])
        out[m] = {"transfer_s": s, "gib_s": nbytes / max(s, 1e-9) / 2**30,
                  "with_s": statistics.median(x["with"] for x in rows[m]),
                  "without_s": statistics.median(x["without"] for x in rows[m])}
    out["ratio"] = out["pw"]["gib_s"] / out["ray"]["gib_s"]
    return out


def calls(args, callers: dict[str, Proc]) -> dict:
    """Row 3: µs of a waited tiny call from a client of each service, rounds interleaved (medians)."""
    for c in callers.values():
        c.expect("ready", timeout=240)
    samples: dict[str, list[float]] = {k: [] for k in callers}
    inside: dict[str, list[float]] = {k: [] for k in callers}
    names = list(callers)
    for r in range(args.call_rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            c = callers[name]
            mark = c.send(str(args.calls))
            deadline = time.monotonic() + 120
            while True:
                with c.cond:
                    got = [ln for ln in c.lines[mark:] if ln.startswith("t ")]
                    if got:
                        break
                    if c.p.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{c.name} did not answer:\n" + "\n".join(c.err[-30:]))
                    c.cond.wait(0.1)
            took, there = json.loads(got[0][2:])
            samples[name] += took
            inside[name] += there
    for c in callers.values():
        c.send("exit")
    stats = {k: common.Stat.of(v, 1e6) for k, v in samples.items()}
    return {"us": {k: s.median for k, s in stats.items()}, "stats": {k: s.as_dict() for k, s in stats.items()},
            "in_service_us": {k: statistics.median(v) * 1e6 if v else None for k, v in inside.items()},
            "ratio": stats["ray node island"].median / stats["one-host service"].median,
            "window_s": common.window(samples)}


def killed(args, cluster: Cluster, ray_islands: dict, loser: Proc) -> dict:
    """Row 4: kill node 2 while the loser has runs queued on its island; this client's next call on node 1's."""
    import jax.numpy as jnp

    import pw_kernel as pw

    s = pw.slice(1, island=ray_islands[1].id)
    f = pw.compiled(lambda x: x + 1, slice=s, name="tiny")
    xs = f(jnp.ones(16, jnp.float32))
    idle = statistics.median(common.timed(lambda: f(xs).result(), 20, warmup=3))
    loser.expect("ready", timeout=240)
    loser.expect("queued", since=loser.send("go"), timeout=120)
    call_s, device_s = (float(x) for x in next(ln for ln in loser.lines if ln.startswith("node ")).split()[1:])
    node_s = device_s if device_s > 0 else call_s  # (a node's device time, as the service counts it)
    at = cluster.kill(2)  # (returns once the node's processes are SIGKILLed)
    t = time.perf_counter()
    y = f(xs)
    y.result()
    wait = time.perf_counter() - t
    try:  # where the wait went: until the service had the call, there, and back
        arrived_ns, done_ns = y.remote_array().timing()
        split = {"arrived_s": arrived_ns / 1e9 - t, "in_service_s": (done_ns - arrived_ns) / 1e9}
    except Exception:  # noqa: BLE001 - (no stamps: the split is left out)
        split = {}
    deadline = time.monotonic() + 120
    while not any(ln.startswith("lost ") for ln in loser.lines):
        if loser.p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the losing client did not report:\n" + "\n".join(loser.err[-30:]))
        time.sleep(0.05)
    _, last, failed, done = next(ln for ln in loser.lines if ln.startswith("lost ")).split()
    why = next(ln for ln in loser.lines if ln.startswith("why "))[4:]
    lost_s = float(last) - at if last != "none" else None
    island_lost = [i.id for i in pw.islands() if i.lost]
    after = statistics.median(common.timed(lambda: f(xs).result(), 10, warmup=1))
    run_ahead_s = pw.Config().run_ahead_s or 0.0
    extra = wait - idle
    return {"idle_s": idle, "wait_s": wait, "extra_wait_s": extra, "node_s": node_s, "run_ahead_s": run_ahead_s,
            "bound_s": run_ahead_s + node_s, "node_call_s": call_s, "lost_s": lost_s, "failed": int(failed), "completed": int(done),
            "error": why, "islands_lost_here": island_lost, **split, "call_after_s": after, "runs": args.loser_runs}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage-ms", type=float, default=20.0, help="a pipeline stage's time to size its matmuls to")
    ap.add_argument("--n", type=int, default=512, help="the stages' n x n activations")
    ap.add_argument("--steps", type=int, default=40, help="pipeline steps submitted ahead in each round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the pipeline, each timing both layouts")
    ap.add_argument("--mib", type=int, default=64, help="MiB moved island to island")
    ap.add_argument("--transfer-rounds", type=int, default=8)
    ap.add_argument("--calls", type=int, default=50, help="waited calls in each round of row 3")
    ap.add_argument("--call-rounds", type=int, default=10)
    ap.add_argument("--loser-size", type=int, default=512, help="the lost client's matmul n")
    ap.add_argument("--loser-runs", type=int, default=200, help="runs the lost client has queued at the kill")
    ap.add_argument("--store-mib", type=int, default=400, help="each Ray node's object store")
    ap.add_argument("--json", default=None)
    args = common.parse_args(ap, argv, {"stage_ms": 5.0, "n": 128, "steps": 6, "rounds": 2, "mib": 4,
                                        "transfer_rounds": 2, "calls": 10, "call_rounds": 2, "loser_size": 256,
                                        "loser_runs": 100, "store_mib": 200})
    why = common.missing("ray")
    if why:
        return common.skipped(args.json, "cluster", f"needs Ray for a multi-node cluster: {why}")
    for m in ("zmq",):
        why = common.missing(m)
        if why:
            return common.skipped(args.json, "cluster", f"the service needs pyzmq: {why}")

    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="pw-bench-cluster-"))
    procs: list[Proc] = []
    services: list[subprocess.Popen] = []
    cluster = None
    connected = False
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("JAX_", "PW_", "XLA_")) and k != "PW_VALIDATE"}
    base_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(common.ROOT), os.environ.get("PYTHONPATH")) if p)
    svc_env = {**base_env, "PW_NUM_CPU_DEVICES": "2"}
    try:
        cluster = Cluster(workers=2, store_mib=args.store_mib)
        t_cluster = time.monotonic() - t_start
        conn, conn1 = tmp / "ray.json", tmp / "one.json"
        log, log1 = tmp / "ray.log", tmp / "one.log"
        services.append(start_service(conn, log, svc_env, "--ray", cluster.address, "--ray-devices", "2"))
        services.append(start_service(conn1, log1, svc_env))
        info = wait_service(services[0], conn, log)
        wait_service(services[1], conn1, log1)
        t_services = time.monotonic() - t_start
        n = info["devices"]
        os.environ.update(JAX_PLATFORMS="cpu", PW_NUM_CPU_DEVICES=str(n))
        os.environ.pop("PW_VALIDATE", None)
        client_env = {**base_env, "JAX_PLATFORMS": "cpu"}
        import pw_kernel as pw

        pw.connect(str(conn), name="bench")
        connected = True
        node_ids = {k: node.node_id for k, node in enumerate(cluster.nodes)}
        by_node = {i.remote.info.get("node_id"): i for i in pw.islands() if i.remote is not None}
        missing = [k for k, nid in node_ids.items() if nid not in by_node]
        if missing:
            raise RuntimeError(f"the service has no island on Ray node(s) {missing}: {list(by_node)}")
        ray_islands = {k: by_node[nid] for k, nid in node_ids.items()}
        # row 3's callers and row 4's loser start now (their start-up overlaps rows 1 and 2)
        callers = {
            "ray node island": Proc([sys.executable, "-c", CALLER, str(conn), node_ids[1]], client_env, "ray caller"),
            "one-host service": Proc([sys.executable, "-c", CALLER, str(conn1), "own"], client_env, "one-host caller"),
            # (reported: the Ray service's own island, where the way from the service to a Ray actor is left out)
            "ray service own island": Proc([sys.executable, "-c", CALLER, str(conn), "own"], client_env,
                                           "ray service's own-island caller"),
        }
        procs += callers.values()

        t = time.monotonic()
        b = transfer(args, ray_islands, node_ids)
        t_transfer = time.monotonic() - t
        t = time.monotonic()
        a = pipeline(args, ray_islands)
        t_pipeline = time.monotonic() - t
        t = time.monotonic()
        c = calls(args, callers)
        t_calls = time.monotonic() - t
        loser = Proc([sys.executable, "-c", LOSER, str(conn), node_ids[2], str(args.loser_size),
                      str(args.loser_runs)], client_env, "loser")
        procs.append(loser)
        t = time.monotonic()
        d = killed(args, cluster, ray_islands, loser)
        t_killed = time.monotonic() - t
        loser.send("exit")
        result = report(args, a, b, c, d, info)
        result["phases_s"] = {"cluster": t_cluster, "services": t_services - t_cluster, "transfer": t_transfer,
                              "pipeline": t_pipeline, "calls": t_calls, "killed": t_killed,
                              "all": time.monotonic() - t_start}
        result["machine"] = common.machine()
        pw.disconnect()
        connected = False
        print("\nphases, s: " + ", ".join(f"{k} {v:.1f}" for k, v in result["phases_s"].items()))
        print("\ntargets:")
        common.print_targets(result["targets"])
        common.write_json(args.json, result)
        return result
    finally:
        if connected:
            try:
                import pw_kernel as pw

                pw.disconnect()
            except Exception as e:  # noqa: BLE001 - tearing down after a failure: the processes go below anyway
                print(f"cluster: disconnecting after a failure: {type(e).__name__}: {e}", file=sys.stderr)
        for p in procs:
            p.stop()
        for s in services:
            stop_service(s)
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def report(args, a: dict, b: dict, c: dict, d: dict, info: dict) -> dict:
    import pw_kernel as pw

    print(f"cluster: a head and 2 worker Ray nodes on 127.0.0.1 (one machine, {os.cpu_count()} cores shared), "
          f"{args.store_mib} MiB object stores, a dead node declared after ~1.5 s of missed health checks "
          f"(Ray's default: ~15 s); a service over it ({info['devices']} devices of its own, 2 per node's island) "
          f"and a one-host service; load average {common.loadavg()}")
    r = a["steps_per_s"]
    print(f"\n(1) 2-stage pipeline through the service, {a['reps']} x tanh(x @ x) of {a['n']}x{a['n']} float32 per "
          f"stage ({a['activation_mib']:.1f} MiB between stages), {a['steps']} steps submitted ahead; medians of "
          f"{a['rounds']} interleaved rounds")
    print(f"  a stage: {a['stage_ms_island']:.1f} ms on a node's island ({a['stage_ms_local']:.1f} ms as jax.jit here)")
    print(f"  one host (2 devices of one node's island)   {r['one host']:>8.1f} steps/s")
    print(f"  two hosts (two nodes' islands)              {r['two hosts']:>8.1f} steps/s")
    print(f"  two hosts / one host                        {a['ratio']:>8.2f}x")
    print(f"\n(2) {b['mib']} MiB from node 1's island to node 2's; medians of {b['rounds']} interleaved rounds "
          f"(a call with the move less the same call without)")
    for m, what in (("pw", "pw, through the service"), ("ray", "raw Ray: ray.put on A, ray.get on B")):
        x = b[m]
        print(f"  {what:<40} {x['transfer_s'] * 1e3:>8.1f} ms  {x['gib_s']:>6.2f} GiB/s  "
              f"(call {x['with_s'] * 1e3:.1f} ms with, {x['without_s'] * 1e3:.1f} without)")
    print(f"  pw / raw Ray bandwidth                   {b['ratio']:>8.2f}x")
    st = c["stats"]
    print(f"\n(3) a waited x + 1 on float32[16], µs (medians of {st['ray node island']['n']} calls in "
          f"{args.call_rounds} interleaved rounds, {common.window_note(c['window_s'])})")
    print(f"  Ray service, a Ray node's island            {c['us']['ray node island']:>8,.0f}")
    print(f"  one-host service, its own island            {c['us']['one-host service']:>8,.0f}")
    print(f"  Ray service, its own island (reported)      {c['us']['ray service own island']:>8,.0f}")
    print(f"  Ray node island / one-host                  {c['ratio']:>8.2f}x")
    ins = c["in_service_us"]
    if all(v is not None for v in ins.values()):
        print("  of which in the service (arrived to result): "
              + ", ".join(f"{k} {v:,.0f}" for k, v in ins.items()))
    lost = "none failed" if d["lost_s"] is None else f"{d['lost_s']:.2f} s"
    print(f"\n(4) worker node 2 killed, another client with {d['runs']} matmul runs queued on its island "
          f"({d['node_s'] * 1e3:.1f} ms a node's device time, "
          f"{d['node_call_s'] * 1e3:.1f} ms a waited call of one)")
    print(f"  this client's next call on node 1's island  {d['wait_s'] * 1e3:>8.1f} ms  "
          f"({d['extra_wait_s'] * 1e3:.1f} ms more than idle {d['idle_s'] * 1e3:.1f}; bound: run-ahead "
          f"{d['run_ahead_s'] * 1e3:g} ms + a node = {d['bound_s'] * 1e3:.1f} ms)")
    if "arrived_s" in d:
        print(f"    reached the service after {d['arrived_s'] * 1e3:.1f} ms, there {d['in_service_s'] * 1e3:.1f} ms, "
              f"back {(d['wait_s'] - d['arrived_s'] - d['in_service_s']) * 1e3:.1f} ms")
    print(f"  the lost client's runs all failed after     {lost:>8}  ({d['failed']} failed, {d['completed']} "
          f"completed before the kill)")
    print(f"    error: {d['error']}")
    print(f"  islands lost here: {d['islands_lost_here']}; a call on node 1's island after: "
          f"{d['call_after_s'] * 1e3:.1f} ms")
    targets = [
        common.target("pipeline across two hosts / on one host, steps/s", a["ratio"], 0.9, below=False, unit="x"),
        common.target("transfer between nodes, pw / raw Ray, bandwidth", b["ratio"], 0.8, below=False, unit="x"),
        common.target("waited call, Ray node island / one-host service", c["ratio"], 1.5, unit="x"),
        common.target("next call after a host's kill, beyond idle / bound", d["extra_wait_s"] / d["bound_s"], 1.0,
                      unit="x"),
        common.target("the lost runs failed after the kill", d["lost_s"] if d["lost_s"] is not None else float("inf"),
                      10.0, unit=" s"),
    ]
    return {"benchmark": "cluster", "run_ahead_s": pw.Config().run_ahead_s, "pipeline": a, "transfer": b,
            "call": c, "kill": d, "targets": targets, "fast_node_death": FAST_NODE_DEATH}


if __name__ == "__main__":
    main()

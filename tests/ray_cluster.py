"""A local multi-node Ray cluster for tests: a head and worker nodes, each a real raylet process, all on 127.0.0.1.

Built on `ray.cluster_utils.Cluster` (Ray's own multi-node test harness). Node ``k`` carries the custom
resource ``{"node-k": 1}``, so an actor can be pinned to it; ``kill_node`` takes a worker node away the
way a host dies (SIGKILL of its raylet and the processes it runs, no goodbye to the cluster), and
``add_node_back`` adds a fresh one.

Example::

    with local_cluster(nodes=3, devices_per_node=2) as lc:
        pw.add_ray_islands(lc.address, devices_per_island=lc.devices_per_node)
        kill_node(lc, 2)
        add_node_back(lc)
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

from pw_kernel.runtime.extend import init_ray

LOOPBACK = "127.0.0.1"
#: Per node: one CPU (island actors take none), a small object store; 2 cores and 24 GiB here.
NODE_ARGS = {"node_ip_address": LOOPBACK, "num_cpus": 1, "object_store_memory": 200 * 1024 * 1024}
#: The session's single-node Ray (conftest's ``ray_cluster``), on 127.0.0.1 too.
SESSION_RAY = {"num_cpus": 4, "include_dashboard": False, "log_to_driver": False, "object_store_memory": 200 * 2**20}
#: The GCS declares a node dead after this many missed health checks of this period (Ray's defaults: 5 of
#: 3 s, ~15 s); a test cluster says so in ~1.5 s, so a lost host is seen well within a test's patience.
FAST_NODE_DEATH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}


@dataclasses.dataclass
class LocalCluster:
    """A running local cluster: Ray's `Cluster`, its GCS address, and its nodes by index (None once killed)."""

    cluster: Any
    address: str
    devices_per_node: int
    nodes: list = dataclasses.field(default_factory=list)

    def node_id(self, k: int) -> str:
        """Ray's id (hex) of node ``k``."""
        return self.nodes[k].node_id


def _add(lc: LocalCluster) -> Any:
    k = len(lc.nodes)
    node = lc.cluster.add_node(**NODE_ARGS, resources={f"node-{k}": 1})
    lc.nodes.append(node)
    return node


@contextlib.contextmanager
def local_cluster(nodes: int = 3, devices_per_node: int = 2):
    """A head and ``nodes - 1`` worker nodes on 127.0.0.1, with this process connected as a driver; torn down
    after (the driver disconnected, every node's processes killed)."""
    import ray
    from ray._common.utils import reset_ray_address
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # (conftest's session Ray: its next user starts it again, `ray_cluster`)
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**NODE_ARGS, "resources": {"node-0": 1}, "include_dashboard": False,
                        "_system_config": FAST_NODE_DEATH},
    )
    # Cluster writes its address where a bare `ray.init()` of another process would find and join it
    # (/tmp/ray/ray_current_cluster): this one is the test's alone.
    reset_ray_address()
    lc = LocalCluster(cluster, cluster.address, devices_per_node, [cluster.head_node])
    try:
        for _ in range(nodes - 1):
            _add(lc)
        cluster.wait_for_nodes()
        init_ray(lc.address, log_to_driver=False)
        yield lc
    finally:
        ray.shutdown()
        shutdown(cluster)


def kill_processes(cluster, node) -> None:
    """SIGKILL a node's processes, and the raylet's children too (its agents and workers, which a raylet that
    dies gracefully would stop: killed, it leaves them orphaned)."""
    import psutil

    raylets = node.all_processes.get("raylet", [])
    children = []
    for info in raylets:
        try:
            children += psutil.Process(info.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    for child in children:  # (first: all at once, as a host's processes die; a worker left running takes a core)
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    cluster.remove_node(node, allow_graceful=False)
    deadline = time.monotonic() + 10
    for child in children:  # gone, or a zombie: orphans whose reaper (PID 1 here) may never reap them
        while time.monotonic() < deadline:
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)


def shutdown(cluster) -> None:
    """`Cluster.shutdown`, without its graceful stop of each node's processes (SIGTERM, then waiting for each to
    exit: ~10 s a cluster whose workers hold JAX): a test cluster's processes are killed, the head last."""
    import ray
    from ray._common.utils import reset_ray_address

    for node in list(cluster.worker_nodes):
        kill_processes(cluster, node)
    if cluster.head_node is not None:
        kill_processes(cluster, cluster.head_node)
    ray.experimental.internal_kv._internal_kv_reset()
    reset_ray_address()
    ray._private.services.find_gcs_addresses.cache_clear()


def kill_node(lc: LocalCluster, k: int) -> float:
    """Kill worker node ``k`` as a host dies: SIGKILL of its raylet and the node's other processes (its
    workers, an island actor among them, exit once their raylet is gone). Returns when it was killed
    (`time.monotonic()`, taken just before)."""
    node = lc.nodes[k]
    if node is None or node is lc.cluster.head_node:
        raise ValueError(f"kill_node: node {k} is {'the head' if node is not None else 'killed already'}")
    at = time.monotonic()
    kill_processes(lc.cluster, node)
    lc.nodes[k] = None
    return at


def add_node_back(lc: LocalCluster) -> int:
    """Add a fresh worker node (the next index, its own ``node-k`` resource); returns its index once alive."""
    _add(lc)
    lc.cluster.wait_for_nodes()
    return len(lc.nodes) - 1


def alive_nodes() -> list[dict]:
    """The cluster's alive nodes as `ray.nodes()` lists them."""
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]

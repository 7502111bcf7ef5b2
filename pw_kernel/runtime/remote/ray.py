"""Ray as a remote island's transport: the link to an island's actor, and starting the actors.

`RemoteIsland` (`client.py`) talks to its actor through a link; `RayLink` is Ray's
(``actor.method.remote(...)`` gives an ``ObjectRef``, read here). `start_ray_islands`
starts (or attaches) the actors, one per Ray node or as many as asked, each owning the
JAX devices of its process. `init_ray` is how pw starts or joins a Ray: one on this machine
binds to the loopback (127.0.0.1). Ray is imported only when these run.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

from ..errors import IslandLostError, PathwaysError, RayShutDownError
from .actor import IslandActor


class RayLink:
    """How a remote island talks to its Ray actor (a `link.Link`): ``actor.method.remote(...)`` gives a ref, read here.

    Example::

        link = RayLink(actor)
        link.get(link.request("stats"))      # {"buffers": ..., ...}
    """

    direct = False  # (a Ray call serialises its arguments at length: the island's mailbox thread sends)
    cancels = False  # (an actor runs its mailbox in order)
    profiles = False
    runs_python = True
    #: What a user does once the island is gone.
    again = "add it again with `pw.add_ray_islands(...)` and make new slices there"

    def __init__(self, actor) -> None:
        self.actor = actor

    def request(self, method: str, *args):
        _ray()
        return getattr(self.actor, method).remote(*args)

    def request_oneway(self, method: str, *args) -> None:
        _ray()
        getattr(self.actor, method).remote(*args)

    def ready(self, ref) -> bool:
        return self.wait(ref, 0)

    def get(self, ref):
        ray = _ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            # Ray raises a call whose argument was another actor's reply, lost with that actor, as an instance of
            # both RayTaskError and the cause (RayActorError): this island is fine, the one the value came from
            # is not. Raised as one of `lost_errors`, it would mark this island lost too.
            if isinstance(e, ray.exceptions.RayActorError):
                raise IslandLostError(
                    f"a value this call read came from a Ray actor that died (its island was lost): {_said(e.cause)}"
                ) from None
            raise

    def wait(self, ref, timeout: float) -> bool:
        """Block until ``ref`` is ready (True) or ``timeout`` s pass (False)."""
        import ray

        if not ray.is_initialized():  # (as good as answered: its read raises RayShutDownError, starting no Ray)
            return True
        done, _ = ray.wait([ref], timeout=timeout)
        return bool(done)

    def take_inline(self, handle: int) -> Any:
        """The value of ``handle`` if it came with its run's reply (the service's small values), once; else None."""
        return None

    def put(self, value):
        """A value shipped as an argument of a later call (Ray: through its object store)."""
        return _ray().put(value)

    def usable(self) -> bool:
        """Whether calls can be sent now (False: Ray was shut down; a call would start a new one)."""
        import ray

        return ray.is_initialized()

    def lost_errors(self) -> tuple[type[BaseException], ...]:
        """The errors that mean the actor is gone."""
        import ray

        return (ray.exceptions.RayActorError, RayShutDownError)

    def where(self, info: dict) -> str:
        node = f", node {info['node_ip']} ({info['node_id']})" if info.get("node_id") else ""
        return f"Ray actor on {info['host']}, pid {info['pid']}{node}"


def _ray():
    """Ray, if this process is still connected to it; else `RayShutDownError`.

    Ray's ``get``, ``wait``, ``put`` and actor calls start a new Ray when none is connected
    (its auto-init): one made after ``ray.shutdown()`` (a notebook's last cell) would start a
    local Ray in this process, or join the cluster being torn down and hang there, only
    to find no actor of ours.
    """
    import ray

    if not ray.is_initialized():
        raise RayShutDownError(
            "this process is no longer connected to Ray (`ray.shutdown()` was called): the islands on its actors "
            "are out of reach. Connect again with `pw.add_ray_islands(address)` for new ones."
        )
    return ray


class RayIslandActor(IslandActor):
    """`IslandActor` as Ray runs it: `describe` also says which Ray node it is on (its IP and id), so a lost
    island's error names the host that went away."""

    def describe(self) -> dict:
        import ray

        info = super().describe()
        info["node_id"] = ray.get_runtime_context().get_node_id()
        info["node_ip"] = ray.util.get_node_ip_address()
        return info


LOOPBACK = "127.0.0.1"


def _host(address: str) -> str:
    return address.rsplit(":", 1)[0].strip("[]") if ":" in address else address


def init_ray(address: str | None = None, **options):
    """`ray.init`, except that a Ray on this machine (started here, or found at ``address``: None, "auto",
    "local" or one on 127.0.0.1) binds to the loopback and this process joins it as a driver on 127.0.0.1.

    Ray otherwise swaps 127.0.0.1 for the machine's network address (its `resolve_ip_for_localhost`), which a
    multi-machine cluster needs and a single machine does not; the swap is skipped only while Ray believes it
    runs single-machine (`ray_constants.ENABLE_RAY_CLUSTER`), so that is what this call says during
    ``ray.init``. A cluster elsewhere (an address on another host) is joined as ``ray.init`` would.

    Example::

        init_ray(num_cpus=2, include_dashboard=False)     # a local Ray, all on 127.0.0.1
        init_ray("127.0.0.1:6379")                        # join one started with --node-ip-address=127.0.0.1
    """
    import ray
    from ray._private import ray_constants, services  # (no public switch: see above)

    found = address
    if address in (None, "auto"):
        try:
            found = services.get_ray_address_from_environment(address, None)
        except ConnectionError:
            found = address  # (ray.init raises its own error, naming what to do)
    if found not in (None, "auto", "local") and _host(found) not in (LOOPBACK, "localhost"):
        return ray.init(address=address, **options)
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        return ray.init(address=found if found not in (None, "auto") else address, _node_ip_address=LOOPBACK,
                        **options)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def _device_env(env: dict[str, str], n: int) -> dict[str, str]:
    """``env`` with ``n`` simulated CPU devices asked for every way JAX and pw read it (each actor gets exactly
    ``n``, whatever the node's raylet inherited): the XLA flag appended to any flags given, and JAX's and pw's
    own counts."""
    flags = env.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    env.setdefault("JAX_NUM_CPU_DEVICES", str(n))  # (over what workers inherit: a Pathways kernel sets 8)
    env.setdefault("PW_NUM_CPU_DEVICES", str(n))
    return env


def _said(err: BaseException) -> str:
    """Ray's error in one line: its first, and the lines that say which process and node."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    where = [line for line in lines[1:] if line.startswith(("pid:", "ip:", "The actor died because"))]
    return "; ".join([f"{type(err).__name__}: {lines[0] if lines else ''}", *where])


_actor_class = None


def start_ray_islands(
    address: str | None = None,
    *,
    count: int | None = None,
    devices_per_island: int | None = None,
    platform: str = "cpu",
    env: dict[str, str] | None = None,
    skip_nodes: Collection[str] = (),
) -> list[tuple[Any, dict, int]]:
    """Start (or attach) the Ray actors of remote islands: (actor, its `describe()`, clock offset) each, which
    `pw.add_ray_islands` (documented there) makes `RemoteIsland`s and registers.

    Without ``count``, one actor per alive Ray node except those in ``skip_nodes`` (Ray node ids: the nodes
    that already have a live island), each pinned to its node and with exactly ``devices_per_island`` CPU
    devices; a Ray this call starts binds to 127.0.0.1 (`init_ray`)."""
    try:
        import ray
    except ImportError:
        raise PathwaysError(
            "`pw.add_ray_islands` needs Ray: `pip install 'ray[default]'` (or the project's `bench` extra)."
        ) from None
    global _actor_class
    if not ray.is_initialized():
        init_ray(address, include_dashboard=False, log_to_driver=False)
    if _actor_class is None:
        _actor_class = ray.remote(RayIslandActor)
    env_vars = dict(env or {})
    if platform == "cpu":
        env_vars.setdefault("JAX_PLATFORMS", "cpu")
        if devices_per_island:
            _device_env(env_vars, devices_per_island)
    options: dict[str, Any] = {"runtime_env": {"env_vars": env_vars}, "num_cpus": 0}
    if count is None:
        nodes = [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in skip_nodes]
        actors = [
            _actor_class.options(
                **options,
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
            ).remote()
            for n in nodes
        ]
    else:
        actors = [_actor_class.options(**options).remote() for _ in range(count)]
    infos = ray.get([a.describe.remote() for a in actors], timeout=300)
    wrong = [(i["node_ip"], len(i["devices"])) for i in infos if devices_per_island and platform == "cpu"
             and len(i["devices"]) != devices_per_island]
    if wrong:
        for a in actors:
            ray.kill(a)
        raise PathwaysError(
            f"`pw.add_ray_islands(devices_per_island={devices_per_island})`: actors came up with other device "
            f"counts ((node, devices): {wrong}), so a device count in `env=` (XLA_FLAGS or JAX_NUM_CPU_DEVICES) "
            f"disagrees. Leave the count out of `env=`, or pass the same number."
        )
    remotes = []
    for actor, info in zip(actors, infos):
        t0 = time.perf_counter_ns()
        remote_now = ray.get(actor.clock.remote(), timeout=60)
        t1 = time.perf_counter_ns()
        remotes.append((actor, info, (t0 + t1) // 2 - remote_now))  # (a `RemoteIsland` each, made by the caller)
    return remotes

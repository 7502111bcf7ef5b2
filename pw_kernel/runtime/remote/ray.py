"""Ray as a remote island's transport: the link to an island's actor, and starting the actors.

`RemoteIsland` (`client.py`) talks to its actor through a link; `RayLink` is Ray's
(``actor.method.remote(...)`` gives an ``ObjectRef``, read here). `start_ray_islands`
starts (or attaches) the actors, one per Ray node or as many as asked, each owning the
JAX devices of its process. Ray is imported only when these run.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import PathwaysError
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
        return getattr(self.actor, method).remote(*args)

    def request_oneway(self, method: str, *args) -> None:
        getattr(self.actor, method).remote(*args)

    def ready(self, ref) -> bool:
        import ray

        done, _ = ray.wait([ref], timeout=0)
        return bool(done)

    def get(self, ref):
        import ray

        return ray.get(ref)

    def wait(self, ref, timeout: float) -> bool:
        """Block until ``ref`` is ready (True) or ``timeout`` s pass (False)."""
        import ray

        done, _ = ray.wait([ref], timeout=timeout)
        return bool(done)

    def take_inline(self, handle: int) -> Any:
        """The value of ``handle`` if it came with its run's reply (the service's small values), once; else None."""
        return None

    def put(self, value):
        """A value shipped as an argument of a later call (Ray: through its object store)."""
        import ray

        return ray.put(value)

    def usable(self) -> bool:
        """Whether calls can be sent now (False: Ray was shut down; a call would start a new one)."""
        import ray

        return ray.is_initialized()

    def lost_errors(self) -> tuple[type[BaseException], ...]:
        """The errors that mean the actor is gone."""
        import ray

        return (ray.exceptions.RayActorError,)

    def where(self, info: dict) -> str:
        return f"Ray actor on {info['host']}, pid {info['pid']}"


_actor_class = None


def start_ray_islands(
    address: str | None = None,
    *,
    count: int | None = None,
    devices_per_island: int | None = None,
    platform: str = "cpu",
    env: dict[str, str] | None = None,
) -> list[tuple[Any, dict, int]]:
    """Start (or attach) the Ray actors of remote islands: (actor, its `describe()`, clock offset) each, which
    `pw.add_ray_islands` (documented there) makes `RemoteIsland`s and registers."""
    try:
        import ray
    except ImportError:
        raise PathwaysError(
            "`pw.add_ray_islands` needs Ray: `pip install 'ray[default]'` (or the project's `bench` extra)."
        ) from None
    global _actor_class
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    if _actor_class is None:
        _actor_class = ray.remote(IslandActor)
    env_vars = dict(env or {})
    if platform == "cpu":
        env_vars.setdefault("JAX_PLATFORMS", "cpu")
        if devices_per_island:
            env_vars.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={devices_per_island}")
            # ... and over what the workers inherit from this process (a Pathways kernel sets 8 for itself)
            env_vars.setdefault("JAX_NUM_CPU_DEVICES", str(devices_per_island))
    options: dict[str, Any] = {"runtime_env": {"env_vars": env_vars}, "num_cpus": 0}
    if count is None:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
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
    remotes = []
    for actor, info in zip(actors, infos):
        t0 = time.perf_counter_ns()
        remote_now = ray.get(actor.clock.remote(), timeout=60)
        t1 = time.perf_counter_ns()
        remotes.append((actor, info, (t0 + t1) // 2 - remote_now))  # (a `RemoteIsland` each, made by the caller)
    return remotes

"""The service's Ray nodes (``serve --ray``): each one's devices an island, watched, lost, added back.

A thread asks Ray which nodes are alive every `WATCH_S`. A node that died
loses its island at once (`RemoteIsland.lost`, naming the node), not at the
next call that would have hung on it: the service's controller then fails
the runs that use it, and only those, with `pw.IslandLostError`; every
heartbeat's answer tells the clients (`Pong.lost`), whose own island for it
is lost too. Other islands, other clients' runs and kept trees elsewhere go
on. A node that joins (or comes back) gets an actor and becomes a new island;
a client adds the islands it does not have yet with `pw.add_ray_islands()`.

Example::

    nodes = RayNodes(ctrl, devices_per_island=2)   # after the first islands were added
    nodes.start()
    ...
    nodes.stop()
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("pw_kernel.service")

#: Seconds between two looks at which Ray nodes are alive (a lost node's runs fail within this and a call).
WATCH_S = 1.0


class RayNodes:
    """Watches the Ray nodes behind a controller's Ray islands: loses the dead, adds the new."""

    def __init__(self, ctrl, devices_per_island: int | None = None, on_change=None) -> None:
        self.ctrl = ctrl
        self.devices_per_island = devices_per_island
        self.on_change = on_change or (lambda: None)  # (islands added or lost: clients are told)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pw-service-ray-nodes", daemon=True)

    def start(self) -> RayNodes:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop watching, and wait for a look under way to end: after this the watcher makes no Ray call (one
        made after `ray.shutdown()` would start a new Ray in this process, or join a cluster being torn down)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _islands(self) -> list:
        return [i for i in self.ctrl.islands if i.remote is not None and i.remote.info.get("node_id")]

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            try:
                self.look()
            except Exception:  # (Ray shutting down, a GCS hiccup: look again next time)
                log.debug("pw_kernel service: could not ask Ray about its nodes", exc_info=True)

    def look(self) -> tuple[list, list]:
        """Lose the islands whose node died and add islands on nodes that have none; returns (lost, added)."""
        import ray

        if self._stop.is_set() or not ray.is_initialized():  # (stopping: the islands are let go, not lost)
            return [], []
        alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
        lost, served = [], set()
        for island in self._islands():
            r = island.remote
            if not r.alive:
                continue
            if r.info["node_id"] in alive:
                served.add(r.info["node_id"])
                continue
            r.lost(RuntimeError(f"its Ray node {r.info.get('node_ip')} ({r.info['node_id']}) died or was removed"))
            log.warning("pw_kernel service: island %d lost: Ray node %s (%s) is gone", island.id,
                        r.info.get("node_ip"), r.info["node_id"])
            lost.append(island)
        added: list[Any] = []
        # (not once stopping: the service let its islands go, so every node would look unserved)
        if any(n not in served for n in alive) and not self._stop.is_set():
            from ..runtime.extend import ray_islands

            added = self.ctrl.add_remote_islands(
                ray_islands("auto", devices_per_island=self.devices_per_island, skip_nodes=served)
            )
            for island in added:
                log.info("pw_kernel service: island %d added: Ray node %s", island.id, island.remote.info.get("node_ip"))
        if lost or added:
            self.on_change()
        return lost, added

"""Helpers for the tests with remote islands, which share one Ray cluster (conftest's ``ray_cluster``)."""

from __future__ import annotations

import pw_kernel as pw


def kill_islands(ray, controller) -> None:
    """Shut ``controller`` down, then kill the Ray actors of its remote islands (a lost one is dead already)."""
    actors = [isl.remote.actor for isl in controller.islands if isl.remote is not None]
    pw.shutdown()
    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:  # noqa: BLE001 - killed already (a test that loses an island)
            pass

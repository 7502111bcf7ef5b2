"""Controller configuration and the embedded default of 8 simulated CPU devices."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Literal

Mode = Literal["auto", "fused", "chained"]

DEFAULT_CPU_DEVICES = 8


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclasses.dataclass(frozen=True)
class Config:
    """How a Controller groups devices and how hard it may run ahead of them.

    Example::

        pw.init(pw.Config(islands=2))   # the 8 CPU devices as two islands of 4
    """

    #: None: one island per platform. An int k: each platform's devices split
    #: into k equal islands. A list of lists of device ids: explicit islands.
    islands: int | Sequence[Sequence[int]] | None = None
    #: Nodes dispatched but not yet finished, per island, before the dispatcher
    #: waits. Bounds host memory held by in-flight work; never waits otherwise.
    max_inflight: int = 256
    #: Of those, nodes whose executable holds collectives (all-reduce, all-gather, ...), per island.
    #: None: 1 on CPU islands of several devices, where XLA aborts the process when collective
    #: executions queued together starve each other of threads; otherwise no extra bound.
    max_inflight_collectives: int | None = None
    #: Check state-machine invariants on every transition (on in tests).
    validate: bool = dataclasses.field(default_factory=lambda: _env_flag("PW_VALIDATE"))
    #: Completed node events kept in the log (oldest dropped first).
    max_events: int = 1_000_000
    #: Default execution mode of programs.
    mode: Mode = "auto"
    #: Bytes per device that runs may reserve (memory-aware admission). None: the device's
    #: reported limit (``memory_stats()['bytes_limit']``) times ``memory_fraction``, or no limit
    #: where the device reports none (the CPU).
    device_memory: int | None = None
    memory_fraction: float = 0.9
    #: Finished runs whose outputs the controller keeps alive (`controller().runs[-1].outputs`);
    #: older runs' outputs live only as long as their futures are referenced.
    keep_outputs: int = 16
    #: Runs kept in `controller().runs` (the oldest finished ones are forgotten first).
    keep_runs: int = 10_000


def configure_cpu_devices(n: int | None = None) -> bool:
    """Ask JAX for ``n`` simulated CPU devices if its backends have not started.

    Respects a count the user already chose (``XLA_FLAGS`` or
    ``jax_num_cpu_devices``). Returns True when the setting was applied.
    Accelerators are untouched: with a GPU or TPU the controller uses those.

    Example::

        import pw_kernel  # before any JAX computation: 8 CPU devices
    """
    import jax

    if n is None:
        n = int(os.environ.get("PW_NUM_CPU_DEVICES", DEFAULT_CPU_DEVICES))
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return False
    if jax.config.jax_num_cpu_devices not in (-1, None):
        return False
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # backends already initialised: too late, keep what JAX has
        return False
    return True

"""Controller configuration and the embedded default of 8 simulated CPU devices."""

from __future__ import annotations

import dataclasses
import os
import re
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
    #: Seconds of estimated device work that dispatch may run ahead of completion, per device (each
    #: node's estimate: the measured device time of its executable). Enough to keep devices busy,
    #: small enough that `cancel`, Ctrl-C and a higher priority act within it: after a cancel the next
    #: call on those devices waits at most about this plus one node. 0: one node at a time per device.
    #: None: no bound but ``max_inflight`` (a cancelled run's dispatched nodes all still run).
    run_ahead_s: float | None = 0.02
    #: Threads that compile a run's executables before their first calls, several at once (XLA
    #: compiles without holding the GIL: a pipeline's first step has tens to compile). None: the
    #: machine's CPU count, at most 4. 1: one after the other, each as its step comes up. Whatever
    #: the count, compiling holds up only the steps it compiles for: other runs are dispatched meanwhile.
    compile_threads: int | None = None
    #: Check state-machine invariants on every transition (on in tests).
    validate: bool = dataclasses.field(default_factory=lambda: _env_flag("PW_VALIDATE"))
    #: Completed node events kept, in the event log and in the runs of `controller().runs` alike
    #: (the oldest events and finished runs go first); the log keeps as many rows of run transitions
    #: (a call run whole on its caller's thread makes one, others three). ~350 bytes an event, ~150 a
    #: row: full, they hold ~50 MB, after 33,000 to 100,000 one-node steps, and growth stops there.
    max_events: int = 100_000
    #: Default execution mode of programs.
    mode: Mode = "auto"
    #: Bytes per device that runs may reserve (memory-aware admission). None: the device's
    #: reported limit (``memory_stats()['bytes_limit']``) times ``memory_fraction``, or no limit
    #: where the device reports none (the CPU).
    device_memory: int | None = None
    memory_fraction: float = 0.9
    #: Runs submitted and not yet final, at most; past it a call waits (Ctrl-C works) until one ends.
    #: A loop that submits faster than the devices run would otherwise hold every step it is ahead
    #: by (its futures, its inputs), without end. Far above what run-ahead needs: a loop of 1,000
    #: steps on held devices still returns at once. None: no bound (the Pathways service's
    #: controller, whose clients each keep their own).
    max_pending_runs: int | None = 10_000
    #: Their outputs (futures), at most, likewise (a step of 400 leaves counts 400): ~150 bytes each.
    max_pending_outputs: int | None = 1_000_000
    #: Seconds a call fed a future of a run not yet done waits, at most, for a busy dispatcher thread
    #: to catch up, so that it dispatches its run itself (the quick way for a stream of small steps on
    #: the CPU) instead of queueing it behind. 0: never wait (each such call is queued at once).
    inline_wait_s: float = 0.002
    #: Finished runs whose outputs the controller keeps alive (`controller().runs[-1].outputs`);
    #: older runs' outputs live only as long as their futures are referenced.
    keep_outputs: int = 16
    #: Finished runs kept in `controller().runs`, a ring (the oldest finished are forgotten first; runs
    #: in flight are always there). A finished run holds no arrays and no futures: its state, times,
    #: node events and story (~1 KB with one event).
    keep_runs: int = 10_000
    #: Transitions kept in the lifecycle's log, which `Run.story()` reads (the oldest go first; a run
    #: makes a few, a chained run a few per dispatch burst).
    story_length: int = 100_000
    #: Python's garbage collector runs a young collection after this many net new container objects,
    #: while the controller runs (`gc.set_threshold`'s first value; raised, never lowered, and put back
    #: at `pw.shutdown`). Python's 700 makes a step of hundreds of leaves promote its futures until a
    #: full collection walks the whole process every hundred steps or so (~40% of a 400-leaf step on
    #: the CPU); at 2,000 that loop makes none. None: leave the process's setting alone.
    gc_threshold: int | None = 2000


def backends_started() -> bool:
    """Whether JAX's backends have started (after that the device count is fixed for the process).

    JAX has no public query for it; updating ``jax_num_cpu_devices`` to another value is refused
    exactly then, so a probe that puts the old value back answers without side effects.

    Example::

        backends_started()  # False right after `import jax`
    """
    import jax

    current = jax.config.jax_num_cpu_devices
    try:
        jax.config.update("jax_num_cpu_devices", current + 1 if current not in (-1, None) else 1)
    except RuntimeError:
        return True
    jax.config.update("jax_num_cpu_devices", current if current is not None else -1)
    return False


def device_flags_ignored(devices) -> str | None:
    """A warning when ``XLA_FLAGS`` asks for a number of CPU devices JAX did not start with, else None."""
    m = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    cpus = [d for d in devices if d.platform == "cpu"]
    if m is None or not cpus or len(devices) != len(cpus) or int(m.group(1)) == len(cpus):
        return None
    return (
        f"pw_kernel: XLA_FLAGS asks for {m.group(1)} CPU devices, but JAX started with {len(cpus)}: "
        f"jax_num_cpu_devices (JAX_NUM_CPU_DEVICES={os.environ.get('JAX_NUM_CPU_DEVICES', '?')} in this "
        f"environment, which the Pathways kernel sets) takes precedence. To choose the count, run "
        f"`jax.config.update('jax_num_cpu_devices', {m.group(1)})` before any JAX computation (then restart "
        f"the kernel if JAX already ran), or install the kernel with `python -m pw_kernel install --user "
        f"--devices {m.group(1)}`."
    )


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

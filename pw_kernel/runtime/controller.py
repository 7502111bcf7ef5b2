"""The single controller: one per process, owning devices, slices, runs and the event log."""

from __future__ import annotations

import atexit
import collections
import dataclasses
import itertools
import threading
from typing import Any

import jax

from . import plan as plan_mod
from .config import Config
from .devices import Island, ResourceManager, VirtualSlice, build_islands, remote_device_id
from .dispatch import Dispatcher
from .errors import AdmissionError, ArgumentError, ControllerShutdownError, InputFailedError, NodeError, PathwaysError
from .events import EventLog, RunEvent
from .futures import Future
from .graph import ProgramGraph
from .run import FINAL, Run
from .scheduler import Scheduler


@dataclasses.dataclass(frozen=True)
class Status:
    """A snapshot of the controller: islands, live slices, runs by state."""

    islands: tuple[Island, ...]
    slices: tuple[VirtualSlice, ...]
    runs: tuple[tuple[int, str, str, int, int], ...]  # (id, name, state, done, total)
    inflight: dict[int, int]
    policy: str

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, _, state, _, _ in self.runs:
            out[state] = out.get(state, 0) + 1
        return out

    def __str__(self) -> str:
        lines = [f"pw_kernel controller: {len(self.islands)} islands, policy {self.policy}"]
        for i in self.islands:
            lines.append(f"  {i!r}  in flight: {self.inflight.get(i.id, 0)}")
        lines.append(f"slices ({len(self.slices)}):")
        for s in self.slices:
            lines.append(f"  {s!r}")
        counts = ", ".join(f"{v} {k}" for k, v in sorted(self.counts().items())) or "none"
        lines.append(f"runs: {counts}")
        for rid, name, state, done, total in self.runs[-10:]:
            lines.append(f"  run {rid:4d} {name:24s} {state:9s} {done}/{total}")
        return "\n".join(lines)


class Controller:
    """Drives every device JAX can see: traces are submitted here, dispatched, and reported.

    Example::

        c = pw.controller()
        c.islands, c.runs[-1].state
        print(c.status())
    """

    def __init__(self, config: Config | None = None):
        self.config = config or Config()
        self.devices: tuple[jax.Device, ...] = tuple(jax.devices())
        self.islands = build_islands(self.devices, self.config.islands)
        self.resources = ResourceManager(self.islands)
        self.events = EventLog(self.config.max_events)
        for isl in self.islands:
            self.events.island_names[isl.id] = f"island {isl.id} ({isl.platform})"
            for d in isl.devices:
                self.events.device_names[d.id] = f"{d.platform}:{d.id}"
        self.lock = threading.RLock()
        self.scheduler = Scheduler()
        self.capacity: dict[int, int] = self._capacity()  # device id -> bytes runs may reserve
        self.reserved: dict[int, int] = {}
        self._recent: collections.deque = collections.deque(maxlen=self.config.keep_outputs)
        self.runs: list[Run] = []
        self._ids = itertools.count()
        self._closed = False
        self.dispatcher = Dispatcher(self)

    # ------------------------------------------------------------- public API
    def slice(self, n: int, mesh: dict[str, int] | None = None, name: str | None = None, island=None) -> VirtualSlice:
        self._check_open("pw.slice")
        return self.resources.allocate(n, mesh=mesh, name=name, island=island)

    def submit(
        self,
        graph: ProgramGraph,
        inputs: list[Any],
        *,
        name: str | None = None,
        mode: str | None = None,
        tenant: str = "default",
        weight: float = 1.0,
        priority: int = 0,
        source_map: dict[str, str] | None = None,
    ) -> Run:
        """Queue a traced program with its flat inputs (arrays or futures); returns its Run at once.

        ``source_map`` maps node (or step) names to where they come from, for error
        messages (the notebook front passes cell lines).
        """
        self._check_open("submit")
        for s in graph.slices:
            s.check_live(f"submit {graph.name!r}")
            if s.island.remote is not None:
                s.island.remote.check(f"submit {graph.name!r}")
            if s._manager is not self.resources:
                raise PathwaysError(
                    f"`submit`: program {graph.name!r} uses slice {s.name!r} from a controller that was shut down "
                    f"or replaced (`pw.init`). Create the slices and compiled functions again."
                )
        plan = plan_mod.plan_for(graph, mode or self.config.mode)
        for d, need in plan.peak_bytes.items():
            cap = self.capacity.get(d)
            if cap is not None and need > cap:
                raise AdmissionError(
                    f"`submit {graph.name!r}`: the run needs about {need / 2**20:.1f} MiB on device {d}, but runs "
                    f"may reserve at most {cap / 2**20:.1f} MiB there (Config.device_memory / memory_fraction). "
                    f"Shard the values over more devices, use smaller shapes, or raise the limit."
                )
        with self.lock:
            run = Run(self, next(self._ids), name or graph.name, graph, plan, inputs, tenant, weight, priority)
            if source_map:
                run.source_map.update(source_map)
            self.runs.append(run)
            self.events.emit_run(_queued_event(run, self.events.now()))
            self.scheduler.add(run)
            self.dispatcher.wake()
        return run

    def add_remote_islands(self, remotes) -> list[Island]:
        """Register remote islands (see `pw.add_ray_islands`); returns the new Island objects."""
        from .remote import stand_in_devices

        added = []
        with self.lock:
            next_id = max((i.id for i in self.islands), default=-1) + 1
            for r in remotes:
                n = len(r.info["devices"])
                island = Island(next_id, tuple(stand_in_devices(n, "pw.add_ray_islands")), r.info["platform"], remote=r)
                r.island = island
                next_id += 1
                added.append(island)
                self.events.island_names[island.id] = f"island {island.id} (Ray: {r.info['host']} pid {r.info['pid']})"
                for k, d in enumerate(r.info["devices"]):
                    self.events.device_names[remote_device_id(island, k)] = f"{r.info['platform']}:{d}@{island.id}"
            self.resources.add_islands(added)
            self.islands = self.resources.islands
            self.dispatcher.add_islands(len(self.islands))
        return added

    def set_policy(self, policy) -> None:
        """Switch the scheduling policy now (FIFO, FairShare, Priority); queued runs follow the new one.

        Example::

            pw.controller().set_policy(pw.FairShare({"A": 1, "B": 3}))
        """
        if not all(hasattr(policy, a) for a in ("pick", "charge", "quantum", "name")):
            raise ArgumentError(
                f"`Controller.set_policy` needs a policy such as pw.FIFO(), pw.FairShare() or pw.Priority(); "
                f"got {policy!r}."
            )
        with self.lock:
            self.scheduler.policy = policy
            self.dispatcher.wake()

    def status(self) -> Status:
        with self.lock:
            runs = tuple((r.id, r.name, r.state, r.nodes_done, r.nodes_total) for r in self.runs)
            return Status(
                islands=tuple(self.islands),
                slices=tuple(self.resources.slices),
                runs=runs,
                inflight={i.id: self.dispatcher.inflight(i.id) for i in self.islands},
                policy=getattr(self.scheduler.policy, "name", repr(self.scheduler.policy)),
            )

    def run(self, run_id: int) -> Run:
        for r in self.runs:
            if r.id == run_id:
                return r
        raise PathwaysError(f"No run with id {run_id!r}; runs are {[r.id for r in self.runs][-20:]} (latest last).")

    def wait_all(self, timeout: float | None = None) -> None:
        """Block until every submitted run is final."""
        for r in list(self.runs):
            r.wait(timeout)

    def cancel_all(self) -> int:
        """Cancel every run not yet final; returns how many were cancelled."""
        return sum(self._cancel(r) for r in list(self.runs))

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Fail runs still in flight with ControllerShutdownError, stop and join the controller's threads."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            for r in self.runs:
                if r.state not in FINAL:
                    r._transition(
                        "failed",
                        ControllerShutdownError(
                            f"run {r.id} ({r.name!r}) was still {r.state} when the controller shut down."
                        ),
                    )
                    self.scheduler.remove(r)
        self.dispatcher.stop(timeout)
        self.resources.release_all()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def threads(self) -> list[threading.Thread]:
        return self.dispatcher.threads

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running"
        return f"<pw.Controller {state}: {len(self.devices)} devices, {len(self.islands)} islands, {len(self.runs)} runs>"

    # --------------------------------------------- called by the dispatcher
    def _capacity(self) -> dict[int, int]:
        cap: dict[int, int] = {}
        for d in self.devices:
            if self.config.device_memory is not None:
                cap[d.id] = int(self.config.device_memory)
                continue
            try:
                stats = d.memory_stats() or {}
            except Exception:  # not every backend reports memory
                stats = {}
            if "bytes_limit" in stats:
                cap[d.id] = int(stats["bytes_limit"] * self.config.memory_fraction)
        return cap

    def _admit(self, run: Run) -> bool:
        """Reserve the run's estimated peak memory if it fits next to what running runs hold (lock held)."""
        need = run.plan.peak_bytes
        cap, reserved = self.capacity, self.reserved
        for d, n in need.items():
            c = cap.get(d)
            if c is not None and reserved.get(d, 0) + n > c:
                run.waiting_for = "memory"
                return False
        for d, n in need.items():
            reserved[d] = reserved.get(d, 0) + n
        run._reserved = need
        run.waiting_for = None
        return True

    def _retire(self, run: Run, futures) -> None:
        """A run became final: keep its outputs among the most recent, forget the oldest runs (lock held)."""
        if self.config.keep_outputs > 0 and futures is not None:
            self._recent.append(futures)
        if len(self.runs) > self.config.keep_runs:
            # Forget the oldest tenth at once, so this stays cheap per run (not a rebuild per run).
            excess = len(self.runs) - self.config.keep_runs + self.config.keep_runs // 10
            self.runs[:] = [r for k, r in enumerate(self.runs) if k >= excess or not r.done()]

    def _unreserve(self, run: Run) -> None:
        """Give back a final run's reservation and let queued runs try again (lock held)."""
        if run._reserved:
            for d, n in run._reserved.items():
                self.reserved[d] -= n
            run._reserved = {}
            self.dispatcher.wake()

    def _start(self, run: Run) -> bool:
        """Resolve a queued run's inputs and admit it; True when it can start (lock held)."""
        arrays = []
        for x in run._inputs:
            if isinstance(x, Future):
                src = x.run
                if src.state in ("failed", "cancelled"):
                    why = "was cancelled" if src.state == "cancelled" else f"failed: {src.error}"
                    run._transition(
                        "failed",
                        InputFailedError(
                            f"run {run.id} ({run.name!r}) reads output {x.index} of run {src.id} ({src.name!r}), "
                            f"which {why}. Recompute that input, then submit again."
                        ),
                    )
                    self.scheduler.remove(run)
                    return False
                if x._array is None:
                    run.waiting_for = "input"
                    return False  # its producer has not been dispatched yet
                arrays.append(x._array)
            else:
                arrays.append(x)
        if not self._admit(run):
            return False  # back-pressure: waits until running runs give memory back
        plan = run.plan
        slots: list[Any] = [None] * plan.n_slots
        for slot, a in zip(plan.input_slots, arrays):
            slots[slot] = a
        for slot, c in plan.const_slots.items():
            slots[slot] = c
        run._slots = slots
        run._inputs = []
        run._transition("running")
        for j, k in enumerate(plan.output_step):
            if k < 0:
                run.futures[j]._array = slots[plan.output_slots[j]]
        return True

    def _fail(self, run: Run, step, exc: BaseException) -> None:
        """A node raised: fail its run (lock held). Other runs are untouched."""
        if run.state in FINAL:
            return
        where = None
        if step is not None:
            where = run.source_map.get(step.name)
            node = step.node
            # A fused step stands for many nodes: only the source map can say where it came from.
            if where is None and node is not None and node.name == step.name and node.source is not None:
                where = f"{node.source[0]}, line {node.source[1]}"
        src = f"\n  at {where}" if where else ""
        step_name = step.name if step is not None else "<dispatcher>"
        err = NodeError(
            f"node {step_name!r} of program {run.graph.name!r} (run {run.id}, {run.name!r}) failed: "
            f"{type(exc).__name__}: {exc}{src}",
            run_id=run.id,
            program=run.graph.name,
            node=step_name,
        )
        err.__cause__ = exc
        run._transition("failed", err)
        self.scheduler.remove(run)
        self.dispatcher.wake()

    def _cancel(self, run: Run) -> bool:
        with self.lock:
            if run.state in FINAL:
                return False
            run._transition("cancelled")
            self.scheduler.remove(run)
            self.dispatcher.wake()
            return True

    def _check_open(self, api: str) -> None:
        if self._closed:
            raise ControllerShutdownError(
                f"`{api}`: this controller was shut down. `pw.controller()` returns a fresh one; "
                f"create slices and compiled functions on it."
            )


def _queued_event(run: Run, t: int) -> RunEvent:
    return RunEvent(run.id, run.name, run.tenant, "queued", t)


_controller: Controller | None = None
_controller_lock = threading.Lock()


@atexit.register
def _shutdown_at_exit() -> None:
    # Join the controller's threads before JAX's runtime is torn down under them.
    c = _controller
    if c is not None:
        c.shutdown(timeout=5)


def controller(create: bool = True) -> Controller | None:
    """The process's controller (created on first use; with ``create=False``, None if there is none).

    Example::

        print(pw.controller().status())
    """
    global _controller
    with _controller_lock:
        if not create:
            return _controller if _controller is not None and not _controller.closed else None
        if _controller is None or _controller.closed:
            from .config import configure_cpu_devices

            configure_cpu_devices()
            _controller = Controller()
        return _controller


def init(config: Config | None = None, **kwargs) -> Controller:
    """Replace the process's controller with a fresh one built from ``config``.

    Runs of the old controller are failed, its threads joined and its slices released.

    Example::

        pw.init(islands=2)    # the 8 CPU devices as two islands of 4
    """
    global _controller
    if config is None:
        config = Config(**kwargs)
    elif kwargs:
        config = dataclasses.replace(config, **kwargs)
    with _controller_lock:
        old, _controller = _controller, None
    if old is not None:
        old.shutdown()
    with _controller_lock:
        from .config import configure_cpu_devices

        configure_cpu_devices()
        _controller = Controller(config)
        return _controller


def shutdown() -> None:
    """Shut the process's controller down (a later `pw.controller()` makes a new one)."""
    global _controller
    with _controller_lock:
        old, _controller = _controller, None
    if old is not None:
        old.shutdown()

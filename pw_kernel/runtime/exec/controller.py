"""The single controller: one per process, owning devices, slices, runs and the event log."""

from __future__ import annotations

import atexit
import collections
import dataclasses
import itertools
import logging
import sys
import threading
import time
import warnings
from typing import Any

import jax

from ..config import Config, configure_cpu_devices, device_flags_ignored
from ..core.lifecycle import Lifecycle
from ..core.records import FINAL, Emit, Finish, OutputCell, Reject, Resolve, RunRecord, Wake
from ..core.runahead import RunAhead
from ..core.scheduler import Policy
from ..core.story import Story
from ..devices import Island, ResourceManager, VirtualSlice, build_islands, stand_in_devices
from ..donation import done_reading, mark_all_donated, reading
from ..errors import AdmissionError, ArgumentError, ControllerShutdownError, PathwaysError
from ..futures import Future
from ..remote.client import Bursts
from ..run import Run, RunLink, RunLock
from ..trace.graph import ProgramGraph
from .callback_logs import quiet_while
from .collector import raise_young_threshold
from .completion import Completion
from .dispatcher import Dispatcher, Failed
from .events import EventLog
from .history import RunHistory
from .interrupts import interrupts_deferred
from .plan import plan_for
from .port import Port
from .status import RunSummary, Status


class Controller:
    """Drives every device JAX can see: the public face of the runtime, plus its lock.

    Every change to a run goes through the lifecycle (`lifecycle.py`): the
    controller calls one transition at a time under ``lock`` and applies the
    effects it returns in `_apply`, the one place futures are resolved, run
    events emitted and the dispatcher woken. The dispatcher and completion
    report through a `Port` it hands them, and know nothing of it.

    Example::

        c = pw.controller()
        c.islands, c.runs[-1].state
        print(c.status())
    """

    def __init__(self, config: Config | None = None):
        self.config = config or Config()
        self.devices: tuple[jax.Device, ...] = tuple(jax.devices())
        ignored = device_flags_ignored(self.devices)
        if ignored is not None:
            warnings.warn(ignored, RuntimeWarning, stacklevel=3)
        self.islands = build_islands(self.devices, self.config.islands)
        self.resources = ResourceManager(self.islands)
        self.events = EventLog(self.config.max_events)
        for isl in self.islands:
            self.events.island_names[isl.id] = f"island {isl.id} ({isl.platform})"
            for d in isl.devices:
                self.events.device_names[d.id] = f"{d.platform}:{d.id}"
        self.lock = RunLock()  # re-entrant; a run's waiters wake once its holder lets go (`_retire`)
        n_islands = max((i.id for i in self.islands), default=-1) + 1
        by_id = {i.id: i for i in self.islands}
        self.runahead = RunAhead(self.config.run_ahead_s, wake=self._wake_dispatcher)
        self.lifecycle = Lifecycle(
            max_inflight=self.config.max_inflight,
            n_islands=n_islands,
            capacity=self._capacity(),
            validate=self.config.validate,
            max_collectives=[self._collective_limit(by_id.get(k)) for k in range(n_islands)],
            gate=self.runahead,
            story_length=self.config.story_length,
        )
        self._recent: collections.deque = collections.deque(maxlen=self.config.keep_outputs)
        #: Every run in flight, and the latest finished ones (Config.keep_runs, keep_events).
        self.runs = RunHistory(self.config.keep_runs, self.config.max_events)
        self._live: dict[int, Run] = {}  # runs not yet final, by id
        self._pending_outputs = 0  # their outputs: with their count, bounded (`Config.max_pending_runs`)
        self._max_pending_runs = _bound(self.config.max_pending_runs)
        self._max_pending_outputs = _bound(self.config.max_pending_outputs)
        self._room = threading.Condition(self.lock)  # a submitter waits on it for room (`_wait_for_room`)
        self._room_waiters = 0
        self._inline_wait_s = self.config.inline_wait_s
        self._ids = itertools.count()
        self._closed = False
        self.bursts = Bursts()  # remote islands with ops buffered by the dispatch burst under way
        port = Port(self.lock, self.lifecycle, self._apply)
        self.completion = Completion(port, self.events, self.runahead)
        self.dispatcher = Dispatcher(
            port, self.completion, self.events, self.runahead, self.bursts, self.config.compile_threads
        )
        self._link = RunLink(self.cancel, self.completion.wait_here, self.lifecycle.story, self.config.keep_outputs)
        self.threads: tuple[threading.Thread, ...] = (self.dispatcher.thread, self.completion.thread)
        self.dispatcher.start()
        self.completion.start()
        # Its own threads never dispatch inline (asked on every submit).
        self.dispatcher.thread_ids = frozenset(t.ident for t in self.threads)
        # A failing host callback fails its node, reported once; JAX's log line would repeat it, raw.
        self._unquiet = quiet_while(lambda: bool(self._live))
        self._ungc = raise_young_threshold(self.config.gc_threshold)  # (see `exec/collector.py`)

    #: Where `slice` places a slice given no ``island=`` (and no concrete mesh): None, the resource
    #: manager's choice among this process's islands; an island id, that island (a Pathways service's,
    #: while this process is its client: `pw_kernel.service.session`).
    default_island: int | None = None
    #: Where `pw.add_ray_islands()` (no address, no count) gets islands when another process owns the Ray
    #: nodes: a Pathways service's, while this process is its client (the ones it does not have yet).
    islands_from: Any = None

    # ------------------------------------------------------------- public API
    def slice(
        self, n: int | None = None, mesh=None, name: str | None = None, island=None, axis_types=None
    ) -> VirtualSlice:
        self._check_open("pw.slice")
        if island is None and self.default_island is not None and not isinstance(mesh, jax.sharding.Mesh):
            island = self.default_island
        return self.resources.allocate(n, mesh=mesh, name=name, island=island, axis_types=axis_types)

    @property
    def capacity(self) -> dict[int, int]:
        """Bytes per device id that runs may reserve (memory-aware admission)."""
        return self.lifecycle.capacity

    @property
    def reserved(self) -> dict[int, int]:
        """Bytes per device id reserved by running runs."""
        return self.lifecycle.reserved

    @property
    def policy(self) -> Policy:
        return self.lifecycle.policy

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
        on_error=None,
    ) -> Run:
        """Queue a traced program with its flat inputs (arrays or futures); returns its Run at once.

        ``source_map`` maps node (or step) names to where they come from, for error
        messages (the notebook front passes cell lines); ``on_error`` is called with the
        run's error if it fails, before any future raises it.
        """
        return self.call(
            graph, inputs, name=name, mode=mode, tenant=tenant, weight=weight, priority=priority,
            source_map=source_map, on_error=on_error,
        )[0]

    def call(
        self, graph: ProgramGraph, inputs: list[Any], *, name: str | None = None, mode: str | None = None,
        tenant: str = "default", weight: float = 1.0, priority: int = 0, source_map: dict[str, str] | None = None,
        on_error=None, on_computed=None,
    ) -> tuple[Run, list[Future]]:
        """`submit`, returning the run and its output futures (flat), held from before it starts: a program call
        reads them, and a run that ends within this call has let go of its own by the time it returns.

        ``on_computed``: called with the output values (flat) if the run computes whole inside this
        call (a lone call on arrays), before it is reported done (lock held): whoever answers another
        process with them (the Pathways service) answers before the bookkeeping, not after.
        """
        if self._closed:
            self._check_open("submit")
        for s in graph.slices:
            if s.released:  # (the message is made only then: every call passes here)
                s.check_live(f"submit {graph.name!r}")
            if s.island.remote is not None:
                s.island.remote.check(f"submit {graph.name!r}")
            if s._manager is not self.resources:
                raise PathwaysError(
                    f"`submit`: program {graph.name!r} uses slice {s.name!r} from a controller that was shut down "
                    f"or replaced (`pw.init`). Create the slices and compiled functions again."
                )
        plan = plan_for(graph, mode or self.config.mode, self.config.run_ahead_s)
        capacity = self.lifecycle.capacity
        for d, need in plan.peak_bytes.items() if capacity else ():
            cap = capacity.get(d)
            if cap is not None and need > cap:
                raise AdmissionError(
                    f"`submit {graph.name!r}`: the run needs about {need / 2**20:.1f} MiB on device {d}, but runs "
                    f"may reserve at most {cap / 2**20:.1f} MiB there (Config.device_memory / memory_fraction). "
                    f"Shard the values over more devices, use smaller shapes, or raise the limit."
                )
        # A future input is its output's cell: the run can start once it is dispatched.
        ins = inputs
        if self._inline_wait_s and self.completion._pending and not self.lock._is_owned() and self.completion.computed():
            # What earlier calls sent has computed (a stream of steps, each fed the last one's
            # outputs): completed here, so that this call finds its producer done and runs on this
            # thread, rather than left to the other threads, which would take the GIL for it. (Not
            # where `inline_wait_s` is 0: the Pathways service's threads that submit answer messages.)
            self.completion.complete_pending()
        # A caller that holds the lock (submitting several runs at once, or a future's callback
        # while effects are applied) leaves dispatch to the dispatcher thread.
        may_inline = not self.lock._is_owned()
        n_out = len(graph.outputs)
        with self.lock:
            if self._closed:
                self._check_open("submit")
            if not self._has_room(n_out):
                self._wait_for_room(n_out, may_inline)
            if may_inline and self.dispatcher.busy and self._inline_wait_s and _reads_unfinished(ins):
                self.dispatcher.wait_idle(self._inline_wait_s)  # (see `Config.inline_wait_s`)
            self._pending_outputs += n_out
            rec = RunRecord(
                next(self._ids), name or graph.name, graph.name, plan, ins, tenant, weight, priority, source_map,
                time.time(), on_error, cells=(),
            )
            run = Run(self._link, rec, graph)  # (gives the record its futures as its output cells)
            futures = run._futures
            self.runs.add(run)
            self._live[rec.id] = run
            self._start(rec, may_inline, on_computed)
            self._note_reads(rec, graph, inputs, ins)
        return run, futures

    def _wait_for_room(self, n_out: int, may_inline: bool) -> None:
        """Wait (lock held, let go meanwhile) until runs in flight leave room for one more of ``n_out`` outputs.

        Only a user's thread waits: the controller's own threads, a caller holding the lock, and
        a run alone (however many outputs) go on. Ctrl-C stops the wait (nothing was submitted).
        """
        if not may_inline or threading.get_ident() in self.dispatcher.thread_ids:
            return
        self._room_waiters += 1
        try:
            while self._live and not self._closed and not self._has_room(n_out):
                self._room.wait(0.25)  # (a timeout: a signal handler runs between waits)
        finally:
            self._room_waiters -= 1
        self._check_open("submit")

    def _start(self, rec: RunRecord, may_inline: bool, on_computed) -> None:
        """Queue a new run, or run or dispatch it on this thread when it is alone in the queue (lock held)."""
        # Its events in order (queued, then running if this thread starts it); the dispatcher
        # thread is woken only if this thread does not dispatch the run itself (it would contend).
        if may_inline and self.dispatcher.can_inline():
            # Alone in the queue, one step on arrays: run here whole, reported in one transition.
            args = self.lifecycle.lone_args(rec)
            if args is not None and self._run_lone(rec, args, on_computed):
                return
            # Alone in the queue: submitted and started in one transition, dispatched here.
            work, effects = self.lifecycle.submit_lone(rec, rec.submitted_at)
            self._apply(effects)
            if work is not None:
                self.dispatcher.dispatch_inline(work)
            return
        effects = self.lifecycle.handle(rec, "submit", rec.submitted_at)
        self._apply([e for e in effects if type(e) is not Wake])
        if not (may_inline and self.dispatcher.dispatch_inline()):
            self.dispatcher.wake()

    def _note_reads(self, rec: RunRecord, graph: ProgramGraph, inputs: list, ins: list) -> None:
        """Mark what the run donates; note what it still has to read until it retires (lock held).

        A run already final, or whose steps were all dispatched (XLA holds what they read), reads
        nothing more: a later run may donate its inputs, as after a `jax.jit` call. One record per
        run, whatever its leaves: nothing here looks at earlier runs.
        """
        donated = graph.donated_inputs
        if donated:
            where = {node: f"run {rec.id} ({rec.name!r}), node {node!r}" for node in set(donated.values())}
            mark_all_donated([(inputs[i], where[node]) for i, node in donated.items()])
        if rec.state in FINAL or rec.dispatched >= rec.total:
            return
        reading(rec, [x for i, x in enumerate(ins) if i not in donated] if donated else ins)

    def _run_lone(self, rec: RunRecord, args: list, on_computed=None) -> bool:
        """Call a new run's only step on this thread and report what it did (lock held; `Lifecycle.lone_args`).

        False (nothing done, the run still new) where its step needs the dispatch loop. Computed
        inside its call, the run is completed here and reported `ran` from "new": new, queued,
        running and done in one transition (`Completion.complete_computed`). Still computing, it
        is reported `sent` from "new" (queued, running and dispatched in one transition; completion
        takes it); failed, it is started, then reported failed.
        """
        life = self.lifecycle
        with interrupts_deferred:  # a Ctrl-C between the call and its report would lose the step
            try:
                sent = self.dispatcher.call_one(rec, rec.plan.steps[0], args)
                if sent is None:
                    return False
                if type(sent) is not Failed:
                    first = None if on_computed is None else (lambda out: self._computed(rec, on_computed, out))
                    if self.completion.complete_computed(sent, first):
                        return True
            except Exception as e:  # a bug of ours: fail the run, keep the controller alive
                sent = Failed(None, e)
            now = time.time()
            if type(sent) is Failed:
                self._apply(life.handle(rec, "start", rec.submitted_at))
                self._apply(life.handle(rec, "step_failed", now, sent.step, sent.error))
                return True
            # (`start` and `dispatched` in one transition: on a waited call's way, each costs it ~10 µs)
            self._apply(life.handle(rec, "sent", now, sent.cursor, sent.per_island, sent.published, sent.cost))
            self.completion.add(sent, lone=True)  # its caller completes it, waiting
            return True

    @staticmethod
    def _computed(rec: RunRecord, on_computed, published) -> None:
        try:
            on_computed([v for _, v in sorted(published, key=lambda p: p[0])])
        except Exception:  # the caller's: logged, the run goes on
            logging.getLogger("pw_kernel").exception("`on_computed` of run %s (%r) raised", rec.id, rec.name)

    @property
    def idle(self) -> bool:
        """Whether no run is live (submitted, not yet final): nothing a new node would be ordered against."""
        return not self._live

    def plan(self, graph: ProgramGraph, mode: str | None = None):
        """How ``graph`` would run here: its steps, slots and peak memory per device (cached per mode).

        Example::

            pw.controller().plan(step.trace(x)).peak_bytes
        """
        return plan_for(graph, mode or self.config.mode)

    def add_remote_islands(self, remotes) -> list[Island]:
        """Register remote islands (see `pw.add_ray_islands`); returns the new Island objects."""
        added = []
        with self.lock:
            next_id = max((i.id for i in self.islands), default=-1) + 1
            for r in remotes:
                n = len(r.info["devices"])
                island = Island(next_id, tuple(stand_in_devices(n, "pw.add_ray_islands")), r.info["platform"], remote=r)
                r.island = island
                r.bursts = self.bursts
                next_id += 1
                added.append(island)
                self.events.island_names[island.id] = f"island {island.id} (Ray: {r.info['host']} pid {r.info['pid']})"
                for k, d in enumerate(r.info["devices"]):
                    self.events.device_names[island.device_id(k)] = f"{r.info['platform']}:{d}@{island.id}"
            self.resources.add_islands(added)
            self.islands = self.resources.islands
            self.lifecycle.add_islands(len(self.islands))
        return added

    def set_policy(self, policy: Policy) -> None:
        """Switch the scheduling policy now (FIFO, FairShare, Priority); queued runs follow the new one.

        Example::

            pw.controller().set_policy(pw.FairShare({"A": 1, "B": 3}))
        """
        if not isinstance(policy, Policy):
            raise ArgumentError(
                f"`Controller.set_policy` needs a policy such as pw.FIFO(), pw.FairShare() or pw.Priority() "
                f"(an object with name, quantum, pick and charge); got {policy!r}."
            )
        with self.lock:
            self.lifecycle.policy = policy
            self.dispatcher.wake()

    def status(self) -> Status:
        with self.lock:
            runs = tuple(
                RunSummary(r.id, r.name, r.state, r.nodes_done, r.nodes_total, r.compile_time, r.nodes_on_devices,
                           *((r.throughput, r.time_left) if r.state == "running" else ()))
                for r in self.runs
            )
            return Status(
                islands=tuple(self.islands),
                slices=tuple(self.resources.slices),
                runs=runs,
                inflight={i.id: self.lifecycle.inflight[i.id] for i in self.islands},
                policy=self.lifecycle.policy.name,
            )

    def run(self, run_id: int) -> Run:
        r = self.runs.get(run_id)
        if r is not None:
            return r
        raise PathwaysError(f"No run with id {run_id!r}; runs are {[r.id for r in self.runs][-20:]} (latest last).")

    def wait_all(self, timeout: float | None = None) -> None:
        """Block until every submitted run is final."""
        for r in list(self.runs):
            r.wait(timeout)

    def cancel(self, run: Run) -> bool:
        """Cancel ``run`` (what `Run.cancel` does); False if it was already final."""
        with self.lock:
            if run.state in FINAL:
                return False
            self._apply(self.lifecycle.handle(run.record, "cancel", time.time()))
            self._cancel_remote(run.record)
            return True

    @staticmethod
    def _cancel_remote(rec) -> None:
        """Tell the remote islands that run nodes of ``rec`` dispatched and not finished (the service queues them)."""
        if rec.dispatched <= rec.done:
            return
        told = set()
        for st in rec.plan.steps:
            isl = getattr(st.call, "island", None) if st.remote else None
            if isl is not None and id(isl) not in told:
                told.add(id(isl))
                isl.cancel_run(rec.id)

    def cancel_all(self) -> int:
        """Cancel every run not yet final; returns how many were cancelled."""
        return sum(self.cancel(r) for r in list(self.runs))

    def submitted_by(self, thread: threading.Thread, after: int = -1) -> list[Run]:
        """The kept runs with ids above ``after`` that ``thread`` submitted, oldest first.

        The submitter is the thread of a run's first transition in the story log, read from its end
        (a run whose first row the log no longer keeps is left out). Example (what a notebook's Ctrl-C
        cancels)::

            mark = c.runs[-1].id if c.runs else -1      # before the cell
            mine = c.submitted_by(threading.current_thread(), after=mark)
        """
        with self.lock:
            newer: dict[int, Run] = {}
            for r in reversed(self.runs):  # ids increase along the list
                if r.id <= after:
                    break
                newer[r.id] = r
            mine = []
            for row in reversed(self.lifecycle.log):
                if not newer:
                    break
                _, run_id, start, *_, by = row  # (a `story.Row`)
                if start == "new" and run_id in newer:
                    run = newer.pop(run_id)
                    if by is thread:
                        mine.append(run)
            return mine[::-1]

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Fail runs still in flight with ControllerShutdownError, stop and join the controller's threads."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            now = time.time()
            for run in list(self._live.values()):
                if run.record.state not in FINAL:  # (failed meanwhile: an earlier one's end failed its readers)
                    self._apply(self.lifecycle.handle(run.record, "shutdown", now))
        self.dispatcher.stop()
        self.completion.stop()
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(timeout)
        self.resources.release_all()
        self._unquiet()
        self._ungc()

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running"
        counts = ", ".join(_count(n, what) for n, what in (
            (len(self.devices), "device"), (len(self.islands), "island"), (len(self.runs), "run")))
        return f"<pw.Controller {state}: {counts}>"

    def story(self, run_id: int) -> Story:
        """Run ``run_id``'s transitions (`Run.story`), as far as the lifecycle's log keeps them."""
        run = self.runs.get(run_id)
        return Story(self.lifecycle.story(run_id), run_id, run.name if run is not None else "")

    def _wake_dispatcher(self) -> None:
        """A node finished and the dispatcher waits for run-ahead room (completing thread, no lock held)."""
        with self.lock:
            self.dispatcher.wake()

    # ------------------------------------------------------------ effects
    def _apply(self, effects: list) -> None:
        """Carry out what the lifecycle decided: the one place futures are set and run events emitted."""
        for e in effects:
            kind = type(e)
            if kind is Emit:  # (the commonest first: one to three per run)
                rec = e.rec
                err = e.error
                if err is None:
                    self.events.emit_run(rec.id, rec.name, rec.tenant, e.state, None)
                    continue
                if rec.on_error is not None:  # before any future raises it
                    rec.on_error(err)
                self.events.emit_run(rec.id, rec.name, rec.tenant, e.state, f"{type(err).__name__}: {err}")
            elif kind is Resolve:
                self._live[e.rec.id].resolve(e.outputs)
            elif kind is Wake:
                self.dispatcher.wake()
            elif kind is Reject:
                self._live[e.rec.id].reject(e.indices, e.error, e.cancelled)
            elif kind is Finish:
                run = self._live.pop(e.rec.id)
                self._pending_outputs -= len(run.graph.outputs)
                self._retire(run)
                if self._room_waiters and self._has_room(0):
                    self._room.notify()
            else:  # pragma: no cover - a new effect without its applier
                raise AssertionError(f"no applier for effect {e!r}")

    def _retire(self, run: Run) -> None:
        """A run became final: keep its outputs among the most recent, forget old runs, and wake its waiters
        once this thread lets go of the lock (and of what it held of the run's arrays: `Completion._complete`)."""
        done_reading(run.record)
        self.lock.pending.append(run)  # woken once this thread lets go of the lock (`RunLock`)
        if self.lifecycle.validate:
            assert all(f.done() for f in run.futures), run
        recent = self._recent
        if self.config.keep_outputs > 0:
            if len(recent) == recent.maxlen:
                recent[0].release_outputs()  # (the deque drops it below)
            recent.append(run)
        else:
            run.release_outputs()
        self.runs.finished(run)

    def _has_room(self, n_out: int) -> bool:
        """Whether a run of ``n_out`` outputs fits under the pending bounds (lock held; on every call and run's end)."""
        return len(self._live) < self._max_pending_runs and self._pending_outputs + n_out <= self._max_pending_outputs

    def _collective_limit(self, island: Island | None) -> int:
        """How many steps with collectives ``island`` may queue (see `Config.max_inflight_collectives`)."""
        if self.config.max_inflight_collectives is not None:
            return self.config.max_inflight_collectives
        if island is not None and island.platform == "cpu" and len(island.devices) > 1 and island.remote is None:
            return CPU_COLLECTIVES_INFLIGHT
        return self.config.max_inflight

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

    def _check_open(self, api: str) -> None:
        if self._closed:
            raise ControllerShutdownError(
                f"`{api}`: this controller was shut down. `pw.controller()` returns a fresh one; "
                f"create slices and compiled functions on it."
            )


def _bound(n: int | None) -> int:
    """A `Config` bound as a number to compare with (None: no bound)."""
    return sys.maxsize if n is None else max(1, n)


def _reads_unfinished(inputs: list) -> bool:
    """Whether a call reads an output of a run not yet done (its first such input answers: a chain's are alike)."""
    for x in inputs:
        if isinstance(x, OutputCell):
            return x.producer.state != "done"
    return False


def _count(n: int, what: str) -> str:
    """``3 runs``, ``1 device``."""
    return f"{n} {what}{'' if n == 1 else 's'}"


#: XLA:CPU runs every simulated device's part of an execution on one shared thread pool, about as
#: many threads as devices, and a collective holds its threads until every participant arrives. Two
#: collective executions queued together can each hold some of the threads and wait for the others:
#: after 40 s XLA aborts the process ("Termination timeout for all reduce"). With 8 devices on 2
#: cores, 4 or 8 queued steps aborted a 300-step data-parallel loop; 1 never did.
CPU_COLLECTIVES_INFLIGHT = 1

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
    c = _controller
    if create and c is not None and not c._closed:
        return c  # every call outside a program asks: no lock for the common answer
    with _controller_lock:
        if not create:
            return _controller if _controller is not None and not _controller.closed else None
        if _controller is None or _controller.closed:
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
        configure_cpu_devices()
        _controller = new = Controller(config)
    for hook in list(_on_replaced):
        hook(old, new)
    return new


#: What `on_controller_replaced` registered: called with (old, new) when `init` replaces the controller.
_on_replaced: list = []


def on_controller_replaced(hook) -> None:
    """Call ``hook(old, new)`` each time `init` replaces the process's controller (``old`` may be None).

    For extensions that registered something on the old one: the Pathways service's client adds its
    island to the new controller, so a `pw.init()` after `pw.connect()` keeps the connection. `shutdown`
    calls it too, with ``new`` None: the connection ends there.

    Example::

        on_controller_replaced(lambda old, new: print("new controller", new))
    """
    if hook not in _on_replaced:
        _on_replaced.append(hook)


def shutdown() -> None:
    """Shut the process's controller down (a later `pw.controller()` makes a new one)."""
    global _controller
    with _controller_lock:
        old, _controller = _controller, None
    if old is not None:
        old.shutdown()
    for hook in list(_on_replaced):
        hook(old, None)

"""The run lifecycle: every run's state, and transitions that decide and return effects.

One `Lifecycle` per controller holds each run's state, cursor, value slots and
memory reservation, the per-island in-flight counts and the runnable queue.
Every change goes through `Lifecycle.handle(rec, event, ...)`, which looks the
handler up in the table (`table.py`) by (state, event), lets it update the state, and
returns the *effects* the caller must apply: resolve or reject futures, emit a
run event, finish a run, wake the dispatcher. As in dask.distributed's
``SchedulerState._transition``, nothing here acts: no locks, threads, futures
or JAX calls. The controller calls one transition at a time under its lock and
applies the effects in one place (`Controller._apply`); the dispatcher and the
watcher only execute steps and report what happened.

Each decision is made here and only here: a run starts (inputs dispatched,
memory admitted), a run is done (`_finish_if_complete`), a run leaves the
queue (`_leave`), an output is resolved (`_resolve`, exactly once each).
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import CancelledError, ControllerShutdownError, InvalidTransition, at_rest
from .failures import input_error, node_error
from .records import NOTHING, WAKE, Emit, OutputCell, Resolve, Reject, Finish, RunRecord, RunState, Work
from .pick import pick
from .ready import ReadyIndex
from .scheduler import FIFO, Policy
from .story import Row, Story, transition
from .table import TARGETS, TRANSITIONS, on, transition_edges
from .validation import check_events, check_invariants, check_row

if TYPE_CHECKING:
    from ..exec.plan import Step
    from .runahead import RunAhead


_HERE = threading.local()  # (`Lifecycle._thread`: each thread's `threading.Thread`, read in C)


class Lifecycle:
    """Every run's state and the runnable queue; `handle` is the one way to change them.

    Example (no threads, no devices: the controller does this under its lock)::

        life = Lifecycle(max_inflight=256, n_islands=1)
        effects = life.submit(rec)
        work, effects = life.next_work(now)      # starts rec, returns Work(rec, quantum)
    """

    def __init__(
        self,
        *,
        max_inflight: int,
        n_islands: int,
        capacity: dict[int, int] | None = None,
        policy: Policy | None = None,
        validate: bool = False,
        max_collectives: Sequence[int] | None = None,
        gate: RunAhead | None = None,
        story_length: int = 100_000,
    ):
        self.max_inflight = max_inflight
        # The run-ahead bound (`runahead.py`): ``gate.full(step, inflight)`` says a step's devices
        # have enough estimated work queued. None: no bound beyond max_inflight.
        self.gate = gate
        self.inflight = [0] * n_islands  # dispatched minus completed steps, per island
        # ... of which steps whose executable has collectives, and how many of those an island may
        # queue: XLA:CPU aborts when too many collective executions wait on its simulated devices.
        self.collectives_inflight = [0] * n_islands
        self.max_collectives = list(max_collectives) if max_collectives is not None else [max_inflight] * n_islands
        # ... and steps that call Python host callbacks: one at a time per island, so that what a
        # guarded callback raised is known to belong to the one execution in flight (see
        # `executables._GuardedCallback`).
        self.callbacks_inflight = [0] * n_islands
        self.dispatched = [0] * n_islands  # totals, for validation
        self.completed = [0] * n_islands
        self.capacity: dict[int, int] = dict(capacity or {})  # device id -> bytes runs may reserve
        self.reserved: dict[int, int] = {}
        self.queue: dict[int, RunRecord] = {}  # runs not yet final, in submission order
        # ... of which those with steps left to dispatch: the only ones `next_work` looks at (runs
        # that wait for completions only are off it, so a deep queue of those costs nothing).
        self.dispatchable: dict[int, RunRecord] = {}
        self._policy: Policy = policy or FIFO()
        # ... indexed by what their next step needs, in the policy's order: the pick's cost does not grow
        # with the queue (`ready.py`)
        self.ready = ReadyIndex(self._policy)
        self.validate = validate
        # What the last `next_work` found runs waiting for: the events that can unblock them wake
        # the dispatcher (credit: a completion; memory or input: a run ending), and nothing else does.
        self.credit_wanted = False
        self.blocked = False  # a queued run waits for memory or for an input
        self._last_end: dict[int, int] = {}  # validation: device -> end of its last node event
        # Transitions that a transition recommends (a failed producer fails its readers, a done one
        # may finish them), applied in order by the outermost `handle`: dask's recommendations loop,
        # so a cascade through 10,000 chained runs is a loop, not 10,000 nested calls.
        self._later: collections.deque = collections.deque()
        self._cascading = False
        #: The transition log (`story`): one row per transition, the last ``story_length`` kept.
        self.log: collections.deque[Row] = collections.deque(maxlen=story_length)
        self._stimuli = itertools.count(1)
        # The stimulus being handled: kind, number, thread (named when a story is read: one lookup less a row).
        self._stimulus: tuple[str, int, Any] = ("", 0, None)
        self._last_state: dict[int, str] = {}  # validation: each run's state after its last logged transition

    @property
    def policy(self) -> Policy:
        """The scheduling policy; set it to switch (queued runs follow the new one's order)."""
        return self._policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self._policy = policy
        self.ready.set_policy(policy)

    # ---------------------------------------------------------------- events
    def handle(self, rec: RunRecord, event: str, now: float, *args: Any, stimulus: tuple | None = None) -> list:
        """Apply ``event`` to ``rec`` through the table, then every transition it recommends; returns the effects.

        The outermost call is one stimulus (a report, a call): it gets the next number, and every
        transition it causes is logged with it (`story`). ``stimulus``: one already begun
        (`begin`), which several calls share (one pick of the next work starts several runs).
        """
        if self._cascading:  # (a handler handling another run: part of the same stimulus)
            return self._transition(rec, event, now, args)
        if stimulus is None:
            try:
                thread = _HERE.thread  # (read in C; the call below once per thread)
            except AttributeError:
                thread = self._thread()
            stimulus = (event, next(self._stimuli), thread)
        self._stimulus = stimulus
        effects = self._transition(rec, event, now, args)
        if not self._later:
            return effects
        self._cascading = True
        try:
            later = self._later
            while later:
                r, ev, t, a = later.popleft()
                effects += self._transition(r, ev, t, a)
        finally:
            self._cascading = False
            self._later.clear()
        return effects

    def begin(self, kind: str) -> tuple[str, int, Any]:
        """A new stimulus of ``kind`` that several `handle` calls share (pass it as ``stimulus=``)."""
        return (kind, next(self._stimuli), self._thread())

    @staticmethod
    def _thread() -> threading.Thread:
        """This thread, kept in a thread-local the first time (`threading.current_thread` is a Python call, and a
        stimulus is made per call or report; a thread-local is read in C)."""
        try:
            return _HERE.thread
        except AttributeError:
            _HERE.thread = threading.current_thread()
            return _HERE.thread

    def recommend(self, rec: RunRecord, event: str, now: float, *args: Any) -> None:
        """Queue a transition for after the current one (only inside a handler)."""
        self._later.append((rec, event, now, args))

    def _transition(self, rec: RunRecord, event: str, now: float, args: tuple) -> list:
        start = rec.state
        key = (start, event)
        fn = TRANSITIONS.get(key)
        if fn is None:
            raise InvalidTransition(f"run {rec.id}: no transition for event {event!r} in state {start!r}")
        effects = fn(self, rec, now, *args)
        kind, n, thread = self._stimulus
        row = (now, rec.id, start, rec.state, event, kind, n, thread)
        self.log.append(row)
        if self.validate:
            assert rec.state in TARGETS[key], f"{key} led to {rec.state!r}, not one of {TARGETS[key]}"
            check_row(self._last_state, row)
            self.check(rec)
        return effects

    def story(self, run_id: int) -> Story:
        """Run ``run_id``'s transitions in order, as far as the log still keeps them.

        Example::

            print(life.story(3))     # time, from -> to, event, stimulus, thread
        """
        return Story([transition(r) for r in list(self.log) if r[1] == run_id], run_id)

    def submit(self, rec: RunRecord, now: float = 0.0) -> list:
        """A new run joins the queue: the table's ``("new", "submit")``."""
        return self.handle(rec, "submit", now)

    def submit_lone(self, rec: RunRecord, now: float) -> tuple[Work | None, list]:
        """A new run: queued and started in one transition if it finds the queue empty (a lone interactive call).

        The fused form of ``submit`` followed by the `next_work` that would pick it: the table's
        ``("new", "start")`` does both, through the same states and events, without the queue
        scan. Returns the work for the submitting thread (None if the run cannot start now: it
        was submitted, ``("new", "submit")``, and waits in the queue, with a WAKE among the effects).
        """
        steps = rec.plan.steps
        if self.queue or (steps and self.out_of_credit(steps[0])) or self.blocker(rec) is not None:
            return None, self.handle(rec, "submit", now)
        effects = self.handle(rec, "start", now)
        if rec.state != "running" or rec.cursor >= len(steps):
            return None, effects  # finished at start (nothing to dispatch)
        return Work(self.policy.pick((rec,)), self.policy.quantum, True), effects  # (inline)

    def lone_args(self, rec: RunRecord) -> list[Any] | None:
        """The arguments of a new run's only step, if its submitting thread may run the run whole now.

        So it may when the queue is empty, the plan is one step that reads only the run's
        inputs and makes all its outputs (`Plan.lone_args`), its island has credit, its memory
        fits, and its inputs are arrays or outputs of finished runs. The caller then calls the
        step and reports ``ran`` from "queued" (queued, running and done in one transition),
        or, if the step is still computing or failed, starts the run (`start_lone`) and reports
        the usual way. None: submit it the usual way (nothing changed).
        """
        plan = rec.plan
        feed = plan.lone_args
        if feed is None or self.queue or self.out_of_credit(plan.steps[0]):
            return None
        ins = rec.inputs
        args = [ins[k] for k in feed]
        try:  # every input another run's output (a step's state fed to the next): asked as one batch
            producers = {x.producer for x in args}
        except AttributeError:  # arrays among them: one by one
            producers = None
        if producers is not None:
            if any(p.state != "done" for p in producers):
                return None  # read before its producer is done: it must wait for it (`upstream`)
            args = [x.value for x in args]
        else:
            for i, x in enumerate(args):
                if isinstance(x, OutputCell):
                    if x.producer.state != "done":
                        return None
                    args[i] = x.value
        if plan.peak_bytes and self.capacity and not self._fits(plan.peak_bytes):
            return None
        return args

    def add_islands(self, n: int, max_collectives: int | None = None) -> None:
        grow = n - len(self.inflight)
        for counts in (self.inflight, self.collectives_inflight, self.callbacks_inflight, self.dispatched, self.completed):
            counts.extend([0] * grow)
        self.max_collectives.extend([max_collectives or self.max_inflight] * grow)

    def no_room(self, step: Step, sent: Sequence[int] = (0, 0, 0)) -> bool:
        """Whether ``step``'s island has no room for it beside ``sent`` (steps, with collectives, with host
        callbacks, sent and not yet reported): too many steps, or too many with collectives, queued, or a
        step with host callbacks already in flight. The one place credit is decided (the dispatcher asks it
        for each step of a burst; `out_of_credit` for the first)."""
        island = step.island
        if self.inflight[island] + sent[0] >= self.max_inflight:
            return True
        if step.host_callbacks and self.callbacks_inflight[island] + sent[2]:
            return True
        return step.exe.collectives and self.collectives_inflight[island] + sent[1] >= self.max_collectives[island]

    def out_of_credit(self, step: Step) -> bool:
        """Whether ``step`` cannot go now: `no_room`, its devices' run-ahead bound reached, or its executable
        compiling (`Dispatcher._compile_aside`, whose end wakes the dispatcher)."""
        if self.no_room(step) or step.exe.compiling:
            return True
        return self.gate is not None and self.gate.full(step, self.inflight)

    def next_work(self, now: float) -> tuple[Work | None, list]:
        """The policy's choice among runs that can dispatch now; a queued run it picks starts (`pick.py`)."""
        return pick(self, now)

    def has_work(self) -> bool:
        """Whether some run is queued or has steps left to dispatch (what `next_work` might pick)."""
        return bool(self.dispatchable)

    def check_events(self, events: Sequence[Any]) -> None:
        """Validation: node events of one device never overlap (end >= start >= dispatch)."""
        check_events(self._last_end, events)

    def check(self, rec: RunRecord | None = None) -> None:
        """Assert the invariants (after every transition when ``validate`` is on, as in the tests)."""
        check_invariants(self, rec)

    # --------------------------------------------------------------- helpers
    def blocker(self, rec: RunRecord) -> str | None:
        """Why a queued run cannot start: 'failed' (an input failed), 'input', 'memory', or None."""
        for x in rec.inputs:
            if isinstance(x, OutputCell):
                if x.producer.state in ("failed", "cancelled"):
                    return "failed"
                if x.value is None:
                    return "input"  # its producer has not dispatched it yet
        if rec.plan.peak_bytes and self.capacity and not self._fits(rec.plan.peak_bytes):
            return "memory"  # back-pressure: waits until running runs give memory back
        return None

    def _fits(self, need: dict[int, int]) -> bool:
        """Whether ``need`` (bytes per device) fits beside what running runs reserve."""
        cap, reserved = self.capacity, self.reserved
        for d, n in need.items():
            c = cap.get(d)
            if c is not None and reserved.get(d, 0) + n > c:
                return False
        return True

    def _resolve(self, rec: RunRecord, outputs: Sequence[tuple[int, Any]]) -> Resolve | None:
        """The effect that sets outputs ``(j, value)`` of ``rec`` not yet resolved (each is, once)."""
        resolved = rec.resolved
        if len(outputs) == len(resolved) and not any(resolved):  # every output, none set yet (a whole run)
            rec.resolved = bytearray(b"\x01") * len(resolved)
            return Resolve(rec, tuple(outputs)) if outputs else None
        outs = []
        for j, v in outputs:
            if not resolved[j]:
                resolved[j] = 1
                outs.append((j, v))
        return Resolve(rec, tuple(outs)) if outs else None

    def _leave(self, rec: RunRecord, state: RunState, now: float, error: BaseException | None) -> list:
        """Every way into a final state: leave the queue, give memory back, reject what is unresolved."""
        rec.state = state
        rec.error = at_rest(error) if error is not None else None  # (kept with the run: no frames, no arrays)
        rec.finished_at = now
        rec.slots = None
        rec.inputs = ()
        rec.cells = ()  # the futures (and readers) keep theirs; a retained record holds no arrays
        rec.waiting_for = None
        rec.held = NOTHING
        self.queue.pop(rec.id, None)
        self.dispatchable.pop(rec.id, None)
        ready = self.ready
        ready.remove(rec)
        if rec.id in ready.on_producer:  # its readers find it failed
            ready.producer_moved(rec)
        if rec.reserved:
            for d, n in rec.reserved.items():
                self.reserved[d] -= n
            ready.memory_freed()
        rec.reserved = NOTHING
        for cell in rec.upstream:
            cell.producer.downstream.remove(rec)
        rec.upstream = ()
        effects: list = [Emit(rec, state, error)]
        pending = tuple(j for j, r in enumerate(rec.resolved) if not r)
        if pending:
            for j in pending:
                rec.resolved[j] = 1
            effects.append(Reject(rec, pending, error, cancelled=state == "cancelled"))
        effects.append(Finish(rec))
        if rec.downstream:
            self._release_readers(rec, "upstream_failed", now)  # they computed on what this run made: they fail with it
        if self.blocked or self.credit_wanted:
            effects.append(WAKE)
        return effects

    def _finish_if_complete(self, rec: RunRecord, now: float, published: Sequence[tuple[int, Any]] = ()) -> list:
        """The one place that decides a run is done: every step dispatched and completed.

        Outputs not yet resolved get the values the last steps ``published``, else what their cells hold
        (an output that is an input or a constant: set at start). The value slots are never read here:
        they are lent to the dispatcher.
        """
        if rec.done < rec.total or rec.cursor < rec.total:
            return []
        if rec.upstream:  # what it read may yet turn out to come from a failure: wait for those runs
            rec.held = {**rec.held, **dict(published)}
            return []
        rec.state = "done"
        rec.finished_at = now
        self.queue.pop(rec.id, None)
        self.dispatchable.pop(rec.id, None)
        ready = self.ready
        ready.remove(rec)
        if rec.id in ready.on_producer:
            ready.producer_moved(rec)
        if rec.reserved:
            reserved = self.reserved
            for d, n in rec.reserved.items():
                reserved[d] -= n
            ready.memory_freed()
        rec.reserved = NOTHING
        cells = rec.cells
        rec.slots = None
        rec.inputs = ()
        rec.cells = ()
        # The event first, then the futures: whoever wakes on an output sees the run done.
        effects: list = [Emit(rec, "done")]
        held = rec.held
        rec.held = NOTHING
        resolved = rec.resolved
        if held or len(published) < len(resolved):  # some outputs are among those held, or inputs (set at start)
            fresh = {**held, **dict(published)}
            outs = [(j, fresh[j] if j in fresh else cells[j].value) for j, r in enumerate(resolved) if not r]
        else:
            outs = published  # every output, just made (each is published once): a lone call, a fused run
        res = self._resolve(rec, outs)
        if res is not None:
            effects.append(res)
        effects.append(Finish(rec))
        if self.blocked:  # its memory may let a queued run start
            effects.append(WAKE)
        if rec.downstream:
            self._release_readers(rec, "upstream_done", now)
        return effects

    def _release_readers(self, rec: RunRecord, event: str, now: float) -> None:
        """``rec`` is final: detach the runs that read it before it was, and recommend ``event`` for each.

        The cell is detached here, so a reader never holds a final producer while it waits its turn.
        """
        readers, rec.downstream = rec.downstream, ()
        for reader in readers:
            cell = next(c for c in reader.upstream if c.producer is rec)
            reader.upstream.remove(cell)
            self.recommend(reader, event, now, cell)


# ---------------------------------------------------------------- handlers
@on(("new", "submit"), to=("queued",))
def _submit(life: Lifecycle, rec: RunRecord, now: float) -> list:
    """A new run joins the queue."""
    rec.state = "queued"
    life.queue[rec.id] = rec
    life.dispatchable[rec.id] = rec
    life.ready.add(rec)
    return [Emit(rec, "queued"), WAKE]


@on(("new", "start"), to=("running", "done"))
def _submit_start(life: Lifecycle, rec: RunRecord, now: float) -> list:
    """A new run that may start at once (`Lifecycle.submit_lone`, or its step was called at submit): queued, then
    started, in one transition. The queue was empty, so nobody waits for credit or memory."""
    rec.state = "queued"
    life.queue[rec.id] = rec
    life.dispatchable[rec.id] = rec
    life.ready.add(rec)
    life.credit_wanted = life.blocked = False
    return [Emit(rec, "queued"), *_start(life, rec, now)]


@on(("queued", "wait"), ("running", "wait"))
def _wait(life: Lifecycle, rec: RunRecord, now: float, reason: str | None) -> list:
    """What the run waits for before it can dispatch ('credit', 'memory', 'input'), or None: it is picked."""
    rec.waiting_for = reason
    return []


@on(("running", "compiling"), ("failed", "compiling"), ("cancelled", "compiling"))
def _compiling(life: Lifecycle, rec: RunRecord, now: float, step_name: str | None, events: Sequence[Any] = (),
               ns: int = 0) -> list:
    """The dispatcher compiles ``step_name`` for ``rec`` (None: done); ``events``: its compile events once timed,
    ``ns`` the wall time they took (several compile at once). Progress views show what compiles; `Run.compile_time`
    and `Run.events` read the rest."""
    rec.compiling = step_name
    if events:
        rec.compile_ns += ns
        rec.events.extend(events)
    return []


@on(("queued", "start"), to=("running", "done"))
def _start(life: Lifecycle, rec: RunRecord, now: float) -> list:
    """Inputs are dispatched and memory fits: reserve it, fill the slots, run."""
    plan = rec.plan
    for d, n in plan.peak_bytes.items():
        life.reserved[d] = life.reserved.get(d, 0) + n
    rec.reserved = plan.peak_bytes  # read when it is given back, never written
    slots: list[Any] = [None] * plan.n_slots
    for slot, x in zip(plan.input_slots, rec.inputs):
        if isinstance(x, OutputCell):
            slots[slot] = x.value
            src = x.producer
            if src.state != "done" and all(c.producer is not src for c in rec.upstream):
                rec.upstream = [*rec.upstream, x]
                src.downstream = [*src.downstream, rec]
        else:
            slots[slot] = x
    for slot, c in plan.const_slots.items():
        slots[slot] = c
    rec.slots = slots
    rec.inputs = ()
    rec.state = "running"
    rec.started_at = now
    rec.waiting_for = None
    set_now = False
    for j, k in enumerate(plan.output_step):
        if k < 0:  # an output that is an input or a constant: dispatched from the start
            rec.cells[j].value = slots[plan.output_slots[j]]
            set_now = True
    if set_now and rec.id in life.ready.on_producer:
        life.ready.producer_moved(rec)
    if rec.total:
        return [Emit(rec, "running")]
    life.dispatchable.pop(rec.id, None)
    life.ready.remove(rec)
    return [Emit(rec, "running"), *life._finish_if_complete(rec, now)]  # nothing to run: done at once


@on(("queued", "input_failed"), to=("failed",))
def _input_failed(life: Lifecycle, rec: RunRecord, now: float) -> list:
    for x in rec.inputs:
        if isinstance(x, OutputCell) and x.producer.state in ("failed", "cancelled"):
            return life._leave(rec, "failed", now, input_error(rec, x))
    raise InvalidTransition(f"run {rec.id}: input_failed, but no input failed")


@on(("running", "dispatched"), ("failed", "dispatched"), ("cancelled", "dispatched"))
def _dispatched(
    life: Lifecycle,
    rec: RunRecord,
    now: float,
    cursor: int,
    per_island: Sequence[tuple[int, int, int, int]],
    published: Sequence[tuple[int, Any]],
    cost: int = 0,
) -> list:
    """The dispatcher sent steps up to ``cursor`` (a run may have ended meanwhile: they still count).

    ``per_island``: (island, steps, of which with collectives, of which with host callbacks);
    ``cost``: their estimated device time, which the policy charges the run's tenant.
    """
    if cost:
        life.policy.charge(rec, cost)
    n = 0
    for island, k, kc, kh in per_island:
        life.inflight[island] += k
        life.collectives_inflight[island] += kc
        life.callbacks_inflight[island] += kh
        life.dispatched[island] += k
        n += k
    rec.dispatched += n
    if rec.state == "running":
        rec.cursor = cursor
        if cursor >= rec.total:
            life.dispatchable.pop(rec.id, None)  # all sent: it only waits for completions now
            life.ready.remove(rec)
        else:
            life.ready.add(rec)  # under its next step
        cells = rec.cells
        for j, value in published:
            cells[j].value = value
        if published and rec.id in life.ready.on_producer:
            life.ready.producer_moved(rec)
    else:
        rec.cursor = rec.dispatched  # nothing more will be sent for a final run
    return []


@on(("running", "completed"), to=("running", "failed", "done"))
@on(("failed", "completed"), ("cancelled", "completed"))
def _completed(
    life: Lifecycle,
    rec: RunRecord,
    now: float,
    per_island: Sequence[tuple[int, int, int, int]],
    published: Sequence[tuple[int, Any]],
    failure: tuple[Step, BaseException] | None,
    events: Sequence[Any] = (),
) -> list:
    """Steps finished on their devices: give credit back, record their node events, resolve what they made,
    fail or finish the run."""
    n = 0
    for island, k, kc, kh in per_island:
        life.inflight[island] -= k
        life.collectives_inflight[island] -= kc
        life.callbacks_inflight[island] -= kh
        life.completed[island] += k
        n += k
    rec.done += n
    if events:
        if life.validate:
            life.check_events(events)
        rec.events.extend(events)
    effects: list = [WAKE] if life.credit_wanted else []
    if rec.state != "running":
        return effects  # steps of a run that already failed or was cancelled, draining
    if failure is not None:
        return effects + life._leave(rec, "failed", now, node_error(rec, *failure))
    if rec.done == rec.total and rec.cursor == rec.total:
        return effects + life._finish_if_complete(rec, now, published)  # resolves after the done event
    if published and rec.upstream:
        rec.held = {**rec.held, **dict(published)}  # resolved once the runs it read from are done
    elif published:
        res = life._resolve(rec, published)
        if res is not None:
            effects.append(res)
    return effects


@on(("running", "ran"), to=("running", "failed", "done"))
def _ran(life: Lifecycle, rec: RunRecord, now: float, cursor: int, per_island: Sequence[tuple[int, int, int, int]],
         published: Sequence[tuple[int, Any]], cost: int, events: Sequence[Any]) -> list:
    """Steps up to ``cursor`` were dispatched and have finished, reported at once by the thread that sent them
    (a lone call's step that computed inside its call): `dispatched` followed by `completed`, in one transition."""
    _dispatched(life, rec, now, cursor, per_island, published, cost)
    return _completed(life, rec, now, per_island, published, None, events)


_LONE_STATES = ("queued", "running", "done")  # the events of a lone call run whole: entered at once


@on(("new", "ran"), to=("done",))
def _ran_lone(life: Lifecycle, rec: RunRecord, now: float, cursor: int, per_island: Sequence[tuple[int, int, int, int]],
              published: Sequence[tuple[int, Any]], cost: int, events: Sequence[Any]) -> list:
    """A new run its caller ran whole at submit (`Lifecycle.lone_args`): queued, running and done in one transition.

    `start` then `ran` for the commonest interactive call, a one-step run that computed inside
    its call: the same states, counts and effects, without the value slots or a memory
    reservation (it fit, and would be given back in this same transition). Done is decided,
    and the outputs resolved, where every run's are (`_finish_if_complete`).
    """
    if cost:
        life.policy.charge(rec, cost)
    for island, k, _, _ in per_island:  # in flight and out again: only the totals move
        life.dispatched[island] += k
        life.completed[island] += k
    life.credit_wanted = life.blocked = False  # the queue was empty: nobody waits for either
    rec.dispatched = rec.done = rec.cursor = cursor
    if life.validate:
        life.check_events(events)
    rec.events.extend(events)
    rec.state = "running"
    rec.started_at = rec.submitted_at
    rec.inputs = ()
    cells = rec.cells
    for j, value in published:  # (every output: `Plan.lone_args`)
        cells[j].value = value
    effects = life._finish_if_complete(rec, now, published)
    effects[0] = Emit(rec, _LONE_STATES)  # its done event (the first), with the states it went through before
    return effects


@on(("new", "sent"), to=("running",))
def _sent_lone(life: Lifecycle, rec: RunRecord, now: float, cursor: int, per_island: Sequence[tuple[int, ...]],
               published: Sequence[tuple[int, Any]], cost: int) -> list:
    """A new run its caller sent whole at submit, still computing (a remote island's answer on its way): `start` (at
    its submit) then `dispatched` in one transition, with one run event for the two states it entered."""
    effects = _submit_start(life, rec, rec.submitted_at)
    _dispatched(life, rec, now, cursor, per_island, published, cost)
    effects[0:2] = [Emit(rec, ("queued", "running"))]
    return effects


@on(("running", "upstream_done"), to=("running", "done"))
def _upstream_done(life: Lifecycle, rec: RunRecord, now: float, cell: OutputCell) -> list:
    """A run this one read from before it was done is done (its cell already detached): this one may be too."""
    return life._finish_if_complete(rec, now)


@on(("running", "upstream_failed"), to=("failed",))
def _upstream_failed(life: Lifecycle, rec: RunRecord, now: float, cell: OutputCell) -> list:
    """A run this one read from failed after this one started on its (dispatched) output."""
    return life._leave(rec, "failed", now, input_error(rec, cell))


@on(("failed", "upstream_done"), ("cancelled", "upstream_done"), ("failed", "upstream_failed"),
     ("cancelled", "upstream_failed"))
def _upstream_late(life: Lifecycle, rec: RunRecord, now: float, cell: OutputCell) -> list:
    return []  # recommended before this run ended by another way in the same cascade


@on(("running", "step_failed"), to=("failed",))
def _step_failed(life: Lifecycle, rec: RunRecord, now: float, step: Step | None, exc: BaseException) -> list:
    """A step raised while being dispatched (or the dispatcher itself did): the run fails, others go on."""
    return life._leave(rec, "failed", now, node_error(rec, step, exc))


@on(("failed", "step_failed"), ("cancelled", "step_failed"))
def _step_failed_late(life: Lifecycle, rec: RunRecord, now: float, step: Step | None, exc: BaseException) -> list:
    return []  # the run ended first; its first error stands


@on(("queued", "cancel"), ("running", "cancel"), to=("cancelled",))
def _cancel(life: Lifecycle, rec: RunRecord, now: float) -> list:
    return life._leave(rec, "cancelled", now, CancelledError(f"run {rec.id} ({rec.name!r}) was cancelled."))


@on(("queued", "internal_error"), ("running", "internal_error"), to=("failed",))
def _internal_error(life: Lifecycle, rec: RunRecord, now: float, error: BaseException) -> list:
    """A thread of the controller's own hit an error (a bug): its runs fail with it rather than wait for good."""
    return life._leave(rec, "failed", now, error)


@on(("queued", "shutdown"), ("running", "shutdown"), to=("failed",))
def _shutdown(life: Lifecycle, rec: RunRecord, now: float) -> list:
    err = ControllerShutdownError(f"run {rec.id} ({rec.name!r}) was still {rec.state} when the controller shut down.")
    return life._leave(rec, "failed", now, err)


__all__ = ["TARGETS", "TRANSITIONS", "Lifecycle", "transition_edges"]

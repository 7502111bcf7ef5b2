"""Islands on other hosts, run by Ray actors; the notebook's controller stays the single controller.

Each remote island is one Ray actor that owns the JAX devices of its process
(one per Ray node, or one per placement-group bundle). The controller traces,
schedules (one ordered queue per island: the actor's mailbox) and dispatches
asynchronously exactly as for local islands. What differs is only where a
step executes:

- A node on a remote slice is shipped once per actor as a serialized
  `jax.export` artifact of its compiled function and run there on the actor's
  own mesh of the same shape (`Step.call` is a `RemoteCall`). A node that calls
  the host (`jax.debug.print`, callbacks), which export cannot carry, travels to
  a Ray actor (or the Pathways service) as pickled Python instead (`shipped.py`);
  what it prints or logs there comes back with its burst's reply (`node_output.py`).
- Values computed there stay there, as device buffers behind integer handles;
  the controller holds `RemoteArray` handles. Only transfers between islands
  move bytes (through Ray's object store; actor to actor for remote-remote),
  and `Future.result()` brings a value to the notebook only when asked.
  Handles are freed when the last `RemoteArray` referring to them is dropped.
- The actor times each node with its own clock; the controller corrects the
  offset measured when the island was added, so remote events land in the
  same event log and timeline.
- An actor that dies fails the runs that used it, with an error naming the
  island; other islands go on, and the island can be added again.

Tracing needs a mesh for every slice: a remote island's slices are laid out
on local stand-in devices of the same count (the controller's simulated CPU
devices), which never run its work.

What an island needs of its transport (send a request, wait for its reply,
read it, ship a value, the errors that mean the other side died, how to say
where it is, and what it can do) is declared by `link.Link`: `RayLink`
(`ray.py`, where Ray is imported, and only when `add_ray_islands` is called; it
also starts the actors) and the Pathways service's `ServiceLink`
(`pw_kernel.service.link`, ZeroMQ) implement it.
"""

from __future__ import annotations

import functools
import itertools
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax

from ..devices import Island
from ..errors import IslandLostError, at_rest
from ..trace.graph import as_dtype
from .actor import from_wire, spec_tuple
from .link import ErrorEnvelope, Link
from .ticket import Ticket

#: Handles to free wait this long for a call to carry them before they are sent on their own.
FREE_AFTER_S = 0.05


class RemoteIsland:
    """The controller's side of one remote island: its actor, clock offset, handles and mailbox.

    Every call to the actor that must keep dispatch order goes through the
    island's mailbox: a thread of its own sends them in order, so a transfer
    that waits for a local value (``np.asarray``) or serialises bytes never
    holds up the dispatcher. Steps dispatched in one burst are buffered and
    handed to the mailbox together (`Bursts.flush`), and consecutive nodes
    among them travel in one ``run_many`` call.
    """

    def __init__(self, link: Link, info: dict, offset_ns: int, shares: RemoteIsland | None = None):
        self.link = link  # the transport: requests, replies, what it can do (`link.Link`)
        # Islands of one Pathways service share one link, and so one sender and one handle count: what
        # one island's node makes, another's reads, in the order sent (``shares``: the first such island).
        self.primary: RemoteIsland = shares or self
        self.info = info
        self.offset_ns = offset_ns  # local perf_counter_ns = remote + offset
        self.alive = True
        self.error: BaseException | None = None
        self.loaded: set[str] = set()
        self._handles = itertools.count(1) if shares is None else shares._handles
        self._lock = threading.Lock()
        self.island: Island | None = None
        self.bursts: Bursts | None = None  # the controller's, set when it registers the island
        # Ops of the current dispatch burst (only the dispatching thread touches it), then the
        # mailbox: a SimpleQueue, whose put is safe from __del__ on any thread (frees).
        self._burst: list = []
        self._mailbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sender: threading.Thread | None = None
        # One thread sends at a time (`_sending`, under `_lock`), in order: a burst of nodes goes from the
        # dispatching thread itself when nothing waits in the mailbox (`_posted` == `_sent`) and the link
        # says sending is cheap (no thread hand-off on a small call's way), else through the mailbox.
        self._idle = threading.Condition(self._lock)
        self._idle_waiters = 0  # (threads in `_idle.wait`: a send with none skips the notify, three Python calls)
        self._sending = False
        self._posted = 0
        self._sent = 0
        self._direct = link.direct
        # Handles whose last RemoteArray died: freed with the next call that runs nodes, or on their own
        # after FREE_AFTER_S (one message fewer per call; a list: append and slice-delete are atomic).
        self._frees: list[int] = []
        self._asleep = False  # the mailbox thread waits with no timeout: a free must wake it
        # `rebind` bumps the generation; each one's process id, and how to get an older one's arrays back.
        self.generation, self.pids, self.again = 0, [info.get("pid")], ""
        # Local jax.Arrays sent here by a transfer node, by id: a jax.Array never changes, so while it lives
        # the next run reads its copy here instead of sending it again (a dataset placed with
        # `jax.device_put` on a slice of this island crosses once). {id: (weakref to it, {(layout, spec): RemoteArray})}
        self.placed: dict[int, tuple] = {}

    @property
    def actor(self):
        """The Ray actor of a Ray island (its link's), e.g. to ``ray.kill`` it in a test."""
        return self.link.actor

    def new_handle(self) -> int:
        return next(self._handles)

    def fetch_many(self, arrays: list[RemoteArray]) -> None:
        """Bring several of its arrays' values here in one request (`pw.get` of a tree), not one each; those here
        already or sent with their run's reply are not asked for; one gone or failed is left to its own read."""
        self.check("fetch")
        if self.bursts:
            self.bursts.flush()
        want, values = [], []
        for a in arrays:
            if a.here or a.generation != self.generation:
                continue
            small = self.link.take_inline(a.handle)
            if small is None:
                small = a.inline()
            if small is None:
                want.append(a)
            else:
                values.append((a, small))
        if want:
            handles = [a.handle for a in want]
            ticket = Ticket(self)
            self.send([("call", lambda: self.link.request("get_many", handles), ticket)], cheap=True)
            try:
                values += zip(want, self.link.get(ticket.wait_ref()))
            except self.link.lost_errors() as e:
                raise self.lost(e) from None
        for a, v in values:
            if v is not None:
                a.arrived(v)

    def existing(self, handle: int, shape, dtype, sharding, slice_) -> RemoteArray:
        """A handle to a buffer the island already holds (made by an earlier session: a kept array), ready now."""
        ticket = Ticket(self)
        ticket.answered(([(0, 0)], None))
        return RemoteArray(self, handle, shape, dtype, sharding, ticket, 0, slice_)

    def rebind(self, link: Link, info: dict, offset_ns: int, again: str = "") -> None:
        """Go on through ``link`` to a new process with the same devices (a restarted service): the same island,
        so its slices and compiled functions stay usable (each executable is sent again on first use);
        arrays made before raise `stale`, whose message ends with ``again``."""
        with self._lock:  # (what was queued for the lost process goes first, failing at once, to the old link)
            self._idle_waiters += 1
            try:
                self._idle.wait_for(lambda: not self._sending and self._posted == self._sent, timeout=10)
            finally:
                self._idle_waiters -= 1
            self.link, self.info, self.offset_ns, self._direct, self.again = link, info, offset_ns, link.direct, again
            self.loaded.clear()
            self.placed.clear()
            del self._frees[:]  # (the old process's handles: nothing to free in the new one)
            self.pids.append(info.get("pid"))
            self.generation, self.error, self.alive = self.generation + 1, None, True
        link.island = self

    def stale(self, x: RemoteArray, what: str) -> IslandLostError:
        """The error for ``x``, an array of an older generation (it lived in the process before a restart)."""
        return IslandLostError(
            f"{what}: this array ({x.dtype.name}{list(x.shape)}) lived on island {self.island.id} before its process "
            f"restarted (pid {self.pids[x.generation]} -> {self.pids[-1]}, {self._where()}): it went with that "
            f"process. {self.again}"
        )

    def check(self, api: str) -> None:
        if not self.alive:
            raise IslandLostError(
                f"`{api}`: island {self.island.id if self.island else '?'} ({self._where()}) is gone: {self.error}. "
                f"Runs on it failed; {self.link.again}."
            )

    def lost(self, err: BaseException) -> IslandLostError:
        self.alive = False
        self.error = at_rest(err)
        return IslandLostError(
            f"island {self.island.id if self.island else '?'} ({self._where()}) was lost: "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}. To go on: {self.link.again}."
        )

    def _where(self) -> str:
        return self.link.where(self.info)

    # ------------------------------------------------------------ mailbox
    def run(self, key: str, args: list, out_ids: list[int]) -> tuple[Ticket, int]:
        """Buffer a node; consecutive nodes of a burst share one call (returns its ticket and our index)."""
        if self.primary is not self:  # (islands of one service: one burst, in dispatch order across them)
            return self.primary.run(key, args, out_ids)
        burst = self._burst
        if burst and burst[-1][0] == "run":
            ticket, index = burst[-1][4], burst[-1][5] + 1
        else:
            ticket, index = Ticket(self), 0
            ticket.run = self.bursts.run  # which run of the controller dispatches it (cancel, priority)
        self._open()
        burst.append(("run", key, args, out_ids, ticket, index))
        return ticket, index

    def call(self, send: Callable[[], Any]) -> Ticket:
        """Buffer an actor call; ``send()`` runs on the mailbox thread, in order, and returns its ref."""
        if self.primary is not self:
            return self.primary.call(send)
        ticket = Ticket(self)
        self._open()
        self._burst.append(("call", send, ticket))
        return ticket

    def _open(self) -> None:
        if not self._burst:
            self.bursts.islands.append(self)

    def flush(self) -> None:
        """Send the burst's ops: here if only nodes and nothing is queued, else through the mailbox."""
        if not self._burst:
            return
        burst, self._burst = self._burst, []
        self.send(burst, cheap=all(op[0] == "run" for op in burst))

    def send(self, ops: list, cheap: bool) -> None:
        """Send ``ops`` in order after everything before: on this thread if ``cheap`` (nothing to wait for or
        serialise at length) and the link allows it and nothing is queued, else through the mailbox thread."""
        if self.primary is not self:
            return self.primary.send(ops, cheap)
        self._start_sender()  # (here, not in `free`: that runs in __del__, where taking a lock could deadlock)
        burst = ops
        if cheap and self._direct:
            with self._lock:
                direct = not self._sending and self._posted == self._sent
                self._sending = self._sending or direct
            if direct:
                try:
                    self._send(burst)
                finally:
                    with self._lock:
                        self._sending = False
                        if self._idle_waiters:
                            self._idle.notify_all()
                return
        self.post(burst)

    def post(self, ops: list) -> None:
        """Queue ``ops`` for the mailbox thread (started on first use), after everything sent or queued before."""
        if self.primary is not self:
            return self.primary.post(ops)
        self._start_sender()
        with self._lock:
            self._posted += 1
            self._mailbox.put(ops)

    def _start_sender(self) -> None:
        if self._sender is None:
            with self._lock:
                if self._sender is None:
                    self._sender = threading.Thread(
                        target=self._send_loop, name=f"pw-mailbox-{self.info['pid']}", daemon=True
                    )
                    self._sender.start()

    @property
    def profiles(self) -> bool:
        """Whether `pw.profile` can trace XLA's ops there too (the Pathways service can)."""
        return self.alive and self.link.profiles

    def start_profile(self) -> None:
        """Start JAX's profiler in the island's process (after what was sent before: in order)."""
        ticket = Ticket(self)
        self.send([("call", lambda: self.link.request("profile_start"), ticket)], cheap=True)
        self.link.get(ticket.wait_ref())

    def stop_profile(self) -> list:
        """Stop it; XLA's executions there: (device, HLO module, run, [(op, start, end)]), on its clock."""
        ticket = Ticket(self)
        self.send([("call", lambda: self.link.request("profile_stop"), ticket)], cheap=True)
        return self.link.get(ticket.wait_ref())

    def cancel_run(self, run_id: int) -> None:
        """The controller cancelled run ``run_id``: the island drops what of its nodes it has queued, if its
        link can say so (the service can; a Ray actor runs its mailbox in order)."""
        if self.alive and self.link.cancels:
            self.send([("call", lambda: self.link.request_oneway("cancel", [run_id]), Ticket(self))], cheap=True)

    def free(self, handle: int) -> None:
        """Free ``handle`` on the island (sent with the next call, or within FREE_AFTER_S; safe from ``__del__``)."""
        if self.primary is not self:
            self.primary.free(handle)
        elif self.alive:
            self._frees.append(handle)
            if self._asleep:  # the mailbox thread sleeps for good: woken, it sends them if no call does soon
                self._asleep = False
                self._mailbox.put(None)

    def _take_frees(self) -> list[int]:
        n = len(self._frees)
        frees = self._frees[:n]
        del self._frees[:n]  # (appended meanwhile: stay for the next call)
        return frees

    def _send_loop(self) -> None:
        box = self._mailbox
        while True:
            self._asleep = True  # (set before looking at `_frees`: a free after the look sees it and wakes us)
            try:
                items = [box.get(timeout=FREE_AFTER_S if self._frees else None)]
            except queue.Empty:
                items = []
            self._asleep = False
            if items == [None]:  # woken by a free: a call within FREE_AFTER_S carries it (no wake per step)
                try:
                    items = [box.get(timeout=FREE_AFTER_S)]
                except queue.Empty:
                    items = []
            while not box.empty():
                items.append(box.get())
            bursts = [b for b in items if b is not None]
            with self._lock:
                while self._sending:
                    self._idle_waiters += 1
                    try:
                        self._idle.wait()
                    finally:
                        self._idle_waiters -= 1
                self._sending = True
            try:
                for burst in bursts:
                    self._send(burst)
                if not items:  # FREE_AFTER_S passed with handles to free and no call to carry them
                    self._send_frees()
            finally:
                with self._lock:
                    self._sending = False
                    self._sent += len(bursts)
                    self._idle.notify_all()
                items = bursts = burst = None  # (the bursts' arguments: not kept alive while this thread waits)

    def _send_frees(self) -> None:
        frees = self._take_frees()
        if frees and self.alive and self.link.usable():  # (Ray shut down: a call would start a new Ray)
            try:
                self.link.request_oneway("free", frees)
            except Exception:  # interpreter shutdown or a dead actor: nothing to free
                pass

    def _send(self, burst: list) -> None:
        k = 0
        while k < len(burst):
            op = burst[k]
            if op[0] == "run":
                ticket, ops = op[4], []
                while k < len(burst) and burst[k][0] == "run" and burst[k][4] is ticket:
                    _, key, args, out_ids, _, _ = burst[k]
                    ops.append((key, [a.handle for a in args], out_ids))
                    k += 1
                frees, run = self._take_frees(), ticket.run
                self._deliver(ticket, lambda: self.link.request("run_many", ops, frees, run))
            else:
                self._deliver(op[2], op[1])
                k += 1

    @staticmethod
    def _deliver(ticket: Ticket, send: Callable[[], Any]) -> None:
        try:
            ticket.ref = send()
        except BaseException as e:  # a value that failed to compute, a dead actor: its readers see it
            ticket.error = at_rest(e)
        finally:
            ticket.made()

    def colocated(
        self, fn: Callable, inputs: Sequence[Any] = (), outputs: Sequence[Any] = (), args: tuple = (), slice_=None
    ) -> list:
        """Run ``fn(arrays, out_shardings, *args)`` in this island's process, beside its buffers.

        Pathways' colocated host code: ``inputs`` (RemoteArrays) are read there and ``fn``
        returns the arrays that ``outputs`` (ShapeDtypeStructs with shardings of ``slice_``,
        one of this island's slices) describe, placed as ``out_shardings`` (those shardings
        on the island's own devices) say; no array bytes pass through this process, only
        ``fn`` (pickled by reference) and ``args``. With outputs, returns their RemoteArrays at once (ordered
        after everything sent to the island before); without, waits for ``fn`` and raises
        what it raised.

        Example::

            def write(arrays, out_shardings, path):
                np.save(path, np.asarray(arrays[0]))
                return []

            remote_array.island.colocated(write, [remote_array], args=("/shared/x.npy",))
        """
        isl = self
        isl.check("colocated")
        if isl.bursts:  # empty off the dispatching thread: what made the inputs was handed over
            isl.bursts.flush()
        in_ids = [a.handle for a in inputs]
        out_ids = [isl.new_handle() for _ in outputs]
        layouts = [(_layout(o.sharding, isl), spec_tuple(o.sharding)) for o in outputs]
        ticket = Ticket(isl)
        avals = [(tuple(o.shape), str(o.dtype)) for o in outputs]  # (the service forwards them to a Ray node's island)
        isl.post([("call", lambda: isl.link.request("colocated", fn, in_ids, out_ids, layouts, tuple(args), avals),
                   ticket)])
        if outputs:
            return [
                RemoteArray(isl, h, o.shape, o.dtype, o.sharding, ticket, k, slice_)
                for k, (h, o) in enumerate(zip(out_ids, outputs))
            ]
        try:
            _, failure = isl.link.get(ticket.wait_ref())
        except isl.link.lost_errors() as e:
            raise isl.lost(e) from None
        if failure is not None:
            where = f"on remote island {isl.island.id if isl.island else '?'}: "
            if isinstance(failure[1], ErrorEnvelope):
                raise failure[1].exception(where)
            raise RuntimeError(where + failure[1])
        return []

    def __repr__(self) -> str:
        state = "" if self.alive else ", lost"
        return f"RemoteIsland({self._where()}, {len(self.info['devices'])} {self.info['platform']} devices{state})"


class Bursts:
    """The remote islands with ops buffered in the current dispatch burst, one set per controller.

    Only the thread that dispatches touches it (one at a time: the dispatcher's
    ``busy`` token); the dispatcher flushes it when it hands steps over, so the
    steps of one burst reach each island's mailbox together.
    """

    __slots__ = ("islands", "run")

    def __init__(self) -> None:
        self.islands: list[RemoteIsland] = []
        self.run: tuple | None = None  # (id, priority) of the run being dispatched: its bursts say so

    def __bool__(self) -> bool:
        return bool(self.islands)

    def flush(self) -> None:
        """Hand every buffered op to its island's mailbox."""
        islands = self.islands
        while islands:  # in the order opened: islands of one service share a sender, which keeps that order
            islands.pop(0).flush()


def _layout(sharding, isl: RemoteIsland) -> tuple:
    """(mesh shape, axis names, device positions) of a stand-in NamedSharding, for the actor.

    The positions are the slice's devices among the island's stand-ins, so two slices the resource
    manager put on different devices of the island run on different devices there too.
    """
    mesh = sharding.mesh
    home = {d: k for k, d in enumerate(isl.island.devices)} if isl.island is not None else {}
    positions = tuple(home.get(d, k) for k, d in enumerate(mesh.devices.flat))
    where = isl.info.get("island", 0)  # (a Pathways service's island other than its own devices: says which)
    return (tuple(mesh.devices.shape), tuple(mesh.axis_names), positions) + ((where,) if where else ())


class RemoteArray:
    """A handle to a buffer living on a remote island; ready when its actor call has run."""

    __slots__ = ("island", "handle", "shape", "dtype", "sharding", "ticket", "index", "slice", "_local", "generation",
                 "__weakref__")

    def __init__(
        self, island: RemoteIsland, handle: int, shape, dtype, sharding, ticket: Ticket, index: int = 0, slice_=None
    ):
        self.island = island
        self.handle = handle
        self.shape = tuple(shape)
        self.dtype = as_dtype(dtype)
        self.sharding = sharding  # on the island's stand-in mesh: shape and spec, not the devices
        self.ticket = ticket  # the actor call that makes it (shared by a burst's nodes) ...
        self.index = index  # ... and which of its nodes
        self.slice = slice_  # the VirtualSlice it was placed on, when made outside a run (a program input then)
        self._local = None
        self.generation = island.generation  # (an older one than its island's: made before a restart)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def is_ready(self) -> bool:
        return self.ticket.ready()

    def wait(self, timeout: float) -> bool:
        """Block until the call that makes it is answered (True), or ``timeout`` s pass (False)."""
        return self.ticket.wait(timeout)

    def block_until_ready(self) -> RemoteArray:
        failure = self.ticket.result()[1]
        if failure is not None and self.index >= failure[0]:
            where = f"island {self.island.island.id if self.island.island else '?'}"
            if self.index == failure[0]:
                error = failure[1]
                if isinstance(error, ErrorEnvelope):  # (the service's: raised as the class it left as)
                    raise error.exception(f"on remote {where}: ")
                raise RuntimeError(f"on remote {where}: {error}")
            raise RuntimeError(f"not run on remote {where}: an earlier node of the same actor call failed")
        return self

    def timing(self) -> tuple[int, int]:
        """(start, end) of the node that made it, on the controller's perf_counter_ns clock."""
        start, end = self.ticket.result()[0][self.index]
        return start + self.island.offset_ns, end + self.island.offset_ns

    def said(self) -> list:
        """What the node that made it printed or logged on the island as it ran: [(stream, text), ...]."""
        return self.ticket.said(self.index)

    def fetch(self):
        """Bring the value to this process (the only place bytes cross to the notebook): a numpy
        array, or a typed PRNG key on this process's default device."""
        isl = self.island
        isl.check("fetch")
        if self.generation != isl.generation:
            raise isl.stale(self, "Fetching it (`.result()`, `np.asarray`)")
        if isl.bursts:  # empty off the dispatching thread: what made this value was handed over
            isl.bursts.flush()
        handle = self.handle
        value = isl.link.take_inline(handle)  # (the service's link keeps a reply's small values: one dict pop)
        if value is None:
            value = self.inline()  # (a Ray island's come in its actor call's reply)
        if value is not None:  # (a small value came with the reply of the run that made it)
            return from_wire(value)
        ticket = Ticket(isl)
        isl.send([("call", lambda: isl.link.request("get", handle), ticket)], cheap=True)
        try:
            return from_wire(isl.link.get(ticket.wait_ref()))
        except isl.link.lost_errors() as e:
            raise isl.lost(e) from None

    def inline(self) -> Any:
        """Its value if it is small and came with its actor call's reply (a Ray island's), else None."""
        reply = self.ticket.result() if self.ticket.ready() else ()
        return reply[3].get(self.handle) if len(reply) > 3 else None

    def local(self) -> jax.Array:
        if self._local is None:
            self._local = _on_this_device(self.fetch())
        return self._local

    @property
    def here(self) -> bool:
        """Whether its value is in this process already (`local` asks nothing)."""
        return self._local is not None

    def arrived(self, value) -> None:
        """Its value, fetched with others' (`RemoteIsland.fetch_many`, as `to_wire` packed it): what `local` returns."""
        self._local = _on_this_device(from_wire(value))

    def __array__(self, dtype=None, copy=None):
        out = self.fetch()
        return out if dtype is None else out.astype(dtype)

    def __del__(self) -> None:
        if self.generation == self.island.generation:  # (else its process, and the buffer, are gone)
            self.island.free(self.handle)

    def __repr__(self) -> str:
        return f"RemoteArray({self.dtype.name}{list(self.shape)}, handle={self.handle}, {self.island!r})"


@functools.cache
def _identity():
    return jax.jit(lambda x: x)


def _on_this_device(value) -> jax.Array:
    """A fetched value as a `jax.Array` on the default device (a jitted identity: ~4x quicker than
    `jnp.asarray`, whose primitive is bound in Python on each call; a small call's result pays it)."""
    return value if isinstance(value, jax.Array) else _identity()(value)


def _avals(values) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for v in values]


def runs_python(island: RemoteIsland) -> bool:
    """Whether ``island`` runs a node shipped as pickled Python (a Ray actor and the Pathways service do:
    its link says so)."""
    return island.link.runs_python


class RemoteCall:
    """`Step.call` for a node on a remote island: export once, then run by handle on the actor. A node that calls
    the host (its jit has ``callback_errors``) is pickled instead, here: `SliceError` naming ``what`` if it cannot be."""

    lands_remote = True  # its outputs are RemoteArrays, timed by the actor

    def __init__(self, fn, island: RemoteIsland, in_values, out_values, key: str, what: str = "", where: str = "",
                 donate: tuple[int, ...] = ()):
        self.fn = fn
        self.donate = donate  # inputs whose buffers the island's executable reuses for its outputs, as jit's do
        self.island = island
        self.in_values = list(in_values)
        self.out_values = list(out_values)
        self.key = f"{key}@{island.info['island']}" if island.info.get("island") else key  # (one client, many islands)
        self.shipped: bytes | None = None
        if getattr(fn, "callback_errors", None) is not None:
            from .shipped import ship

            devices = island.island.devices if island.island is not None else ()
            self.shipped = ship(fn, devices, island, what or f"`{getattr(fn, '__name__', fn)}`", where)

    def _ensure_loaded(self) -> None:
        isl = self.island
        if self.key in isl.loaded:
            return
        if self.shipped is not None:
            blob, load = self.shipped, "load_shipped"
        else:
            # for the island's platform: a client traces on CPU stand-ins, the island may run on a GPU
            platform = isl.info.get("export")
            exported = jax.export.export(self.fn, platforms=(platform,) if platform else None)(*_avals(self.in_values))
            blob, load = exported.serialize(), "load"
        ref_sh = (self.out_values or self.in_values)[0].sharding
        args = (
            self.key,
            blob,
            _layout(ref_sh, isl),
            [spec_tuple(v.sharding) for v in self.in_values],
            [spec_tuple(v.sharding) for v in self.out_values],
            list(self.donate),
        )
        isl.call(lambda: isl.link.request(load, *args))
        isl.loaded.add(self.key)  # the mailbox sends the load before the run below

    def __call__(self, *args):
        isl = self.island
        isl.check("dispatch")
        for a in args:
            if a.generation != isl.generation:
                raise isl.stale(a, "A call with it (a `pw.compiled` function or a program)")
        self._ensure_loaded()
        out_ids = [isl.new_handle() for _ in self.out_values]
        # The args (RemoteArrays) ride along until sent, so their buffers outlive the call.
        ticket, index = isl.run(self.key, list(args), out_ids)
        return [
            RemoteArray(isl, h, v.shape, v.dtype, v.sharding, ticket, index) for h, v in zip(out_ids, self.out_values)
        ]


"""The run-ahead bound: per device, dispatch stays at most ``Config.run_ahead_s`` of estimated work ahead.

XLA runs whatever it was given: a node dispatched cannot be taken back. With
unbounded asynchronous dispatch a long run of slow nodes is entirely on the
devices within microseconds, and `cancel`, Ctrl-C or a higher-priority run can
only act after all of it has run. So the dispatcher asks this gate before each
step: a step may go to its devices while each of them has less than the bound
of estimated work queued (so at most the bound plus one node).

A step's estimate is the measured device time of the nodes that share its
executable (the same jit and shapes), learnt as the completing thread finishes
them: the first node's time, then the mean of each block of `_BLOCK` nodes
(from the second block on, averaged with the estimate before). Not a per-node
running mean: completion, finding several nodes done at once, gives the first
their time and the rest ~0, and the dispatcher looks right after such a batch,
so a per-node mean was read near its trough (0.87 of the nodes' mean time over
11 traced kills of `benchmarks/service.py`'s row (c); block means: 1.06 over
6) and let more work ahead than the bound.

A device running one node longer than the bound would otherwise sit idle between
nodes: the next could go only once that one was seen to finish, so the host's
work to send it (flattening the step's leaves, XLA's own argument handling),
which JAX's asynchronous dispatch hides behind the device, showed in every
step (a 12-layer transformer's 43 ms step: 1.22x `jax.jit`, against 1.03x with a
bound above the step). So the node a device is running counts for what is left
of it: its estimate less the time since it began (when it was sent to an idle
device, or when the one before it was seen to finish, which is late, so what is
left is overstated, never understated). The next node goes once less than the
bound is left of it, and waits on the devices behind it: what a cancel then
waits for is still at most the bound plus one node. Only a lone node counts
so: behind two or more, room comes from completions as before (tiny nodes
keep their bursts), and a bound of 0 still sends each node once the one before
has finished.

A node not yet measured counts as small, but only one such node of an
executable is in flight at once (and no other run's step passes the one that
waits for it, on its devices): a program of 20 slow nodes of one function is
bounded from its first run, after one node's round trip. The accounting is two
counters per device (added by the one dispatching thread, retired by the one
completing thread) and a queue of the estimates in flight, so neither side
takes the controller's lock for it. Remote (Ray) islands are not gated: their
nodes keep the behaviour they had (``max_inflight`` only).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from ..errors import ArgumentError

_UNMEASURED_NS = 50_000  # what a node not yet measured counts for: small, so a first run is not throttled
_MIN_NS = 1_000  # a measured node counts for at least this (tiny nodes measure ~0 when seen late)
_BLOCK = 8  # nodes whose mean moves an estimate at once (a batch found done together falls in one or two)
_FORGET = 100_000  # executables (or shapes) remembered before the maps start afresh (estimates are relearnt)
NEVER = 1 << 62  # (ns) room that time alone does not bring: a node must finish first


class _Lane:
    """One device: estimated nanoseconds dispatched (``added``) and finished (``retired``), and those in flight."""

    __slots__ = ("added", "retired", "queued", "held", "since")

    def __init__(self):
        self.added = 0  # written only by the dispatching thread (one at a time: the dispatcher's `busy`)
        self.retired = 0  # written only by the completing thread (one at a time: completion's token)
        self.queued: collections.deque[int] = collections.deque()  # the estimates in flight, in dispatch order
        # A step here waits for the measurement of its executable's first node: until a node here
        # finishes, no other run's step may pass it (FIFO stays FIFO on these devices).
        self.held = False
        # When the first node queued here began, at the latest (perf_counter_ns): sent to an idle device,
        # or the one before it seen to finish. Written by whichever side leaves one node queued (both
        # write a time after the node began, so what is left of it is never understated).
        self.since = 0

    def room_at(self, bound: int, now: int) -> int:
        """0 if a node may join this lane now; else when time alone makes room (ns), or `NEVER`."""
        queued = self.queued
        if not queued:
            return 0
        if self.held:
            return NEVER
        ahead = self.added - self.retired
        if ahead < bound:
            return 0
        if len(queued) > 1 or bound <= 0:
            return NEVER
        # One node, running: what is left of it counts. Room once less than the bound is left.
        at = self.since + ahead - bound + 1
        return 0 if now >= at else at


class _Devices:
    """One set of devices (a slice, a transfer's two): its lanes, and the lifecycle's last answer about them."""

    __slots__ = ("lanes", "lane", "more", "open_at", "full_at")

    def __init__(self, lanes: tuple[_Lane, ...]):
        self.lanes = lanes
        self.lane = lanes[0] if lanes else _Lane()  # a step on no device (none planned so) counts on a lane of its own
        self.more = lanes[1:]
        # The lifecycle asks about every queued run on each pick. Found open, the lanes stay open until
        # something is sent (``open_at``: the count of sends then); found full, they stay full until
        # something finishes or is sent (``full_at``: both counts then).
        self.open_at = -1
        self.full_at: tuple[int, int, int] = (-1, -1, 0)  # (sends, ends, until when by time alone)

    def room_at(self, bound: int) -> int:
        """0 if a node may join these devices now: none has ``bound`` ns of work queued (a lone running node
        counting for what is left of it) or is held for a measurement; else when time alone makes room
        (perf_counter_ns), or `NEVER`."""
        lane = self.lane  # the first (often only) device, without a loop: this runs for every node
        at = 0
        now = 0
        if lane.queued and (lane.held or lane.added - lane.retired >= bound):
            now = time.perf_counter_ns()
            at = lane.room_at(bound, now)
            if at == NEVER:
                return at
        for other in self.more:
            if other.queued and (other.held or other.added - other.retired >= bound):
                now = now or time.perf_counter_ns()
                at = max(at, other.room_at(bound, now))
                if at == NEVER:
                    return at
        return at


class _Estimate:
    """The measured device time of one executable at one signature (-1: not measured yet)."""

    __slots__ = ("blocks", "n", "ns", "probing", "sum")

    def __init__(self):
        self.ns = -1
        self.probing = False  # a first, unmeasured node is in flight: the next waits for its measurement
        self.sum = 0  # the measurements of the block under way, and their count
        self.n = 0
        self.blocks = 0  # blocks measured (the first replaces the first node's time, which often runs slow)


class _Track:
    """What the gate needs of one step, found once: its estimate and its devices."""

    __slots__ = ("est", "devs")

    def __init__(self, est: _Estimate, devs: _Devices):
        self.est = est
        self.devs = devs


class RunAhead:
    """The gate: how much estimated work each device has queued, and whether a step may join it.

    Example (the controller makes one from its Config; the dispatcher and completion use it)::

        gate = RunAhead(0.02, wake=lambda: None)
        ns = gate.take(step)          # -1: its devices are full, wait for a completion
        ...                           # dispatch the step (it raised: gate.untake(step, ns))
        gate.finished(step, 165_000_000)   # on the completing thread, with its measured device time
    """

    def __init__(self, bound_s: float | None, wake: Callable[[], None]):
        if bound_s is not None and (isinstance(bound_s, bool) or not isinstance(bound_s, (int, float)) or bound_s < 0):
            raise ArgumentError(
                f"`Config.run_ahead_s` is the estimated device time (seconds) dispatch may run ahead of "
                f"completion: a number >= 0, or None for no bound; got {bound_s!r}."
            )
        self.on = bound_s is not None
        self.bound = int(bound_s * 1e9) if bound_s is not None else 0
        self.lanes: dict[int, _Lane] = {}  # device id -> its lane
        self._devices: dict[tuple[int, ...], _Devices] = {}  # device ids -> their set
        self._by_key: dict[tuple[int, str], _Estimate] = {}  # (id of the jit, shapes) -> its estimate
        self._tracks: dict[Any, _Track] = {}  # a step's Executable -> its estimate and devices, found once
        self._wake = wake  # wakes the dispatcher (takes the controller's lock)
        #: The dispatcher waits for one of the gate's devices: the next node finished wakes it.
        self.wanted = False
        # Changes of the lanes, counted by each side (one writer each, so no count is lost).
        self._sends = 0  # the dispatching side: nodes sent, lanes held or reset
        self._ends = 0  # the completing side: nodes finished
        #: When a running node will have left room by time alone (perf_counter_ns; 0: none pending): the
        #: dispatcher, waiting for room, wakes then (a node finishing wakes it before, `wanted`).
        self.wake_at = 0

    def room(self, step) -> int:
        """The estimate (ns) ``step`` would add, or -1 if one of its devices has the bound queued already."""
        track = self._tracks.get(step.exe) or self._track(step)
        est = track.est
        ns = est.ns
        devs = track.devs
        if ns < 0:
            if est.probing:  # its first node is still being measured
                for lane in devs.lanes:
                    lane.held = True
                self._sends += 1
                return -1
            ns = _UNMEASURED_NS
        return -1 if devs.room_at(self.bound) else ns

    def take(self, step) -> int:
        """`room`, and if there is, ``step``'s estimate counted on its devices (the dispatching thread, just
        before calling it); -1 if there is none. One call per node: the dispatcher's hot loop."""
        track = self._tracks.get(step.exe) or self._track(step)
        est = track.est
        ns = est.ns
        if ns < 0:
            if est.probing:
                return self.room(step)  # held: -1
            est.probing = True  # this one is its first: the next waits for its measurement
            ns = _UNMEASURED_NS
        devs = track.devs
        if devs.room_at(self.bound):
            return self._untaken(est)
        lane = devs.lane
        # A node alone on its device once appended begins now. (Looked at after appending: the completing
        # thread, popping the node before it meanwhile, then finds this one alone too and stamps it itself.)
        now = 0
        lane.queued.append(ns)
        lane.added += ns
        if len(lane.queued) == 1:
            lane.since = now = time.perf_counter_ns()
        for other in devs.more:
            other.queued.append(ns)
            other.added += ns
            if len(other.queued) == 1:
                other.since = now = now or time.perf_counter_ns()
        self._sends += 1
        return ns

    def untake(self, step, ns: int) -> None:
        """``step`` raised when called: it is not on its devices after all (the dispatching thread)."""
        track = self._tracks.get(step.exe) or self._track(step)
        if track.est.ns < 0:
            track.est.probing = False
        for lane in track.devs.lanes:
            if lane.queued:
                lane.queued.pop()
                lane.added -= ns
        self._sends += 1

    @staticmethod
    def _untaken(est: _Estimate) -> int:
        if est.ns < 0:
            est.probing = False  # it did not go after all
        return -1

    def finished(self, step, device_ns: int) -> None:
        """The completing thread saw ``step``'s node finish after ``device_ns`` on its devices.

        The one writer of what execution learns of a step's time: its executable's running mean
        (``Executable.cost``, which fair share charges) and, on a gated island, its estimate here.
        """
        exe = step.exe
        # the first execution of a new executable often runs slow (caches, pages): the second replaces it
        exe.cost = exe.cost + ((device_ns - exe.cost) >> 2) if exe.measured >= 2 else device_ns
        exe.measured += 1
        if not self.on or step.remote:
            return
        track = self._tracks.get(exe) or self._track(step)
        est = track.est
        old = est.ns
        if device_ns < _MIN_NS:
            device_ns = _MIN_NS
        if old < 0:
            est.ns = device_ns
        else:
            est.sum += device_ns
            est.n += 1
            if est.n == _BLOCK:
                mean = est.sum // _BLOCK
                est.ns = (old + mean) >> 1 if est.blocks else mean
                est.blocks += 1
                est.sum = est.n = 0
        est.probing = False
        devs = track.devs
        lane = devs.lane
        lane.held = False
        queued = lane.queued
        now = 0
        if queued:
            lane.retired += queued.popleft()
            if queued:  # the next node began when this one finished, at the latest now
                lane.since = now = time.perf_counter_ns()
        for other in devs.more:
            other.held = False
            if other.queued:
                other.retired += other.queued.popleft()
                if other.queued:
                    other.since = now = now or time.perf_counter_ns()
        self._ends += 1
        if self.wanted:
            # Wake the dispatcher once half the bound has drained, not per node: it then sends a burst
            # instead of trading the GIL with this thread node by node (a lane that empties always wakes it).
            # (A lane left with one node counts as drained: time makes room there, from when it began.)
            low = self.bound >> 1
            for lane in devs.lanes:
                if lane.queued and lane.added - lane.retired > low and (len(lane.queued) > 1 or low <= 0):
                    return
            self.wanted = False
            self._wake()

    def full(self, step, inflight: list[int]) -> bool:
        """Whether ``step`` must wait for room (the lifecycle asks, under the controller's lock).

        ``inflight``: nodes dispatched and not reported, per island. With none on the step's islands,
        what its lanes still count is a leftover (a batch a bug of ours failed as a whole): it is
        forgotten rather than waited for for ever.
        """
        if not self.on or step.remote:
            return False
        track = self._tracks.get(step.exe) or self._track(step)
        devs = track.devs
        if not devs.lane.queued and not devs.more and not track.est.probing:
            return False  # an idle device (a lone call's): nothing to look up
        sends, ends = self._sends, self._ends  # read before looking: a change after it voids what we find
        if not track.est.probing:
            if devs.open_at == sends:
                return False
            at = devs.full_at
            if at[0] == sends and at[1] == ends and (at[2] == NEVER or time.perf_counter_ns() < at[2]):
                return self._full_until(at[2])
        if self.room(step) >= 0:
            devs.open_at = sends
            return False
        src = step.src_island
        if not inflight[step.island] and (src is None or not inflight[src]):
            track.est.probing = False
            for lane in devs.lanes:
                lane.queued.clear()
                lane.retired = lane.added
                lane.held = False
            self._sends += 1
            return False
        self.wanted = True  # before looking again: a node finishing now either sees it or is seen
        if self.room(step) >= 0:
            return False
        until = devs.room_at(self.bound) if not track.est.probing else NEVER
        devs.full_at = (self._sends, ends, until)  # room() may have held the lanes (a send of sorts): count that in
        return self._full_until(until)

    def _full_until(self, until: int) -> bool:
        """Full: a node finishing wakes the dispatcher (``wanted``), and so does time, ``until`` (ns) if not NEVER."""
        self.wanted = True
        if until != NEVER and (not self.wake_at or until < self.wake_at):
            self.wake_at = until
        return True

    def ahead_s(self, device: int) -> float:
        """Seconds of estimated work queued on ``device`` (what the bound limits)."""
        lane = self.lanes.get(device)
        return 0.0 if lane is None else (lane.added - lane.retired) / 1e9

    def _track(self, step) -> _Track:
        if len(self._tracks) > _FORGET:
            self._tracks.clear()
        if len(self._by_key) > _FORGET:
            self._by_key.clear()
        key = (id(step.call), step.shapes)  # not the jit itself: what it closes over must not outlive its program
        est = self._by_key.get(key)
        if est is None:
            est = self._by_key[key] = _Estimate()
        devs = self._devices.get(step.devices)
        if devs is None:
            lanes = []
            for d in step.devices:
                lane = self.lanes.get(d)
                if lane is None:
                    lane = self.lanes[d] = _Lane()
                lanes.append(lane)
            devs = self._devices[step.devices] = _Devices(tuple(lanes))
        track = self._tracks[step.exe] = _Track(est, devs)
        return track

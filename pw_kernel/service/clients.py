"""What the service holds for each client: its tenant, its buffers and executables, its kept trees.

Owned by the service's worker (or its socket thread for a quick request, holding the same lock):
`Client` is one connected client; `Kept`, a tree pinned under a name that outlives its client;
`retire` cancels a dropped client's runs and frees what they held once their last nodes end;
`Heap` keeps long-lived objects out of the garbage collector's full passes.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ..runtime.extend import hold
from .memory import Buffers

log = logging.getLogger("pw_kernel.service")

#: A client not heard from for this long is gone (its runs cancelled, its buffers freed).
DEAD_AFTER_S = 4.0


class Client:
    """One connected client: its tenant, and the buffers and executables only it can name."""

    def __init__(self, ident: bytes, name: str, tenant: str, weight: float, user: str, pid: int,
                 reply_to: bytes | None = None, beats_from: bytes | None = None):
        self.ident = ident  # the identity of the socket it sends requests on ...
        self.reply_to = ident if reply_to is None else reply_to  # ... reads replies on ...
        self.beats_from = self.reply_to if beats_from is None else beats_from  # ... and sends heartbeats from
        self.name = name
        self.tenant = tenant
        self.weight = weight
        self.user = user
        self.pid = pid
        self.gone = False  # dropped: what it still had running is answered to nobody
        self.buffers = Buffers()  # handle -> jax.Array or this controller's Future, bytes counted per device
        self.memory: int | None = None  # bytes it may hold on each device (`pw.connect(memory=...)`)
        self.out_bytes: dict[str, dict[int, int]] = {}  # export key -> its outputs' bytes per device
        self.puts = 0  # arrays sent to it from the client (`Put`: a placement, or a transfer node)
        self.shipped: dict[str, Any] = {}  # key -> the NodeSink of a node that calls the host (`callbacks`)
        self.executables: dict[str, Any] = {}  # export key -> CompiledFunction on a service slice
        self.load_errors: dict[str, str] = {}  # export key -> why it could not be loaded
        self.never_now: set[str] = set()  # export keys whose node never runs at once (`runs._now`)
        self.now_steps: dict[str, tuple] = {}  # ... and of those that did, (controller, step, feed, picks): again
        self.live: set = set()  # runs not finished (cancelled if the client goes)
        self.by_run: dict[int, set] = {}  # the client's run id -> those of its runs here (what its cancel names)
        self.runs = 0
        self.nodes = 0  # nodes that ran (a cancelled run's dropped ones do not count)
        self.count_lock = threading.Lock()  # (outputs' done-callbacks count down on the completing thread)
        self.device_ns = 0
        self.last_seen = time.monotonic()
        self.since = time.time()
        self.dropping = False
        self._waiting: queue.SimpleQueue | None = None
        self._waiter: threading.Thread | None = None

    def waiter(self) -> queue.SimpleQueue:
        """Where finished-run replies wait: a thread of this client's that waits for its runs in order.

        It waits with `Future.result`, which completes a run on the waiting thread as soon as it is
        computed; a done-callback would fire only when the controller's watcher gets to a run nobody
        waits on (up to 5 ms later: the watcher leaves lone calls to their callers).
        """
        if self._waiting is None:
            self._waiting = queue.SimpleQueue()
            self._waiter = threading.Thread(target=self._wait_loop, name=f"pw-service-wait-{self.tenant}", daemon=True)
            self._waiter.start()
        return self._waiting

    def _wait_loop(self) -> None:
        box = self._waiting
        while True:
            item = box.get()
            if item is None:
                return
            outs, then = item
            for f in outs:
                try:
                    # Waited for (and completed here), not fetched: an output on one of the service's Ray islands
                    # stays there (`runs._here`), where `result()` would bring its bytes here, a request to that
                    # island per output.
                    f.remote_array()
                except BaseException:  # (failed or cancelled: `then` reports it)
                    pass
            then()
            del item, outs, then  # (nothing of a finished run stays alive here while the next is waited for)

    def stop_waiting(self) -> None:
        if self._waiting is not None:
            self._waiting.put(None)

    def join_waiting(self, timeout: float) -> None:
        """Wait at most ``timeout`` s for the waiting thread to end (once told to: `stop_waiting`).

        A daemon thread still inside JAX when the process exits is killed there, in C++ frames:
        the process then aborts ("terminate called after throwing an instance of ...").
        """
        if self._waiter is not None:
            self._waiter.join(timeout)


def retire(held: tuple, collect: Callable[[], Any] = gc.collect, said: str = "") -> None:
    """What a dropped client held, ``(runs, buffers, executables)``: cancel the runs, log ``said``
    with the count of runs cancelled, and once the nodes they had on the devices finished, free the rest and
    collect (a cancelled run is final at once; its dispatched nodes still run and hold their buffers until
    they end; its executables are freed by a full collection)."""
    runs = held[0]
    cancelled = 0
    for run in runs:
        cancelled += bool(run.cancel())
        time.sleep(0)  # (the GIL to other clients' requests between two cancels, not after all of them)
    if said:
        log.info("pw_kernel service: " + said.format(cancelled))
    # Freed once its dispatched nodes have ended: freeing hundreds of MiB takes milliseconds of this process's
    # CPU, which the nodes queued on the devices meanwhile (the other clients' next calls wait behind them) need.
    deadline = time.monotonic() + 10 * DEAD_AFTER_S
    while any(r.nodes_on_devices for r in runs) and time.monotonic() < deadline:
        time.sleep(0.02)
    for d in held[1:]:
        d.clear()
    runs.clear()
    del held, runs
    collect()


class Heap:
    """Keeps the garbage collector's full passes short in a process the service owns: what survives one is frozen.

    A full collection walks every object the process holds (~200,000 here: JAX and XLA's state, the
    clients' executables) with the GIL held, 70-300 ms on a loaded host, during which no request is read
    and no node dispatched: a client's call waited behind one for up to 350 ms. What survives a full pass
    lives long, so it is frozen (`gc.freeze`) on the next heartbeat: later passes walk only what is newer.
    Frozen objects are still freed when their last reference goes; only a cycle among them outlives its
    use, until a walk of everything, frozen objects too: when a client is dropped (`collect_soon`), and
    whenever the frozen objects have grown by `REWALK_GROWTH` since the last such walk. So what is frozen
    stays within that factor of what lives, whatever a cycle holds (a run's objects form none on purpose:
    `runs.when_done`; a cycle anywhere else, JAX's included, is freed at the latest by the next walk), at
    the cost of a full walk each time the heap grows by half. Only for a process that is the service alone
    (``python -m pw_kernel serve``), never a notebook's kernel that serves in the background.

    Example::

        heap = Heap()      # at start: freezes what importing JAX and starting the devices made
        heap.tick()        # on each heartbeat
        heap.collect_soon()   # a client is gone: on the next tick, everything walked, then frozen again
    """

    #: A walk of everything once the frozen objects are this many times those the last walk left.
    REWALK_GROWTH = 1.5

    def __init__(self) -> None:
        self._passed = False  # a full pass ended: freeze what survived it
        self._wanted = False  # a full collection of everything was asked for (`collect_soon`)
        self.walks = 0  # walks of everything since the start (for tests)
        self._walk()
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "stop" and info["generation"] == 2:
            self._passed = True  # (frozen on the next tick, outside the collector)

    def collect_soon(self) -> None:
        """Walk everything, frozen objects too, on the next tick (a client is gone: what it alone held goes)."""
        self._wanted = True

    def tick(self) -> None:
        """On the socket thread's heartbeat (every gc call on one thread): freeze, or walk everything (asked for,
        or the frozen objects grew by `REWALK_GROWTH`)."""
        if self._wanted or self._frozen > self.REWALK_GROWTH * self._walked:
            self._wanted = False
            self._walk()
        elif self._passed:
            self._passed = False
            gc.freeze()
            # (Counted here, once a freeze, not on every heartbeat: the count walks the whole frozen list,
            # ~11 ms at 250,000 objects, during which no request is read.)
            self._frozen = gc.get_freeze_count()

    def _walk(self) -> None:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._walked = self._frozen = gc.get_freeze_count()  # what lives (and a floor of the interpreter's own)
        self.walks += 1

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        gc.unfreeze()


class Kept:
    """A tree pinned under a name: its leaves (arrays / futures with where they live, or constants)."""

    def __init__(self, leaves: list, treedef: bytes, by: str):
        self.leaves = leaves  # ("a", value, shape, dtype, layout, spec) or ("c", constant)
        self.treedef = treedef
        self.by = by
        self.at = time.time()
        # Its arrays are not donated while kept: a step that donates the state it was kept from leaves the
        # kept copy whole (XLA writes the outputs elsewhere), as a checkpoint still writing holds its arrays.
        self._held = hold([leaf[1] for leaf in leaves if leaf[0] == "a"])

    def release(self) -> None:
        """No longer kept (unkept, or kept again under its name): its arrays may be donated again."""
        self._held.release()

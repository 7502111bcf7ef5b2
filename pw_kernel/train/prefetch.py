"""`pw.prefetch`: batches read on a thread of their own and placed on the devices ahead of the step that needs them.

A `PrefetchIterator` runs its source (any iterable of numpy pytrees: a grain
``MapDataset`` / ``IterDataset`` / ``DataLoader``, a generator) on a worker
thread, which loads each batch, places it (`targets.BatchTarget`) and keeps at
most ``depth`` placed batches ahead of the consumer. Each batch shows on the
timeline: its loading as a bar on the host's ``input`` lane, its placing as a
host-to-device transfer on the transfer lane of the island it went to.

The consumer's position is what a checkpoint saves (`get_state`): the source's
state right after the last batch the loop *took*, not after what the worker
pulled ahead, so a restored iterator yields exactly the batches that follow.

Inside a traced program (`%%pathways`, `@pw.program`) ``next(batches)`` reads
nothing: it becomes an input node (`pw.Program.input_node`) that takes
the next placed batch when the run gets there.
"""

from __future__ import annotations

import atexit
import itertools
import queue
import threading
import weakref
from typing import Any, NamedTuple

import jax
import numpy as np

from ..runtime import NodeEvent, Program, controller
from .errors import CheckpointError, PrefetchError
from .targets import AUTO, BatchTarget, placed_nbytes
from .tree import decode_iterator_state, encode_iterator_state, is_iterator_with_state

_POLL = 0.05  # s between checks of a stop request while waiting (Ctrl-C and close are seen this fast)
_names = itertools.count()


class _Batch(NamedTuple):
    index: int
    leaves: list  # placed: jax.Arrays (or futures on a remote island)
    treedef: Any
    state: Any  # the source's state right after this batch (None: not checkpointable)


class _End(NamedTuple):
    index: int  # how many batches the source gave


class _Failed(NamedTuple):
    index: int
    error: BaseException
    placing: bool  # False: the source raised; True: the batch could not be placed


class _Worker:
    """The thread that loads and places batches; holds no reference to the iterator (which may then be collected)."""

    def __init__(self, source, target: BatchTarget, depth: int, start: int, name: str, checkpointable: bool):
        self.source = source
        self.target = target
        self.name = name
        self.checkpointable = checkpointable
        self.items: queue.Queue = queue.Queue()
        self.slots = threading.Semaphore(depth)  # placed batches the consumer has not taken yet, at most depth
        self.stopping = threading.Event()
        self.next_index = start
        self.dropped = False  # a batch was read and then dropped because of a stop
        # (treedef, shapes and dtypes) -> what `_describe` says of such a batch: checked once per kind, as the
        # plan is made once (a loop of 16 KB batches spent ~100 µs a batch checking and describing again)
        self.checked: dict[tuple, tuple[int, str, list[int]]] = {}
        self.thread = threading.Thread(target=self._loop, name=f"pw-prefetch-{name}", daemon=True)
        _workers.add(self)
        self.thread.start()

    def _loop(self) -> None:
        try:
            self._load_and_place()
        finally:
            _workers.discard(self)
            if self.stopping.is_set():  # what it placed after the stop's drain goes too
                self._drain()

    def _load_and_place(self) -> None:
        k = self.next_index
        log = controller().events
        while True:
            while not self.slots.acquire(timeout=_POLL):
                if self.stopping.is_set():
                    return
            if self.stopping.is_set():
                return
            t0 = log.now()
            try:
                batch = next(self.source)
            except StopIteration:
                self.items.put(_End(k))
                return
            except BaseException as e:  # the source's own error: the consumer raises it at the batch it needed
                self.items.put(_Failed(k, e, False))
                return
            try:
                state = self.source.get_state() if self.checkpointable else None
                t1 = log.now()
                if self.stopping.is_set():  # closed while loading: place nothing more
                    self.dropped = True
                    return
                leaves, treedef, parts, shardings = self.target.plan(batch)
                kind = (treedef, tuple((np.shape(x), getattr(x, "dtype", type(x))) for x in leaves))
                if kind not in self.checked:  # a batch shaped as one checked already splits as it did
                    self.target.check(leaves, shardings, treedef, k)
                    self.checked[kind] = self._describe(leaves, parts)
                placed = self.target.place(leaves, parts)
                jax.block_until_ready([a for a in placed if isinstance(a, jax.Array)])  # this thread's wait, for its bar
                t2 = log.now()
            except BaseException as e:
                self.items.put(_Failed(k, e, True))
                return
            self._emit(log, k, t0, t1, t2, parts, self.checked[kind])
            self.items.put(_Batch(k, placed, treedef, state))
            k += 1

    @staticmethod
    def _describe(leaves: list, parts) -> tuple[int, str, list[int]]:
        """(bytes, shapes, bytes per part) of a batch: the same for every batch of its shapes and dtypes."""
        shapes = ", ".join(f"{getattr(x, 'dtype', type(x).__name__)}{list(getattr(x, 'shape', ()))}" for x in leaves[:4])
        return placed_nbytes(leaves), shapes, [placed_nbytes([leaves[i] for i in p.leaves]) for p in parts]

    def _emit(self, log, k: int, t0: int, t1: int, t2: int, parts, described: tuple[int, str, list[int]]) -> None:
        """Loading on the host's input lane; placing as a transfer on each island's lane from the host."""
        nbytes, shapes, part_bytes = described
        load = NodeEvent(-1, -1, self.name, "input", f"load batch {k}", "input", (), None, None, t0, nbytes, shapes)
        load.start, load.end = t0, t1
        log.emit_node(load)
        for part, b in zip(parts, part_bytes):
            if part.remote:  # its identity node's run draws the transfer to the island
                continue
            ev = NodeEvent(-1, -1, self.name, "input", f"place batch {k}", "transfer", (), part.island,
                           None, t1, b, f"{b / 2**20:.2f} MiB -> {part.where}")
            ev.start, ev.end = t1, t2
            log.emit_node(ev)

    def stop(self, wait: float = 0.0) -> None:
        """Stop loading; drop the placed batches not taken (their device buffers go with them)."""
        self.stopping.set()
        if wait and self.thread is not threading.current_thread():
            self.thread.join(wait)
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                self.items.get_nowait()
            except queue.Empty:
                break


#: Workers whose thread runs: stopped and joined at exit, since a daemon thread still inside
#: the source's or JAX's C++ code when the interpreter ends aborts the process.
_workers: set[_Worker] = set()


@atexit.register
def _stop_at_exit() -> None:
    for w in list(_workers):
        w.stop(wait=2.0)


def _own_reader(iterable: Any) -> Any:
    """A grain ``MapDataset`` read on this iterator's worker alone (``num_threads=0``), else ``iterable``.

    Iterated as it is, a MapDataset starts grain's defaults: 16 reader threads and 500 batches
    ahead, which fight the controller's threads for the interpreter (a pipelined step took
    0.6-1.7 s instead of ~0.2 s in tutorial 06). The worker already reads ``depth`` batches
    ahead. An ``IterDataset`` (``ds.to_iter_dataset(grain.ReadOptions(...))``) is used as given:
    that is how to ask for grain's threads.
    """
    if type(iterable).__module__.startswith("grain") and hasattr(iterable, "to_iter_dataset"):
        import grain

        return iterable.to_iter_dataset(grain.ReadOptions(num_threads=0))
    return iterable


class PrefetchIterator:
    """Batches from a source, placed on the devices ``depth`` steps ahead on a thread of their own.

    Iterate it as the source (``for x, y in batches``); inside a traced program each
    ``next(batches)`` is an input node that takes the next placed batch at run time.
    Checkpointable when its source is (grain's iterators): ``ckpt.save(step, {"data": it})``
    saves the position of the batch the loop has reached.

    Example::

        ds = grain.MapDataset.source(tokens).shuffle(seed=0).batch(32, drop_remainder=True)
        batches = pw.prefetch(ds, to=pipe, depth=2)
        for x, y in batches:
            state, loss = pipe.step(state, x, y)
    """

    def __init__(self, iterable: Any, to: Any, depth: int = 2, *, axis: str | None = AUTO, name: str | None = None):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise PrefetchError(f"`pw.prefetch(depth=...)` must be an int >= 1 (batches placed ahead); got {depth!r}.")
        try:
            self._source = iter(_own_reader(iterable))
        except TypeError:
            raise PrefetchError(
                f"`pw.prefetch(iterable, ...)` needs an iterable of batches (a grain dataset or DataLoader, a "
                f"generator, a list); got {type(iterable).__name__}."
            ) from None
        self.target = BatchTarget(to, axis)
        self.depth = depth
        self.name = name or f"prefetch{next(_names)}"
        self.checkpointable = is_iterator_with_state(self._source)
        self.taken = 0  # batches the consumer has taken
        self._state = self._source.get_state() if self.checkpointable else None  # the source's, at ``taken``
        self._head: _Batch | _End | _Failed | None = None  # the next item, peeked at (a trace needs its shapes)
        self._finished: str | None = None  # why no more batches come ("ended", "failed", "closed")
        self._dropped = False  # batches pulled from a non-checkpointable source and dropped by a stop
        self._worker: _Worker | None = None
        self._stopped: _Worker | None = None  # the last worker stopped (its thread may still be in the source)
        self._finalizer: weakref.finalize | None = None
        self._start()

    # ------------------------------------------------------------------ the worker
    def _start(self) -> None:
        w = _Worker(self._source, self.target, self.depth, self.taken, self.name, self.checkpointable)
        self._worker = w
        # Left early (a `for` over `pw.prefetch(...)` broken or interrupted), the iterator is collected:
        # stop its thread and drop its placed batches then, without a reference to self.
        self._finalizer = weakref.finalize(self, w.stop)

    def _stop(self, wait: float = 5.0) -> None:
        w, self._worker = self._worker, None
        if self._finalizer is not None:
            self._finalizer.detach()
        if w is not None:
            pulled = w.items.qsize() + (self._head is not None)
            w.stop(wait)
            self._dropped = self._dropped or (pulled > 0 and not self.checkpointable)
            self._stopped = w
        self._head = None

    def close(self) -> None:
        """Stop the worker thread and free the batches it placed ahead (also on leaving ``with``)."""
        self._stop()
        if self._finished is None:
            self._finished = "closed"

    def __enter__(self) -> PrefetchIterator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ taking batches
    def __iter__(self) -> PrefetchIterator:
        return self  # in a traced program too: `zip(range(n), batches)` bounds it (an unbounded loop is refused)

    def __next__(self):
        if Program.tracing():
            return self._traced_next()
        item = self._take()
        return jax.tree_util.tree_unflatten(item.treedef, item.leaves)

    def _peek(self) -> _Batch | _End | _Failed:
        """The next item without taking it (waits for the worker); Ctrl-C stops the worker."""
        if self._head is None:
            if self._worker is None:
                self._resume()
            w = self._worker
            while True:
                try:
                    self._head = w.items.get(timeout=_POLL)
                    break
                except queue.Empty:
                    continue
                except KeyboardInterrupt:
                    self._stop(wait=0.5)  # Ctrl-C: the thread stops and its batches go
                    raise
        return self._head

    def _resume(self) -> None:
        """Start the worker again after a stop, from the consumer's position."""
        if self._finished in ("ended", "failed"):
            raise StopIteration
        last, self._stopped = self._stopped, None
        if last is not None:  # it may still be inside the source: one thread at a time reads it
            last.thread.join()
            self._dropped = self._dropped or (last.dropped and not self.checkpointable)
        if self._dropped:
            raise PrefetchError(
                f"`{self.name}` was stopped (Ctrl-C or close) after reading ahead of batch {self.taken} from a "
                f"source that cannot go back (a generator). Make a new `pw.prefetch`; a grain source resumes where "
                f"the loop was."
            )
        if self.checkpointable:
            self._source.set_state(self._state)
        self._finished = None
        self._start()

    def _take(self) -> _Batch:
        if self._finished in ("ended", "failed") and self._head is None:
            raise StopIteration
        item = self._peek()
        self._head = None
        if isinstance(item, _End):
            self._finished = "ended"
            self._stop(wait=0)
            raise StopIteration
        if isinstance(item, _Failed):
            self._finished = "failed"
            self._stop(wait=0)
            raise self._failure(item) from item.error if not item.placing else None
        self._worker.slots.release()
        self.taken, self._state = item.index + 1, item.state
        return item

    def _failure(self, f: _Failed) -> BaseException:
        if f.placing:
            if isinstance(f.error, PrefetchError):
                return f.error
            return PrefetchError(f"`{self.name}`: batch {f.index} could not be placed: {type(f.error).__name__}: {f.error}")
        return PrefetchError(
            f"`{self.name}`: the source raised {type(f.error).__name__} while reading batch {f.index} (batches "
            f"{'0-' + str(f.index - 1) if f.index else 'none'} were read before it); its traceback is above. No "
            f"more batches come from this iterator: fix the source and make a new `pw.prefetch` (a grain source "
            f"can resume from a checkpoint)."
        )

    # ------------------------------------------------------------------ inside a traced program
    def _traced_next(self):
        """An input node: tracers shaped as the next batch, filled from the queue when the run gets there."""
        item = self._peek()  # its shapes only: it stays for the run to take
        if isinstance(item, _End):
            raise PrefetchError(f"`next({self.name})` in a traced program: the source has no more batches.")
        if isinstance(item, _Failed):
            self._head = None
            self._finished = "failed"
            raise self._failure(item) from item.error if not item.placing else None
        avals = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding) for a in item.leaves)
        parts = self.target.plan(jax.tree_util.tree_unflatten(item.treedef, [a for a in item.leaves]))[2]
        ref = weakref.ref(self)

        def take() -> list:
            it = ref()
            if it is None:
                raise PrefetchError("the `pw.prefetch` iterator this program reads was closed and collected.")
            return it._take_like(avals)

        leaves = Program.input_node(take, avals, slice=parts[0].program_slice(), name=f"input {self.name}")
        return jax.tree_util.tree_unflatten(item.treedef, leaves)

    def _take_like(self, avals: tuple) -> list:
        """The next batch's leaves for an input node traced with ``avals`` (the dispatcher's thread)."""
        try:
            item = self._take()
        except StopIteration:
            raise PrefetchError(
                f"`{self.name}`: the program reads batch {self.taken}, but the source ended after {self.taken} "
                f"batches. Take fewer steps, or repeat the data (grain: `ds.repeat(n)`)."
            ) from None
        got = [(tuple(a.shape), a.dtype) for a in item.leaves]
        want = [(tuple(a.shape), a.dtype) for a in avals]
        if got != want:
            raise PrefetchError(
                f"`{self.name}`: batch {item.index} has leaves {got}, but the program was traced for {want}. Give "
                f"every batch the same shapes (grain: `.batch(n, drop_remainder=True)`)."
            )
        return list(item.leaves)

    # ------------------------------------------------------------------ checkpoints
    def get_state(self) -> dict:
        """Where the consumer is: the source's state after the last batch taken (`pw.CheckpointManager` saves it)."""
        if not self.checkpointable:
            raise CheckpointError(
                f"`{self.name}` cannot be checkpointed: its source, a {type(self._source).__name__}, cannot say "
                f"where it is (no get_state/set_state) — a plain generator cannot. Read the data through grain "
                f"(`grain.MapDataset.source(...)`, `grain.DataLoader`), or save the position yourself."
            )
        return {"pw_prefetch": 1, "batches": self.taken, "source": encode_iterator_state(self._state)}

    def set_state(self, state: dict) -> None:
        """Go to a position `get_state` gave: the batches that follow it come next."""
        if not isinstance(state, dict) or state.get("pw_prefetch") != 1:
            raise CheckpointError(f"`{self.name}.set_state`: not a `pw.prefetch` state: {state!r:.200}.")
        self.get_state()  # raises for a source that cannot be checkpointed
        self._stop()
        last, self._stopped = self._stopped, None
        if last is not None:
            last.thread.join()  # out of the source before it is moved
        self._state = decode_iterator_state(state["source"])
        self._source.set_state(self._state)
        self.taken = int(state["batches"])
        self._finished = None
        self._start()

    def __repr__(self) -> str:
        where = "" if self._finished is None else f", {self._finished}"
        return f"<pw.prefetch {self.name}: {self.taken} batches taken, depth {self.depth}, to {self.target.describe}{where}>"


def prefetch(iterable: Any, to: Any, depth: int = 2, *, axis: str | None = AUTO, name: str | None = None) -> PrefetchIterator:
    """Batches of ``iterable`` placed on ``to``'s devices ``depth`` steps ahead, on a thread of their own.

    ``to``: a slice (each leaf's leading axis split over its ``axis``: "data" when it has
    one, else its first; ``axis=None`` replicates), a `NamedSharding` (or a pytree of them
    matching the batch), or a pipeline (x and fields to the slices of the stages that read
    them, y and weights to the last stage's slice). Yields what a step takes.

    Example::

        for x, y in pw.prefetch(grain.MapDataset.source(data).batch(32), to=pipe):
            state, loss = pipe.step(state, x, y)
    """
    return PrefetchIterator(iterable, to, depth, axis=axis, name=name)


__all__ = ["PrefetchIterator", "prefetch"]

"""`pw.prefetch`: batches read on a thread of their own and placed on the devices ahead of the step that needs them.

A `PrefetchIterator` reads its source (any iterable of numpy pytrees: a grain
``MapDataset`` / ``IterDataset`` / ``DataLoader``, a generator) on reader
threads of its own and places each batch (`targets.BatchTarget`) on a placer
thread, at most ``depth`` batches ahead of the consumer (read, being read or
placed). An iterator has one reader; a grain ``MapDataset`` is read by index by
up to `MAX_READERS` (never more than ``depth``), so reads that wait on storage
overlap each other, the placing and the steps. Each batch shows on the
timeline: its loading as a bar on the host's ``input`` lane, its placing as a
host-to-device transfer on the transfer lane of the island it went to.

The consumer's position is what a checkpoint saves (`get_state`): the source's
state right after the last batch the loop *took*, not after what the readers
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
import time
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

#: Threads that read a grain MapDataset at once for one `pw.prefetch` (at most its ``depth``):
#: two reads waiting on storage overlap each other and the steps; CPU-bound reads share the
#: interpreter with the controller's threads, so more would only fight over it.
MAX_READERS = 2


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


class _Read(NamedTuple):
    """What one read of the source gave, in the order the reads were claimed."""

    batch: Any  # None from a MapDataset: a record its filter dropped (no batch; its slot is freed)
    state: Any  # the source's state right after it (None: not checkpointable)
    t0: int
    t1: int


class _ReadEnd(NamedTuple):
    pass


class _ReadFailed(NamedTuple):
    error: BaseException


class _Sequential:
    """An iterator (a generator, a grain ``IterDataset``'s or ``DataLoader``'s): read by one thread, in order."""

    threads = 1
    skips_none = False  # a None it yields is a batch (of no leaves)

    def __init__(self, iterator: Any):
        self.iterator = iterator
        self.checkpointable = is_iterator_with_state(iterator)
        self.kind = type(iterator).__name__

    def get_state(self) -> Any:
        return self.iterator.get_state()

    def set_state(self, state: Any) -> None:
        self.iterator.set_state(state)

    def start(self) -> int:
        return 0

    def read(self, ticket: int) -> tuple[Any, Any]:
        batch = next(self.iterator)  # StopIteration: the end
        return batch, (self.iterator.get_state() if self.checkpointable else None)


class _ByIndex:
    """A grain ``MapDataset``, read record by record (``ds[i]``) by a few threads at once.

    Iterated as it is, a MapDataset starts grain's defaults: 16 reader threads and 500 records
    ahead, which fight the controller's threads for the interpreter (a pipelined step took
    0.6-1.7 s instead of ~0.2 s in tutorial 06). Read here, at most ``depth`` records are
    read ahead of the loop (the worker's slots), by at most `MAX_READERS` threads: reads that
    wait on storage overlap each other and the steps; reads that work on the CPU do not take
    more of it than the loop consumes. Its position is grain's (``{"next_index": i}``, as
    ``ds.to_iter_dataset()``'s iterator saves it), so a checkpoint restores either way. A
    record the dataset filtered out (None) gives no batch, as in grain's own iterator.
    """

    def __init__(self, ds: Any, depth: int):
        self.ds = ds
        self.length = len(ds)
        self.next_index = 0
        self.threads = max(1, min(depth, MAX_READERS))
        self.skips_none = True  # grain's iterator skips the Nones a filter leaves
        self.checkpointable = True
        self.kind = type(ds).__name__

    def get_state(self) -> dict:
        return {"next_index": self.next_index}

    def set_state(self, state: dict) -> None:
        i = int(state["next_index"])
        if not 0 <= i <= self.length:
            raise IndexError(f"checkpoint `next_index` {i} is out of range for a dataset of length {self.length}.")
        self.next_index = i

    def start(self) -> int:
        return self.next_index

    def read(self, ticket: int) -> tuple[Any, Any]:
        if ticket >= self.length:
            raise StopIteration
        return self.ds[ticket], {"next_index": ticket + 1}


def _reader(iterable: Any, depth: int) -> _Sequential | _ByIndex:
    """How a source is read: a grain ``MapDataset`` by index (`_ByIndex`), anything else as an iterator.

    An ``IterDataset`` (``ds.to_iter_dataset(grain.ReadOptions(...))``) is read as it was made,
    its own reader threads and all: that is how to ask for grain's threads.
    """
    if _is_map_dataset(iterable):
        return _ByIndex(iterable, depth)
    return _Sequential(iter(iterable))


def _is_map_dataset(x: Any) -> bool:
    if not type(x).__module__.startswith("grain"):
        return False
    try:
        import grain
    except ImportError:
        return False
    return isinstance(x, grain.MapDataset)


class _Worker:
    """The threads that read and place batches; they hold no reference to the iterator (which may then be collected).

    Its reader threads (``pw-prefetch-NAME-read``: one for an iterator, up to `MAX_READERS` for a
    MapDataset) read the source; its placer (``pw-prefetch-NAME``) takes their reads in order,
    places each batch and queues it for the consumer. A read starts only when fewer than
    ``depth`` batches are ahead of the consumer (read, being read or placed), so reads overlap
    the steps and each other without running further ahead.
    """

    def __init__(self, reader: _Sequential | _ByIndex, target: BatchTarget, depth: int, start: int, name: str):
        self.reader = reader
        self.target = target
        self.name = name
        self.start = start  # batches the consumer had taken when this worker started
        self.items: queue.Queue = queue.Queue()
        self.slots = threading.Semaphore(depth)  # reads not yet taken by the consumer (read, reading, placed)
        self.stopping = threading.Event()
        self.lock = threading.Condition()
        self.reads: dict[int, _Read | _ReadEnd | _ReadFailed] = {}  # by ticket, until the placer takes them
        self.next_ticket = reader.start()  # the next read to claim (a MapDataset's: its index)
        self.first_ticket = self.next_ticket
        self.no_more = False  # a read ended or failed: claim nothing after it
        self.read_count = 0  # batches read from the source (some may never be taken: a generator loses them)
        self.in_flight = 0
        # (treedef, shapes and dtypes) -> what `_describe` says of such a batch: checked once per kind, as the
        # plan is made once (a loop of 16 KB batches spent ~100 µs a batch checking and describing again)
        self.checked: dict[tuple, tuple[int, str, list[int]]] = {}
        self.thread = threading.Thread(target=self._loop, name=f"pw-prefetch-{name}", daemon=True)
        self.readers = [threading.Thread(target=self._read_loop, name=f"pw-prefetch-{name}-read", daemon=True)
                        for _ in range(reader.threads)]
        self.alive = 1 + len(self.readers)
        _workers.add(self)
        for t in (self.thread, *self.readers):
            t.start()

    @property
    def threads(self) -> list[threading.Thread]:
        return [self.thread, *self.readers]

    def _exited(self) -> None:
        with self.lock:
            self.alive -= 1
            last = self.alive == 0
        if last:
            _workers.discard(self)

    # ------------------------------------------------------------------ reading
    def _read_loop(self) -> None:
        try:
            self._read()
        finally:
            self._exited()

    def _read(self) -> None:
        log = controller().events
        while True:
            while not self.slots.acquire(timeout=_POLL):
                if self.stopping.is_set() or self.no_more:
                    return
            with self.lock:
                if self.stopping.is_set() or self.no_more:
                    return
                ticket = self.next_ticket
                self.next_ticket += 1
                self.in_flight += 1
            t0 = log.now()
            try:
                batch, state = self.reader.read(ticket)
                got: _Read | _ReadEnd | _ReadFailed = _Read(batch, state, t0, log.now())
            except StopIteration:
                got = _ReadEnd()
            except BaseException as e:  # the source's own error: the consumer raises it at the batch it needed
                got = _ReadFailed(e)
            with self.lock:
                self.in_flight -= 1
                if isinstance(got, _Read):
                    self.read_count += not (got.batch is None and self.reader.skips_none)
                else:
                    self.no_more = True
                self.reads[ticket] = got
                self.lock.notify_all()
            if not isinstance(got, _Read):
                return

    def _take_read(self, ticket: int) -> _Read | _ReadEnd | _ReadFailed | None:
        """The read of ``ticket`` once a reader has it; None on a stop."""
        with self.lock:
            while ticket not in self.reads:
                if self.stopping.is_set():
                    return None
                self.lock.wait(_POLL)
            return self.reads.pop(ticket)

    # ------------------------------------------------------------------ placing
    def _loop(self) -> None:
        try:
            self._place_in_order()
        finally:
            if self.stopping.is_set():  # what it placed after the stop's drain goes too
                self._drain()
            self._exited()

    def _place_in_order(self) -> None:
        k = self.start
        ticket = self.first_ticket
        log = controller().events
        while True:
            got = self._take_read(ticket)
            ticket += 1
            if got is None:
                return
            if isinstance(got, _ReadEnd):
                self.items.put(_End(k))
                return
            if isinstance(got, _ReadFailed):
                self.items.put(_Failed(k, got.error, False))
                return
            if got.batch is None and self.reader.skips_none:  # a record the MapDataset filtered out: no batch
                self.slots.release()
                continue
            if self.stopping.is_set():  # closed while loading: place nothing more
                return
            try:
                t1 = log.now()
                leaves, treedef, parts, shardings = self.target.plan(got.batch)
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
            self._emit(log, k, got.t0, got.t1, t1, t2, parts, self.checked[kind])
            self.items.put(_Batch(k, placed, treedef, got.state))
            k += 1

    @staticmethod
    def _describe(leaves: list, parts) -> tuple[int, str, list[int]]:
        """(bytes, shapes, bytes per part) of a batch: the same for every batch of its shapes and dtypes."""
        shapes = ", ".join(f"{getattr(x, 'dtype', type(x).__name__)}{list(getattr(x, 'shape', ()))}" for x in leaves[:4])
        return placed_nbytes(leaves), shapes, [placed_nbytes([leaves[i] for i in p.leaves]) for p in parts]

    def _emit(self, log, k: int, t0: int, t1: int, tp: int, t2: int, parts, described: tuple[int, str, list[int]]) -> None:
        """Loading (``t0``-``t1``, on a reader) on the host's input lane; placing (``tp``-``t2``) as a transfer on
        each island's lane from the host."""
        nbytes, shapes, part_bytes = described
        load = NodeEvent(-1, -1, self.name, "input", f"load batch {k}", "input", (), None, None, t0, nbytes, shapes)
        load.start, load.end = t0, t1
        log.emit_node(load)
        for part, b in zip(parts, part_bytes):
            if part.remote:  # its identity node's run draws the transfer to the island
                continue
            ev = NodeEvent(-1, -1, self.name, "input", f"place batch {k}", "transfer", (), part.island,
                           None, tp, b, f"{b / 2**20:.2f} MiB -> {part.where}")
            ev.start, ev.end = tp, t2
            log.emit_node(ev)

    # ------------------------------------------------------------------ stopping
    def stop(self, wait: float = 0.0) -> None:
        """Stop reading and placing; drop the placed batches not taken (their device buffers go with them)."""
        self.stopping.set()
        if wait:
            self.join(wait)
        self._drain()

    def join(self, wait: float | None = None) -> None:
        """Wait for its threads to end (``wait``: seconds in all; None: however long a read takes)."""
        deadline = None if wait is None else time.monotonic() + wait
        for t in self.threads:
            if t is threading.current_thread():
                continue
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def lost(self, taken: int) -> bool:
        """Whether batches were read from the source beyond the ``taken`` the consumer has (after `join`)."""
        return self.read_count > taken - self.start

    def _drain(self) -> None:
        while True:
            try:
                self.items.get_nowait()
            except queue.Empty:
                break


#: Workers whose threads run: stopped and joined at exit, since a daemon thread still inside
#: the source's or JAX's C++ code when the interpreter ends aborts the process.
_workers: set[_Worker] = set()


@atexit.register
def _stop_at_exit() -> None:
    for w in list(_workers):
        w.stop(wait=2.0)


class PrefetchIterator:
    """Batches from a source, placed on the devices ``depth`` steps ahead on threads of their own.

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
            self._source = _reader(iterable, depth)
        except TypeError:
            raise PrefetchError(
                f"`pw.prefetch(iterable, ...)` needs an iterable of batches (a grain dataset or DataLoader, a "
                f"generator, a list); got {type(iterable).__name__}."
            ) from None
        self.target = BatchTarget(to, axis)
        self.depth = depth
        self.name = name or f"prefetch{next(_names)}"
        self.checkpointable = self._source.checkpointable
        self.taken = 0  # batches the consumer has taken
        self._state = self._source.get_state() if self.checkpointable else None  # the source's, at ``taken``
        self._head: _Batch | _End | _Failed | None = None  # the next item, peeked at (a trace needs its shapes)
        self._finished: str | None = None  # why no more batches come ("ended", "failed", "closed")
        self._dropped = False  # batches read from a non-checkpointable source and dropped by a stop
        self._worker: _Worker | None = None
        self._stopped: _Worker | None = None  # the last worker stopped (a reader may still be in the source)
        self._finalizer: weakref.finalize | None = None
        self._start()

    # ------------------------------------------------------------------ the worker
    def _start(self) -> None:
        w = _Worker(self._source, self.target, self.depth, self.taken, self.name)
        self._worker = w
        # Left early (a `for` over `pw.prefetch(...)` broken or interrupted), the iterator is collected:
        # stop its threads and drop its placed batches then, without a reference to self.
        self._finalizer = weakref.finalize(self, w.stop)

    def _stop(self, wait: float = 5.0) -> None:
        w, self._worker = self._worker, None
        if self._finalizer is not None:
            self._finalizer.detach()
        if w is not None:
            w.stop(wait)
            self._stopped = w  # what it read and the loop did not take is counted when it is joined
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
        if last is not None:  # it may still be inside the source: one worker at a time reads it
            last.join()
            self._dropped = self._dropped or (not self.checkpointable and last.lost(self.taken))
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
                f"`{self.name}` cannot be checkpointed: its source, a {self._source.kind}, cannot say "
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
            last.join()  # out of the source before it is moved
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

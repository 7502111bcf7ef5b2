"""Sharded futures: program outputs whose shape, dtype and sharding are known at submit time."""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import jax
import numpy as np
from jax.sharding import Sharding

from .core.records import OutputCell
from .donation import check_not_donated, donated_to_any
from .errors import ArgumentError, CancelledError, TimeoutError
from .trace.graph import describe_sharding

if TYPE_CHECKING:
    from .core.records import RunRecord
    from .trace.graph import Value


class Producer(Protocol):
    """What a future asks of the run that makes it (a `Run`; this module does not import it)."""

    id: int
    name: str
    state: str
    nodes_done: int
    nodes_total: int
    error_seen: bool

    def cancel(self) -> bool: ...

    def complete_here(self, value: Any, done: Callable[[], bool]) -> None: ...


def check_timeout(timeout: float | None, api: str) -> float | None:
    """Validate a user timeout: None waits forever, 0 polls, negative is a mistake."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout):
        raise ArgumentError(f"`{api}(timeout=...)` must be a number of seconds or None; got {timeout!r}.")
    if timeout < 0:
        raise ArgumentError(
            f"`{api}(timeout={timeout!r})`: a timeout cannot be negative. Use None to wait until done, "
            f"0 to check without waiting, or a positive number of seconds."
        )
    return float(timeout)


# The states of `concurrent.futures.Future`, shared so that its `wait` and asyncio read ours.
_PENDING, _FINISHED = "PENDING", "FINISHED"
_CANCELLED, _NOTIFIED = "CANCELLED", "CANCELLED_AND_NOTIFIED"
_DONE = frozenset({_FINISHED, _CANCELLED, _NOTIFIED})
#: Makes a future's condition once when two threads ask for it at once: one lock for all futures,
#: taken only then, instead of a Condition and an RLock made per future.
_LAZY = threading.Lock()


class Future(concurrent.futures.Future, OutputCell):
    """A program output that will be a `jax.Array`; shape, dtype and sharding are known now.

    Works with `concurrent.futures.wait`, `await` (asyncio, as in ipykernel) and
    as the input of later programs, which are submitted without waiting.

    Example::

        y, z = step(v)            # returns at once
        y.shape, y.sharding       # known before anything ran
        y.result()                # blocks: the jax.Array
        await z                   # or asynchronously
        float(loss), np.asarray(y)  # also block, as they do on a jax.Array
    """

    # A future is made per output of every call (a training step's state: hundreds): it is its run's
    # output cell too (``producer``, ``index``, ``value``: what later runs read), keeps what it was made
    # from by reference (its graph's `Value`: shape, dtype, sharding, slice), and makes no Condition of
    # its own until another thread waits on it or a callback is added (`__getattr__` makes the base
    # class's lazily, and says so in ``_waited``).
    __slots__ = ("run", "_spec", "_state", "_result", "_exception", "_waited")

    def __init__(self, run: Producer, index: int, spec: Value, producer: RunRecord):
        self.run = run
        self.producer = producer  # the run's record: what the lifecycle reads of it
        self.index = index
        self.value = None  # the array once the producing node is dispatched
        self._spec = spec  # shared by every run of its graph: also what a program's signature keys it by
        self._state = _PENDING
        self._result = None
        self._exception = None
        self._waited = False

    @property
    def _cell(self) -> OutputCell:
        """What a later run reads: the future itself (it is its output's cell)."""
        return self

    @property
    def shape(self) -> tuple[int, ...]:
        return self._spec.shape

    @property
    def dtype(self):
        return self._spec.dtype

    @property
    def sharding(self) -> Sharding | None:
        return self._spec.sharding

    @property
    def slice(self):
        """The VirtualSlice the value lives on (None: the host or no slice)."""
        return self._spec.slice

    def __getattr__(self, name: str):
        # The parts of `concurrent.futures.Future` only a waiter on another thread, `wait` or a
        # done-callback needs, made on first use (the condition last: `_settle` looks for it).
        if name in ("_condition", "_waiters", "_done_callbacks"):
            with _LAZY:
                self._waited = True
                d = self.__dict__
                if "_condition" not in d:
                    d["_waiters"] = []
                    d["_done_callbacks"] = []
                    d["_condition"] = threading.Condition()
            return d[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _settle(self, state: str, result: Any = None, exception: BaseException | None = None) -> None:
        """Resolve once: the value, the error or cancelled; wake waiters and run callbacks if any were made."""
        self._result = result
        self._exception = exception
        self._state = state
        # The state is set, then ``_waited`` read; a waiter sets ``_waited``, then looks at the state
        # (`_wait`). With the GIL each sees the other's write first: either this finds it set and
        # notifies, or the waiter finds the state set and does not wait.
        if self._waited:
            self._wake(state)

    def _wake(self, state: str) -> None:
        """Notify the waiters and run the callbacks of a future just settled (someone waits on it)."""
        exception = self._exception
        with self._condition:
            for w in self._waiters:
                if state == _FINISHED:
                    w.add_result(self) if exception is None else w.add_exception(self)
                else:
                    w.add_cancelled(self)
            self._condition.notify_all()
        self._invoke_callbacks()
        # Each runs once: dropped now, so that a callback referring to this future (a closure over a
        # run's outputs) does not hold it, and its device buffer, in a cycle until a full collection.
        self._done_callbacks.clear()

    def set_result(self, result: Any) -> None:
        # (what `_settle` does, without its arguments: a run's outputs settle here by the hundred)
        self._result = result
        self._state = _FINISHED
        if self._waited:  # (read after the state: see `_settle`)
            self._wake(_FINISHED)

    def set_exception(self, exception: BaseException) -> None:
        self._settle(_FINISHED, None, exception)

    def _set_cancelled(self) -> None:
        self._settle(_NOTIFIED)

    def done(self) -> bool:
        return self._state in _DONE

    def cancelled(self) -> bool:
        return self._state == _CANCELLED or self._state == _NOTIFIED

    def running(self) -> bool:
        return False  # pending until resolved: a run's output has no RUNNING state of its own

    def _wait(self, timeout: float | None) -> bool:
        """Block until resolved or ``timeout``; whether it is resolved."""
        if self._state in _DONE:
            return True
        cond = self._condition
        with cond:
            if self._state not in _DONE:
                cond.wait(timeout)
        return self._state in _DONE

    def _outcome(self):
        """The value of a resolved future, or raise its error (cancelled: pw.CancelledError)."""
        if self._state == _FINISHED:
            if self._exception is None:
                return self._result
            self.run.error_seen = True  # the run's error, raised here: the user has it
            err = self._exception
            # The error is kept with its run for as long as the controller keeps the run (`errors.at_rest`):
            # each raise starts a traceback of its own, which must not hold this future (nor its output).
            self = None  # noqa: PLW0642
            raise err.with_traceback(None)
        raise CancelledError(self._cancel_message()) from None

    def resolved_value(self) -> Any:
        """The array if this future has resolved to one on this process and was never donated, else None.

        What a compiled function called on a future reads at once (a local, finished value), as
        it reads an array. Example::

            y = f(x); y.result(); y.resolved_value() is y.result()   # True
        """
        if self._state != _FINISHED or self._exception is not None or donated_to_any():
            return None
        value = self._result
        return None if hasattr(value, "fetch") else value  # a remote island's stays there

    def resolved_remote(self) -> bool:
        """Whether this future has resolved to an array that stays on a remote island (read there by handle)."""
        return self._state == _FINISHED and self._exception is None and hasattr(self._result, "fetch")

    def remote_key(self) -> tuple | None:
        """(shape, dtype, sharding, id of its slice) if `resolved_remote`, else None: how a program's signature
        keys it (one call where a call's arguments are looked up: four properties and a test otherwise).

        Example::

            y = f(x); y.result(); y.remote_key()   # (shape, dtype, sharding, id(slice)) on the service's island
        """
        if self._state != _FINISHED or self._exception is not None or not hasattr(self._result, "fetch"):
            return None
        spec = self._spec
        return spec.shape, spec.dtype, spec.sharding, id(spec.slice)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def aval(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self.shape, self.dtype, sharding=self.sharding)

    @property
    def dispatched(self) -> bool:
        """True once the producing node was dispatched: later programs can consume it now."""
        return self.value is not None

    def is_ready(self) -> bool:
        """Whether its devices have computed it (as `jax.Array.is_ready`): True before `done()` is, which
        waits for the controller to report the node. False while not dispatched.

        Example::

            y = f(x); y.is_ready()   # False while the node runs; y.done() follows soon after True
        """
        if self._state in _DONE:
            return True
        value = self.value
        if value is None:
            return False
        try:
            return value.is_ready()
        except Exception:  # (deleted: a later node took it as a donated input, so this one ran)
            return True

    def result(self, timeout: float | None = None):
        """Block until the value is computed and return it as a `jax.Array`.

        Ctrl-C while waiting cancels the run (nodes not yet dispatched are dropped).
        """
        try:  # (zero-cost) a Ctrl-C anywhere in here cancels the run
            if self._state == _FINISHED and self._exception is None and timeout is None:
                value = self._result  # the hot path: resolved, nothing to check but donation
                check_not_donated(self, "Future.result", self._label)
            else:
                value = self._slow_result(timeout)
        except KeyboardInterrupt:
            self.run.cancel()
            raise
        except BaseException:
            self = None  # noqa: PLW0642 - (see `_outcome`: the raised error outlives this frame)
            raise
        if hasattr(value, "fetch"):  # on a remote island: bring it here now, once
            return value.local()
        return value

    def _slow_result(self, timeout: float | None):
        """`result` of a future not yet resolved (or failed, or with a timeout); a Ctrl-C comes out of here."""
        timeout = check_timeout(timeout, "Future.result")
        check_not_donated(self, "Future.result", self._label)
        if self._state not in _DONE:
            value = self.value
            if timeout is None and value is not None:
                # Dispatched: watch the device here, as a jax.Array does, rather than wait for
                # another thread to notice first; then complete the node on this thread.
                self.run.complete_here(value, self.done)
            if not self._wait(timeout):
                raise TimeoutError(
                    f"`Future.result(timeout={timeout})`: {self._label()} not ready after {timeout} s "
                    f"(run is {self.run.state}, {self.run.nodes_done}/{self.run.nodes_total} nodes done). "
                    f"Wait longer, or cancel with `fut.cancel()`."
                )
        try:
            return self._outcome()
        except BaseException:
            self = None  # noqa: PLW0642 - (see `_outcome`)
            raise

    def remote_array(self, timeout: float | None = None):
        """Wait for the value; its `RemoteArray` handle if it lives on a remote island (no bytes move), else None.

        Example::

            handle = state.params[1]["w"].remote_array()   # stays on the island
        """
        timeout = check_timeout(timeout, "Future.remote_array")
        if timeout is None and not self.done() and self.value is not None:
            self.run.complete_here(self.value, self.done)
        if not self._wait(timeout):
            raise TimeoutError(f"`Future.remote_array(timeout={timeout})`: {self._label()} not ready after {timeout} s.")
        value = self._outcome()
        return value if hasattr(value, "fetch") else None

    def exception(self, timeout: float | None = None):
        timeout = check_timeout(timeout, "Future.exception")
        try:
            if not self._wait(timeout):
                raise TimeoutError(f"`Future.exception(timeout={timeout})`: {self._label()} not done yet.")
        except KeyboardInterrupt:
            self.run.cancel()
            raise
        if self._state != _FINISHED:
            raise CancelledError(self._cancel_message())
        if self._exception is not None:
            self.run.error_seen = True
        return self._exception

    def cancel(self) -> bool:
        """Cancel the run that computes this future; False if it already finished."""
        return self.run.cancel()

    def __await__(self):
        return asyncio.wrap_future(self).__await__()

    # Outside programs numpy reads a future as the array it becomes: it waits, as a jax.Array waits
    # for its data. No `__jax_array__`: JAX 0.10 refuses such objects wherever it reads shapes
    # (jax.eval_shape, jit arguments), which futures must pass as ShapeDtypeStruct-likes.
    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.result(), dtype=dtype)

    # ... and so do `float(loss)` and `int(count)` (a training loop's logging line), as they do a jax.Array.
    def __float__(self) -> float:
        return float(self.result())

    def __int__(self) -> int:
        return int(self.result())

    def _not_an_array(self, *args, what: str = "arithmetic"):
        """A future is a promise of an array, not one: say how to get the array (or stay asynchronous)."""
        raise TypeError(
            f"{what} on a pw.Future ({self._label()}, {self.dtype.name}{list(self.shape)}): a future is not an array "
            f"outside a program. Use `fut.result()` or `pw.get(fut)` for the jax.Array (this waits), or compute in a "
            f"`%%pathways` cell or a `@pw.program`, where futures are inputs and nothing waits."
        )

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _not_an_array
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _not_an_array
    __pow__ = __rpow__ = __matmul__ = __rmatmul__ = __neg__ = __pos__ = __abs__ = _not_an_array

    def __getitem__(self, key):
        self._not_an_array(what="indexing")

    def _label(self) -> str:
        return f"output {self.index} of run {self.run.id} ({self.run.name!r})"

    def _cancel_message(self) -> str:
        return f"{self._label()} was cancelled."

    def _state_name(self) -> str:
        if self.cancelled():
            return "cancelled"
        if self.done():
            return "failed" if self._exception is not None else "done"
        return "dispatched" if self.value is not None else "pending"

    def __repr__(self) -> str:
        shape = ",".join(map(str, self.shape))
        return (
            f"<pw.Future run={self.run.id} {self.run.name!r} out[{self.index}] {self.dtype.name}[{shape}] "
            f"{describe_sharding(self.sharding)} state={self._state_name()}>"
        )


def get(tree: Any, timeout: float | None = None) -> Any:
    """Block on every `pw.Future` in a pytree and return the same tree with `jax.Array` leaves.

    Example::

        y, z = pw.get(step(v))
    """
    timeout = check_timeout(timeout, "pw.get")
    deadline = None if timeout is None else time.monotonic() + timeout
    _fetch_together([x for x in jax.tree_util.tree_leaves(tree) if isinstance(x, Future)], deadline)

    def one(x):
        if not isinstance(x, Future):
            return x
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return x.result(left)
        except TimeoutError:  # say it with the user's timeout, not what was left of it for this leaf
            raise TimeoutError(
                f"`pw.get(timeout={timeout:g})`: {x._label()} not ready after {timeout:g} s (run is "
                f"{x.run.state}, {x.run.nodes_done}/{x.run.nodes_total} nodes done). Wait longer, or cancel "
                f"with `fut.cancel()`."
            ) from None

    return jax.tree_util.tree_map(one, tree)


def _fetch_together(futures: list[Future], deadline: float | None) -> None:
    """Bring the values of ``futures`` that live on remote islands here in one request per island (a tree of
    hundreds of leaves costs a round trip, not hundreds); their `result` then asks nothing. Local ones are
    left to `result`, as are errors: it raises them, in the tree's order."""
    by_island: dict = {}
    for f in futures:
        if f.done() and not f.resolved_remote() or f.value is not None and not hasattr(f.value, "fetch"):
            continue  # (a local value: its `result` reads it, or waits for it, as it would)
        try:
            r = f.remote_array(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:
            f.run.cancel()
            raise
        except Exception:
            break
        if r is not None:
            by_island.setdefault(r.island, []).append(r)
    for island, arrays in by_island.items():
        if len(arrays) > 1:
            island.fetch_many(arrays)


__all__ = ["Future", "check_timeout", "get"]

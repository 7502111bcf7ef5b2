"""Checkpoints written asynchronously from futures, restored onto any slice layout (orbax-checkpoint underneath).

`CheckpointManager.save(step, tree)` returns at once: the tree is snapshotted
(futures and arrays are immutable values; numpy arrays are copied; a data
iterator's position is read now), and a saver thread of its own, never the
controller's, waits for each future and hands the arrays to orbax's
asynchronous `CheckpointManager`, which writes them and finalizes the step
atomically. A `pw.PipelineState` is saved in a layout-free form (each stage's
params and optimizer state, one copy of each shared param), so
`Pipeline.restore` can put it on another set of slices.

On disk it is plain orbax: a step directory with a ``state`` item (a
`StandardSave` pytree) and a ``data`` item (JSON: where the pipeline states
are, each data iterator's state, and which leaves live in island items), which
``ocp.CheckpointManager(dir).restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))``
opens. Leaves that live on a remote (Ray) island are written by that island's
actor into an item of its own (``island_0``, ...; see `island_io`) and are None
in ``state``: their bytes never pass through the controller.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import sys
import threading
import time
from typing import Any

import jax
import numpy as np

from ..runtime import Future, NodeEvent, RemoteArray, controller
from ..runtime.extend import hold, nbytes_of
from .errors import CheckpointError
from .island_io import ITEM_PREFIX, handler_types, islands_items, read_item, read_onto_island, remote_leaf
from .restore import OnIsland, restore_tree
from .state import PipelineState
from .tree import canonical, containers, encode_iterator_state, flat, is_iterator_with_state, is_leaf, path_key

STATE, DATA = "state", "data"  # the orbax items of a step


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        raise CheckpointError(
            "`pw.CheckpointManager` writes with orbax-checkpoint, which is not installed: "
            "`pip install 'pw_kernel[train]'` (or `pip install orbax-checkpoint`)."
        ) from None
    return ocp


@dataclasses.dataclass
class SaveRecord:
    """One save: its step, how many bytes, and where it stands (queued, waiting, writing, done, failed)."""

    step: int
    nbytes: int
    submitted: float
    state: str = "queued"
    error: BaseException | None = None
    writing: float | None = None  # when its futures were all ready and orbax began to write
    finished: float | None = None
    tree: Any = dataclasses.field(default=None, repr=False)
    data: dict = dataclasses.field(default_factory=dict, repr=False)
    held: Any = dataclasses.field(default=None, repr=False)  # keeps the tree's values from being donated

    @property
    def seconds(self) -> float | None:
        """Seconds spent writing (from the moment its futures were ready to the commit)."""
        if self.finished is None:
            return None
        return self.finished - (self.writing if self.writing is not None else self.submitted)


class CheckpointManager:
    """Asynchronous checkpoints of futures, arrays, pipeline states, scalars and data iterators.

    ``max_to_keep`` and ``save_interval_steps`` are orbax's
    (`ocp.CheckpointManagerOptions`): keep the newest N steps; save only steps
    that are a multiple of the interval (``save`` returns False for the others).

    Example::

        ckpt = pw.CheckpointManager("/tmp/run1", max_to_keep=3, save_interval_steps=5)
        for step in range(100):
            state, loss = pipe.step(state, x, y)
            ckpt.save(step, {"state": state, "loss": loss})   # returns at once
        ckpt.wait_until_finished()
        back = ckpt.restore(target={"state": pipe, "loss": None})  # the latest step, the state on pipe's slices
        state = back["state"]

    Opening a directory removes the temporary folders of a save that a killed process left
    there (orbax's ``<step>.orbax-checkpoint-tmp``), unless another pw manager has it open.
    """

    def __init__(self, directory: str | os.PathLike, max_to_keep: int | None = None, save_interval_steps: int = 1):
        ocp = _orbax()
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=save_interval_steps,
            enable_async_checkpointing=True,
            create=True,
        )
        self._ocp = ocp
        # what a killed save left is removed here, unless another manager has the directory open
        self._lock = _open_directory(self.directory, ocp.utils.TMP_DIR_SUFFIX)
        self._island_save = handler_types()[1]
        # No fixed item handlers: orbax picks each item's handler from its args, so a save may
        # hold as many island items as islands hold its leaves.
        try:
            self._mngr = ocp.CheckpointManager(self.directory, options=options)
        except BaseException:
            if self._lock is not None:
                os.close(self._lock)
            raise
        self.save_interval_steps = save_interval_steps
        self._last_step = self._mngr.latest_step()  # the newest step saved or queued
        self._cond = threading.Condition()
        self._queue: list[SaveRecord] = []
        self.saves: list[SaveRecord] = []  # every save asked for, in order (the last few kept)
        self._unreported: list[SaveRecord] = []
        self._metadata: dict[tuple[int, str], Any] = {}  # (step, item) -> its metadata tree
        self._closed = False
        self._thread: threading.Thread | None = None
        _managers.append(self)

    # ----------------------------------------------------------------- saving
    def should_save(self, step: int) -> bool:
        """Whether ``save(step, ...)`` would save, as orbax decides: the first save, then multiples of
        ``save_interval_steps``, and never a step at or before one already saved or queued."""
        with self._cond:
            last = self._last_step
        if last is not None and step <= last:
            return False
        return last is None or step % self.save_interval_steps == 0

    def save(self, step: int, tree: Any, *, force: bool = False) -> bool:
        """Save ``tree`` as ``step`` without waiting for it; False if the interval skips this step.

        ``tree``: any pytree of `pw.Future`, `jax.Array`, numpy arrays, `pw.PipelineState`,
        Python scalars and data iterators with ``get_state``/``set_state`` (grain's). An iterator's
        position is read now: a restored one yields the batches that follow the ones already taken.
        """
        if self._closed:
            raise CheckpointError(f"`CheckpointManager.save({step})`: this manager was closed.")
        if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step < 0:
            raise CheckpointError(f"`CheckpointManager.save(step, tree)`: step must be an int >= 0; got {step!r}.")
        step = int(step)
        if not force and not self.should_save(step):
            return False
        rec = self._snapshot(step, tree)
        with self._cond:
            self._last_step = step if self._last_step is None else max(step, self._last_step)
            self._queue.append(rec)
            self.saves.append(rec)
            del self.saves[:-100]
            if self._thread is None:
                self._thread = threading.Thread(target=self._save_loop, name="pw-checkpoint", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return True

    def _snapshot(self, step: int, tree: Any) -> SaveRecord:
        """What the save writes, fixed now: later steps make new arrays; numpy arrays are copied."""
        leaves, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
        out, pipelines, iterators, numpy_scalars, nbytes = [], [], {}, [], 0
        for path, leaf in leaves:
            key = jax.tree_util.keystr(path)
            if isinstance(leaf, np.generic):  # orbax reads it back as a 0-d array: say it was a scalar
                numpy_scalars.append(path_key(path))
            if isinstance(leaf, PipelineState):
                pipelines.append(key)
                leaf = canonical(leaf)
            elif is_iterator_with_state(leaf):
                iterators[key] = encode_iterator_state(leaf.get_state())
                leaf = None
            elif isinstance(leaf, np.ndarray):
                leaf = np.array(leaf, copy=True)
            elif leaf is not None and not isinstance(
                leaf, (Future, RemoteArray, jax.Array, np.generic, int, float, bool)
            ):
                raise CheckpointError(
                    f"`CheckpointManager.save({step}, tree)`: the leaf at {key or 'the root'} is a "
                    f"{type(leaf).__name__}, which cannot be checkpointed. Save arrays, futures, pw.PipelineState, "
                    f"Python numbers and data iterators with get_state/set_state (grain's); a plain generator "
                    f"cannot say where it is: read it through grain, or save the position yourself."
                )
            for x in jax.tree_util.tree_leaves(leaf):
                if hasattr(x, "shape") and hasattr(x, "dtype"):
                    nbytes += nbytes_of(x.shape, x.dtype)
            out.append(leaf)
        saved = jax.tree_util.tree_unflatten(treedef, out)
        data = {
            "pipeline_states": pipelines,
            "iterators": iterators,
            "numpy_scalars": numpy_scalars,
            "containers": containers(saved),  # tuples and named tuples, which orbax writes as lists and dicts
        }
        # a step submitted next would donate these (its update reuses their buffers): not while we still read them
        return SaveRecord(step, nbytes, time.time(), tree=saved, data=data, held=hold(saved))

    def _save_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                rec = self._queue[0]
            self._write(rec)
            with self._cond:
                self._queue.pop(0)
                self._cond.notify_all()

    def _write(self, rec: SaveRecord) -> None:
        """Wait for the futures (this thread only), then let orbax write and finalize the step."""
        log = controller().events
        t0 = log.now()
        try:
            rec.state = "waiting"
            tree, islands = self._resolve(rec.tree)
            # The timeline's bar is the writing only: waiting for the step that made the values is
            # that step's time, already drawn on the devices.
            rec.state, rec.writing, t0 = "writing", time.time(), log.now()
            items = {STATE: self._ocp.args.StandardSave(tree)}
            for item, (_, names, arrays) in islands.items():  # each island's actor writes its own leaves
                items[item] = self._island_save(arrays, list(names.values()))
            data = {**rec.data, "island_items": {item: names for item, (_, names, _) in islands.items()}}
            items[DATA] = self._ocp.args.JsonSave(data)
            args = self._ocp.args.Composite(**items)
            for key in [k for k in self._metadata if k[0] == rec.step]:  # a step written again
                del self._metadata[key]
            self._mngr.save(rec.step, args=args, force=True)
            self._mngr.wait_until_finished()  # orbax writes on its own threads; this one waits for the commit
            rec.state = "done"
        except BaseException as e:  # disk full, permission, a future that failed: reported once, nothing lost
            rec.state, rec.error = "failed", e
            with self._cond:
                self._unreported.append(rec)
        finally:
            rec.finished = time.time()
            rec.tree = None  # the arrays may go now
            rec.held.release()
            self._emit(log, rec, t0)

    @staticmethod
    def _resolve(tree: Any) -> tuple[Any, dict]:
        """The tree with each future's value, and the leaves on remote islands taken out (None in
        their place), grouped per island as `islands_items` gives them."""
        is_value = lambda x: isinstance(x, (Future, RemoteArray))  # noqa: E731
        remote: dict[str, RemoteArray] = {}

        def one(path, x):
            ra = remote_leaf(x)
            if ra is not None:
                remote[jax.tree_util.keystr(path)] = ra  # respelled below, as orbax reads paths back
                return None
            return x.result() if isinstance(x, Future) else x

        out = jax.tree_util.tree_map_with_path(one, tree, is_leaf=is_value)
        keys = dict(zip((jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_value)[0]),
                        (k for k, _ in flat(tree, is_leaf=is_value))))
        return out, islands_items({keys[k]: ra for k, ra in remote.items()})

    def _emit(self, log, rec: SaveRecord, t0: int) -> None:
        """The save as a bar on the timeline's host lane, with its bytes."""
        ev = NodeEvent(
            -1, -1, "checkpoint", "checkpoint", f"save step {rec.step}", "checkpoint", (), 0, None, t0,
            rec.nbytes, f"{rec.nbytes / 2**20:.1f} MiB -> {self.directory}",
        )
        ev.start, ev.end = t0, log.now()
        if rec.error is not None:
            ev.error = f"{type(rec.error).__name__}: {rec.error}"
        log.emit_node(ev)

    def wait_until_finished(self, timeout: float | None = None) -> None:
        """Block until every save asked for so far is written (or failed); raise the first failure not yet seen."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise CheckpointError(
                        f"`CheckpointManager.wait_until_finished(timeout={timeout:g})`: "
                        f"{len(self._queue)} saves still in progress (steps {[r.step for r in self._queue]})."
                    )
                self._cond.wait(left)
        failure = self.take_failures()
        if failure:
            raise CheckpointError(self.describe_failure(failure[0])) from failure[0].error

    def take_failures(self) -> list[SaveRecord]:
        """Saves that failed and were not reported yet (each is reported once)."""
        with self._cond:
            out, self._unreported = self._unreported, []
        return out

    def describe_failure(self, rec: SaveRecord) -> str:
        last = self.latest_step()
        kept = f"the last finished checkpoint (step {last}) is intact" if last is not None else "no earlier checkpoint"
        return (
            f"checkpoint of step {rec.step} to {self.directory} failed: {type(rec.error).__name__}: {rec.error}. "
            f"{kept}; free space or fix permissions, then save again."
        )

    @property
    def in_progress(self) -> list[SaveRecord]:
        with self._cond:
            return list(self._queue)

    @property
    def last_finished(self) -> SaveRecord | None:
        done = [r for r in self.saves if r.state == "done"]
        return done[-1] if done else None

    # ------------------------------------------------------------------ reading
    def latest_step(self) -> int | None:
        """The newest step whose checkpoint is finished (orbax's atomic commit), or None."""
        self._mngr.reload()
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        """Every finished step kept on disk, oldest first."""
        self._mngr.reload()
        return sorted(self._mngr.all_steps())

    def metadata(self, step: int | None = None) -> tuple[Any, dict]:
        """(shapes and dtypes of the saved tree, the pw data item) of ``step`` (default: the latest)."""
        step = self.finished_step(step, "CheckpointManager.metadata")
        if self._plain_item(step):
            return self._item_metadata(step, "default"), {}
        data = self._ocp.JsonCheckpointHandler().restore(self._epath(step, DATA)) or {}
        tree = self._item_metadata(step, STATE)
        from .restore import replace_at

        for item, names in data.get("island_items", {}).items():  # each leaf where its island wrote it
            md = self._item_metadata(step, item)
            for key, name in names.items():
                tree = replace_at(tree, key, md[name])
        return tree, data

    def _item_metadata(self, step: int, item: str) -> Any:
        key = (step, item)
        if key not in self._metadata:  # a finished step never changes: read each item's metadata once
            md = self._ocp.PyTreeCheckpointHandler().metadata(self._epath(step, item))
            self._metadata[key] = getattr(md, "tree", md)
            while len(self._metadata) > 16:
                self._metadata.pop(next(iter(self._metadata)))
        return self._metadata[key]

    def _epath(self, step: int, item: str):
        from etils import epath

        return epath.Path(self.directory) / str(step) / item

    def _plain_item(self, step: int) -> bool:
        """Whether ``step`` was written by plain orbax as one default item (not by pw)."""
        here = os.path.join(self.directory, str(step))
        return not os.path.isdir(os.path.join(here, STATE)) and os.path.isdir(os.path.join(here, "default"))

    def finished_step(self, step: int | None, api: str) -> int:
        """``step`` if it is finished on disk (default: the latest); CheckpointError naming ``api`` otherwise."""
        self.wait_until_finished()
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise CheckpointError(f"`{api}`: no finished checkpoint in {self.directory}.")
            return steps[-1]
        if step not in steps:
            raise CheckpointError(
                f"`{api}(step={step})`: no finished checkpoint of step {step} in {self.directory}; "
                f"steps there: {steps}."
            )
        return step

    def restore(self, step: int | None = None, target: Any = None) -> Any:
        """The tree saved at ``step`` (default: the latest), each leaf placed as ``target`` says.

        ``target`` mirrors the saved tree; each of its leaves says what comes back there:

        - an array, a future, a `jax.ShapeDtypeStruct` with a sharding: an array on its devices;
        - a `pw.Pipeline`: the pipeline state saved there, on that pipeline's slices with its
          specs (what ``pipe.restore`` gives), whatever slices saved it;
        - a `pw.PipelineState` (``pipe.abstract_state(params)``): placed as its leaves say;
        - an int, float, bool or numpy scalar: the saved number as that type;
        - a data iterator: set to the saved position, and returned;
        - None: what was saved there, as without a target.

        Without ``target``: arrays come back as numpy arrays on the host, numbers as the Python
        or numpy scalars they were saved as, a pipeline state as its layout-free dict, and tuples
        and named tuples (an optax state) as saved, when the named tuple's module is imported in
        this process; otherwise (or from a checkpoint that did not record them) a named tuple is a
        dict of its fields, and ``target=`` (e.g. ``opt.init(params)``) gives it back.

        A data-parallel run and a pipeline restore the same way::

            # data parallel: the state as the run makes it says where each leaf goes
            back = ckpt.restore(target={"params": params, "opt_state": opt.init(params), "step": 0})
            # a pipeline: the pipeline says where its state goes
            back = ckpt.restore(target={"state": pipe, "step": 0, "data": batches})
            state, start = back["state"], back["step"] + 1
        """
        step = self.finished_step(step, "CheckpointManager.restore")
        saved, data = self.metadata(step)
        return restore_tree(self, step, saved, data, target)

    def read_leaves(self, step: int, data: dict, requests: list[tuple[str, Any]]) -> list:
        """Each (saved leaf's key, destination) of ``step`` read from disk, in order.

        A destination is a `jax.ShapeDtypeStruct` with a sharding (orbax reads each device's
        shards onto it), None (numpy), or `OnIsland` (that island's actor reads it: no bytes
        pass through this process). Leaves are read from the item that holds them.
        """
        where = {
            key: (item, f"[{name!r}]")  # as `path_key` spells a key of the item's flat dict
            for item, names in data.get("island_items", {}).items()
            for key, name in names.items()
        }
        default = "default" if self._plain_item(step) else STATE
        out: list = [None] * len(requests)
        rounds: dict[tuple, list[tuple[int, str, Any]]] = {}  # (item, island slice or None, round) -> requests
        seen: dict[tuple, int] = {}
        for i, (key, dest) in enumerate(requests):
            item, name = where.get(key, (default, key))
            home = dest.slice if isinstance(dest, OnIsland) else None
            n = seen[(item, id(home), name)] = seen.get((item, id(home), name), -1) + 1  # one destination per read
            rounds.setdefault((item, home, n), []).append((i, name, dest))
        for (item, home, _), group in rounds.items():
            directory = str(self._epath(step, item))
            if home is not None:
                try:
                    values = read_onto_island(home, directory, [(name, d.abstract) for _, name, d in group])
                except RuntimeError as e:
                    raise CheckpointError(
                        f"`CheckpointManager.restore(step={step})`: reading {item} onto {home.name} failed: {e}"
                    ) from e
            else:
                wanted = [(name, getattr(d, "sharding", None), d.dtype) for _, name, d in group]
                values = read_item(directory, wanted, self._item_metadata(step, item))
            for (i, _, _), v in zip(group, values, strict=True):
                out[i] = v
        return out

    def close(self, timeout: float | None = None) -> None:
        """Finish the saves in progress, then release orbax's threads (``timeout``: at most so many seconds for the saves)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():  # still waiting for its futures: leave orbax to it
                return
        self._mngr.close()
        if self._lock is not None:
            os.close(self._lock)  # releases the directory to the next manager that opens it
            self._lock = None
        if self in _managers:
            _managers.remove(self)

    def status(self) -> str:
        """One line: the saves in progress and the last one finished (what `%pathways status` shows).

        Example::

            print(ckpt.status())   # checkpoints in /tmp/run1: saving step 20 (96.0 MiB, writing); last: step 15
        """
        busy = self.in_progress
        parts = [f"saving step {r.step} ({r.nbytes / 2**20:.1f} MiB, {r.state})" for r in busy]
        last = self.last_finished
        if last is not None:
            parts.append(f"last finished: step {last.step} ({last.nbytes / 2**20:.1f} MiB written in {last.seconds:.2f} s)")
        failed = [r for r in self.saves if r.state == "failed"]
        if failed:
            parts.append(f"failed: step {failed[-1].step}")
        return f"checkpoints in {self.directory}: " + ("; ".join(parts) or "none saved by this process")

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        busy = len(self.in_progress)
        return f"<pw.CheckpointManager {self.directory}: steps {self.all_steps()}, {busy} saving>"


def _open_directory(directory: str, tmp_suffix: str) -> int | None:
    """Create ``directory``, remove the temporary folders a save cut short left there, and hold it open.

    Orbax writes a step into ``<step>.orbax-checkpoint-tmp`` (``tmp_suffix``) and renames it
    when the step is whole; a process killed meanwhile leaves that folder (and orbax warns about
    it when that step is saved again). It is removed only when no other pw manager, in this
    process or another one, has the directory open: each holds a shared lock on it (``flock``,
    which the system releases when its process dies), and this one first tries the lock
    exclusively. A plain orbax manager holds no such lock. Returns the locked file descriptor
    (None where ``flock`` is not available: then nothing is removed).
    """
    os.makedirs(directory, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: leave the leftovers to orbax
        return None
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # another manager has it open and may be saving: leave its folders alone
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd
    try:
        for name in os.listdir(directory):
            if tmp_suffix in name:
                shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    finally:
        fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


#: Managers alive in this process, for the notebook front's status and failure reports.
_managers: list[CheckpointManager] = []


@atexit.register
def _finish_at_exit() -> None:
    # Python shuts down the thread pools orbax writes with before exit hooks run, so a save still
    # in flight when a script ends fails ("cannot schedule new futures after interpreter shutdown"):
    # say which steps are not on disk rather than leave a silent gap. The manager's and orbax's
    # threads are joined first: one still inside C++ code when the interpreter ends aborts the process.
    for m in managers():
        try:
            m.close(timeout=30.0)
        except Exception:  # its failure is said below
            pass
        lost = sorted({r.step for r in m.saves if r.state not in ("done", "failed")} | {r.step for r in m.take_failures()})
        if lost:
            print(f"pw.CheckpointManager({m.directory!s}): the process ended before step(s) {lost} were "
                  f"written; they are not on disk. Call ckpt.wait_until_finished() before a script ends.",
                  file=sys.stderr)


def managers() -> list[CheckpointManager]:
    """The checkpoint managers open in this process."""
    return list(_managers)


def checkpoint_lines() -> list[str]:
    """One line per open checkpoint manager: its saves in progress and the last finished (`%pathways status`)."""
    return [m.status() for m in managers()]


def take_failed_saves() -> list[str]:
    """What to say of each save that failed and was not reported yet (the notebook says it once, after a cell)."""
    return [m.describe_failure(r) for m in managers() for r in m.take_failures()]


__all__ = ["CheckpointManager", "SaveRecord", "checkpoint_lines", "managers", "take_failed_saves"]

"""The kept trees on disk: what `pw.keep` pins is written to the service's state folder and read back at start.

One folder per kept name (``<state>/<user>/k-<name>/``), holding numbered
versions; a version is whole or absent:

* it is written in a hidden ``.tmp-*`` folder beside the versions: the arrays
  with orbax-checkpoint (``arrays/``, itself finalised by orbax's atomic
  rename), then ``meta.pkl`` (the treedef the client sent, the constants,
  and per array leaf its shape, dtype, the client's layout and spec, and the
  service devices and mesh it lived on), fsynced;
* then the folder is renamed to its number (one atomic rename), and older
  versions are removed. A service killed at any point leaves either the new
  version whole or none of it, and the next start restores the highest whole
  version and deletes the rest (``.tmp-*`` left by a kill, ``.trash-*``);
* `pw.unkeep` renames the name's folder to ``.trash-*`` (atomic) before
  deleting it, so a kill mid-delete never brings back half a tree.

What it costs: a keep replies once the tree is on disk, so `pw.keep` takes
a copy of every array to the host and a write of its bytes (on top of
orbax's fixed cost, tens of milliseconds), and the service's worker handles
no other client's request meanwhile. The meta file and the folders are
fsynced; the array files are left to the OS's write-back: a keep survives the
service being killed, a power cut only once the OS has written them.

Without orbax-checkpoint the service says once that kept trees will not
survive a restart, and keeps them in memory only.

Example::

    store = KeptStore.open("/path/state", service_devices)
    kept = store.restore()                 # {(user, name): Kept}, back on their devices
    store.save(user, "state", kept[(user, "state")])
    store.remove(user, "state")
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import pickle
import shutil
import urllib.parse
import uuid
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..runtime import Future, PathwaysError
from .clients import Kept

log = logging.getLogger("pw_kernel.service")

META = "meta.pkl"
ARRAYS = "arrays"
#: Bumped when the meta file's fields change: a version of another format is left where it is.
FORMAT = 1


class KeptStore:
    """The kept trees of one service, on disk under ``directory`` (see the module's notes).

    Example::

        store = KeptStore.open(state_dir, devices)
        store.save("alice", "weights", kept)     # durable when it returns
    """

    def __init__(self, directory: str, devices: list) -> None:
        self.directory = directory
        self.devices = {d.id: d for d in devices}
        self._ocp = None

    @classmethod
    def open(cls, directory: str | None, devices: list) -> KeptStore | None:
        """The store at ``directory`` (made, this user's alone, at the first keep); None, said once, without orbax."""
        if directory is None:
            return None
        if importlib.util.find_spec("orbax") is None or importlib.util.find_spec("orbax.checkpoint") is None:
            msg = ("pw_kernel service: orbax-checkpoint is not installed, so kept trees (`pw.keep`) live in memory "
                   "only and will not survive a restart (`pip install orbax-checkpoint` to keep them in "
                   f"{directory})")
            log.warning(msg)
            print(msg, flush=True)
            return None
        return cls(os.path.abspath(directory), devices)

    # ------------------------------------------------------------ where
    def _entry(self, user: str, name: str) -> str:
        """The folder of one kept name: readable when it can be, a digest when the name is long."""
        quoted = urllib.parse.quote(name, safe="")
        leaf = f"k-{quoted}" if len(quoted) <= 180 else "h-" + hashlib.sha256(name.encode()).hexdigest()
        return os.path.join(self.directory, "u-" + urllib.parse.quote(user, safe=""), leaf)

    @staticmethod
    def _versions(entry: str) -> list[int]:
        try:
            names = os.listdir(entry)
        except FileNotFoundError:
            return []
        return sorted(int(n) for n in names if n.isdigit())

    def _checkpointer(self):
        if self._ocp is None:
            import orbax.checkpoint as ocp

            self._ocp = (ocp, ocp.Checkpointer(ocp.StandardCheckpointHandler()))
        return self._ocp

    # ------------------------------------------------------------ writing
    def save(self, user: str, name: str, kept: Kept) -> None:
        """Write ``kept`` as the newest version of ``name``; whole on disk when this returns (or raises).

        A tree with a leaf on one of the service's Ray nodes' islands is not written: it lives on that host,
        as long as its island does (its bytes would otherwise all cross to the service's host to be saved).
        """
        if any(leaf[0] == "a" and len(leaf[4]) > 3 for leaf in kept.leaves):
            log.info("pw_kernel service: kept tree %r lives on a Ray node's island: not written to %s", name,
                     self.directory)
            return
        entry = self._entry(user, name)
        os.makedirs(self.directory, mode=0o700, exist_ok=True)  # (the folders below it: the user's umask)
        os.makedirs(entry, exist_ok=True)
        tmp = os.path.join(entry, f".tmp-{uuid.uuid4().hex}")
        os.makedirs(tmp)
        try:
            arrays, leaves = {}, []
            for leaf in kept.leaves:
                if leaf[0] == "c":
                    leaves.append(leaf)
                    continue
                _, value, shape, dtype, layout, spec = leaf
                x = value.result() if isinstance(value, Future) else value
                key_impl = None
                if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # (orbax writes numbers: the key's data)
                    key_impl, x = str(jax.random.key_impl(x)), jax.random.key_data(x)
                mesh, where = x.sharding.mesh, tuple(x.sharding.spec)
                place = (tuple(mesh.devices.shape), tuple(mesh.axis_names), [d.id for d in mesh.devices.flat], where,
                         tuple(x.shape), str(x.dtype))
                leaves.append(("a", str(len(arrays)), shape, dtype, layout, spec, place, key_impl))
                arrays[str(len(arrays))] = x
            if arrays:
                ocp, ckpt = self._checkpointer()
                ckpt.save(os.path.join(tmp, ARRAYS), args=ocp.args.StandardSave(arrays))
            meta = {"format": FORMAT, "user": user, "name": name, "by": kept.by, "at": kept.at,
                    "treedef": kept.treedef, "leaves": leaves}
            _write_synced(os.path.join(tmp, META), pickle.dumps(meta))
            _sync_dir(tmp)
            older = self._versions(entry)
            os.rename(tmp, os.path.join(entry, str((older[-1] if older else 0) + 1)))  # (the commit)
            _sync_dir(entry)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for v in older:
            shutil.rmtree(os.path.join(entry, str(v)), ignore_errors=True)

    def remove(self, user: str, name: str) -> bool:
        """Forget ``name`` on disk (renamed away first, then deleted); returns whether it was there."""
        entry = self._entry(user, name)
        trash = os.path.join(self.directory, f".trash-{uuid.uuid4().hex}")
        try:
            os.rename(entry, trash)
        except FileNotFoundError:
            return False
        _sync_dir(os.path.dirname(entry))
        shutil.rmtree(trash, ignore_errors=True)
        return True

    # ------------------------------------------------------------ reading back
    def restore(self) -> dict[tuple[str, str], Kept]:
        """Every whole kept tree, its arrays back on the devices they lived on; leftovers of a kill deleted.

        A tree that cannot come back (its devices are not this service's, a file unreadable) is left on
        disk and said in the log; the others come back.
        """
        out: dict[tuple[str, str], Kept] = {}
        if not os.path.isdir(self.directory):
            return out
        for junk in _hidden(self.directory):
            shutil.rmtree(junk, ignore_errors=True)
        for user_dir in sorted(os.listdir(self.directory)):
            base = os.path.join(self.directory, user_dir)
            if not user_dir.startswith("u-") or not os.path.isdir(base):
                continue
            for leaf in sorted(os.listdir(base)):
                entry = os.path.join(base, leaf)
                for junk in _hidden(entry):
                    shutil.rmtree(junk, ignore_errors=True)
                versions = self._versions(entry)
                if not versions:
                    continue
                for v in versions[:-1]:  # (a kill between a commit and the removal of the older ones)
                    shutil.rmtree(os.path.join(entry, str(v)), ignore_errors=True)
                try:
                    user, name, kept = self._read(os.path.join(entry, str(versions[-1])))
                except Exception as e:  # (one unreadable tree does not keep the others, or the service, down)
                    log.warning("pw_kernel service: kept tree in %s not restored: %s: %s", entry, type(e).__name__, e)
                    continue
                out[(user, name)] = kept
        if out:
            log.info("pw_kernel service: %d kept trees restored from %s", len(out), self.directory)
        return out

    def _read(self, version: str) -> tuple[str, str, Kept]:
        with open(os.path.join(version, META), "rb") as f:
            meta = pickle.load(f)
        if meta.get("format") != FORMAT:
            raise PathwaysError(f"written in format {meta.get('format')}, this service reads {FORMAT}")
        targets = {}
        for leaf in meta["leaves"]:
            if leaf[0] == "a":
                (shape, names, ids, where, stored, dtype), key = leaf[6], leaf[1]
                missing = [i for i in ids if i not in self.devices]
                if missing:
                    raise PathwaysError(f"it lived on devices {ids}; this service has no devices {missing}")
                grid = np.array([self.devices[i] for i in ids], dtype=object).reshape(shape)
                sharding = NamedSharding(Mesh(grid, names), PartitionSpec(*where))
                targets[key] = jax.ShapeDtypeStruct(stored, jnp.dtype(dtype), sharding=sharding)
        arrays: dict[str, Any] = {}
        if targets:
            ocp, ckpt = self._checkpointer()
            arrays = ckpt.restore(os.path.join(version, ARRAYS), args=ocp.args.StandardRestore(targets))
        leaves = []
        for leaf in meta["leaves"]:
            if leaf[0] == "c":
                leaves.append(leaf)
                continue
            _, key, shape, dtype, layout, spec, _, key_impl = leaf
            x = arrays[key]
            if key_impl is not None:
                x = jax.random.wrap_key_data(x, impl=key_impl)
            leaves.append(("a", x, shape, dtype, layout, spec))
        kept = Kept(leaves, meta["treedef"], meta["by"])
        kept.at = meta["at"]
        return meta["user"], meta["name"], kept


def _hidden(folder: str) -> list[str]:
    """What a kill left in ``folder``: a version being written (``.tmp-*``), a name being deleted (``.trash-*``)."""
    try:
        return [os.path.join(folder, n) for n in os.listdir(folder) if n.startswith((".tmp-", ".trash-"))]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _write_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""Islands, virtual slices and the resource manager that maps one onto the other.

An *island* is a group of devices with a fast interconnect (one per platform by
default). A *virtual slice* asks for ``n`` devices with a named mesh shape; the
resource manager places it on the least-loaded devices of one island, 1:1 while
free devices remain and time-multiplexed (oversubscribed) after that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from .errors import PathwaysError, SliceError, SliceReleasedError, SpecError

Device = jax.Device


@dataclasses.dataclass(frozen=True, eq=False)
class Island:
    """Devices joined by a fast interconnect; transfers between islands are explicit nodes.

    Example::

        >>> [i.id for i in pw.islands()]
        [0]
    """

    id: int
    devices: tuple[Device, ...]
    platform: str
    #: For an island on another host: its `RemoteIsland` (the Ray actor that owns its devices).
    #: Its ``devices`` are then local stand-ins that give slices their mesh shape for tracing.
    remote: Any = None

    @property
    def size(self) -> int:
        return len(self.devices)

    @property
    def lost(self) -> bool:
        """Whether this island's devices are gone (its Ray actor or node died); a local island never is."""
        return self.remote is not None and not self.remote.alive

    def device_id(self, k: int) -> int:
        """The id events use for this island's device ``k`` (a local device's own id; see `remote_device_id`)."""
        return remote_device_id(self, k) if self.remote is not None else self.devices[k].id

    def __repr__(self) -> str:
        if self.remote is not None:
            return f"Island(id={self.id}, platform={self.platform!r}, remote={self.remote!r})"
        ids = ",".join(str(d.id) for d in self.devices)
        return f"Island(id={self.id}, platform={self.platform!r}, devices=[{ids}])"


def remote_device_id(island: Island, k: int) -> int:
    """The id events use for device ``k`` of a remote island (local ids stay below 1000)."""
    return 1000 * (island.id + 1) + k


def build_islands(devices: Sequence[Device], spec: int | Sequence[Sequence[int]] | None) -> list[Island]:
    """Group ``devices`` into islands: one per platform, k equal parts, or explicit id lists."""
    if spec is None or isinstance(spec, int):
        parts = 1 if spec is None else spec
        if isinstance(parts, bool) or parts < 1:
            raise SliceError(f"`pw.Config(islands=...)` must be a positive int or lists of device ids; got {spec!r}.")
        islands: list[Island] = []
        by_platform: dict[str, list[Device]] = {}
        for d in devices:
            by_platform.setdefault(d.platform, []).append(d)
        for platform, devs in by_platform.items():
            if len(devs) % parts:
                raise SliceError(
                    f"`pw.Config(islands={parts})` splits each platform's devices into {parts} equal islands, "
                    f"but {platform} has {len(devs)} devices. Pass a divisor of {len(devs)}, or explicit "
                    f"lists of device ids such as islands=[[0, 1, 2], [3, 4, 5, 6, 7]]."
                )
            size = len(devs) // parts
            for k in range(parts):
                islands.append(Island(len(islands), tuple(devs[k * size : (k + 1) * size]), platform))
        return islands
    by_id = {d.id: d for d in devices}
    seen: set[int] = set()
    islands = []
    for group in spec:
        members = []
        for i in group:
            if i not in by_id:
                raise SliceError(
                    f"`pw.Config(islands=...)` names device id {i!r}, but the devices are "
                    f"{sorted(by_id)}. Use ids from `pw.devices()`."
                )
            if i in seen:
                raise SliceError(f"`pw.Config(islands=...)` puts device {i} in two islands; each device belongs to one.")
            seen.add(i)
            members.append(by_id[i])
        if not members:
            raise SliceError("`pw.Config(islands=...)` has an empty island; every island needs at least one device.")
        platforms = {d.platform for d in members}
        if len(platforms) > 1:
            raise SliceError(f"`pw.Config(islands=...)`: island {list(group)} mixes platforms {sorted(platforms)}.")
        islands.append(Island(len(islands), tuple(members), members[0].platform))
    return islands


class VirtualSlice:
    """A named set of devices with a mesh, placed on one island by the resource manager.

    Example::

        s = pw.slice(4, mesh={"data": 2, "model": 2}, name="a")
        x = jax.device_put(jnp.ones((8, 8)), s.sharding("data", None))
        s.release()
    """

    __slots__ = ("name", "mesh", "devices", "island", "_manager", "_released", "__weakref__")

    def __init__(self, name: str, mesh: Mesh, island: Island, manager: ResourceManager):
        self.name = name
        self.mesh = mesh
        self.devices: tuple[Device, ...] = tuple(mesh.devices.flat)
        self.island = island
        self._manager = manager
        self._released = False

    @property
    def size(self) -> int:
        return len(self.devices)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(self.mesh.axis_names)

    @property
    def released(self) -> bool:
        return self._released

    @property
    def remote(self) -> bool:
        """True when the slice lives on an island of another host (run by a Ray actor)."""
        return self.island.remote is not None

    def sharding(self, *spec) -> NamedSharding:
        """A NamedSharding on this slice's mesh; ``s.sharding("data", None)`` is ``P("data", None)``.

        Example::

            s.sharding()            # replicated over the slice
            s.sharding("data")      # first dimension split over the "data" axis
        """
        if len(spec) == 1 and isinstance(spec[0], PartitionSpec):
            pspec = spec[0]
        else:
            pspec = PartitionSpec(*spec)
        self.check_live("VirtualSlice.sharding")
        check_spec_axes(pspec, self, "VirtualSlice.sharding")
        return NamedSharding(self.mesh, pspec)

    def tracing_mesh(self) -> contextlib.AbstractContextManager:
        """While tracing code for this slice: its mesh as the context mesh when it has Explicit axes.

        Only when no `jax.set_mesh` is in effect, so the code's bare PartitionSpecs
        (``out_sharding=P(...)``, `jax.sharding.reshard`) mean the slice's axes, as they would
        under ``jax.set_mesh(s.mesh)``. A pipeline's stages each get their own slice's mesh,
        which no single `jax.set_mesh` could give.

        Example::

            with s.tracing_mesh():
                jax.make_jaxpr(step)(x)
        """
        if has_explicit_axes(self.mesh) and jax.sharding.get_abstract_mesh().empty:
            return jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh)
        return contextlib.nullcontext()

    def release(self) -> None:
        """Give the devices back to the resource manager; later use raises SliceReleasedError."""
        self._manager.release(self)

    def mark_released(self) -> bool:
        """The resource manager took the devices back (under its lock); False if it already had."""
        was_live, self._released = not self._released, True
        return was_live

    def check_live(self, api: str) -> None:
        if self._released:
            raise SliceReleasedError(
                f"`{api}`: slice {self.name!r} was released. Ask for a new one with "
                f"`pw.slice({self.size}, mesh={dict(self.mesh.shape)!r})` and use that instead."
            )

    def __repr__(self) -> str:
        ids = ",".join(str(d.id) for d in self.devices)
        state = ", released" if self._released else ""
        return f"VirtualSlice({self.name!r}, mesh={dict(self.mesh.shape)}, devices=[{ids}], island={self.island.id}{state})"


def has_explicit_axes(mesh) -> bool:
    """Whether ``mesh`` (a `Mesh` or an abstract one) has Explicit axes: shardings on it are part of a value's type."""
    return any(t == AxisType.Explicit for t in mesh.axis_types)


def is_one_device_output(sharding, s: VirtualSlice) -> bool:
    """Whether ``sharding`` is XLA's own for an output on ``s``, a local slice of one device, kept as it is.

    JAX keys its compile cache on the kind of sharding an argument carries, and a fresh array's is a
    `SingleDeviceSharding`: an output named on the slice's mesh instead would make a loop's second call
    (fed the first one's outputs) compile its step again, as `jax.jit`'s does not. A remote slice's
    values are stand-ins named on its mesh (the island's executables declare them).

    Example::

        one = pw.slice(1)
        is_one_device_output(jax.sharding.SingleDeviceSharding(one.devices[0]), one)  # True
    """
    return isinstance(sharding, SingleDeviceSharding) and not s.remote and sharding.device_set == set(s.devices)


def check_spec_axes(spec: PartitionSpec, slice_: VirtualSlice, api: str) -> None:
    """Raise SpecError when ``spec`` names a mesh axis the slice does not have."""
    names = set(slice_.axis_names)
    for entry in spec:
        for axis in entry if isinstance(entry, tuple) else (entry,):
            if axis is not None and axis not in names:
                raise SpecError(
                    f"`{api}`: PartitionSpec {spec} names mesh axis {axis!r}, but slice {slice_.name!r} "
                    f"has axes {slice_.axis_names}. Use one of those names, or None to replicate a dimension."
                )


class ResourceManager:
    """Maps virtual slices onto the physical devices of islands, balancing load."""

    def __init__(self, islands: Sequence[Island]):
        self.islands = list(islands)
        # Load per (island, device): a remote island's stand-in devices are local ids too.
        self._load: dict[tuple[int, int], int] = {(i.id, d.id): 0 for i in self.islands for d in i.devices}
        self._slices: dict[str, VirtualSlice] = {}
        self._names = itertools.count()
        self._lock = threading.Lock()

    @property
    def slices(self) -> list[VirtualSlice]:
        with self._lock:
            return list(self._slices.values())

    def get(self, name: str) -> VirtualSlice:
        with self._lock:
            try:
                return self._slices[name]
            except KeyError:
                known = sorted(self._slices) or "none yet"
                raise SliceError(
                    f"No live slice named {name!r}; live slices: {known}. Create it with `pw.slice(n, name={name!r})`."
                ) from None

    def load(self, device: Device, island: Island | None = None) -> int:
        """How many live virtual slices are mapped onto ``device`` (of ``island``; default: a local one)."""
        if island is None:
            island = next((i for i in self.islands if i.remote is None and device in i.devices), None)
            if island is None:
                return 0
        return self._load.get((island.id, device.id), 0)

    def add_islands(self, islands: Sequence[Island]) -> None:
        with self._lock:
            for isl in islands:
                self.islands.append(isl)
                for d in isl.devices:
                    self._load[(isl.id, d.id)] = 0

    def allocate(
        self,
        n: int | None,
        mesh: Mapping[str, int] | Mesh | None = None,
        name: str | None = None,
        island: int | Island | None = None,
        axis_types: Any = None,
    ) -> VirtualSlice:
        """Place a slice of ``n`` devices; see `pw.slice`."""
        if isinstance(mesh, Mesh):
            return self._adopt(mesh, n, name, island, axis_types)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise SliceError(f"`pw.slice(n)` needs a positive int number of devices; got {n!r}.")
        n = int(n)
        axes = self._check_mesh(n, mesh)
        types = self._check_axis_types(axis_types, tuple(axes))
        with self._lock:
            if name is None:
                name = f"slice{next(self._names)}"
                while name in self._slices:
                    name = f"slice{next(self._names)}"
            elif not isinstance(name, str) or not name:
                raise SliceError(f"`pw.slice(name=...)` must be a non-empty str; got {name!r}.")
            elif name in self._slices:
                raise SliceError(
                    f"`pw.slice(name={name!r})`: a live slice already has that name ({self._slices[name]!r}). "
                    f"Release it first (`s.release()`) or pick another name."
                )
            target = self._pick_island(n, island)
            tid = target.id
            chosen = sorted(target.devices, key=lambda d: (self._load[(tid, d.id)], d.id))[:n]
            chosen.sort(key=lambda d: d.id)
            for d in chosen:
                self._load[(tid, d.id)] += 1
            grid = np.array(chosen, dtype=object).reshape(tuple(axes.values()))
            s = VirtualSlice(name, Mesh(grid, tuple(axes), axis_types=types), target, self)
            self._slices[name] = s
            return s

    def _adopt(self, mesh: Mesh, n, name, island, axis_types) -> VirtualSlice:
        """A slice that is the user's own `jax.sharding.Mesh`: its devices, axis names and axis types."""
        if n is not None and n != mesh.size:
            raise SliceError(
                f"`pw.slice({n!r}, mesh=<Mesh of {mesh.size} devices>)`: a slice made from a Mesh has its devices; "
                f"leave n out (pw.slice(mesh=mesh)) or pass n={mesh.size}."
            )
        if axis_types is not None:
            raise SliceError(
                "`pw.slice(mesh=<Mesh>, axis_types=...)`: a slice made from a Mesh keeps the Mesh's axis types "
                f"{tuple(mesh.axis_types)}; make the Mesh with the types you want (jax.make_mesh(..., axis_types=...))."
            )
        devices = set(mesh.devices.flat)
        homes = [i for i in self.islands if devices <= set(i.devices)]
        if not homes or (island is not None and all(i.id != getattr(island, "id", island) for i in homes)):
            where = {d.id: next((i.id for i in self.islands if d in i.devices), None) for d in mesh.devices.flat}
            raise SliceError(
                f"`pw.slice(mesh=<Mesh {dict(mesh.shape)}>)`: a slice lives on one island, but the Mesh's devices "
                f"are on islands {where} (device id: island). Make the Mesh from one island's devices "
                f"(`pw.islands()[k].devices`), or configure islands that hold it with `pw.init(pw.Config(islands=...))`."
            )
        # (a remote island's devices are stand-ins, shared by every remote island: ``island=`` says which)
        target = next((i for i in homes if i.id == getattr(island, "id", island)), homes[0])
        with self._lock:
            if name is None:
                name = f"slice{next(self._names)}"
                while name in self._slices:
                    name = f"slice{next(self._names)}"
            elif name in self._slices:
                raise SliceError(
                    f"`pw.slice(name={name!r})`: a live slice already has that name ({self._slices[name]!r}). "
                    f"Release it first (`s.release()`) or pick another name."
                )
            for d in mesh.devices.flat:
                self._load[(target.id, d.id)] += 1
            s = VirtualSlice(name, mesh, target, self)
            self._slices[name] = s
            return s

    @staticmethod
    def _check_axis_types(axis_types: Any, axes: tuple[str, ...]) -> tuple | None:
        """``axis_types`` as one `jax.sharding.AxisType` per axis (one value applies to all), or None (Auto)."""
        if axis_types is None:
            return None
        types = tuple(axis_types) if isinstance(axis_types, (tuple, list)) else (axis_types,) * len(axes)
        if len(types) != len(axes) or not all(isinstance(t, AxisType) for t in types):
            raise SliceError(
                f"`pw.slice(axis_types=...)` takes a jax.sharding.AxisType, or one per mesh axis {axes}; got "
                f"{axis_types!r}. For example axis_types=jax.sharding.AxisType.Explicit."
            )
        return types

    def release(self, s: VirtualSlice) -> None:
        with self._lock:
            if not s.mark_released():
                return
            if self._slices.get(s.name) is s:
                del self._slices[s.name]
            for d in s.devices:
                self._load[(s.island.id, d.id)] -= 1

    def release_all(self) -> None:
        for s in self.slices:
            self.release(s)

    def _check_mesh(self, n: int, mesh: Mapping[str, int] | None) -> dict[str, int]:
        if mesh is None:
            return {"d": n}
        if not isinstance(mesh, Mapping) or not mesh:
            raise SliceError(
                f"`pw.slice(mesh=...)` must be a dict of axis name to size such as {{'data': 2, 'model': 2}}; got {mesh!r}."
            )
        for axis, size in mesh.items():
            if not isinstance(axis, str) or isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
                raise SliceError(
                    f"`pw.slice(mesh=...)` maps axis names (str) to positive sizes (int); got {axis!r}: {size!r}."
                )
        total = math.prod(mesh.values())
        if total != n:
            shape = " x ".join(str(v) for v in mesh.values()) + " = " if len(mesh) > 1 else ""
            raise SliceError(
                f"`pw.slice({n}, mesh={dict(mesh)!r})`: the mesh has {shape}{total} devices, not {n}. "
                f"Make the axis sizes multiply to {n}, or ask for pw.slice({total}, ...)."
            )
        return {str(k): int(v) for k, v in mesh.items()}

    def _more_devices_hint(self, n: int, sizes: list[int]) -> str:
        """How to get ``n`` devices on one island: larger islands if the devices exist, else more devices."""
        local = sum(len(i.devices) for i in self.islands if i.remote is None)
        if local >= n:
            return "or configure larger islands with `pw.init(pw.Config(islands=...))`."
        if all(d.platform == "cpu" for i in self.islands for d in i.devices):
            # Simulated CPU devices are fixed when JAX's backend starts; only a new process changes them.
            return (
                f"or simulate more CPU devices, fixed when JAX starts: start Python (or Jupyter) with "
                f"PW_NUM_CPU_DEVICES={n} in its environment, or install the kernel with `python -m pw_kernel "
                f"install --user --devices {n}` (used where PW_NUM_CPU_DEVICES is not set), then restart it."
            )
        return f"or add islands from other hosts with `pw.add_ray_islands(...)` (this process has {local} devices)."

    def _pick_island(self, n: int, island: int | Island | None) -> Island:
        if island is not None:
            iid = island.id if isinstance(island, Island) else island
            matches = [i for i in self.islands if i.id == iid]
            if not matches or (isinstance(island, Island) and matches[0] is not island):
                raise SliceError(
                    f"`pw.slice(island={island!r})`: no such island; the islands are "
                    f"{[i.id for i in self.islands]} (see `pw.islands()`)."
                )
            target = matches[0]
            if target.remote is not None:
                target.remote.check(f"pw.slice({n}, island={target.id})")  # IslandLostError once it is gone
            if len(target.devices) < n:
                raise SliceError(
                    f"`pw.slice({n}, island={target.id})`: island {target.id} has only {len(target.devices)} devices. "
                    f"Ask for at most {len(target.devices)}, or leave island=None to let the resource manager choose."
                )
            return target
        # Without island=, slices go to local islands; remote ones are asked for by id.
        fits = [i for i in self.islands if len(i.devices) >= n and i.remote is None]
        if not fits:
            sizes = [len(i.devices) for i in self.islands]
            raise SliceError(
                f"`pw.slice({n})`: no island has {n} devices (island sizes: {sizes}; all devices: "
                f"{sum(sizes)}). A slice lives on one island: ask for at most {max(sizes)} "
                f"device{'s' if max(sizes) != 1 else ''} (several slices may share them, time-multiplexed: "
                f"`pw.slice({max(sizes)})` once per stage), " + self._more_devices_hint(n, sizes)
            )

        def cost(i: Island):
            loads = sorted(self._load[(i.id, d.id)] for d in i.devices)
            return (loads[n - 1], sum(loads[:n]), sum(loads), i.id)

        return min(fits, key=cost)


def stand_in_devices(n: int, api: str) -> Sequence[jax.Device]:
    """This process's first ``n`` devices, on which a remote island's slices are traced (its devices stand-ins)."""
    local = jax.devices()
    if n > len(local):
        raise PathwaysError(
            f"`{api}`: a remote island of {n} devices needs {n} local devices to trace its slices on, but this "
            f"process has {len(local)}. Start it with more simulated devices (PW_NUM_CPU_DEVICES={n})."
        )
    return local[:n]

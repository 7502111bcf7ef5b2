"""MeshWidget: a device mesh with its axis names, and where every shard of an array lives.

The data model is built from public JAX objects only (`Mesh`, `Sharding.devices_indices_map`)
and the runtime's public `VirtualSlice` / `Island` / controller; the widget's
front-end and its static HTML both draw that same model. Unlike
`jax.debug.visualize_array_sharding` (2-D at most), arrays of any rank are
drawn: the last two dimensions as a grid of tiles, leading dimensions as
facets; meshes above 2-D are faceted the same way.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import traitlets as t

from ..runtime import controller
from ._html import SLICE_PALETTE, device_colour, mesh_html
from ._base import PwWidget
from ._devices import DeviceRef, island_devices, local_device, slice_devices
from .esm import esm_source

Interval = tuple[int, int]
WRAP = 16  # a 1-D mesh longer than this wraps into rows


# ------------------------------------------------------------------- model
def _device_table(devs: Sequence[Any], coords: dict[int, str] | None = None) -> dict[str, dict[str, Any]]:
    """Per device id (as str, JSON keys): label, colour (by position in ``devs``), mesh coordinates."""
    coords = coords or {}
    out: dict[str, dict[str, Any]] = {}
    for k, d in enumerate(devs):
        ref = d if isinstance(d, DeviceRef) else local_device(d)
        out[str(ref.id)] = {
            "id": ref.id,
            "label": ref.label + (f" ({ref.device_kind})" if ref.device_kind else ""),
            "short": ref.platform,
            "colour": device_colour(k),
            "coords": coords.get(ref.id, ""),
        }
    return out


def mesh_facets(names: Sequence[str], grid: np.ndarray) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """Facets of a device grid: the last two axes as rows x columns, leading axes enumerated.

    Returns the facets and each device id's coordinates (``data=0, model=1``).
    """
    names = [str(n) for n in names]
    sizes = grid.shape
    coords: dict[int, str] = {}
    for idx in np.ndindex(*sizes):
        coords[int(grid[idx].id)] = ", ".join(f"{n}={i}" for n, i in zip(names, idx))
    if grid.ndim == 0:
        return [
            {
                "label": "",
                "rows": 1,
                "cols": 1,
                "row_labels": [""],
                "col_labels": [""],
                "cells": [{"r": 0, "c": 0, "device": int(grid[()].id)}],
            }
        ], coords
    if grid.ndim == 1:
        n = sizes[0]
        if n <= WRAP:
            cells = [{"r": 0, "c": c, "device": int(grid[c].id)} for c in range(n)]
            return [
                {
                    "label": "",
                    "rows": 1,
                    "cols": n,
                    "row_labels": [""],
                    "col_labels": [f"{names[0]}={c}" for c in range(n)],
                    "cells": cells,
                }
            ], coords
        # a long 1-D mesh wraps into rows of WRAP devices: row r starts at index r * WRAP
        rows = -(-n // WRAP)
        cells = [{"r": k // WRAP, "c": k % WRAP, "device": int(grid[k].id)} for k in range(n)]
        return [
            {
                "label": "",
                "rows": rows,
                "cols": WRAP,
                "row_labels": [f"{names[0]}={r * WRAP}+" for r in range(rows)],
                "col_labels": [f"+{c}" for c in range(WRAP)],
                "cells": cells,
            }
        ], coords
    facets = []
    rows, cols = sizes[-2], sizes[-1]
    for lead in np.ndindex(*sizes[:-2]):
        cells = [{"r": r, "c": c, "device": int(grid[lead + (r, c)].id)} for r in range(rows) for c in range(cols)]
        facets.append(
            {
                "label": ", ".join(f"{n}={i}" for n, i in zip(names, lead)),
                "rows": rows,
                "cols": cols,
                "row_labels": [f"{names[-2]}={r}" for r in range(rows)],
                "col_labels": [f"{names[-1]}={c}" for c in range(cols)],
                "cells": cells,
            }
        )
    return facets, coords


def _dtype_name(dtype: Any) -> str:
    # a typed PRNG key's dtype (key<fry>) is no numpy dtype, but has a name
    name = dtype.name if hasattr(dtype, "name") else np.dtype(dtype).name
    short = {
        "float32": "f32",
        "float64": "f64",
        "float16": "f16",
        "bfloat16": "bf16",
        "int32": "i32",
        "int64": "i64",
        "int8": "i8",
        "uint8": "u8",
        "uint32": "u32",
        "bool": "bool",
    }
    return short.get(name, name)


def _type_str(shape: Sequence[int], dtype: Any) -> str:
    return f"{_dtype_name(dtype)}[{','.join(map(str, shape))}]"


def _spec_str(sharding: Any) -> str:
    spec = getattr(sharding, "spec", None)
    if spec is not None:
        return "P(" + ", ".join(repr(s) for s in spec) + ")"
    return type(sharding).__name__


def _norm(index: tuple, shape: Sequence[int]) -> tuple[Interval, ...]:
    out = []
    for sl, n in zip(index, shape):
        start, stop, _ = sl.indices(n) if isinstance(sl, slice) else (int(sl), int(sl) + 1, 1)
        out.append((start, stop))
    return tuple(out)


def _sizes(intervals: Sequence[Interval], total: int, budget: float, minimum: int) -> list[int]:
    """Pixel sizes proportional to the intervals' lengths, at least ``minimum`` each (less when there are many)."""
    if len(intervals) * minimum > 2 * budget:
        minimum = max(4, int(2 * budget / len(intervals)))
    return [max(minimum, round(budget * (b - a) / max(total, 1))) for a, b in intervals]


def _offsets(sizes: Sequence[int]) -> list[int]:
    return [0, *itertools.accumulate(sizes)][:-1]


def array_layout(shape: Sequence[int], dtype: Any, sharding: Any, name: str, order: Sequence[int]) -> dict[str, Any]:
    """Where every block of an array lives: tiles (pixel boxes) per facet, devices per tile.

    ``order`` is the device ids in mesh order (replicas are listed in that order).
    """
    shape = tuple(int(s) for s in shape)
    pos = {d: k for k, d in enumerate(order)}
    blocks: dict[tuple[Interval, ...], list[int]] = {}
    for dev, index in sharding.devices_indices_map(shape).items():
        blocks.setdefault(_norm(index, shape), []).append(int(dev.id))
    for devs in blocks.values():
        devs.sort(key=lambda d: pos.get(d, d))
    nd = len(shape)
    cuts: list[list[Interval]] = [sorted({k[d] for k in blocks}) for d in range(nd)]

    def label_of(iv: tuple[Interval, ...]) -> str:
        return "[" + ", ".join(f"{a}:{b}" for a, b in iv) + "]"

    facets = []
    n_lead = max(nd - 2, 0)
    lead_choices = list(itertools.product(*[cuts[d] for d in range(n_lead)]))
    n_facets = len(lead_choices)
    width = 360 if n_facets == 1 else (220 if n_facets <= 4 else 150)
    if nd == 0:
        grid_rows: list[Interval] = [(0, 1)]
        grid_cols: list[Interval] = [(0, 1)]
        col_w, row_h = [64], [40]
    elif nd == 1:
        grid_rows, grid_cols = [(0, 1)], cuts[0]
        col_w, row_h = _sizes(grid_cols, shape[0], width, 30), [44]
    else:
        grid_rows, grid_cols = cuts[-2], cuts[-1]
        col_w = _sizes(grid_cols, shape[-1], width, 30)
        total_h = min(
            max(width * shape[-2] / max(shape[-1], 1), 28 * len(grid_rows), 40), 300 if n_facets == 1 else 160
        )
        row_h = _sizes(grid_rows, shape[-2], total_h, 26)
    xs, ys = _offsets(col_w), _offsets(row_h)
    for lead in lead_choices:
        tiles = []
        for r, rows_iv in enumerate(grid_rows):
            for c, cols_iv in enumerate(grid_cols):
                if nd == 0:
                    key: tuple[Interval, ...] = ()
                elif nd == 1:
                    key = (cols_iv,)
                else:
                    key = (*lead, rows_iv, cols_iv)
                devs = blocks[key]
                tiles.append(
                    {
                        "x": xs[c],
                        "y": ys[r],
                        "w": col_w[c],
                        "h": row_h[r],
                        "index": label_of(key) if nd else "[]",
                        "shard": _type_str([b - a for a, b in key], dtype),
                        "devices": devs,
                    }
                )
        label = ""
        if n_lead:
            label = name + "[" + ", ".join([f"{a}:{b}" for a, b in lead] + [":"] * (nd - n_lead)) + "]"
        facets.append({"label": label, "width": sum(col_w), "height": sum(row_h), "tiles": tiles})

    n_dev = sum(len(v) for v in blocks.values())
    reps = {len(v) for v in blocks.values()}
    if len(blocks) == 1 and n_dev == 1:
        summary = "on a single device"
    elif len(blocks) == 1:
        summary = f"fully replicated on {n_dev} devices"
    elif reps == {1}:
        summary = f"{len(blocks)} shards, one per device"
    else:
        rep = "×" + "/".join(str(r) for r in sorted(reps))
        summary = f"{len(blocks)} shards on {n_dev} devices, each replicated {rep}"
    return {
        "name": name,
        "shape": list(shape),
        "dtype": _dtype_name(dtype),
        "type": _type_str(shape, dtype),
        "spec": _spec_str(sharding),
        "summary": summary,
        "n_shards": len(blocks),
        "facets": facets,
    }


def _is_slice(x: Any) -> bool:
    return hasattr(x, "mesh") and hasattr(x, "devices") and hasattr(x, "island") and hasattr(x, "name")


def _is_controller(x: Any) -> bool:
    return hasattr(x, "islands") and hasattr(x, "resources") and hasattr(x, "events")


def _mesh_parts(mesh: Any) -> tuple[list[str], np.ndarray]:
    return [str(n) for n in mesh.axis_names], np.asarray(mesh.devices)


def model_of(
    obj: Any = None, *, shape: Sequence[int] | None = None, dtype: Any = None, name: str | None = None
) -> dict[str, Any]:
    """The MeshWidget state for a slice, a `jax.sharding.Mesh`, an array or future, a sharding, or the controller.

    Example::

        model_of(pw.slice(4, mesh={"data": 2, "model": 2}))["axis_names"]   # ['data', 'model']
    """
    from jax.sharding import Mesh, NamedSharding, Sharding

    state: dict[str, Any] = {
        "kind": "mesh",
        "title": "",
        "axis_names": [],
        "axis_sizes": [],
        "device_ids": [],
        "devices": {},
        "mesh_facets": [],
        "array": {},
        "islands": [],
        "slices": [],
    }
    if obj is None or _is_controller(obj) or _is_island_list(obj):
        return _devices_model(obj, state)
    if _is_island(obj):
        return _devices_model([obj], state)
    sharding = None
    if _is_slice(obj):
        names, grid = _mesh_parts(obj.mesh)
        if getattr(obj.island, "remote", None) is not None:  # show the ids its events use, not stand-ins
            refs = slice_devices(obj, _device_names())
            grid = np.array(refs, dtype=object).reshape(grid.shape)
        sizes = "×".join(f"{n}={s}" for n, s in zip(names, grid.shape))
        island = getattr(obj.island, "id", obj.island)
        state["title"] = f"slice {obj.name!r}: mesh {sizes} on island {island}"
    elif isinstance(obj, Mesh):
        names, grid = _mesh_parts(obj)
        state["title"] = "mesh " + "×".join(f"{n}={s}" for n, s in zip(names, grid.shape))
    else:
        if isinstance(obj, Sharding):
            sharding = obj
            if shape is None:
                raise TypeError(
                    "`pw.show_mesh(sharding)` needs the array's shape too: `pw.show_mesh(sharding, shape=(8, 8))`."
                )
        elif hasattr(obj, "shape") and getattr(obj, "sharding", None) is not None:
            sharding = obj.sharding
            shape = tuple(obj.shape)
            dtype = getattr(obj, "dtype", dtype)
        else:
            what = f"{type(obj).__module__}.{type(obj).__qualname__}"
            hint = ""
            if hasattr(obj, "shape"):
                hint = (
                    " It has a shape but no sharding: put it on devices first, "
                    "e.g. `jax.device_put(x, s.sharding('data'))`."
                )
            raise TypeError(
                f"`pw.show_mesh` takes a VirtualSlice, a jax.sharding.Mesh, a jax.Array or pw.Future, a Sharding "
                f"(with shape=), or nothing (all devices); got {what}.{hint}"
            ) from None
        if isinstance(sharding, NamedSharding):
            names, grid = _mesh_parts(sharding.mesh)
        else:
            devs = sorted(sharding.device_set, key=lambda d: d.id)
            names, grid = ["devices"], np.array(devs, dtype=object)
    facets, coords = mesh_facets(names, grid)
    flat = list(grid.flat)
    state.update(
        axis_names=names,
        axis_sizes=[int(s) for s in grid.shape],
        device_ids=[int(d.id) for d in flat],
        devices=_device_table(flat, coords),
        mesh_facets=facets,
    )
    if sharding is not None:
        arr = array_layout(
            shape, dtype if dtype is not None else np.float32, sharding, name or "array", state["device_ids"]
        )
        mesh_desc = "×".join(f"{n}={s}" for n, s in zip(names, grid.shape))
        state.update(kind="array", array=arr, title=f"{arr['type']} {arr['spec']} over mesh {mesh_desc}")
    return state


def _device_names() -> dict[int, str]:
    return dict(controller().events.device_names)


def _is_island(x: Any) -> bool:
    return hasattr(x, "devices") and hasattr(x, "platform") and hasattr(x, "id") and not _is_slice(x)


def _is_island_list(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and bool(x) and all(_is_island(i) for i in x)


def _devices_model(obj: Any, state: dict[str, Any]) -> dict[str, Any]:
    """Every device of the controller (or of the given islands), grouped by island, with the slices on each."""
    if obj is None or _is_controller(obj):
        if obj is None:
            obj = controller()
        islands = list(obj.islands)
        slices = list(obj.resources.slices)
        names = dict(obj.events.device_names)
    else:
        islands = list(obj)
        slices = []
        names = {}
    per_island = {isl.id: island_devices(isl, names) for isl in islands}
    devs = [d for isl in islands for d in per_island[isl.id]]
    ids = {d.id for d in devs}
    state.update(
        kind="devices",
        title=f"{len(devs)} device{'s' if len(devs) != 1 else ''} in {len(islands)} island{'s' if len(islands) != 1 else ''}, "
        f"{len(slices)} live slice{'s' if len(slices) != 1 else ''}",
        device_ids=[d.id for d in devs],
        devices=_device_table(devs),
        islands=[
            {"id": int(i.id), "platform": str(i.platform), "devices": [d.id for d in per_island[i.id]]} for i in islands
        ],
        slices=[
            {
                "name": str(s.name),
                "mesh": " × ".join(f"{n}={v}" for n, v in s.mesh.shape.items()),
                "devices": [d.id for d in slice_devices(s, names) if d.id in ids],
                "island": int(getattr(s.island, "id", -1)),
                "colour": SLICE_PALETTE[k % len(SLICE_PALETTE)],
            }
            for k, s in enumerate(slices)
        ],
    )
    return state


# ------------------------------------------------------------------ widget
class MeshWidget(PwWidget):
    """The device mesh of a slice, or the shard placement of an array over its mesh.

    Example::

        s = pw.slice(4, mesh={"data": 2, "model": 2})
        pw.show_mesh(s)                                   # the 2x2 grid, axis names, device ids
        x = jax.device_put(jnp.ones((8, 8)), s.sharding("data", None))
        pw.show_mesh(x)                                   # which rows live where; replicas marked
    """

    _esm = esm_source("mesh")

    kind = t.Unicode("mesh").tag(sync=True)
    title = t.Unicode("").tag(sync=True)
    axis_names = t.List(t.Unicode()).tag(sync=True)
    axis_sizes = t.List(t.Int()).tag(sync=True)
    device_ids = t.List(t.Int()).tag(sync=True)
    devices = t.Dict().tag(sync=True)
    mesh_facets = t.List(t.Dict()).tag(sync=True)
    array = t.Dict().tag(sync=True)
    islands = t.List(t.Dict()).tag(sync=True)
    slices = t.List(t.Dict()).tag(sync=True)

    def __init__(self, obj: Any = None, *, shape=None, dtype=None, name: str | None = None, **kwargs: Any):
        super().__init__(**model_of(obj, shape=shape, dtype=dtype, name=name), **kwargs)

    def state_dict(self) -> dict[str, Any]:
        keys = (
            "kind",
            "title",
            "axis_names",
            "axis_sizes",
            "device_ids",
            "devices",
            "mesh_facets",
            "array",
            "islands",
            "slices",
        )
        return {k: getattr(self, k) for k in keys}

    def static_html(self) -> str:
        return mesh_html(self.state_dict())

    def __repr__(self) -> str:
        if self.kind == "devices":
            return f"MeshWidget({self.title})"
        mesh = " × ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.axis_sizes))
        what = f"{self.array['type']} {self.array['spec']}, {self.array['summary']}, " if self.kind == "array" else ""
        return f"MeshWidget({what}mesh {mesh}, devices {self.device_ids})"


def show_mesh(obj: Any = None, *, shape=None, dtype=None, name: str | None = None) -> MeshWidget:
    """A MeshWidget for a slice, an array (or future, or sharding with ``shape=``), or all devices.

    Example::

        pw.show_mesh(s)         # the slice's mesh
        pw.show_mesh(x)         # where each shard of x lives
        pw.show_mesh()          # every device by island, with the slices placed on it

    The array is labelled ``name``, else the caller's variable that holds it (``z`` for
    ``pw.show_mesh(z)``), else "array".
    """
    if name is None and obj is not None:
        name = _callers_name_for(obj) or "array"
    return MeshWidget(obj, shape=shape, dtype=dtype, name=name)


def _callers_name_for(obj: Any) -> str | None:
    """The name the first caller outside pw_kernel gives ``obj`` (its locals, then its globals), if any."""
    package = __name__.split(".")[0]
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == package:
        frame = frame.f_back
    if frame is None:
        return None
    for scope in (frame.f_locals, frame.f_globals):
        for key, value in scope.items():
            if value is obj and not key.startswith("_"):
                return key
    return None


__all__ = ["MeshWidget", "array_layout", "mesh_facets", "model_of", "show_mesh"]

"""Device identity as the views show it: the ids node events use, and their labels.

A local island's devices are JAX devices and events name them by ``device.id``.
An island on another host (run by a Ray actor) has local stand-in devices for
tracing; its events use `Island.device_id` instead, and the event log names
them (``EventLog.device_names``). Views go through here so lanes, mesh cells
and events agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any



@dataclasses.dataclass(frozen=True)
class DeviceRef:
    """A device as a view shows it: the id its events carry, a label, its platform and kind."""

    id: int
    label: str
    platform: str
    device_kind: str = ""


def _remote(island: Any) -> bool:
    return getattr(island, "remote", None) is not None


def island_devices(island: Any, names: Mapping[int, str] | None = None) -> list[DeviceRef]:
    """The island's devices, in order, under the ids their node events use."""
    names = names or {}
    out = []
    for k, d in enumerate(island.devices):
        if _remote(island):
            dev_id = island.device_id(k)
            kind = ""
        else:
            dev_id = int(d.id)
            kind = str(getattr(d, "device_kind", ""))
        platform = str(getattr(island, "platform", getattr(d, "platform", "device")))
        out.append(DeviceRef(dev_id, names.get(dev_id, f"{platform}:{dev_id}"), platform, kind))
    return out


def slice_devices(s: Any, names: Mapping[int, str] | None = None) -> list[DeviceRef]:
    """A slice's devices in mesh order (``s.devices``), under the ids their node events use."""
    island = s.island
    if not _remote(island):
        names = names or {}
        return [
            DeviceRef(int(d.id), names.get(int(d.id), f"{d.platform}:{d.id}"), str(d.platform), str(d.device_kind))
            for d in s.devices
        ]
    by_pos = {d.id: ref for d, ref in zip(island.devices, island_devices(island, names))}
    return [by_pos[d.id] for d in s.devices]


def local_device(d: Any) -> DeviceRef:
    return DeviceRef(int(d.id), f"{d.platform}:{d.id}", str(d.platform), str(getattr(d, "device_kind", "")))

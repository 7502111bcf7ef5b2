"""A client's share of device memory: what it holds on each device, and the admission that caps it.

`pw.connect(memory="4GiB")` gives a client a cap per device. The service counts
what each client holds as its buffers come and go (`Held`: one add when a buffer
is made, one subtract when it is freed; nothing scans the buffers), and refuses
a burst whose outputs would take a device past the cap, before anything runs:
`pw.AdmissionError` to that client, while the others go on. The outputs' bytes
are known from the executable before it runs (`out_bytes`: a `jax.export`'s
output avals and the slice's shardings, computed once at load); a node that
calls the host, whose outputs are known only once traced, is counted when it is
made. Frees that ride with a burst are applied before its check.

Example::

    held = Held()
    held.add(7, id(x), {0: 4096, 1: 4096})   # buffer 7 (array x) holds 4 KiB on devices 0 and 1
    held.admit("alice", 8192, {0: 8192}) # AdmissionError: 12 KiB on device 0 > 8 KiB
    held.drop(7)
"""

from __future__ import annotations

import re
from typing import Any

from ..runtime import AdmissionError, ArgumentError
from ..runtime.extend import nbytes_of

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: Any, api: str) -> int | None:
    """``value`` as a number of bytes: an int, or a str such as ``"512MiB"`` / ``"4 GB"``; None stays None.

    Example::

        parse_bytes("1.5GiB", "pw.connect(memory=...)")   # 1610612736
    """
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS and float(m.group(1)) > 0:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ArgumentError(
        f"`{api}` takes bytes per device: a positive int, or a str such as '512MiB' or '4GiB'; got {value!r}."
    )


def mib(n: int) -> str:
    """A size in binary units: ``64 KiB``, ``1.5 MiB``, ``2.0 GiB``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.{0 if n % size == 0 else 1}f} {unit}"
    return f"{n} B"


def shard_bytes(sharding, shape, dtype) -> dict[int, int]:
    """Bytes an array of ``shape``/``dtype`` laid out by ``sharding`` takes on each of its devices."""
    try:
        shard = sharding.shard_shape(tuple(shape))
    except Exception:  # (a sharding that cannot say: count the whole array on each device)
        shard = shape
    n = nbytes_of(shard, dtype)
    return {d.id: n for d in sharding.device_set}


def out_bytes(exported, shardings: list) -> dict[int, int]:
    """Bytes per device of one run's outputs: a `jax.export.Exported`'s output avals on ``shardings``."""
    total: dict[int, int] = {}
    for aval, sh in zip(exported.out_avals, shardings):
        for d, n in shard_bytes(sh, aval.shape, aval.dtype).items():
            total[d] = total.get(d, 0) + n
    return total


_SEEN: dict[tuple, dict[int, int]] = {}  # (sharding, shape, dtype) -> bytes per device: a step's outputs repeat


def of_value(value) -> dict[int, int]:
    """Bytes per device of a buffer the service holds (a `jax.Array` or a Future of its controller)."""
    sh = getattr(value, "sharding", None)
    if sh is None:
        return {}
    key = (sh, value.shape, value.dtype)
    n = _SEEN.get(key)
    if n is None:
        if len(_SEEN) > 4096:  # (bounded: a long session of ever new shapes)
            _SEEN.clear()
        n = _SEEN[key] = shard_bytes(sh, value.shape, value.dtype)
    return n


class Held:
    """What one client holds on each device, kept as buffers are made and freed (never by a scan).

    An array under two handles (a kept tree adopted by the client that kept it) counts once.
    """

    __slots__ = ("per_device", "_of", "_arrays")

    def __init__(self) -> None:
        self.per_device: dict[int, int] = {}
        self._of: dict[int, int] = {}  # handle -> the id of its array (alive while a handle holds it)
        self._arrays: dict[int, list] = {}  # array id -> [handles to it, its bytes per device]

    def add(self, handle: int, key: int, nbytes: dict[int, int]) -> None:
        if handle in self._of:
            self.drop(handle)
        self._of[handle] = key
        entry = self._arrays.get(key)
        if entry is not None:
            entry[0] += 1
            return
        self._arrays[key] = [1, nbytes]
        pd = self.per_device
        for d, n in nbytes.items():
            pd[d] = pd.get(d, 0) + n

    def drop(self, handle: int) -> None:
        key = self._of.pop(handle, None)
        if key is None:
            return
        entry = self._arrays[key]
        entry[0] -= 1
        if entry[0] == 0:
            del self._arrays[key]
            pd = self.per_device
            for d, n in entry[1].items():
                pd[d] -= n

    def donated(self, handle: int) -> None:
        """``handle``'s array was donated to a later node (its buffer became that node's output): not counted."""
        key = self._of.get(handle)
        if key is None:
            return
        entry = self._arrays[key]
        pd = self.per_device
        for d, n in entry[1].items():
            pd[d] -= n
        entry[1] = {}

    @property
    def total(self) -> int:
        """Bytes held on all devices together."""
        return sum(self.per_device.values())

    @property
    def peak(self) -> int:
        """The most this client holds on any one device."""
        return max(self.per_device.values(), default=0)

    def admit(self, tenant: str, cap: int, need: dict[int, int]) -> None:
        """Refuse (`pw.AdmissionError`) if holding ``need`` more would take a device past ``cap``."""
        pd = self.per_device
        for d, n in need.items():
            have = pd.get(d, 0)
            if have + n > cap:
                raise AdmissionError(
                    f"`pw.connect(memory={mib(cap)})`: client {tenant!r} may hold {mib(cap)} on each service "
                    f"device, and this call would hold {mib(have + n)} on device {d} ({mib(have)} held now + "
                    f"{mib(n)} of outputs). Free what it holds there (`del` arrays it no longer needs, "
                    f"`pw.unkeep`), or connect with a larger `memory=`. Other clients are not affected."
                )


class Buffers(dict):
    """A client's buffers by handle, each one's bytes counted in ``held`` as it comes and goes.

    Example::

        b = Buffers(); b[3] = jnp.zeros(1024)    # b.held.per_device == {0: 4096}
        b.pop(3)                                  # {0: 0}
    """

    __slots__ = ("held",)

    def __init__(self) -> None:
        super().__init__()
        self.held = Held()

    def __setitem__(self, handle: int, value) -> None:
        dict.__setitem__(self, handle, value)
        self.held.add(handle, id(value), of_value(value))

    def update(self, pairs) -> None:
        for handle, value in (pairs.items() if isinstance(pairs, dict) else pairs):
            self[handle] = value

    def pop(self, handle: int, *default):
        self.held.drop(handle)
        return dict.pop(self, handle, *default)

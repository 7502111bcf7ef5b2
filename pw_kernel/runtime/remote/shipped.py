"""A node that calls the host, shipped to a Ray island as Python: its function pickled, not exported.

`jax.export` cannot carry host callbacks (`jax.debug.print`, `jax.pure_callback`,
`io_callback`, `jax.debug.callback`): a callback is a Python object. So a node
that has them travels as its evaluator (the function its `jax.jit` wraps:
the node's equations replayed, callbacks guarded) and the list its guarded
callbacks record errors into, pickled with cloudpickle, as Ray pickles what it
sends. Four things in a jaxpr need help to travel:

- JAX primitives: pickled by reference (the module attribute that holds them),
  so the island binds its own registered ones, not copies without lowering rules;
- tracebacks of the equations' source info: dropped (they cannot be pickled);
- the devices of shardings inside the equations: the controller's stand-ins,
  pickled as their position on the island, which picks its own device there;
- literals (JAX's typed numpy arrays), rebuilt from their value and type.

The island's actor loads it (`load_shipped`) as a `ShippedNode`: `jax.jit` on
its own mesh, compiled before its first run, run while the island catches what
it writes (`node_output.py`).
"""

from __future__ import annotations

import importlib
import io
import pickle
import sys
import traceback
from typing import Any

from ..errors import SliceError
from .node_output import NodeOutput, Pieces

_PRIMITIVES: dict[int, tuple[Any, tuple[str, str]]] = {}  # id(primitive) -> (it, (module, attribute))


def _where(prim) -> tuple[str, str]:
    """The (module, attribute) that holds ``prim``: how the island finds its own (looked up once per primitive)."""
    hit = _PRIMITIVES.get(id(prim))
    if hit is not None and hit[0] is prim:
        return hit[1]
    # JAX's public modules first (`jax.lax`, `jax.extend.core.primitives`), its private ones only for a
    # primitive no public module holds.
    modules = sorted(sys.modules.items(), key=lambda m: (not m[0].startswith("jax"),
                                                         any(p.startswith("_") for p in m[0].split("."))))
    for name, module in modules:
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            if value is prim:
                _PRIMITIVES[id(prim)] = (prim, (name, attr))
                return name, attr
    raise pickle.PicklingError(f"JAX primitive {prim.name!r} is held by no module, so the island cannot find it")


def primitive(module: str, attr: str):
    """The island's own primitive (unpickling)."""
    return getattr(importlib.import_module(module), attr)


def no_traceback():
    """A dropped traceback (unpickling)."""
    return None


def island_device(position: int):
    """The island's device at ``position`` of its own device list (unpickling)."""
    import jax

    return jax.devices()[position]


def ship(fn, devices, island: Any, what: str, where: str = "") -> bytes:
    """``fn`` (a node's `jax.jit`, made by `trace.executables.jit_of`) as bytes an island loads.

    ``devices``: the island's stand-in devices, in order (a sharding inside the node names them).
    Raises `SliceError` naming ``what`` (the node), ``island`` and what could not be pickled, with
    ``where`` (the user's line) after it.
    """
    try:
        return _pickled(fn, devices)
    except pickle.PicklingError as e:
        raise SliceError(
            f"{what} calls the host (jax.debug.print, jax.pure_callback, io_callback or jax.debug.callback), so "
            f"it goes to its remote island {island!r} as a pickled Python function, but it cannot be pickled: {e}. "
            f"Make the callback a function of picklable values (no locks, open files, sockets or local devices in "
            f"its closure), or put the node on a local slice.{where}"
        ) from None


def _pickled(fn, devices) -> bytes:
    """`ship`'s bytes, or `pickle.PicklingError` saying what could not be pickled."""
    import cloudpickle
    import jax
    import numpy as np
    from jax.extend.core import Primitive

    position = {d: k for k, d in enumerate(devices)}

    class _Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            kind = type(obj)
            # (Two of JAX's types have no public name: known by their own, not imported from jax._src.)
            if kind.__name__ == "Traceback" and kind.__module__.startswith(("jax", "jaxlib")):
                return no_traceback, ()
            if isinstance(obj, Primitive):
                return primitive, _where(obj)
            if isinstance(obj, jax.Device):
                if obj not in position:
                    raise pickle.PicklingError(f"it names device {obj}, which is not one of the island's")
                return island_device, (position[obj],)
            if kind.__name__ == "TypedNdArray" and kind.__module__.startswith("jax"):
                # a literal: its aval lives in slots that pickle would scramble
                return kind, (np.asarray(obj), obj.aval)
            return super().reducer_override(obj)

    buf = io.BytesIO()
    try:
        _Pickler(buf, protocol=pickle.DEFAULT_PROTOCOL).dump((fn.__wrapped__, getattr(fn, "callback_errors", [])))
    except pickle.PicklingError:
        raise
    except Exception as e:  # what cloudpickle refuses: the callback's closure holds a lock, a socket, ...
        raise pickle.PicklingError(f"{type(e).__name__}: {e}") from None
    return buf.getvalue()


class ShippedNode:
    """A shipped node on its island: its evaluator `jax.jit`-ed on the island's shardings, compiled at its first run."""

    def __init__(self, blob: bytes, in_shardings: tuple, out_shardings: tuple):
        import jax

        self.compiled = None
        self.unloaded: str | None = None  # why it could not be loaded (its runs fail saying so)
        try:
            evaluate, self.errors = pickle.loads(blob)  # the list its guarded callbacks record into
            self.jitted = jax.jit(evaluate, in_shardings=in_shardings, out_shardings=out_shardings, keep_unused=True)
        except Exception as e:  # a module the island lacks (a primitive or callback defined in a notebook)
            self.unloaded = f"{type(e).__name__}: {e}"

    def run(self, args: list, output: NodeOutput) -> tuple[Any, Pieces, str | None]:
        """(its outputs, what it wrote while it ran, the traceback of a callback that raised or None)."""
        import jax

        if self.unloaded is not None:
            raise RuntimeError(f"the island could not load this node's pickled function: {self.unloaded}")
        if self.compiled is None:  # compiled outside the catch: what compiling writes is not the node's
            self.compiled = self.jitted.lower(*args).compile()
        with output.catching() as pieces:
            outs = self.compiled(*args)
            jax.block_until_ready(outs)
        if not self.errors:
            return outs, pieces, None
        first = self.errors[0]
        self.errors.clear()
        return outs, pieces, callback_failure(first)


def callback_failure(error: BaseException) -> str:
    """What a node whose host callback raised ``error`` fails with: the callback's traceback."""
    said = "".join(traceback.format_exception(error)).rstrip("\n")
    return f"a host callback raised:\n{said}"

"""Input nodes: values a program takes from a feed (a data iterator) when the run reaches them, not when traced.

Reading a data iterator inside a traced program (``x, y = next(batches)`` in a
`%%pathways` cell) must not consume data at trace time, or a 50-step loop would
read all 50 batches before its first step and bake them into the program as
constants. `input_node` instead binds an equation with the batch's shapes and
shardings (a ``jit`` of no arguments, never executed) and records it in the
trace scope; the tracer turns that equation into an ``input`` node whose
executable is ``take``, called by the dispatcher in dispatch order.

The runtime knows nothing of where batches come from: `pw.prefetch` (the
training layer) calls `input_node` with its own ``take``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ..devices import VirtualSlice
from ..errors import TracingError
from .compiled import current_trace

# The jit eqn of an input carries this in its name; the trace scope maps the name to its `InputRead`.
_MARK = "__pwinput"
_uids = itertools.count()
#: Reads of feeds one program may make: an unbounded ``for x in batches`` in a traced program stops here.
MAX_READS = 10_000


@dataclasses.dataclass(frozen=True, eq=False)
class InputRead:
    """One read of a feed in a traced program: where its values live and how the run takes them."""

    name: str  # the node's name, e.g. "input batches"
    slice: VirtualSlice  # where the node runs (its island orders it with the island's other work)
    avals: tuple[jax.ShapeDtypeStruct, ...]  # each value's shape, dtype and sharding
    take: Callable[[], Sequence[Any]]  # at run time: the next values, placed as ``avals`` say


def input_node(
    take: Callable[[], Sequence[Any]],
    avals: Sequence[jax.ShapeDtypeStruct],
    *,
    slice: VirtualSlice,  # noqa: A002 - as pw.compiled's keyword
    name: str = "input",
) -> list[Any]:
    """Inside a program trace: tracers of ``avals``, which the run fills with ``take()`` when it gets there.

    ``take`` runs on the dispatching thread, in dispatch order, and returns one placed array per
    aval (each with that aval's shape, dtype and sharding). Outside a trace it is an error.

    Example::

        def take():
            return [jax.device_put(np.ones(4, np.float32), s.sharding("d"))]

        @pw.program
        def f():
            (x,) = input_node(take, [jax.ShapeDtypeStruct((4,), jnp.float32, sharding=s.sharding("d"))], slice=s)
            return x * 2
    """
    scope = current_trace()
    if scope is None:
        raise TracingError(f"`input_node` ({name!r}) makes a node of a program being traced; call it inside one.")
    avals = tuple(avals)
    for a in avals:
        if a.sharding is None:
            raise TracingError(f"`input_node` ({name!r}): every value needs a sharding; {a} has none.")
    if len(scope.inputs) >= MAX_READS:
        raise TracingError(
            f"`input_node` ({name!r}): this program already reads {MAX_READS} batches while being traced; a "
            f"`for batch in batches` loop in a traced program never ends (the data's end is only known when it "
            f"runs). Bound it: `for _, batch in zip(range(n), batches)`, or `for _ in range(n): next(batches)`."
        )
    jit_name = f"input{_MARK}{next(_uids)}"

    def placeholder():  # traced only, never run: the run takes the values from ``take``
        return tuple(jnp.zeros(a.shape, a.dtype) for a in avals)

    placeholder.__name__ = jit_name
    scope.inputs[jit_name] = InputRead(name, slice, avals, take)
    out = jax.jit(placeholder, out_shardings=tuple(a.sharding for a in avals))()
    return list(out)


def input_read(jit_name: str) -> InputRead | None:
    """The `InputRead` an equation named ``jit_name`` stands for in the trace running on this thread."""
    if _MARK not in jit_name:
        return None
    scope = current_trace()
    return None if scope is None else scope.inputs.get(jit_name)


__all__ = ["InputRead", "input_node", "input_read"]

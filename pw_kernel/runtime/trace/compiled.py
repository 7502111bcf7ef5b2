"""CompiledFunction: a `jax.jit` pinned to a virtual slice, the unit of scheduling."""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from ..devices import VirtualSlice, check_spec_axes, has_explicit_axes
from ..errors import ArgumentError, SpecError

# The jit eqn in a jaxpr carries the function's __name__; a unique suffix maps
# it back to the CompiledFunction that made it (see tracing.py).
_MARK = "__pw"
_registry: weakref.WeakValueDictionary[str, CompiledFunction] = weakref.WeakValueDictionary()
_uids = itertools.count()


# The program trace running on each thread (see `trace_scope`).
_thread = threading.local()


# Collective ops in an optimized HLO module's text (their async forms end in -start).
_COLLECTIVE = re.compile(
    r"\b(?:all-reduce|all-gather|reduce-scatter|all-to-all|ragged-all-to-all|collective-permute|"
    r"collective-broadcast)(?:-start)?\("
)


def has_collectives(compiled: Any) -> bool:
    """Whether a `jax.stages.Compiled` executable holds collectives (its devices then wait for each other).

    Example::

        has_collectives(jax.jit(f).lower(x).compile())
    """
    try:
        text = compiled.as_text()
    except Exception:  # some backends cannot print their executables: assume none
        return False
    return bool(text) and _COLLECTIVE.search(text) is not None


def lookup(jit_name: str) -> CompiledFunction | None:
    """The CompiledFunction whose jit eqn is named ``jit_name``, if any."""
    if _MARK not in jit_name:
        return None
    scope = current_trace()
    if scope is not None and jit_name in scope.seen:
        return scope.seen[jit_name]
    return _registry.get(jit_name)


class TraceScope:
    """The compiled functions called while a program is being traced, held strongly until its graph is built.

    One created inside the traced function (a temporary) must not vanish from the registry
    before its jit equation is looked up.
    """

    def __init__(self):
        self.seen: dict[str, CompiledFunction] = {}
        self.inputs: dict[str, Any] = {}  # jit name -> feeds.InputRead: reads of data iterators (input nodes)

    def record(self, cf: CompiledFunction) -> None:
        self.seen[cf.jit_name] = cf

    def functions(self) -> tuple[CompiledFunction, ...]:
        """The compiled functions called so far, in order of first call."""
        return tuple(self.seen.values())


def current_trace() -> TraceScope | None:
    """The program trace running on this thread, or None."""
    return getattr(_thread, "scope", None)


def in_program_trace() -> bool:
    """Whether this thread is tracing a program now (a program called here becomes part of it)."""
    return getattr(_thread, "scope", None) is not None  # current_trace() inlined: every call asks


@contextlib.contextmanager
def trace_scope() -> Iterator[TraceScope]:
    """Trace a program on this thread: compiled functions called meanwhile are kept in the scope.

    A program traced inside another one shares the outer scope. Example::

        with trace_scope() as scope:
            jax.make_jaxpr(fn)(*args)
        [cf.name for cf in scope.functions()]
    """
    outer = current_trace()
    _thread.scope = TraceScope() if outer is None else outer
    try:
        yield _thread.scope
    finally:
        _thread.scope = outer


def _is_spec_leaf(x: Any) -> bool:
    return x is None or isinstance(x, PartitionSpec)


def specs_to_shardings(specs: Any, slice_: VirtualSlice, api: str, *, per_argument: bool = False) -> Any:
    """Turn a pytree (prefix) of PartitionSpecs into NamedShardings on the slice; None stays None.

    None leaves it to JAX, as for `jax.jit`: an argument keeps its own sharding (see
    `tracing._unspecified_input`), an output gets the one XLA propagates. With ``per_argument``
    (in_specs) a top-level list is one spec per positional argument, as `jax.jit` reads
    ``in_shardings``; otherwise (out_specs) a list keeps its structure.
    """

    def one(spec):
        if spec is None:
            return None
        if not isinstance(spec, PartitionSpec):
            raise SpecError(
                f"`{api}` expects PartitionSpecs (or None to leave it to JAX); got {spec!r} of type "
                f"{type(spec).__name__}. Write e.g. jax.sharding.PartitionSpec('data', None)."
            )
        check_spec_axes(spec, slice_, api)
        return NamedSharding(slice_.mesh, spec)

    if isinstance(specs, list) and per_argument:
        specs = tuple(specs)
    return jax.tree_util.tree_map(one, specs, is_leaf=_is_spec_leaf)


class CompiledFunction:
    """A JAX function compiled for one slice with known input and output shardings.

    Inside a `pw.program` a call becomes one node of the dataflow graph; called
    on its own it runs as a one-node program and returns a `pw.Future`.

    Example::

        s = pw.slice(2, mesh={"d": 2})
        double = pw.compiled(lambda x: x * 2, slice=s, in_specs=P("d"), out_specs=P("d"))
        double(jnp.arange(4.0)).result()   # [0., 2., 4., 6.]
    """

    def __init__(
        self,
        fn: Callable,
        *,
        slice: VirtualSlice,  # noqa: A002 - the public keyword is `slice`
        in_specs: Any = None,
        out_specs: Any = None,
        name: str | None = None,
        static_argnums: int | Sequence[int] | None = None,
        static_argnames: str | Sequence[str] | None = None,
        donate_argnums: int | Sequence[int] | None = None,
        donate_argnames: str | Sequence[str] | None = None,
    ):
        if not callable(fn):
            raise ArgumentError(f"`pw.compiled` needs a callable; got {fn!r} of type {type(fn).__name__}.")
        if not isinstance(slice, VirtualSlice):
            raise ArgumentError(
                f"`pw.compiled(slice=...)` needs a VirtualSlice from `pw.slice(n, ...)`; got {slice!r}."
            )
        slice.check_live("pw.compiled")
        self.fn = fn
        self.slice = slice
        self.name = name or getattr(fn, "__name__", None) or "compiled"
        if self.name == "<lambda>":
            self.name = "lambda"
        self.in_specs = in_specs
        self.out_specs = out_specs
        self.in_shardings = specs_to_shardings(in_specs, slice, "pw.compiled(in_specs=...)", per_argument=True)
        self.out_shardings = specs_to_shardings(out_specs, slice, "pw.compiled(out_specs=...)")
        self.uid = next(_uids)
        # Explicit mesh axes put shardings in the types: a traced argument must carry the sharding the
        # function is compiled for (jit does not convert it), so it is resharded on the way in.
        self._explicit = has_explicit_axes(slice.mesh)

        @functools.wraps(fn)
        def body(*args, **kwargs):
            return fn(*args, **kwargs)

        body.__name__ = f"{_safe(self.name)}{_MARK}{self.uid}"
        self.jit_name = body.__name__
        # Static arguments as jax.jit has them: Python values baked into the trace (a program's
        # constants, part of its trace-cache key); in_specs then cover the other arguments only.
        self.static_argnums = _as_tuple(static_argnums, int, "static_argnums")
        self.static_argnames = _as_tuple(static_argnames, str, "static_argnames")
        kw = {k: v for k, v in (("in_shardings", self.in_shardings), ("out_shardings", self.out_shardings)) if v is not None}
        if self.static_argnums:
            kw["static_argnums"] = self.static_argnums
        if self.static_argnames:
            kw["static_argnames"] = self.static_argnames
        # Donation as jax.jit has it: JAX records which flat arguments are donated in the call's
        # equation (donated_invars); the tracer donates them where nothing reads them later.
        self.donate_argnums = _as_tuple(donate_argnums, int, "donate_argnums")
        self.donate_argnames = _as_tuple(donate_argnames, str, "donate_argnames")
        if self.donate_argnums:
            kw["donate_argnums"] = self.donate_argnums
        if self.donate_argnames:
            kw["donate_argnames"] = self.donate_argnames
        self.jitted = jax.jit(body, **kw)
        _registry[self.jit_name] = self
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args, **kwargs):
        """Inside a program being traced: one node of it. (`pw.compiled`'s functions also run alone: `Compiled`.)"""
        if in_program_trace() or any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs))):
            scope = current_trace()
            if scope is not None:
                scope.record(self)
            if not self._explicit:  # no context mesh to set (`VirtualSlice.tracing_mesh`): the loop's fast path
                return self.jitted(*args, **kwargs)  # being traced inside a program: one node
            if not kwargs:
                args = _reshard(args, self.in_shardings, self.static_argnums)
            with self.slice.tracing_mesh():
                return self.jitted(*args, **kwargs)
        raise ArgumentError(
            f"`CompiledFunction {self.name!r}` was called outside a program, but it was built directly rather "
            f"than with `pw.compiled(...)`, so it has no program to run in. Build it with `pw.compiled`, or "
            f"call it inside a `@pw.program`."
        )

    def __repr__(self) -> str:
        return f"CompiledFunction({self.name!r}, slice={self.slice.name!r}, in_specs={self.in_specs}, out_specs={self.out_specs})"


# type -> 1: a concrete jax.Array, 2: a pw Future (it has `resolved_value`), 0: anything else (tracers,
# numpy, Python values: the full way)
_CONCRETE: dict[type, int] = {}


def array_signature(args: tuple) -> tuple[tuple, tuple] | None:
    """(key, arrays) for positional arguments that are all concrete jax Arrays, else None.

    The key is each argument's (shape, dtype, sharding), as a program's signature keys arrays.
    A future already resolved to an array counts as that array, and ``arrays`` has it in its
    place (a loop feeding each call the last one's future, finished by the next call). A future
    resolved to an array that stays on a remote island stays a future, keyed as the full way
    keys it (with its slice); one still pending, failed or donated takes the full way.
    """
    key = []
    arrays = args
    for i, a in enumerate(args):
        t = type(a)
        kind = _CONCRETE.get(t)
        if kind is None:
            kind = _CONCRETE[t] = (
                1 if issubclass(t, jax.Array) and not issubclass(t, jax.core.Tracer)
                else 2 if hasattr(t, "resolved_value") else 0
            )
        if kind == 2:
            v = a.resolved_value()
            if _CONCRETE.get(type(v)) != 1:
                remote = a.remote_key() if v is None else None
                if remote is not None:  # (read where it lives, by handle)
                    key.append(remote)
                    continue
                return None
            a = v
            if arrays is args:
                arrays = list(args)
            arrays[i] = a
        elif not kind:
            return None
        key.append((a.shape, a.dtype, a.sharding))
    return tuple(key), (args if arrays is args else tuple(arrays))


def _reshard(args: tuple, shardings: Any, static: tuple[int, ...] = ()) -> tuple:
    """``args`` resharded to ``shardings`` (a pytree prefix of them; None leaves what it covers alone).

    The positions in ``static`` are static arguments: left as they are and, as in jax.jit's
    in_shardings, not counted by ``shardings``.
    """
    if shardings is None:
        return args
    static = {i % len(args) for i in static}
    dynamic = [i for i in range(len(args)) if i not in static]
    if not isinstance(shardings, tuple):
        shardings = (shardings,) * len(dynamic)

    def one(sh, sub):
        if not isinstance(sh, NamedSharding):
            return sub
        return jax.tree_util.tree_map(lambda x: jax.sharding.reshard(x, sh), sub)

    out = list(args)
    for sh, i in zip(shardings, dynamic):
        if sh is not None:
            out[i] = jax.tree_util.tree_map(one, sh, args[i], is_leaf=lambda x: x is None or isinstance(x, NamedSharding))
    return tuple(out)


def _as_tuple(value: Any, kind: type, what: str) -> tuple:
    """``static_argnums=1`` or ``(0, 2)`` as a tuple, as jax.jit takes them; a clear error otherwise."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, kind) else value
    try:
        items = tuple(items)
    except TypeError:
        items = (value,)
    if not all(isinstance(v, kind) for v in items):
        raise ArgumentError(f"`pw.compiled({what}=...)` takes {kind.__name__}s, as jax.jit does; got {value!r}.")
    return items


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "fn"

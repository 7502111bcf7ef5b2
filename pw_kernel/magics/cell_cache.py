"""A `%%pathways` cell run again unchanged reuses its trace and plan, as a `@pw.program` called again does.

What a cell's trace depends on, and so what its key holds:

- the cell's text and its `%%pathways` options;
- the signature of every traced input (shapes, dtypes, shardings): the cell's `Program`
  keeps one graph per signature, so inputs of another shape trace again;
- every other name the cell reads (compiled functions, programs, helpers, ints, slices, data
  feeds), keyed by value or identity (`value_key`), and through a helper function the globals,
  defaults and closure cells its code reads, so a changed global used anywhere is seen;
- the notebook namespace, the controller and its live slices.

A value whose changes cannot be seen (an instance of a user class with mutable fields, a
large numpy array baked as a constant) makes the cell uncacheable: it is traced every time,
as before. Python in the cell (``print``, numpy random numbers) runs when the cell is traced,
not when a trace is reused: the same as a `@pw.program`.
"""

from __future__ import annotations

import builtins
import collections
import copy
import dataclasses
import functools
import sysconfig
import types
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec, Sharding

from ..runtime import Future, Program
from .errors import Uncacheable

#: Cells remembered per notebook (least recently run forgotten first).
MAX_CELLS = 32
#: Values walked for one cell's key; a cell that reads more (a big list of constants) is traced every time.
MAX_VALUES = 20_000
#: Bytes of a numpy array read as a constant (not a traced input) that are compared by content.
MAX_NUMPY_BYTES = 1 << 20

_PLAIN = (type(None), bool, int, str, bytes, type(Ellipsis), type(NotImplemented))
_BY_IDENTITY = (
    types.ModuleType, type, types.BuiltinFunctionType, types.BuiltinMethodType, types.CodeType,
    jax.Array, Future,
)
_ABSENT = ("absent",)
#: Where installed code lives: a function from there is keyed by identity and closure, not by the globals it reads.
_PATHS = sysconfig.get_paths()
_LIBRARY_DIRS = tuple(dict.fromkeys(_PATHS[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if _PATHS.get(k)))
#: A class's own entries that say nothing about what its methods compute.
_CLASS_PLUMBING = frozenset({"__dict__", "__weakref__", "__module__", "__doc__", "__qualname__", "__annotations__",
                             "__firstlineno__", "__static_attributes__", "__slotnames__"})


class Same:
    """An object compared by identity (a key part that keeps it alive, so its id is never reused)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __repr__(self) -> str:
        return f"Same({type(self.obj).__name__} at {id(self.obj):#x})"


class _Walk:
    """One key computation: a budget of values and the functions already entered (recursion)."""

    def __init__(self) -> None:
        self.left = MAX_VALUES
        self.functions: set[int] = set()

    def key(self, v: Any) -> Any:
        self.left -= 1
        if self.left < 0:
            raise Uncacheable(f"the cell reads more than {MAX_VALUES} values")
        t = type(v)
        if t in _PLAIN:
            return (t, v)
        if t is float or t is complex:
            return (t, repr(v))  # 0.0 and -0.0 are equal but bake different constants
        if isinstance(v, (tuple, list)):
            return (t, tuple(self.key(x) for x in v))
        if isinstance(v, dict):
            return (t, tuple((self.key(k), self.key(x)) for k, x in v.items()))
        if isinstance(v, (set, frozenset)):
            return (t, frozenset(self.key(x) for x in v))
        if isinstance(v, np.ndarray):
            if v.dtype.hasobject:
                raise Uncacheable("a numpy array of Python objects is read as a constant")
            if v.nbytes > MAX_NUMPY_BYTES:
                raise Uncacheable(f"a numpy array of {v.nbytes} bytes is read as a constant")
            return (np.ndarray, v.shape, v.dtype.str, v.tobytes())
        if isinstance(v, np.generic):
            return (t, v.tobytes())
        if isinstance(v, type) and v.__module__ == "__main__":
            return self.user_class(v)
        if isinstance(v, _BY_IDENTITY):
            return Same(v)
        if isinstance(v, Program):  # inlined when called in a trace: its Python runs then
            return ("program", Same(v), self.key(v.fn))
        if isinstance(v, types.FunctionType):
            return self.function(v)
        if isinstance(v, types.MethodType):
            return ("method", self.key(v.__func__), self.key(v.__self__))
        if isinstance(v, (staticmethod, classmethod)):
            return (t, self.key(v.__func__))
        if isinstance(v, property):
            return (t, self.key(v.fget), self.key(v.fset), self.key(v.fdel))
        if callable(v) and hasattr(v, "lower") and hasattr(v, "__wrapped__"):  # a `jax.jit` of a Python function
            return ("jit", Same(v), self.key(v.__wrapped__))
        if isinstance(v, functools.partial):
            return ("partial", self.key(v.func), self.key(v.args), self.key(v.keywords))
        if isinstance(v, (PartitionSpec, Sharding, Mesh, np.dtype)):
            return (t, v)  # immutable, compared by value
        if t.__module__.startswith("pw_kernel."):
            return Same(v)  # compiled functions, slices, pipelines, data feeds: fixed once made
        if dataclasses.is_dataclass(v) and t.__dataclass_params__.frozen:
            return (t, tuple(self.key(getattr(v, f.name)) for f in dataclasses.fields(v)))
        if isinstance(v, types.SimpleNamespace):
            return (t, self.key(vars(v)))
        raise Uncacheable(f"a {t.__module__}.{t.__qualname__} may change without the cell seeing it")

    def function(self, fn: types.FunctionType) -> Any:
        """A Python function by identity, with what its code reads: globals, defaults, closure cells."""
        if id(fn) in self.functions:
            return ("fn", Same(fn))  # recursion: its parts are in the key already
        self.functions.add(id(fn))
        glob = fn.__globals__
        if fn.__code__.co_filename.startswith(_LIBRARY_DIRS):  # an installed library's globals are its own
            reads: tuple = ()
        else:
            reads = tuple((n, self.key(glob[n]) if n in glob else _ABSENT) for n in global_names(fn.__code__))
        cells = tuple(self.key(c.cell_contents) if _filled(c) else _ABSENT for c in fn.__closure__ or ())
        return ("fn", Same(fn), Same(fn.__code__), reads, self.key(fn.__defaults__), self.key(fn.__kwdefaults__), cells)

    def user_class(self, cls: type) -> Any:
        """A class defined in the notebook: its methods and class attributes (a method may read a changed global)."""
        if id(cls) in self.functions:
            return ("class", Same(cls))
        self.functions.add(id(cls))
        attrs = tuple((n, self.key(a)) for n, a in vars(cls).items() if n not in _CLASS_PLUMBING)
        return ("class", Same(cls), tuple(self.key(b) for b in cls.__bases__), attrs)


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=1024)
def global_names(code: types.CodeType) -> tuple[str, ...]:
    """Names a code object (and the functions and comprehensions inside it) may read as globals."""
    names = dict.fromkeys(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names.update(dict.fromkeys(global_names(c)))
    return tuple(names)


def value_key(v: Any) -> Any:
    """A key that is equal for two values when a trace reading either one would be the same.

    Plain data by value (numbers, strings, containers of them, small numpy arrays); immutable
    objects (jax arrays, futures, modules, compiled functions, slices) by identity; functions by
    identity and what they read. Raises `Uncacheable` for anything else. Example::

        value_key({"lr": 0.1}) == value_key({"lr": 0.1})   # True
        value_key({"lr": 0.1}) == value_key({"lr": 0.2})   # False
    """
    return _Walk().key(v)


def rebindable(values: dict[str, Any]) -> bool:
    """Whether a reused trace may bind the cell's plain Python values again (each one `value_key` accepts).

    An object of a user class the cell made while traced could have been changed since: a
    cell that binds one is traced every time, so each run binds a new one.
    """
    try:
        for v in values.values():
            value_key(v)
    except Uncacheable:
        return False
    return True


def fresh(v: Any) -> Any:
    """``v`` as a new run of the cell would bind it: a list, dict, set or numpy array it made is a new copy."""
    if isinstance(v, (list, dict, set, np.ndarray)):
        try:
            return copy.deepcopy(v)
        except Exception:  # noqa: BLE001 - something inside cannot be copied: the same object, as before
            return v
    return v


@dataclasses.dataclass(eq=False)
class CellTrace:
    """What a cell's first run made, for the next run of the same text to reuse."""

    key: Any  # what the trace depends on besides the traced inputs' signatures (see the module docstring)
    program: Program  # its graphs (one per input signature) and their plans
    params: list[str]  # the traced inputs' names, in the program's argument order
    filename: str  # the cell's code as compiled the first time (the graph's source lines point there)
    python_values: dict[str, Any]  # names the cell binds to plain Python values, filled in by each trace
    reads: list[str]  # names the cell reads before assigning them (the key's parts)
    traces: int = 0  # how many times the cell was traced (once per input signature)
    # graph -> copies of the plain Python values its trace made: what a run reusing that graph binds (copied again)
    bound: dict[Any, dict[str, Any]] = dataclasses.field(default_factory=dict)


class CellCache:
    """The last trace of each cell text this notebook ran, reused while its key holds."""

    def __init__(self) -> None:
        self._cells: collections.OrderedDict[tuple[str, str], CellTrace] = collections.OrderedDict()

    def key(self, reads: list[str], params: list[str], ns: dict, controller: Any) -> Any:
        """The cell's key in ``ns`` (None: uncacheable). ``reads``: the names the cell reads before assigning."""
        walk = _Walk()
        parts = []
        try:
            for name in reads:
                if name in params:
                    continue  # traced: its signature is the program's own cache key
                if name in ns:
                    parts.append((name, walk.key(ns[name])))
                else:
                    parts.append((name, Same(getattr(builtins, name, None))))
        except Uncacheable:
            return None
        slices = tuple(Same(s) for s in controller.resources.slices)
        return (Same(ns), Same(controller), slices, tuple(params), tuple(parts))

    def get(self, line: str, cell: str) -> CellTrace | None:
        hit = self._cells.get((line, cell))
        if hit is not None:
            self._cells.move_to_end((line, cell))
        return hit

    def put(self, line: str, cell: str, entry: CellTrace | None) -> None:
        """Remember ``entry`` for this text (None: forget the text's trace)."""
        self._cells.pop((line, cell), None)
        for text, old in list(self._cells.items()):  # a new controller (`pw.init`): earlier traces are of no use
            if entry is not None and old.key[1] != entry.key[1]:
                del self._cells[text]
        if entry is not None:
            self._cells[(line, cell)] = entry
            while len(self._cells) > MAX_CELLS:
                self._cells.popitem(last=False)

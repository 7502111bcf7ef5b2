"""Trace a Python function into a ProgramGraph with JAX's own tracing.

`jax.make_jaxpr` turns the function into a jaxpr in which every call of a
`pw.compiled` function is a nested ``jit`` equation carrying its shardings.
Those become compute nodes on their slice; runs of other equations between
them become glue nodes on the slice of their inputs; values that must move
between slices (or be resharded) get explicit transfer nodes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import Literal
from jax.sharding import NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding

from ..devices import ResourceManager, VirtualSlice, has_explicit_axes
from ..errors import ArgumentError, PathwaysError, SpecError, TracingError
from .compiled import CompiledFunction, TraceScope, lookup, trace_scope
from .feeds import InputRead, input_read
from .executables import calls_host, executable_with_chosen_outputs, glue_key, jaxpr_key, literal_key, node_executable
from .graph import Node, ProgramGraph, Value, as_dtype
from .jax_errors import UNTRACEABLE, JaxErrorKind, classify
from .signatures import abstract_leaf, home_slice, is_traced_leaf, signature
from .sources import fmt_exc_source, fmt_sources, is_runtime

def _user_frames(frames) -> tuple[tuple[str, int], ...]:
    return tuple((f, line) for f, line in frames if not is_runtime(f))


def _eqn_stack(eqn) -> tuple[tuple[str, int], ...]:
    """Every user frame (innermost first) of the code that made an equation."""
    tb = getattr(eqn.source_info, "traceback", None)
    if tb is None:
        return ()
    # Where a loop calls one function, each call's frames are at the same code and offsets. Keyed by the
    # code objects' ids (equal code in two cells compares equal but has another filename), kept alive below.
    codes, offsets = tb.raw_frames()
    key = (tuple(map(id, codes)), tuple(offsets))
    hit = _STACKS.get(key)
    if hit is not None:
        return hit[1]
    stack = _user_frames((f.file_name, f.line_num) for f in tb.frames)
    if len(_STACKS) >= 4096:
        _STACKS.clear()
    _STACKS[key] = (codes, stack)
    return stack


#: Traceback (code object ids, instruction offsets) -> (the code objects, so their ids stay unique; user frames).
_STACKS: dict[tuple, tuple[list, tuple[tuple[str, int], ...]]] = {}


def _eqn_source(eqn) -> tuple[str, int] | None:
    stack = _eqn_stack(eqn)
    return stack[0] if stack else None


def _fmt_source(src: tuple[str, int] | None) -> str:
    """An equation's source line, as an error's ``at ...`` line ("" if unknown)."""
    return fmt_sources((src,)) if src is not None else ""


def context_mesh_hint(slices: Sequence[VirtualSlice | None]) -> str:
    """Why code under `jax.set_mesh` may fail on a slice with another mesh, and what to do; or ""."""
    ctx = jax.sharding.get_abstract_mesh()
    if ctx.empty:
        return ""
    other = list(dict.fromkeys(s for s in slices if s is not None and s.mesh.abstract_mesh != ctx))
    if not other:
        return ""
    names = ", ".join(f"{s.name!r} {_mesh_str(s.mesh)}" for s in other)
    return (
        f"\nThis code runs under `jax.set_mesh` with the mesh {_mesh_str(ctx)}, but it runs on slice(s) {names}: "
        f"code written for the context mesh (`shard_map` without `mesh=`, bare PartitionSpecs, Explicit axes) "
        f"sees another mesh than its arrays'. Make the slice from the context mesh, `pw.slice(mesh=m)`, or "
        f"call the program outside the `jax.set_mesh` block (`jax.set_mesh(None)` clears a mesh set for the "
        f"whole notebook)."
    )


def _mesh_str(mesh) -> str:
    axes = ", ".join(f"{a}: {n}" for a, n in mesh.shape.items())
    types = ", ".join(str(t).split(".")[-1] for t in mesh.axis_types)
    return f"({axes}; {types})"


def _adopt_mesh(resources: ResourceManager, sharding: Sharding) -> VirtualSlice | None:
    """The slice made for a program input's own mesh (`pw.slice(mesh=...)`), when one island holds it."""
    mesh = getattr(sharding, "mesh", None)
    if not isinstance(sharding, NamedSharding) or not isinstance(mesh, jax.sharding.Mesh) or mesh.size < 2:
        return None  # a single device or no mesh: the input is moved where it is read, as before
    try:
        return resources.allocate(None, mesh=mesh)
    except PathwaysError:  # spread over islands: it is moved where it is read
        return None


def _unspecified_input(val: Value, s: VirtualSlice) -> Sharding:
    """Where an argument with no in_spec goes: as `jax.jit` without in_shardings, its own sharding
    when it lives on the slice; else the same PartitionSpec on the slice where its axes exist
    there (from another slice), else replicated (a host value, or axes the slice lacks)."""
    if val.slice is s and isinstance(val.sharding, Sharding) and val.sharding.device_set == set(s.devices):
        return val.sharding
    return _map_sharding(val.sharding, val.shape, s)


def _trace_aval(a: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """What the program's jaxpr is traced on for input ``a``: without its sharding where it is one copy
    everywhere (one device, or replicated over a mesh with no Explicit axes), so that a loop's first call, on fresh
    arrays, and its later ones, on the outputs (replicated on the slice's mesh), trace one program. (JAX types
    a value on a mesh, and a gradient's constants are then resharded to it: the two traces differed, and each
    compiled.) A split value keeps its sharding: JAX derives the specs of what is computed from it (trailing
    Nones included). Where a value goes is pw's to decide, from its own sharding (`add_inputs`)."""
    sh = a.sharding
    if sh is None or not sh.is_fully_replicated:
        return a
    if isinstance(sh, SingleDeviceSharding) or (isinstance(sh, NamedSharding) and not has_explicit_axes(sh.mesh)):
        return jax.ShapeDtypeStruct(a.shape, a.dtype)
    return a


def _check_divisible(shape, sharding: Sharding, what: str | Callable[[], str]) -> None:
    """A clear error where ``sharding`` does not split ``shape`` evenly; ``what`` (or ``what()``) names the value."""
    if not isinstance(sharding, NamedSharding):
        return
    spec = sharding.spec
    if not any(spec) and len(spec) <= len(shape):  # replicated: nothing to divide (the common case, checked fast)
        return
    key = (tuple(shape), sharding)
    if key in _DIVIDES:
        return
    if callable(what):
        what = what()
    if len(spec) > len(shape):
        raise SpecError(
            f"{what}: PartitionSpec {spec} has {len(spec)} entries but the value has shape {tuple(shape)} "
            f"(rank {len(shape)}). Give at most {len(shape)} entries."
        )
    for dim, entry in enumerate(spec):
        if entry is None:
            continue
        axes = entry if isinstance(entry, tuple) else (entry,)
        size = math.prod(sharding.mesh.shape[a] for a in axes)
        if shape[dim] % size:
            raise SpecError(
                f"{what}: dimension {dim} of shape {tuple(shape)} is {shape[dim]}, which does not divide "
                f"evenly over mesh axes {axes} of size {size} (PartitionSpec {spec}). Use a size that is a "
                f"multiple of {size}, or replicate that dimension with None."
            )
    if len(_DIVIDES) >= 4096:
        _DIVIDES.clear()
    _DIVIDES.add(key)


#: (shape, sharding) pairs that divide evenly: a loop places the same values each step.
_DIVIDES: set[tuple] = set()


def _map_sharding(sharding: Sharding | None, shape, target: VirtualSlice) -> NamedSharding:
    """The same PartitionSpec on ``target``'s mesh when it fits there, else replicated."""
    if isinstance(sharding, NamedSharding):
        spec = sharding.spec
        names = set(target.axis_names)
        try:
            axes_ok = all(
                a is None or all(x in names for x in (a if isinstance(a, tuple) else (a,))) for a in spec
            )
            if axes_ok:
                candidate = NamedSharding(target.mesh, spec)
                _check_divisible(shape, candidate, "")
                return candidate
        except SpecError:
            pass
    return NamedSharding(target.mesh, PartitionSpec())


def _same_placement(have: Sharding | None, want: Sharding, ndim: int) -> bool:
    if have is None:
        return False
    if have is want or have == want:
        return True
    try:
        return have.is_equivalent_to(want, ndim)
    except Exception:  # different device sets or incomparable kinds
        return False


@dataclasses.dataclass
class _Builder:
    name: str
    resources: ResourceManager
    default_slice: VirtualSlice | None
    nodes: list[Node] = dataclasses.field(default_factory=list)
    values: list[Value] = dataclasses.field(default_factory=list)
    var_value: dict[Any, int] = dataclasses.field(default_factory=dict)
    transfers: dict[int, list[tuple[Sharding, int]]] = dataclasses.field(default_factory=dict)
    name_counts: dict[str, int] = dataclasses.field(default_factory=dict)

    def new_value(self, aval_shape, dtype, sharding, origin, producer=None, slice_=None) -> int:
        if slice_ is None and sharding is not None:
            slice_ = self.slice_of(sharding)
        v = Value(len(self.values), tuple(aval_shape), as_dtype(dtype), sharding, origin, producer, slice_)
        self.values.append(v)
        return v.id

    def slice_of(self, sharding: Sharding) -> VirtualSlice | None:
        return home_slice(self.resources, sharding)

    def unique(self, name: str) -> str:
        k = self.name_counts.get(name, 0)
        self.name_counts[name] = k + 1
        return name if k == 0 else f"{name}:{k}"

    def add_node(self, **kw) -> Node:
        node = Node(id=len(self.nodes), **kw)
        self.nodes.append(node)
        return node

    def placed(self, vid: int, want: Sharding, slice_: VirtualSlice, source) -> int:
        """Value ``vid`` with sharding ``want`` on ``slice_``: itself, or a (cached) transfer of it."""
        v = self.values[vid]
        # On a remote island, stand-in devices are shared with local ones: placement is also the slice.
        same_home = v.slice is slice_ or (
            (v.slice is None or v.slice.island.remote is None) and slice_.island.remote is None
        )
        if same_home and _same_placement(v.sharding, want, len(v.shape)):
            return vid
        for have, tid in self.transfers.get(vid, ()):
            if self.values[tid].slice is slice_ and _same_placement(have, want, len(v.shape)):
                return tid
        src = v.slice
        if src is not None:
            src_name = src.name
        elif v.sharding is None:
            src_name = "host"
        else:
            src_name = "dev" + ",".join(str(d.id) for d in sorted(v.sharding.device_set, key=lambda d: d.id))
        out = self.new_value(v.shape, v.dtype, want, "node", producer=len(self.nodes), slice_=slice_)

        def transfer(x, _want=want):
            return [jax.device_put(x, _want)]

        label = "reshard" if src is slice_ else "transfer"
        self.add_node(
            name=self.unique(f"{label} {src_name}->{slice_.name}"),
            kind="transfer",
            slice=slice_,
            src_slice=src,
            inputs=(vid,),
            outputs=(out,),
            fn=transfer,
            source=source,
        )
        self.transfers.setdefault(vid, []).append((want, out))
        return out

    def read(self, var) -> int:
        return self.var_value[var]


def trace_program(
    fn: Callable,
    args: tuple,
    kwargs: dict,
    *,
    name: str,
    resources: ResourceManager,
    default_slice: VirtualSlice | None = None,
    keep: tuple[int, ...] = (),
) -> ProgramGraph:
    """Trace ``fn(*args, **kwargs)`` into a ProgramGraph; see the module docstring.

    ``keep``: positions among the traced inputs that must not be donated (pw still reads them elsewhere).
    """
    with trace_scope() as scope:
        return _Tracer(fn, args, kwargs, name, scope, _Builder(name, resources, default_slice), keep).trace()


class _Tracer:
    """One trace of a program, phase by phase: the jaxpr, its inputs, its equations as nodes, its outputs."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict, name: str, scope: TraceScope, builder: _Builder, keep=()):
        self.fn = fn
        self.keep = tuple(keep)
        self.keep_values: set[int] = set()
        self.name = name
        self.scope = scope
        self.b = builder
        self.treedef, self.leaves, _, _ = signature(args, kwargs)
        self.traced_idx = [i for i, x in enumerate(self.leaves) if is_traced_leaf(x)]
        self.abstract = [abstract_leaf(self.leaves[i]) for i in self.traced_idx]
        self.out_tree: Any = None
        self.consts: dict[int, Any] = {}
        self.last_use: dict[Any, int] = {}
        self.glue: list[tuple[int, Any]] = []  # (index, equation) of the glue group being collected
        self.glue_slice: VirtualSlice | None = None
        # (jaxpr, function, arguments' pattern and placements) -> (input shardings, executable, output shardings)
        self.templates: dict[tuple, tuple[list, Any, list, bool]] = {}  # (+ whether it calls back into Python)

    def trace(self) -> ProgramGraph:
        closed = self.make_jaxpr()
        jaxpr = closed.jaxpr
        inputs = self.add_inputs(jaxpr.invars)
        self.keep_values = {inputs[i] for i in self.keep if i < len(inputs)}
        self.jaxpr = jaxpr
        self.add_consts(jaxpr.constvars, closed.consts)
        self.choose_default_slice(jaxpr.eqns)
        self.walk(jaxpr)
        outputs = self.place_outputs(jaxpr.outvars)
        b = self.b
        return ProgramGraph(
            name=self.name,
            nodes=b.nodes,
            values=b.values,
            inputs=inputs,
            outputs=outputs,
            out_tree=self.out_tree,
            consts=self.consts,
            jaxpr=closed,
            default_slice=b.default_slice,
        )

    # ------------------------------------------------------------------ the jaxpr
    def call_flat(self, *traced):
        """The program's function of its traced leaves, returning flat outputs.

        Its frame is the one that calls the user's function (`names.returned_expr` looks for it there).
        """
        full = list(self.leaves)
        for i, t in zip(self.traced_idx, traced):
            full[i] = t
        a, k = jax.tree_util.tree_unflatten(self.treedef, full)
        out = self.fn(*a, **k)
        flat, self.out_tree = jax.tree_util.tree_flatten(out)
        return flat

    def make_jaxpr(self) -> Any:
        """JAX's ClosedJaxpr of the program; JAX's errors become pw's (see `jax_errors`)."""
        try:
            return jax.make_jaxpr(self.call_flat)(*map(_trace_aval, self.abstract))
        except PathwaysError:  # already says what is wrong and what to do
            raise
        except Exception as e:
            kind = classify(e)
            if kind is not None and not kind.quotes_jax:
                raise kind.error(e, self.api, fmt_exc_source(e)) from None
            raise self.untraceable(e, kind) from e

    @property
    def api(self) -> str:
        return f"`pw.program` {self.name!r}"

    def untraceable(self, e: Exception, kind: JaxErrorKind | None) -> PathwaysError:
        """JAX's error quoted whole, with its entry's hint if any, and why a context mesh may be the cause."""
        where = fmt_exc_source(e)
        mesh_hint = context_mesh_hint([*(cf.slice for cf in self.scope.functions()), self.b.default_slice])
        if kind is not None:
            return kind.becomes(kind.message(e, self.api, where) + mesh_hint)
        head = UNTRACEABLE.format(api=self.api, error_type=type(e).__name__, error=e)
        return TracingError(f"{head}{where}{mesh_hint}")

    # ------------------------------------------------------------------ inputs and constants
    def add_inputs(self, invars: Sequence[Any]) -> tuple[int, ...]:
        """A value per traced input, on the slice it lives on."""
        b = self.b
        ids = []
        for var, a, i in zip(invars, self.abstract, self.traced_idx):
            home = getattr(self.leaves[i], "slice", None)  # a future knows the slice it lives on
            if not isinstance(home, VirtualSlice):
                home = b.slice_of(a.sharding) if a.sharding is not None else None
                if home is None:  # an array on a mesh of the notebook's own that no slice covers: adopt it
                    home = _adopt_mesh(b.resources, a.sharding)
            vid = b.new_value(a.shape, a.dtype, a.sharding, "input", slice_=home)
            b.var_value[var] = vid
            ids.append(vid)
        return tuple(ids)

    def add_consts(self, constvars: Sequence[Any], consts: Sequence[Any]) -> None:
        b = self.b
        for var, c in zip(constvars, consts):
            sh = c.sharding if isinstance(c, jax.Array) else None
            vid = b.new_value(np.shape(c), np.asarray(c).dtype if sh is None else c.dtype, sh, "const")
            b.var_value[var] = vid
            self.consts[vid] = c

    def choose_default_slice(self, eqns: Sequence[Any]) -> None:
        """Where glue that reads no device value goes: the program's slice, else the first compute slice."""
        if self.b.default_slice is not None:
            return
        for eqn in eqns:
            cf = lookup(str(eqn.params.get("name", "")))
            if cf is not None:
                self.b.default_slice = cf.slice
                return

    # ------------------------------------------------------------------ equations into nodes
    def walk(self, jaxpr: Any) -> None:
        """Each `pw.compiled` call becomes a compute node; the equations between them, glue nodes."""
        self.last_use = _last_uses(jaxpr)
        taken = 0
        for k, eqn in enumerate(jaxpr.eqns):
            is_jit = "jit" in eqn.primitive.name
            cf = lookup(str(eqn.params.get("name", ""))) if is_jit else None
            read = input_read(str(eqn.params.get("name", ""))) if is_jit and cf is None else None
            if read is not None:
                self.flush_glue()
                self.add_input(eqn, read)
                taken += 1
            elif cf is None:
                self.collect_glue(k, eqn)
            else:
                self.flush_glue()
                self.add_compute(eqn, cf, k)
        self.flush_glue()
        if taken != len(self.scope.inputs):  # a read inside a compiled function or a jax loop would run its placeholder
            raise TracingError(
                f"{self.api} reads a data iterator (`next(...)` of a `pw.prefetch`) inside a `pw.compiled` "
                f"function, a `jax.jit` or a jax loop, where a batch cannot be taken as the run goes. Read it in "
                f"the program's own body (a Python `for` loop) and pass the batch to the compiled function."
            )

    def collect_glue(self, k: int, eqn: Any) -> None:
        """Add ``eqn`` to the glue group being collected; a group on another slice is made a node first."""
        s = self.glue_slice_of(eqn)
        s.check_live(f"pw.program {self.name!r}")
        if self.glue and self.glue_slice is not s:
            self.flush_glue()
        self.glue_slice = s
        self.glue.append((k, eqn))

    def glue_slice_of(self, eqn: Any) -> VirtualSlice:
        """Where a glue equation runs: on its first input that lives on a slice, else the group's or the program's."""
        b = self.b
        s = None
        for v in eqn.invars:
            if isinstance(v, Literal):
                continue
            if v in b.var_value:
                s = b.values[b.var_value[v]].slice
            elif self.glue:  # produced earlier in the glue group being collected
                s = self.glue_slice
            if s is not None:
                return s
        s = self.glue_slice if self.glue else b.default_slice
        if s is None:
            raise TracingError(
                f"{self.api}: the jnp operation `{eqn.primitive.name}` reads no array that lives "
                f"on a slice, and the program calls no `pw.compiled` function, so there is nowhere to run it."
                f"{_fmt_source(_eqn_source(eqn))}\nPass a slice: `@pw.program(slice=s)`, or call a "
                f"`pw.compiled` function."
            )
        return s

    def flush_glue(self) -> None:
        """The glue group collected so far as one node on its slice, its inputs moved there."""
        if not self.glue:
            return
        b, s = self.b, self.glue_slice
        eqns = [e for _, e in self.glue]
        invars, outvars = _glue_vars(eqns, self.last_use, self.glue[-1][0])
        source = _eqn_source(eqns[0])
        in_ids, in_sh = [], []
        for v in invars:
            val = b.values[b.read(v)]
            want = val.sharding if val.slice is s else _map_sharding(val.sharding, val.shape, s)
            in_ids.append(b.placed(val.id, want, s, source))
            in_sh.append(want)
        fn, out_sh = _glue_executable(eqns, invars, outvars, in_sh, s)
        prims = tuple(dict.fromkeys(e.primitive.name for e in eqns))
        label = ",".join(prims[:3]) + (",…" if len(prims) > 3 else "")
        self.add_node("glue", f"glue[{label}]", s, eqns, in_ids, outvars, out_sh, fn, primitives=prims)
        self.glue.clear()

    def add_input(self, eqn: Any, read: InputRead) -> None:
        """A read of a data feed as an input node: at run time it takes the next batch, placed as traced."""
        s = read.slice
        s.check_live(f"pw.program {self.name!r}")
        if s.remote:
            raise TracingError(
                f"{self.api} reads {read.name!r} inside the program, but its batches go to slice {s.name!r} on a "
                f"remote island, where a program cannot take them as it runs yet. Iterate it outside the program "
                f"(`for x, y in batches: pipe.step(state, x, y)`), which places them there directly."
            )
        b = self.b
        node_id = len(b.nodes)
        out_ids = [b.new_value(a.shape, a.dtype, a.sharding, "node", node_id, b.slice_of(a.sharding) or s) for a in read.avals]
        take = read.take
        b.add_node(
            name=b.unique(read.name), kind="input", slice=s, inputs=(), outputs=tuple(out_ids),
            fn=lambda: list(take()), source=_eqn_source(eqn), stack=_eqn_stack(eqn),
            host_callbacks=True,  # it may wait for the feed: never on a submitting thread, one at a time
        )
        for v, vid in zip(eqn.outvars, out_ids):
            b.var_value[v] = vid

    def add_compute(self, eqn: Any, cf: CompiledFunction, k: int) -> None:
        """A `pw.compiled` call as a compute node on its slice, its arguments moved there."""
        if cf.slice.released:  # the message is made only then: this runs once per call in a loop
            cf.slice.check_live(f"pw.compiled {cf.name!r}")
        stack = _eqn_stack(eqn)
        source = stack[0] if stack else None
        b = self.b
        # The inner jaxpr object is JAX's trace-cache entry: identical calls share it. A loop calling one
        # function on values placed alike makes the same node each time: its template is worked out once.
        vids, pattern, first = [], [], {}
        for v in eqn.invars:
            if isinstance(v, Literal):
                pattern.append(literal_key(v))
            else:
                pattern.append(("in", first.setdefault(v, len(vids))))
                vids.append(b.read(v))
        pattern = tuple(pattern)
        donating = any(eqn.params.get("donated_invars") or ())
        tkey = None if donating else (
            id(eqn.params["jaxpr"]), id(cf), pattern, tuple((b.values[i].sharding, id(b.values[i].slice)) for i in vids)
        )
        hit = self.templates.get(tkey) if tkey is not None else None
        if hit is not None:
            in_sh, fn, out_sh, host = hit
            in_ids = [b.placed(vid, want, cf.slice, source) for vid, want in zip(vids, in_sh)]
            self.add_node("compute", cf.name, cf.slice, [eqn], in_ids, eqn.outvars, out_sh, fn, stack=stack, donated=(),
                          host_callbacks=host)
            return
        in_ids, in_sh, var_ins = self.compute_inputs(eqn, cf, source)
        donate = self.donations(k, eqn, cf, in_ids)
        # by structure: a pipeline's identical middle stages (different closures) share one compile
        params = repr(sorted((k, v) for k, v in eqn.params.items() if k not in ("jaxpr", "name")))
        key = ("compute", jaxpr_key(eqn.params["jaxpr"]), params, pattern)
        out_sh = list(eqn.params["out_shardings"])
        if all(isinstance(sh, Sharding) for sh in out_sh):
            fn = node_executable([eqn], var_ins, eqn.outvars, in_sh, out_sh, key, donate, cf.name)
        else:  # an out_specs of None: XLA chooses, as for jax.jit without out_shardings
            # the leaves that were given keep their spec as written (P('model', None), not XLA's P('model',)),
            # as jax.jit returns them; XLA places the others, in the same compile
            declared = [d if isinstance(d, Sharding) else None for d in out_sh]
            fn, out_sh = executable_with_chosen_outputs([eqn], var_ins, eqn.outvars, in_sh, cf.slice, key, donate, declared, cf.name)
        for v, sh in zip(eqn.outvars, out_sh):
            _check_divisible(v.aval.shape, sh, lambda v=v: f"`{cf.name}` output ({v.aval.str_short()})")
        if tkey is not None:
            self.templates[tkey] = (in_sh, fn, out_sh, calls_host([eqn]))
        self.add_node("compute", cf.name, cf.slice, [eqn], in_ids, eqn.outvars, out_sh, fn, stack=stack, donated=donate)

    def donations(self, k: int, eqn: Any, cf: CompiledFunction, in_ids: list[int]) -> tuple[int, ...]:
        """Positions of the node's inputs it donates, as JAX recorded ``donate_argnums`` in the call.

        Refused (clearly) when a later node reads the value or the program returns it; a value pw still
        reads elsewhere (``keep``) or a program constant is not donated (the node leaves it alone).
        """
        flags = eqn.params.get("donated_invars") or ()
        if not any(flags):  # (a remote island's node donates there: its executable is loaded with them)
            return ()
        b, out, pos = self.b, [], -1
        for i, (v, d) in enumerate(zip(eqn.invars, flags)):
            if isinstance(v, Literal):
                continue
            pos += 1
            if not d:
                continue
            val = b.values[b.read(v)]
            if self.last_use.get(v, -1) > k:
                raise ArgumentError(
                    f"`pw.compiled(donate_argnums=...)` {cf.name!r}: its argument {i} ({val.type_str}) is donated, but "
                    f"{self.reader_after(k, v)} reads it afterwards. A donated buffer is reused for the outputs, so "
                    f"nothing may read it later: read it before this call, pass a copy (`jnp.copy(x)`), or do not "
                    f"donate it.{_fmt_source(_eqn_source(eqn))}"
                )
            moved = in_ids[pos] != val.id  # a transfer's copy on this slice: always the node's to reuse
            if not moved and (val.origin == "const" or val.id in self.keep_values):
                continue
            if sum(1 for w in eqn.invars if w is v) > 1:
                continue  # passed twice: one buffer cannot be reused and read
            out.append(pos)
        return tuple(out)

    def reader_after(self, k: int, var: Any) -> str:
        """Who reads ``var`` after equation ``k``: a compiled function, a jnp operation, or the program's caller."""
        for eqn in self.jaxpr.eqns[k + 1 :]:
            if any(v is var for v in eqn.invars):
                cf = lookup(str(eqn.params.get("name", ""))) if "jit" in eqn.primitive.name else None
                what = f"`{cf.name}`" if cf is not None else f"the jnp operation `{eqn.primitive.name}`"
                src = _eqn_source(eqn)
                return what + ("" if src is None else f" (line {src[1]} of {src[0]})")
        return "the program's caller (the program returns it as a future)"

    def compute_inputs(self, eqn: Any, cf: CompiledFunction, source) -> tuple[list[int], list[Sharding], list[Any]]:
        """The values a call reads, each placed as its in_specs say: (value ids, shardings, vars); ``source``: its line."""
        b = self.b
        in_ids, in_sh, var_ins = [], [], []
        for pos, (v, want) in enumerate(zip(eqn.invars, eqn.params["in_shardings"])):
            if isinstance(v, Literal):
                continue
            val = b.values[b.read(v)]
            if not isinstance(want, Sharding):  # an in_specs of None
                want = _unspecified_input(val, cf.slice)
            _check_divisible(val.shape, want, lambda pos=pos, val=val: f"`{cf.name}` argument {pos} ({val.type_str})")
            in_ids.append(b.placed(val.id, want, cf.slice, source))
            in_sh.append(want)
            var_ins.append(v)
        return in_ids, in_sh, var_ins

    def add_node(self, kind, name, s, eqns, in_ids, outvars, out_sh, fn, stack=None, host_callbacks=None, **kw) -> None:
        """A node of ``eqns`` on slice ``s``, with a new value for each of ``outvars`` (``stack``, ``host_callbacks``:
        known already)."""
        b = self.b
        if stack is None:
            stack = _eqn_stack(eqns[0])
        node_id = len(b.nodes)
        out_ids = [b.new_value(v.aval.shape, v.aval.dtype, sh, "node", node_id, s) for v, sh in zip(outvars, out_sh)]
        b.add_node(
            name=b.unique(name),
            kind=kind,
            slice=s,
            inputs=tuple(in_ids),
            outputs=tuple(out_ids),
            fn=fn,
            source=stack[0] if stack else None,
            stack=stack,
            host_callbacks=calls_host(eqns) if host_callbacks is None else host_callbacks,
            **kw,
        )
        for v, vid in zip(outvars, out_ids):
            b.var_value[v] = vid

    # ------------------------------------------------------------------ outputs
    def place_outputs(self, outvars: Sequence[Any]) -> tuple[int, ...]:
        """The value of each output; a literal becomes a host constant."""
        outputs = []
        for v in outvars:
            if isinstance(v, Literal):
                vid = self.b.new_value(np.shape(v.val), np.asarray(v.val).dtype, None, "const")
                self.consts[vid] = np.asarray(v.val)
                outputs.append(vid)
            else:
                outputs.append(self.b.read(v))
        return tuple(outputs)


def _last_uses(jaxpr: Any) -> dict[Any, int]:
    """The index of the last equation that reads each var (the program's outputs: one past the end)."""
    last_use: dict[Any, int] = {}
    for k, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not isinstance(v, Literal):
                last_use[v] = k
    for v in jaxpr.outvars:
        if not isinstance(v, Literal):
            last_use[v] = len(jaxpr.eqns)
    return last_use


def _glue_vars(eqns: Sequence[Any], last_use: dict[Any, int], last_k: int) -> tuple[list[Any], list[Any]]:
    """A glue group's inputs (vars it reads but does not make) and outputs (vars read after equation ``last_k``)."""
    produced = {v for e in eqns for v in e.outvars}
    invars: list[Any] = []
    for e in eqns:
        for v in e.invars:
            if not isinstance(v, Literal) and v not in produced and v not in invars:
                invars.append(v)
    outvars = [v for e in eqns for v in e.outvars if last_use.get(v, -1) > last_k]
    return invars, outvars


def _glue_executable(eqns, invars, outvars, in_sh, s: VirtualSlice) -> tuple[Callable, list[Sharding]]:
    """A glue node's executable and its outputs' shardings."""
    key = glue_key(eqns, invars, outvars)
    if in_sh:  # XLA chooses the outputs' shardings, as in a plain jax.jit of the same code
        return executable_with_chosen_outputs(eqns, invars, outvars, in_sh, s, key, name="glue")
    # made from constants only: nothing to propagate from, so on the slice, replicated
    out_sh = [NamedSharding(s.mesh, PartitionSpec()) for _ in outvars]
    return node_executable(eqns, invars, outvars, in_sh, out_sh, key, name="glue"), out_sh

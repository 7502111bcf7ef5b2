"""Trace a Python function into a ProgramGraph with JAX's own tracing.

`jax.make_jaxpr` turns the function into a jaxpr in which every call of a
`pw.compiled` function is a nested ``jit`` equation carrying its shardings.
Those become compute nodes on their slice; runs of other equations between
them become glue nodes on the slice of their inputs; values that must move
between slices (or be resharded) get explicit transfer nodes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import Literal
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from . import compiled as compiled_mod
from ..devices import ResourceManager, VirtualSlice
from ..errors import ControlFlowError, PathwaysError, SpecError, TracingError
from ..futures import Future
from .graph import Node, ProgramGraph, Value, as_dtype

_JAX_DIR = os.path.dirname(jax.__file__)
_PW_DIR = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))  # pw_kernel/


def is_traced_leaf(x: Any) -> bool:
    """Arrays and futures are traced program inputs; every other leaf is a constant."""
    return isinstance(x, (Future, jax.Array, np.ndarray, np.generic))


def abstract_leaf(x: Any) -> jax.ShapeDtypeStruct:
    if isinstance(x, (Future, jax.Array)):
        return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype, sharding=x.sharding)
    x = np.asarray(x)
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def signature(args: tuple, kwargs: dict) -> tuple[Any, list[Any], tuple]:
    """Flatten (args, kwargs); return (treedef, leaves, hashable cache key)."""
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    key = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, Future):
            key.append(("A", tuple(leaf.shape), leaf.dtype, leaf.sharding, id(leaf.slice) if leaf.slice else None))
        elif isinstance(leaf, jax.Array):  # the hot path of every call: no ShapeDtypeStruct
            key.append(("A", tuple(leaf.shape), leaf.dtype, leaf.sharding))
        elif isinstance(leaf, (np.ndarray, np.generic)):
            key.append(("A", np.shape(leaf), leaf.dtype, None))
        else:
            try:
                hash(leaf)
            except TypeError:
                raise TracingError(
                    f"`pw.program`: argument leaf {i} is a {type(leaf).__name__}, which is neither an array "
                    f"(traced) nor hashable (a constant baked into the trace). Pass it as a jax/numpy array, "
                    f"or as a hashable value such as a tuple."
                ) from None
            key.append(("S", type(leaf), leaf))
    return treedef, leaves, (treedef, tuple(key))


def user_frame(tb_frames) -> tuple[str, int] | None:
    """The innermost (file, line) that is user code, not JAX's or pw_kernel's."""
    for filename, line in tb_frames:
        if not filename.startswith((_JAX_DIR, _PW_DIR)) and "/importlib/" not in filename:
            return filename, line
    return None


def _user_frames(frames) -> tuple[tuple[str, int], ...]:
    return tuple(
        (f, line) for f, line in frames if not f.startswith((_JAX_DIR, _PW_DIR)) and "/importlib/" not in f
    )


def _eqn_stack(eqn) -> tuple[tuple[str, int], ...]:
    """Every user frame (innermost first) of the code that made an equation."""
    tb = getattr(eqn.source_info, "traceback", None)
    if tb is None:
        return ()
    return _user_frames((f.file_name, f.line_num) for f in tb.frames)


def _eqn_source(eqn) -> tuple[str, int] | None:
    stack = _eqn_stack(eqn)
    return stack[0] if stack else None


def _exc_source(exc: BaseException) -> tuple[str, int] | None:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return user_frame((f.filename, f.lineno) for f in reversed(frames))


def _fmt_source(src: tuple[str, int] | None) -> str:
    if src is None:
        return ""
    import linecache

    filename, line = src
    text = linecache.getline(filename, line).strip()
    where = f"{filename}, line {line}"
    return f"\n  at {where}" + (f":\n    {text}" if text else "")


def _bind(eqn, args):
    params = eqn.params
    bind_params = eqn.primitive.get_bind_params(params)
    if isinstance(bind_params, tuple):  # older JAX: (subfuns, params)
        subfuns, bind_params = bind_params
        return eqn.primitive.bind(*subfuns, *args, **bind_params)
    return eqn.primitive.bind(*args, **bind_params)


def sub_jaxprs(eqn: Any):
    """The Jaxprs nested in an equation's params (a call's body, a cond's branches, a scan's body)."""
    for p in eqn.params.values():
        for sub in p if isinstance(p, (tuple, list)) else (p,):
            inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr, or a Jaxpr
            if hasattr(inner, "eqns"):
                yield inner


def calls_host(eqns: Sequence[Any]) -> bool:
    """Whether these equations (or any jaxpr nested in their params) call back into Python."""
    return any("callback" in e.primitive.name or any(calls_host(j.eqns) for j in sub_jaxprs(e)) for e in eqns)


class _GuardedCallback:
    """A host callback that never raises into XLA: it records the exception and returns zeros.

    On several devices a callback that raises leaves the other devices waiting in their
    collectives until XLA aborts the process; guarded, the computation finishes and the
    node fails afterwards with the recorded exception (`HostCallbackError`).
    """

    def __init__(self, callback: Callable, result_avals: Sequence[Any], errors: list):
        self.callback = callback
        self.result_avals = tuple(result_avals)
        self.errors = errors

    def __call__(self, *args):
        try:
            return self.callback(*args)
        except BaseException as e:  # noqa: BLE001 - any raise would strand the other devices
            self.errors.append(e)
            return [np.zeros(a.shape, a.dtype) for a in self.result_avals]


def guard_callbacks(eqns: Sequence[Any], errors: list) -> list:
    """``eqns`` with every host callback (also in nested jaxprs) guarded, recording into ``errors``."""
    out = []
    for e in eqns:
        params = dict(e.params)
        changed = False
        if "callback" in e.primitive.name and callable(params.get("callback")):
            params["callback"] = _GuardedCallback(params["callback"], params.get("result_avals", ()), errors)
            changed = True
        for k, p in e.params.items():
            if hasattr(p, "jaxpr") and hasattr(p, "consts") and calls_host(p.jaxpr.eqns):  # a ClosedJaxpr
                params[k] = p.replace(jaxpr=p.jaxpr.replace(eqns=guard_callbacks(p.jaxpr.eqns, errors)))
                changed = True
            elif hasattr(p, "eqns") and calls_host(p.eqns):  # a Jaxpr
                params[k] = p.replace(eqns=guard_callbacks(p.eqns, errors))
                changed = True
        out.append(e.replace(params=params) if changed else e)
    return out


def make_evaluator(eqns: Sequence[Any], invars: Sequence[Any], outvars: Sequence[Any]) -> Callable:
    """A function of ``invars`` that replays ``eqns`` (by binding their primitives) and returns ``outvars``."""

    def evaluate(*args):
        env = dict(zip(invars, args))

        def read(v):
            return v.val if isinstance(v, Literal) else env[v]

        for eqn in eqns:
            ans = _bind(eqn, [read(v) for v in eqn.invars])
            if eqn.primitive.multiple_results:
                env.update(zip(eqn.outvars, ans))
            else:
                env[eqn.outvars[0]] = ans
        return tuple(read(v) for v in outvars)

    return evaluate


# Node executables are shared between nodes (and programs) that do the same thing with the
# same shardings, so a chain calling one compiled function K times compiles it once, as JAX would.
_EXECUTABLES: dict[Any, tuple[Any, Callable]] = {}
_MAX_EXECUTABLES = 4096
_OUT_SHARDINGS: dict[Any, tuple[Any, list]] = {}  # glue key and input shardings -> what XLA gives the outputs


def _literal_key(v) -> Any:
    val = np.asarray(v.val)
    return ("lit", val.dtype.str, val.shape, val.tobytes())


def _glue_key(eqns, invars, outvars) -> Any | None:
    """A structural key for a group of equations (vars renamed by position); None if not hashable."""
    local = {v: ("in", i) for i, v in enumerate(invars)}
    parts = []
    for k, e in enumerate(eqns):
        ins = tuple(_literal_key(v) if isinstance(v, Literal) else local.get(v, ("?", id(v))) for v in e.invars)
        params = repr(sorted(e.params.items(), key=lambda kv: kv[0]))
        if "..." in params or " at 0x" in params:  # truncated or identity-based: not a safe key
            return None
        parts.append((e.primitive.name, params, ins, tuple(str(v.aval) for v in e.outvars)))
        for j, v in enumerate(e.outvars):
            local[v] = ("t", k, j)
    outs = tuple(_literal_key(v) if isinstance(v, Literal) else local.get(v) for v in outvars)
    return (tuple(str(v.aval) for v in invars), tuple(parts), outs)


def jit_of(eqns, invars, outvars, in_sh, out_sh) -> Callable:
    """`jax.jit` replaying ``eqns`` with these shardings; host callbacks guarded (see `_GuardedCallback`).

    A guarded executable carries ``callback_errors``: what its callbacks raised, for the dispatcher's
    watcher to fail the node with once the computation has finished.
    """
    errors: list | None = None
    if calls_host(eqns):
        errors = []
        eqns = guard_callbacks(eqns, errors)
    kw = {} if out_sh is None else {"out_shardings": tuple(out_sh)}  # None: XLA chooses
    # keep_unused: a node runs on its slice even when its outputs ignore its inputs (jnp.zeros_like
    # of params on Explicit axes: jit would prune the input, run on one device, and refuse the mesh)
    fn = jax.jit(make_evaluator(eqns, invars, outvars), in_shardings=tuple(in_sh), keep_unused=True, **kw)
    if errors is not None:
        fn.callback_errors = errors
    return fn


def node_executable(eqns, invars, outvars, in_sh, out_sh, key: Any | None = None) -> Callable:
    """`jax.jit` of the equations with the given shardings, shared with identical nodes (``out_sh`` None: XLA
    chooses, see `chosen_out_shardings`)."""
    if key is not None:
        key = (key, tuple(in_sh), None if out_sh is None else tuple(out_sh))
        hit = _EXECUTABLES.get(key)
        if hit is not None:
            return hit[1]
    fn = jit_of(eqns, invars, outvars, in_sh, out_sh)
    if key is not None:
        if len(_EXECUTABLES) >= _MAX_EXECUTABLES:
            _EXECUTABLES.clear()
        _EXECUTABLES[key] = (eqns, fn)  # eqns keep the jaxprs in the key alive
    return fn


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


def chosen_out_shardings(fn, invars, outvars, in_sh, s: VirtualSlice, key: Any | None = None) -> list[Sharding]:
    """The shardings XLA gives the outputs of ``fn``, a node executable built without out_shardings.

    So XLA's propagation, `with_sharding_constraint`, a nested jit's out_shardings and
    shard_map's out_specs all decide, exactly as in a plain `jax.jit` of the same code. The
    compile this takes is ``fn``'s own: JAX keeps it for the node's first call.
    ``key`` (structural) caches the answer; None: not cached.
    """
    if key is not None:
        key = (key, tuple(in_sh))
        hit = _OUT_SHARDINGS.get(key)
        if hit is not None:
            return hit[1]
    args = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, sharding=sh) for v, sh in zip(invars, in_sh)]
    out = [_on_slice(sh, v.aval.ndim, s) for sh, v in zip(fn.lower(*args).compile().output_shardings, outvars)]
    if key is not None:
        if len(_OUT_SHARDINGS) >= _MAX_EXECUTABLES:
            _OUT_SHARDINGS.clear()
        _OUT_SHARDINGS[key] = (fn, out)
    return out


def _executable_with_chosen_outputs(eqns, invars, outvars, in_sh, s: VirtualSlice, key):
    """A node's executable built without out_shardings, and the shardings XLA gives its outputs.

    (Shardings the equations declare themselves, a compiled function's out_specs or a nested
    jit's, are XLA's choice too.) An output XLA puts on part of the slice only (a value that
    depends on no input may land on one device) is replicated over the slice instead, with an
    executable that says so: pw keeps every node's values on its slice.
    """
    fn = node_executable(eqns, invars, outvars, in_sh, None, key)
    chosen = chosen_out_shardings(fn, invars, outvars, in_sh, s, key)
    devices = set(s.devices)
    out = [sh if sh.device_set == devices else NamedSharding(s.mesh, PartitionSpec()) for sh in chosen]
    if out != chosen:
        fn = node_executable(eqns, invars, outvars, in_sh, out, key)
    return fn, out


def _unspecified_input(val: Value, s: VirtualSlice) -> Sharding:
    """Where an argument with no in_spec goes: as `jax.jit` without in_shardings, its own sharding
    when it lives on the slice; else the same PartitionSpec on the slice where its axes exist
    there (from another slice), else replicated (a host value, or axes the slice lacks)."""
    if val.slice is s and isinstance(val.sharding, Sharding) and val.sharding.device_set == set(s.devices):
        return val.sharding
    return _map_sharding(val.sharding, val.shape, s)


def _on_slice(sharding: Sharding, ndim: int, s: VirtualSlice) -> Sharding:
    """``sharding`` as a NamedSharding on the slice's mesh where XLA gave an equivalent positional one."""
    if isinstance(sharding, NamedSharding) and sharding.mesh == s.mesh:
        return sharding
    if ndim > 4:  # the candidates grow as (axes + 1) ** ndim: keep XLA's own sharding, it is as good
        return sharding
    for spec in _candidate_specs(s, ndim):
        named = NamedSharding(s.mesh, spec)
        if named.is_equivalent_to(sharding, ndim):
            return named
    return sharding


def _candidate_specs(s: VirtualSlice, ndim: int):
    """PartitionSpecs of rank ``ndim`` on the slice's axes, each axis used at most once (small meshes only)."""
    axes = list(s.mesh.axis_names)
    yield PartitionSpec()
    choices = [None, *axes]
    for combo in itertools.product(choices, repeat=ndim):
        used = [a for a in combo if a is not None]
        if used and len(used) == len(set(used)):
            yield PartitionSpec(*combo)


def _check_divisible(shape, sharding: Sharding, what: str) -> None:
    if not isinstance(sharding, NamedSharding):
        return
    spec = sharding.spec
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
        devs = sharding.device_set
        best = None
        for s in self.resources.slices:
            if s.island.remote is not None:  # its devices are stand-ins: a local array is never there
                continue
            if set(s.devices) == devs:
                if isinstance(sharding, NamedSharding) and sharding.mesh == s.mesh:
                    return s
                best = best or s
        return best

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


def trace_program(*args, **kwargs) -> ProgramGraph:
    """Trace ``fn(*args, **kwargs)`` into a ProgramGraph; see the module docstring."""
    with compiled_mod.tracing_scope():
        return _trace_program(*args, **kwargs)


def _trace_program(
    fn: Callable,
    args: tuple,
    kwargs: dict,
    *,
    name: str,
    resources: ResourceManager,
    default_slice: VirtualSlice | None = None,
) -> ProgramGraph:
    treedef, leaves, _ = signature(args, kwargs)
    traced_idx = [i for i, x in enumerate(leaves) if is_traced_leaf(x)]
    abstract = [abstract_leaf(leaves[i]) for i in traced_idx]
    out_tree_box: list[Any] = []

    def flat_fn(*traced):
        full = list(leaves)
        for i, t in zip(traced_idx, traced):
            full[i] = t
        a, k = jax.tree_util.tree_unflatten(treedef, full)
        out = fn(*a, **k)
        flat, out_tree = jax.tree_util.tree_flatten(out)
        out_tree_box.append(out_tree)
        return flat

    try:
        closed = jax.make_jaxpr(flat_fn)(*abstract)
    except jax.errors.TracerBoolConversionError as e:
        src = _exc_source(e)
        raise ControlFlowError(
            f"`pw.program` {name!r}: Python control flow depends on a value computed on devices "
            f"({type(e).__name__}).{_fmt_source(src)}\n"
            "A program is traced once into a static dataflow graph, so `if`/`while` on array values cannot "
            "be decided at trace time. Instead: (1) use `jax.lax.cond` / `jnp.where` / `jax.lax.while_loop` "
            "inside a `pw.compiled` function, or (2) fetch the value first (`fut.result()`) and branch in "
            "plain Python outside the program. Loops over Python ranges are fine: they unroll."
        ) from None
    except PathwaysError:  # already says what is wrong and what to do
        raise
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
            jax.errors.TracerIntegerConversionError) as e:
        src = _exc_source(e)
        raise TracingError(
            f"`pw.program` {name!r} needs a concrete value where it only has a traced one "
            f"({type(e).__name__}).{_fmt_source(src)}\n"
            "Inside a program, arrays are abstract (shape and dtype only) until the run executes, so "
            "`float(x)`, `int(x)`, `np.asarray(x)` or indexing with an array value cannot work. Use jnp "
            "operations on the array instead, or pass the value in as a Python constant."
        ) from None
    except Exception as e:
        src = _exc_source(e)
        if "evenly divide" in str(e):
            raise SpecError(
                f"`pw.program` {name!r}: a value does not fit the PartitionSpec it is given: {e}{_fmt_source(src)}\n"
                "Use sizes that are multiples of the mesh axes they are split over, or replicate that "
                "dimension with None in the spec."
            ) from None
        hint = ""
        if "not a valid JAX type" in str(e):
            hint = "\nA program must return arrays (or pytrees of arrays); return non-array values outside it."
        slices = [cf.slice for cf in (getattr(compiled_mod._tracing, "seen", None) or {}).values()]
        hint += context_mesh_hint([*slices, default_slice])
        raise TracingError(
            f"`pw.program` {name!r} could not be traced: {type(e).__name__}: {e}{_fmt_source(src)}{hint}"
        ) from e

    jaxpr = closed.jaxpr
    b = _Builder(name=name, resources=resources, default_slice=default_slice)

    input_ids = []
    for var, a, i in zip(jaxpr.invars, abstract, traced_idx):
        home = getattr(leaves[i], "slice", None)  # a future knows the slice it lives on
        if not isinstance(home, VirtualSlice):
            home = b.slice_of(a.sharding) if a.sharding is not None else None
            if home is None:  # an array on a mesh of the notebook's own that no slice covers: adopt it
                home = _adopt_mesh(resources, a.sharding)
        vid = b.new_value(a.shape, a.dtype, a.sharding, "input", slice_=home)
        b.var_value[var] = vid
        input_ids.append(vid)
    consts: dict[int, Any] = {}
    for var, c in zip(jaxpr.constvars, closed.consts):
        sh = c.sharding if isinstance(c, jax.Array) else None
        vid = b.new_value(np.shape(c), np.asarray(c).dtype if sh is None else c.dtype, sh, "const")
        b.var_value[var] = vid
        consts[vid] = c

    # Where glue that reads no device value goes: the program's slice, else the first compute slice.
    if b.default_slice is None:
        for eqn in jaxpr.eqns:
            cf = compiled_mod.lookup(str(eqn.params.get("name", "")))
            if cf is not None:
                b.default_slice = cf.slice
                break

    # Which vars are read after a given equation (to find a glue group's outputs).
    last_use: dict[Any, int] = {}
    for k, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not isinstance(v, Literal):
                last_use[v] = k
    for v in jaxpr.outvars:
        if not isinstance(v, Literal):
            last_use[v] = len(jaxpr.eqns)

    glue: list[tuple[int, Any]] = []
    glue_slice: list[VirtualSlice | None] = [None]

    def flush_glue():
        if not glue:
            return
        s = glue_slice[0]
        eqns = [e for _, e in glue]
        produced = {v for e in eqns for v in e.outvars}
        last_k = glue[-1][0]
        invars: list[Any] = []
        for e in eqns:
            for v in e.invars:
                if not isinstance(v, Literal) and v not in produced and v not in invars:
                    invars.append(v)
        outvars = [v for e in eqns for v in e.outvars if last_use.get(v, -1) > last_k]
        source = _eqn_source(eqns[0])
        in_ids, in_sh = [], []
        for v in invars:
            val = b.values[b.read(v)]
            want = val.sharding if val.slice is s else _map_sharding(val.sharding, val.shape, s)
            in_ids.append(b.placed(val.id, want, s, source))
            in_sh.append(want)
        glue_key = _glue_key(eqns, invars, outvars)
        if in_sh:  # XLA chooses the outputs' shardings, as in a plain jax.jit of the same code
            fn_, out_sh = _executable_with_chosen_outputs(eqns, invars, outvars, in_sh, s, glue_key)
        else:  # made from constants only: nothing to propagate from, so on the slice, replicated
            out_sh = [NamedSharding(s.mesh, PartitionSpec()) for _ in outvars]
            fn_ = node_executable(eqns, invars, outvars, in_sh, out_sh, glue_key)
        prims = tuple(dict.fromkeys(e.primitive.name for e in eqns))
        node_id = len(b.nodes)
        out_ids = [b.new_value(v.aval.shape, v.aval.dtype, sh, "node", node_id, s) for v, sh in zip(outvars, out_sh)]
        label = ",".join(prims[:3]) + (",…" if len(prims) > 3 else "")
        b.add_node(
            name=b.unique(f"glue[{label}]"),
            kind="glue",
            slice=s,
            inputs=tuple(in_ids),
            outputs=tuple(out_ids),
            fn=fn_,
            primitives=prims,
            source=source,
            stack=_eqn_stack(eqns[0]),
            host_callbacks=calls_host(eqns),
        )
        for v, vid in zip(outvars, out_ids):
            b.var_value[v] = vid
        glue.clear()

    for k, eqn in enumerate(jaxpr.eqns):
        cf = compiled_mod.lookup(str(eqn.params.get("name", ""))) if "jit" in eqn.primitive.name else None
        if cf is None:
            s = None
            for v in eqn.invars:
                if isinstance(v, Literal):
                    continue
                if v in b.var_value:
                    s = b.values[b.var_value[v]].slice
                elif glue:  # produced earlier in the glue group being collected
                    s = glue_slice[0]
                if s is not None:
                    break
            if s is None:
                s = glue_slice[0] if glue else b.default_slice
            if s is None:
                raise TracingError(
                    f"`pw.program` {name!r}: the jnp operation `{eqn.primitive.name}` reads no array that lives "
                    f"on a slice, and the program calls no `pw.compiled` function, so there is nowhere to run it."
                    f"{_fmt_source(_eqn_source(eqn))}\nPass a slice: `@pw.program(slice=s)`, or call a "
                    f"`pw.compiled` function."
                )
            s.check_live(f"pw.program {name!r}")
            if glue and glue_slice[0] is not s:
                flush_glue()
            glue_slice[0] = s
            glue.append((k, eqn))
            continue
        flush_glue()
        cf.slice.check_live(f"pw.compiled {cf.name!r}")
        source = _eqn_source(eqn)
        in_ids, in_sh, literals = [], [], {}
        var_ins = []
        for pos, (v, want) in enumerate(zip(eqn.invars, eqn.params["in_shardings"])):
            if isinstance(v, Literal):
                literals[pos] = v
                continue
            val = b.values[b.read(v)]
            if not isinstance(want, Sharding):  # an in_specs of None
                want = _unspecified_input(val, cf.slice)
            _check_divisible(val.shape, want, f"`{cf.name}` argument {pos} ({val.type_str})")
            in_ids.append(b.placed(val.id, want, cf.slice, source))
            in_sh.append(want)
            var_ins.append(v)
        # The inner jaxpr object is JAX's trace-cache entry: identical calls share it.
        key = ("compute", id(eqn.params["jaxpr"]), tuple(
            _literal_key(v) if isinstance(v, Literal) else ("in", var_ins.index(v)) for v in eqn.invars
        ))
        out_sh = list(eqn.params["out_shardings"])
        if all(isinstance(sh, Sharding) for sh in out_sh):
            fn_ = node_executable([eqn], var_ins, eqn.outvars, in_sh, out_sh, key)
        else:  # an out_specs of None: XLA chooses, as for jax.jit without out_shardings
            fn_, out_sh = _executable_with_chosen_outputs([eqn], var_ins, eqn.outvars, in_sh, cf.slice, key)
        node_id = len(b.nodes)
        out_ids = []
        for v, sh in zip(eqn.outvars, out_sh):
            _check_divisible(v.aval.shape, sh, f"`{cf.name}` output ({v.aval.str_short()})")
            out_ids.append(b.new_value(v.aval.shape, v.aval.dtype, sh, "node", node_id, cf.slice))
        b.add_node(
            name=b.unique(cf.name),
            kind="compute",
            slice=cf.slice,
            inputs=tuple(in_ids),
            outputs=tuple(out_ids),
            fn=fn_,
            source=source,
            stack=_eqn_stack(eqn),
            host_callbacks=calls_host([eqn]),
        )
        for v, vid in zip(eqn.outvars, out_ids):
            b.var_value[v] = vid
    flush_glue()

    outputs = []
    for v in jaxpr.outvars:
        if isinstance(v, Literal):
            vid = b.new_value(np.shape(v.val), np.asarray(v.val).dtype, None, "const")
            consts[vid] = np.asarray(v.val)
            outputs.append(vid)
        else:
            outputs.append(b.read(v))
    return ProgramGraph(
        name=name,
        nodes=b.nodes,
        values=b.values,
        inputs=tuple(input_ids),
        outputs=tuple(outputs),
        out_tree=out_tree_box[-1],
        consts=consts,
        jaxpr=closed,
        default_slice=b.default_slice,
    )

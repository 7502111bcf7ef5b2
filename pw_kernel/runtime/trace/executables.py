"""Node executables: a `jax.jit` that replays a node's jaxpr equations with the node's shardings.

Executables are shared between nodes (and programs) that do the same thing with the
same shardings; host callbacks inside them are guarded so a raise never strands the
other devices of a collective; where a node leaves its outputs' shardings to XLA,
the ones XLA chose are read back from the compiled executable.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import Literal
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from ..devices import VirtualSlice, is_one_device_output


def _bind(eqn, args):
    params = eqn.params
    bind_params = eqn.primitive.get_bind_params(params)
    if isinstance(bind_params, tuple):  # older JAX: (subfuns, params)
        subfuns, bind_params = bind_params
        return eqn.primitive.bind(*subfuns, *args, **bind_params)
    return eqn.primitive.bind(*args, **bind_params)


def sub_jaxprs(eqn: Any):
    """The Jaxprs nested in an equation's params (a call's body, a cond's branches, a scan's body)."""
    params = eqn.params
    if eqn.primitive.name in _CALLS and "jaxpr" in params:  # a jit's other params are shardings, names, flags
        yield getattr(params["jaxpr"], "jaxpr", params["jaxpr"])
        return
    for p in params.values():
        for sub in p if isinstance(p, (tuple, list)) else (p,):
            inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr, or a Jaxpr
            if hasattr(inner, "eqns"):
                yield inner


_CALLS = ("pjit", "jit")


def _host_primitive(name: str) -> bool:
    """Whether a primitive calls back into Python: pure_callback, io_callback, debug_callback, and
    jax.debug.print (its own ``debug_print`` primitive in newer JAX)."""
    return "callback" in name or name == "debug_print"


def calls_host(eqns: Sequence[Any]) -> bool:
    """Whether these equations (or any jaxpr nested in their params) call back into Python."""
    return any(_host_primitive(e.primitive.name) or any(_jaxpr_calls_host(j) for j in sub_jaxprs(e)) for e in eqns)


def _jaxpr_calls_host(jaxpr: Any) -> bool:
    """`calls_host` of a nested jaxpr, asked once per jaxpr object (a loop calls one compiled function's many times)."""
    hit = _CALLS_HOST.get(id(jaxpr))
    if hit is not None and hit[0] is jaxpr:
        return hit[1]
    out = calls_host(jaxpr.eqns)
    if len(_CALLS_HOST) >= 4096:
        _CALLS_HOST.clear()
    _CALLS_HOST[id(jaxpr)] = (jaxpr, out)  # the jaxpr kept alive: its id is not reused while here
    return out


_CALLS_HOST: dict[int, tuple[Any, bool]] = {}


class CallbackErrors(list):
    """What one node executable's guarded host callbacks raised, in order (`jit_of` makes one per executable).

    Also the node's identity while one of its callbacks runs (`calling_node`). A process that runs
    several clients' nodes at once (the Pathways service) gives it a ``sink``: then what the callbacks
    raise goes there, to the run of the node that raised it, and is not kept here.
    """

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.sink: Any = None  # has .raised(exception): the service's NodeSink (see `calling_node`)

    def append(self, error: BaseException) -> None:
        if self.sink is not None:
            self.sink.raised(error)
        else:
            super().append(error)

    def __reduce__(self):  # (shipped to an island without the sink of the process it was made in)
        return CallbackErrors, (list(self),)


_calling = threading.local()


def calling_node() -> CallbackErrors | None:
    """The `CallbackErrors` of the node whose host callback runs on this thread now, else None.

    XLA runs a node's callbacks on its own threads, whoever dispatched the node: what a callback
    writes belongs to its node, and this is how a process that catches writes tells whose they are.
    """
    return getattr(_calling, "node", None)


class _GuardedCallback:
    """A host callback that never raises into XLA: it records the exception and returns zeros.

    On several devices a callback that raises leaves the other devices waiting in their
    collectives until XLA aborts the process; guarded, the computation finishes and the
    node fails afterwards with the recorded exception (`HostCallbackError`).
    """

    def __init__(self, callback: Callable, result_avals: Sequence[Any], errors: CallbackErrors):
        self.callback = callback
        self.result_avals = tuple(result_avals)
        self.errors = errors

    def __call__(self, *args):
        outer = getattr(_calling, "node", None)
        _calling.node = self.errors
        try:
            return self.callback(*args)
        except BaseException as e:  # noqa: BLE001 - any raise would strand the other devices
            self.errors.append(e)
            return [np.zeros(a.shape, a.dtype) for a in self.result_avals]
        finally:
            _calling.node = outer


class _Print:
    """`jax.debug.print`'s printing, from the params of its ``debug_print`` equation, as a host callback.

    JAX's own prints from inside XLA, where no thread says whose node it is; as a guarded
    ``debug_callback`` it is one of the node's callbacks (`calling_node` names the node). It formats
    as JAX does: ``fmt.format`` under the call's numpy print options, or the values after the text.
    """

    def __init__(self, params: dict):
        self.fmt = params["fmt"]
        self.in_tree = params["in_tree"]
        self.static = dict(params["static_args"])
        self.options = dict(params["np_printoptions"])
        self.placeholders = params["has_placeholders"]

    def __call__(self, *values) -> None:
        flat, given = [], iter(values)
        for i in range(len(self.static) + len(values)):
            flat.append(self.static[i] if i in self.static else next(given))
        args, kwargs = jax.tree_util.tree_unflatten(self.in_tree, flat)
        if self.placeholders:
            with np.printoptions(**self.options):
                text = self.fmt.format(*args, **kwargs)
        else:
            text = " ".join((self.fmt, *(str(a) for a in args)))
        sys.stdout.write(text + "\n")


def _as_callback(eqn: Any) -> Any:
    """A ``debug_print`` equation as the ``debug_callback`` one that prints the same (`_Print`), or
    ``eqn`` itself if it logs instead (``logging_record``) or another JAX spells it otherwise."""
    params = eqn.params
    if params.get("logging_record") is not None or not {"fmt", "in_tree", "static_args"} <= params.keys():
        return eqn
    printer = _Print(params)
    avals = [v.aval for v in eqn.invars]
    traced = jax.make_jaxpr(
        lambda *xs: jax.debug.callback(printer, *xs, ordered=params.get("ordered", False),
                                       partitioned=params.get("partitioned", False))
    )(*[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals])
    (made,) = traced.jaxpr.eqns
    return made.replace(invars=list(eqn.invars), outvars=list(eqn.outvars))


def guard_callbacks(eqns: Sequence[Any], errors: CallbackErrors) -> list:
    """``eqns`` with every host callback (also in nested jaxprs) guarded, recording into ``errors``.

    `jax.debug.print` becomes a guarded callback too (`_Print`), so that its line, like any other
    callback's output, is its node's (`calling_node`).
    """
    out = []
    for e in eqns:
        if e.primitive.name == "debug_print":
            e = _as_callback(e)
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


def make_evaluator(eqns: Sequence[Any], invars: Sequence[Any], outvars: Sequence[Any], name: str = "evaluate") -> Callable:
    """A function of ``invars`` that replays ``eqns`` (by binding their primitives) and returns ``outvars``.

    ``name`` is what JAX's compile log and XLA's profiler call it (``jit(stage0)``).
    """

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

    evaluate.__name__ = evaluate.__qualname__ = name
    return evaluate


# Node executables are shared between nodes (and programs) that do the same thing with the
# same shardings, so a chain calling one compiled function K times compiles it once, as JAX would.
_EXECUTABLES: dict[Any, tuple[Any, Callable]] = {}
_MAX_EXECUTABLES = 4096
_OUT_SHARDINGS: dict[Any, tuple[Any, list]] = {}  # glue key and input shardings -> what XLA gives the outputs


def literal_key(v) -> Any:
    val = np.asarray(v.val)
    return ("lit", val.dtype.str, val.shape, val.tobytes())


_JAXPR_KEYS: dict[int, tuple[Any, Any]] = {}  # id(closed jaxpr) -> (it, its structural key)
_MAX_CONST_KEY_BYTES = 1 << 16  # larger constants are compared by identity


def jaxpr_key(closed: Any) -> Any:
    """A structural key for a compiled function's closed jaxpr: equal for the same computation.

    Two stages that are different Python closures of the same layer (a pipeline's middle
    stages) trace to equal jaxprs and so share one executable: each distinct stage compiles
    once. The text of the jaxpr names every primitive, parameter and shape; constants count
    by value (small) or identity (large); anything printed by identity (`` at 0x``, a host
    callback) keeps the jaxpr's own identity, so nothing is shared by mistake.
    """
    hit = _JAXPR_KEYS.get(id(closed))
    if hit is not None and hit[0] is closed:
        return hit[1]
    text = str(closed.jaxpr)
    # A `jax.export` call prints as its function's name only (``Exported(fun_name=<lambda>, ...)``): two
    # different exported functions of one signature would look the same (the Pathways service runs every
    # client's node so). Keyed by identity, like anything printed by identity.
    if " at 0x" in text or "call_exported[" in text or calls_host(closed.jaxpr.eqns):
        key: Any = ("id", id(closed))
    else:
        consts = []
        for c in closed.consts:
            a = np.asarray(c) if isinstance(c, (np.ndarray, np.generic, int, float, bool, complex)) else None
            if a is not None and a.nbytes <= _MAX_CONST_KEY_BYTES:
                consts.append((a.dtype.str, a.shape, a.tobytes()))
            else:
                consts.append(("id", id(c)))
        key = ("jaxpr", text, tuple(consts))
    if len(_JAXPR_KEYS) >= _MAX_EXECUTABLES:
        _JAXPR_KEYS.clear()
    _JAXPR_KEYS[id(closed)] = (closed, key)
    return key


def glue_key(eqns, invars, outvars) -> Any | None:
    """A structural key for a group of equations (vars renamed by position); None if not hashable."""
    local = {v: ("in", i) for i, v in enumerate(invars)}
    parts = []
    for k, e in enumerate(eqns):
        ins = tuple(literal_key(v) if isinstance(v, Literal) else local.get(v, ("?", id(v))) for v in e.invars)
        params = repr(sorted(e.params.items(), key=lambda kv: kv[0]))
        if "..." in params or " at 0x" in params:  # truncated or identity-based: not a safe key
            return None
        parts.append((e.primitive.name, params, ins, tuple(str(v.aval) for v in e.outvars)))
        for j, v in enumerate(e.outvars):
            local[v] = ("t", k, j)
    outs = tuple(literal_key(v) if isinstance(v, Literal) else local.get(v) for v in outvars)
    return (tuple(str(v.aval) for v in invars), tuple(parts), outs)


def jit_of(eqns, invars, outvars, in_sh, out_sh, donate: tuple[int, ...] = (), name: str = "evaluate") -> Callable:
    """`jax.jit` replaying ``eqns`` with these shardings; host callbacks guarded (see `_GuardedCallback`).

    A guarded executable carries ``callback_errors``: what its callbacks raised, for the dispatcher's
    watcher to fail the node with once the computation has finished.
    """
    errors: CallbackErrors | None = None
    if calls_host(eqns):
        errors = CallbackErrors()
        eqns = guard_callbacks(eqns, errors)
    kw = {} if out_sh is None else {"out_shardings": tuple(out_sh)}  # None: XLA chooses
    if donate:  # arguments whose buffers the outputs may reuse (the tracer checked nothing reads them later)
        kw["donate_argnums"] = tuple(donate)
    # keep_unused: a node runs on its slice even when its outputs ignore its inputs (jnp.zeros_like
    # of params on Explicit axes: jit would prune the input, run on one device, and refuse the mesh)
    fn = jax.jit(make_evaluator(eqns, invars, outvars, name), in_shardings=tuple(in_sh), keep_unused=True, **kw)
    if errors is not None:
        fn.callback_errors = errors
    return fn


def node_executable(eqns, invars, outvars, in_sh, out_sh, key: Any | None = None, donate: tuple[int, ...] = (),
                    name: str = "evaluate") -> Callable:
    """`jax.jit` of the equations with the given shardings, shared with identical nodes (``out_sh`` None: XLA
    chooses, see `chosen_out_shardings`); ``donate``: positions of arguments whose buffers it may reuse."""
    if key is not None:
        key = (key, tuple(in_sh), None if out_sh is None else tuple(out_sh), tuple(donate))
        hit = _EXECUTABLES.get(key)
        if hit is not None:
            return hit[1]
    fn = jit_of(eqns, invars, outvars, in_sh, out_sh, donate, name)
    if key is not None:
        if len(_EXECUTABLES) >= _MAX_EXECUTABLES:
            _EXECUTABLES.clear()
        _EXECUTABLES[key] = (eqns, fn)  # eqns keep the jaxprs in the key alive
    return fn


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


def executable_with_chosen_outputs(eqns, invars, outvars, in_sh, s: VirtualSlice, key, donate: tuple[int, ...] = (),
                                   declared: list | None = None, name: str = "evaluate"):
    """A node's executable whose outputs XLA places, and the shardings it gives them.

    ``declared``: per output, a sharding the code gave it (a compiled function's out_specs, a nested
    jit's out_shardings), kept as written, or None where XLA chooses; one compile serves both (jit's
    None leaves are XLA's to choose). An output XLA puts on part of the slice only (a value that
    depends on no input may land on one device) is replicated over the slice instead, with an
    executable that says so: pw keeps every node's values on its slice.
    """
    declared = list(declared) if declared is not None and any(d is not None for d in declared) else None
    if declared is not None and key is not None:
        key = (key, tuple(declared))
    fn = node_executable(eqns, invars, outvars, in_sh, declared, key, donate, name)
    chosen = chosen_out_shardings(fn, invars, outvars, in_sh, s, key)
    devices = set(s.devices)
    out = [
        d if d is not None else c if c.device_set == devices else NamedSharding(s.mesh, PartitionSpec())
        for d, c in zip(declared or [None] * len(chosen), chosen)
    ]
    if any(o is not c and (declared is None or declared[i] is None) for i, (o, c) in enumerate(zip(out, chosen))):
        fn = node_executable(eqns, invars, outvars, in_sh, out, key, donate, name)
    return fn, out


def _on_slice(sharding: Sharding, ndim: int, s: VirtualSlice) -> Sharding:
    """``sharding`` as a NamedSharding on the slice's mesh where XLA gave an equivalent positional one."""
    if isinstance(sharding, NamedSharding) and sharding.mesh == s.mesh:
        return sharding
    if is_one_device_output(sharding, s):  # the kind the arrays really carry, and JAX's cache keys on it
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

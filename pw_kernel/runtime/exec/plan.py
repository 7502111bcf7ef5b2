"""Execution plans: a ProgramGraph lowered to a flat list of steps over numbered value slots.

The dispatcher's hot loop only indexes lists: ``outs = step.call(*[slots[i] for
i in step.ins])``. Everything else (which slot dies where, which future a step
publishes, which devices it occupies) is decided here, once per graph and mode.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Literal

import jax
from jax.sharding import NamedSharding, PartitionSpec

from ..devices import is_one_device_output, remote_device_id
from ..errors import ArgumentError, FusedModeError, SliceError
from ..trace.graph import Node, ProgramGraph, Value, nbytes_of
from ..remote.client import RemoteCall, runs_python
from ..remote.transfer import RemoteTransfer
from ..trace.executables import jit_of, sub_jaxprs
from ..trace.sources import fmt_sources

ExecMode = Literal["fused", "chained"]


class Executable:
    """What execution learns about a step's executable as it runs: compiled yet, collectives, device time.

    A plan is cached and shared by every run of its graph, so its steps never
    change once planned; what execution finds out lives here, the one mutable
    part a step points at, each field with one writer at a time: the dispatcher's
    compile (compiled yet, compiling, collectives: the dispatching thread hands
    them to the compile thread) and `RunAhead.finished` on the completing thread
    (device time).
    """

    __slots__ = ("compile_first", "compiling", "collectives", "cost", "measured", "probe")

    def __init__(self, compile_first: bool = False):
        self.compile_first = compile_first  # a jax.jit not yet run by this step: compile it ahead (its own event)
        # being compiled on the compile thread: its steps have no credit until it is (set by the dispatching
        # thread as it hands the compile over, cleared with ``compile_first`` by the compile thread, under the
        # controller's lock)
        self.compiling = False
        self.collectives = False  # its compiled executable holds collectives (known once compiled)
        self.cost = 1000  # ns of device time, a running mean (`RunAhead.finished`; fair share charges it)
        self.measured = 0  # how many executions ``cost`` has seen (the first sets it)
        #: the position of an output the execution computes (not an argument returned as it was: jit
        #: forwards those), learnt at its first call: what completion asks whether the whole node has
        #: computed (its outputs are ready together). None: not yet known; -1: ask every output.
        self.probe: int | None = None

    def __repr__(self) -> str:
        return f"Executable(compile_first={self.compile_first}, collectives={self.collectives}, cost={self.cost})"


@dataclasses.dataclass(frozen=True, eq=False)
class Step:
    """One dispatchable unit: a graph node (or, fused, the whole program). Immutable once planned."""

    name: str
    kind: str
    call: Any
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    frees: tuple[int, ...]  # slots whose last reader is this step
    publishes: tuple[tuple[int, int], ...]  # (output index j, position in outs) this step produces
    island: int
    src_island: int | None
    devices: tuple[int, ...]
    nbytes: int
    shapes: str
    node: Node | None
    remote: bool = False  # runs on a remote island: the watcher reads its timing from the actor
    host_callbacks: bool = False  # may block the thread that dispatches it (XLA:CPU runs callbacks there)
    donates: tuple[int, ...] = ()  # slots whose buffers its outputs may reuse (donated arguments)
    outs_donated: bool = False  # a later step donates one of its outputs: completion must not wait on them
    exe: Executable = dataclasses.field(default_factory=Executable)
    fused_nodes: int = 1  # graph nodes it runs as one executable (fused, or a segment)
    #: what its arguments will be (shape, dtype, sharding), for compiling it before they exist
    in_values: tuple[Value, ...] = ()

    @property
    def collectives(self) -> bool:
        """Whether its compiled executable holds collectives (False until it has been compiled)."""
        return self.exe.collectives


@dataclasses.dataclass(eq=False)
class Plan:
    mode: ExecMode
    steps: list[Step]
    n_slots: int
    input_slots: tuple[int, ...]
    const_slots: dict[int, Any]
    output_slots: tuple[int, ...]
    #: step index whose completion makes output j ready (-1: ready when the run starts)
    output_step: tuple[int, ...]
    #: estimated peak bytes the run allocates per device id (for memory-aware admission)
    peak_bytes: dict[int, int] = dataclasses.field(default_factory=dict)
    #: a one-step plan whose step reads only the run's inputs and makes every output: the input
    #: positions of its arguments (its caller may run it whole at submit, `Lifecycle.lone_args`)
    lone_args: tuple[int, ...] | None = None


_EXPORT_KEYS: dict[int, tuple[Any, str]] = {}


def _export_key(fn) -> str:
    """A name for an executable on remote actors (the entry keeps ``fn`` alive, so its id is not reused)."""
    hit = _EXPORT_KEYS.get(id(fn))
    if hit is None:
        hit = _EXPORT_KEYS[id(fn)] = (fn, f"x{len(_EXPORT_KEYS)}-{id(fn)}")
    return hit[1]


def _refuse_host_callbacks(nodes: list[Node], graph: ProgramGraph) -> None:
    """A node on a remote island that calls the host, refused at submit where its Python cannot run there.

    A Ray actor and the Pathways service run such a node as its pickled function (`remote/shipped.py`);
    an island whose link runs only jax.export artifacts cannot: export cannot carry a host callback.
    """
    for node in nodes:
        if node.host_callbacks and not runs_python(node.slice.island.remote):
            raise SliceError(
                f"node {node.name!r} of program {graph.name!r} calls the host (jax.debug.print, jax.pure_callback "
                f"or io_callback), and its slice {node.slice.name!r} is on a remote island "
                f"({node.slice.island.remote!r}), which runs nodes as jax.export artifacts: host callbacks cannot "
                f"be exported. Put that node on a local slice or a Ray island, or take the callback out (to watch "
                f"a value, return it and `pw.log` it).{_where(node)}"
            )


def _where(node: Node) -> str:
    return fmt_sources((node.source,)) if node.source is not None else ""


def _remote_call(node: Node, graph: ProgramGraph, call, ins, outs):
    """Wrap ``call`` for a node that touches a remote island (None if it does not)."""
    dst = node.slice.island.remote if node.slice is not None else None
    src = node.src_slice.island.remote if node.src_slice is not None else None
    vals = graph.values
    if node.kind == "transfer":
        if dst is None and src is None:
            return None
        return RemoteTransfer(src, dst, vals[outs[0]].sharding, vals[outs[0]])
    if dst is None:
        return None
    _refuse_host_callbacks([node], graph)
    if node.host_callbacks and getattr(call, "callback_errors", None) is None:  # not a replayed jaxpr: no way there
        raise SliceError(
            f"node {node.name!r} ({node.kind}) of program {graph.name!r} runs Python on the controller each time, "
            f"and its slice {node.slice.name!r} is on a remote island. Put it on a local slice.{_where(node)}"
        )
    what = f"node {node.name!r} of program {graph.name!r}"
    return RemoteCall(call, dst, [vals[i] for i in ins], [vals[i] for i in outs], _export_key(call), what, _where(node),
                      donate=tuple(sorted(node.donated)))


def _devices(node: Node) -> tuple[int, ...]:
    ids: list[int] = []
    for s in (node.src_slice, node.slice):
        if s is None:
            continue
        if s.island.remote is None:
            ids += [d.id for d in s.devices]
        else:
            pos = {d: k for k, d in enumerate(s.island.devices)}
            ids += [remote_device_id(s.island, pos[d]) for d in s.devices]
    return tuple(dict.fromkeys(ids))


def _step_for(node: Node, graph: ProgramGraph, call, ins, outs, devices: dict, name=None, kind=None,
              wrap_remote=True) -> dict[str, Any]:
    """A step's fields for ``node`` (made a `Step` by `_finish`, which adds what depends on the other steps).

    ``devices``: a memo of `_devices` per (source slice, slice), shared by one plan's steps.
    """
    vals = graph.values
    remote = _remote_call(node, graph, call, ins, outs) if wrap_remote else None
    if remote is not None:
        call = remote
    where = (id(node.src_slice), id(node.slice))
    devs = devices.get(where)
    if devs is None:
        devs = devices[where] = _devices(node)
    return dict(
        name=name or node.name,
        kind=kind or node.kind,
        call=call,
        ins=tuple(ins),
        outs=tuple(outs),
        island=node.slice.island.id,
        src_island=node.src_slice.island.id if node.src_slice is not None else None,
        devices=devs,
        nbytes=sum(vals[i].nbytes for i in outs),
        shapes=", ".join(vals[i].type_str for i in ins) + " -> " + ", ".join(vals[i].type_str for i in outs),
        node=node,
        remote=getattr(call, "lands_remote", False),
        host_callbacks=node.host_callbacks,
        donates=tuple(ins[i] for i in node.donated) if remote is None else (),
        exe=Executable(compile_first=hasattr(call, "lower")),
        in_values=tuple(vals[i] for i in ins),
    )


def _finish(mode: ExecMode, graph: ProgramGraph, fields: list[dict], outputs: tuple[int, ...], n_slots: int) -> Plan:
    """The plan of these steps (each a `_step_for` dict): which slots each frees and which outputs it publishes."""
    keep = set(outputs) | set(graph.inputs)
    last_reader: dict[int, int] = {}
    for k, st in enumerate(fields):
        for i in st["ins"]:
            last_reader[i] = k
    frees: dict[int, list[int]] = {}
    for slot, k in last_reader.items():
        if slot not in keep:
            frees.setdefault(k, []).append(slot)
    producer = {slot: k for k, st in enumerate(fields) for slot in st["outs"]}
    output_step = tuple(producer.get(slot, -1) for slot in outputs)
    publishes: dict[int, list[tuple[int, int]]] = {}
    for j, (slot, k) in enumerate(zip(outputs, output_step)):
        if k >= 0:
            publishes.setdefault(k, []).append((j, slot))
    donated = {slot for st in fields for slot in st["donates"]}
    steps = [
        Step(
            **st,
            frees=tuple(frees.get(k, ())),
            publishes=tuple((j, st["outs"].index(slot)) for j, slot in publishes.get(k, ())),
            outs_donated=bool(donated) and any(slot in donated for slot in st["outs"]),
        )
        for k, st in enumerate(fields)
    ]
    return Plan(
        mode=mode,
        steps=steps,
        n_slots=n_slots,
        input_slots=graph.inputs,
        const_slots=dict(graph.consts),
        output_slots=outputs,
        output_step=output_step,
        peak_bytes=_peak_bytes(graph, steps, outputs),
        lone_args=_lone_args(steps, graph.inputs, outputs),
    )


def _lone_args(steps: list[Step], input_slots: tuple[int, ...], outputs: tuple[int, ...]) -> tuple[int, ...] | None:
    """Where a one-step plan's step finds its arguments among the run's inputs (None: not such a plan).

    Such a run needs no value slots: its caller passes the inputs straight to the step.
    """
    if len(steps) != 1:
        return None
    st = steps[0]
    position = {slot: k for k, slot in enumerate(input_slots)}
    if len(st.publishes) != len(outputs) or any(i not in position for i in st.ins):
        return None
    return tuple(position[i] for i in st.ins)


def shard_bytes(value) -> dict[int, int]:
    """Bytes a value occupies on each device it lives on (a replica counts in full)."""
    sh = value.sharding
    if sh is None:
        return {}
    try:
        shard = sh.shard_shape(value.shape)
    except Exception:
        shard = value.shape
    nbytes = nbytes_of(shard, value.dtype)
    return {d.id: nbytes for d in sh.device_set}


def _peak_bytes(graph: ProgramGraph, steps: list[Step], outputs: tuple[int, ...]) -> dict[int, int]:
    """Walk the steps in order: add each step's outputs, drop slots at their last reader; keep the peak.

    An estimate: it counts the buffers the run allocates (node outputs, transfers),
    not its inputs (they exist already) nor XLA's scratch space inside a node. A
    donated argument's buffer is reused for the outputs: it is dropped before they
    are added, and a donated input of the run (not counted) makes as many bytes of
    outputs free.
    """
    live: dict[int, int] = {}
    peak: dict[int, int] = {}
    size: dict[int, dict[int, int]] = {}
    values = graph.values
    sizes: dict[tuple, dict[int, int]] = {}  # (sharding, shape, dtype) -> bytes per device: a loop repeats them

    def sized(v) -> dict[int, int]:
        try:
            key = (v.sharding, v.shape, v.dtype)
            hit = sizes.get(key)
        except TypeError:  # an unhashable sharding or dtype
            return shard_bytes(v)
        if hit is None:
            hit = sizes[key] = shard_bytes(v)
        return hit

    inputs = set(graph.inputs)
    gone: set[int] = set()
    for st in steps:
        reused: dict[int, int] = {}
        for slot in st.donates:
            if slot in inputs:
                for d, n in sized(values[slot]).items():
                    reused[d] = reused.get(d, 0) + n
            elif slot in size and slot not in gone:
                gone.add(slot)
                for d, n in size[slot].items():
                    live[d] -= n
        added: dict[int, int] = {}
        for slot in st.outs:
            if slot < len(values):
                b = size[slot] = sized(values[slot])
            else:  # a fused output: sized like the program output it stands for
                b = size[slot] = sized(values[graph.outputs[slot - len(values)]])
            for d, n in b.items():
                added[d] = added.get(d, 0) + n
        for d, n in added.items():
            live[d] = live.get(d, 0) + max(0, n - reused.get(d, 0))
            if live[d] > peak.get(d, 0):
                peak[d] = live[d]
        for slot in st.frees:
            if slot in gone:
                continue
            for d, n in size.get(slot, {}).items():
                live[d] -= n
    return peak


def chained(graph: ProgramGraph) -> Plan:
    """One step per node, in the graph's (topological) order."""
    devices: dict = {}
    steps = [_step_for(n, graph, n.fn, n.inputs, n.outputs, devices) for n in graph.nodes]
    return _finish("chained", graph, steps, graph.outputs, len(graph.values))


def fusable(graph: ProgramGraph) -> str | None:
    """None if the program can run as one executable; else the reason it cannot."""
    work = [n for n in graph.nodes if n.kind != "transfer"]
    if not work:
        return "it has no compute or glue nodes"
    slices = {id(n.slice): n.slice.name for n in work}
    if any(n.kind == "input" for n in work):
        return "it takes batches from a data feed as it runs (input nodes)"
    if len(slices) > 1:
        return f"its nodes run on {len(slices)} slices ({', '.join(sorted(slices.values()))}); fusion needs one"
    entry = {v for v in (*graph.inputs, *graph.consts)}
    for n in graph.nodes:
        if n.kind == "transfer" and n.inputs[0] not in entry:
            return "a value moves between slices in the middle of it"
    return None


def fused(graph: ProgramGraph) -> Plan:
    """Input transfers, then the whole program as one `jax.jit` on its slice."""
    reason = fusable(graph)
    if reason is not None:
        raise FusedModeError(
            f"`mode='fused'`: program {graph.name!r} cannot run as one executable because {reason}. "
            f"Use mode='chained' (or 'auto', which picks chained here)."
        )
    work = [n for n in graph.nodes if n.kind != "transfer"]
    s = work[0].slice
    devices: dict = {}  # `_devices` per (source slice, slice), shared by the plan's steps
    jaxpr = graph.jaxpr.jaxpr
    var_of = dict(zip(jaxpr.invars, graph.inputs))
    var_of.update(zip(jaxpr.constvars, graph.consts))
    consumers: dict[int, list[Node]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            consumers.setdefault(i, []).append(n)
    steps: list[dict] = []
    fused_vars, fused_slots, in_sh = [], [], []
    for var, vid in var_of.items():
        users = consumers.get(vid)
        if not users:
            continue
        moved = [n for n in users if n.kind == "transfer"]
        if moved:
            t = moved[0]
            steps.append(_step_for(t, graph, t.fn, t.inputs, t.outputs, devices))
            slot = t.outputs[0]
        else:
            slot = vid
        fused_vars.append(var)
        fused_slots.append(slot)
        in_sh.append(graph.values[slot].sharding)
    out_sh = []
    for vid in graph.outputs:
        sh = graph.values[vid].sharding
        if not (isinstance(sh, NamedSharding) or is_one_device_output(sh, s)) or set(sh.device_set) != set(s.devices):
            sh = NamedSharding(s.mesh, PartitionSpec())
        out_sh.append(sh)
    call = jit_of(jaxpr.eqns, fused_vars, jaxpr.outvars, in_sh, out_sh, name=graph.name)
    # Fused outputs get fresh slots so chained-graph value ids stay meaningful.
    out_slots = list(range(len(graph.values), len(graph.values) + len(graph.outputs)))
    anchor = work[0]
    if s.island.remote is not None:
        _refuse_host_callbacks(work, graph)
        in_vals = [graph.values[i] for i in fused_slots]
        out_vals = [dataclasses.replace(graph.values[v], sharding=sh) for v, sh in zip(graph.outputs, out_sh)]
        call = RemoteCall(call, s.island.remote, in_vals, out_vals, _export_key(call))
    step = _step_for(
        anchor, graph, call, fused_slots, [], devices, name=f"{graph.name}[fused]", kind="compute", wrap_remote=False
    )
    steps.append(
        step
        | dict(
            outs=tuple(out_slots),
            nbytes=sum(graph.values[v].nbytes for v in graph.outputs),
            shapes=f"{len(work)} nodes fused",
            fused_nodes=len(work),
            host_callbacks=any(n.host_callbacks for n in work),
            exe=Executable(compile_first=hasattr(call, "lower")),
        )
    )
    return _finish("fused", graph, steps, tuple(out_slots), len(graph.values) + len(graph.outputs))


def segmented(graph: ProgramGraph, pieces: int, *, alike: bool = True) -> Plan:
    """The program fused in ``pieces`` consecutive segments (a segment of one node is that node's own step).

    ``alike``: up to twice as many segments where that makes them all one length (segments alike
    compile once: what a cut for compile size wants); else exactly ``pieces``, their lengths
    differing by one at most (a cut for time: each segment launch costs, on the CPU ~0.5 ms).

    What `auto` runs for a long program of repeated calls (segments alike share one jit:
    `_segment_call`), and once runs have shown that a step holds its devices longer than the
    run-ahead bound: cancel, Ctrl-C and a higher priority then act between segments, within
    the bound plus one segment, as they do between a chained run's nodes, while each segment
    still runs as one XLA executable. Input transfers come first, as in `fused`. Local slices
    only (a segment calls node executables inside a local jit).
    """
    devices: dict = {}
    steps = [_step_for(n, graph, n.fn, n.inputs, n.outputs, devices) for n in graph.nodes if n.kind == "transfer"]
    work = [n for n in graph.nodes if n.kind != "transfer"]
    n = len(work)
    pieces = max(1, min(pieces, n))
    if alike:
        pieces = next((p for p in range(pieces, min(2 * pieces, n) + 1) if n % p == 0), pieces)
        size = math.ceil(n / pieces)
        chunks = [work[a : a + size] for a in range(0, n, size)]
    else:
        size, longer = divmod(n, pieces)  # the first ``longer`` segments have one node more
        ends = itertools.accumulate(size + (k < longer) for k in range(pieces))
        chunks = [work[b - size - (k < longer) : b] for k, b in enumerate(ends)]
    read_after: dict[int, int] = {}  # slot -> index of the last chunk that reads it
    for c, chunk in enumerate(chunks):
        for n in chunk:
            for i in n.inputs:
                read_after[i] = c
    outputs = set(graph.outputs)
    for c, chunk in enumerate(chunks):
        if len(chunk) == 1:
            n = chunk[0]
            steps.append(_step_for(n, graph, n.fn, n.inputs, n.outputs, devices))
            continue
        made = {o for n in chunk for o in n.outputs}
        ins = list(dict.fromkeys(i for n in chunk for i in n.inputs if i not in made))
        outs = [o for n in chunk for o in n.outputs if o in outputs or read_after.get(o, -1) > c]
        call = _segment_call(graph, chunk, ins, outs, f"{graph.name}[{c}]")
        step = _step_for(chunk[0], graph, call, ins, outs, devices, name=f"{graph.name}[{c + 1}/{len(chunks)}]",
                         kind="compute")
        steps.append(step | dict(shapes=f"{len(chunk)} nodes fused ({chunk[0].name} .. {chunk[-1].name})",
                                 fused_nodes=len(chunk),
                                 host_callbacks=any(n.host_callbacks for n in chunk)))
    return _finish("fused", graph, steps, graph.outputs, len(graph.values))


_SEGMENTS: dict[Any, Any] = {}  # a segment's structure -> its jax.jit (segments alike compile once)


def _segment_call(graph: ProgramGraph, chunk: list[Node], ins: list[int], outs: list[int], name: str):
    """One `jax.jit` that calls the chunk's node executables in order (XLA inlines them: one executable).

    Segments alike (the same executables wired the same way, on values placed alike: a loop's
    repeats) share one jit, so a program cut into N equal segments of a repeated step compiles one.
    """
    local = {slot: ("in", k) for k, slot in enumerate(ins)}
    wiring = []
    for j, n in enumerate(chunk):
        wiring.append((id(n.fn), tuple(local[i] for i in n.inputs)))
        for k, o in enumerate(n.outputs):
            local[o] = ("node", j, k)
    vals = graph.values
    in_sh = tuple(vals[i].sharding for i in ins)
    out_sh = tuple(vals[o].sharding for o in outs)
    try:
        key = (tuple(wiring), tuple(local[o] for o in outs), in_sh, out_sh)
        hit = _SEGMENTS.get(key)
    except TypeError:  # an unhashable sharding: not shared
        key, hit = None, None
    if hit is not None:
        return hit[1]
    fns = [(n.fn, n.inputs, n.outputs) for n in chunk]

    def segment(*args):
        env = dict(zip(ins, args))
        for fn, n_ins, n_outs in fns:
            env.update(zip(n_outs, fn(*[env[i] for i in n_ins])))
        return tuple(env[o] for o in outs)

    segment.__name__ = segment.__qualname__ = name
    call = jax.jit(segment, in_shardings=in_sh, out_shardings=out_sh, keep_unused=True)
    if key is not None:
        if len(_SEGMENTS) >= 4096:
            _SEGMENTS.clear()
        _SEGMENTS[key] = ([n.fn for n in chunk], call)  # (the fns keep their ids from being reused)
    return call


def auto_segments(graph: ProgramGraph, plan: Plan, bound_ns: int | None) -> int:
    """How many segments `auto` cuts ``graph`` into, given its current ``plan``: 0 (keep the plan) until
    runs (two: the first often runs slow) have shown that a step of several nodes holds its devices for
    longer than the run-ahead bound; then enough that each holds them for at most about the bound, on
    the nodes' share of the measured time (nodes of one program are often alike)."""
    if not bound_ns or plan.mode != "fused":
        return 0
    total, long = 0, False
    for step in plan.steps:
        if step.kind == "transfer":
            continue
        if step.remote or step.host_callbacks or step.exe.measured < 2:
            return 0
        total += step.exe.cost
        long = long or (step.exe.cost > bound_ns and step.fused_nodes > 1)
    # Segments of at most the bound: the next is queued while one runs as long as what is queued is
    # under the bound (`RunAhead`), and each boundary costs a launch. Half-bound segments (two
    # always queued) measured 0.965-0.971x a 20-node program's fused throughput on the CPU, these
    # 0.983-0.995x (benchmarks/multitenancy.py, 3 s a figure).
    return math.ceil(total / bound_ns) if long else 0


#: Programs up to this many equations fuse in auto mode whatever they repeat: compiling them is quick.
FUSE_SMALL_EQNS = 300


def compile_sizes(jaxpr: Any) -> tuple[int, int]:
    """Equations XLA compiles for ``jaxpr`` fused (every call inlined) and chained (each called jaxpr once).

    A compiled function called N times is one jaxpr object in N call equations: chained
    compiles it once, fused inlines N copies.
    """
    inlined: dict[int, int] = {}  # id of a nested jaxpr -> its size with every call inlined

    def whole(j: Any) -> int:
        n = inlined.get(id(j))
        if n is None:
            n = len(j.eqns) + sum(whole(inner) for e in j.eqns for inner in sub_jaxprs(e))
            inlined[id(j)] = n
        return n

    seen: set[int] = set()

    def once(j: Any) -> int:
        n = len(j.eqns)
        for e in j.eqns:
            for inner in sub_jaxprs(e):
                if id(inner) not in seen:
                    seen.add(id(inner))
                    n += once(inner)
        return n

    return whole(jaxpr), once(jaxpr)


def auto_mode(graph: ProgramGraph) -> str:
    """'fused' for a program on one slice unless fusing would compile its code many times over.

    A loop of N calls of one step compiles that step once chained but N inlined copies
    fused, and XLA's compile time grows faster than the program (100 optimizer steps:
    about a minute fused, under a second chained), so auto runs such a program in segments
    of about `FUSE_SMALL_EQNS` equations (segments alike compile once, `_segment_call`),
    or chained where a node alone is that big.
    """
    work = sum(1 for n in graph.nodes if n.kind != "transfer")
    if work <= 1 or fusable(graph) is not None:
        return "chained"
    if any(n.donated for n in graph.nodes):  # chained, each node donates what it was given
        return "chained"
    whole, once = compile_sizes(graph.jaxpr.jaxpr)
    if whole <= max(FUSE_SMALL_EQNS, 2 * once):
        return "fused"
    if any(n.host_callbacks for n in graph.nodes) or any(
        n.slice is not None and n.slice.island.remote is not None for n in graph.nodes
    ):
        return "chained"  # (segments call node executables inside a local jit: not remote ones)
    per_segment = FUSE_SMALL_EQNS * work // whole  # nodes in a segment of about FUSE_SMALL_EQNS equations
    return "segments" if per_segment >= 2 else "chained"


def plan_for(graph: ProgramGraph, mode: str, bound_s: float | None = None) -> Plan:
    """The cached plan of ``graph`` for ``mode`` ('auto': see `auto_mode`; ``bound_s``: the run-ahead bound,
    which a fused program that turns out to be longer is cut into segments for, `auto_segments`)."""
    if mode not in ("auto", "fused", "chained"):
        raise ArgumentError(f"`mode` must be 'auto', 'fused' or 'chained'; got {mode!r}.")
    plan = graph._plans.get(mode)
    if plan is None:
        if mode == "auto":
            how = auto_mode(graph)
            if how == "segments":
                whole, _ = compile_sizes(graph.jaxpr.jaxpr)
                plan = segmented(graph, math.ceil(whole / FUSE_SMALL_EQNS))
            else:
                plan = plan_for(graph, how)
        else:
            plan = fused(graph) if mode == "fused" else chained(graph)
        graph._plans[mode] = plan
    elif mode == "auto" and bound_s and not graph._plans.get("auto cut"):
        pieces = auto_segments(graph, plan, int(bound_s * 1e9))
        if pieces > len(plan.steps):  # learned once: the cut plan replaces the other for auto
            plan = graph._plans["auto"] = segmented(graph, pieces, alike=False)
            graph._plans["auto cut"] = plan
    return plan

"""Program: a Python function traced once per input signature into a ProgramGraph and submitted."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from .core.records import NOTHING
from .devices import VirtualSlice
from .donation import check_not_donated, donated_to_any, still_read_among
from .errors import ArgumentError, TracerArgument
from .exec.now import LATER, call_now, lone_step
from .trace.compiled import CompiledFunction, array_signature, in_program_trace
from .trace.feeds import input_node
from .trace.graph import ProgramGraph
from .trace.signatures import is_traced_leaf, placed_signature, signature
from .trace.tracing import trace_program

if TYPE_CHECKING:
    from .exec.controller import Controller
    from .exec.plan import Step
    from .run import Run


#: Signatures a program remembers the graph of (futures are keyed by the graph output they came
#: from, so a program fed by several others has a key per combination): past it, they are
#: looked up again through `placed_signature`, which keys the graphs themselves.
_MAX_SIGNATURES = 256


class Program:
    """A traced dataflow program; calling it submits a run and returns futures at once.

    Two ways to run one: ``prog(*args)`` (its outputs, as futures) and ``prog.submit(*args,
    tenant=..., priority=...)`` (its `Run`). Both go one way (`_submit`); `call_run` is that
    way's full form, for pw's own front ends (a ``%%pathways`` cell, the service) that need the
    run and its outputs together and may pass the graph they traced. A compiled function's call on
    arrays takes a shortcut to the same place (`_call_arrays`: no pytree walk).

    Example::

        @pw.program
        def step(v):
            x = a(v)
            return b(x), a(c(x))

        y, z = step(jnp.array([1.0, 2.0]))   # futures, immediately
        step.trace(v)                        # the ProgramGraph
    """

    @staticmethod
    def input_node(take, avals, *, slice, name: str = "input") -> list:  # noqa: A002 - as pw.compiled's keyword
        """Inside a program's trace: values that the run takes from ``take()`` when it gets there.

        See `trace.feeds.input_node` (how `pw.prefetch` reads data in a traced loop). Example::

            (x,) = pw.Program.input_node(take, [jax.ShapeDtypeStruct((4,), jnp.float32, sharding=sh)], slice=s)
        """
        return input_node(take, avals, slice=slice, name=name)

    @staticmethod
    def tracing() -> bool:
        """Whether a program is being traced on this thread (what reads data there makes input nodes).

        Example::

            if pw.Program.tracing():
                ...   # inside a @pw.program's trace
        """
        return in_program_trace()

    def __init__(
        self,
        fn: Callable,
        *,
        controller: Callable[[], Controller],
        name: str | None = None,
        slice: VirtualSlice | None = None,  # noqa: A002 - where glue with no placed input goes
        mode: str | None = None,
        tenant: str = "default",
    ):
        self.fn = fn
        self._controller = controller  # the lookup of the controller runs are submitted to
        self.name = name or getattr(fn, "__name__", "program")
        self.slice = slice
        self.mode = mode
        self.tenant = tenant
        self._cache: dict[Any, ProgramGraph] = {}  # signature -> graph
        self._placed: dict[Any, ProgramGraph] = {}  # the same graphs by `placed_signature`
        self._cache_lock = threading.Lock()
        self._owner = None  # the controller the cached graphs were traced against
        self._by_arrays: dict[tuple, tuple[Any, ProgramGraph]] = {}  # array signature -> (controller, graph)
        functools.update_wrapper(self, fn, updated=())

    def trace(self, *args, **kwargs) -> ProgramGraph:
        """The ProgramGraph for these arguments (traced once per signature, then cached)."""
        return self._trace(args, kwargs)[0]

    def _trace(self, args, kwargs, keep: tuple[int, ...] = ()) -> tuple[ProgramGraph, list]:
        """The graph for these arguments, and their traced leaves (arrays and futures: the run's inputs).

        ``keep``: traced inputs not to donate (pw still reads them elsewhere).
        """
        c = self._controller()
        if not kwargs and not keep:
            # Positional jax Arrays only (a training loop's call): the graph by their shapes, dtypes
            # and shardings, as `signature` keys them, without the pytree walk.
            hit = array_signature(args)
            if hit is not None:
                graph = self._graph_by_arrays(c, *hit)
                # (A donating run marks what it donates: the futures themselves, not their arrays.)
                if hit[1] is args or not graph.donated_inputs:
                    return graph, list(hit[1])
        return self._trace_full(c, args, kwargs, keep)

    def _graph_by_arrays(self, c: Controller, key: tuple, arrays: tuple) -> ProgramGraph:
        """The graph for positional arrays of this `array_signature` key (traced the full way the first time)."""
        hit = self._by_arrays.get(key)
        if hit is not None and hit[0] is c:
            return hit[1]
        graph = self._trace_full(c, arrays, {}, ())[0]
        if len(self._by_arrays) >= 64:  # signatures remembered
            self._by_arrays.clear()
        self._by_arrays[key] = (c, graph)
        return graph

    def _trace_full(self, c, args, kwargs, keep: tuple[int, ...]) -> tuple[ProgramGraph, list]:
        _, leaves, key, consts = signature(args, kwargs)
        traced = leaves if not consts else [x for x in leaves if is_traced_leaf(x)]
        if keep:
            key = (key, keep)
        with self._cache_lock:
            if self._owner is not c:
                self._cache.clear()
                self._placed.clear()
                self._owner = c
            graph = self._cache.get(key)
        if graph is None:
            # Arrays where futures were (or the reverse) on the same slices: the same graph.
            placed = placed_signature(key[0] if keep else key, leaves, c.resources)
            if keep:
                placed = (placed, keep)
            with self._cache_lock:
                graph = self._placed.get(placed)
            if graph is None:
                graph = trace_program(
                    self.fn, args, kwargs, name=self.name, resources=c.resources, default_slice=self.slice, keep=keep
                )
            with self._cache_lock:
                if len(self._cache) >= _MAX_SIGNATURES:  # bounded: a key per combination of producers
                    self._cache.clear()
                self._cache[key] = graph
                self._placed[placed] = graph
        return graph, traced

    def submit(
        self,
        *args,
        name: str | None = None,
        mode: str | None = None,
        tenant: str | None = None,
        weight: float = 1.0,
        priority: int = 0,
        source_map: dict[str, str] | None = None,
        on_error=None,
        **kwargs,
    ) -> Run:
        """Trace (or reuse the trace) and submit; returns the Run (its futures are ``run.outputs``).

        ``source_map``: node name -> where it came from, for error messages. ``on_error`` is
        called with the run's error if it fails, before any future raises it.

        Example::

            run = step.submit(x, tenant="B", priority=10)
            run.wait(); run.outputs
        """
        return self._submit(args, kwargs, name, mode, tenant, weight, priority, source_map, on_error)[0]

    def call_run(
        self, *args, name: str | None = None, mode: str | None = None, tenant: str | None = None,
        weight: float = 1.0, priority: int = 0, source_map: dict[str, str] | None = None, on_error=None,
        graph: ProgramGraph | None = None, on_computed=None, **kwargs,
    ) -> tuple[Run, Any]:
        """`submit`, returning the run and its outputs, held from before it started (a run that ends inside
        this call keeps none of its futures itself once final). ``graph``: what ``trace(*args)`` returned
        for these very arguments, if the caller has it (it is not looked up again). ``on_computed``: see
        `Controller.call`.

        Example::

            g = f.trace(v)
            run, (y, z) = f.call_run(v, name="first", graph=g)
        """
        run, futures = self._submit(
            args, kwargs, name, mode, tenant, weight, priority, source_map, on_error, graph, on_computed
        )
        return run, run.tree(futures)

    def call_now(self, *args, tenant: str, name: str, mode: str, answer: Callable[[list, int, int], None]) -> str:
        """Call its one node on ``args`` (arrays) now, with no run, if the controller has none live and the
        node is quick: ``answer(outputs, start_ns, end_ns)``, and "ran"; else "later" or "never" (for these
        arguments' graph), and nothing was done: `call_run` it. The Pathways service's call on an idle pool
        (`exec/now.py`).

        Example::

            if f.program.call_now(x, tenant="alice", name="alice-7", mode="chained", answer=reply) != "ran":
                f.program.call_run(x, tenant="alice")
        """
        c = self._controller()
        if not c.idle:  # (asked before the trace: a busy pool costs the call nothing more)
            return LATER
        graph, traced = self._trace(args, {})
        return call_now(c, graph, traced, tenant, name, mode, answer)

    def lone_step(self, *args, mode: str) -> tuple[Any, Step, list[int]] | None:
        """(its controller, the one step it runs on ``args``, which arguments that step takes) if it could be
        called at once (`call_now`); else None. Kept by a caller whose calls all trace alike (the Pathways
        service: an exported function's arguments have its shapes), it calls `exec/now.py:run_now` directly.

        Example::

            c, st, feed = f.program.lone_step(x, mode="chained")
            run_now(c, st, [x], "alice", "alice-7", reply)
        """
        c = self._controller()
        graph, _ = self._trace(args, {})
        found = lone_step(c, graph, mode)
        return None if found is None else (c, *found)

    def _submit(
        self, args: tuple, kwargs: dict, name: str | None = None, mode: str | None = None, tenant: str | None = None,
        weight: float = 1.0, priority: int = 0, source_map=None, on_error=None, graph: ProgramGraph | None = None,
        on_computed=None,
    ) -> tuple[Run, list]:
        if in_program_trace():
            raise ArgumentError(
                f"`{self.name}.submit` was called while another program is being traced (a `@pw.program` or a "
                f"`%%pathways` cell): a run cannot start inside a program. Call `{self.name}(...)` there instead: "
                f"it becomes part of the enclosing program."
            )
        if graph is None:
            graph, traced = self._trace(args, kwargs)
        else:  # the caller traced these very arguments (`trace`): their leaves, without the lookup
            traced = [x for x in jax.tree_util.tree_leaves((args, kwargs)) if is_traced_leaf(x)]
        keep = self._inputs_still_read(traced, graph.donated_inputs)
        if keep:  # traced again with those inputs kept (once per signature and mask, then cached)
            graph, _ = self._trace(args, kwargs, keep)
        run, futures = self._controller().call(
            graph, traced, name=name or self.name, mode=mode or self.mode, tenant=tenant or self.tenant,
            weight=weight, priority=priority, source_map=source_map, on_error=on_error, on_computed=on_computed,
        )
        return run, futures

    def _call_arrays(self, args: tuple, key: tuple, arrays: tuple):
        """Call on ``args``, whose `array_signature` is (``key``, ``arrays``); returns the output futures.

        What calling the program does, without the pytree walk: a compiled function's call
        (`CompiledFunction.__call__`), the commonest call there is. A graph that donates an input
        takes the full way (which inputs pw still reads decides what it may donate).
        """
        c = self._controller()
        graph = self._graph_by_arrays(c, key, arrays)
        if graph.donated_inputs:
            return self(*args)
        traced = list(arrays)
        self._inputs_still_read(traced, NOTHING)
        run, futures = c.call(graph, traced, name=self.name, mode=self.mode, tenant=self.tenant)
        return run.tree(futures)

    def _inputs_still_read(self, traced: list, donated: dict[int, str]) -> tuple[int, ...]:
        """Refuse inputs an earlier run was given (donated); of those this one donates, the ones pw still reads."""
        if donated_to_any():  # something was donated once: look at each input (else nothing to look for)
            for i, x in enumerate(traced):
                check_not_donated(x, self.name, lambda: f"input {i} ({getattr(x, 'dtype', '')}{list(x.shape)})")
        if not donated:
            return ()
        read = still_read_among([traced[i] for i in donated])
        return tuple(sorted(i for k, i in enumerate(donated) if k in read))

    def __call__(self, *args, **kwargs):
        """Submit a run and return its outputs as futures; inside another program, become part of it.

        Example::

            @pw.program
            def train(state, batch):
                for _ in range(3):
                    state = step(state, batch)   # `step`, a program too, is inlined here
                return state
        """
        if in_program_trace():
            # Like a jax.jit called inside a jax.jit: its compiled functions and glue become nodes of
            # the program being traced (one run, one graph), with this program's own options unused.
            return self.fn(*args, **kwargs)
        run, futures = self._submit(args, kwargs)
        return run.tree(futures)

    @property
    def cache_size(self) -> int:
        """How many graphs were traced (one per input signature)."""
        return len(self.graphs)

    @property
    def graphs(self) -> list[ProgramGraph]:
        """The graphs traced so far, one per input signature (oldest first)."""
        with self._cache_lock:
            return list({id(g): g for g in self._cache.values()}.values())

    def __repr__(self) -> str:
        return f"<pw.Program {self.name!r}: {self.cache_size} traced signatures>"


class Compiled(CompiledFunction):
    """What `pw.compiled` returns: one node inside a program, and called alone, a one-node program of its own.

    Example::

        f = pw.compiled(lambda x: x * 2, slice=s)
        f(jnp.ones(4)).result()        # a run of one node
    """

    def __init__(self, fn: Callable, *, controller: Callable[[], Any], **options: Any):
        super().__init__(fn, **options)
        self.program = Program(self, name=self.name, slice=self.slice, controller=controller)

    def __call__(self, *args, **kwargs):
        if not in_program_trace():
            if not kwargs:
                hit = array_signature(args)
                if hit is not None:  # concrete arrays (or resolved futures): the graph by their signature
                    return self.program._call_arrays(args, *hit)
            try:
                return self.program(*args, **kwargs)
            except TracerArgument:  # called inside jax.jit / jax.grad (nothing was submitted): a jitted function
                pass
        return super().__call__(*args, **kwargs)  # a node of the program being traced

"""The runtime's entry points: the calls that make slices, compiled functions, programs and islands.

This is the one place that looks up the process's controller and hands it to
what needs it (programs, compiled functions, remote islands), so nothing below
imports upwards.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from .devices import Island, VirtualSlice
from .errors import ArgumentError, PathwaysError
from .exec.controller import controller
from .profiling import Profile
from .program import Compiled, Program
from .remote.client import RemoteIsland
from .remote.ray import RayLink, start_ray_islands
from .trace.compiled import CompiledFunction


def devices() -> tuple:
    """The physical devices the controller drives.

    Example::

        len(pw.devices())   # 8 on a laptop
    """
    return controller().devices


def islands() -> list[Island]:
    """The islands (groups of devices with a fast interconnect).

    Example::

        [i.id for i in pw.islands()]
    """
    return list(controller().islands)


def slice(  # noqa: A001
    n: int | None = None, mesh=None, name: str | None = None, island=None, axis_types=None
) -> VirtualSlice:
    """Ask the resource manager for ``n`` devices arranged as ``mesh`` (a dict axis -> size).

    Placement balances load: 1:1 onto free devices while there are some, then
    time-multiplexed. The slice lives on one island (``island=`` to choose).
    ``axis_types`` (a `jax.sharding.AxisType`, or one per axis) makes Explicit
    axes; the default is Auto. ``mesh`` may also be a `jax.sharding.Mesh` of the
    notebook's own (``jax.make_mesh``): the slice is then that very mesh, its
    devices and axis types, so pw results and the notebook's arrays combine.

    Example::

        s = pw.slice(4, mesh={"data": 2, "model": 2}, name="a")
        s.mesh, s.devices, s.sharding("data", None)
        t = pw.slice(mesh=jax.make_mesh((2, 4), ("x", "y")))  # Explicit axes, as jax.make_mesh gives
    """
    try:
        return controller().slice(n, mesh=mesh, name=name, island=island, axis_types=axis_types)
    except PathwaysError as e:
        # The message names the call and the fix; the resource manager's frames would only bury it.
        raise e.with_traceback(None) from None


def compiled(
    fn: Callable | None = None,
    *,
    slice: VirtualSlice | str | None = None,  # noqa: A002 - the public keyword is `slice`
    in_specs: Any = None,
    out_specs: Any = None,
    name: str | None = None,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Sequence[str] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    donate_argnames: str | Sequence[str] | None = None,
    **jit_options: Any,
):
    """Compile ``fn`` for a slice: `jax.jit` with NamedShardings on the slice's mesh.

    ``in_specs`` / ``out_specs`` are PartitionSpecs (a pytree prefix of the
    arguments / results, as for `jax.jit`). None (the default) leaves it to JAX,
    as `jax.jit` without ``in_shardings`` / ``out_shardings`` does: an argument
    on the slice keeps its sharding (one from elsewhere gets the same spec on the
    slice, or is replicated), an output gets the sharding XLA propagates.
    Usable as a decorator: ``@pw.compiled(slice=s, in_specs=P("d"))``.
    ``static_argnums`` / ``static_argnames`` are `jax.jit`'s: those arguments are
    Python values baked into the trace (``in_specs`` then cover the others).
    ``donate_argnums`` / ``donate_argnames`` are `jax.jit`'s too: the outputs may
    reuse those arguments' buffers, and an array or future passed there is used up
    (reading it later raises, naming the run it was donated to). Safe by construction:
    in a program, donating a value that a later node reads or that the program
    returns is refused at trace time; a value pw itself still has to read (another
    run's input, a checkpoint being written) is not donated, which is a copy.

    Example::

        a = pw.compiled(lambda x: x * 2, slice=s)
        fut = a(jnp.array([1.0, 2.0]))     # a one-node program; returns a Future
    """
    if jit_options:
        raise ArgumentError(
            f"`pw.compiled` got {', '.join(map(repr, jit_options))}, which it does not take. It takes slice, "
            f"in_specs, out_specs, name, static_argnums, static_argnames, donate_argnums and donate_argnames."
        )
    if isinstance(slice, str):
        slice = controller().resources.get(slice)
    if slice is None:
        raise ArgumentError(
            "`pw.compiled` needs `slice=`: the virtual slice the function runs on, e.g. "
            "`s = pw.slice(2)` then `pw.compiled(fn, slice=s)`."
        )

    def wrap(f: Callable) -> CompiledFunction:
        return Compiled(
            f, controller=controller, slice=slice, in_specs=in_specs, out_specs=out_specs, name=name,
            static_argnums=static_argnums, static_argnames=static_argnames,
            donate_argnums=donate_argnums, donate_argnames=donate_argnames,
        )

    return wrap if fn is None else wrap(fn)


def program(
    fn: Callable | None = None,
    *,
    name: str | None = None,
    slice: VirtualSlice | None = None,  # noqa: A002
    mode: str | None = None,
    tenant: str = "default",
):
    """Decorate a function as a dataflow program: traced once per signature, submitted on call.

    Arrays and futures among the arguments are traced; other leaves are
    constants (part of the trace-cache key). ``mode`` is 'auto' (default),
    'fused' or 'chained'. Calls return futures at once.

    Example::

        @pw.program
        def f(v):
            x = a(v)
            return b(x), a(c(x))
    """

    def wrap(f: Callable) -> Program:
        return Program(f, name=name, slice=slice, mode=mode, tenant=tenant, controller=controller)

    return wrap if fn is None else wrap(fn)


def add_ray_islands(
    address: str | None = None,
    *,
    count: int | None = None,
    devices_per_island: int | None = None,
    platform: str = "cpu",
    env: dict[str, str] | None = None,
) -> list[Island]:
    """Make Ray actors the controller's remote islands; returns the new islands.

    With ``count``, start that many actors (e.g. on one machine, for testing);
    otherwise one per alive Ray node that has no live island here yet (called
    again after a node joins, it adds that node's; in a client of a Pathways service that serves a
    Ray cluster, ``serve --ray``, the service's islands this client lacks). On CPU each actor simulates
    ``devices_per_island`` devices. Slices go there with ``pw.slice(n, island=i)``.

    Example::

        ray.init(address="auto")            # or let this call start a local Ray
        islands = pw.add_ray_islands(count=2, devices_per_island=4)
        s = pw.slice(4, island=islands[0].id)
    """
    ctrl = controller()
    if ctrl.islands_from is not None and address is None and count is None:  # a Pathways service's Ray nodes
        return ctrl.islands_from()
    homes = {i.remote.info.get("node_id") for i in ctrl.islands if i.remote is not None and not i.lost}
    return ctrl.add_remote_islands(
        ray_islands(address, count=count, devices_per_island=devices_per_island, platform=platform, env=env,
                    skip_nodes=homes if count is None else ())
    )


def ray_islands(address: str | None = None, **options) -> list[RemoteIsland]:
    """Ray actors started (or attached) as `RemoteIsland` s, one per alive Ray node unless ``count=`` says
    how many, for a controller to add (`pw.add_ray_islands`; the Pathways service's ``serve --ray``)."""
    started = start_ray_islands(address, **options)
    return [RemoteIsland(RayLink(actor), info, offset) for actor, info, offset in started]


def profile(logdir: str | None = None) -> Profile:
    """Capture XLA's ops while a ``with`` block runs, placed inside pw's nodes; see `Profile`.

    ``logdir``: where JAX's profiler writes (TensorBoard's profile plugin reads it too);
    default a temporary folder, removed at exit (and once four newer profiles have made theirs).

    Example::

        with pw.profile() as prof:
            step(params, opt_state, batch)[2].result()
        pw.timeline(prof)        # each device's ops on a lane under its nodes
    """
    if logdir is not None and not isinstance(logdir, (str, os.PathLike)):
        raise ArgumentError(f"`pw.profile(logdir=...)` takes a folder path or None; got {type(logdir).__name__}.")
    return Profile(controller(), None if logdir is None else os.fspath(logdir))

"""pw_kernel: Pathways-style single-controller asynchronous dataflow for JAX, in Jupyter.

Example::

    import pw_kernel as pw
    s = pw.slice(2, mesh={"d": 2})
    a = pw.compiled(lambda x: x * 2, slice=s)

    @pw.program
    def f(v):
        return a(a(v))

    f(jnp.ones(4)).result()
"""

from __future__ import annotations

# Importing the runtime starts no JAX backend, so the device count can still be chosen after it.
from .runtime import (
    FIFO,
    AdmissionError,
    ArgumentError,
    CancelledError,
    CompiledFunction,
    Config,
    ControlFlowError,
    Controller,
    ControllerShutdownError,
    Edge,
    EventLog,
    FairShare,
    Future,
    FusedModeError,
    HostCallbackError,
    InputFailedError,
    Island,
    IslandLostError,
    Node,
    NodeError,
    NodeEvent,
    PathwaysError,
    Pipeline,
    PipelineError,
    PipelineState,
    PipelineStats,
    Policy,
    Priority,
    Program,
    ProgramGraph,
    Run,
    RunEvent,
    SliceError,
    SliceReleasedError,
    SpecError,
    Status,
    TimeoutError,
    TracingError,
    Value,
    VirtualSlice,
    add_ray_islands,
    compiled,
    configure_cpu_devices,
    controller,
    get,
    init,
    pipeline,
    program,
    replay,
    schedule_ops,
    shutdown,
    theory_bubble,
)

configure_cpu_devices()  # 8 simulated CPU devices unless JAX already started or the user chose

__version__ = "0.1.0"


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


def show_mesh(obj=None, **kwargs):
    """A MeshWidget: a slice's device mesh, where an array's (or future's) shards live, or every device.

    Example::

        pw.show_mesh(s); pw.show_mesh(x); pw.show_mesh()
    """
    from .widgets import show_mesh as _show_mesh

    return _show_mesh(obj, **kwargs)


def timeline(runs=None, live: bool = True, **kwargs):
    """A live per-device TimelineWidget of every run (or of ``runs``); ``.to_perfetto(path)`` exports it.

    Example::

        tl = pw.timeline()
        tl.to_perfetto("trace.json")
    """
    from .widgets import timeline as _timeline

    return _timeline(runs, live=live, **kwargs)


def show_pipeline(stats, **kwargs):
    """A timeline of pipelined steps with each one's per-slice bubble and live activations beside it.

    Example::

        run = pipe.submit_step(state, x, y, mode="chained").wait()
        pw.show_pipeline(pipe.stats(run))
    """
    from .widgets import show_pipeline as _show_pipeline

    return _show_pipeline(stats, **kwargs)


def load_ipython_extension(ipython) -> None:
    """`%load_ext pw_kernel`: register the `%%pathways` / `%pathways` magics (imported lazily)."""
    from .magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    """`%unload_ext pw_kernel`."""
    from .magics import unload_ipython_extension as unload

    unload(ipython)


__all__ = [
    "AdmissionError",
    "ArgumentError",
    "CancelledError",
    "CompiledFunction",
    "Config",
    "ControlFlowError",
    "Controller",
    "ControllerShutdownError",
    "Edge",
    "EventLog",
    "FIFO",
    "FairShare",
    "Future",
    "FusedModeError",
    "HostCallbackError",
    "InputFailedError",
    "IslandLostError",
    "Island",
    "Node",
    "NodeError",
    "NodeEvent",
    "PathwaysError",
    "Pipeline",
    "PipelineError",
    "PipelineState",
    "PipelineStats",
    "Policy",
    "Priority",
    "Program",
    "ProgramGraph",
    "Run",
    "RunEvent",
    "SliceError",
    "SliceReleasedError",
    "SpecError",
    "Status",
    "TimeoutError",
    "TracingError",
    "Value",
    "VirtualSlice",
    "add_ray_islands",
    "compiled",
    "controller",
    "devices",
    "get",
    "init",
    "islands",
    "pipeline",
    "program",
    "replay",
    "schedule_ops",
    "show_mesh",
    "show_pipeline",
    "shutdown",
    "slice",
    "theory_bubble",
    "timeline",
]

"""pw_kernel: Pathways-style single-controller asynchronous dataflow for JAX, in Jupyter.

The names here are the documented API (README, "API"), re-exported from the
runtime (`pw_kernel.runtime`), the training layer (`pw_kernel.train`) and the
views (`pw_kernel.widgets`, imported on first use). Types users receive but
need not name (`Island`, `Policy`, the graph's `Node` / `Edge` / `Value`,
`Pipeline`, `PipelineStats`, ...) stay in those modules; what the layers above
the runtime need and users do not is in `pw_kernel.runtime.extend`.

Example::

    import pw_kernel as pw
    s = pw.slice(2, mesh={"d": 2})
    a = pw.compiled(lambda x: x * 2, slice=s)

    @pw.program
    def f(v):
        return a(a(v))

    f(jnp.ones(4)).result()
"""

import importlib as _importlib

# Importing the runtime starts no JAX backend, so the device count can still be chosen after it.
from .runtime import (
    AdmissionError,
    ArgumentError,
    CancelledError,
    CompiledFunction,
    Config,
    ControlFlowError,
    ControllerShutdownError,
    FIFO,
    FairShare,
    FusedModeError,
    Future,
    HostCallbackError,
    InputFailedError,
    IslandLostError,
    ProtocolError,
    ServiceError,
    NodeError,
    NodeEvent,
    PathwaysError,
    Priority,
    Program,
    ProgramGraph,
    RemoteArray,
    Run,
    RunEvent,
    SliceError,
    SliceReleasedError,
    SpecError,
    TimeoutError,  # noqa: A004
    TracingError,
    VirtualSlice,
    add_ray_islands,
    compiled,
    controller,
    devices,
    get,
    init,
    islands,
    profile,
    program,
    put,
    shutdown,
    slice,  # noqa: A004
)
from .runtime.extend import configure_cpu_devices as _configure_cpu_devices
from .train import (
    CheckpointError,
    CheckpointManager,
    PipelineError,
    PipelineState,
    PrefetchError,
    elastic_retry,
    log,
    pipeline,
    prefetch,
    replay,
    schedule_ops,
    theory_bubble,
)
from .widgets.reprs import register as _register_views

_configure_cpu_devices()  # 8 simulated CPU devices unless JAX already started or the user chose
_register_views()  # how runtime objects draw themselves in a notebook (the views' side; nothing imported yet)

__version__ = "0.1.0"

#: The views, imported on first use: they need the notebook stack (anywidget), the runtime does not.
_VIEWS = ("show_mesh", "timeline", "show_pipeline")
#: The Pathways service's client calls, imported on first use (they need pyzmq and jupyter_client when called).
_SERVICE = ("connect", "disconnect", "clients", "pool", "keep", "kept")

# The documented API, grouped as the README's "API" section lists it (tests/test_runtime_contract.py
# checks the two agree), at most 64 names: the contract's calls (the service, pw.log, pw.profile) fill it.
__all__ = [
    # devices and slices
    "devices",
    "islands",
    "slice",
    "VirtualSlice",
    "add_ray_islands",
    "RemoteArray",
    "put",
    "init",
    "shutdown",
    "Config",
    "controller",
    # programs
    "compiled",
    "program",
    "CompiledFunction",
    "Program",
    "ProgramGraph",
    # runs, futures and their events
    "Future",
    "get",
    "Run",
    "NodeEvent",
    "RunEvent",
    # policies
    "FIFO",
    "FairShare",
    "Priority",
    # training
    "pipeline",
    "PipelineState",
    "schedule_ops",
    "replay",
    "theory_bubble",
    "CheckpointManager",
    "prefetch",
    "elastic_retry",
    "log",
    "profile",
    # the Pathways service: many notebooks, one pool of devices
    "connect",
    "disconnect",
    "clients",
    "pool",
    "keep",
    "kept",
    # views
    "show_mesh",
    "timeline",
    "show_pipeline",
    # errors
    "PathwaysError",
    "AdmissionError",
    "ArgumentError",
    "CancelledError",
    "ControlFlowError",
    "ControllerShutdownError",
    "FusedModeError",
    "HostCallbackError",
    "InputFailedError",
    "IslandLostError",
    "ProtocolError",
    "ServiceError",
    "NodeError",
    "SliceError",
    "SliceReleasedError",
    "SpecError",
    "TimeoutError",
    "TracingError",
    "CheckpointError",
    "PipelineError",
    "PrefetchError",
]


def __getattr__(name: str) -> object:
    if name in _VIEWS:
        value = getattr(_importlib.import_module(".widgets", __name__), name)
        globals()[name] = value
        return value
    if name in _SERVICE:
        value = getattr(_importlib.import_module(".service.session", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pw_kernel' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The documented API and the module's dunders: no helpers, no submodules, no IPython entry points."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__") and n.endswith("__"))})


def load_ipython_extension(ipython) -> None:
    """`%load_ext pw_kernel`: register the `%%pathways` / `%pathways` magics (imported lazily)."""
    _importlib.import_module(".magics", __name__).load_ipython_extension(ipython)


def unload_ipython_extension(ipython) -> None:
    """`%unload_ext pw_kernel`."""
    _importlib.import_module(".magics", __name__).unload_ipython_extension(ipython)

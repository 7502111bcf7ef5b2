"""The Pathways core: the runtime's public face, re-exports only; imports only jax and numpy.

Its names are the users' (`pw_kernel` re-exports most of them). Everything outside
`pw_kernel.runtime` (the training layer, the notebook front, the views,
benchmarks) imports from here, and what those layers need but users do not from
``pw_kernel.runtime.extend``, as JAX's public modules and ``jax.extend`` sit over
``jax._src``. What lives where:

* ``core/``: the run lifecycle (one transition table, records and effects), plans, scheduling policies.
* ``trace/``: compiled functions, program tracing with JAX's own tracer, the program graph (data).
* ``exec/``: the controller (its lock, and the one place effects are applied), the dispatcher,
  completion (the watcher thread and a waiting caller), Ctrl-C deferral, the event log.
* ``remote/``: Ray islands: the actor that owns a host's devices, and the controller's client of it.
* ``devices.py`` (islands, resource manager, slices), ``program.py``, ``run.py``, ``futures.py``
  (the handles users hold), ``donation.py`` (donated inputs and who still reads them),
  ``api.py`` (the entry calls), ``config.py``, ``errors.py``.

Example::

    from pw_kernel.runtime import controller, compiled, program
    print(controller().status())
"""

from __future__ import annotations

from .api import add_ray_islands, compiled, devices, islands, profile, program, slice  # noqa: A004
from .config import Config
from .core.scheduler import FIFO, FairShare, Policy, Priority
from .devices import Island, VirtualSlice
from .errors import (
    AdmissionError,
    ArgumentError,
    CancelledError,
    ControlFlowError,
    ControllerShutdownError,
    FusedModeError,
    HostCallbackError,
    InputFailedError,
    IslandLostError,
    ProtocolError,
    ServiceError,
    NodeError,
    PathwaysError,
    SliceError,
    SliceReleasedError,
    SpecError,
    TimeoutError,  # noqa: A004
    TracingError,
)
from .exec.controller import controller, init, shutdown
from .exec.events import IslandOutput, NodeEvent, RunEvent
from .futures import Future, get
from .profiling import Profile
from .program import Program
from .remote.client import RemoteArray
from .remote.put import put
from .run import Run
from .trace.compiled import CompiledFunction
from .trace.graph import Edge, Node, ProgramGraph, Value

__all__ = [
    # errors
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
    "PathwaysError",
    "SliceError",
    "SliceReleasedError",
    "SpecError",
    "TimeoutError",
    "TracingError",
    # devices, slices, islands
    "Config",
    "Island",
    "RemoteArray",
    "put",
    "VirtualSlice",
    "add_ray_islands",
    "devices",
    "islands",
    "slice",
    # programs and their graphs
    "CompiledFunction",
    "Edge",
    "Node",
    "Program",
    "ProgramGraph",
    "Value",
    "compiled",
    "program",
    # the controller, runs, futures, events
    "FIFO",
    "FairShare",
    "Future",
    "IslandOutput",
    "NodeEvent",
    "Policy",
    "Priority",
    "Run",
    "RunEvent",
    "controller",
    "get",
    "init",
    "shutdown",
    # seeing inside a run: XLA's ops inside pw's nodes
    "Profile",
    "profile",
]

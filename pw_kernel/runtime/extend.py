"""The runtime's names for the layers built on it, not for notebook users; re-exports only.

As `jax.extend` holds JAX's internals for library authors, this module holds
what the training layer (`pw_kernel.train`), the notebook front
(`pw_kernel.magics`), the views (`pw_kernel.widgets`), the benchmarks and the
tests need from the runtime and users do not: the controller's classes, the
remote island (which the Pathways service, `pw_kernel.service`, drives over its own link), the
event log's trace rows and their one writer, the run lifecycle's final states
and transitions, how a sharding or an error is said in one line, values pw
itself still reads, and how the simulated CPU devices are chosen. Users import
`pw_kernel` (or `pw_kernel.runtime`); these names may change with the layers
that use them. Like `pw_kernel.runtime`, it is the only other public way into
the runtime's implementation modules (`tests/test_layout.py` checks both).

Example::

    from pw_kernel.runtime.extend import FINAL, busy_time, short_error

    run = pw.controller().runs[-1]
    if run.state in FINAL and run.error is not None:
        print(short_error(run.error))
    busy_time([0, 10, 30], [20, 15, 40])   # 30.0: [0, 20] and [30, 40]
"""

from __future__ import annotations

from .config import DEFAULT_CPU_DEVICES, backends_started, configure_cpu_devices
from .core.lifecycle import Lifecycle, transition_edges
from .core.records import FINAL, RunRecord
from .core.story import Story, Transition
from .donation import hold
from .errors import short_error
from .exec.controller import Controller, Status, on_controller_replaced
from .exec.events import EventLog, TraceRow, busy_time, chrome_trace
from .exec.now import ready_array, run_now
from .profiling import executions, start_trace
from .api import ray_islands
from .program import Compiled
from .remote.actor import from_wire, inline_picks, to_wire
from .remote.client import RemoteIsland
from .remote.link import ErrorEnvelope, Link
from .remote.node_output import RoutedOutput
from .remote.put import remote_slice
from .remote.ray import init_ray
from .remote.shipped import callback_failure
from .run import pace
from .trace.executables import calling_node
from .trace.graph import describe_sharding, nbytes_of
from .trace.sources import is_library, set_file_labels
from .trace.tracing import context_mesh_hint

__all__ = [
    # the controller behind `pw.controller()`, its status, its event log
    "Controller",
    "EventLog",
    "Status",
    # the run lifecycle (the state machine itself, and its records: for benchmarks of its decisions), for the
    # views that draw it, and a run's story (`Run.story()`) with its rows
    "FINAL",
    "Lifecycle",
    "RunRecord",
    "Story",
    "Transition",
    "transition_edges",
    # the timeline's rows and the one Chrome trace writer; what "busy" means
    "TraceRow",
    "busy_time",
    "chrome_trace",
    # how a value, a sharding or an error is said in one line
    "context_mesh_hint",
    "describe_sharding",
    "nbytes_of",
    "short_error",
    "pace",
    # where an error comes from: the user's files as the front names them (`Cell In[N]`), and which are not theirs
    "is_library",
    "set_file_labels",
    # values pw itself still reads (an unfinished checkpoint save), so they are not donated
    "hold",
    # a remote island over another transport (the Pathways service's ZeroMQ link), and how values cross it
    "RemoteIsland",
    "remote_slice",
    "ray_islands",
    # `ray.init` that binds a Ray on this machine to 127.0.0.1 (Ray would use the machine's network address)
    "init_ray",
    "Link",
    # a compiled function run by a controller other than the process's (the service's own)
    "Compiled",
    "ErrorEnvelope",
    "from_wire",
    "to_wire",
    "inline_picks",
    # a buffer that is an array of this process now (a finished future's too): what a call on an idle pool takes
    "ready_array",
    "run_now",
    # what `pw.init` replacing the controller tells extensions that registered islands on the old one
    "on_controller_replaced",
    # JAX's profiler in a process that serves `pw.profile` for another (the service): start, and its XLA runs
    "executions",
    "start_trace",
    # a process running several clients' nodes that call the host (the service): whose callback runs on this
    # thread, and output routed to it by the writing thread
    "RoutedOutput",
    "callback_failure",
    "calling_node",
    # the simulated CPU devices, chosen before JAX starts
    "DEFAULT_CPU_DEVICES",
    "backends_started",
    "configure_cpu_devices",
]

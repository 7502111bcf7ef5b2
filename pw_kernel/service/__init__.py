"""Many notebooks, one accelerator pool: the controller as a service that kernels attach to.

Design
------
* **The service** (``python -m pw_kernel serve``) is one process that owns
  this host's devices. `server.py` is its I/O (sockets, inbox, heartbeats),
  `state.py` what it holds (clients, their buffers and runs, kept trees, a
  story per request), `handlers.py` what it does with each message
  (`protocol.py`: typed, versioned), `runs.py` how a client's nodes run: each
  one a run of the service's own `Controller` with `pw.FairShare`, every
  client a tenant of its ``weight``, so the per-island queues order all
  clients' nodes in one order and share device time by weight; cancel,
  run-ahead, admission and the event log are the controller's own.
* **A client** (`session.py`, `pw.connect` returns a `Session`) keeps its own
  controller for tracing, planning and dispatch order, and sees the service as
  one more *remote island* - the code Ray islands use (`RemoteIsland`,
  `RemoteCall`, `RemoteArray`), with a ZeroMQ `link.ServiceLink` in place of
  Ray's link (both implement `pw_kernel.runtime.extend.Link`). So programs travel as
  Ray islands' nodes do: each node's executable once, serialized with
  `jax.export`, then "run key on handles" messages; arrays stay in the service
  behind integer handles and cross only when asked (`.result()`). The
  client's JAX needs no accelerator: its slices are laid out on local
  stand-in devices of the service's count, which never run anything. After
  `pw.connect()`, `pw.slice(n)` places slices on the service's devices, on the
  devices this client's resource manager picked (pass ``island=`` an island
  of this process to use local ones). `pw.init()` keeps the session (on the
  new controller); `pw.shutdown()` ends it. Outputs up to 1 KiB come back with
  a run's reply, so reading a loss costs no second round trip.
* **Where a run lives**: the user's run is the client controller's; each node
  it sends is one short run of the service's controller (the pool's
  scheduler). Why two, and what the second costs: `runs.py`.
* **Why ZeroMQ, signed as Jupyter signs**: it is what every notebook already
  runs on (pyzmq and jupyter_client are the kernel's own dependencies, no new
  service to install), and Jupyter's authentication model is what this needs:
  a connection file only the user can read (0600, in Jupyter's per-user
  runtime directory) with the address and a key, every message signed with
  HMAC-SHA256 under it, a replayed signature refused. gRPC (as JAX's IFRT
  proxy) would bring TLS and a schema but no per-user key file; Ray would
  bring a cluster for what is one host. The messages themselves are lighter
  than Jupyter's (`wire.Messages`): one frame holding the signature and a
  pickle of the content (big arrays in raw frames of their own), read only
  once its signature holds, as ipyparallel's engines read pickles from their
  signed clients; Jupyter's six JSON frames cost four times as much a call.
* **State that outlives a client**: each client's handles are its own; when
  it disconnects, or misses heartbeats for a few seconds (killed), its queued
  runs are cancelled and its buffers freed. `pw.keep(name, tree)` moves
  buffers under a name of the user's, which `pw.kept(name)` hands to any later
  client as fresh handles on the same devices. Kept trees outlive the service
  too (`store.py`): each is written with orbax-checkpoint to its state folder
  (``serve --state DIR``; default ``<connection file name>-state`` beside the
  file) before `pw.keep` returns, whole or not at all, and read back onto the
  same devices when a service starts again there. A notebook whose service
  was killed and started again goes on after `pw.connect()`: its island is
  rebound to the new process (`session._rebind`, `RemoteIsland.rebind`), so its
  slices and compiled functions work as before (each executable sent again on
  first use), and an array made before says it is gone and what to re-run.
* **Latency**: a small waited call crosses no thread of pw's own. A client
  sends its requests from the thread that makes them (one socket, under a
  lock); replies come back on a socket of their own that the thread waiting
  for one reads itself (the reader: others waiting meanwhile are woken when
  it has read theirs, or leaves), and heartbeats go on a third, the socket
  thread's, which also sees the service's connection close. A lone call on
  arrays is sent by its caller before the run is reported started. The service
  answers quick requests (`run_many`, `get`, `free`, `cancel`) on its socket
  thread when nothing of that client's is queued before them, and a run computed inside that
  call is answered before the controller reports it done (`on_computed`);
  handles to free ride with the next call.
* **One client does not hold up another**: the service's worker takes one
  request of each client with requests waiting in turn (`inbox.Inbox`), each
  client's in its order, and a dropped client's waiting requests are
  discarded. A first call's compile (seconds, minutes for a big model) runs
  on a thread of its own (`Dispatcher._compile_aside`): other clients' calls
  go on being dispatched meanwhile, where they waited for the whole compile.
* **Cancel and priority cross**: each burst carries the client's run id and
  priority. A client's cancel (Ctrl-C included) tells the service, which drops
  that run's nodes still queued; the priority orders a client's own runs in
  the service's `FairShare` (weights share between clients). A client
  completes remote runs in the order they finish there, not the order sent.
* **Host callbacks** (`callbacks.py`): a node with `jax.debug.print` or a
  callback cannot be exported; it comes as its pickled function, as to a Ray
  island, and its Python runs in the service. Writes and log records are
  routed by the thread that makes them: a callback's thread names its node,
  whose runs in dispatch order say which one runs now; what a run's nodes
  wrote goes back with its reply, to its client's cell.
* **The collector** (`clients.Heap`, in a process that is the service alone):
  a full garbage collection walks the whole heap with the GIL held (70-300 ms
  here, no request read meanwhile), so what survives one is frozen; a run's
  objects form no cycles (futures drop their done-callbacks once resolved), so
  only a dropped client's leftovers need a walk of everything.
* **Faults**: a message with a wrong or no signature is refused, counted and
  logged, never answered; a client whose service stops answering heartbeats
  gets `pw.IslandLostError` saying so and that ``pw.connect()`` again is the
  way back.

Nothing here is imported by ``import pw_kernel``: pyzmq and jupyter_client are
imported when a service starts or a client connects.

Example::

    # terminal:  python -m pw_kernel serve
    import pw_kernel as pw
    pw.connect(name="alice", weight=2)
    s = pw.slice(4, mesh={"d": 4})
    f = pw.compiled(lambda x: x * 2, slice=s)
    f(jnp.ones(8)).result()
"""

from __future__ import annotations

import importlib as _importlib

__all__ = ["clients", "connect", "disconnect", "keep", "kept", "pool_data", "serve", "stats", "unkeep"]

_CLIENT = ("clients", "connect", "disconnect", "keep", "kept", "pool_data", "stats", "unkeep")


def serve(connection_file: str | None = None, *, background: bool = False, ip: str = "127.0.0.1",
          state_dir: str | bool | None = None, dashboard: int | None = None, ray: str | None = None,
          ray_devices: int | None = None, exit_with: int | None = None):
    """Start the Pathways service in this process: it owns this process's devices and serves clients.

    ``background=True`` returns the `Service` at once (``.stop()`` ends it);
    otherwise serves until Ctrl-C or SIGTERM, then removes the connection file.
    Kept trees (`pw.keep`) are written to ``state_dir`` (default: a folder
    beside the connection file, ``<its name>-state``; ``False``: memory only)
    and come back when a service starts again with the same folder.
    ``dashboard=PORT`` also serves the pool view (`pw.pool()`'s) as a web page
    on http://127.0.0.1:PORT/ (0: a free port; `dashboard.py`), read-only.
    ``ray=ADDRESS`` (or ``"auto"``; ``"local"`` starts a Ray on this host's
    loopback) makes each alive Ray node's devices an island of the service
    (an actor per node, as `pw.add_ray_islands`; ``ray_devices``: simulated CPU
    devices per node): clients see them in `pw.islands()` and place slices there.
    ``exit_with=PID`` (in the foreground) stops the service, as SIGTERM does,
    once process PID has ended: a service a script or a test starts for itself
    does not outlive it when it is killed.

    Example::

        from pw_kernel.service import serve
        svc = serve(background=True)     # in a notebook: the other notebooks `pw.connect()`
        svc.stop()
    """
    from .server import Service
    from .wire import pid_running

    if background and exit_with is not None:
        from ..runtime import PathwaysError

        raise PathwaysError(
            f"`pw_kernel.service.serve`: exit_with={exit_with} watches a process for a service in the foreground; "
            f"a background service (background=True) ends with this process, or with its `.stop()`."
        )
    svc = Service(connection_file, ip=ip, owns_process=not background, state_dir=state_dir, dashboard=dashboard,
                  ray=ray, ray_devices=ray_devices)
    if background:
        return svc
    given = "" if connection_file is None else repr(svc.path)
    print(f"pw_kernel service: {len(svc.devices)} {svc.info['platform']} devices, pid {svc.info['pid']}", flush=True)
    print(f"Connection file: {svc.path}", flush=True)
    for i in svc.state.remote_islands():
        print(f"Island {i['island']}: {len(i['devices'])} {i['platform']} devices on {i['host']} (Ray, pid {i['pid']})",
              flush=True)
    if svc.state_dir is not None:
        print(f"Kept trees: {svc.state_dir} ({len(svc.state.kept)} restored)", flush=True)
    if svc.dashboard is not None:
        print(f"Dashboard: {svc.dashboard.url}   (the pool's devices and clients; this host only)", flush=True)
    print(f"Notebooks connect with: pw.connect({given})   (Ctrl-C stops the service)", flush=True)
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: svc.stop())
    try:
        while not svc.wait(0.5):
            if exit_with is not None and not pid_running(exit_with):
                print(f"pw_kernel service: process {exit_with} ended (--exit-with): stopping", flush=True)
                break
    except KeyboardInterrupt:
        pass
    finally:
        svc.stop()
    return svc


def __getattr__(name: str):
    if name in _CLIENT:
        value = getattr(_importlib.import_module(".session", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pw_kernel.service' has no attribute {name!r}")

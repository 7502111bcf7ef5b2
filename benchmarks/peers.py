"""The peers of the dispatch benchmark: Ray tasks, Ray Compiled Graphs, Dask futures.

Each peer runs the same chain as the JAX rows in spirit: K tiny computations
(``x * 1.0001 + c`` with numpy on a 16-element vector), each consuming the
previous one's result. Modes, as in the paper's Figure 5:

- ``opbyop``: one submission per computation, the result passed on as a
  future without waiting (``x = f.remote(x)``; ``x = client.submit(f, x)``),
  one wait at the end;
- ``opbyop_wait``: one submission per computation, waiting for each;
- ``chained``: the K computations submitted as one graph (Ray: a Compiled
  Graph of K actor-method nodes on one actor; Dask: a `dask.delayed` chain
  handed to the scheduler in one `client.compute`);
- ``fused``: one task that runs all K steps.

Every import of ray / dask happens in `start`, so this module imports
anywhere; a peer that is missing or fails to start says why.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

SIZE = 16


def step(x: np.ndarray, i: int = 0) -> np.ndarray:
    return x * 1.0001 + (0.5 + i * 1e-6)


def fused_steps(x: np.ndarray, k: int) -> np.ndarray:
    for i in range(k):
        x = step(x, i)
    return x


def expected(k: int) -> np.ndarray:
    return fused_steps(np.ones(SIZE, np.float32), k)


class PeerUnavailable(Exception):
    """The peer cannot run here; the message says why ('not installed', 'failed: ...')."""


class Peer:
    name: str = "peer"
    label: str = "peer"
    #: how each mode is realised, for the README legend
    how: dict[str, str] = {}

    def start(self, k: int) -> None:
        raise NotImplementedError

    def modes(self) -> dict[str, Callable[[], Any]]:
        raise NotImplementedError

    def stop(self) -> None:
        pass


def _quiet_fork() -> None:
    # Ray starts its processes with fork+exec; JAX warns about fork in a multithreaded process.
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)


def _import(module: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as e:
        raise PeerUnavailable(f"not installed ({e.name or module})") from None


def _init_ray(**options) -> None:
    """A local Ray of the benchmark's own ("local": not one another process left running), bound to 127.0.0.1."""
    from pw_kernel.runtime.extend import init_ray

    init_ray("local", **options)


class RayTasks(Peer):
    """Ray remote functions: one task per computation, object refs as inputs."""

    name = "ray_tasks"
    label = "Ray tasks"
    how = {
        "opbyop": "x = f.remote(x) K times, one ray.get",
        "opbyop_wait": "ray.get(f.remote(x)) K times",
        "fused": "one task doing K steps",
    }

    def start(self, k: int) -> None:
        ray = _import("ray")
        _quiet_fork()
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        if not ray.is_initialized():
            _init_ray(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        self.ray, self.k = ray, k
        self.f = ray.remote(step)
        self.fused_f = ray.remote(fused_steps)
        self.x = np.ones(SIZE, np.float32)

    def modes(self):
        ray, f, k, x = self.ray, self.f, self.k, self.x

        def opbyop():
            v = x
            for i in range(k):
                v = f.remote(v, i)
            return ray.get(v)

        def opbyop_wait():
            v = x
            for i in range(k):
                v = ray.get(f.remote(v, i))
            return v

        def fused():
            return ray.get(self.fused_f.remote(x, k))

        return {"opbyop": opbyop, "opbyop_wait": opbyop_wait, "fused": fused}

    def stop(self) -> None:
        pass  # RayCompiledGraph shares the Ray instance; `shutdown_ray` ends it


class RayCompiledGraph(Peer):
    """Ray Compiled Graphs (`ray.dag` + `experimental_compile`): K method nodes on one actor."""

    name = "ray_cg"
    label = "Ray Compiled Graph"
    how = {"chained": "a compiled DAG of K actor-method nodes on one actor, one execute + ray.get"}

    def start(self, k: int) -> None:
        ray = _import("ray")
        try:
            from ray.dag import InputNode
        except ImportError as e:
            raise PeerUnavailable(f"not installed (ray.dag: {e})") from None
        _quiet_fork()
        if not ray.is_initialized():
            _init_ray(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)

        @ray.remote
        class Stepper:
            def step(self, x, i):
                return step(x, i)

        try:
            self.actor = Stepper.remote()
            with InputNode() as inp:
                node = inp
                for i in range(k):
                    node = self.actor.step.bind(node, i)
            self.dag = node.experimental_compile()
        except Exception as e:  # an experimental API: record why, do not fail the benchmark
            raise PeerUnavailable(f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}") from None
        self.ray, self.x = ray, np.ones(SIZE, np.float32)

    def modes(self):
        ray, dag, x = self.ray, self.dag, self.x

        def chained():
            return ray.get(dag.execute(x))

        return {"chained": chained}

    def stop(self) -> None:
        dag = getattr(self, "dag", None)
        if dag is not None:
            try:
                dag.teardown()
            except Exception:
                pass
            self.dag = None


def shutdown_ray() -> None:
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()


class DaskFutures(Peer):
    """dask.distributed futures on an in-process cluster (``Client(processes=False)``: worker threads)."""

    name = "dask"
    label = "Dask futures"
    how = {
        "opbyop": "x = client.submit(f, x) K times, one .result()",
        "opbyop_wait": "client.submit(f, x).result() K times",
        "chained": "a dask.delayed chain of K tasks, one client.compute",
        "fused": "one task doing K steps",
    }

    def start(self, k: int) -> None:
        distributed = _import("distributed")
        dask = _import("dask")
        logging.getLogger("distributed").setLevel(logging.ERROR)
        self.client = distributed.Client(processes=False, dashboard_address=None)
        self.dask, self.k, self.x = dask, k, np.ones(SIZE, np.float32)

    def modes(self):
        client, dask, k, x = self.client, self.dask, self.k, self.x

        def opbyop():
            v = x
            for i in range(k):
                v = client.submit(step, v, i, pure=False)
            return v.result()

        def opbyop_wait():
            v = x
            for i in range(k):
                v = client.submit(step, v, i, pure=False).result()
            return v

        def chained():
            d = dask.delayed(step, pure=False)
            v = x
            for i in range(k):
                v = d(v, i)
            return client.compute(v).result()

        def fused():
            return client.submit(fused_steps, x, k, pure=False).result()

        return {"opbyop": opbyop, "opbyop_wait": opbyop_wait, "chained": chained, "fused": fused}

    def stop(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
            self.client = None


PEERS: dict[str, type[Peer]] = {p.name: p for p in (RayTasks, RayCompiledGraph, DaskFutures)}

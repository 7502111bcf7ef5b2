"""Test setup: 8 simulated CPU devices before JAX starts, state-machine validation on."""

from __future__ import annotations

import os
import signal
import sys

# A run started as a background job (`cmd &` in a script) inherits SIGINT ignored, so Python installs
# no KeyboardInterrupt handler and Ctrl-C (`pthread_kill`, `_thread.interrupt_main`) does nothing;
# the Ctrl-C tests need the handler a terminal or a notebook kernel has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ.setdefault("PW_VALIDATE", "1")
os.environ.setdefault("PW_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

#: How the suite's processes compile (this one's, and what it starts: kernels, benchmarks, services, Ray
#: workers): XLA's CPU backend without LLVM's optimizations. The suite compiles thousands of small programs,
#: and compiling is most of its time: at level 0 the model tests took 97 s against 147 s, tutorial 06 54 s
#: against 70 s. What pw does with an executable does not depend on how fast its code is; the figures of
#: the benchmarks' --quick modes mean nothing anyway. An XLA_FLAGS of your own is left as it is.
SUITE_XLA_FLAGS = "--xla_backend_optimization_level=0"
os.environ.setdefault("XLA_FLAGS", SUITE_XLA_FLAGS)

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", int(os.environ["PW_NUM_CPU_DEVICES"]))

import pytest  # noqa: E402

import pw_kernel as pw  # noqa: E402


#: Modules that test the whole system in processes of its own (real Jupyter kernels and JupyterLab,
#: Chromium, Ray clusters, the Pathways service, tutorials run top to bottom, the benchmarks' quick
#: modes, the README's commands). `./scripts/test.sh --quick` (the contributor's tier: the runtime, the
#: front and the views in-process, over two pytest-xdist workers) leaves them out; the whole suite runs
#: them in one process after the rest (processes of their own already keep two cores busy).
SYSTEM = frozenset({
    "test_benchmarks", "test_browser_timeline_js", "test_browser_widgets", "test_checkpoint_islands",
    "test_elastic", "test_island_logs", "test_kernel", "test_main_command", "test_notebooks",
    "test_ray_cluster", "test_ray_islands", "test_service", "test_test_command",
})
#: Modules in this process that train real models (a minute or more in all): left out by `--quick`, run
#: with the unit tier over two workers by the whole suite.
MODELS = frozenset({"test_demo", "test_pipeline_models"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rpartition(".")[2] if item.module is not None else ""
        if module in SYSTEM:
            item.add_marker(pytest.mark.system)
        elif module in MODELS:
            item.add_marker(pytest.mark.models)


@pytest.fixture
def ctl():
    """A fresh controller with one island (validation on); shut down and joined afterwards."""
    c = pw.init(pw.Config(validate=True))
    yield c
    pw.shutdown()


@pytest.fixture
def ctl2():
    """A fresh controller whose 8 devices form two islands of 4."""
    c = pw.init(pw.Config(islands=2, validate=True))
    yield c
    pw.shutdown()


@pytest.fixture
def service(tmp_path):
    """A Pathways service in this process, with a controller of its own; this process connects as its client."""
    from pw_kernel.service.server import Service

    pw.init(pw.Config(validate=True))
    svc = Service(str(tmp_path / "svc.json"))
    yield svc
    pw.disconnect()
    svc.stop()
    pw.shutdown()


@pytest.fixture(scope="session")
def _session_ray():
    """Stops the session's Ray (`ray_cluster`) when the session ends, if it is up then."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_cluster(_session_ray):
    """One local Ray cluster for every test with remote islands: starting one takes ~9-19 s.

    Started by the first module that asks, and kept for the next; a module that starts a multi-node
    cluster of its own (`ray_cluster.local_cluster`) stops it, and the next module that asks starts it
    again (not at once: a module after it may never ask). Each test kills the island actors it made
    (`remote_islands.kill_islands`), so the next one finds the cluster's CPUs free.
    """
    ray = pytest.importorskip("ray")
    from pw_kernel.runtime.extend import init_ray
    from ray_cluster import SESSION_RAY

    if not ray.is_initialized():
        # A Ray of its own ("local": not one another process left in /tmp/ray), bound to 127.0.0.1 (`init_ray`).
        init_ray("local", **SESSION_RAY)
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}, ray.nodes()
    yield ray


# ------------------------------------------------- the suite leaves the checkout as it found it
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _checkout_state() -> str | None:
    """`git status --porcelain` of the checkout (None outside git), untracked files included."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"], cwd=_ROOT, capture_output=True, text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def pytest_sessionstart(session):
    session.config.stash[_BEFORE] = _checkout_state()


def pytest_sessionfinish(session, exitstatus):
    """A suite that writes into the checkout (a picture, a notebook, a results file) fails, naming what changed.

    Only what changed during the run counts: a developer's own uncommitted work is left alone.
    """
    before = session.config.stash.get(_BEFORE, None)
    after = _checkout_state()
    if before is None or after is None or after == before:
        return
    changed = sorted(set(after.splitlines()) - set(before.splitlines()))
    if changed:
        session.config.get_terminal_writer().line(
            "the test suite changed the checkout (write under artifacts/ or a tmp_path instead):\n  "
            + "\n  ".join(changed),
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_BEFORE = pytest.StashKey[str | None]()

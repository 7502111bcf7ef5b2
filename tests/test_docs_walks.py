"""docs/architecture.md's two walks of a warm call, checked against the code that runs them.

Each walk in the doc carries a machine-readable line listing the pw_kernel modules it crosses,

    <!-- walk:local modules: pw_kernel/runtime/program.py, pw_kernel/runtime/exec/controller.py, ... -->

a visible sentence with their number ("crosses 19 modules"), and steps naming
``path:function`` (relative to ``pw_kernel/``). Here the real call runs in a fresh
process with a profiler on every thread (installed before the controller's and the
service's threads start), recording only around one warm ``f(x).result()``: the set
of pw_kernel files whose functions ran must be exactly the doc's list, the count its
length, and every function a step names must have run. A module that is legitimately
met only sometimes (a race between threads) may be listed with a ``?`` suffix: it is
accepted whether or not it is seen (the local walk's `core/pick.py`: the dispatcher thread looking for
work, woken before the call, seen once in the quick tier's two workers).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"

#: The measured process: the profiler goes on before `pw.init` and `Service` start their threads;
#: it records (file, function) of each pw_kernel call only while ``on`` is set, around one warm call.
_PROBE = r"""
import json, os, sys, tempfile, threading, time

PKG = os.path.join(sys.argv[1], "pw_kernel") + os.sep
on = False
main_done = False  # (set once the call has returned: what the main thread runs then is this probe's waiting)
MAIN = threading.main_thread()
seen = set()


def profile(frame, event, arg):
    if on and event == "call" and not (main_done and threading.current_thread() is MAIN):
        path = frame.f_code.co_filename
        if path.startswith(PKG):
            seen.add((path[len(PKG):], frame.f_code.co_qualname))


import jax.numpy as jnp
import pw_kernel as pw

threading.setprofile(profile)  # every thread started from here on: the controller's, the service's
sys.setprofile(profile)
walk = sys.argv[2]
pw.init(pw.Config(validate=False))
if walk == "service":
    import pw_kernel.service.link as link
    import pw_kernel.service.server as server
    from pw_kernel.service.server import Service

    # Heartbeats (each way every 0.5 s) are no part of a call: one that fell inside the measured call, as on a
    # loaded machine, added its own module (protocol.py: a Ping's and a Pong's pickling) to the walk.
    link.HEARTBEAT_S = server.HEARTBEAT_S = 3600.0

    folder = tempfile.mkdtemp()
    svc = Service(os.path.join(folder, "svc.json"))
    pw.connect(svc.path)
    s = pw.slice(1)
else:
    s = pw.slice(1, island=0)
f = pw.compiled(lambda x: x + 1, slice=s)
x = f(jnp.zeros(4))
x.result()  # the warm-up: traced, exported, loaded and compiled
x = f(x)
x.result()  # one warm call more, so that no thread is still busy with the first
from pw_kernel.runtime.extend import FINAL

ctrls = [pw.controller()] + ([svc.ctrl] if walk == "service" else [])


def until_idle():  # every run of both controllers final, nothing in flight
    deadline = time.monotonic() + 60  # (only against a hang: what is waited for is a state)
    while not all(not any(st.inflight.values()) and all(r.state in FINAL for r in st.runs)
                  for st in (c.status() for c in ctrls)):
        assert time.monotonic() < deadline, [c.status() for c in ctrls]
        time.sleep(0.001)


until_idle()
on = True
f(x).result()
main_done = True
if walk == "service":  # the reply may leave before the handler is done (a lone node answers as it computes):
    with svc._lock:    # the handler holds this lock throughout, so once it is ours the request is handled
        pass
    # ...and the service's node may be completed after that by its watcher (a node not yet computed when
    # its call returned: a loaded machine), whose charge to the scheduler is part of the walk
    until_idle()
on = False
threading.setprofile(None)
sys.setprofile(None)
if walk == "service":
    pw.disconnect()
    svc.stop()
    os.rmdir(folder)  # (the service removed its connection file)
pw.shutdown()
print("WALK " + json.dumps(sorted(seen)))
"""


def _measure(walk: str) -> set[tuple[str, str]]:
    env = {**os.environ, "PW_VALIDATE": "0", "JAX_PLATFORMS": "cpu", "PW_NUM_CPU_DEVICES": "8"}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(ROOT), walk], check=False, capture_output=True, text=True, timeout=300, env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("WALK "))
    return {tuple(x) for x in json.loads(line[5:])}


def _section(text: str, walk: str) -> str:
    """The doc's section (from its heading to the next heading) holding ``walk``'s module line."""
    at = text.index(f"<!-- walk:{walk} modules:")
    start = text.rfind("\n#", 0, at)
    end = text.find("\n#", at)
    return text[start: end if end >= 0 else len(text)]


def _listed(section: str, walk: str) -> tuple[set[str], set[str], int]:
    """(modules always crossed, modules crossed only sometimes, how many are listed), relative to pw_kernel/."""
    m = re.search(rf"<!-- walk:{walk} modules:(.*?)-->", section, re.DOTALL)
    names = [n.strip() for n in m.group(1).split(",") if n.strip()]
    assert all(n.startswith("pw_kernel/") for n in names), names
    assert len(names) == len(set(names)), f"a module listed twice: {names}"
    short = [n.removeprefix("pw_kernel/") for n in names]
    required = {n for n in short if not n.endswith("?")}
    optional = {n[:-1] for n in short if n.endswith("?")}
    return required, optional, len(names)


WALKS = ("local", "service")


#: Measurements of a walk before it is found out of date: a loaded machine (the suite's two workers) can let
#: a thread run during the call on a wake-up from before it, or leave a step of it until after; what the
#: doc says must be what a call does in one of them.
TRIES = 3


@pytest.fixture(scope="module")
def measured() -> dict[str, set[tuple[str, str]]]:
    """Each walk's measurement: the first that agrees with the doc, else the last of `TRIES`."""
    out = {}
    for walk in WALKS:
        for _ in range(TRIES):
            ran = out[walk] = _measure(walk)
            if not any(_module_problems(walk, ran)) and not _step_problems(walk, ran):
                break
    return out


def _module_problems(walk: str, ran: set[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(modules crossed and not listed, modules listed and not crossed)."""
    required, optional, _ = _listed(_section(DOC.read_text(), walk), walk)
    crossed = {path for path, _ in ran}
    return sorted(crossed - required - optional), sorted(required - crossed)


def _step_problems(walk: str, ran: set[tuple[str, str]]) -> list[str]:
    """The functions the walk's steps name that did not run (a class named alone: its constructor ran)."""
    named = set(re.findall(r"`((?:runtime|service)/[\w/]+\.py):([\w.<>]+)`", _section(DOC.read_text(), walk)))
    return sorted(f"{p}:{fn}" for p, fn in named if (p, fn) not in ran and (p, f"{fn}.__init__") not in ran)


@pytest.mark.parametrize("walk", WALKS)
def test_the_walk_says_how_many_modules_it_lists(walk):
    section = _section(DOC.read_text(), walk)
    _, _, n = _listed(section, walk)
    said = re.findall(r"crosses (\d+) modules", section)
    assert said == [str(n)], f"walk {walk!r}: the text says {said}, the module line lists {n}"


@pytest.mark.parametrize("walk", WALKS)
def test_the_walk_lists_exactly_the_modules_the_call_crosses(walk, measured):
    missing, extra = _module_problems(walk, measured[walk])
    assert not missing and not extra, (
        f"walk {walk!r} in docs/architecture.md is out of date:\n"
        f"  crossed by the call, not listed: {missing}\n"
        f"  listed, not crossed: {extra}"
    )


@pytest.mark.parametrize("walk", WALKS)
def test_every_function_a_step_names_runs_in_the_call(walk, measured):
    section = _section(DOC.read_text(), walk)
    named = set(re.findall(r"`((?:runtime|service)/[\w/]+\.py):([\w.<>]+)`", section))
    assert len(named) >= 10, f"walk {walk!r} names only {len(named)} steps as `path:function`"
    not_run = _step_problems(walk, measured[walk])
    assert not not_run, f"walk {walk!r} names functions the call does not run: {not_run}"

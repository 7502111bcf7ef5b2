"""`./scripts/run.sh --demo`: the headless MPMD demo, as a user runs it."""

from __future__ import annotations

import re

from fresh_python import run_python


def test_the_demo_matches_plain_jax_and_every_device_reports_its_share():
    out = run_python("from pw_kernel.demo import main; main(['--steps', '3', '--width', '64'])", timeout=240)
    err = float(re.search(r"max \|pw - plain JAX\| = (\S+);", out).group(1))
    assert err < 1e-4, out
    rows = re.findall(r"^\s+cpu:(\d+)\s+(\d+)\s+(\S+)\s+(\d+)\s+([\d.]+)\s+(\d+)%\s+([\d.]+)$", out, flags=re.M)
    assert [int(r[0]) for r in rows] == list(range(8)), out
    # every device that ran nodes holds some of their outputs (not only the first of each slice)
    assert all(float(r[6]) > 0 for r in rows if int(r[3]) > 0), out
    assert "3 runs" in out

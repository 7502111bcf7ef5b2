"""The README's test command, `./scripts/test.sh`: both tiers run, and a filter that selects no test fails.

The whole suite is two pytest runs (the unit tier over two workers, then the system tier in one
process), so pytest's own "collected nothing" (exit code 5) of one tier is no failure while the
other ran tests; of both it is.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(600)


def run_test_sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["./scripts/test.sh", *args, "-p", "no:cacheprovider"], cwd=REPO, capture_output=True,
                          text=True, timeout=540)


def test_a_filter_that_selects_no_test_fails_the_command_and_says_why():
    out = run_test_sh("tests/test_layout.py", "-k", "no_test_is_named_like_this_at_all")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "pytest collected no tests: treating that as a failure" in out.stderr
    assert out.stdout.count("test session starts") == 2, out.stdout[-3000:]  # (both tiers were asked)


def test_a_failing_test_fails_the_command_though_the_other_tier_selects_nothing(tmp_path):
    # in a folder of its own (outside tests/, whose conftest marks the system tier): one tier runs them
    (tmp_path / "test_some.py").write_text("def test_passes():\n    pass\n\ndef test_fails():\n    assert 1 == 2\n")
    out = run_test_sh(str(tmp_path / "test_some.py"), "--rootdir", str(tmp_path))
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1 failed, 1 passed" in out.stdout
    assert "collected no tests" not in out.stderr
    (tmp_path / "test_some.py").write_text("def test_passes():\n    pass\n")
    out = run_test_sh(str(tmp_path / "test_some.py"), "--rootdir", str(tmp_path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

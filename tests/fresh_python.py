"""Run a snippet in a fresh Python process (what a user's new kernel or script sees)."""

from __future__ import annotations

import subprocess
import sys


def run_python(code: str, timeout: float = 120, stderr: bool = False) -> str | tuple[str, str]:
    """Run ``code`` with this interpreter in a new process; assert it succeeded and return its stdout
    (with ``stderr``: stdout and stderr)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return (proc.stdout, proc.stderr) if stderr else proc.stdout

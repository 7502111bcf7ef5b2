"""The "Python 3 (Pathways)" Jupyter kernelspec: ipykernel with the extension loaded and simulated CPU devices.

The kernel's first line, before any cell, imports pw_kernel, which asks JAX for
the simulated CPU devices before JAX starts: ``PW_NUM_CPU_DEVICES`` from the
environment that started Jupyter if it is set (``PW_NUM_CPU_DEVICES=1 jupyter
lab`` is what a one-GPU host looks like), else the count installed with
``--devices`` (8). A cell that asks JAX for its devices sees the same count; a
first cell may still choose another (``jax.config.update``). With a GPU or TPU,
JAX uses those; the CPU devices are then unused.

Example::

    python -m pw_kernel install --user            # then pick "Python 3 (Pathways)" in Jupyter
    python -m pw_kernel install --prefix /tmp/k --devices 4
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..runtime.extend import DEFAULT_CPU_DEVICES

KERNEL_NAME = "pathways"
DISPLAY_NAME = "Python 3 (Pathways)"
# Loaded by a startup line, not `--ext`: IPython's extension manager then does not count it as
# loaded, so a notebook's own `%load_ext pw_kernel` (written to run in any kernel) stays silent
# instead of printing "already loaded"; the extension itself registers only once per shell. The
# device count is a default the environment may override, not the kernel's environment (which
# would override what the user's environment says).
STARTUP = (
    "--IPKernelApp.exec_lines=__import__('os').environ.setdefault('PW_NUM_CPU_DEVICES', '{devices}'); "
    "__import__('pw_kernel').load_ipython_extension(get_ipython())"
)


def kernel_spec(
    devices: int = DEFAULT_CPU_DEVICES, python: str | None = None, display_name: str = DISPLAY_NAME
) -> dict[str, Any]:
    """The kernel.json contents: ipykernel on ``python`` with the extension loaded and ``devices`` CPU devices."""
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"`--devices` must be a positive number of simulated CPU devices; got {devices!r}.")
    return {
        "argv": [
            python or sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
            STARTUP.format(devices=devices),
        ],
        "display_name": display_name,
        "language": "python",
        "metadata": {"debugger": True, "pw_kernel": {"cpu_devices": devices}},
    }


def install(
    *,
    user: bool = False,
    prefix: str | None = None,
    devices: int = DEFAULT_CPU_DEVICES,
    name: str = KERNEL_NAME,
    display_name: str = DISPLAY_NAME,
) -> str:
    """Install the kernelspec (per user, under ``prefix``, or system-wide); returns the directory it went to."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = kernel_spec(devices, display_name=display_name)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / name
        src.mkdir()
        (src / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
        try:
            import ipykernel

            resources = Path(ipykernel.__file__).parent / "resources"
            for logo in resources.glob("logo-*"):
                shutil.copy(logo, src / logo.name)
        except ImportError:  # the kernel needs ipykernel at run time; the spec itself does not
            pass
        return KernelSpecManager().install_kernel_spec(str(src), kernel_name=name, user=user, prefix=prefix)

"""The "Python 3 (Pathways)" Jupyter kernelspec: ipykernel with the extension loaded and simulated CPU devices.

The device count is set in the kernel's environment, so JAX reads it when it
starts (`JAX_NUM_CPU_DEVICES`, and `PW_NUM_CPU_DEVICES` for pw_kernel's own
default). With a GPU or TPU, JAX uses those; the CPU devices are then unused.

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
# instead of printing "already loaded"; the extension itself registers only once per shell.
LOAD_EXTENSION = "--IPKernelApp.exec_lines=__import__('pw_kernel').load_ipython_extension(get_ipython())"


def kernel_spec(
    devices: int = DEFAULT_CPU_DEVICES, python: str | None = None, display_name: str = DISPLAY_NAME
) -> dict[str, Any]:
    """The kernel.json contents: ipykernel on ``python`` with the extension loaded and ``devices`` CPU devices."""
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"`--devices` must be a positive number of simulated CPU devices; got {devices!r}.")
    return {
        "argv": [python or sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}", LOAD_EXTENSION],
        "display_name": display_name,
        "language": "python",
        "env": {"PW_NUM_CPU_DEVICES": str(devices), "JAX_NUM_CPU_DEVICES": str(devices)},
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

"""The notebook front: `%load_ext pw_kernel`, `%%pathways`, `%pathways`, post-run failure reports, kernelspec.

IPython is imported only when the extension is loaded, so `import pw_kernel`
works where no notebook stack is installed. What lives where:

* ``magics.py``: the two magics IPython registers, with their options.
* ``cell_magic.py``: `%%pathways`, a cell as a program; ``cell.py``: what the cell reads and assigns.
* ``line_magic.py``: the `%pathways` commands (status, devices, timeline, graph, wait, cancel, reset).
* ``live.py``: run displays that follow their run, and blocking waits with progress (both on the views' ticker).
* ``tracebacks.py``: errors that point at cells, with only the user's frames.
* ``ctrl_c.py``: Ctrl-C in any cell cancels the runs that cell submitted; the one wording of what it cancelled.
* ``island_output.py``: what stages print or log on remote islands, in the cell that submitted their run.
* ``reporting.py``: failures of runs the user moved on from; ``kernelspec.py``; ``errors.py``.

It draws nothing: what a run, a timeline, the status or the graph look like is the views'
(`pw_kernel.widgets`: live widgets, and text/HTML views where no widget can be); this package
decides which to show when. It uses only the faces `pw_kernel.widgets` and `pw_kernel.train`.

Example::

    %load_ext pw_kernel

    %%pathways --block
    y = a(x)
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

from .errors import CellError, PathwaysWarning

_loaded: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def load_ipython_extension(ip: Any) -> None:
    """Register `%%pathways` / `%pathways`, Ctrl-C cancelling a cell's runs, the failure report and island output
    routed to cells on ``ip``."""
    if ip is None or not hasattr(ip, "register_magics"):
        raise RuntimeError(
            f"`pw_kernel.load_ipython_extension` needs an IPython shell; got {ip!r}. Run `%load_ext pw_kernel` in "
            f"a Jupyter notebook or IPython. In a plain Python program use the API directly: `@pw.program`, "
            f"`pw.slice(...)`, `pw.compiled(...)`."
        )
    try:
        from .magics import PathwaysMagics
    except ImportError as e:
        raise ImportError(
            f"`%load_ext pw_kernel` needs IPython ({e}). Install the notebook extra: pip install 'pw_kernel[notebook]'."
        ) from e
    if ip in _loaded:
        return
    magics = PathwaysMagics(ip)
    ip.register_magics(magics)
    magics.interrupts.register()  # (before the reporter: a cell's runs are cancelled first)
    magics.reporter.register()
    magics.presenter.register()  # any cell's pw_kernel errors point at its lines
    magics.island_output.register()
    _loaded[ip] = magics
    from ..runtime.extend import backends_started

    if backends_started():  # else leave JAX unstarted: a first cell may still choose the device count
        check_devices()


def unload_ipython_extension(ip: Any) -> None:
    """`%unload_ext pw_kernel`: remove the magics and the pre-/post-run hooks (runs in flight keep running)."""
    magics = _loaded.pop(ip, None)
    if magics is None:
        return
    magics.island_output.unregister()
    magics.presenter.unregister()  # (the reverse of loading: each custom exception handler finds its own)
    magics.reporter.unregister()
    magics.interrupts.unregister()
    magics.close()
    manager = ip.magics_manager
    for kind in ("line", "cell"):
        table = manager.magics[kind]
        if getattr(table.get("pathways"), "__self__", None) is magics:
            del table["pathways"]
    manager.registry.pop(type(magics).__name__, None)


def check_devices() -> bool:
    """Warn when JAX already started with a single CPU device (slices larger than 1 are then impossible).

    Returns True when the devices are fine. Asking JAX for its devices here is safe: `import pw_kernel`
    (which loading the extension did) already configured the simulated devices if JAX had not started.
    """
    import jax

    devices = jax.devices()
    if len(devices) > 1 or devices[0].platform != "cpu":
        return True
    warnings.warn(
        PathwaysWarning(
            "pw_kernel: JAX already started with a single CPU device, so slices of more than one device, meshes "
            "and multi-slice programs cannot be made. To simulate 8 CPU devices, either:\n"
            "  1. restart the kernel and run `%load_ext pw_kernel` (or `import pw_kernel`) before any JAX code;\n"
            "  2. use the \"Python 3 (Pathways)\" kernel: `python -m pw_kernel install --user`, then pick it in "
            "Jupyter;\n"
            "  3. set the environment variable JAX_NUM_CPU_DEVICES=8 before starting Jupyter."
        ),
        stacklevel=2,
    )
    return False


__all__ = ["CellError", "PathwaysWarning", "check_devices", "load_ipython_extension", "unload_ipython_extension"]

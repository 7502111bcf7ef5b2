"""pw_kernel: Pathways-style single-controller asynchronous dataflow for JAX, in Jupyter.

Example::

    import pw_kernel as pw
    s = pw.slice(2, mesh={"d": 2})
    a = pw.compiled(lambda x: x * 2, slice=s)

    @pw.program
    def f(v):
        return a(a(v))

    f(jnp.ones(4)).result()
"""

from __future__ import annotations

import importlib
from typing import Any

# Importing the runtime starts no JAX backend, so the device count can still be chosen after it.
from .runtime import *  # noqa: F403 - the runtime's public names are pw's
from .runtime import __all__ as _runtime_all
from .runtime import configure_cpu_devices
from .train import *  # noqa: F403
from .train import __all__ as _train_all
from .widgets.reprs import register as _register_views

configure_cpu_devices()  # 8 simulated CPU devices unless JAX already started or the user chose
_register_views()  # how runtime objects draw themselves in a notebook (the views' side; nothing imported yet)

__version__ = "0.1.0"

#: The views, imported on first use: they need the notebook stack (anywidget), the runtime does not.
_VIEWS = ("show_mesh", "timeline", "show_pipeline")
#: The runtime's names for the layers above, not for users.
_LAYERS = frozenset(
    {"DEFAULT_CPU_DEVICES", "FINAL", "TraceRow", "backends_started", "busy_time", "chrome_trace",
     "context_mesh_hint", "describe_sharding", "nbytes_of", "short_error",
     "transition_edges", "configure_cpu_devices"}
)


def __getattr__(name: str) -> Any:
    if name in _VIEWS:
        value = getattr(importlib.import_module(".widgets", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pw_kernel' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """`%load_ext pw_kernel`: register the `%%pathways` / `%pathways` magics (imported lazily)."""
    importlib.import_module(".magics", __name__).load_ipython_extension(ipython)


def unload_ipython_extension(ipython) -> None:
    """`%unload_ext pw_kernel`."""
    importlib.import_module(".magics", __name__).unload_ipython_extension(ipython)


__all__ = sorted({*_runtime_all, *_train_all, *_VIEWS} - _LAYERS)

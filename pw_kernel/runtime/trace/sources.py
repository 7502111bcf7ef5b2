"""Where an error comes from, as a user reads it: their own line first, the library line it failed in below it.

An error raised while tracing a user's function often fails deep in a library
the function called (optax's loss on a wrong target shape fails in
``optax/losses/_classification.py``). The user's line that called it is what
they can change, so an error names that first (``at Cell In[7], line 3``) and
the library's line below it (``in .../optax/losses/_classification.py, line
296``), never instead of it.

A notebook front names a cell's file the way IPython does (``Cell In[N]``):
it registers how with `set_file_labels`; the runtime itself knows nothing of
IPython.

Example::

    try:
        trace(...)
    except TypeError as e:
        raise TracingError("could not be traced" + fmt_exc_source(e))
"""

from __future__ import annotations

import linecache
import os
import sysconfig
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

import jax

_JAX_DIR = os.path.dirname(jax.__file__)
_PW_DIR = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))  # pw_kernel/ (as code objects name it)

#: Files that are never the user's: the standard library, installed packages, pw_kernel itself and JAX.
LIB_DIRS = tuple(
    sorted(
        {
            str(Path(p).resolve())
            for p in (
                *(sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")),
                _PW_DIR,
                _JAX_DIR,
            )
            if p
        }
    )
)

_labels: Callable[[str], str | None] | None = None


def set_file_labels(labels: Callable[[str], str | None] | None) -> None:
    """Name files as the user knows them: ``labels(filename)`` -> ``"Cell In[7]"``, or None to keep the name.

    The notebook front registers its own when loaded (and None when unloaded).
    """
    global _labels
    _labels = labels


def file_label(filename: str) -> str:
    """``filename`` as the user knows it (a cell's temporary file: ``Cell In[N]``)."""
    labels = _labels
    if labels is not None:
        try:
            got = labels(filename)
        except Exception:  # a front's labels must never hide the error being described
            got = None
        if got:
            return got
    return filename


def is_runtime(filename: str) -> bool:
    """Whether ``filename`` is pw_kernel's or JAX's own code (never where a user's error is)."""
    return filename.startswith((_JAX_DIR, _PW_DIR)) or "/importlib/" in filename


def is_library(filename: str) -> bool:
    """Whether ``filename`` is not the user's: the standard library, an installed package, pw_kernel or JAX."""
    if is_runtime(filename):
        return True
    if filename.startswith("<"):  # <string>, <frozen ...>; an IPython cell is labelled, not library
        return _labels is not None and file_label(filename) == filename
    try:
        path = str(Path(filename).resolve())
    except OSError:
        return False
    return path.startswith(LIB_DIRS)


def exc_sources(exc: BaseException) -> tuple[tuple[str, int], ...]:
    """Where ``exc`` comes from: (file, line) of the innermost user frame, then of the library frame it
    failed in when that is another (neither pw_kernel's nor JAX's); () when there is none."""
    frames = [(f.filename, f.lineno) for f in reversed(traceback.extract_tb(exc.__traceback__))]
    return sources(frames)


def sources(frames: Iterable[tuple[str, int | None]]) -> tuple[tuple[str, int], ...]:
    """`exc_sources` of ``frames`` (innermost first)."""
    failed = user = None
    for filename, line in frames:
        if line is None or is_runtime(filename):
            continue
        if failed is None:
            failed = (filename, line)
        if not is_library(filename):
            user = (filename, line)
            break
    if failed is None:
        return ()
    if user is None or user == failed:
        return (failed,)
    return (user, failed)


def fmt_sources(where: tuple[tuple[str, int], ...]) -> str:
    """``where`` (`exc_sources`) as an error's lines: ``at <user's line>``, then ``in <library line>`` below it."""
    out = []
    for k, (filename, line) in enumerate(where):
        text = linecache.getline(filename, line).strip()
        out.append(f"\n  {'at' if k == 0 else 'in'} {file_label(filename)}, line {line}" + (f":\n    {text}" if text else ""))
    return "".join(out)


def fmt_exc_source(exc: BaseException) -> str:
    """`fmt_sources` of `exc_sources`: where ``exc`` comes from, as lines to append to a message ("" if unknown)."""
    return fmt_sources(exc_sources(exc))

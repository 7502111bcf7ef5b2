"""JAX's own log line for a failing host callback, left out while pw runs are in flight.

When a `jax.pure_callback` (or `io_callback`, `jax.debug.callback`) raises, JAX
logs "jax.pure_callback failed" with the callback's traceback to stderr, then
XLA raises an error that quotes the same traceback. In a pw run that error fails
the node and is reported once, condensed (the cell's error, the run widget, the
failure report); the log line would print it again, raw, above them. Outside pw
runs JAX's logging is left as it is.
"""

from __future__ import annotations

import logging
from typing import Callable

# Logger names (strings only: nothing is imported from JAX's private modules) and the messages they log.
_LOGGERS = ("jax._src.callback", "jax._src.debugging")
_MESSAGES = frozenset({"jax.pure_callback failed", "jax.io_callback failed", "jax.debug.callback failed"})


class _WhileRunsAreLive(logging.Filter):
    def __init__(self, live: Callable[[], bool]):
        super().__init__()
        self.live = live

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg in _MESSAGES and self.live())


def quiet_while(live: Callable[[], bool]) -> Callable[[], None]:
    """Drop JAX's "callback failed" log records while ``live()``; returns the function that undoes it.

    Example::

        undo = quiet_while(lambda: bool(controller._live))
        undo()  # at shutdown
    """
    flt = _WhileRunsAreLive(live)
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    for lg in loggers:
        lg.addFilter(flt)

    def undo() -> None:
        for lg in loggers:
            lg.removeFilter(flt)

    return undo

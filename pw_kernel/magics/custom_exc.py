"""A handler of some of IPython's custom exceptions, chained to the one set before it.

IPython holds one custom exception handler (`InteractiveShell.set_custom_exc`).
The front has two (Ctrl-C cancels the cell's runs; pw_kernel's errors point at
the user's lines), and a user or another extension may have set one first: each
`ChainedHandler` adds its types and passes every other exception to the handler
it found.

Example::

    hook = ChainedHandler(shell, (PathwaysError,), show)   # show(shell, etype, value, tb, tb_offset)
    hook.register()
    ...
    hook.unregister()   # the handler found at `register` again, unless another replaced ours
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ChainedHandler:
    """IPython's custom exception handler for ``types``, the exceptions it found handled before passed on to it."""

    def __init__(self, shell: Any, types: tuple[type[BaseException], ...], handler: Callable[..., Any]):
        self.shell = shell
        self.types = types
        self.handler = handler  # handler(shell, etype, value, tb, tb_offset): shows the error
        self._previous: tuple[tuple, Any] | None = None  # the custom exceptions and handler found at `register`
        self._installed: Any = None  # the handler IPython holds for us (to tell whether it still does)

    def register(self) -> None:
        shell = self.shell
        self._previous = (shell.custom_exceptions, shell.CustomTB)
        shell.set_custom_exc((*shell.custom_exceptions, *self.types), self._handle)
        self._installed = shell.CustomTB

    def unregister(self) -> None:
        shell = self.shell
        if self._previous is not None and shell.CustomTB is self._installed:  # (else another one replaced ours)
            shell.custom_exceptions, shell.CustomTB = self._previous
        self._previous = self._installed = None

    def _handle(self, shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None):
        previous_types, previous = self._previous or ((), None)
        if not isinstance(value, self.types) and previous is not None and isinstance(value, previous_types):
            return previous(etype, value, tb, tb_offset=tb_offset)
        return self.handler(shell, etype, value, tb, tb_offset)

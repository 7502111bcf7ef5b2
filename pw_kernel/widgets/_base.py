"""What every pw_kernel widget shares: the static HTML in its mimebundle, and one ticker thread.

The ticker is how live widgets stay cheap for the controller: event-stream
callbacks (on controller threads) only append to a buffer and poke the
ticker; the ticker thread pushes buffered changes to the front-end at most
``PERIOD`` apart, also while the kernel sits idle between cells.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anywidget

from ..runtime import controller
from .esm import STATIC
from ._ticker import PERIOD, Ticker, ticker  # noqa: F401 - where the widgets have always found them


def controller_of(run: Any) -> Any:
    """The live controller ``run`` belongs to, or None (it was shut down or replaced, or forgot the run)."""
    c = controller(create=False)
    if c is None:
        return None
    return c if any(r is run for r in reversed(list(c.runs))) else None


class PwWidget(anywidget.AnyWidget):
    """An anywidget whose mimebundle also carries a static text/html picture of its state."""

    _css = STATIC / "widgets.css"
    _unsubscribe: Callable[[], None] | None = None  # set while the widget follows an event log

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._handles: list[Any] = []

    def static_html(self) -> str:
        """The widget's current state as self-contained HTML (no JavaScript)."""
        raise NotImplementedError

    def _unfollow(self) -> None:
        """Stop following the event log and the ticker (idempotent)."""
        unsub, self._unsubscribe = self._unsubscribe, None
        if unsub is not None:
            unsub()
        ticker.discard(self)

    def _repr_mimebundle_(self, **kwargs: Any):
        out = super()._repr_mimebundle_(**kwargs)
        if out is None:
            return None
        data, metadata = out
        return {**data, "text/html": self.static_html()}, metadata

    def _ipython_display_(self) -> None:
        """Display with a display id, so `refresh_static` can update what static viewers see."""
        from IPython.display import display

        bundle = self._repr_mimebundle_() if callable(self._repr_mimebundle_) else None
        if bundle is None:  # closed: only the picture is left
            display({"text/plain": repr(self), "text/html": self.static_html()}, raw=True)
            return
        data, metadata = bundle
        handle = display(data, metadata=metadata, raw=True, display_id=True)
        if handle is not None:
            self._handles.append(handle)

    def refresh_static(self) -> None:
        """Re-publish every display of this widget, so a saved notebook holds the latest static picture."""
        if not self._handles or not callable(self._repr_mimebundle_):
            return
        bundle = self._repr_mimebundle_()
        if bundle is None:
            return
        data, metadata = bundle
        for h in self._handles:
            h.update(data, metadata=metadata, raw=True)

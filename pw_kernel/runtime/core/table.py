"""The transition table: (state, event) -> the handler, and the states it may lead to.

Handlers register here with `on` (they live in `lifecycle.py`, beside the
`Lifecycle` they change); validation (`validation.py`) and the drawing of the
table (`transition_edges`) read it. An event a state does not accept is a bug:
`InvalidTransition`.

Example::

    from pw_kernel.runtime.core.table import TARGETS
    TARGETS[("running", "completed")]     # ('running', 'failed', 'done')
"""

from __future__ import annotations

from collections.abc import Callable

Handler = Callable[..., list]

#: (state, event) -> handler.
TRANSITIONS: dict[tuple[str, str], Handler] = {}
#: (state, event) -> the states the handler may leave the run in (checked when validating).
TARGETS: dict[tuple[str, str], tuple[str, ...]] = {}


def on(*keys: tuple[str, str], to: tuple[str, ...] = ()) -> Callable[[Handler], Handler]:
    """Register a handler for (state, event) keys; ``to``: where it may lead (empty: the state stays)."""

    def register(fn: Handler) -> Handler:
        for key in keys:
            TRANSITIONS[key] = fn
            TARGETS[key] = to or (key[0],)
        return fn

    return register


def transition_edges() -> list[tuple[str, str, str]]:
    """The table as (from state, event, to state) triples, for drawing it."""
    return [(state, event, to) for (state, event) in TRANSITIONS for to in TARGETS[(state, event)]]


__all__ = ["Handler", "TARGETS", "TRANSITIONS", "on", "transition_edges"]

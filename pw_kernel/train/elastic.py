"""Going on after a lost island: call the training function again, on the devices that are left.

In the spirit of pathwaysutils' ``elastic.retry``: the function a user
decorates builds its slices and pipeline from what is alive, restores the
latest checkpoint and trains on. When an island dies under it (its Ray actor
or node), the runs that needed it fail; `elastic_retry` sees that failure,
lets the checkpoint manager finish or drop the saves in flight, and calls the
function again, up to ``max_retries`` times. Any other error is raised as it
is.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from ..runtime import InputFailedError, IslandLostError, NodeError, controller
from .errors import CheckpointError

_log = logging.getLogger("pw_kernel")


def lost_islands() -> list:
    """The islands whose devices are gone."""
    return [i for i in controller().islands if i.lost]


def caused_by_lost_island(exc: BaseException) -> bool:
    """Whether ``exc`` comes from an island that was lost (directly, or a run that read from one)."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, IslandLostError):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    # A run that read a lost island's output fails with InputFailedError, whose cause is that run's error.
    return isinstance(exc, (NodeError, InputFailedError)) and bool(lost_islands())


def elastic_retry(
    fn: Callable | None = None,
    *,
    max_retries: int = 3,
    manager: Any = None,
    on_retry: Callable[[int, BaseException], None] | None = None,
):
    """Decorate a training function so that a lost island makes it start again on what is left.

    The function is called again with the same arguments; it should make its slices
    (`pw.slice` never places one on a lost island), rebuild its pipeline and restore the
    latest checkpoint (``pipe.restore(ckpt)``). With ``manager=`` the saves still in flight
    are finished (those that read the lost island fail, and are dropped) before the retry.

    Example::

        @pw.elastic_retry(manager=ckpt)
        def train():
            slices = [pw.slice(2) for _ in range(4)]
            pipe = pw.pipeline(stages, slices=slices, microbatches=8, optimizer=opt)
            start = ckpt.latest_step()
            state = pipe.init(params) if start is None else pipe.restore(ckpt)
            for step in range(0 if start is None else start + 1, 1000):
                state, loss = pipe.step(state, *batch(step))
                ckpt.save(step, {"state": state})
                loss.result()

        train()
    """

    def wrap(f: Callable) -> Callable:
        @functools.wraps(f)
        def run(*args, **kwargs):
            attempt = 0
            while True:
                try:
                    return f(*args, **kwargs)
                except Exception as e:
                    if attempt >= max_retries or not caused_by_lost_island(e):
                        raise
                    attempt += 1
                    names = ", ".join(f"island {i.id}" for i in lost_islands()) or "an island"
                    _log.warning("pw.elastic_retry: %s lost (%s); retry %d of %d", names, e, attempt, max_retries)
                    if manager is not None:
                        try:
                            manager.wait_until_finished()
                        except CheckpointError:
                            pass  # saves of values the lost island held: the last finished step stands
                    if on_retry is not None:
                        on_retry(attempt, e)

        return run

    return wrap if fn is None else wrap(fn)


__all__ = ["caused_by_lost_island", "elastic_retry", "lost_islands"]

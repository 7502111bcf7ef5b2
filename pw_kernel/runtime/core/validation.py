"""Validation mode (`Config.validate`, ``PW_VALIDATE=1``, on in the tests): the lifecycle's invariants.

Checked after every transition: the target is one the table declares, each
logged transition starts where the run's last one ended (a state changed
outside the table breaks the chain), in-flight counts equal dispatched minus
completed per island, a final run holds no memory, no slots and sits in no
queue with every output resolved, a done run completed every step; and node
events of one device never overlap.

Example::

    life = Lifecycle(max_inflight=8, n_islands=1, validate=True)   # checks run inside `handle`
    check_invariants(life)                                          # or all runs, at any time
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .records import FINAL, RunRecord
from .table import TARGETS, TRANSITIONS

if TYPE_CHECKING:
    from .story import Row

Lifecycle = Any  # (the `Lifecycle` of lifecycle.py, which imports this module: not imported back, even for types)


#: Runs whose last logged state validation remembers (a failed or cancelled run's dispatched nodes
#: still report; a done run is forgotten at once).
_LAST_STATES = 10_000


def check_row(last_state: dict[int, str], row: Row) -> None:
    """A logged transition is one the table has, and starts where the run's last logged one ended."""
    _, run, start, finish, event, _, _, _ = row
    assert (start, event) in TRANSITIONS and finish in TARGETS[(start, event)], row
    last = last_state.get(run, "new")
    assert start == last, f"run {run}: logged {start!r} -> {finish!r} ({event}), but its last transition ended in {last!r}"
    if finish == "done":  # (no transition leaves it: forgotten, so the check holds nothing per run done)
        last_state.pop(run, None)
        return
    last_state[run] = finish
    if len(last_state) > _LAST_STATES:  # failed and cancelled runs' late reports come soon: the oldest go
        del last_state[next(iter(last_state))]


def check_events(last_end: dict[int, int], events: Sequence[Any]) -> None:
    """Node events of one device never overlap (end >= start >= dispatch); ``last_end``: device -> last end."""
    for ev in events:
        assert ev.end >= ev.start >= ev.dispatch, ev
        for d in ev.devices:
            assert ev.start >= last_end.get(d, 0), f"{ev} overlaps the previous node on device {d}"
            last_end[d] = ev.end


def check_invariants(life: Lifecycle, rec: RunRecord | None = None) -> None:
    """The lifecycle's counts, and ``rec``'s state (every run in the queue if None)."""
    for i, n in enumerate(life.inflight):
        assert n == life.dispatched[i] - life.completed[i] >= 0, (i, n, life.dispatched[i], life.completed[i])
        assert 0 <= life.collectives_inflight[i] <= n, (i, life.collectives_inflight[i], n)
        assert 0 <= life.callbacks_inflight[i] <= min(n, 1), (i, life.callbacks_inflight[i], n)
    for d, n in life.reserved.items():
        assert n >= 0, (d, n)
    for r in [rec] if rec is not None else list(life.queue.values()):
        _check_record(life, r)


def _check_record(life: Lifecycle, r: RunRecord) -> None:
    assert 0 <= r.done <= r.dispatched <= r.cursor <= r.total, r
    if r.state == "queued":
        assert r.dispatched == 0 and r.started_at is None and r.slots is None, r
    if r.state in FINAL:
        assert r.id not in life.queue and not r.reserved, f"final {r} still queued or holds memory"
        assert r.slots is None and r.finished_at is not None, r
        assert all(r.resolved), f"final {r}: outputs {r.resolved} not all resolved"
    else:
        assert r.id in life.queue, f"{r} is not final but left the queue"
        want = r.state == "queued" or r.cursor < r.total
        assert (r.id in life.dispatchable) == want, f"{r}: dispatchable should be {want}"
        assert (r in life.ready) == want, f"{r}: in the ready index (or parked) should be {want}"
    if r.state == "done":
        assert r.done == r.total and r.error is None and not r.upstream, r
    for cell in r.upstream:
        assert cell.producer.state not in FINAL and r in cell.producer.downstream, (r, cell.producer)
    if r.state in ("failed", "cancelled"):
        assert r.error is not None, r


__all__ = ["check_events", "check_invariants", "check_row"]

"""What a remote island's process runs (`IslandActor`, a Ray actor's body), here in this process: how it answers
for a value it does not hold, and that it keeps nothing for the outputs of a node that failed.

A Ray island reaches it by actor calls; these are the same methods, called directly.
"""

from __future__ import annotations

import pytest

from pw_kernel.runtime.remote.actor import IslandActor, from_wire


def test_a_value_it_does_not_hold_is_answered_not_raised_and_moving_it_fails_the_move():
    actor = IslandActor()
    reply = actor.get(12)  # (a raised error nobody reads, a move's to a host that died, Ray prints as unhandled)
    with pytest.raises(RuntimeError, match=r"value 12 is not on its island: the node that makes it failed"):
        from_wire(reply)
    times, failure = actor.put(13, reply, (), ())
    assert times == [] and failure[0] == 0 and "value 12 is not on its island" in failure[1]
    assert actor.get_many([12, 13]) == [None, None]
    assert actor.stats()["waiting_frees"] == 1  # (13's free is yet to come)
    actor.free([13])
    assert actor.stats()["waiting_frees"] == 0


def test_the_outputs_of_a_failed_node_and_of_those_after_it_leave_nothing_behind_once_freed():
    actor = IslandActor()
    actor.free([21])  # a free may come before its node runs: kept until the node makes it, or fails
    times, failure, said = actor.run_many([("no such executable", [], [20, 21]), ("another", [], [22])])
    assert times == [] and failure[0] == 0 and "KeyError" in failure[1]
    actor.free([20, 22])
    assert actor.stats() == {"buffers": 0, "executables": 0, "run_calls": 1, "waiting_frees": 0}

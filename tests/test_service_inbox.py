"""The service's worker serves its clients' requests in turn: one client's backlog does not stand before another's."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("zmq")

from pw_kernel.service.inbox import Inbox


def served(box: Inbox, n: int) -> list:
    out = []
    for _ in range(n):
        out.append(box.get())
        box.done()
    return out


def test_a_clients_backlog_does_not_stand_before_another_clients_next_request():
    box = Inbox()
    for i in range(100):  # a loop queuing a hundred runs
        box.put(b"busy", f"run {i}")
    box.put(b"other", "call")
    first = served(box, 3)
    assert first == [(b"busy", "run 0"), (b"other", "call"), (b"busy", "run 1")]
    assert [item for _, item in served(box, 98)] == [f"run {i}" for i in range(2, 100)]  # its own order kept
    assert box.waiting() == 0


def test_a_client_is_idle_only_with_nothing_waiting_or_in_the_workers_hands():
    box = Inbox()
    assert box.idle(b"a")
    box.put(b"a", "first")
    assert not box.idle(b"a")
    assert box.get() == (b"a", "first")
    assert not box.idle(b"a") and box.idle(b"b")  # being handled: a request of its after it must wait
    box.done()
    assert box.idle(b"a")


def test_a_dropped_clients_waiting_requests_are_discarded_and_its_drop_comes_in_its_turn():
    box = Inbox()
    for i in range(5):
        box.put(b"dead", f"run {i}")
    box.put(b"alive", "call")
    assert box.drop(b"dead", "its connection closed") == 5
    assert served(box, 2) == [(b"dead", "its connection closed"), (b"alive", "call")]
    assert box.drop(b"gone", "heartbeats stopped") == 0 and served(box, 1) == [(b"gone", "heartbeats stopped")]


def test_the_worker_sleeps_until_a_request_comes_and_wakes_for_good_when_closed():
    box = Inbox()
    got = []
    handled = threading.Event()

    def work():
        while (item := box.get()) is not None:
            got.append(item)
            box.done()
            handled.set()
        got.append("stopped")

    worker = threading.Thread(target=work)
    worker.start()
    box.put(b"a", "hello")
    assert handled.wait(30)
    box.close()
    worker.join(30)
    assert not worker.is_alive() and got == [(b"a", "hello"), "stopped"]

"""The service as a layer: a service and its client in one process, its protocol, errors, stories and sessions.

These run in the quick tier: the service here is a `Service` object with a controller of its own,
and this process's `pw.connect()` is its client over the real ZeroMQ sockets.
"""

from __future__ import annotations

import gc
import json
import pickle
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw
from pw_kernel.runtime.extend import Compiled, ErrorEnvelope, Link
from pw_kernel.runtime.remote.ray import RayLink
from pw_kernel.service import protocol as p
from pw_kernel.service import wire
from pw_kernel.service.link import SPIN_MAX_S, ServiceLink
from pw_kernel.service.server import Service
from pw_kernel.service.wire import read_connection_file

HANG_S = 60  # only stops a wait that would hang: no test asserts on time


def bare_link(svc: Service, name: str = "observer") -> ServiceLink:
    """A client without a controller: sends protocol messages itself."""
    path, info = read_connection_file(svc.path, "test")
    link = ServiceLink(path, info)
    link.hello(name, 1.0, timeout=HANG_S)
    return link


def test_a_service_and_its_client_live_in_one_process(service):
    session = pw.connect(service.path, name="alice")
    assert session.alive and session.tenant == "alice"
    n = min(2, len(jax.devices()))  # (1 on a one-device host: the service has what this process has)
    s = pw.slice(n, mesh={"d": n})
    assert s.island.remote is not None  # the service's devices, by default
    double = pw.compiled(lambda x: x * 2, slice=s)
    y = double(jnp.arange(4.0))
    for _ in range(3):
        y = double(y)
    assert np.asarray(y.result()).tolist() == [0.0, 16.0, 32.0, 48.0]
    assert [c.name for c in pw.clients()] == ["alice"]
    assert service.ctrl is not pw.controller()  # the service schedules with a controller of its own


def test_every_request_has_a_story_from_arrival_to_reply(service):
    pw.connect(service.path, name="bob")
    s = pw.slice(1)
    inc = pw.compiled(lambda x: x + 1, slice=s)
    inc(jnp.zeros(3)).result()
    stories = {}
    for row in service.state.story.rows:
        stories.setdefault(row.stimulus, []).append(row)
    runs = [rows for rows in stories.values() if rows[0].request == "RunMany"]
    assert runs, stories.keys()
    stimulus = runs[-1][0].stimulus
    events = [r.event for r in runs[-1]]
    assert events[0] == "received" and "replied" in events, events  # (a lone node replies before its run returns)
    run_id = int(next(e for e in events if e.startswith("runs ")).split()[1])
    made = [r for r in service.ctrl.runs if r.id == run_id]  # the service's run, named by the request
    assert [(r.name, r.tenant) for r in made] == [(stimulus, "bob")]
    assert service.story(runs[-1][0].stimulus) == runs[-1]


def _until(what, check) -> None:
    deadline = time.monotonic() + HANG_S
    while not check():
        assert time.monotonic() < deadline, f"waited {HANG_S} s for {what}"
        time.sleep(0.01)


def _last_run_many(svc: Service) -> str:
    """What the service's story says last of the latest `RunMany` request."""
    latest = [r for r in svc.state.story.rows if r.request == "RunMany"][-1].stimulus
    return svc.story(latest)[-1].event


def test_a_call_on_an_idle_pool_runs_at_once_with_no_run_of_the_services_controller(service, monkeypatch):
    """Nothing else live in the pool: the node is called on the thread that received it, one lifecycle in all
    (the client's), and still counted where fair share and the pool view look (its device time, its span)."""
    pw.connect(service.path, name="carol")
    inc = pw.compiled(lambda x: x + 1, slice=pw.slice(1))
    x = inc(jnp.zeros(3))
    x.result()
    pw.clients()
    calls = 1
    # Compiled, then timed the usual way until its time is known to be quick (a few calls; more on a loaded
    # machine, where a node's first times are long): then it runs at once.
    while not _last_run_many(service).startswith("ran at once"):
        assert calls < 200, _last_run_many(service)
        _until("the service's runs to end", lambda: service.ctrl.idle)
        x = inc(x)
        x.result()
        pw.clients()  # (a request its worker answers, under the lock a call at once holds till its event is out)
        calls += 1
    runs, nodes = len(service.ctrl.runs), len(service.ctrl.events.nodes)
    spans, device_ns = service.state.pool_record.recorded, service.state.clients.by_tenant["carol"].device_ns
    carol = service.state.clients.by_tenant["carol"]
    assert len(carol.now_steps) == 1  # its step, kept: a loaded key's calls all trace alike
    (program,) = [e.program for k, e in carol.executables.items() if k in carol.now_steps]
    monkeypatch.setattr(program, "_trace", lambda *a: pytest.fail("a call at once traced its arguments again"))
    for _ in range(20):
        x = inc(x)
        x.result()
    monkeypatch.undo()
    assert np.asarray(x.result()).tolist() == [calls + 20.0] * 3
    pw.clients()
    assert len(service.ctrl.runs) == runs  # no run of the service's controller
    new = list(service.ctrl.events.nodes)[nodes:]
    assert [(e.run_id, e.tenant) for e in new] == [(None, "carol")] * 20, new
    assert service.state.pool_record.recorded - spans == 20
    assert service.state.clients.by_tenant["carol"].device_ns > device_ns
    last = [r for r in service.state.story.rows if r.request == "RunMany"][-3:]
    assert [r.event for r in last] == ["received", "replied", "ran at once (the pool was idle)"], last
    assert [e.tenant for e in service.ctrl.events.nodes][-1] == "carol"
    # A step that donates its state goes the usual way (what pw still reads decides what it may donate), and
    # is not looked at again: its key is remembered, so its inputs are not walked each step for nothing.
    step = pw.compiled(lambda v: v * 0.5, slice=inc.slice, donate_argnums=0)
    for _ in range(4):
        x = step(x)
        x.result()
    pw.clients()
    assert len(service.ctrl.runs) == runs + 4
    assert len(service.state.clients.by_tenant["carol"].never_now) == 1


def test_a_donating_step_fed_from_another_slice_is_answered(service):
    """The service reshards its input first, and the step, sent right behind, donates that copy before the
    reshard's answer is made: the answer leaves the donated value out (the client no longer reads it)."""
    pw.connect(service.path, name="frank")
    make = pw.compiled(lambda x: x + 1, slice=pw.slice(1))
    step = pw.compiled(lambda v: v * 0.5, slice=pw.slice(1), donate_argnums=0)
    x = make(jnp.zeros(3))
    for _ in range(3):
        x = step(x)
    assert np.asarray(x.result(timeout=HANG_S)).tolist() == [0.125] * 3


def test_a_call_while_another_clients_run_is_live_goes_through_the_services_scheduler(service):
    """Another client's node still running: the call becomes a run of the service's controller, which orders it
    among the pool's work (fair share), and is answered when it is done."""
    pw.connect(service.path, name="dave")
    inc = pw.compiled(lambda x: x + 1, slice=pw.slice(1))
    x = inc(jnp.zeros(3))
    for _ in range(3):
        x = inc(x)
        x.result()
    gate = threading.Event()
    held = Compiled(lambda v: jax.pure_callback(lambda a: (gate.wait(HANG_S), a)[1], v, v) + 0,
                    slice=service.state.slice(((1,), ("d",), (0,))), controller=lambda: service.ctrl)
    other = held.program.submit(jnp.zeros(3), tenant="erin")  # another tenant's run, live until the gate opens
    try:
        assert not service.ctrl.idle
        runs = len(service.ctrl.runs)
        y = inc(x)
        pw.clients()  # (answered by the service's worker once its socket thread has handled the call)
        assert len(service.ctrl.runs) == runs + 1
        latest = [r for r in service.state.story.rows if r.request == "RunMany"][-1].stimulus
        told = [r.event for r in service.story(latest)]
        assert told[0] == "received" and told[1].startswith("runs "), told  # (then "replied", once it ran)
    finally:
        gate.set()  # (before waiting for the call: the held node may share its device)
    assert np.asarray(y.result()).tolist() == [5.0] * 3
    other.wait(HANG_S)


def test_a_client_of_another_protocol_version_is_refused_with_a_clear_error(service):
    link = bare_link(service, "observer")
    old = p.Hello(p.PROTOCOL_VERSION - 1, "old", 1.0, 1, link.reply_id, link.beats_id)
    with pytest.raises(pw.ProtocolError, match=rf"protocol version {p.PROTOCOL_VERSION} and the client {p.PROTOCOL_VERSION - 1}.*same|Use one pw_kernel"):
        link.call(old, timeout=HANG_S)
    link.call(p.Bye(), timeout=HANG_S)
    link.close()
    # A connection file that says another version is refused before anything is sent.
    info = json.loads(open(service.path).read())
    other = service.path + ".v9"
    with open(other, "w") as f:
        json.dump({**info, "protocol": 9}, f)
    with pytest.raises(pw.ProtocolError, match="protocol version 9"):
        pw.connect(other)


def test_errors_arrive_as_the_class_they_left_as(service):
    link = bare_link(service)
    with pytest.raises(pw.PathwaysError, match="no buffer 12345"):  # raised there as a PathwaysError
        link.call(p.Get(12345), timeout=HANG_S)
    with pytest.raises(pw.ArgumentError, match="nothing is kept under that name"):
        link.call(p.Adopt("nothing kept", [1]), timeout=HANG_S)
    # Not pw's own error (JAX's TypeError on a str to place): a ServiceError here, naming it.
    with pytest.raises(pw.ServiceError, match="TypeError"):
        link.call(p.Put(1, "text", ((1,), ("d",), (0,)), ()), timeout=HANG_S)
    link.call(p.Bye(), timeout=HANG_S)
    link.close()
    env = pickle.loads(pickle.dumps(ErrorEnvelope.of(pw.AdmissionError("too big"))))
    err = env.exception("there: ")
    assert type(err) is pw.AdmissionError and str(err) == "there: too big"


def test_shutdown_ends_the_connection_and_init_keeps_it(service):
    pw.connect(service.path, name="carol")
    pw.init(pw.Config(validate=True))  # kept: the service is an island of the new controller
    assert pw.slice(1).island.remote is not None
    assert [c.name for c in pw.clients()] == ["carol"]
    pw.shutdown()  # ended: the service forgets this client, and slices are this process's again
    with pytest.raises(pw.PathwaysError, match=r"needs a connection.*pw.connect\(\)"):
        pw.clients()
    link = bare_link(service)
    assert [c["name"] for c in link.call(p.Clients(), timeout=HANG_S)] == ["observer"]
    link.call(p.Bye(), timeout=HANG_S)
    link.close()
    assert pw.slice(1).island.remote is None


def test_a_lost_services_error_is_every_later_calls_and_does_not_grow_with_them(service):
    """A notebook that goes on calling after its service died (a retry loop) gets the link's one error each time:
    raised bare, it had kept every raiser's frames, call after call."""
    from pw_kernel.service import session

    pw.connect(service.path, name="erin")
    lost = session._conn.link.lose("the test says so")  # (what the heartbeat does when the service goes quiet)
    lengths = []
    for _ in range(20):
        with pytest.raises(pw.IslandLostError, match="Pathways service lost: the test says so") as info:
            pw.clients()
        assert info.value is lost
        tb, n = info.value.__traceback__, 0
        while tb is not None:
            tb, n = tb.tb_next, n + 1
        lengths.append(n)
    assert len(set(lengths)) == 1, lengths


def test_bursts_of_any_shape_trace_nothing_new_in_the_service(service):
    pw.connect(service.path, name="dave")
    s = pw.slice(1)
    a = pw.compiled(lambda x: x + 1, slice=s, name="a")
    b = pw.compiled(lambda x: x * 2, slice=s, name="b")

    @pw.program(mode="chained")  # (each call's nodes sent as they are: bursts of n nodes of a and b)
    def chain(x, n):
        for i in range(n):
            x = (a if i % 2 else b)(x)
        return x

    x = jnp.ones(4)
    for n in (1, 2, 3, 5, 8, 2, 7, 1):  # bursts of many shapes
        x = chain(x, n)
    x.result()
    assert np.asarray(x.result()).tolist()[0] > 1
    programs = [exe.program for c in service.state.clients for exe in c.executables.values()]
    assert len(programs) == 2  # one executable per node function, loaded once ...
    traced = [len({id(g) for g in prog._cache.values()}) for prog in programs]
    assert traced == [1, 1]  # ... and traced once (one graph each), whatever the bursts' shapes


def test_a_waiting_thread_polls_without_sleeping_only_while_replies_come_quickly(service):
    link = bare_link(service)
    polls = []  # the reader's poll timeouts, ms: 0 while it spins
    real = link._poller.poll
    link._poller.poll = lambda timeout=None: polls.append(timeout) or real(timeout)
    for _ in range(200):  # (until one reply is waited for within its spin window: on a loaded machine not each is)
        # Replies as quick as a new link assumes: a loaded machine's slow ones would have raised the average past
        # spinning, which is the second half's behaviour, not this one's
        link.round_trip_s = SPIN_MAX_S / 4
        link.call(p.Clock(), timeout=HANG_S)
        if 0 in polls:
            break
    assert 0 in polls  # quick replies: waited for polling, not sleeping
    with service._lock:  # (a request waits for the lock the socket thread cannot take: its reply comes late)
        late = link.send(p.Clock())
        time.sleep(8 * SPIN_MAX_S)  # (a reply at least this late: the average moves a tenth of the way to it)
    link.get(late, HANG_S)
    assert link.round_trip_s > SPIN_MAX_S / 2  # the usual round trip, a moving average, is now slow ...
    polls.clear()
    link.call(p.Clock(), timeout=HANG_S)
    assert polls and 0 not in polls  # ... so the next waiter sleeps in its poll at once
    link.call(p.Bye(), timeout=HANG_S)
    link.close()


def test_links_are_declared():
    assert isinstance(RayLink(actor=None), Link)
    members = {"direct", "cancels", "profiles", "runs_python", "again", "request", "request_oneway", "ready",
               "wait", "get", "take_inline", "put", "usable", "lost_errors", "where"}
    for cls in (RayLink, ServiceLink):
        assert members <= set(dir(cls)), members - set(dir(cls))


def test_whether_a_process_runs_is_asked_in_one_place_and_a_background_service_watches_none():
    import os
    import subprocess

    from pw_kernel.service import serve
    from pw_kernel.service.wire import pid_running

    ended = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    assert pid_running(ended.pid)
    ended.stdin.close()  # it ends; not yet waited for (WNOWAIT), it is a zombie, which has ended too
    os.waitid(os.P_PID, ended.pid, os.WEXITED | os.WNOWAIT)
    assert not pid_running(ended.pid)
    assert ended.poll() is not None  # (only now waited for)
    assert pid_running(os.getpid()) and not pid_running(ended.pid)
    with pytest.raises(pw.PathwaysError, match="watches a process for a service in the foreground"):
        serve(background=True, exit_with=os.getpid())


def test_messages_are_typed_records_that_cross_whole():
    for cls in [*p.REQUESTS.values(), p.Hello, p.Reply, p.Failed, p.Pong, p.RunReply, p.Keep]:
        fields = cls.__dataclass_fields__
        msg = cls(*[None] * len(fields))
        assert pickle.loads(pickle.dumps(msg)) == msg
        with pytest.raises((AttributeError, TypeError)):  # (frozen and slotted: Python 3.11 says TypeError)
            msg.id = 1


def test_a_calls_request_and_answer_travel_flat_and_arrive_as_the_records_they_left_as():
    info = {"signature_scheme": "hmac-sha256", "key": "k" * 64}
    client, svc = wire.Messages(info, "pw-client-1"), wire.Messages(info, "pw-service", routed=True)
    request = p.Request(7, p.RunMany([("k1", [3], [4])], [9, 10], (12, 0)))
    answer = p.Reply(7, p.RunReply([(1, 2)], None, {4: np.arange(3, dtype=np.float32)}, {0: [("stdout", "hi")]}))
    assert wire.flat(request) is not None and wire.flat(answer) is not None
    _, got = svc.unpack([b"them", *client.pack(request)])
    assert got.body == request
    _, got = client.unpack(svc.pack(answer, b"them")[1:])
    small = got.body.value.small[4]
    assert got.body.value.times == [(1, 2)] and got.body.value.said == answer.value.said
    assert small.dtype == np.float32 and small.tolist() == [0.0, 1.0, 2.0]

    # Flat: pickle writes and reads it without calling back into Python (each such call is a cost on a call's way).
    calls = []
    profile = lambda frame, event, arg: calls.append(frame.f_code.co_name) if event == "call" else None
    frames = svc.pack(answer, b"them")
    sys.setprofile(profile)
    try:
        svc.pack(answer, b"them")
        client.unpack(frames[1:])
    finally:
        sys.setprofile(None)
    assert "reducer_override" not in calls and "__reduce__" not in calls, calls

    # What a tuple cannot carry goes pickled as itself, and arrives the same.
    for other in [
        p.Reply(8, p.RunReply([(1, 2)], (0, ErrorEnvelope.of(ValueError("bad"))), {}, {})),
        p.Reply(9, p.RunReply([(1, 2)], None, {4: np.zeros(2**15)}, {})),  # (out of band)
        p.Reply(10, np.ones(3)),
    ]:
        assert other != answer and (wire.flat(other) is None or type(other.value) is not p.RunReply)
        _, got = client.unpack(svc.pack(other, b"them")[1:])
        assert type(got.body.value) is type(other.value) and got.body.id == other.id


def test_messages_are_signed_with_hmac_sha256_of_the_connection_files_key():
    import hashlib
    import hmac

    for key in ["k", "k" * 64, "k" * 200]:  # (shorter, as long as, longer than SHA-256's block)
        m = wire.Messages({"signature_scheme": "hmac-sha256", "key": key}, "pw-client-1")
        for body in [b"", b"abc", bytes(range(256)) * 9]:
            assert m.sign(body) == hmac.new(key.encode(), body, hashlib.sha256).digest()
    with pytest.raises(ValueError, match="unsupported signature scheme 'hmac-md5'"):
        wire.Messages({"signature_scheme": "hmac-md5", "key": "k"}, "pw-client-1")


def test_a_request_cut_short_by_ctrl_c_is_refused_by_the_service_and_the_link_goes_on(service):
    link = bare_link(service)
    real, refused = link._out, service.state.refused
    link._out = CtrlCAfterFirstFrame(real)
    big = np.ones(2 * wire.OUT_OF_BAND, np.float32)
    with pytest.raises(KeyboardInterrupt):
        link.send(p.Put(1, big, (), ()))
    link._out = real
    assert not link.pending  # (no reply will come for it: none is waited for)
    assert link.call(p.Clock(), timeout=HANG_S) is not None  # the next request: answered
    assert service.state.refused == refused + 1  # the cut one: refused whole, with a warning in the service's log
    link.call(p.Bye(), timeout=HANG_S)
    link.close()


class CtrlCAfterFirstFrame:
    """A real socket, and a Ctrl-C that lands after a message's first frame has left."""

    def __init__(self, sock):
        self.sock, self.sent = sock, 0

    def send(self, frame, flags, copy=True):
        if self.sent == 1:
            self.sent += 1
            raise KeyboardInterrupt
        self.sent += 1
        return self.sock.send(frame, flags, copy=copy)

    def close(self, linger=None):
        self.sock.close(linger=linger)


class Sub(np.ndarray):
    """An ndarray subclass: numpy reduces it itself, with an out-of-band buffer of any size."""


def test_a_send_cut_short_by_ctrl_c_is_refused_whole_and_the_next_message_arrives_intact():
    """ZeroMQ joins a multipart message cut short to the socket's next one: `wire.send` ends it, the peer refuses it."""
    import zmq

    info = {"signature_scheme": "hmac-sha256", "key": "k"}
    sender, receiver = wire.Messages(info, "pw-client-1"), wire.Messages(info, "pw-service")
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.linger = b.linger = 0
    port = b.bind_to_random_port("tcp://127.0.0.1")
    a.connect(f"tcp://127.0.0.1:{port}")

    big = np.arange(2 * wire.OUT_OF_BAND, dtype=np.float32)  # (out of band: a frame of its own)
    cut = sender.pack(p.Request(1, p.Put(7, big, (), ())))
    assert len(cut) == 2
    with pytest.raises(KeyboardInterrupt):
        wire.send(CtrlCAfterFirstFrame(a), cut)
    wire.send(a, sender.pack(p.Request(2, p.Put(8, big + 1, (), ()))))
    try:
        with pytest.raises(ValueError, match="cut short by its sender"):
            receiver.unpack(wire.recv(b))
        msg = receiver.unpack(wire.recv(b))[1].body
        assert msg.id == 2 and msg.body.handle == 8
        np.testing.assert_array_equal(msg.body.value, big + 1)
        # frames of another message after a whole one: refused, not read as its arrays
        one, other = sender.pack(p.Request(3, p.Put(9, big, (), ()))), sender.pack(p.Request(4, p.Ping()))
        with pytest.raises(ValueError, match="more than its arrays"):
            receiver.unpack([*one, *other])
        # a small array of an ndarray subclass stays in the pickle: no array's frame is ever empty
        small = np.zeros(0, np.float32).view(Sub)
        frames = sender.pack(p.Request(5, p.Put(10, small, (), ())))
        assert len(frames) == 1 and receiver.unpack(frames)[1].body.body.value.shape == (0,)
    finally:
        ctx.destroy(linger=0)


def test_two_functions_of_one_signature_and_name_each_run_their_own_code(service):
    # Each reaches the service as a `jax.export` call, which prints as its name and signature only: they must
    # not share one executable there (they did: g returned f's values).
    pw.connect(service.path, name="alice")
    s = pw.slice(1)
    f = pw.compiled(lambda x: x * 2, slice=s)
    g = pw.compiled(lambda x: x + 1, slice=s)
    x = jnp.arange(4.0)
    assert np.asarray(f(x).result()).tolist() == [0.0, 2.0, 4.0, 6.0]
    assert np.asarray(g(x).result()).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_nodes_are_exported_for_the_platform_the_service_runs_on_not_the_clients_stand_ins(service, monkeypatch):
    # A client traces on CPU stand-ins and never opens the accelerator; the service may run on GPUs, where a
    # node exported for the client's CPU was refused ("exported for platforms ('cpu',) but it is used on
    # ('cuda',)"): every call through a GPU service failed. The service's hello says what to export for.
    session = pw.connect(service.path, name="alice")
    assert session.remote.info["export"] == jax.export.default_export_platform()
    loaded = []
    deserialize = jax.export.deserialize  # (the service's handler, in this process, loads each node with it)
    monkeypatch.setattr(jax.export, "deserialize", lambda blob: loaded.append(deserialize(blob)) or loaded[-1])
    s = pw.slice(1)
    x = jnp.arange(4.0)
    assert np.asarray(pw.compiled(lambda v: v * 2, slice=s)(x).result()).tolist() == [0.0, 2.0, 4.0, 6.0]
    assert [e.platforms for e in loaded] == [(jax.export.default_export_platform(),)]
    # a service that runs on CUDA is sent a CUDA export (here, on the CPU, it refuses it: the call fails, clearly)
    monkeypatch.setitem(session.remote.info, "export", "cuda")
    with pytest.raises(pw.NodeError, match=r"exported for platforms '\('cuda',\)' but it is used on"):
        pw.compiled(lambda v: v + 1, slice=s)(x).result()
    assert loaded[-1].platforms == ("cuda",)


def test_a_step_of_hundreds_of_small_leaves_costs_no_object_nor_copy_per_leaf(service, monkeypatch):
    from pw_kernel.runtime.extend import inline_picks
    from pw_kernel.runtime.remote.actor import INLINE_COUNT
    from pw_kernel.service import runs

    sent = []  # how many values each run's reply carried
    real = runs.RunReply
    monkeypatch.setattr(runs, "RunReply", lambda times, failure, small, said: sent.append(len(small))
                        or real(times, failure, small, said))
    pw.connect(service.path, name="erin")
    s = pw.slice(1)
    step = pw.compiled(lambda state, x: (jax.tree.map(lambda v: v + x, state), x * 2), slice=s, donate_argnums=0)
    state = {f"b{i:03d}": jnp.zeros(8) for i in range(200)}  # 200 biases of 32 bytes: each small enough to inline
    for _ in range(5):
        state, loss = step(state, jnp.ones(()))
        assert float(loss.result()) == 2.0  # (the loss came with the reply: the smallest output)
    assert sent and max(sent) <= INLINE_COUNT  # a few values come back per run, not 201
    (c,) = service.state.clients
    futures = [f for f in c.buffers.values() if isinstance(f, pw.Future)]
    assert len(futures) >= 201  # (the last run's outputs)
    # A done-callback or a waiter makes a future a Condition: the service watches a run (its last output), and
    # its reply thread waits on the outputs not yet set when it gets to them (a few, as the GIL passes between
    # it and the thread setting them); not one each.
    assert sum("_condition" in f.__dict__ for f in futures) < 20
    assert float(state["b199"].result()[0]) == 5.0  # (a leaf not sent along is fetched when read)
    # The smallest first, in order; none over the byte bound.
    assert inline_picks([4, 2000, 4, 8, 4]) == [0, 2, 3, 4]
    assert inline_picks([8] * 20 + [4]) == list(range(INLINE_COUNT - 1)) + [20]


def test_pw_get_of_a_tree_asks_the_service_once(service):
    pw.connect(service.path, name="fay")
    s = pw.slice(1)
    bump = pw.compiled(lambda st: jax.tree.map(lambda v: v + 1, st), slice=s)
    state = bump({f"w{i:03d}": jnp.full(64, float(i)) for i in range(100)})  # (256 B each: a few come inline)

    def gets() -> int:
        return len({r.stimulus for r in service.state.story.rows if r.request in ("Get", "GetMany")})

    before = gets()
    values = pw.get(state)
    assert gets() == before + 1  # one request for the 92 values not sent with the run, not 92
    assert [float(v[0]) for v in values.values()] == [i + 1.0 for i in range(100)]
    assert all(isinstance(v, jax.Array) for v in values.values())
    assert pw.get(state)["w099"] is values["w099"]  # (fetched once: read again, nothing is asked)
    assert gets() == before + 1
    local = pw.compiled(lambda x: x * 2, slice=pw.slice(1, island=0))  # (this process's own devices)
    mixed = pw.get({"remote": bump(state), "local": local(jnp.ones(2)), "plain": 3})
    assert float(mixed["remote"]["w000"][0]) == 2.0 and mixed["local"].tolist() == [2.0, 2.0] and mixed["plain"] == 3


def test_a_donated_state_is_one_copy_in_the_service_and_reads_as_donated_here(service):
    pw.connect(service.path, name="gus")
    s = pw.slice(1)
    step = pw.compiled(lambda st: jax.tree.map(lambda v: v * 2, st), slice=s, donate_argnums=0)
    state = step({"w": jnp.ones(256), "b": jnp.ones(4)})
    pw.get(state)
    (c,) = service.state.clients
    before = {k: pw.get(c.buffers[f.remote_array().handle]) for k, f in state.items()}  # the service's arrays
    old, state = state, step(state)
    assert float(state["w"].result()[0]) == 4.0
    assert all(a.is_deleted() for a in before.values())  # XLA reused them for the outputs: one copy, as jit's
    with pytest.raises(pw.ArgumentError, match="donated to run"):
        old["w"].result()  # as it would say on this process's own devices
    pw.keep("ckpt", state)  # a kept tree is not donated: the next step writes its outputs elsewhere
    state = step(state)
    assert float(np.asarray(pw.kept("ckpt")["w"])[0]) == 4.0 and float(state["w"].result()[0]) == 8.0
    from pw_kernel.service import unkeep

    assert unkeep("ckpt")


def test_a_step_of_many_outputs_asks_its_reply_once_not_once_an_output(service, monkeypatch):
    pw.connect(service.path, name="hal")
    step = pw.compiled(lambda st: jax.tree.map(lambda v: v * 2, st), slice=pw.slice(1), donate_argnums=0)
    state = step({f"w{i:03d}": jnp.ones(4) for i in range(200)})
    state["w000"].result()
    asked = []
    real = ServiceLink.ready
    monkeypatch.setattr(ServiceLink, "ready", lambda self, ref: asked.append(ref) or real(self, ref))
    for _ in range(10):
        state = step(state)
        state["w000"].result()
    assert len(asked) < 10 * 20  # a node's outputs share one reply: asked about once each step, not 200 times


def test_waiting_for_a_bursts_outputs_makes_no_reference_cycle():
    """The service's own process freezes what survives a full collection (`clients.Heap`): whatever a cycle
    holds outlives its use there until the next walk of everything. So the wait for a burst's outputs
    (`runs.when_done`: a step's hundreds of futures, and their arrays) makes none, and they go when used."""
    from pw_kernel.service.runs import when_done

    gate = threading.Event()
    gate.set()
    slow = pw.compiled(lambda v: jax.pure_callback(lambda a: (gate.wait(HANG_S), a)[1], v, v) * 2, slice=pw.slice(1))
    slow(jnp.ones(3)).result()  # compiled
    gate.clear()
    called = []
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable is kept in gc.garbage, to look at
    try:
        outs = [[slow(jnp.ones(3)), slow(jnp.ones(3))], [slow(jnp.ones(3))]]
        assert not any(f.done() for fs in outs for f in fs)  # (waited for with a done-callback, not at once)
        when_done(outs, lambda: called.append(True), threading.Lock())
        gate.set()
        for fs in outs:
            for f in fs:
                f.result(timeout=HANG_S)
        _until("the burst's answer", lambda: called)
        del outs, fs, f
        gc.collect()
        in_runs = lambda o: getattr(getattr(o, "__code__", None), "co_filename", "").endswith("runs.py")
        cyclic = [o for o in gc.garbage if isinstance(o, pw.Future) or in_runs(o)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert called == [True]
    assert cyclic == []


def test_the_services_heartbeat_reads_the_frozen_count_its_last_freeze_made(monkeypatch):
    """The service's collector check runs on every heartbeat of its socket thread (`clients.Heap.tick`).
    Counting the frozen objects walks all of them (~11 ms at 250,000, with no request read meanwhile), so a
    tick with nothing to freeze counts nothing; a freeze counts once, and a growth past REWALK_GROWTH is still seen."""
    import types

    from pw_kernel.service import clients

    counts = []
    real = gc.get_freeze_count
    counting = types.SimpleNamespace(freeze=gc.freeze, unfreeze=gc.unfreeze, collect=gc.collect, callbacks=gc.callbacks,
                                     get_freeze_count=lambda: counts.append(1) or real())
    monkeypatch.setattr(clients, "gc", counting)
    was_enabled = gc.isenabled()
    gc.disable()  # (the only full passes are this test's: one the collector made by itself would be frozen too)
    heap = clients.Heap()  # (walks and freezes this process's heap: `close` lets it go)
    try:
        at_start = len(counts)
        for _ in range(50):
            heap.tick()  # heartbeats, no full pass between them
        assert len(counts) == at_start
        junk = [[i] for i in range(2 * real())]  # the frozen objects more than double at the next freeze
        gc.collect()
        heap.tick()  # a full pass ended: frozen, and counted once
        assert len(counts) == at_start + 1
        walks = heap.walks
        heap.tick()  # the count that freeze made is past REWALK_GROWTH: everything walked
        assert heap.walks == walks + 1
        del junk
    finally:
        heap.close()
        if was_enabled:
            gc.enable()


def _queue_steps(svc: Service, n: int) -> dict:
    """Connect as "ivy" and queue ``n`` steps of a donated 8-leaf state in ``svc``; the last state (futures)."""
    pw.connect(svc.path, name="ivy")
    step = pw.compiled(lambda st: jax.tree.map(lambda v: jnp.tanh(v @ v) * 0.5, st), slice=pw.slice(1),
                       donate_argnums=0)
    state = {f"w{i}": jnp.eye(256) for i in range(8)}
    for _ in range(n):
        state = step(state)
    return state


def test_shutting_down_with_a_loop_queued_in_the_service_fails_each_run_once(service):
    """A client that exits (or shuts down) with steps queued: each queued run fails with why, once, though
    the end of one fails its readers meanwhile (a run already failed is not ended again)."""
    state = _queue_steps(service, 200)
    pw.shutdown()
    with pytest.raises(pw.PathwaysError, match="shut down|lost|failed"):
        state["w0"].result(timeout=HANG_S)


def test_a_service_stopped_with_runs_in_flight_leaves_no_thread_of_its_clients_behind(service):
    """`Service.stop()` joins each client's waiting thread: a daemon thread still inside JAX when the
    process exits is killed there (the service process then aborted at exit, now and then)."""
    _queue_steps(service, 50)
    _until("its waiting thread", lambda: any(t.name.startswith("pw-service-wait-") for t in threading.enumerate()))
    service.stop()
    assert [t.name for t in threading.enumerate() if t.name.startswith("pw-service-wait-")] == []

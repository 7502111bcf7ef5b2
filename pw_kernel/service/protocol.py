"""The service's protocol: every message a typed record, one version, one error envelope.

A client and the service exchange these and nothing else (`wire.Messages` signs
and pickles them). A request is one of the classes below, wrapped in a
`Request` with its id; the answer is a `Reply` with that id, or a `Failed`
carrying an `ErrorEnvelope`, which arrives as the same `pw.PathwaysError`
subclass it left as. `Ping`/`Pong` are heartbeats.

The first request a client sends is `Hello`, with its `PROTOCOL_VERSION`: a
service of another version refuses it with `pw.ProtocolError`, saying both
versions and what to do, before anything else is read. Change a message's
fields, add or remove one, and the version goes up.

The island requests (`Load` ... `ProfileStop`) are what a remote island asks of
its process (the Ray island actor's methods, `runtime.remote.actor`): the
service's link sends ``link.request("run_many", ops, frees, run)`` as
``RunMany(ops, frees, run)`` (`REQUESTS` maps the names).

Example::

    msg = Request(7, RunMany(ops=[("k1", [3], [4])], frees=[], run=(12, 0)))
    Reply(7, value)                    # or Failed(7, ErrorEnvelope.of(err))
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

from ..runtime.extend import ErrorEnvelope

#: Bumped whenever a message below changes: a client and a service of different versions do not talk.
PROTOCOL_VERSION = 5

#: Both sides tick this often: a client pings the service (`Ping`), the service answers (`Pong`) and looks
#: for clients it has not heard from.
HEARTBEAT_S = 0.5


def message(cls):
    """A typed message: a frozen, slotted dataclass that pickles as its class and its fields (cheaply)."""
    cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
    names = tuple(f.name for f in dataclasses.fields(cls))
    get = operator.attrgetter(*names) if names else None  # (C: a tuple of the fields when there are several)

    def __reduce__(self):  # (a frozen slotted dataclass's own pickling sets each field again: ~3x slower)
        if len(names) > 1:
            return cls, get(self)
        return cls, (get(self),) if names else ()

    cls.__reduce__ = __reduce__
    return cls


# ---------------------------------------------------------------- envelopes
@message
class Request:
    """A request and the id its reply will carry."""

    id: int
    body: Any  # one of the request classes below


@message
class Reply:
    id: int
    value: Any


@message
class Failed:
    """The request failed there: its error, to be raised here as the same class."""

    id: int
    error: ErrorEnvelope


@message
class RunReply:
    """A `RunMany`'s answer: each node's (start, end) on the service's clock; (index, `ErrorEnvelope`) of
    the node that failed, or None; a few small outputs (`inline_picks`) by handle (read without asking
    again); what nodes that call the host wrote, by index: [(stream, text), ...]."""

    times: list
    failure: tuple | None
    small: dict
    said: dict


@message
class Ping:
    """A heartbeat (and, from a client's reply socket at `hello`, its introduction to the service's router)."""


@message
class Pong:
    known: bool  # whether the service knows this client (False: it was dropped)
    lost: tuple = ()  # (island id, why) of each of the service's islands that is gone (a Ray node died)


# ---------------------------------------------------------------- the service's own requests
@message
class Hello:
    """A client introduces itself; answered with the service's `describe` and the client's tenant name."""

    version: int
    name: str | None
    weight: float
    pid: int
    reply_to: bytes  # the identity of the socket it reads replies on
    beats_from: bytes  # ... and of the one its heartbeats come from
    memory: int | None = None  # bytes it may hold on each device (`pw.connect(memory=...)`), or no cap


@message
class Bye:
    """The client leaves: its runs are cancelled and its buffers freed (kept trees stay)."""


@message
class Clock:
    """The service's `perf_counter_ns`, for the client's clock offset."""


@message
class Clients:
    """Every client: name, weight, device time, runs, nodes, pid."""


@message
class Islands:
    """The service's islands in other processes (each Ray node's), alive ones: what `Hello` said of them, now."""


@message
class Stats:
    """What the service holds, for this client and in all."""


@message
class Pool:
    """What the pool did lately (`pool.pool_data`): devices, every client (named: all are this user's), and the
    node spans that end at or after ``since_ns`` (the service's clock; 0: all kept; < 0: the last ``-since_ns`` ns
    of activity), with share samples."""

    since_ns: int = 0


@message
class Keep:
    name: str
    leaves: list  # ("a", handle, shape, dtype, layout, spec) or ("c", constant)
    treedef: bytes


@message
class KeptTree:
    """The tree kept under ``name`` (its leaves' metadata and treedef; None if none), or the names."""

    name: str | None


@message
class Adopt:
    """Give this client ``handles`` on the arrays of the tree kept under ``name``."""

    name: str
    handles: list


@message
class Unkeep:
    name: str


# ---------------------------------------------------------------- a remote island's requests
@message
class Load:
    """A node's executable: a serialized `jax.export`, to run on a mesh of ``layout``; ``donate``: the inputs
    whose buffers it reuses for its outputs (as the client's jit would: one copy of a step's state, not two)."""

    key: str
    blob: bytes
    layout: tuple
    in_specs: list
    out_specs: list
    donate: list = ()


@message
class LoadShipped(Load):
    """A node that calls the host: its pickled Python (`runtime.remote.shipped`), with `Load`'s fields."""


@message
class RunMany:
    """Run nodes by key on handles: ``ops`` [(key, in handles, out handles)], in order; free ``frees``;
    ``run``: the client's (run id, priority) they belong to."""

    ops: list
    frees: list = ()
    run: tuple | None = None


@message
class Put:
    handle: int
    value: Any
    layout: tuple
    spec: tuple


@message
class Reshard:
    src: int
    handle: int
    layout: tuple
    spec: tuple


@message
class Get:
    handle: int


@message
class GetMany:
    """Several values in one reply (`pw.get` of a tree): each as `to_wire` packs it, None for one that is gone
    or failed (reading that one alone then says why)."""

    handles: list


@message
class Colocated:
    """Host code beside the client's buffers: ``fn(arrays, out_shardings, *args)`` (a checkpoint's shards)."""

    fn: Any
    in_ids: list
    out_ids: list
    out_layouts: list
    args: tuple
    out_avals: list = ()  # (shape, dtype name) of each output: a Ray node's island makes them there


@message
class Free:
    handles: list


@message
class Cancel:
    run_ids: list


@message
class ProfileStart:
    pass


@message
class ProfileStop:
    pass


#: What a remote island's link calls by name, as the message it sends.
REQUESTS: dict[str, type] = {
    "load": Load, "load_shipped": LoadShipped, "run_many": RunMany, "put": Put, "reshard": Reshard, "get": Get,
    "get_many": GetMany,
    "colocated": Colocated, "free": Free, "cancel": Cancel, "stats": Stats, "clock": Clock,
    "profile_start": ProfileStart, "profile_stop": ProfileStop,
}

#: Requests that want no reply.
ONEWAY = (Free, Cancel)

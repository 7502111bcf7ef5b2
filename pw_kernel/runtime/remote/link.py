"""What a remote island needs of its transport: the `Link` protocol, which Ray's link and the service's implement.

A `RemoteIsland` (`client.py`) never names its transport: it sends requests
(``link.request("run_many", ops, frees, run)``) and reads their replies through
this interface. Two links implement it: `RayLink` (`ray.py`: a Ray actor per
island, replies as Ray ``ObjectRef``s) and the Pathways service's `ServiceLink`
(`pw_kernel.service.link`: ZeroMQ, signed typed messages). The requests are the
island actor's methods (`actor.IslandActor`): describe, clock, load,
load_shipped, run_many, put, reshard, get, get_many, colocated, free, cancel, stats,
profile_start, profile_stop.

What a link can do is declared, not probed: every link states each capability.

Example::

    class MyLink:                      # a third transport: implement every member
        direct = False
        ...
    assert isinstance(MyLink(), Link)  # (a runtime check of the members' presence)
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..errors import PathwaysError, ServiceError


@runtime_checkable
class Link(Protocol):
    """A remote island's transport: send a request to the island's process, read its reply."""

    #: Sending is cheap (serialise, one socket send): the dispatching thread sends itself, no mailbox hop.
    direct: bool
    #: The island drops a cancelled run's queued nodes when told (`cancel`); else it runs its mailbox in order.
    cancels: bool
    #: `pw.profile` can trace XLA's ops in the island's process too (`profile_start`, `profile_stop`).
    profiles: bool
    #: A node that calls the host can go as pickled Python (`load_shipped`).
    runs_python: bool
    #: What a user does once the island is gone (ends an `IslandLostError`'s message).
    again: str

    def request(self, method: str, *args: Any) -> Any:
        """Send ``method(*args)`` to the island's process; a reference to its reply (read with `get`)."""

    def request_oneway(self, method: str, *args: Any) -> None:
        """Send ``method(*args)``, wanting no reply (frees, cancels)."""

    def ready(self, ref: Any) -> bool:
        """Whether the reply of ``ref`` has come (never blocks)."""

    def wait(self, ref: Any, timeout: float) -> bool:
        """Block until the reply of ``ref`` has come (True) or ``timeout`` s pass (False)."""

    def get(self, ref: Any) -> Any:
        """The reply of ``ref`` (blocks); raises what the island raised, or a `lost_errors` error."""

    def take_inline(self, handle: int) -> Any:
        """The value of ``handle`` if it came with its run's reply (small values), once; else None."""

    def put(self, value: Any) -> Any:
        """``value`` shipped for a later request's argument (Ray: into its object store; else as it is)."""

    def usable(self) -> bool:
        """Whether requests can be sent now."""

    def lost_errors(self) -> tuple[type[BaseException], ...]:
        """The errors `get` raises when the island's process is gone."""

    def where(self, info: dict) -> str:
        """Where the island is, for messages: its host and process."""


class ErrorEnvelope:
    """An error as it crosses between processes, to be raised on the other side as the same class.

    A `PathwaysError` travels as its class's name, its message and its simple
    attributes (a `NodeError`'s run id, program and node), and is raised again as
    that class; any other exception as `ServiceError` whose message starts with
    its type's name (the other side may not have its class).

    Example::

        env = ErrorEnvelope.of(ArgumentError("`pw.keep` needs a name"))
        raise env.exception()          # ArgumentError: `pw.keep` needs a name
    """

    __slots__ = ("attrs", "kind", "message")

    def __init__(self, kind: str, message: str, attrs: dict | None = None):
        self.kind = kind
        self.message = message
        self.attrs = attrs or {}

    def __reduce__(self):
        return ErrorEnvelope, (self.kind, self.message, self.attrs)

    @classmethod
    def of(cls, error: BaseException) -> ErrorEnvelope:
        if isinstance(error, PathwaysError):
            attrs = {k: v for k, v in vars(error).items() if isinstance(v, (str, int, float, bool))}
            return cls(type(error).__name__, str(error), attrs)
        return cls("ServiceError", f"{type(error).__name__}: {error}")

    def exception(self, prefix: str = "") -> PathwaysError:
        """The error to raise here: the class it left as (a `ServiceError` where this process lacks it)."""
        kind = _pathways_errors().get(self.kind, ServiceError)
        message = prefix + self.message
        try:
            err = kind(message)
        except TypeError:  # (a class whose constructor takes more, e.g. NodeError's run, program, node)
            err = kind.__new__(kind, message)
            Exception.__init__(err, message)
        for k, v in self.attrs.items():
            setattr(err, k, v)
        return err

    def __repr__(self) -> str:
        return f"ErrorEnvelope({self.kind}: {self.message[:80]!r})"


def _pathways_errors() -> dict[str, type]:
    """Every `PathwaysError` subclass loaded in this process, by name."""
    found: dict[str, type] = {}
    todo = [PathwaysError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.__name__, cls)
        todo.extend(cls.__subclasses__())
    return found

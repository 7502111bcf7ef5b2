"""Errors raised by pw_kernel: one base class, one subclass per kind of mistake.

Messages name the API in backticks, show what was received and say what to do.
"""

from __future__ import annotations

import concurrent.futures
import re
import traceback


class PathwaysError(Exception):
    """Base class of every error pw_kernel raises on purpose."""


class ArgumentError(PathwaysError, TypeError, ValueError):
    """An argument of the wrong kind or value for a pw_kernel API (a TypeError and a ValueError)."""


class SliceError(PathwaysError, ValueError):
    """A slice request that cannot be satisfied (size, mesh shape, island, name)."""


class SliceReleasedError(PathwaysError, RuntimeError):
    """A released VirtualSlice was used."""


class SpecError(PathwaysError, ValueError):
    """`in_specs` / `out_specs` that do not fit the slice's mesh or the arguments."""


class TracingError(PathwaysError, TypeError):
    """A program could not be traced into a dataflow graph."""


class TracerArgument(TracingError):
    """A program was called on JAX tracers (inside `jax.jit`, `jax.grad`...), outside a program's trace."""


class ControlFlowError(TracingError):
    """Python control flow in a program depends on a value computed on devices."""


class FusedModeError(PathwaysError, ValueError):
    """`mode="fused"` was asked for a program that cannot run as one executable."""


class NodeError(PathwaysError, RuntimeError):
    """A node of a run raised; carries the node, the program and the original cause."""

    def __init__(self, message: str, *, run_id: int, program: str, node: str):
        super().__init__(message)
        self.run_id = run_id
        self.program = program
        self.node = node


class HostCallbackError(PathwaysError, RuntimeError):
    """A Python host callback raised inside a compiled computation, which was let finish (its node fails).

    The message is the callback's own traceback; ``original`` is the exception it raised.
    """

    def __init__(self, original: BaseException):
        super().__init__("".join(traceback.format_exception(original)).rstrip("\n"))
        original.__traceback__ = None  # (its text is the message: its frames would only hold the callback's locals)
        self.original = original


class InputFailedError(PathwaysError, RuntimeError):
    """A run's input future belongs to a run that failed or was cancelled."""


class AdmissionError(PathwaysError, MemoryError):
    """A run needs more device memory than its devices have, even with nothing else running."""


class NodeAdmissionError(NodeError, AdmissionError):
    """A node its island refused for memory (a client over its `pw.connect(memory=...)` share): caught as
    `pw.NodeError` (which node, which run) and as `pw.AdmissionError` (why)."""


class ControllerShutdownError(PathwaysError, RuntimeError):
    """The controller was shut down before the run finished."""


class CancelledError(PathwaysError, concurrent.futures.CancelledError):
    """A run (and so its futures) was cancelled."""


class TimeoutError(PathwaysError, concurrent.futures.TimeoutError):  # noqa: A001
    """Waiting for a future or a run took longer than its timeout."""


class IslandLostError(PathwaysError, RuntimeError):
    """A remote island's actor (or its node) died; runs that used it fail with this."""


class RayShutDownError(IslandLostError):
    """This process left Ray (``ray.shutdown()``): the islands on its Ray actors are out of reach."""


class ServiceError(PathwaysError, RuntimeError):
    """An error in the Pathways service that is not pw's own (its message starts with the original type's name)."""


class ProtocolError(PathwaysError, RuntimeError):
    """A client and a service that speak different protocol versions (or a message neither expects)."""


class InvalidTransition(AssertionError):
    """An internal bug: a run lifecycle event that its state does not accept."""


# XLA's wrapper around an exception raised by a Python host callback (jax.pure_callback, io_callback,
# jax.debug.callback): "INTERNAL: CpuCallback error calling callback: Traceback ...". The quoted
# traceback already ends with the user's exception; the wrapper's words only hide it.
_CALLBACK_WRAPPER = re.compile(r"^(?:[A-Z_]+: )?\w*Callback error(?: calling callback)?: (?=Traceback)", re.S)


def describe_cause(exc: BaseException) -> str:
    """``Type: message`` of a node's exception; for XLA's host-callback wrapper, the callback's own traceback.

    Example::

        describe_cause(ValueError("bad"))  # 'ValueError: bad'
    """
    text = str(exc)
    if isinstance(exc, HostCallbackError):
        return "a host callback raised: " + text
    m = _CALLBACK_WRAPPER.match(text)
    if m is not None:
        return "a host callback raised: " + text[m.end() :]
    return f"{type(exc).__name__}: {text}"


#: Frames of a kept error's traceback that its note keeps, the innermost (a few KiB at most, whatever the depth).
KEPT_FRAMES = 20


def at_rest(exc: BaseException) -> BaseException:
    """``exc``, ready to be kept (as a run's error, for as long as the controller keeps the run) and raised again.

    A traceback holds its frames, each frame its locals and its caller's frame: the error of a failed
    step would hold that step's arrays, and the frames it was raised through after it failed, for as
    long as its run is kept. So the traceback of ``exc``, and of each exception it chains to, becomes
    text in a note (as Ray and Dask keep a remote traceback) and the frames go. Raise a kept error with
    ``raise exc.with_traceback(None)``: a bare ``raise`` would add the raiser's frames to the ones before.

    Example::

        rec.error = at_rest(error)   # error.__traceback__ is None; "Traceback where it was raised" is a note
    """
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        if tb is not None:
            if not e.__dict__.get("_pw_at_rest"):  # (raised again since it was kept: the raiser's frames go, no note)
                text = "".join(traceback.format_tb(tb, limit=-KEPT_FRAMES)).rstrip()  # (the innermost: where)
                e.add_note(f"Traceback where it was raised (kept as text):\n{text}")
            e.__traceback__ = None
        e.__dict__["_pw_at_rest"] = True
        todo.extend(x for x in (e.__cause__, e.__context__, *vars(e).values()) if isinstance(x, BaseException))
    return exc


def short_error(err: BaseException | str | None, max_lines: int = 12) -> str:
    """``Type: message`` cut to about ``max_lines``: its head and its last lines (the cause and where it happened)."""
    if err is None:
        return ""
    text = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    lines = text.splitlines()
    if len(lines) <= max_lines:
        return text
    keep_tail = min(3, max_lines // 2)
    head = lines[: max_lines - keep_tail - 1]
    tail = lines[-keep_tail:]
    return "\n".join([*head, f"  ... ({len(lines) - len(head) - len(tail)} more lines)", *tail])

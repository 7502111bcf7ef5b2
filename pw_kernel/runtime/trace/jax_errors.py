"""The JAX errors a traced program can raise that pw recognises, in one table.

Each entry says how to tell a JAX error (its exception class, the words of its
message) and what it becomes: a pw error class and a message that says what to
do. Telling errors apart by JAX's wording is fragile, so it happens here only,
and `tests/test_jax_errors.py` triggers the real JAX error of every entry: a JAX
upgrade that changes a message fails the test named after its entry.

Example::

    kind = classify(e)   # the first entry that matches, or None
    if kind is not None:
        raise kind.error(e, "`pw.program` 'step'", where) from None
"""

from __future__ import annotations

import dataclasses

import jax

from ..errors import ControlFlowError, PathwaysError, SpecError, TracingError


@dataclasses.dataclass(frozen=True)
class JaxErrorKind:
    """One kind of JAX error: how to tell it, and the pw error it becomes."""

    name: str
    becomes: type[PathwaysError]
    says: str  # the message's head: {api}, {error_type} and {error} are filled in; the user's line follows
    hint: str  # what to do, after the user's line
    fragments: tuple[str, ...] = ()  # words of JAX's message, any of which matches (none: any message)
    types: tuple[type[BaseException], ...] = ()  # JAX's exception classes (none: any class)
    quotes_jax: bool = False  # the message quotes JAX's error whole, which stays its cause (more hints may follow)

    def matches(self, exc: BaseException) -> bool:
        if self.types and not isinstance(exc, self.types):
            return False
        return not self.fragments or any(f in str(exc) for f in self.fragments)

    def message(self, exc: BaseException, api: str, where: str) -> str:
        """The pw message for ``exc`` raised by ``api``; ``where`` is the user's line (or "")."""
        head = self.says.format(api=api, error_type=type(exc).__name__, error=exc)
        return f"{head}{where}\n{self.hint}"

    def error(self, exc: BaseException, api: str, where: str) -> PathwaysError:
        return self.becomes(self.message(exc, api, where))


UNTRACEABLE = "{api} could not be traced: {error_type}: {error}"  # a JAX error quoted as it is

_CONCRETE_SAYS = "{api} needs a concrete value where it only has a traced one ({error_type})."
_CONCRETE_HINT = (
    "Inside a program, arrays are abstract (shape and dtype only) until the run executes, so "
    "`float(x)`, `int(x)`, `np.asarray(x)` or indexing with an array value cannot work. Use jnp "
    "operations on the array instead, or pass the value in as a Python constant."
)

# First match wins: a subclass comes before its base (TracerBoolConversionError is a ConcretizationTypeError).
TABLE: tuple[JaxErrorKind, ...] = (
    JaxErrorKind(
        name="control_flow",
        types=(jax.errors.TracerBoolConversionError,),
        becomes=ControlFlowError,
        says="{api}: Python control flow depends on a value computed on devices ({error_type}).",
        hint=(
            "A program is traced once into a static dataflow graph, so `if`/`while` on array values cannot "
            "be decided at trace time. Instead: (1) use `jax.lax.cond` / `jnp.where` / `jax.lax.while_loop` "
            "inside a `pw.compiled` function, or (2) fetch the value first (`fut.result()`) and branch in "
            "plain Python outside the program. Loops over Python ranges are fine: they unroll."
        ),
    ),
    # A traced value used where Python needs a concrete one: three JAX classes, one message.
    *(
        JaxErrorKind(name=name, types=(kind,), becomes=TracingError, says=_CONCRETE_SAYS, hint=_CONCRETE_HINT)
        for name, kind in (
            ("concrete_value", jax.errors.ConcretizationTypeError),
            ("array_conversion", jax.errors.TracerArrayConversionError),
            ("integer_conversion", jax.errors.TracerIntegerConversionError),
        )
    ),
    JaxErrorKind(
        name="indivisible_sharding",  # JAX's IndivisibleError is not public: its words tell it
        fragments=("evenly divide",),
        becomes=SpecError,
        says="{api}: a value does not fit the PartitionSpec it is given: {error}",
        hint=(
            "Use sizes that are multiples of the mesh axes they are split over, or replicate that "
            "dimension with None in the spec."
        ),
    ),
    JaxErrorKind(
        name="non_array_output",
        fragments=("not a valid JAX type",),
        becomes=TracingError,
        says=UNTRACEABLE,
        hint="A program must return arrays (or pytrees of arrays); return non-array values outside it.",
        quotes_jax=True,
    ),
)


def classify(exc: BaseException) -> JaxErrorKind | None:
    """The first entry of `TABLE` that ``exc`` matches; None for an error pw does not recognise."""
    return next((kind for kind in TABLE if kind.matches(exc)), None)

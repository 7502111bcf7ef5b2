"""The errors a run fails with: a node that raised, an input whose run failed or was cancelled.

Made by the lifecycle's transitions (they name the node, the program, the run and
where the node came from), so every way a run fails says the same things.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import AdmissionError, InputFailedError, NodeAdmissionError, NodeError, describe_cause
from .records import OutputCell, RunRecord

if TYPE_CHECKING:
    from ..exec.plan import Step


def input_error(rec: RunRecord, cell: OutputCell) -> InputFailedError:
    """The error of a run that reads ``cell`` of a run that failed or was cancelled."""
    src = cell.producer
    # Down a chain of runs the first failure is what matters: quoting each producer's message in
    # full would make the 10,000th reader's message 10,000 messages long.
    root = getattr(src.error, "root", None) or src.error
    if src.state == "cancelled":
        why = "was cancelled"
    elif root is not src.error:
        why = f"failed because an input of its failed first: {type(root).__name__}: {root}"
    else:
        why = f"failed: {src.error}"
    err = InputFailedError(
        f"run {rec.id} ({rec.name!r}) reads output {cell.index} of run {src.id} ({src.name!r}), "
        f"which {why}. Recompute that input, then submit again."
    )
    err.root = root  # the first failure of the chain
    return err

def node_error(rec: RunRecord, step: Step | None, exc: BaseException) -> NodeError:
    """The error a run fails with when ``step`` raised ``exc``: names the node and where it came from."""
    where = None
    if step is not None:
        where = rec.source_map.get(step.name)
        node = step.node
        # A fused step stands for many nodes: only the source map can say where it came from.
        if where is None and node is not None and node.name == step.name and node.source is not None:
            where = f"{node.source[0]}, line {node.source[1]}"
    src = f"\n  at {where}" if where else ""
    step_name = step.name if step is not None else "<dispatcher>"
    kind = NodeAdmissionError if isinstance(exc, AdmissionError) else NodeError
    err = kind(
        f"node {step_name!r} of program {rec.program!r} (run {rec.id}, {rec.name!r}) failed: "
        f"{describe_cause(exc)}{src}",
        run_id=rec.id,
        program=rec.program,
        node=step_name,
    )
    err.__cause__ = exc
    return err


__all__ = ["input_error", "node_error"]

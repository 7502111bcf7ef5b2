"""Node events as the runtime records them, for the timeline's tests (Python and browser side)."""

from __future__ import annotations

from pw_kernel.runtime import NodeEvent


def node(seq, name, start, end, devices=(0,), kind="compute", run=0, island=0, src=None):
    """A NodeEvent as the runtime records it: ``name`` ran from ``start`` to ``end`` (ns) on ``devices``."""
    ev = NodeEvent(seq, run, "p", "default", name, kind, devices, island, src, start, 0, "f32[8]")
    ev.start, ev.end = start, end
    return ev


def chained_layers(n=6, ms=1.0, devices=(0, 1, 2, 3), t0=5_000_000_000):
    """``n`` layers that run back to back on ``devices`` (a `--mode chained` loop), ``ms`` each."""
    d = int(ms * 1e6)
    return [node(k, "layer", t0 + k * d, t0 + (k + 1) * d, devices) for k in range(n)]

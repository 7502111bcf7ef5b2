"""Computations of a chosen size (device time), calibrated on the machine at hand.

On the CPU a computation is a `fori_loop` of ``sin(v) * 0.999 + 0.001`` over a
1024-element vector: one XLA CPU thread, time linear in the trip count. On a
GPU it is ``tanh(x @ x / n)`` on square matrices, sized by the matrix side (a
loop would make XLA read its predicate back to the host every iteration).
A computation's size is its device time: a hand-written `jax.jit` of the
chain of K computations, unrolled (the device never waits for the host
inside one executable), timed and divided by K: the fused reference.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

REF_UNROLL = 16  # computations per reference executable in calibration


@dataclasses.dataclass(frozen=True)
class Sized:
    """One computation: ``fn(x) -> x`` of about ``target_us`` of device time on ``x``."""

    target_us: float
    param: int  # trip count (CPU) or matrix side (GPU)
    fn: Callable
    x: jax.Array

    def reference(self, m: int = REF_UNROLL) -> Callable[[], jax.Array]:
        """A `jax.jit` of ``m`` computations back to back; call it, block, divide by m: device time."""
        fn = self.fn

        def whole(v):
            for _ in range(m):
                v = fn(v)
            return v

        jitted = jax.jit(whole)
        x = self.x
        return lambda: jitted(x).block_until_ready()


def _loop_fn(trips: int) -> Callable:
    def comp(v):
        return jax.lax.fori_loop(0, trips, lambda i, u: jnp.sin(u) * 0.999 + 0.001, v)

    return comp


def _matmul_fn(n: int) -> Callable:
    def comp(x):  # no captured weights: a large constant would be baked into the executable
        return jnp.tanh((x @ x) * (1.0 / n))

    return comp


def _device_us(fn: Callable, x, m: int = REF_UNROLL, repeats: int = 5) -> float:
    ref = Sized(0, 0, fn, x).reference(m)
    ref()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        ref()
        best = min(best, time.perf_counter() - t)
    return best / m * 1e6


def calibrate(targets_us: list[float], platform: str | None = None) -> list[Sized]:
    """One computation per target size, from a few timed probes of the fused reference."""
    platform = platform or jax.devices()[0].platform
    if platform == "cpu":
        x = jnp.ones(1024, jnp.float32)
        lo, hi = 8, 256
        t_lo, t_hi = _device_us(_loop_fn(lo), x), _device_us(_loop_fn(hi), x)
        per_trip = max((t_hi - t_lo) / (hi - lo), 1e-3)
        base = max(t_lo - per_trip * lo, 0.0)
        out = []
        for t in targets_us:
            trips = max(1, round((t - base) / per_trip))
            out.append(Sized(t, trips, _loop_fn(trips), x))
        return out
    out = []
    for t in targets_us:  # matmul: time ~ n^3 once it is large enough; refine the side a few times
        n = 256
        for _ in range(4):
            measured = _device_us(_matmul_fn(n), jnp.ones((n, n), jnp.float32), m=8, repeats=3)
            nxt = max(64, int(round(n * (t / measured) ** (1 / 3) / 64)) * 64)
            if nxt == n:
                break
            n = nxt
        out.append(Sized(t, n, _matmul_fn(n), jnp.ones((n, n), jnp.float32)))
    return out

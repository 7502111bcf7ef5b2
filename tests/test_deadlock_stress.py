"""Deadlock freedom: random programs with collectives over overlapping slices, from several threads."""

from __future__ import annotations

import concurrent.futures
import random

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import pw_kernel as pw


def centre_op(s):
    """x * 0.5 + mean(x), the mean computed with a psum across the slice's devices."""
    axes = tuple(s.axis_names)
    n = s.size

    def body(x):
        return x * 0.5 + jax.lax.psum(x.sum(), axes) / (x.shape[0] * n)

    spec = P(axes)
    return pw.compiled(
        jax.shard_map(body, mesh=s.mesh, in_specs=spec, out_specs=spec), slice=s, in_specs=spec, out_specs=spec,
        name=f"centre_{s.name}",
    )


def test_random_collective_programs_from_threads_all_finish(ctl):
    # 7 slices over 8 devices: every device is shared by several slices (time-multiplexed).
    sizes = [8, 4, 4, 2, 2, 2, 2]
    slices = [pw.slice(n, mesh={"i": n}, name=f"s{k}") for k, n in enumerate(sizes)]
    assert max(ctl.resources.load(d) for d in ctl.devices) >= 3
    ops = [centre_op(s) for s in slices]
    rng = random.Random(1234)
    programs = []
    for k in range(12):
        path = [rng.randrange(len(ops)) for _ in range(rng.randint(2, 6))]
        glue = [rng.random() < 0.5 for _ in path]

        def body(x, path=tuple(path), glue=tuple(glue)):
            for i, g in zip(path, glue):
                x = ops[i](x)
                if g:
                    x = x + 1.0  # glue on that slice
            return x

        programs.append((pw.program(body, name=f"rand{k}"), path, glue))

    def reference(x, path, glue):
        for _, g in zip(path, glue):
            x = x * 0.5 + x.mean()
            if g:
                x = x + 1.0
        return x

    jobs = [(programs[rng.randrange(len(programs))], np.float32(rng.random()) * np.arange(8, dtype=np.float32)) for _ in range(96)]

    def submit(chunk):
        return [(prog(x), x, path, glue) for (prog, path, glue), x in chunk]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        submitted = [r for part in pool.map(submit, [jobs[i::4] for i in range(4)]) for r in part]
    for fut, x, path, glue in submitted:
        got = np.asarray(fut.result(timeout=240))  # generous: a deadlock would hang here forever
        np.testing.assert_allclose(got, reference(x, path, glue), rtol=1e-5, atol=1e-5)
    assert all(r.wait(60).state == "done" for r in ctl.runs)

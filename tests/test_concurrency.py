"""Many runs from several threads over overlapping slices, with collectives: gang scheduling at work."""

from __future__ import annotations

import concurrent.futures
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pw_kernel as pw


def test_concurrent_runs_with_collectives_on_overlapping_slices(ctl):
    # Overlapping slices: 'all' shares every device with 'left', 'right' and 'mid'.
    left = pw.slice(4, mesh={"i": 4}, name="left")
    right = pw.slice(4, mesh={"i": 4}, name="right")
    everything = pw.slice(8, mesh={"i": 8}, name="all")
    mid = pw.slice(4, mesh={"i": 2, "j": 2}, name="mid")
    assert set(mid.devices) & set(left.devices) or set(mid.devices) & set(right.devices)

    def psum_fn(s):
        axes = tuple(s.axis_names)

        def body(x):
            return jax.lax.psum(x, axes)

        spec = P(axes)
        return pw.compiled(
            jax.shard_map(body, mesh=s.mesh, in_specs=spec, out_specs=P()),
            slice=s,
            in_specs=spec,
            out_specs=P(),
            name=f"psum_{s.name}",
        )

    def total_fn(s):
        return pw.compiled(lambda x: jnp.sum(x * 2), slice=s, in_specs=P(s.axis_names[0]), name=f"total_{s.name}")

    slices = [left, right, everything, mid]
    psums = {s.name: psum_fn(s) for s in slices}
    totals = {s.name: total_fn(s) for s in slices}

    @pw.program
    def prog(x, a, b):
        # a collective on slice a, a sharded reduction on slice b, glue, and back to a
        y = psums[a](x)
        z = totals[b](x + y.sum())
        return y, z

    jobs = []
    rng = np.random.default_rng(0)
    for k in range(48):
        a, b = slices[k % 4].name, slices[(k * 3 + 1) % 4].name
        x = rng.normal(size=(8,)).astype(np.float32)
        jobs.append((x, a, b))

    def expected(x, a):
        n = pw.controller().resources.get(a).size
        y = x.reshape(n, -1).sum(0)  # psum over shards of x
        return y, np.sum((x + y.sum()) * 2)

    barrier = threading.Barrier(4)

    def worker(chunk):
        barrier.wait()
        return [(prog(x, a, b), x, a) for x, a, b in chunk]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        submitted = [f for part in pool.map(worker, [jobs[i::4] for i in range(4)]) for f in part]
    assert len(submitted) == 48
    for (y, z), x, a in submitted:
        ey, ez = expected(x, a)
        np.testing.assert_allclose(np.asarray(y.result(timeout=120)), ey, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(float(z.result(timeout=120)), ez, rtol=1e-4, atol=1e-3)
    runs = pw.controller().runs
    assert len(runs) == 48 and all(r.wait(30).state == "done" for r in runs)
    # one consistent order per island: the dispatch sequence numbers never go backwards per device
    last_seq: dict[int, int] = {}
    for ev in sorted(pw.controller().events.query(), key=lambda e: e.seq):
        for d in ev.devices:
            assert ev.seq > last_seq.get(d, -1)
            last_seq[d] = ev.seq

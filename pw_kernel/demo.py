"""The headless demo: an MPMD program over 8 devices in two islands, run asynchronously.

    python -m pw_kernel.demo [--steps N] [--trace trace.json]

Four slices (two per island) hold an encoder, two model-parallel experts and a
data-parallel head; glue ops and transfers connect them. N steps are
submitted back to back, each reading the previous step's futures, so the
controller runs ahead of the devices. At the end it checks the result against
plain JAX and prints what every device did.
"""

from __future__ import annotations

import argparse
import time

import pw_kernel as pw


def build(width: int = 256):
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    enc_s = pw.slice(2, mesh={"data": 2}, name="encoder", island=0)
    exp_s = pw.slice(2, mesh={"model": 2}, name="experts", island=0)
    head_s = pw.slice(4, mesh={"data": 2, "model": 2}, name="head", island=1)

    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    # Parameters live on the slices that use them, so runs move only activations.
    w_enc = jax.device_put(jax.random.normal(k1, (width, width)) / width**0.5, enc_s.sharding())
    w_exp = jax.device_put(jax.random.normal(k2, (width, width)) / width**0.5, exp_s.sharding(None, "model"))
    w_head = jax.device_put(jax.random.normal(k3, (width, width)) * 2 / width**0.5, head_s.sharding(None, "model"))

    def encode(x, w):
        return jnp.tanh(x @ w)

    def expert(h, w):
        return jax.nn.gelu(h @ w)

    def head(h, w):
        return jnp.tanh(h @ w)

    encode_c = pw.compiled(encode, slice=enc_s, in_specs=(P("data"), None), out_specs=P("data"), name="encode")
    expert_c = pw.compiled(expert, slice=exp_s, in_specs=(None, P(None, "model")), out_specs=P(None, "model"), name="expert")
    head_c = pw.compiled(head, slice=head_s, in_specs=(P("data"), P(None, "model")), out_specs=P("data", "model"), name="head")

    @pw.program
    def step(x, w_enc, w_exp, w_head):
        h = encode_c(x, w_enc)
        e = expert_c(h, w_exp)
        h = 0.5 * h + 0.5 * e            # glue on the experts' slice
        y = head_c(h, w_head)            # crosses to island 1
        return y, jnp.mean(y * y)        # glue on the head slice

    def reference(x, steps):
        """The same model in plain JAX on one device."""
        import numpy as np

        we, wx, wh = (np.asarray(w) for w in (w_enc, w_exp, w_head))
        x = np.asarray(x)
        for _ in range(steps):
            h = encode(x, we)
            h = 0.5 * h + 0.5 * expert(h, wx)
            x = head(h, wh)
        return x

    return step, (w_enc, w_exp, w_head), reference


def summary(runs, wall: float) -> str:
    c = pw.controller()
    events = [e for r in runs for e in r.events]
    t0 = min(e.start for e in events)
    t1 = max(e.end for e in events)
    span = max(t1 - t0, 1)
    busy = c.events.busy(events)
    lines = [
        f"{'device':>10} {'island':>6} {'slices':<18} {'nodes':>6} {'busy ms':>9} {'util':>6} {'MB out':>8}",
    ]
    for isl in c.islands:
        for d in isl.devices:
            mine = [e for e in events if d.id in e.devices]
            slices = ",".join(s.name for s in c.resources.slices if d in s.devices) or "-"
            mb = sum(e.nbytes / len(e.devices) for e in mine) / 1e6  # a node's outputs, shared by its devices
            lines.append(
                f"{str(d):>10} {isl.id:>6} {slices:<18} {len(mine):>6} {busy.get(d.id, 0) / 1e6:>9.2f} "
                f"{busy.get(d.id, 0) / span:>6.0%} {mb:>8.2f}"
            )
    kinds: dict[str, int] = {}
    for e in events:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    lines.append(
        f"{len(runs)} runs, {len(events)} node executions ({', '.join(f'{v} {k}' for k, v in kinds.items())}); "
        f"device span {span / 1e6:.1f} ms, wall {wall * 1e3:.1f} ms; MB out: the bytes of each node's outputs, "
        f"split evenly over the devices it ran on"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    import numpy as np

    ap = argparse.ArgumentParser(prog="python -m pw_kernel.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="program runs submitted back to back (default 20)")
    ap.add_argument("--width", type=int, default=256, help="hidden width (default 256)")
    ap.add_argument("--trace", default=None, help="write a Chrome trace (open in Perfetto) to this path")
    args = ap.parse_args(argv)

    c = pw.init(islands=2)
    print(f"pw_kernel {pw.__version__}: {len(c.devices)} devices in {len(c.islands)} islands")
    for isl in c.islands:
        print(f"  {isl!r}")
    step, weights, reference = build(args.width)
    import jax

    x0 = jax.random.normal(jax.random.PRNGKey(1), (16, args.width))

    graph = step.trace(x0, *weights)
    print()
    print(graph)

    print(f"\nwarming up (tracing and compiling {len(graph.nodes)} nodes)...")
    y, _ = step(x0, *weights)
    y.result()
    # Each step reads the previous step's future: submitted without waiting for it.
    t = time.perf_counter()
    x = y
    runs = []
    for _ in range(args.steps):
        run = step.submit(x, *weights)
        runs.append(run)
        x, loss = run.outputs
    submitted = time.perf_counter() - t
    final = x.result()
    wall = time.perf_counter() - t
    print(f"submitted {args.steps} runs in {submitted * 1e3:.1f} ms (the cell would return here); "
          f"all done after {wall * 1e3:.1f} ms")

    expected = reference(x0, args.steps + 1)
    err = float(np.max(np.abs(np.asarray(final) - np.asarray(expected))))
    print(f"max |pw - plain JAX| = {err:.2e}; loss of the last step = {float(loss.result()):.5f}\n")
    print(summary(runs, wall))
    if args.trace:
        c.events.to_perfetto(args.trace, [e for r in runs for e in r.events])
        print(f"\nChrome trace written to {args.trace} (open it at ui.perfetto.dev)")
    pw.shutdown()
    return 0 if err < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())

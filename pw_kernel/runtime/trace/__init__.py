"""From Python to a program graph: compiled functions, tracing with JAX's own tracer, the graph as data.

It owns `compiled.py` (`CompiledFunction`, a `jax.jit` pinned to a slice, and
`trace_scope`, which lets a program see the calls it makes), `tracing.py` (a
function traced by `jax.make_jaxpr` and split into compute, glue and transfer
nodes placed on slices), `signatures.py` (which leaves of a call are traced, and the key a
program caches its graphs under), `executables.py` (the node executables built from
jaxpr equations), `jax_errors.py` (the one table that classifies JAX's errors),
`graph.py` (the `ProgramGraph`: nodes, values and edges, data that never draws
itself) and `names.py` (the names a program returns its outputs as).
"""

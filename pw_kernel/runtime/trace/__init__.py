"""From Python to a program graph: compiled functions, tracing with JAX's own tracer, the graph as data.

It owns `CompiledFunction` (a `jax.jit` pinned to a slice, and the trace scope
that lets a program see its calls), `tracing.py` (a function traced by
`jax.make_jaxpr` and split into compute, glue and transfer nodes placed on
slices), the node executables built from jaxpr equations, the table that
classifies JAX's errors, and `graph.py` (the `ProgramGraph`: nodes, values and
edges, data that never draws itself).
"""

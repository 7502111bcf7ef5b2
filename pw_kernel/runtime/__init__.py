"""The pw_kernel runtime: imports only jax and numpy."""

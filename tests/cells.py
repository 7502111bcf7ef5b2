"""Notebook cells shared by the tests that drive a real shell or kernel."""

#: Device work that waits for `gate`, and device work that then fails: they make "still running"
#: and "failed later" happen exactly when a test says so (no sleeps).
GATED = """
import threading, time
import jax, jax.numpy as jnp, numpy as np
import pw_kernel as pw

one = pw.slice(1, name="one")
gate = threading.Event()

def _held(x):
    gate.wait(30)
    return x

def _broken(x):
    gate.wait(30)
    raise ValueError("the sensor returned garbage")

def on_host(fn):
    return lambda x: jax.pure_callback(fn, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

held = pw.compiled(on_host(_held), slice=one, name="held")
broken = pw.compiled(on_host(_broken), slice=one, name="broken")
"""

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


def run_cell(kc, code: str, timeout: float) -> str:
    """Run ``code`` in a kernel (a jupyter_client ``kc``); its stdout (a failing cell fails the test with its
    traceback)."""
    import textwrap

    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    reply = kc.execute_interactive(textwrap.dedent(code), timeout=timeout, output_hook=hook)
    assert reply["content"]["status"] == "ok", "".join(out)
    return "".join(out)

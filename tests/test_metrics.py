"""`pw.log`: a training loop's metrics from futures, recorded as they resolve, never waiting for them."""

from __future__ import annotations

import re
import struct
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pw_kernel as pw
from pw_kernel.train import MetricsLog
from pw_kernel.widgets import MetricsPlot


def held_step(gate: threading.Event):
    """A training step whose device work waits for ``gate`` (a host callback): its loss resolves only then."""
    s = pw.slice(1, name="one")

    def wait(x):
        gate.wait(60)
        return x

    def step(w):
        w = jax.pure_callback(wait, jax.ShapeDtypeStruct(w.shape, w.dtype), w)
        w = w * 0.99 + 0.01
        return w, jnp.mean(w)

    return pw.compiled(step, slice=s, name="step"), jax.device_put(jnp.zeros(4), s.sharding())


def test_a_thousand_logged_steps_of_futures_never_wait_for_them(ctl):
    log = MetricsLog()
    gate = threading.Event()
    step, w = held_step(gate)
    losses = []
    try:
        for i in range(1000):
            w, loss = step(w)
            log({"loss": loss, "lr": 1e-3 * 0.999**i}, step=i)
            losses.append(loss)
        # Every call returned while the devices were held: nothing of the loss could be read yet.
        assert not any(loss.done() for loss in losses)
        assert log.pending == 1000 and log.series("lr")[0] == list(range(1000))
    finally:
        gate.set()
    assert log.wait(120)
    steps, values = log.series("loss")
    assert steps == list(range(1000))
    np.testing.assert_allclose(values, [float(loss.result()) for loss in losses], rtol=1e-6)
    assert log.last("loss") == values[-1] and log.pending == 0 and not log.errors


def test_the_plot_draws_every_step_and_follows_new_values(ctl):
    log = MetricsLog()
    for i in range(1000):
        log({"loss": 2.0 / (i + 1)}, step=i)
    plot = MetricsPlot(log)
    assert plot.names == ["loss"] and plot.series["loss"]["steps"] == list(range(1000))
    page = plot.static_html()
    points = re.search(r'class="pw-metric-line"[^>]* points="([^"]*)"', page).group(1).split()
    assert len(points) == 1000 and "0.002 at step 999" in page  # every step, the last value written
    log({"loss": 0.001, "acc": 0.5}, step=1000)
    plot.flush()
    assert plot.names == ["loss", "acc"] and plot.series["loss"]["steps"][-1] == 1000
    plot.close()


def _tensorboard_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``logdir``'s event files (TFRecords of `Event` protos, read with tensorboardX's proto)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for f in sorted(logdir.glob("events.out.tfevents.*")):
        data = f.read_bytes()
        pos = 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos : pos + 8])
            ev = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + n])
            pos += 12 + n + 4
            for v in ev.summary.value:
                out.setdefault(v.tag, []).append((ev.step, v.simple_value))
    return out


def test_tensorboard_files_hold_every_scalar_logged_before_and_after(ctl, tmp_path):
    pytest.importorskip("tensorboardX")
    log = MetricsLog()
    gate = threading.Event()
    step, w = held_step(gate)
    gate.set()
    for i in range(5):
        log({"loss": float(i)}, step=i)
    stop = log.to_tensorboard(str(tmp_path))
    for i in range(5, 10):
        w, loss = step(w)
        log({"loss": loss}, step=i)
    assert log.wait(60)
    stop()
    got = _tensorboard_scalars(tmp_path)
    assert [s for s, _ in got["loss"]] == list(range(10))
    np.testing.assert_allclose([v for _, v in got["loss"]][5:], log.series("loss")[1][5:], rtol=1e-6)


def test_bad_metrics_say_what_to_log_instead(ctl):
    log = MetricsLog()
    with pytest.raises(pw.ArgumentError, match=r"takes a dict of name -> scalar.*got str"):
        log("loss")
    with pytest.raises(pw.ArgumentError, match=r"'acts' has shape \(4,\); a metric is one number"):
        log({"acts": jnp.ones(4)})
    with pytest.raises(pw.ArgumentError, match=r"`step` must be an int"):
        log({"loss": 1.0}, step="3")
    assert log.names == [] and log.pending == 0  # nothing half-logged


def test_a_failed_runs_loss_is_said_and_the_rest_recorded(ctl):
    log = MetricsLog()
    s = pw.slice(1, name="one")

    def broken(x):
        raise ValueError("diverged")

    bad = pw.compiled(lambda x: jax.pure_callback(broken, jax.ShapeDtypeStruct((), jnp.float32), x), slice=s, name="bad")
    log({"loss": bad(jnp.float32(1.0)), "lr": 0.1}, step=0)
    assert log.wait(60)
    assert log.series("lr") == ([0], [0.1]) and "loss" not in log.names
    assert re.search(r"'loss' at step 0: NodeError: node 'bad' .*ValueError: diverged", log.errors[0], re.S)


def test_pw_log_is_one_log_for_the_process(ctl):
    step = pw.log({"probe": 1.0})
    assert pw.log.series("probe")[0][-1] == step and isinstance(pw.log, MetricsLog)

"""Fitting: synthetic recovery of a bending parameter, and clear errors on bad input."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fitting.fit import FitFailed, fit
from ipcjax import candidates as C
from ipcjax.implicit import make_rollout, stack_controls
from ipcjax.model import Config, Controls, Params
from scenes.film import cantilever_scene

STEPS = 6


@pytest.fixture(scope="module")
def cantilever():
    sc = cantilever_scene()
    m = sc["model"]
    roll = make_rollout(m, Config(), C.initial_capacity(m.topology), round_fp32=False)
    ctl = stack_controls([Controls.empty(m.n_particles, tolerance=1e-10)] * STEPS)
    x0 = jnp.asarray(sc["x"]); v0 = jnp.zeros_like(x0)

    @jax.jit
    def rollout(p):
        frames, _, codes = roll(p, x0, v0, ctl, 1 / 240)
        return frames, codes

    tip = jnp.asarray(sc["tip"])
    measure = lambda frames: jnp.mean(frames[-1, tip, 2])  # tip height, m
    return rollout, measure


def test_recovers_bending_scale_from_two_times_off(cantilever):
    rollout, measure = cantilever
    truth = Params.film_defaults()
    target = float(measure(rollout(truth)[0]))
    start = truth._replace(bending_scale=jnp.asarray(2.0))
    assert abs(float(measure(rollout(start)[0])) - target) > 1e-5  # the start is visibly off
    res = fit(rollout, measure, target, start, ["bending_scale"], optimizer=optax.adam(0.1, b1=0.5),
              iterations=80, loss_tol=1e-14, scale=1e-3, progress=False)
    assert abs(float(res.params.bending_scale) - 1.0) < 0.01
    assert res.history[-1]["loss"] < res.history[0]["loss"] * 1e-4
    assert all(np.isfinite(h["grad_norm"]) and h["grad_norm"] > 0 for h in res.history[:-1])


def test_bad_fit_input_is_named(cantilever):
    rollout, measure = cantilever
    p = Params.film_defaults()
    with pytest.raises(ValueError, match="cannot fit 'gravity'"):
        fit(rollout, measure, 0.0, p, ["gravity"], progress=False)
    with pytest.raises(ValueError, match="initial friction must be > 0"):
        fit(rollout, measure, 0.0, p._replace(friction=jnp.asarray(-0.1)), ["friction"], progress=False)
    with pytest.raises(ValueError, match="targets must be finite"):
        fit(rollout, measure, np.nan, p, ["bending_scale"], progress=False)


def test_failed_rollout_step_stops_the_fit_with_its_index():
    def rollout(p):  # a rollout whose third step reports an exhausted line search
        return jnp.zeros((4, 1, 3)) + p.bending_scale, jnp.asarray([0, 0, 1, 0], jnp.int32)

    with pytest.raises(FitFailed, match="rollout step 2 failed: line search exhausted"):
        fit(rollout, lambda f: f[-1, 0, 0], 1.0, Params.film_defaults(), ["bending_scale"], progress=False)

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


def test_gauss_newton_bfgs_first_step_solves_linear_least_squares():
    from fitting.fit import gauss_newton_bfgs
    J = jnp.asarray([[2.0, 0.5], [0.1, 1.0], [0.3, -0.4]])
    t = jnp.asarray([1.0, -2.0, 0.5])
    z = jnp.zeros(2)
    g = 2 * J.T @ (J @ z - t)
    opt = gauss_newton_bfgs(J, damping=0.0)
    upd, _ = opt.update(g, opt.init(z), z)
    np.testing.assert_allclose(np.asarray(z + upd), np.linalg.lstsq(np.asarray(J), np.asarray(t), rcond=None)[0],
                               rtol=1e-12)


def test_gauss_newton_bfgs_follows_curvature_that_the_start_jacobian_misses():
    """r(z) = exp(z) − 1 from z = log 2: the fixed start slope (2) overshoots into a slow
    alternating approach; the BFGS updates converge to 1e-10 in a handful of steps."""
    from fitting.fit import gauss_newton_bfgs
    r = lambda z: jnp.exp(z) - 1.0
    loss_grad = jax.grad(lambda z: jnp.sum(r(z) ** 2))
    z = jnp.asarray([np.log(2.0)])
    J0 = jax.jacobian(r)(z)
    opt = gauss_newton_bfgs(J0)
    state = opt.init(z)
    for k in range(12):
        upd, state = opt.update(loss_grad(z), state, z)
        z = z + upd
        if abs(float(z[0])) < 1e-10:
            break
    assert abs(float(z[0])) < 1e-10 and k < 10
    # a fixed Gauss–Newton step with the start slope is still 1e-4 away after as many steps
    zf = jnp.asarray([np.log(2.0)])
    for _ in range(k + 1):
        zf = zf - loss_grad(zf) / (2 * float(J0[0, 0]) ** 2)
    assert abs(float(zf[0])) > 1e-6
    with pytest.raises(ValueError, match="current parameters"):
        opt.update(loss_grad(z), state)

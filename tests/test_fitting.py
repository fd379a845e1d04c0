"""Fitting: synthetic recovery of a bending parameter, one compilation per problem, the
Levenberg–Marquardt optimizer, and clear errors on bad input or a failed rollout."""
import contextlib
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fitting.fit import FitFailed, MeasuredRollout, fit, fit_measured, levenberg_marquardt, to_z
from ipcjax import candidates as C
from ipcjax import implicit
from ipcjax.implicit import make_rollout, stack_controls
from ipcjax.model import Config, Controls, Params
from scenes.film import cantilever_scene

STEPS = 6


@contextlib.contextmanager
def xla_compilations():
    """Collect JAX's "Finished XLA compilation of jit(NAME)" log lines inside the block."""
    lines = []

    class Collect(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if msg.startswith("Finished XLA compilation of "):
                lines.append(msg)

    handler = Collect(level=logging.DEBUG)
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            yield lines
    finally:
        logger.removeHandler(handler)


def compilations_of(lines, name):
    return sum(f"jit({name})" in ln for ln in lines)


@pytest.fixture(scope="module")
def cantilever():
    sc = cantilever_scene()
    m = sc.model
    roll = make_rollout(m, Config(), C.initial_capacity(m.topology), round_fp32=False)
    ctl = stack_controls([Controls.empty(m.n_particles, tolerance=1e-10)] * STEPS)
    x0 = jnp.asarray(sc.x); v0 = jnp.zeros_like(x0)

    @jax.jit
    def rollout(p):
        frames, _, codes = roll(p, x0, v0, ctl, 1 / 240)
        return frames, codes

    tip = jnp.asarray(sc.tip)
    measure = lambda frames: jnp.mean(frames[-1, tip, 2])  # tip height, m
    return rollout, measure


@pytest.mark.slow  # 80 adam iterations of the rollout's Jacobian (≈ 80 s in the suite); the README's fit,
# run by tests/test_readme.py, is the same fit with Levenberg–Marquardt and the same checks
def test_recovers_bending_scale_from_two_times_off(cantilever):
    """Target at the film defaults, start at 2×, adam: one compilation serves the target,
    the start check and every fit iteration."""
    rollout, measure = cantilever
    truth = Params.film_defaults()
    with xla_compilations() as compiled:
        problem = MeasuredRollout(rollout, measure, ["bending_scale"])
        target = problem(to_z(["bending_scale"], truth), truth).y
        start = truth._replace(bending_scale=jnp.asarray(2.0))
        assert abs(problem(to_z(["bending_scale"], start), start).y - target) > 1e-5  # visibly off
        res = fit_measured(problem, target, start, optimizer=optax.adam(0.1, b1=0.5), iterations=80,
                           loss_tol=1e-14, scale=1e-3, progress=False)
    assert compilations_of(compiled, "measurements_and_jacobian") == 1, compiled
    assert abs(float(res.params.bending_scale) - 1.0) < 0.01
    assert res.history[-1].loss < res.history[0].loss * 1e-4
    assert all(np.isfinite(h.grad_norm) and h.grad_norm > 0 for h in res.history[:-1])


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


def test_a_rollout_that_raises_inside_jit_stops_the_fit_with_its_step(monkeypatch):
    """A rollout that raises on a failed step (inside the jitted evaluation JAX reports it
    as a JaxRuntimeError) ends the fit as FitFailed with the step and reason that
    ``ipcjax.implicit.rollout_failure`` maps the error back to."""
    class Failure(RuntimeError):
        step, code, reason = 3, 1, "line search exhausted"

    monkeypatch.setattr(implicit, "rollout_failure",
                        lambda e: Failure() if "step 3 went wrong" in str(e) else None, raising=False)

    def fail_on_host(_):
        raise RuntimeError("step 3 went wrong")

    def rollout(p):
        jax.debug.callback(fail_on_host, p.bending_scale)
        return jnp.zeros((4, 1, 3)) + p.bending_scale, jnp.zeros(4, jnp.int32)

    with pytest.raises(FitFailed, match="fit iteration 0: rollout step 3 failed: line search exhausted") as e:
        fit(rollout, lambda f: f[-1, 0, 0], 1.0, Params.film_defaults(), ["bending_scale"], progress=False)
    assert (e.value.step, e.value.iteration) == (3, 0)


SHAPE = ("youngs_modulus", "friction", "bending_scale")


def _toy_rollout(p):
    """Three smooth, invertible 'measurements' of (log E, log μf, log kθ) as one frame."""
    a, b, c = jnp.log(p.youngs_modulus / 315e6), jnp.log(p.friction / 0.35), jnp.log(p.bending_scale)
    y = jnp.stack([jnp.exp(0.8 * a + 0.1 * b), jnp.exp(0.3 * b) + 0.2 * a, 1.0 + 0.5 * c + 0.1 * a * a])
    return y[None, None, :], jnp.zeros(1, jnp.int32)


def test_one_compilation_serves_every_subset_and_start():
    """E alone, μf alone, kθ alone and all three, each from 2× off, on one MeasuredRollout:
    one XLA compilation of its program, and each fit recovers its parameters."""
    truth = Params.film_defaults()
    with xla_compilations() as compiled:
        problem = MeasuredRollout(_toy_rollout, lambda f: f[-1, 0], SHAPE)
        target = problem(to_z(SHAPE, truth), truth).y
        for names in (["youngs_modulus"], ["friction"], ["bending_scale"], list(SHAPE)):
            p0 = truth._replace(**{n: 2.0 * getattr(truth, n) for n in names})
            res = fit_measured(problem, target, p0, names, optimizer=levenberg_marquardt(), iterations=30,
                               loss_tol=1e-24, progress=False)
            for n in names:
                assert float(getattr(res.params, n)) == pytest.approx(float(getattr(truth, n)), rel=1e-9), names
    assert problem.compiles == 1 and problem.evaluations > 8
    assert compilations_of(compiled, "measurements_and_jacobian") == 1, compiled


def test_subset_fit_holds_the_other_parameters_and_uses_their_columns():
    truth = Params.film_defaults()
    problem = MeasuredRollout(_toy_rollout, lambda f: f[-1, 0], SHAPE)
    ev = problem(to_z(SHAPE, truth), truth)
    np.testing.assert_allclose(ev.J, [[0.8, 0.1, 0.0], [0.2, 0.3, 0.0], [0.0, 0.0, 0.5]], atol=1e-12)
    p0 = truth._replace(friction=0.7, bending_scale=3.0)  # bending_scale is held at 3, not fitted
    res = fit_measured(problem, ev.y, p0, ["friction"], optimizer=levenberg_marquardt(), iterations=3,
                       progress=False)
    assert float(res.params.bending_scale) == 3.0 and float(res.params.youngs_modulus) == 315e6
    with pytest.raises(ValueError, match="thickness not among the problem's parameters"):
        fit_measured(problem, ev.y, truth, ["thickness"], progress=False)
    # a problem is a MeasuredProblem: names and (z, params) -> Evaluation
    with pytest.raises(TypeError, match="problem must be a MeasuredProblem .* got function"):
        fit_measured(lambda z, p: ev, ev.y, truth, progress=False)


def test_levenberg_marquardt_small_damping_step_solves_linear_least_squares():
    J = jnp.asarray([[2.0, 0.5], [0.1, 1.0], [0.3, -0.4]])
    t = jnp.asarray([1.0, -2.0, 0.5])
    z = jnp.zeros(2)
    r = J @ z - t
    opt = levenberg_marquardt(damping=1e-14, max_step=1e3)
    upd, _ = opt.update(2 * J.T @ r, opt.init(z), z, value=r @ r, jacobian=J)
    np.testing.assert_allclose(np.asarray(z + upd), np.linalg.lstsq(np.asarray(J), np.asarray(t), rcond=None)[0],
                               rtol=1e-12)


def _run_lm(r, z, opt, n):
    jac = jax.jacobian(r)
    state = opt.init(z)
    losses = []
    for k in range(n):
        rz = r(z)
        losses.append(float(rz @ rz))
        upd, state = opt.update(2 * jac(z).T @ rz, state, z, value=rz @ rz, jacobian=jac(z))
        z = z + upd
    return z, losses


def test_levenberg_marquardt_converges_on_a_curved_residual():
    """r(z) = exp(z) − 1 from z = log 4: the clipped first step, then Gauss–Newton steps
    from the Jacobian at each iterate converge quadratically."""
    z, losses = _run_lm(lambda z: jnp.exp(z) - 1.0, jnp.asarray([np.log(4.0)]), levenberg_marquardt(), 8)
    assert abs(float(z[0])) < 1e-12
    assert losses[1] <= losses[0] and losses[-1] < 1e-20


def test_levenberg_marquardt_retries_a_step_that_raises_the_loss_from_the_accepted_iterate():
    """r(z) = atan(z) from z = 2: the Gauss–Newton step −atan(z)(1 + z²) overshoots to a
    higher loss; that step is rejected and retried from z = 2 with 10× the damping and at
    most half its length."""
    r = lambda z: jnp.arctan(z)
    jac = jax.jacobian(r)
    opt = levenberg_marquardt(damping=0.1, max_step=10.0)
    z0 = jnp.asarray([2.0])
    state = opt.init(z0)
    upd, state = opt.update(2 * jac(z0).T @ r(z0), state, z0, value=r(z0) @ r(z0), jacobian=jac(z0))
    z1 = z0 + upd
    assert float(r(z1) @ r(z1)) > float(r(z0) @ r(z0))  # the overshoot
    upd, state = opt.update(2 * jac(z1).T @ r(z1), state, z1, value=r(z1) @ r(z1), jacobian=jac(z1))
    z2 = z1 + upd
    assert float(state.z[0]) == 2.0 and float(state.damping) == pytest.approx(1.0)
    assert float(state.radius) == pytest.approx(0.5 * abs(float(z1[0]) - 2.0))
    assert abs(float(z2[0]) - 2.0) <= float(state.radius) * (1 + 1e-12)
    assert float(r(z2) @ r(z2)) < float(r(z0) @ r(z0))  # the damped retry improves on z0
    z, losses = _run_lm(r, z0, levenberg_marquardt(damping=0.1, max_step=10.0), 12)
    assert min(losses) < 1e-20


FIT_OPTIMIZERS = {
    "levenberg_marquardt": levenberg_marquardt(),
    "adam b1=0.5 (cantilever, Verlet stiffness)": optax.adam(0.1, b1=0.5),
    "adam (default)": optax.adam(0.1),
}


@pytest.mark.parametrize("name", list(FIT_OPTIMIZERS))
def test_every_fit_optimizer_update_jits(name):
    """The fit loop calls update(g, state, z, value=, jacobian=); it must be a pure jnp
    function of arrays, so jax.jit(update) traces, and gives the eager result."""
    opt = optax.with_extra_args_support(FIT_OPTIMIZERS[name])
    J = jnp.asarray([[2.0, 0.5], [0.1, 1.0], [0.3, -0.4]])
    z = jnp.asarray([0.2, -0.1])
    r = J @ z - jnp.asarray([1.0, -2.0, 0.5])
    args = (2 * J.T @ r, opt.init(z), z)
    kw = dict(value=r @ r, jacobian=J)
    upd_jit, state_jit = jax.jit(opt.update)(*args, **kw)
    upd, state = opt.update(*args, **kw)
    np.testing.assert_allclose(np.asarray(upd_jit), np.asarray(upd), rtol=1e-12)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12),
                           state_jit, state)
    assert np.all(np.isfinite(np.asarray(upd_jit))) and np.any(np.asarray(upd_jit) != 0)

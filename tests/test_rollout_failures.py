"""A rollout never fails silently: overflow grows or raises, failed steps raise, and
inputs are checked before anything compiles."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax._src.dispatch import BACKEND_COMPILE_EVENT
from jax._src.monitoring import unregister_event_duration_listener

from ipcjax import candidates as C
from ipcjax.implicit import BackwardFailed, RolloutFailed, _check_backward, _check_codes, make_rollout, \
    rollout_failure, stack_controls
from ipcjax.model import Config, Controls, Params
from ipcjax.newton import CandidateStats
from ipcjax.result import LinearStatus, StepCode
from scenes.film import drape_scene

STEPS = 2
DT = 1 / 240


@pytest.fixture(scope="module")
def drape():
    sc = drape_scene(n=4, size=0.03, sphere_radius=0.01, gap=0.5e-3)
    m = sc.model
    ctl = stack_controls([Controls.empty(m.n_particles)] * STEPS)
    x0 = jnp.asarray(sc.x)
    return m, ctl, x0


def _tiny(m):
    """A capacity with one sphere–face row: the drape's first step needs more."""
    return C.initial_capacity(m.topology)._replace(sf=1)


def test_overflow_raises_under_grad_and_jit_then_grows_to_nonzero_gradients(drape):
    m, ctl, x0 = drape
    roll = make_rollout(m, Config(), _tiny(m), max_regrow=0)
    loss = lambda p: roll(p, x0, jnp.zeros_like(x0), ctl, DT)[0][-1, :, 2].mean()
    p = Params.film_defaults()
    with pytest.raises(RolloutFailed, match=r"rollout step 0 failed: capacity overflow .*sf \d+") as e:
        jax.grad(loss)(p)
    needs = e.value.needs
    assert e.value.step == 0 and e.value.code & StepCode.CAPACITY_OVERFLOW and needs[2] > 1
    # inside a user's jit JAX reports it as a runtime error carrying the message; it maps back
    with pytest.raises(Exception, match="rollout step 0 failed: capacity overflow") as e:
        jax.jit(loss)(p)
    assert isinstance(rollout_failure(e.value), RolloutFailed)
    # outside jit the rollout grows its capacity above the need and runs again
    roll.max_regrow = 6
    g = jax.grad(loss)(p)
    assert roll.capacity.sf >= needs[2]
    for name in ("youngs_modulus", "thickness", "friction", "barrier_stiffness"):
        v = float(getattr(g, name))
        assert np.isfinite(v) and v != 0.0, name
    # a Python-float or float32 leaf is canonicalised to float64 at the boundary: the rollout
    # does not compile again (jax.grad's own small ops on a weak-typed leaf may)
    compiles = []
    listener = lambda event, secs, fun_name="", **kw: (compiles.append(fun_name)
                                                        if event == BACKEND_COMPILE_EVENT else None)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for e_value in (2e8, jnp.asarray(2e8, jnp.float32), np.float64(2e8)):
            jax.grad(loss)(p._replace(youngs_modulus=e_value))
    finally:
        unregister_event_duration_listener(listener)
    assert not [f for f in compiles if "rollout" in f], compiles


def test_host_check_names_the_first_failed_step_and_its_reason():
    T = 5
    codes = np.zeros(T, np.int32)
    codes[3] = int(StepCode.ITERATION_CAP)
    codes[4] = int(StepCode.NON_FINITE)
    z = np.zeros(T, np.int32)
    with pytest.raises(RolloutFailed, match="rollout step 3 failed: iteration cap$") as e:
        _check_codes(codes, CandidateStats(z, z, z, z, np.zeros((T, 2, 3)), z))
    assert e.value.reason == "iteration cap" and e.value.code == StepCode.ITERATION_CAP
    # a batch (vmap) of rollouts: the first failing member's first failed step
    batch = np.zeros((3, T), np.int32)
    batch[1, 2] = int(StepCode.CAPACITY_OVERFLOW)
    counts = np.arange(3 * T).reshape(3, T)
    with pytest.raises(RolloutFailed, match=r"rollout step 2 failed: capacity overflow \(.*sf 7,") as e:
        _check_codes(batch, CandidateStats(counts, counts, counts, counts, np.zeros((3, T, 2, 3)), counts))
    assert e.value.needs[:3] == (7, 7, 7)
    _check_codes(np.zeros(T, np.int32), CandidateStats(z, z, z, z, np.zeros((T, 2, 3)), z))  # all ok: silent
    for status in LinearStatus:
        if status is LinearStatus.SUCCESSFUL:
            _check_backward(np.int32(status))  # a successful backward solve: silent
            continue
        with pytest.raises(BackwardFailed, match=f"failed: {status.name.lower().replace('_', ' ')} .*gradient would be NaN") as e:
            _check_backward(np.int32(status))
        assert e.value.status == status


@pytest.mark.parametrize("bad, message", [
    (dict(youngs_modulus=-315e6), "youngs_modulus must be > 0"),
    (dict(poisson=0.7), r"poisson must be in \(−1, 0.5\)"),
    (dict(thickness=0.0), "thickness must be > 0"),
    (dict(friction=-0.35), "friction must be ≥ 0"),
    (dict(barrier_stiffness=-1000.0), "barrier_stiffness must be > 0"),
    (dict(drag=float("nan")), "drag must be finite"),
])
def test_rollout_refuses_impossible_parameters_before_compiling(drape, bad, message):
    m, ctl, x0 = drape
    roll = make_rollout(m, Config())
    p = Params.film_defaults()._replace(**{k: jnp.asarray(v) for k, v in bad.items()})
    with pytest.raises(ValueError, match=message):
        roll(p, x0, jnp.zeros_like(x0), ctl, DT)
    with pytest.raises(ValueError, match=message):
        Params.film_defaults(**bad)


def test_rollout_refuses_bad_dt_controls_and_states(drape):
    m, ctl, x0 = drape
    roll = make_rollout(m, Config())
    p, v0 = Params.film_defaults(), jnp.zeros_like(x0)
    for dt in (0.0, -DT, float("inf")):
        with pytest.raises(ValueError, match="dt must be a finite scalar > 0"):
            roll(p, x0, v0, ctl, dt)
    with pytest.raises(ValueError, match="x0 must have shape"):
        roll(p, x0[:-1], v0, ctl, DT)
    with pytest.raises(ValueError, match="v0 must be finite"):
        roll(p, x0, v0.at[0, 0].set(jnp.nan), ctl, DT)
    with pytest.raises(ValueError, match="controls.tolerance must be > 0"):
        roll(p, x0, v0, ctl._replace(tolerance=-ctl.tolerance), DT)
    with pytest.raises(ValueError, match="controls.force must have shape"):
        roll(p, x0, v0, ctl._replace(force=ctl.force[:, :-1]), DT)
    with pytest.raises(ValueError, match="capacity.sf must be an integer ≥ 1"):
        make_rollout(m, Config(), C.initial_capacity(m.topology)._replace(sf=0))


def test_initial_capacity_covers_the_readme_drape():
    """The 10 × 10 drape over one sphere needs about 100 sphere–face rows at its first step."""
    m = drape_scene(n=10)["model"]
    cap = C.initial_capacity(m.topology)
    assert cap.sf >= len(m.topology.triangles) * len(m.topology.spheres)

"""Implicit-function VJP of the step solve: against unrolled Newton and the Taylor test."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax import candidates as C
from ipcjax.implicit import make_rollout, make_solve, stack_controls
from ipcjax.energies import PSDProjection
from ipcjax.implicit import BackwardFailed, _check_backward, solve_at
from ipcjax.model import Config, Controls, Params
from ipcjax.newton import query_contacts
from ipcjax.potential import TERMS, dense_hessian, gradient_and_blocks
from ipcjax.problem import StepInputs
from ipcjax.result import LinearStatus
from ipcjax.step import step_problem
from scenes.film import drape_scene, hanging_scene, vertex_triangle_scene
from tests.helpers import assert_nonzero, rel_err, taylor_test

DT = 1.0 / 240.0
CFG = Config()
PARAMS = ("youngs_modulus", "poisson", "thickness", "bending_scale", "drag", "gravity")


def test_implicit_gradient_equals_unrolled_newton_without_contact():
    sc = hanging_scene(n=4)
    m = sc.model
    cap = C.initial_capacity(m.topology)
    rng = np.random.default_rng(0)
    x0 = jnp.asarray(sc.x).at[:12].add(jnp.asarray(rng.normal(size=(12, 3)) * 1e-4))
    v0 = jnp.asarray(rng.normal(size=x0.shape) * 1e-2).at[12:].set(0.0)
    ctl = Controls.empty(m.n_particles, tolerance=1e-11)
    W = jnp.asarray(rng.normal(size=x0.shape))
    p0 = Params.film_defaults()
    solve = make_solve(m, CFG, cap, with_stats=True)
    # no contact: the reference below leaves out the barrier and friction terms, which are
    # exactly zero while no stencil comes inside d̂ (asserted from the solve's stats)
    elastic = tuple(t for t in TERMS if t.name not in ("barrier", "friction"))

    def implicit_loss(p, x0, v0):
        x, code, stats, _, _ = solve(p, x0, v0, ctl, DT)
        return jnp.sum(W * x), (code, stats.n_active)

    def unrolled_loss(p, x0, v0):
        problem = step_problem(m, CFG, StepInputs(p, x0, v0, ctl, DT), None)

        def newton(_, x):  # plain Newton with the exact Hessian, differentiated through
            g, hb = gradient_and_blocks(x, problem, None, projection=PSDProjection.NONE, terms=elastic)
            return x.at[m.free_particles].add(jnp.linalg.solve(dense_hessian(hb), -g).reshape(-1, 3))

        return jnp.sum(W * jax.lax.fori_loop(0, 30, newton, x0))

    (li, (code, n_active)), gi = jax.jit(jax.value_and_grad(implicit_loss, argnums=(0, 1, 2), has_aux=True))(
        p0, x0, v0)
    assert int(code) == 0 and int(n_active) == 0  # no stencil inside d̂ at any iterate
    lu, gu = jax.jit(jax.value_and_grad(unrolled_loss, argnums=(0, 1, 2)))(p0, x0, v0)
    assert abs(float(li - lu)) <= 1e-9 * abs(float(lu))  # same minimiser
    for name in PARAMS:
        a, b = getattr(gi[0], name), getattr(gu[0], name)
        assert_nonzero(b, name)
        assert rel_err(a, b) < 1e-6, name
    assert rel_err(gi[1], gu[1]) < 1e-6 and rel_err(gi[2], gu[2]) < 1e-6
    assert_nonzero(gi[1]); assert_nonzero(gi[2])


def _contact_case(name):
    if name == "vertex-triangle press":
        sc = vertex_triangle_scene(speed=0.05)
        x = sc.x.copy(); x[:3, 2] -= 0.0015  # start inside the barrier range (0.5 mm gap)
        return sc.model, x, sc.v
    if name == "frictional slide":
        sc = vertex_triangle_scene()
        x = sc.x.copy(); x[:3, 2] -= 0.0015
        v = np.zeros_like(x); v[:3] = [0.3, 0.1, -0.02]  # sliding along the face
        return sc.model, x, v
    sc = drape_scene(n=4, size=0.02, sphere_radius=0.02, gap=4e-4)  # film resting on a sphere
    return sc.model, sc.x, np.zeros_like(sc.x)


def contact_rollout_loss(case):
    """The jitted loss p ↦ (Σ W·x of the last frame of a 3-step rollout of ``case``, codes),
    random weights W: what the Taylor test below differentiates
    (benchmarks/taylor_base_points.py takes it too)."""
    m, x0, v0 = _contact_case(case)
    steps = 3
    ctl = stack_controls([Controls.empty(m.n_particles, tolerance=1e-12)] * steps)
    rollout = make_rollout(m, CFG, C.initial_capacity(m.topology), round_fp32=False)
    W = jnp.asarray(np.random.default_rng(1).normal(size=x0.shape))
    x0, v0 = jnp.asarray(x0), jnp.asarray(v0)

    @jax.jit
    def loss(p):
        frames, _, codes = rollout(p, x0, v0, ctl, DT)
        return jnp.sum(W * frames[-1]), codes

    return loss


@pytest.mark.parametrize("case", [
    pytest.param("vertex-triangle press", marks=pytest.mark.slow),
    "frictional slide",
    pytest.param("film on sphere", marks=pytest.mark.slow),
])
def test_rollout_gradients_with_contact_pass_the_taylor_test(case):
    loss = contact_rollout_loss(case)
    p0 = Params.film_defaults()
    # one program for f0, the gradient and every f(h): ``loss`` alone compiled a second
    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (val, codes), g = value_and_grad(p0)
    assert np.all(np.asarray(codes) == 0)
    # one film triangle has no hinge (no bending lever); the film at rest on the sphere
    # does not slide (no friction lever)
    names = (("youngs_modulus", "bending_scale", "barrier_stiffness") if case == "film on sphere"
             else ("youngs_modulus", "friction", "barrier_stiffness"))
    # The Taylor test (tests/helpers.py), not one central difference: at the old step of
    # 3e-3 relative the difference's own truncation error was 9.4e-5 against a bound of
    # 1e-4 for μf (frictional slide), a verdict resting on one h. Measured here, the
    # remainders fall as h² over 2.7 (E), 3.3 (μf) and 4.2 (κ) decades, down to the solve's
    # 1e-12 m noise floor, where r/|h·dfd| is 1.5e-4, 3e-5 and 7e-6 (the slow cases: ≤ 5.6e-4,
    # the press's μf; rtol 3e-3 leaves room for 25× this machine's noise). The press's E fails
    # since 131a923: its default E lies within ~1e-3 of a kink (docs/differentiation.md).
    for name in names:
        base = float(getattr(p0, name))
        ad = float(getattr(g, name))
        assert ad != 0.0, name
        res = taylor_test(lambda s: value_and_grad(p0._replace(**{name: jnp.asarray(base * (1 + s))}))[0][0],
                          ad * base, 0.3, n=16, f0=float(val), rtol=3e-3)
        print(case, name, res)


def test_backward_solve_with_too_few_active_rows_refuses():
    """The implicit VJP's H u = rhs over the compacted active rows equals the solve over
    every candidate row, and when x has more active stencils than rows it gives no
    solution (NaN, ``TOO_FEW_ROWS``, and a rollout's backward raises) instead of leaving
    contacts out."""
    m, x0, v0 = _contact_case("film on sphere")
    # perturbed off the symmetric start, where the sphere's closest point lies exactly on
    # a shared film edge (a branch boundary of the exact Hessian, which rounding then picks)
    n_film = int(np.sum(np.asarray(m.film)))
    x0 = np.asarray(x0).copy()
    x0[:n_film] += np.random.default_rng(6).normal(size=(n_film, 3)) * 2e-5
    x0, v0 = jnp.asarray(x0), jnp.asarray(v0)
    cap = C.initial_capacity(m.topology)
    p = Params.film_defaults()
    ctl = Controls.empty(m.n_particles)

    @jax.jit  # one program for the set-up (op by op it was hundreds of small compilations)
    def set_up(x0, v0):
        cs, _ = query_contacts(x0, x0, m, CFG, cap, skin=CFG.skin)
        problem = step_problem(m, CFG, StepInputs(p, x0, v0, ctl, jnp.asarray(DT)), cs)
        return cs, problem, gradient_and_blocks(x0, problem, cs, active=cap.active)[1].n_active

    cs, problem, n_active = set_up(x0, v0)
    n_active = int(n_active)
    rhs = jnp.asarray(np.random.default_rng(5).normal(size=3 * m.n_free))
    run = jax.jit(lambda active: solve_at(x0, problem, cs, rhs, projection="exact", active=active),
                  static_argnums=0)
    assert 1 < n_active < cs.idx.shape[0]
    full = np.asarray(run(None).value)
    assert np.abs(full).max() > 0
    np.testing.assert_allclose(np.asarray(run(cap.active).value), full, rtol=1e-12, atol=0)
    # one row for several active stencils: a solve over it would miss contacts
    few = run(1)
    assert int(few.status) == LinearStatus.TOO_FEW_ROWS and np.all(np.isnan(np.asarray(few.value)))
    with pytest.raises(BackwardFailed, match="too few rows .*active rows") as err:
        _check_backward(few.status)
    assert err.value.status == LinearStatus.TOO_FEW_ROWS

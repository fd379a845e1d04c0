"""The matrix-free linear-solve path: block matvec, block-Jacobi PCG direction, CG drape."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax import candidates as C
from ipcjax.audit import audit_trajectory
from ipcjax.implicit import hessian_solve
from ipcjax.model import Config, Controls, Params
from ipcjax.newton import cg_direction, newton_direction, query_contacts
from ipcjax.potential import (
    StepContext, dense_hessian, friction_set, gradient_and_blocks, hessian_block_diagonal, hessian_matvec,
)
from ipcjax.result import StepCode
from ipcjax.step import make_state, simulate, step
from scenes.film import drape_scene
from tests.helpers import rel_err

DT = 1.0 / 240.0
CG = Config(linear_solver="cg")


@pytest.fixture(scope="module")
def contact_system():
    """A 9×9 film 0.4 mm above a sphere (inside d̂) and a floor, perturbed, with active
    friction and supports: jitted exact ↦ (gradient, Hessian blocks) at x, step start x₀."""
    n = 9
    sc = drape_scene(n=n, size=0.04, sphere_radius=0.02, gap=0.4e-3, floor=True)
    m = sc["model"]
    p = Params.film_defaults()
    rng = np.random.default_rng(1)
    x0 = jnp.asarray(sc["x"])
    x = x0.at[:n * n].add(jnp.asarray(rng.normal(size=(n * n, 3)) * 5e-5))
    cs, stats = query_contacts(x0, x, m, CG, C.Capacity(4 * n * n, 16 * n * n, 4 * n * n))
    assert not bool(stats.overflow)
    ctx = StepContext(x0=x0, y=x0 + DT**2 * p.gravity, dt=jnp.asarray(DT),
                      friction=jax.jit(friction_set)(x0, cs, m.radius, p, CG))
    assert int(jnp.sum(ctx.friction.load > 0)) > 0  # friction is active
    ctl = Controls.empty(m.n_particles)._replace(
        support_index=jnp.array([0, n - 1], jnp.int32), support_k=jnp.array([5.0, 5.0]),
        support_target=x[jnp.array([0, n - 1])] + 1e-4)
    blocks = jax.jit(lambda exact: gradient_and_blocks(x, m, p, ctl, ctx, cs, CG, exact), static_argnums=0)
    return blocks


@pytest.mark.parametrize("exact", [False, True])
def test_block_matvec_equals_dense_hessian(contact_system, exact):
    g, hb = contact_system(exact)
    H = np.asarray(dense_hessian(hb))
    rng = np.random.default_rng(2)
    for _ in range(3):
        v = rng.normal(size=H.shape[0])
        assert rel_err(hessian_matvec(hb, jnp.asarray(v)), H @ v) < 1e-12
    F = H.shape[0] // 3
    blocks = np.stack([H[3 * i:3 * i + 3, 3 * i:3 * i + 3] for i in range(F)])
    assert rel_err(hessian_block_diagonal(hb), blocks) < 1e-12


def test_cg_direction_matches_the_cholesky_direction(contact_system):
    g, hb = contact_system(False)
    dense, ok_dense = newton_direction(g, dense_hessian(hb))
    cg, ok_cg, info = jax.jit(cg_direction)(g, hb, CG)
    assert bool(ok_dense) and bool(ok_cg)
    assert 0 < int(info.iterations) < CG.cg_max_iterations and float(info.residual) <= CG.cg_tolerance
    assert rel_err(cg, dense) < 1e-6


def test_cg_that_misses_its_tolerance_fails_like_a_factorization(contact_system):
    g, hb = contact_system(False)
    dx, ok, info = cg_direction(g, hb, Config(linear_solver="cg", cg_max_iterations=2))
    assert not bool(ok) and int(info.iterations) == 2 and not np.any(np.asarray(dx))
    g_nan = g.at[0].set(jnp.nan)
    assert not bool(cg_direction(g_nan, hb, CG)[1])


def test_implicit_vjp_solve_by_cg_matches_dense(contact_system):
    """The implicit VJP's H u = rhs on the CG path (never forming H) against the dense solve."""
    cg_cfg = Config(linear_solver="cg", cg_tolerance=1e-12)
    solve = jax.jit(hessian_solve, static_argnums=3)
    rhs = jnp.asarray(np.random.default_rng(3).normal(size=(3 * 81,)))
    _, hb = contact_system(False)
    assert rel_err(solve(hb, rhs, cg_cfg, "projected"), hessian_solve(hb, rhs, Config(), "projected")) < 1e-8
    # away from a minimiser the exact Hessian is indefinite: CG reports it with NaN, not a wrong u
    _, hb = contact_system(True)
    assert np.linalg.eigvalsh(np.asarray(dense_hessian(hb))).min() < 0
    assert np.all(np.isnan(np.asarray(solve(hb, rhs, cg_cfg, "exact"))))


def test_cg_drape_ends_where_the_dense_drape_does():
    sc = drape_scene(n=6, size=0.04, sphere_radius=0.02, gap=0.4e-3)
    m = sc["model"]
    p = Params.film_defaults()
    ctl = Controls.empty(m.n_particles, tolerance=5e-7)
    runs = {}
    for cfg in (Config(), CG):
        frames, _, reps = simulate(m, p, make_state(sc["x"]), ctl, 12, DT, cfg)
        assert all(r.ok for r in reps)
        runs[cfg.linear_solver] = (frames, reps)
    (fd, _), (fc, reps) = runs["dense"], runs["cg"]
    print('max |x_cg - x_dense| %.3g m, film moved %.3g m' % (np.max(np.abs(fc[-1] - fd[-1])), np.max(np.abs(fd[-1] - fd[0]))))
    assert np.max(np.abs(fc[-1] - fd[-1])) < 2e-6  # m, after 12 steps
    assert np.max(np.abs(fd[-1] - fd[0])) > 3e-4
    audit = audit_trajectory(fc, sc["film_triangles"], [sc["sphere"]], [0.02])
    assert audit["frames_with_self_intersection"] == 0 and np.all(audit["min_film_sphere"] > 0)
    assert min(r.min_gap for r in reps) > 0

    # a CG cap too small to converge is reported by the step as a failed factorization
    _, info = step(m, p, make_state(fc[-1]), ctl, DT, config=Config(linear_solver="cg", cg_max_iterations=1),
                   capacity=reps[-1].capacity)
    assert int(info.code) & int(StepCode.FACTORIZATION_FAILED)

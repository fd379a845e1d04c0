"""The matrix-free linear-solve path: block matvec, block-Jacobi PCG direction, CG drape."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax import candidates as C
from ipcjax.audit import audit_trajectory
from ipcjax.linear_solvers import BlockJacobiCG, DenseCholesky, linear_solver
from ipcjax.model import Config, Controls, Params
from ipcjax.newton import query_contacts
from ipcjax.potential import (
    ContactSet, contact_gaps, contact_weights, dense_hessian, friction_set, gather_stencils, gradient_and_blocks,
    hessian_block_diagonal, hessian_matvec, incremental_potential,
)
from ipcjax.problem import StepContext, StepProblem
from ipcjax.result import StepCode
from ipcjax.step import advance, make_state, simulate, step
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
    problem = StepProblem(model=m, params=p, controls=ctl, context=ctx, config=CG)
    blocks = jax.jit(lambda exact: gradient_and_blocks(x, problem, cs, projection="exact" if exact else "projected"),
                     static_argnums=0)
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
    dense, ok_dense, _ = DenseCholesky().direction(g, dense_hessian(hb))
    cg, ok_cg, info = jax.jit(linear_solver(CG).direction)(g, hb)
    assert bool(ok_dense) and bool(ok_cg)
    assert 0 < int(info.iterations) < CG.cg_max_iterations and float(info.residual) <= CG.cg_tolerance
    assert rel_err(cg, dense) < 1e-6


def test_cg_that_misses_its_tolerance_fails_like_a_factorization(contact_system):
    g, hb = contact_system(False)
    dx, ok, info = linear_solver(Config(linear_solver="cg", cg_max_iterations=2)).direction(g, hb)
    assert not bool(ok) and int(info.iterations) == 2 and not np.any(np.asarray(dx))
    g_nan = g.at[0].set(jnp.nan)
    assert not bool(linear_solver(CG).direction(g_nan, hb)[1])


def test_implicit_vjp_solve_by_cg_matches_dense(contact_system):
    """The implicit VJP's H u = rhs on the CG path (never forming H) against the dense solve."""
    cg = BlockJacobiCG(tolerance=1e-12, max_iterations=Config().cg_max_iterations)
    solve = jax.jit(cg.solve, static_argnums=2)
    dense = DenseCholesky()
    rhs = jnp.asarray(np.random.default_rng(3).normal(size=(3 * 81,)))
    _, hb = contact_system(False)
    assert rel_err(solve(hb, rhs, "projected"), dense.solve(dense.init(hb), rhs, "projected")) < 1e-8
    # away from a minimiser the exact Hessian is indefinite: CG reports it with NaN, not a wrong u
    _, hb = contact_system(True)
    assert np.linalg.eigvalsh(np.asarray(dense_hessian(hb))).min() < 0
    assert np.all(np.isnan(np.asarray(solve(hb, rhs, "exact"))))


def drape_runs(configs, steps=12):
    """A 6×6 film dropped 0.4 mm onto a sphere for ``steps`` steps with each config:
    (scene, params, controls, {linear_solver: (frames, reports)}); every step must succeed."""
    sc = drape_scene(n=6, size=0.04, sphere_radius=0.02, gap=0.4e-3)
    m = sc["model"]
    p = Params.film_defaults()
    ctl = Controls.empty(m.n_particles, tolerance=5e-7)
    runs = {}
    for cfg in configs:
        frames, _, reps = simulate(m, p, make_state(sc["x"]), ctl, steps, dt=DT, config=cfg)
        assert all(r.ok for r in reps)
        runs[cfg.linear_solver] = (frames, reps)
    return sc, p, ctl, runs


def test_cg_drape_ends_where_the_dense_drape_does():
    sc, p, ctl, runs = drape_runs((Config(), CG))
    m = sc["model"]
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


# ---------------------------------------------------------------- active-row compaction

@pytest.fixture(scope="module")
def active_system():
    """The 9×9 film 0.4 mm above the sphere (inside d̂ near its top, the rest of the
    candidate rows farther out), perturbed: model, params, state x, step start x₀, contacts."""
    n = 9
    sc = drape_scene(n=n, size=0.04, sphere_radius=0.02, gap=0.4e-3, floor=True)
    m = sc["model"]
    rng = np.random.default_rng(4)
    x0 = jnp.asarray(sc["x"])
    x = x0.at[:n * n].add(jnp.asarray(rng.normal(size=(n * n, 3)) * 5e-5))
    cap = C.Capacity(4 * n * n, 16 * n * n, 4 * n * n)
    # jitted: one program, where op by op it was hundreds of small compilations
    cs, stats = jax.jit(lambda a, b: query_contacts(a, b, m, Config(), cap, skin=1.5e-3))(x0, x)
    assert not bool(stats.overflow)
    return sc, m, Params.film_defaults(), x, x0, cs


@pytest.mark.parametrize("exact", [False, True])
def test_compacted_assembly_equals_the_full_one(active_system, exact):
    """Assembling only the stencils inside d̂ (Capacity.active) gives the same ∇Φ and H as
    assembling every candidate row, with the friction set compacted too."""
    sc, m, p, x, x0, cs = active_system
    ctl = Controls.empty(m.n_particles)
    M = cs.idx.shape[0]
    K = 48
    fs_full, fs_comp = jax.jit(lambda x0: (friction_set(x0, cs, m.radius, p, Config()),
                                           friction_set(x0, cs, m.radius, p, Config(), active=K)))(x0)
    n_fric = int(fs_full.count)
    assert 0 < n_fric <= K < M and fs_comp.idx.shape[0] == K and int(fs_comp.count) == n_fric
    out = {}
    for name, fs, active in (("full", fs_full, None), ("compact", fs_comp, K)):
        ctx = StepContext(x0=x0, y=x0 + DT**2 * p.gravity, dt=jnp.asarray(DT), friction=fs)
        problem = StepProblem(model=m, params=p, controls=ctl, context=ctx, config=Config())
        projection = "exact" if exact else "projected"

        @jax.jit
        def assembled(x):
            g, hb = gradient_and_blocks(x, problem, cs, projection=projection, active=active)
            return g, dense_hessian(hb), incremental_potential(x, problem, cs), hb.n_active

        g, H, phi, n_active = assembled(x)
        out[name] = (np.asarray(g), np.asarray(H), float(phi), int(n_active))
    (g_f, H_f, phi_f, _), (g_c, H_c, phi_c, n_act) = out["full"], out["compact"]
    print(f"{M} candidate rows, {n_act} active, {n_fric} with friction")
    assert n_fric <= n_act <= K
    assert np.abs(g_f).max() > 0 and rel_err(g_c, g_f) < 1e-12
    assert rel_err(H_c, H_f) < 1e-12 and phi_c == pytest.approx(phi_f, rel=1e-14)


def test_too_few_active_rows_overflow_and_the_driver_grows_them(active_system):
    """A step whose contacts need more active rows than Capacity.active stops with
    CAPACITY_OVERFLOW, leaves the state alone, and the host driver grows the rows."""
    sc, m, p, _, x0, _ = active_system
    ctl = Controls.empty(m.n_particles, tolerance=1e-6)
    st = make_state(x0)
    cap = C.initial_capacity(m.topology)._replace(active=2)
    new, info = step(m, p, st, ctl, DT, config=Config(), capacity=cap)
    assert int(info.code) & int(StepCode.CAPACITY_OVERFLOW)
    assert not int(info.code) & int(StepCode.FACTORIZATION_FAILED)
    assert int(info.n_active) > 2
    np.testing.assert_array_equal(np.asarray(new.x), np.asarray(st.x))
    out, rep = advance(m, p, st, ctl, DT, config=Config(), capacity=cap, validate=False)
    assert rep.ok and rep.reallocations >= 1 and rep.capacity.active >= int(info.n_active)
    # and the grown, compacted step lands where an uncompacted one does
    ref, rep_ref = advance(m, p, st, ctl, DT, config=Config(), capacity=cap._replace(active=None), validate=False)
    assert rep_ref.ok
    assert np.max(np.abs(np.asarray(out.x) - np.asarray(ref.x))) < 1e-9
    assert np.max(np.abs(np.asarray(out.x) - np.asarray(st.x))) > 1e-6


def test_a_reach_set_beyond_the_slots_overflows_and_the_grown_step_lands_where_every_row_does(active_system):
    """A step whose slots hold the rows inside d̂ but not every row in reach of its first
    directions stops with CAPACITY_OVERFLOW (its bound and line search would miss rows),
    leaves the state alone, and the host grows the slots and ends where the uncompacted
    step ends."""
    sc, m, p, _, x0, _ = active_system
    ctl = Controls.empty(m.n_particles, tolerance=1e-6)
    st = make_state(x0)
    cap0 = C.initial_capacity(m.topology)
    g0 = np.asarray(jax.jit(lambda x: contact_gaps(x, query_contacts(x, x, m, Config(), cap0, skin=1.5e-3)[0],
                                                   m.radius, Config().min_gap)[0])(x0))
    n_in = int(np.sum(g0 < Config().dhat))
    cap = cap0._replace(active=n_in + 2)
    new, info = step(m, p, st, ctl, DT, config=Config(), capacity=cap)
    assert int(info.code) == int(StepCode.CAPACITY_OVERFLOW) and int(info.n_active) > n_in + 2
    np.testing.assert_array_equal(np.asarray(new.x), np.asarray(st.x))
    out, rep = advance(m, p, st, ctl, DT, config=Config(), capacity=cap, validate=False)
    ref, rep_ref = advance(m, p, st, ctl, DT, config=Config(), capacity=cap._replace(active=None), validate=False)
    assert rep.ok and rep_ref.ok and rep.reallocations >= 1 and rep.capacity.active >= int(info.n_active)
    assert np.max(np.abs(np.asarray(out.x) - np.asarray(ref.x))) < 1e-9
    assert np.max(np.abs(np.asarray(out.x) - np.asarray(st.x))) > 1e-6


def test_per_block_weights_equal_the_kind_selected_ones(active_system):
    """Candidate sets carry their block sizes; weights computed block by block with one
    formula each equal the every-formula-then-select fallback on the same rows."""
    sc, m, p, x, x0, cs = active_system
    assert cs.blocks is not None and sum(cs.blocks) == cs.idx.shape[0]
    X = gather_stencils(x, cs)
    fast = np.asarray(jax.jit(contact_weights)(X, cs))
    generic = np.asarray(jax.jit(contact_weights)(X, ContactSet(cs.idx, cs.kind, cs.valid)))
    valid = np.asarray(cs.valid)
    kinds = set(np.asarray(cs.kind)[valid].tolist())
    assert {int(C.ContactKind.VT), int(C.ContactKind.EE), int(C.ContactKind.SF)} <= kinds
    np.testing.assert_allclose(fast, generic, rtol=0, atol=1e-14)
    assert np.abs(fast[valid]).max() > 0
    with pytest.raises(ValueError, match="blocks"):
        contact_weights(X, ContactSet(cs.idx, cs.kind, cs.valid, (1, 1, 1, 1)))

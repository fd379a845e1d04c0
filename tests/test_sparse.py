"""The linear-solve paths beside the dense Cholesky: the matrix-free one (block matvec,
block-Jacobi PCG direction) and the sparse direct one (host LDLᵀ of the element blocks,
reached from jit: ipcjax.ldl); active-row compaction; and drapes on each path against one
dense drape. One module, so that the film-over-sphere blocks and the dense drape compile
once for both paths (issue #31)."""
import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax import candidates as C
from ipcjax import ldl
from ipcjax.audit import audit_trajectory
from ipcjax.implicit import make_rollout, stack_controls
from ipcjax.ldl import sparse_solve, upper_csc, upper_triangle
from ipcjax.capacity import KIND_FLOOR, kind_slots
from ipcjax.line_search import compact_contacts, reach_contacts, reach_need, reach_scale
from ipcjax.linear_solvers import BlockJacobiCG, DenseCholesky, LinearSolver, SparseLDL, linear_solver
from ipcjax.result import LinearStatus
from ipcjax.model import Config, Controls, Params
from ipcjax.newton import query_contacts
from ipcjax.potential import (
    dense_hessian, gradient_and_blocks, hessian_block_diagonal, hessian_matvec, incremental_potential,
)
from ipcjax.problem import StepContext, StepProblem
from ipcjax.result import StepCode
from ipcjax import stencils as S
from ipcjax.stencils import ContactSet, contact_gaps, contact_weights, friction_set, gather_stencils
from ipcjax.step import advance, make_state, simulate, step
from scenes.film import drape_scene, vertex_triangle_scene
from tests.helpers import assert_nonzero, rel_err

DT = 1.0 / 240.0
CG = Config(linear_solver="cg")
SPARSE = Config(linear_solver="sparse")


@pytest.fixture(scope="module")
def contact_system():
    """A 9×9 film 0.4 mm above a sphere (inside d̂) and a floor, perturbed, with active
    friction and supports: jitted exact ↦ (gradient, Hessian blocks) at x, step start x₀."""
    n = 9
    sc = drape_scene(n=n, size=0.04, sphere_radius=0.02, gap=0.4e-3, floor=True)
    m = sc.model
    p = Params.film_defaults()
    rng = np.random.default_rng(1)
    x0 = jnp.asarray(sc.x)
    x = x0.at[:n * n].add(jnp.asarray(rng.normal(size=(n * n, 3)) * 5e-5))
    cap = C.Capacity(4 * n * n, 16 * n * n, 4 * n * n)
    # jitted: one program, where op by op it was hundreds of small compilations
    cs, stats = jax.jit(lambda a, b: query_contacts(a, b, m, CG, cap))(x0, x)
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
    dense_solution = DenseCholesky().direction(g, dense_hessian(hb))
    dense = dense_solution.value
    cg, status_cg, info = jax.jit(linear_solver(CG).direction)(g, hb)
    assert bool(dense_solution.ok) and int(status_cg) == LinearStatus.SUCCESSFUL
    assert 0 < int(info.iterations) < CG.cg_max_iterations and float(info.residual) <= CG.cg_tolerance
    assert rel_err(cg, dense) < 1e-6


def test_dense_solver_names_why_it_failed():
    """Every solver returns a LinearSolution whose status names the failure (lineax-style):
    the dense one on small matrices that are indefinite, singular or not finite."""
    g = jnp.asarray([1.0, -2.0, 0.5])
    spd = jnp.asarray([[4.0, 1.0, 0.0], [1.0, 3.0, 0.5], [0.0, 0.5, 2.0]])
    dense = DenseCholesky()
    assert isinstance(dense, LinearSolver) and isinstance(linear_solver(CG), LinearSolver)
    ok = dense.direction(g, spd)
    assert bool(ok.ok) and np.all(np.isfinite(np.asarray(ok.value))) and np.any(np.asarray(ok.value))
    indefinite = dense.direction(g, spd.at[2, 2].set(-2.0))
    assert int(indefinite.status) == LinearStatus.NOT_POSITIVE_DEFINITE and not np.any(np.asarray(indefinite.value))
    assert int(dense.direction(g.at[1].set(jnp.inf), spd).status) == LinearStatus.NON_FINITE_INPUT
    singular = spd.at[2].set(0.0).at[:, 2].set(0.0)
    sol = dense.solve(singular, g, "exact")
    assert int(sol.status) == LinearStatus.SINGULAR and np.all(np.isnan(np.asarray(sol.value)))
    assert int(dense.solve(spd.at[0, 0].set(jnp.nan), g, "exact").status) == LinearStatus.NON_FINITE_INPUT
    sol = dense.solve(spd, g, "projected")
    assert bool(sol.ok)
    np.testing.assert_allclose(np.asarray(sol.value), np.linalg.solve(np.asarray(spd), np.asarray(g)), rtol=1e-12)
    assert LinearStatus.describe(3) == "singular" and "unknown" in LinearStatus.describe(99)


def test_cg_that_misses_its_tolerance_fails_like_a_factorization(contact_system):
    g, hb = contact_system(False)
    dx, status, info = linear_solver(Config(linear_solver="cg", cg_max_iterations=2)).direction(g, hb)
    assert int(status) == LinearStatus.MAX_ITERATIONS and int(info.iterations) == 2 and not np.any(np.asarray(dx))
    g_nan = g.at[0].set(jnp.nan)
    assert int(linear_solver(CG).direction(g_nan, hb).status) == LinearStatus.NON_FINITE_INPUT


def test_implicit_vjp_solve_by_cg_matches_dense(contact_system):
    """The implicit VJP's H u = rhs on the CG path (never forming H) against the dense solve."""
    cg = BlockJacobiCG(tolerance=1e-12, max_iterations=Config().cg_max_iterations)
    solve = jax.jit(cg.solve, static_argnums=2)
    dense = DenseCholesky()
    rhs = jnp.asarray(np.random.default_rng(3).normal(size=(3 * 81,)))
    _, hb = contact_system(False)
    assert rel_err(solve(hb, rhs, "projected").value, dense.solve(dense.init(hb), rhs, "projected").value) < 1e-8
    # away from a minimiser the exact Hessian is indefinite: CG reports it with NaN and its
    # status, not a wrong u
    _, hb = contact_system(True)
    assert np.linalg.eigvalsh(np.asarray(dense_hessian(hb))).min() < 0
    sol = solve(hb, rhs, "exact")
    assert np.all(np.isnan(np.asarray(sol.value)))
    assert int(sol.status) in (LinearStatus.BREAKDOWN, LinearStatus.MAX_ITERATIONS), LinearStatus.describe(sol.status)


DRAPE_STEPS = 12


def drape_run(config, steps=DRAPE_STEPS):
    """A 6×6 film dropped 0.4 mm onto a sphere for ``steps`` steps with ``config``:
    (scene, params, controls, frames, reports); every step must succeed."""
    sc = drape_scene(n=6, size=0.04, sphere_radius=0.02, gap=0.4e-3)
    m = sc.model
    p = Params.film_defaults()
    ctl = Controls.empty(m.n_particles, tolerance=5e-7)
    frames, _, reps = simulate(m, p, make_state(sc.x), ctl, steps, dt=DT, config=config)
    assert all(r.ok for r in reps)
    return sc, p, ctl, frames, reps


@pytest.fixture(scope="module")
def dense_drape():
    """The drape on the dense Cholesky path: what the CG and sparse drapes must follow."""
    return drape_run(Config())


def test_cg_drape_ends_where_the_dense_drape_does(dense_drape):
    sc, p, ctl, fd, _ = dense_drape
    _, _, _, fc, reps = drape_run(CG)
    m = sc.model
    print('max |x_cg - x_dense| %.3g m, film moved %.3g m' % (np.max(np.abs(fc[-1] - fd[-1])), np.max(np.abs(fd[-1] - fd[0]))))
    assert np.max(np.abs(fc[-1] - fd[-1])) < 2e-6  # m, after 12 steps
    assert np.max(np.abs(fd[-1] - fd[0])) > 3e-4
    audit = audit_trajectory(fc, sc.film_triangles, [sc.sphere], [0.02])
    assert audit["frames_with_self_intersection"] == 0 and np.all(audit["min_film_sphere"] > 0)
    assert min(r.min_gap for r in reps) > 0

    # a CG that fails (negative mass makes H indefinite) is reported by the step as a
    # failed factorization, not stepped over; the same program, the model's arrays are its
    # inputs (a CG cap too small to converge: test_cg_that_misses_its_tolerance_fails_like_a_factorization)
    state = make_state(fc[-1])
    out, info = step(m._replace(mass=-m.mass), p, state, ctl, DT, config=CG, capacity=reps[-1].capacity)
    assert int(info.code) & int(StepCode.FACTORIZATION_FAILED)
    assert np.array_equal(np.asarray(out.x), np.asarray(state.x))


def test_sparse_drape_follows_the_dense_drape(dense_drape):
    """Same Newton iterations, same positions to round-off, no intersection; a failed
    factorization (negative mass makes H indefinite) is reported, not stepped over."""
    sc, p, ctl, fd, rd = dense_drape
    _, _, _, fs, rs = drape_run(SPARSE)
    m = sc.model
    assert [r.iterations for r in rd] == [r.iterations for r in rs]
    assert np.max(np.abs(fs[-1] - fd[-1])) < 1e-9  # m
    assert np.max(np.abs(fd[-1] - fd[0])) > 3e-4
    assert min(r.min_gap for r in rs) > 0

    bad = m._replace(mass=-m.mass)
    state = make_state(fs[-1])
    out, info = step(bad, p, state, ctl, DT, config=SPARSE, capacity=rs[-1].capacity)
    assert int(info.code) & int(StepCode.FACTORIZATION_FAILED)
    assert np.array_equal(np.asarray(out.x), np.asarray(state.x))


# ---------------------------------------------------------------- active-row compaction

@pytest.fixture(scope="module")
def active_system():
    """The 9×9 film 0.4 mm above the sphere (inside d̂ near its top, the rest of the
    candidate rows farther out), perturbed: model, params, state x, step start x₀, contacts."""
    n = 9
    sc = drape_scene(n=n, size=0.04, sphere_radius=0.02, gap=0.4e-3, floor=True)
    m = sc.model
    rng = np.random.default_rng(4)
    x0 = jnp.asarray(sc.x)
    x = x0.at[:n * n].add(jnp.asarray(rng.normal(size=(n * n, 3)) * 5e-5))
    cap = C.Capacity(4 * n * n, 16 * n * n, 4 * n * n)
    # jitted: one program, where op by op it was hundreds of small compilations
    cs, stats = jax.jit(lambda a, b: query_contacts(a, b, m, Config(), cap, skin=1.5e-3))(x0, x)
    assert not bool(stats.overflow)
    return sc, m, Params.film_defaults(), x, x0, cs


@pytest.fixture(scope="module")
def uncompacted_step(active_system):
    """One step of 1e-6 m from the system's start x₀ assembling every candidate row
    (``active=None``): where the overflow tests' grown, compacted steps must land."""
    sc, m, p, _, x0, _ = active_system
    ctl = Controls.empty(m.n_particles, tolerance=1e-6)
    cap = C.initial_capacity(m.topology)._replace(active=None)
    ref, rep = advance(m, p, make_state(x0), ctl, DT, config=Config(), capacity=cap, validate=False)
    assert rep.ok
    return ref


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


def test_too_few_active_rows_overflow_and_the_driver_grows_them(active_system, uncompacted_step):
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
    assert np.max(np.abs(np.asarray(out.x) - np.asarray(uncompacted_step.x))) < 1e-9
    assert np.max(np.abs(np.asarray(out.x) - np.asarray(st.x))) > 1e-6


@pytest.mark.slow  # two step programs of its own (≈ 45 s in the suite); the reach set itself is checked in
# the default suite by test_the_reach_set_is_every_row_a_segment_can_bring_inside_dhat, the overflow, growth and
# landing of a compacted step by test_too_few_active_rows_overflow_and_the_driver_grows_them
def test_a_step_whose_loose_bounds_reach_past_the_slots_retakes_its_reference_and_keeps_its_slots(
        active_system, uncompacted_step):
    """A step whose slots hold the rows inside d̂ and two more. Its later iterations, by the
    lower bounds of the reference taken at x₀, put more rows in reach of their segments
    than that (until c5b5de8 the step stopped with CAPACITY_OVERFLOW here and the host
    grew the slots). The search now retakes the reference at its iterate, where the exact
    gaps fit the slots: the step succeeds in them, the driver grows nothing, and it ends
    where the step that assembles and searches every candidate row ends."""
    sc, m, p, _, x0, _ = active_system
    ctl = Controls.empty(m.n_particles, tolerance=1e-6)
    st = make_state(x0)
    cap0 = C.initial_capacity(m.topology)
    g0 = np.asarray(jax.jit(lambda x: contact_gaps(x, query_contacts(x, x, m, Config(), cap0, skin=1.5e-3)[0],
                                                   m.radius, Config().min_gap)[0])(x0))
    n_in = int(np.sum(g0 < Config().dhat))
    cap = cap0._replace(active=n_in + 2)
    new, info = step(m, p, st, ctl, DT, config=Config(), capacity=cap)
    assert int(info.code) == 0 and n_in <= int(info.n_active) <= n_in + 2
    out, rep = advance(m, p, st, ctl, DT, config=Config(), capacity=cap, validate=False)
    assert rep.ok and rep.reallocations == 0 and rep.capacity == cap
    assert np.array_equal(np.asarray(out.x), np.asarray(new.x))
    assert np.max(np.abs(np.asarray(out.x) - np.asarray(uncompacted_step.x))) < 1e-9
    assert np.max(np.abs(np.asarray(out.x) - np.asarray(st.x))) > 1e-6

@pytest.mark.slow  # two step programs of its own; the cut itself is checked in the default suite by
# test_a_segment_whose_reach_set_overflows_is_cut_where_it_fits
@pytest.mark.parametrize("slots", [40, 120])
def test_a_falling_film_whose_directions_reach_past_the_slots_steps_on_shorter_segments(slots):
    """A film falling at 0.5 m/s onto a sphere 2 mm below: its step sweeps past more rows
    than the slots hold (the step's own displacement reaches more of them), where the
    rows inside d̂ take less than half. The step cuts its segments where they fit
    (``reach_scale``) instead of stopping with a capacity overflow, keeps within its
    slots, and lands within the Newton tolerance of the step that assembles and searches
    every candidate row."""
    n, cfg = 9, Config()
    sc = drape_scene(n=n, size=0.04, sphere_radius=0.02, gap=2e-3, floor=True)
    m, p = sc.model, Params.film_defaults()
    v = np.zeros_like(sc.x)
    v[:n * n, 2] = -0.5
    st = make_state(sc.x, v)
    ctl = Controls.empty(m.n_particles, tolerance=1e-6)
    cap = C.initial_capacity(m.topology)
    ref, info_ref = step(m, p, st, ctl, DT, config=cfg, capacity=cap._replace(active=None))
    out, info = step(m, p, st, ctl, DT, config=cfg, capacity=cap._replace(active=slots))
    assert int(info_ref.code) == 0 and int(info.code) == 0 and int(info.n_active) <= slots

    @jax.jit
    def needs(x0, x1):
        cs, _ = query_contacts(x0, x1, m, cfg, cap, skin=cfg.skin)
        g = contact_gaps(x0, cs, m.radius, cfg.min_gap)[0]
        return reach_need(x1 - x0, cs, g, cfg.dhat), reach_need(0 * x0, cs, g, cfg.dhat)

    sweep, inside = (int(a) for a in needs(st.x.astype(jnp.float64), ref.x.astype(jnp.float64)))
    assert 2 * inside <= slots < sweep  # the case the cut is for
    moved = np.abs(np.asarray(ref.x) - np.asarray(st.x)).max()
    assert moved > 1e-3 and np.abs(np.asarray(out.x) - np.asarray(ref.x)).max() < 1e-6

def test_the_reach_set_is_every_row_a_segment_can_bring_inside_dhat(active_system):
    """``reach_contacts``: the rows with g < d̂ + 2·max‖Δxᵢ‖ over their stencil, in order, and
    no row outside that set comes inside d̂ anywhere on x → x + Δx (its barrier and its step
    bound are those of a padding row); the rows are compacted kind by kind into
    ``kind_slots`` of the size, and with too few slots the count (the smallest size that
    holds them, found here by search) says so (the step's capacity overflow). The
    step on this set within its slots is the slow test above's; the overflow, growth and
    landing of a compacted step are the too-few-rows test's."""
    sc, m, p, _, x0, cs = active_system
    cfg = Config()
    M = cs.idx.shape[0]
    assert cs.blocks is not None and sum(cs.blocks) == M  # a query's set, blocked by kind
    free = np.asarray(~m.fixed)[:, None]  # a Newton direction moves the free particles only
    dx = jnp.asarray(np.random.default_rng(7).normal(size=x0.shape) * 2e-4 * free)
    alphas = jnp.linspace(0.0, 1.0, 9)

    @jax.jit
    def run(x, dx):
        g = contact_gaps(x, cs, m.radius, cfg.min_gap)[0]
        full, n = reach_contacts(dx, cs, g, cfg.dhat, M)
        short, n_short = reach_contacts(dx, cs, g, cfg.dhat, 8)
        along = jax.vmap(lambda a: contact_gaps(x + a * dx, cs, m.radius, cfg.min_gap)[0])(alphas)
        return g, full, n, short, n_short, along

    g, full, n, short, n_short, along = run(x0, dx)
    g, along, valid, idx = np.asarray(g), np.asarray(along), np.asarray(cs.valid), np.asarray(cs.idx)
    kind = np.asarray(cs.kind)
    move = np.linalg.norm(np.asarray(dx), axis=1)[idx].max(axis=1)
    in_reach = valid & (g < cfg.dhat + 2 * move)
    n_in = int(np.sum(valid & (g < cfg.dhat)))
    assert 8 < n_in < int(in_reach.sum()) < int(valid.sum())  # the segment reaches rows beyond those inside d̂, not all
    counts = np.bincount(kind[in_reach], minlength=4)
    # the count: the smallest size whose slots hold every kind's rows and whose total holds them all
    holds = lambda a: a >= counts.sum() and all(s >= c for s, c in zip(kind_slots(a, cs.blocks), counts))
    want = next(a for a in range(M + 1) if holds(a))
    assert int(n) == want == int(n_short) and want >= int(in_reach.sum()) and want > 8
    for size, got in ((M, full), (8, short)):
        slots = kind_slots(size, cs.blocks)
        assert got.blocks == slots and got.idx.shape[0] == sum(slots)
        taken, start = np.asarray(got.valid), 0
        for k, s in enumerate(slots):  # each kind's slots hold its first rows of the set, in order
            rows = in_reach & (kind == k)
            keep = min(s, int(rows.sum()))
            assert taken[start:start + s].sum() == keep and taken[start:start + keep].all()
            np.testing.assert_array_equal(np.asarray(got.idx)[start:start + keep], idx[rows][:keep])
            assert (np.asarray(got.kind)[start:start + keep] == k).all()
            start += s
    assert np.asarray(full.valid).sum() == int(in_reach.sum())  # all of them, with every kind's rows in its slots
    outside = valid & ~in_reach
    assert outside.any() and np.all(along[:, outside] >= cfg.dhat)



def test_a_segment_whose_reach_set_overflows_is_cut_where_it_fits(active_system):
    """``reach_scale``: where the reach set of x → x + Δx needs more slots than ``size``, the
    largest s whose segment x → x + sΔx fits them: its set fits, a little more of the
    segment does not, and no row left out comes inside d̂ anywhere on the shorter segment.
    s is exactly 1 where the whole segment fits, and where the rows inside d̂ alone do not
    (no shorter segment helps: the step's overflow stands)."""
    sc, m, p, _, x0, cs = active_system
    cfg = Config()
    free = np.asarray(~m.fixed)[:, None]
    dx = jnp.asarray(np.random.default_rng(7).normal(size=x0.shape) * 4e-4 * free)
    g = jax.jit(lambda x: contact_gaps(x, cs, m.radius, cfg.min_gap)[0])(x0)
    n_in = int(reach_need(0 * dx, cs, g, cfg.dhat))  # the slots the rows inside d̂ need
    need = int(reach_need(dx, cs, g, cfg.dhat))
    size = (2 * n_in + need) // 2
    assert 2 * n_in <= size < need  # room for twice the rows inside d̂, not for all the segment reaches
    alphas = jnp.linspace(0.0, 1.0, 9)

    @partial(jax.jit, static_argnames="size")
    def run(dx, size):
        s = reach_scale(dx, cs, g, cfg.dhat, size)
        sub, n = reach_contacts(s * dx, cs, g, cfg.dhat, size)
        _, n_more = reach_contacts(1.001 * s * dx, cs, g, cfg.dhat, size)
        along = jax.vmap(lambda a: contact_gaps(x0 + a * s * dx, cs, m.radius, cfg.min_gap)[0])(alphas)
        return s, sub, n, n_more, along

    s, sub, n, n_more, along = run(dx, size)
    s = float(s)
    print(f"{n_in} slots inside d̂, {need} for the segment, {size} given: cut at s = {s:.4f} ({int(n)} slots)")
    assert 0.0 < s < 1.0 and int(n) <= size < int(n_more)
    taken = np.zeros(cs.idx.shape[0], bool)  # the rows the cut segment's set holds
    key = lambda c, i: (int(c.kind[i]),) + tuple(int(v) for v in c.idx[i])
    sub_np = jax.tree_util.tree_map(np.asarray, sub)
    cs_np = jax.tree_util.tree_map(np.asarray, cs)
    rows = {key(sub_np, i) for i in np.flatnonzero(sub_np.valid)}
    taken[[i for i in range(len(taken)) if key(cs_np, i) in rows]] = True
    left_out = np.asarray(cs.valid) & ~taken
    assert left_out.any() and np.all(np.asarray(along)[:, left_out] >= cfg.dhat)
    assert float(run(dx, need)[0]) == 1.0  # the whole segment fits
    assert float(run(dx, 2 * n_in - 1)[0]) == 1.0  # the rows inside d̂ take over half the slots: no cut

def _smallest_size_holding(counts, blocks):
    """By search: the smallest size whose kind slots hold ``counts`` and whose total holds their sum."""
    return next(a for a in range(sum(blocks) + 1)
                if a >= sum(counts) and all(s >= c for s, c in zip(kind_slots(a, blocks), counts)))


@pytest.mark.parametrize("size", [1, 20, 60, 150, 183])
def test_compaction_by_kind_keeps_each_kinds_rows_in_its_slots_and_counts_the_size_it_needs(size):
    """``compact_contacts`` on a set blocked by kind (as a query builds it): each kind's rows,
    in order, fill that kind's ``kind_slots``; the result is blocked by those slots, so its
    closest points are each kind's own formula and equal the weights of the same rows in the
    whole set; the count is the smallest size that holds every row (found by search), above
    the size exactly when some row is left out or there are more rows than the size."""
    blocks = (50, 120, 10, 3)
    rng = np.random.default_rng(size)
    kind = np.repeat(np.arange(4), blocks).astype(np.int8)
    idx = rng.integers(0, 40, size=(sum(blocks), 4)).astype(np.int32)
    mask = rng.random(sum(blocks)) < np.repeat([0.9, 0.5, 0.8, 1.0], blocks)
    cs = ContactSet(jnp.asarray(idx), jnp.asarray(kind), jnp.ones(sum(blocks), bool), blocks)
    sub, count = jax.jit(lambda c, m: compact_contacts(c, m, size))(cs, jnp.asarray(mask))
    slots = kind_slots(size, blocks)
    assert sub.blocks == slots and all(s <= b for s, b in zip(slots, blocks))
    assert all(s >= min(b, -(-size // KIND_FLOOR)) for s, b in zip(slots, blocks))  # no kind below the floor
    counts = [int(mask[kind == k].sum()) for k in range(4)]
    assert int(count) == _smallest_size_holding(counts, blocks)
    taken, start, kept = np.asarray(sub.valid), 0, 0
    for k, s in enumerate(slots):
        keep = min(s, counts[k])
        assert taken[start:start + s].sum() == keep and taken[start:start + keep].all()
        np.testing.assert_array_equal(np.asarray(sub.idx)[start:start + keep], idx[mask & (kind == k)][:keep])
        assert (np.asarray(sub.kind)[start:start + s] == k).all()
        start, kept = start + s, kept + keep
    # an overflow: some row left out, or more rows in all than the size (the slots add up to more)
    assert (int(count) > size) == (kept < sum(counts) or sum(counts) > size)
    # the blocked set's closest points (one formula per kind) are the whole set's
    x = jnp.asarray(rng.normal(size=(40, 3)))
    w_sub = np.asarray(contact_weights(gather_stencils(x, sub), sub))
    w_all = np.asarray(contact_weights(gather_stencils(x, cs), cs))
    rows = np.concatenate([np.flatnonzero(mask & (kind == k))[:min(s, counts[k])] for k, s in enumerate(slots)])
    np.testing.assert_allclose(w_sub[taken], w_all[rows], rtol=0, atol=1e-12)


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


@pytest.mark.parametrize("chunk", [64, 100, 512])
def test_gaps_up_to_each_blocks_last_valid_row_are_every_rows(active_system, monkeypatch, chunk):
    """The Newton loop's gaps over a candidate set (``used_row_gaps``: passes of GAP_CHUNK
    rows up to each block's last valid row) are contact_gaps' over every row: the same
    +∞, weights and normals for padding, the valid rows' to round-off; also with rows left
    out in the middle of a block and at a block's end, and with a last pass that overlaps
    the one before."""
    sc, m, p, x, x0, cs = active_system
    monkeypatch.setattr(S, "GAP_CHUNK", chunk)
    valid = np.asarray(cs.valid).copy()
    first_ee = cs.blocks[0]
    valid[5] = valid[first_ee + 3] = False  # holes inside the VT and EE blocks
    holes = ContactSet(cs.idx, cs.kind, jnp.asarray(valid), cs.blocks)
    for c in (cs, holes):
        assert c.idx.shape[0] > 2 * chunk and c.blocks is not None
        ref = jax.jit(lambda z, c: contact_gaps(z, c, m.radius, 3e-5))(x, c)
        got = jax.jit(lambda z, c: S.used_row_gaps(z, c, m.radius, 3e-5))(x, c)
        v = np.asarray(c.valid)
        assert np.all(np.isinf(np.asarray(got[0])[~v])) and np.all(np.isfinite(np.asarray(got[0])[v]))
        for a, b in zip(ref, got):
            a, b = np.asarray(a), np.asarray(b)
            np.testing.assert_array_equal(a[~v], b[~v])
            np.testing.assert_allclose(b[v], a[v], rtol=1e-13, atol=1e-17)
        assert np.sum(v) > 100 and np.abs(np.asarray(got[0])[v]).max() > 0


@pytest.mark.parametrize("chunk", [16, 64])
def test_line_search_phi_and_step_bound_over_the_used_rows_are_over_every_row(active_system, monkeypatch, chunk):
    """The line search's Φ (its barrier summed pass by pass up to each kind's last used slot)
    and the step bound without a geometry (single bounds the same way) equal Φ and the bound
    over every slot of a compacted set, to round-off; with a hole in a block too."""
    from ipcjax import line_search as LS
    from ipcjax import used_rows as P
    from ipcjax.problem import StepContext, StepProblem

    sc, m, p, x, x0, cs = active_system
    monkeypatch.setattr(P, "CHUNK", chunk)
    monkeypatch.setattr(LS, "BOUND_CHUNK", chunk)
    g = np.asarray(jax.jit(lambda z, c: contact_gaps(z, c, m.radius, 3e-5))(x, cs)[0])
    sub, n = compact_contacts(cs, jnp.asarray(g < 1.5e-3), 200)
    assert int(n) <= 200 and sub.blocks is not None
    cfg = Config()
    ctx = StepContext(x0=x0, y=x0 + DT**2 * p.gravity, dt=jnp.asarray(DT),
                      friction=jax.jit(friction_set)(x0, cs, m.radius, p, cfg))
    pb = StepProblem(m, p, Controls.empty(m.n_particles), ctx, cfg)
    dx = jnp.zeros_like(x).at[:81, 2].set(-1.5e-3)  # the film pressed onto the sphere: bounds below 1
    valid = np.asarray(sub.valid).copy()
    valid[2] = False  # a hole inside the VT slots
    for c in (sub, ContactSet(sub.idx, sub.kind, jnp.asarray(valid), sub.blocks)):
        phi_all = float(jax.jit(lambda z: incremental_potential(z, pb, c))(x))
        phi_used = float(jax.jit(lambda z: P.line_search_potential(z, pb, c))(x))
        assert phi_all > 0 and phi_used == pytest.approx(phi_all, rel=1e-14)
        geom = jax.jit(lambda z: LS.stencil_geometry(z, c, m.radius, cfg.min_gap))(x)
        b_all = float(jax.jit(lambda z, d: LS.step_bound(z, d, c, pb, geometry=geom))(x, dx))
        b_used = float(jax.jit(lambda z, d: LS.step_bound(z, d, c, pb))(x, dx))
        assert 0 < b_all < 1 and b_used == pytest.approx(b_all, rel=1e-12)


# ---------------------------------------------------------------- the sparse direct path (ipcjax.ldl)

def sparse_direction(g, hb):
    d = SparseLDL().direction(g, hb)
    return d.value, d.ok


def test_upper_triangle_is_the_dense_matrix(contact_system):
    """The host's coordinate form, duplicates summed, is the dense scatter's upper triangle:
    fixed particles' rows dropped, padded contact rows' zeros left out, diagonal kept."""
    import scipy.sparse as sp
    _, hb = contact_system(False)
    H = np.asarray(dense_hessian(hb))
    hbn = jax.tree_util.tree_map(np.asarray, hb)
    r, c, v = upper_triangle(hbn.diag, hbn.rows, hbn.blocks)
    assert np.all(r <= c) and np.all(c < H.shape[0]) and np.all(v != 0)
    U = sp.csc_matrix((v, (r, c)), shape=H.shape).toarray()
    assert rel_err(U, np.triu(H)) < 1e-14
    assert len(v) < 0.5 * sum(B.size for B in hbn.blocks)  # the padding really was dropped


def test_upper_csc_is_the_dense_matrix_and_keeps_its_pattern(contact_system):
    """The host's CSC matrix (kept pattern for the first groups + coordinate form for the
    rest) is the dense scatter's upper triangle; the pattern is built once per set of rows
    and another set of rows gets its own, right, pattern."""
    _, hb = contact_system(False)
    H = np.asarray(dense_hessian(hb))
    hbn = jax.tree_util.tree_map(np.asarray, hb)
    assert len(hbn.rows) > ldl.STATIC_GROUPS and hbn.rows[0].shape[0] > 0
    U = upper_csc(hbn.diag, hbn.rows, hbn.blocks)
    assert U.has_sorted_indices and U.shape == H.shape
    assert rel_err(U.toarray(), np.triu(H)) < 1e-14
    first = ldl.static_pattern(H.shape[0], hbn.rows[:ldl.STATIC_GROUPS])
    assert ldl.static_pattern(H.shape[0], [r.copy() for r in hbn.rows[:ldl.STATIC_GROUPS]]) is first
    # new values on the same rows reuse it; the matrix follows the values
    blocks2 = tuple(2.0 * b for b in hbn.blocks)
    U2 = upper_csc(2.0 * hbn.diag, hbn.rows, blocks2)
    assert rel_err(U2.toarray(), 2.0 * np.triu(H)) < 1e-14
    # other rows in the first group (one element dropped): another pattern, the right matrix
    rows3 = (hbn.rows[0][1:],) + tuple(hbn.rows[1:])
    blocks3 = (hbn.blocks[0][1:],) + tuple(hbn.blocks[1:])
    assert ldl.static_pattern(H.shape[0], rows3[:ldl.STATIC_GROUPS]) is not first
    hb3 = hb._replace(rows=tuple(jnp.asarray(r) for r in rows3), blocks=tuple(jnp.asarray(b) for b in blocks3))
    U3 = upper_csc(hbn.diag, rows3, blocks3)
    assert rel_err(U3.toarray(), np.triu(np.asarray(dense_hessian(hb3)))) < 1e-14
    assert rel_err(U3.toarray(), np.triu(H)) > 1e-6  # the dropped element really changed it


def test_sparse_direction_matches_the_cholesky_direction(contact_system):
    g, hb = contact_system(False)
    dense_solution = DenseCholesky().direction(g, dense_hessian(hb))
    dense = dense_solution.value
    sparse, ok_sparse = jax.jit(sparse_direction)(g, hb)
    assert bool(dense_solution.ok) and bool(ok_sparse)
    assert_nonzero(sparse)
    assert rel_err(sparse, dense) < 1e-10


def test_sparse_solve_tells_indefinite_from_singular(contact_system):
    """The exact Hessian away from a minimiser is indefinite: a failure for the Newton
    direction (as for Cholesky), a valid solve for the implicit VJP's exact Hessian."""
    _, hb = contact_system(True)
    H = np.asarray(dense_hessian(hb))
    assert np.linalg.eigvalsh(H).min() < 0
    rhs = jnp.asarray(np.random.default_rng(3).normal(size=H.shape[0]))
    solve = jax.jit(sparse_solve, static_argnums=2)
    u, status = solve(hb, rhs, True)
    assert int(status) == LinearStatus.NOT_POSITIVE_DEFINITE and np.all(np.isnan(np.asarray(u)))
    u, status = solve(hb, rhs, False)
    assert int(status) == LinearStatus.SUCCESSFUL
    assert rel_err(u, np.linalg.solve(H, np.asarray(rhs))) < 1e-8
    # the implicit VJP's solve on the sparse path, both Hessians, against the dense path
    sparse, dense = SparseLDL(), DenseCholesky()
    solve_sp = jax.jit(lambda hb, rhs, projection: sparse.solve(hb, rhs, projection).value, static_argnums=2)
    solve_d = jax.jit(lambda hb, rhs, projection: dense.solve(dense.init(hb), rhs, projection).value,
                      static_argnums=2)
    assert rel_err(solve_sp(hb, rhs, "exact"), solve_d(hb, rhs, "exact")) < 1e-8
    _, hb_p = contact_system(False)
    assert rel_err(solve_sp(hb_p, rhs, "projected"), solve_d(hb_p, rhs, "projected")) < 1e-10
    # a singular matrix (a zero row and column) is a failure even without the PD requirement
    F3 = H.shape[0]
    hb_sing = hb._replace(diag=hb.diag.at[0].set(0.0),
                          rows=tuple(jnp.where(r == 0, F3 + 5, r) for r in hb.rows))
    u, status = solve(hb_sing, rhs, False)
    assert int(status) == LinearStatus.SINGULAR and np.all(np.isnan(np.asarray(u)))


def test_the_positive_definite_solve_is_cholmods_keeps_its_analysis_and_names_its_failures(contact_system,
                                                                                          monkeypatch):
    """require_pd goes through CHOLMOD's supernodal Cholesky: its answer is QDLDL's to
    round-off; one symbolic analysis serves every matrix of one pattern; cvxopt's global
    options are left as found; a singular matrix, which CHOLMOD only calls "not positive
    definite", is named SINGULAR by QDLDL, an indefinite one NOT_POSITIVE_DEFINITE."""
    from cvxopt import cholmod

    _, hb = contact_system(False)
    d, rows, blocks = (np.asarray(hb.diag), [np.asarray(r) for r in hb.rows], [np.asarray(b) for b in hb.blocks])
    H = np.asarray(dense_hessian(hb))
    rhs = np.random.default_rng(7).normal(size=H.shape[0])
    U = upper_csc(d, rows, blocks)
    ldl._ANALYSES.clear()
    monkeypatch.setitem(cholmod.options, "supernodal", 0)  # somebody else's setting
    u = ldl.cholmod_solve(U, rhs)
    assert cholmod.options == {"supernodal": 0}
    u_q, status = ldl._qdldl_solve(U, rhs, True)
    assert u is not None and status == LinearStatus.SUCCESSFUL
    assert_nonzero(u)
    assert rel_err(u, u_q) < 1e-12 and rel_err(u, np.linalg.solve(H, rhs)) < 1e-10
    u2 = ldl.cholmod_solve(upper_csc(2.0 * d, rows, [2.0 * b for b in blocks]), rhs)  # same pattern
    assert len(ldl._ANALYSES) == 1 and rel_err(u2, 0.5 * u) < 1e-12
    # failures: CHOLMOD gives up (None), host_solve names why
    F3 = H.shape[0]
    sing = upper_csc(np.where(np.arange(F3) == 0, 0.0, d), [np.where(r == 0, F3 + 5, r) for r in rows], blocks)
    assert ldl.cholmod_solve(sing, rhs) is None
    # a failure on a kept pattern (H with a negative pivot, the same entries): the next
    # positive definite matrix of that pattern still gets its answer
    bad = U.copy()
    bad.data[bad.indptr[1] - 1] = -1.0  # (0, 0), the only entry of column 0
    assert bad.indices[bad.indptr[1] - 1] == 0 and ldl._pattern_key(bad) == ldl._pattern_key(U)
    assert ldl.cholmod_solve(bad, rhs) is None
    assert rel_err(ldl.cholmod_solve(U, rhs), u) < 1e-12
    u, status = ldl.host_solve(np.where(np.arange(F3) == 0, 0.0, d), [np.where(r == 0, F3 + 5, r) for r in rows],
                               blocks, rhs, True)
    assert status == LinearStatus.SINGULAR and np.all(np.isnan(u))
    _, hb_x = contact_system(True)
    u, status = ldl.host_solve(np.asarray(hb_x.diag), [np.asarray(r) for r in hb_x.rows],
                               [np.asarray(b) for b in hb_x.blocks], rhs, True)
    assert status == LinearStatus.NOT_POSITIVE_DEFINITE and np.all(np.isnan(u))


def test_sparse_solve_rejects_non_finite_input(contact_system):
    g, hb = contact_system(False)
    d = SparseLDL().direction(g.at[4].set(jnp.nan), hb)
    assert int(d.status) == LinearStatus.NON_FINITE_INPUT and not np.any(np.asarray(d.value))
    blocks = list(hb.blocks)
    blocks[0] = blocks[0].at[0, 0, 0].set(jnp.inf)
    assert int(SparseLDL().direction(g, hb._replace(blocks=tuple(blocks))).status) == LinearStatus.NON_FINITE_INPUT


def test_sparse_solve_under_vmap(contact_system):
    _, hb = contact_system(False)
    H = np.asarray(dense_hessian(hb))
    R = jnp.asarray(np.random.default_rng(5).normal(size=(3, H.shape[0])))
    U, status = jax.jit(jax.vmap(lambda r: sparse_solve(hb, r)))(R)
    assert np.all(np.asarray(status) == LinearStatus.SUCCESSFUL)
    assert rel_err(U, np.linalg.solve(H, np.asarray(R).T).T) < 1e-10


@pytest.mark.slow  # two rollout compilations (≈ 1 min); the backward solve itself is in the default suite above
def test_rollout_gradient_on_the_sparse_path_equals_the_dense_one():
    """The implicit VJP through a frictional contact rollout: the sparse backward solve
    gives the dense path's gradients."""
    sc = vertex_triangle_scene()
    x = sc.x.copy(); x[:3, 2] -= 0.0015
    v = np.zeros_like(x); v[:3] = [0.3, 0.1, -0.02]
    m = sc.model
    cap = C.initial_capacity(m.topology)
    ctl = stack_controls([Controls.empty(m.n_particles, tolerance=1e-12)] * 3)
    W = jnp.asarray(np.random.default_rng(1).normal(size=x.shape))
    grads = {}
    for cfg in (Config(), SPARSE):
        rollout = make_rollout(m, cfg, cap, round_fp32=False)

        def loss(p):
            frames, _, codes = rollout(p, jnp.asarray(x), jnp.asarray(v), ctl, DT)
            return jnp.sum(W * frames[-1]), codes

        (_, codes), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(Params.film_defaults())
        assert np.all(np.asarray(codes) == 0)
        grads[cfg.linear_solver] = g
    for name in ("youngs_modulus", "friction", "barrier_stiffness"):
        a, b = getattr(grads["sparse"], name), getattr(grads["dense"], name)
        assert_nonzero(a, name)
        assert rel_err(a, b) < 1e-8, name


def test_unknown_linear_solver_is_named():
    with pytest.raises(ValueError, match="linear_solver must be one of .*'sparse'.*got 'lu'"):
        Config(linear_solver="lu")


def test_the_cholmod_custom_call_is_built_here_and_solves_as_the_host_does(contact_system, tmp_path):
    """The Newton direction's solve inside XLA (ipcjax.cholmod_ffi): built on this machine
    with gcc, no host callback left in the direction's program, its answer the host
    solve's to round-off, one kept pattern serving a matrix of the same entries, and the
    same answers under jit and vmap."""
    from ipcjax import cholmod_ffi

    assert cholmod_ffi.available(), cholmod_ffi.why_not()
    assert cholmod_ffi.build(str(tmp_path)) == cholmod_ffi.build(str(tmp_path))  # built once, then found
    g, hb = contact_system(False)
    H = np.asarray(dense_hessian(hb))
    rhs = jnp.asarray(np.random.default_rng(11).normal(size=H.shape[0]))
    text = jax.jit(sparse_direction).lower(g, hb).as_text()
    assert cholmod_ffi.TARGET in text and "callback" not in text
    solve = jax.jit(cholmod_ffi.solve)
    u, status = solve(hb, rhs)
    assert int(status) == LinearStatus.SUCCESSFUL
    assert_nonzero(u)
    u_host, s_host = ldl.host_solve(np.asarray(hb.diag), [np.asarray(r) for r in hb.rows],
                                    [np.asarray(b) for b in hb.blocks], np.asarray(rhs), True)
    assert s_host == LinearStatus.SUCCESSFUL
    assert rel_err(u, u_host) < 1e-12 and rel_err(u, np.linalg.solve(H, np.asarray(rhs))) < 1e-10
    twice = hb._replace(diag=2.0 * hb.diag, blocks=tuple(2.0 * b for b in hb.blocks))
    assert rel_err(solve(twice, rhs)[0], 0.5 * np.asarray(u)) < 1e-12
    R = jnp.stack([rhs, -2.0 * rhs])
    U, S = jax.jit(jax.vmap(lambda r: cholmod_ffi.solve(hb, r)))(R)
    assert np.all(np.asarray(S) == LinearStatus.SUCCESSFUL) and rel_err(U[1], -2.0 * np.asarray(u)) < 1e-12
    sparse, ok = jax.jit(sparse_direction)(g, hb)
    with cholmod_ffi.switched_off():  # a new function: JAX keeps a function's trace across jit objects
        host = jax.jit(lambda g, hb: sparse_direction(g, hb)).lower(g, hb)
        assert "callback" in host.as_text() and cholmod_ffi.TARGET not in host.as_text()
        sparse_host, ok_host = host.compile()(g, hb)
    assert bool(ok) and bool(ok_host) and rel_err(sparse, sparse_host) < 1e-12


def test_the_cholmod_custom_call_names_its_failures(contact_system):
    """Where CHOLMOD's Cholesky fails, the custom call's own LDLᵀ names why, as QDLDL does
    on the host: a zero row SINGULAR, the exact indefinite Hessian NOT_POSITIVE_DEFINITE;
    a NaN or an infinity NON_FINITE_INPUT; each with NaN for u. A failure on a kept
    pattern leaves it serving the next positive definite matrix. Arguments of the wrong
    shape are an error that names the expected ones."""
    from ipcjax import cholmod_ffi

    solve = jax.jit(cholmod_ffi.solve)
    g, hb = contact_system(False)
    F3 = hb.diag.shape[0]
    rhs = jnp.asarray(np.random.default_rng(12).normal(size=F3))
    u, status = solve(hb, rhs)
    assert int(status) == LinearStatus.SUCCESSFUL

    def fails(h, r, expected):
        v, s = solve(h, r)
        assert int(s) == expected, LinearStatus.describe(int(s))
        assert np.all(np.isnan(np.asarray(v)))

    fails(hb._replace(diag=hb.diag.at[0].set(0.0), rows=tuple(jnp.where(r == 0, F3 + 5, r) for r in hb.rows)),
          rhs, LinearStatus.SINGULAR)
    _, hb_exact = contact_system(True)
    assert np.linalg.eigvalsh(np.asarray(dense_hessian(hb_exact))).min() < 0
    fails(hb_exact, rhs, LinearStatus.NOT_POSITIVE_DEFINITE)
    fails(hb._replace(diag=hb.diag.at[3].set(-1e9)), rhs, LinearStatus.NOT_POSITIVE_DEFINITE)  # hb's pattern
    again, status = solve(hb, rhs)
    assert int(status) == LinearStatus.SUCCESSFUL and rel_err(again, u) < 1e-14
    fails(hb, rhs.at[2].set(jnp.nan), LinearStatus.NON_FINITE_INPUT)
    fails(hb._replace(blocks=(hb.blocks[0].at[0, 1, 1].set(jnp.inf),) + tuple(hb.blocks[1:])), rhs,
          LinearStatus.NON_FINITE_INPUT)
    # name_failure=False (the exact tangent tried first): a failed factorization is
    # NOT_POSITIVE_DEFINITE, the zero row's too, without the LDLᵀ; a success is the same
    tried = jax.jit(partial(cholmod_ffi.solve, name_failure=False))
    singular = hb._replace(diag=hb.diag.at[0].set(0.0), rows=tuple(jnp.where(r == 0, F3 + 5, r) for r in hb.rows))
    for h, r, expected in ((singular, rhs, LinearStatus.NOT_POSITIVE_DEFINITE),
                           (hb_exact, rhs, LinearStatus.NOT_POSITIVE_DEFINITE),
                           (hb, rhs.at[2].set(jnp.nan), LinearStatus.NON_FINITE_INPUT)):
        v, s = tried(h, r)
        assert int(s) == expected and np.all(np.isnan(np.asarray(v))), LinearStatus.describe(int(s))
    v, s = tried(hb, rhs)
    assert int(s) == LinearStatus.SUCCESSFUL and np.array_equal(np.asarray(v), np.asarray(u))
    out = (jax.ShapeDtypeStruct((F3,), jnp.float64), jax.ShapeDtypeStruct((), jnp.int32))
    call = jax.ffi.ffi_call(cholmod_ffi.TARGET, out)
    rows = hb.rows[0].astype(jnp.int32)
    with pytest.raises(Exception, match=r"blocks \(E, k, k\) f64"):
        call(hb.diag, rhs, rows, jnp.zeros(rows.shape + (rows.shape[1] + 1,)))


def test_contact_elements_that_add_nothing_are_dropped_unread(contact_system):
    """The assembly gives every barrier and friction element that adds nothing (a padded or
    unloaded row, a stencil beyond d̂) the rows of a fixed particle, and only those: they
    are exactly the elements whose block is all zeros. The custom call drops them without
    reading their blocks, as the host solve drops their entries: a NaN there changes
    nothing, bit for bit, where a NaN in a block it reads is NON_FINITE_INPUT; and the
    used elements moved to other slots in the same order give the same answer bit for bit
    through the kept pattern (its scatter map holds each entry's place in its block)."""
    from ipcjax import cholmod_ffi
    from ipcjax.potential import TERMS

    g, hb = contact_system(False)
    F3 = hb.diag.shape[0]
    names = [t.name for t in TERMS if t.name != "inertia"]  # the groups of blocks, in order
    for name in ("barrier", "friction"):
        k = names.index(name)
        rows, B = np.asarray(hb.rows[k]), np.asarray(hb.blocks[k])
        dropped, zero = np.all(rows >= F3, axis=1), np.all(B == 0, axis=(1, 2))
        assert dropped.any() and (~dropped).any(), name
        assert np.array_equal(dropped, zero), name
    solve = jax.jit(cholmod_ffi.solve)
    rhs = jnp.asarray(np.random.default_rng(13).normal(size=F3))
    u, status = solve(hb, rhs)
    assert int(status) == LinearStatus.SUCCESSFUL
    k = names.index("barrier")
    e = int(np.flatnonzero(np.all(np.asarray(hb.rows[k]) >= F3, axis=1))[0])
    nan_dropped = hb._replace(blocks=tuple(b.at[e].set(jnp.nan) if i == k else b for i, b in enumerate(hb.blocks)))
    v, s = solve(nan_dropped, rhs)
    assert int(s) == LinearStatus.SUCCESSFUL and np.array_equal(np.asarray(v), np.asarray(u))
    # the used elements moved to other slots, in the same order: the kept pattern serves them
    order = jnp.asarray([e] + [i for i in range(hb.rows[k].shape[0]) if i != e])
    moved = hb._replace(rows=tuple(r[order] if i == k else r for i, r in enumerate(hb.rows)),
                        blocks=tuple(b[order] if i == k else b for i, b in enumerate(hb.blocks)))
    assert np.array_equal(np.asarray(solve(moved, rhs)[0]), np.asarray(u))
    u_host, s_host = ldl.host_solve(np.asarray(hb.diag), [np.asarray(r) for r in nan_dropped.rows],
                                    [np.asarray(b) for b in nan_dropped.blocks], np.asarray(rhs), True)
    assert s_host == LinearStatus.SUCCESSFUL and rel_err(u_host, u) < 1e-12
    used = int(np.flatnonzero(~np.all(np.asarray(hb.rows[k]) >= F3, axis=1))[0])
    nan_read = hb._replace(blocks=tuple(b.at[used, 0, 0].set(jnp.nan) if i == k else b
                                        for i, b in enumerate(hb.blocks)))
    assert int(solve(nan_read, rhs)[1]) == LinearStatus.NON_FINITE_INPUT


def test_the_custom_calls_pattern_by_particles_is_its_pattern_by_entries(contact_system):
    """The custom call builds a new assembly pattern (CSC structure, each kept entry's place)
    from the particles where every kept element's rows come in particle triples, as the
    assembly's always do, and from the entries otherwise. Both builds give the same arrays:
    on the film's projected and exact blocks, and on random groups with repeated particles,
    fixed particles and all-zero blocks. Rows out of triples take the build by entries, in
    the handler too: the same matrix with each element's first two DOFs swapped solves to
    the same u."""
    from ipcjax import cholmod_ffi

    for exact in (False, True):
        _, hb = contact_system(exact)
        F3 = hb.diag.shape[0]
        rows, blocks = [np.asarray(r) for r in hb.rows], [np.asarray(b) for b in hb.blocks]
        assert any(np.any(r >= F3) for r in rows) and any(np.any(r < F3) for r in rows)
        assert cholmod_ffi.pattern_builds_agree(F3, rows, blocks) == 0
    rng = np.random.default_rng(14)
    seen = dict(repeated=0, fixed=0, zero=0)
    for _ in range(60):
        n_part = int(rng.integers(1, 25))
        rows, blocks = [], []
        for _ in range(int(rng.integers(1, 4))):
            s, E = int(rng.integers(1, 5)), int(rng.integers(1, 30))
            P = rng.integers(0, n_part + 3, size=(E, s))  # ≥ n_part: a fixed particle
            rows.append(np.where(P[..., None] < n_part, 3 * P[..., None] + np.arange(3),
                                 3 * n_part + np.arange(3)).reshape(E, 3 * s))
            blocks.append(rng.normal(size=(E, 3 * s, 3 * s)) * (rng.random((E, 1, 1)) < 0.8))
            seen["repeated"] += int(np.sum([len(set(p)) < s for p in P]))
            seen["fixed"] += int(np.sum(P >= n_part))
            seen["zero"] += int(np.sum(np.all(blocks[-1] == 0, axis=(1, 2))))
        assert cholmod_ffi.pattern_builds_agree(3 * n_part, rows, blocks) == 0
    assert min(seen.values()) > 0, seen
    assert cholmod_ffi.pattern_builds_agree(6, [np.array([[1, 0, 2]])], [np.eye(3)[None]]) == 1
    assert cholmod_ffi.pattern_builds_agree(6, [np.array([[0, 1, 2]])], [np.full((1, 3, 3), np.nan)]) == 3
    # the handler on rows out of triples: swap the first two DOFs of every element
    _, hb = contact_system(False)
    rhs = jnp.asarray(np.random.default_rng(15).normal(size=hb.diag.shape[0]))
    u, status = jax.jit(cholmod_ffi.solve)(hb, rhs)
    swap = lambda k: np.r_[1, 0, 2:k]
    swapped = hb._replace(rows=tuple(r[:, swap(r.shape[1])] for r in hb.rows),
                          blocks=tuple(b[:, swap(b.shape[1])][:, :, swap(b.shape[1])] for b in hb.blocks))
    assert cholmod_ffi.pattern_builds_agree(hb.diag.shape[0], swapped.rows, swapped.blocks) == 1
    v, s = jax.jit(cholmod_ffi.solve)(swapped, rhs)
    assert int(status) == int(s) == LinearStatus.SUCCESSFUL
    assert_nonzero(u)
    assert rel_err(v, u) < 1e-12


def test_without_the_custom_call_the_sparse_solve_warns_and_takes_the_host_callback(contact_system, monkeypatch,
                                                                                     tmp_path):
    """A machine where the custom call cannot be built (here: pretended) gets the host
    callback and one warning that names why; no compiler is a NativeBuildError naming it;
    an unwritable cache folder builds under the temporary folder instead."""
    from ipcjax import cholmod_ffi, linear_solvers

    g, hb = contact_system(False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(cholmod_ffi.ENV_CACHE, str(blocker / "native"))  # cannot be created
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    built = cholmod_ffi.build()  # an unwritable cache folder: built under the temporary folder instead
    assert built.startswith(str(tmp_path / "ipcjax-native-")) and os.path.exists(built)
    monkeypatch.setenv("CC", "no-such-compiler-ipcjax")
    with pytest.raises(cholmod_ffi.NativeBuildError, match="no-such-compiler-ipcjax"):
        cholmod_ffi.build()
    monkeypatch.setattr(cholmod_ffi, "_state", {"why": "pretended: no compiler"})
    monkeypatch.setattr(linear_solvers, "_fallback_warned", False)
    assert not cholmod_ffi.available() and cholmod_ffi.why_not() == "pretended: no compiler"
    with pytest.warns(RuntimeWarning, match="pretended: no compiler"):
        lowered = jax.jit(lambda g, hb: sparse_direction(g, hb)).lower(g, hb)
    assert "callback" in lowered.as_text()
    dx, ok = lowered.compile()(g, hb)
    assert bool(ok)
    assert_nonzero(dx)

"""One IPC timestep (docs/spec.md §6 small reference solves): gaps, bounds, rejections, retries."""
import ipctk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax import candidates as C
from ipcjax import ensemble as E
from ipcjax.energies.bending import dihedral_angle
from ipcjax.line_search import step_bound
from ipcjax.model import Config, Controls, Params
from ipcjax.newton import query_contacts
from ipcjax.potential import TERMS, gradient_and_blocks, gradient_and_hessian, incremental_potential, potential_terms
from ipcjax.problem import StepContext, StepInputs, StepProblem
from ipcjax.result import RETRYABLE, StepCode
from ipcjax.stencils import friction_set
from ipcjax.step import CandidateCache, advance, carried_step, check_geometry, make_state, step, step_problem
from scenes.film import edge_edge_scene, hinge_scene, vertex_triangle_scene
from tests.helpers import assert_nonzero, central_gradient, fp32_ulp, rel_err
from tests.test_ensemble import members_equal_their_single_steps

DT = 1.0 / 240.0
CFG = Config()
TIGHT = 5e-7  # m: the specification's post-release tolerance (0.0005 mm, docs/spec.md §5)


def _min_vt_distance(x, n_film=3):
    """Independent oracle: smallest film-vertex/obstacle-triangle and edge–edge distance (ipctk)."""
    x = np.asarray(x, np.float64)
    d = []
    for p in range(n_film):
        for tri in ([3, 4, 5],) if len(x) == 6 else ([3, 4, 5], [3, 6, 4]):
            d.append(np.sqrt(ipctk.point_triangle_distance(x[p], *x[tri])))
    return min(d)


def _min_ee_distance(x):
    x = np.asarray(x, np.float64)
    film_edges = [(0, 1), (1, 2), (0, 2)]
    ridge_edges = [(3, 4), (3, 5), (4, 5), (3, 6), (4, 6)]
    return min(np.sqrt(ipctk.edge_edge_distance(x[a], x[b], x[c], x[d])) for a, b in film_edges for c, d in ridge_edges)


def _run(sc, steps, params=None, config=CFG, tol=TIGHT):
    m = sc.model
    st = make_state(sc.x, sc.v)
    ctl = Controls.empty(m.n_particles, tolerance=tol)
    params = Params.film_defaults() if params is None else params
    out, cap = [], None
    for i in range(steps):
        st, rep = advance(m, params, st, ctl, DT, config=config, capacity=cap, validate=(i == 0))
        assert rep.ok, rep.reason
        cap = rep.capacity
        out.append((np.asarray(st.x), rep))
    return out


def test_vertex_triangle_scene_keeps_the_gap():
    out = _run(vertex_triangle_scene(), 12)
    dists = [_min_vt_distance(x) for x, _ in out]
    assert min(dists) > CFG.min_gap  # mid-surface distance > 30 µm at every step
    assert dists[-1] < 2e-3  # the triangle did come down into the barrier range
    assert out[0][1].min_step_bound < 1.0  # the first step was limited by the bound


def test_two_members_of_a_contact_scene_equal_their_single_steps():
    """ipcjax.ensemble: a vertex falling onto a triangle, two members with different speeds
    and stiffnesses, one vmapped program with no host callback: each member equals its own
    step to round-off (measured 0 m on this CPU); a failed member is named; the host solver
    is refused. Here, after the test above, the single step's program is already compiled;
    the coarse bag's ensemble is tests/test_ensemble.py's (slow)."""
    sc = vertex_triangle_scene()
    m = sc.model
    ctl = Controls.empty(m.n_particles, tolerance=1e-9)
    s0 = make_state(sc.x, sc.v)
    s1 = make_state(sc.x, sc.v * 1.5)
    p0 = Params.film_defaults()
    cap = C.initial_capacity(m.topology)  # advance()'s in the test above, so its program is shared
    diff = members_equal_their_single_steps(
        m, [p0, p0._replace(youngs_modulus=jnp.asarray(2 * 315e6))], [s0, s1], [ctl, ctl], Config(), cap)
    assert diff <= 4 * fp32_ulp(s0.x), diff  # to four FP32 steps: batched code may round otherwise

    # a member whose step fails (a non-finite velocity) keeps its input state and is named,
    # beside a member that steps; the same program
    P = E.stack([p0, p0])
    S = E.stack([s0, s1._replace(v=s1.v.at[0, 2].set(jnp.nan))])
    Cs = E.stack([ctl, ctl])
    out, info = E.ensemble_step(m, P, S, Cs, DT, config=Config(), capacity=cap)
    codes = np.asarray(info.code)
    assert codes[0] == 0 and codes[1] != 0, codes  # the NaN fails the factorization (measured)
    np.testing.assert_array_equal(np.asarray(out.x[1]), np.asarray(S.x[1]))
    assert np.max(np.abs(np.asarray(out.x[0]) - np.asarray(s0.x))) > 1e-6
    with pytest.raises(E.MemberFailed, match=f"ensemble member 1 failed its step: {StepCode.describe(codes[1])}"):
        E.check_members(info)
    with pytest.raises(ValueError, match="linear solve inside XLA"):
        E.ensemble_step(m, P, S, Cs, DT, config=Config(linear_solver="sparse"), capacity=cap)
    with pytest.raises(ValueError, match="fixed capacity"):
        E.ensemble_step(m, P, S, Cs, DT, config=Config(), capacity=None)
    with pytest.raises(ValueError, match="same number of members"):
        E.ensemble_step(m, E.stack([p0] * 3), S, Cs, DT, config=Config(), capacity=cap)
    with pytest.raises(ValueError, match="must be stacked over the members"):
        E.ensemble_step(m, p0, S, Cs, DT, config=Config(), capacity=cap)


def test_subdivided_members_equal_the_host_driver():
    """ipcjax.ensemble.ensemble_rollout: advance()'s subdivision as a bounded loop inside
    one vmapped program over two steps (Constant schedule). With 6 Newton iterations per
    try the vertex–triangle steps must be halved: member 0 (4× the speed) down to depth 5,
    member 1 to depth 3 (measured). Each member equals two advance() calls with the same
    substeps, depth and iterations, its positions, velocities and kept frames to four FP32
    steps (bit for bit on this CPU); a member with a NaN velocity fails at step 0 without retries, keeps its
    input state, is skipped at step 1 and is named; the program calls no host. The
    capacity growth on overflow is tests/test_ensemble.py's (a stand-in program, and the
    coarse bag, slow)."""
    sc = vertex_triangle_scene()
    m = sc.model
    ctl = Controls.empty(m.n_particles, tolerance=1e-9)
    p0 = Params.film_defaults()
    cfg = Config(max_newton=6)
    cap = C.initial_capacity(m.topology)  # advance()'s above, so its step program is shared
    states = [make_state(sc.x, sc.v * 4), make_state(sc.x, sc.v), make_state(sc.x, sc.v)]
    states[2] = states[2]._replace(v=states[2].v.at[0, 2].set(jnp.nan))
    args = (E.stack([p0] * 3), E.stack(states), E.stack([ctl] * 3), E.Constant())
    run, cap_out = E.ensemble_rollout(m, *args, dt=DT, steps=2, config=cfg, capacity=cap)
    assert cap_out == cap
    rep = run.reports
    for k in (0, 1):
        s = states[k]
        for i in range(2):
            s, r = advance(m, p0, s, ctl, DT, config=cfg, capacity=cap, validate=False)
            assert r.ok and r.substeps > 1 and r.reallocations == 0
            got = (int(rep.code[k, i]), int(rep.substeps[k, i]), int(rep.max_depth[k, i]), int(rep.iterations[k, i]))
            assert got == (0, r.substeps, r.max_depth, r.iterations), (k, i)  # the same tree of substeps
            # the stored positions to a few FP32 steps (measured: bit for bit); the tries that
            # failed differ by round-off (measured: up to 4 line-search trials of a try at the
            # Newton cap, a step bound 2e-13 relative off: batched code rounds otherwise)
            assert np.abs(np.asarray(run.frames[k, i]) - np.asarray(s.x)).max() <= 4 * fp32_ulp(s.x)
            assert float(rep.min_gap[k, i]) == pytest.approx(r.min_gap, rel=1e-6)
            assert float(run.times[k, i]) == float(s.t)
        assert np.abs(np.asarray(run.state.x[k]) - np.asarray(s.x)).max() <= 4 * fp32_ulp(s.x)
        assert np.abs(np.asarray(run.state.v[k]) - np.asarray(s.v)).max() <= 4 * fp32_ulp(s.x) / DT
        assert float(run.state.t[k]) == float(s.t)
    assert int(rep.max_depth[0, 0]) > int(rep.max_depth[1, 0]) > 0
    assert list(np.asarray(run.failed_at)) == [-1, -1, 0] and list(np.asarray(run.code)[:2]) == [0, 0]
    assert int(run.code[2]) & ~int(RETRYABLE), StepCode.describe(int(run.code[2]))  # a non-retryable code
    assert int(rep.tries[2, 0]) == 1 and int(rep.substeps[2, 0]) == 0  # a NaN is not retried
    assert int(rep.tries[2, 1]) == 0  # and the failed member is not stepped again
    for field in ("x", "v", "t"):
        np.testing.assert_array_equal(np.asarray(getattr(run.state, field)[2]), np.asarray(getattr(states[2], field)))
    with pytest.raises(E.MemberFailed, match="ensemble member 2 failed its step"):
        E.check_members(run)
    one = (p0, states[0], ctl)
    assert E.host_callbacks(lambda *a: E.subdivided_step(m, *a, DT, config=cfg, capacity=cap), *one) == []
    with pytest.raises(ValueError, match=r"max_subdivisions must be in \[0, 30\]"):
        E.ensemble_rollout(m, *args, dt=DT, steps=2, config=Config(max_subdivisions=31), capacity=cap)
    with pytest.raises(ValueError, match="linear solve inside XLA"):
        E.ensemble_rollout(m, *args, dt=DT, steps=2, config=Config(linear_solver="sparse"), capacity=cap)
    with pytest.raises(ValueError, match=r"keep_every \(3\) must divide steps \(2\)"):
        E.ensemble_rollout(m, *args, dt=DT, steps=2, keep_every=3, config=cfg, capacity=cap)


def test_edge_edge_scene_keeps_the_gap():
    out = _run(edge_edge_scene(), 12)
    dists = [_min_ee_distance(x) for x, _ in out]
    assert min(dists) > CFG.min_gap
    assert dists[-1] < 2e-3


def test_fast_crossing_attempt_is_bounded_below_half():
    sc = vertex_triangle_scene()
    m = sc.model
    x = jnp.asarray(sc.x)
    gap0 = float(sc.x[0, 2]) - CFG.min_gap
    dx = jnp.zeros_like(x).at[0, 2].set(-2.0 * (gap0 + CFG.min_gap) - 1e-4)  # through the face

    @jax.jit  # one program (op by op it was hundreds of small compilations)
    def bound(x, dx):
        cs, _ = query_contacts(x, x + dx, m, CFG, C.initial_capacity(m.topology))
        problem = step_problem(m, CFG, StepInputs(Params.film_defaults(), x, jnp.zeros_like(x),
                                                  Controls.empty(m.n_particles), jnp.asarray(DT)), cs)
        return step_bound(x, dx, cs, problem)

    a = float(bound(x, dx))
    assert 0.0 < a < 0.5
    # and a whole step at 20 m/s (8 cm per step through a 2 mm gap) keeps the gap
    fast = vertex_triangle_scene(speed=20.0)
    out = _run(fast, 2)
    assert out[0][1].min_step_bound < 0.5
    assert min(_min_vt_distance(x) for x, _ in out) > CFG.min_gap


def test_initial_overlap_is_rejected_and_input_untouched():
    sc = vertex_triangle_scene()
    x = sc.x.copy()
    x[0, 2] = 1e-5  # 10 µm above the obstacle: closer than min_gap
    keep = x.copy()
    st = make_state(x)
    with pytest.raises(ValueError, match=r"initial overlap: vertex 0 – triangle \(3, 4, 5\)"):
        advance(sc.model, Params.film_defaults(), st, Controls.empty(6), DT)
    assert np.array_equal(x, keep)


def test_edge_through_face_is_rejected():
    sc = vertex_triangle_scene()
    x = sc.x.copy()
    x[0, 2] = -0.003  # vertex 0 below the obstacle plane: edges (0,1), (0,2) pierce it
    with pytest.raises(ValueError, match="edge-through-face penetration"):
        check_geometry(sc.model, x)


def test_failed_step_returns_input_state_unchanged():
    sc = vertex_triangle_scene(speed=20.0)
    m = sc.model
    x_in, v_in = sc.x.copy(), sc.v.copy()
    st = make_state(x_in, v_in)
    cfg = Config(max_newton=1, max_subdivisions=0)
    new, rep = advance(m, Params.film_defaults(), st, Controls.empty(6, tolerance=TIGHT), DT, config=cfg)
    assert not rep.ok and rep.code & StepCode.ITERATION_CAP
    assert "iteration cap" in rep.reason
    assert new is st and np.array_equal(np.asarray(new.x), x_in.astype(np.float32))
    assert np.array_equal(x_in, sc.x) and np.array_equal(v_in, sc.v)
    # the jitted core reports the same and keeps its input too
    out, info = step(m, Params.film_defaults(), st, Controls.empty(6, tolerance=TIGHT), DT, config=cfg,
                     capacity=C.initial_capacity(m.topology))
    assert int(info.code) & StepCode.ITERATION_CAP
    assert np.array_equal(np.asarray(out.x), np.asarray(st.x))


def test_subdivision_rescues_an_eight_iteration_cap():
    sc = vertex_triangle_scene(speed=20.0)
    cfg = Config(max_newton=8)
    st = make_state(sc.x, sc.v)
    new, rep = advance(sc.model, Params.film_defaults(), st, Controls.empty(6, tolerance=TIGHT), DT, config=cfg)
    assert rep.ok, rep.reason
    assert rep.max_depth >= 1 and rep.substeps >= 2
    assert float(new.t) == pytest.approx(DT)
    assert _min_vt_distance(np.asarray(new.x)) > CFG.min_gap


def test_hinge_scene_relaxes_its_angle():
    sc = hinge_scene()
    m = sc.model
    h = np.asarray(m.hinges)[0]
    theta = lambda x: float(np.degrees(dihedral_angle(*np.asarray(x, np.float64)[h])))
    start = theta(sc.x)
    assert abs(abs(start) - 14.036) < 1e-3
    out = _run(sc, 12, Params.film_defaults(gravity=(0.0, 0.0, 0.0)))
    end = theta(out[-1][0])
    assert abs(end) < 0.5 * abs(start)


def test_determinism_and_no_recompilation():
    sc = vertex_triangle_scene()
    m = sc.model
    cap = C.initial_capacity(m.topology)
    st = make_state(sc.x, sc.v)
    ctl = Controls.empty(6, tolerance=TIGHT)
    p = Params.film_defaults()
    a, _ = step(m, p, st, ctl, DT, config=CFG, capacity=cap)
    n_compiled = step._cache_size()
    b, _ = step(m, p, st, ctl, DT, config=CFG, capacity=cap)
    c, _ = step(m, p, a, ctl, DT / 2, config=CFG, capacity=cap)  # new values, same shapes
    assert step._cache_size() == n_compiled
    assert np.array_equal(np.asarray(a.x), np.asarray(b.x)) and np.array_equal(np.asarray(a.v), np.asarray(b.v))


@pytest.mark.parametrize("cfg", [Config(), Config(membrane="stvk", bending="discrete_shell")])
def test_assembled_gradient_matches_autodiff_and_central_differences(cfg):
    """§6: assembled-energy gradient against autodiff and central differences, in contact;
    with the default models also each term of TERMS alone against autodiff of its value."""
    sc = vertex_triangle_scene()
    m = sc.model
    rng = np.random.default_rng(0)
    x = sc.x.copy()
    x[:3] += rng.normal(size=(3, 3)) * 1e-4
    x[0, 2] = 4e-4  # inside the barrier range of the obstacle
    x0 = sc.x.copy(); x0[0, 2] = 5e-4
    x, x0 = jnp.asarray(x), jnp.asarray(x0)
    p = Params.film_defaults()
    cap = C.initial_capacity(m.topology)
    cs, _ = jax.jit(lambda a, b: query_contacts(a, b, m, cfg, cap))(x0, x)  # jitted: one program, not
    ctl = Controls.empty(6)._replace(                                        # hundreds op by op
        support_index=jnp.array([1], jnp.int32), support_k=jnp.array([5.0]),
        support_target=jnp.array([[0.011, 0.001, 0.009]]))
    y = x0 + jnp.asarray(rng.normal(size=(6, 3))) * 1e-4
    ctx = StepContext(x0=x0, y=y, dt=jnp.asarray(DT),
                      friction=jax.jit(lambda a: friction_set(a, cs, m.radius, p, cfg))(x0))
    assert float(jnp.max(ctx.friction.load)) > 0  # friction is active in this configuration
    problem = StepProblem(model=m, params=p, controls=ctl, context=ctx, config=cfg)
    phi = jax.jit(lambda z: incremental_potential(z, problem, cs))
    g, H = jax.jit(lambda z: gradient_and_hessian(z, problem, cs))(x)
    free = np.asarray(m.free_particles)
    g_ad = np.asarray(jax.grad(phi)(x))[free].reshape(-1)
    assert_nonzero(g)
    assert rel_err(g, g_ad) < 1e-9
    fd = central_gradient(lambda z: float(phi(jnp.asarray(z))), np.asarray(x), h=1e-8)[free].reshape(-1)
    assert rel_err(g, fd) < 1e-6
    assert np.linalg.eigvalsh(np.asarray(H)).min() > 0  # SPD: inertia + PSD terms
    if cfg != Config():
        return
    # each term of TERMS alone (the default models): its assembled elements against autodiff of its value
    per_term = jax.jit(lambda z: tuple((gradient_and_blocks(z, problem, cs, terms=(t,))[0],
                                        jax.grad(lambda z: potential_terms(z, problem, cs)[t.name])(z)[free])
                                       for t in TERMS))(x)
    names = []  # the terms' names, in order, from a trace (eval_shape), not from running it op by op
    jax.eval_shape(lambda z: names.extend(potential_terms(z, problem, cs)), x)
    assert names == [t.name for t in TERMS]
    for t, (g_t, g_t_ad) in zip(TERMS, per_term):
        if t.name in ("bending", "tie"):  # one triangle, no hinge, no tie in this scene: both are zero
            assert not np.any(np.asarray(g_t)) and not np.any(np.asarray(g_t_ad))
            continue
        assert_nonzero(g_t, t.name)
        assert rel_err(g_t, np.asarray(g_t_ad).reshape(-1)) < 1e-9, t.name


def test_a_carried_candidate_set_skips_the_step_start_query_and_lands_where_a_fresh_one_does():
    """``carried_step`` from the last step's candidate set: x₀ inside the box it was queried
    for ± skin/2 makes no step-start query and ends where the step with a fresh query ends;
    the same set with its box moved away from x₀, or a carry that holds nothing, queries
    afresh and gives that step bit for bit. ``advance`` keeps the set in the
    ``CandidateCache`` it is given and uses it for the same model object, config and
    capacity only."""
    sc = vertex_triangle_scene()
    m, p = sc.model, Params.film_defaults()
    ctl = Controls.empty(6, tolerance=TIGHT)
    st0 = make_state(sc.x, sc.v)
    cache = CandidateCache()
    assert cache.for_step(m, CFG, C.initial_capacity(m.topology)) is None
    st1, rep1 = advance(m, p, st0, ctl, DT, config=CFG, candidates=cache)
    assert rep1.ok and rep1.queries >= 1
    cap, carry = rep1.capacity, cache.for_step(m, CFG, rep1.capacity)
    assert carry is not None and bool(carry.held)
    fresh, info_f = step(m, p, st1, ctl, DT, config=CFG, capacity=cap)
    kept, info_k, carry2 = carried_step(m, p, st1, ctl, DT, carry=carry, config=CFG, capacity=cap)
    assert int(info_f.code) == int(info_k.code) == 0 and bool(carry2.held)
    assert int(info_f.queries) >= 1 and int(info_k.queries) == int(info_f.queries) - 1
    np.testing.assert_allclose(np.asarray(kept.x), np.asarray(fresh.x), rtol=0, atol=4 * fp32_ulp(0.01))
    assert float(info_k.min_gap) > 0 and float(info_k.min_gap) == pytest.approx(float(info_f.min_gap))
    lo, hi = carry.box
    for away in (carry._replace(box=(lo + 1.0, hi + 1.0)), carry._replace(held=jnp.bool_(False))):
        out, info, _ = carried_step(m, p, st1, ctl, DT, carry=away, config=CFG, capacity=cap)
        assert int(info.queries) == int(info_f.queries)
        assert np.array_equal(np.asarray(out.x), np.asarray(fresh.x))
        assert int(info.iterations) == int(info_f.iterations)
    # the driver: the cache's set serves the next call, not another config, capacity or model object
    st2, rep2 = advance(m, p, st1, ctl, DT, config=CFG, capacity=cap, candidates=cache, validate=False)
    assert rep2.ok and rep2.queries == int(info_k.queries)
    assert np.array_equal(np.asarray(st2.x), np.asarray(kept.x))
    assert cache.for_step(m, CFG, cap) is not None  # the second step's set, in place of the first's
    other_model = vertex_triangle_scene().model
    assert cache.for_step(m, Config(skin=2e-3), cap) is None
    assert cache.for_step(m, CFG, cap._replace(active=cap.active + 1)) is None
    assert cache.for_step(other_model, CFG, cap) is None
    _, rep3 = advance(other_model, p, st1, ctl, DT, config=CFG, capacity=cap, candidates=cache, validate=False)
    assert rep3.ok and rep3.queries == int(info_f.queries)
    with pytest.raises(TypeError, match="CandidateCache"):  # e.g. the carry itself: refused before any solve
        advance(m, p, st1, ctl, DT, config=CFG, capacity=cap, candidates=carry)


def test_the_empty_carry_first_made_inside_a_trace_is_an_array_every_later_step_can_use():
    """``step``'s empty candidate carry is made once per capacity and shared. Made first
    inside a trace (an ensemble's step under ``jit``), it is still a concrete array: a
    tracer cached there leaked into the next step outside that trace, and every slow
    ensemble test failed with an UnexpectedTracerError."""
    from ipcjax.step import _empty_carry

    m = vertex_triangle_scene().model
    cap = C.initial_capacity(m.topology)
    cap = cap._replace(vt=cap.vt + 17)  # a capacity no other test made a carry for
    inside = jax.jit(lambda z: z + jnp.sum(_empty_carry(m, CFG, cap).contacts.idx))(jnp.int32(1))
    assert int(inside) == 1  # an empty carry holds zeros
    leaves = jax.tree_util.tree_leaves(_empty_carry(m, CFG, cap))
    assert leaves and not any(isinstance(a, jax.core.Tracer) for a in leaves)
    assert all(isinstance(a, jax.Array) and not bool(np.any(np.asarray(a))) for a in leaves)

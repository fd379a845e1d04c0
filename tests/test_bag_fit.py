"""The bag fit's parts: the rest-state derivative (fitting/rest_derivative.py) against
finite differences of static equilibria, the smoothing rule (fitting/smoothing.py), the
error bar and the reach message (fitting/uncertainty.py), and the problem's refusals
(fitting/bag_rest.py). The fit itself runs the 481-vertex bag (slow:
tests/test_bag_fit_slow.py)."""
from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fitting import bag_nodes, bag_rest as br, rest_derivative as rd, smoothing as sm, uncertainty as unc
from fitting.fit import MeasuredProblem, from_z
from ipcjax.candidates import initial_capacity
from ipcjax.model import Config, Controls, Params
from scenes.film import cantilever_scene

NAMES = rd.BAG_NAMES


# --------------------------------------------------------------------------- rest-state derivative


@pytest.fixture(scope="module")
def cantilever():
    """The clamped plate, its set-up and one compiled rest Jacobian, shared by this module's
    tests (make_rest_jacobian compiles once, not once a test)."""
    sc = cantilever_scene()
    m = sc.model
    cfg = Config()
    cap = initial_capacity(m.topology)
    ctl = Controls.empty(m.n_particles)
    tip = jnp.asarray(sc.tip)
    measure = lambda x: jnp.stack([jnp.mean(x[tip, 2]), x[tip[-1], 0] - x[tip[0], 0], jnp.max(x[:, 2])])
    return sc, m, cfg, cap, ctl, measure, rd.make_rest_jacobian(m, cfg, cap, measure)


_SOLVERS = {}


def _static_solve(m, cfg, cap, ctl, params, x_start, dt):
    """The equilibrium G(x; θ) = 0 by Newton from x_start, the friction anchor at x_start,
    with the Hessian from jax.jacfwd of G (independent of the assembled blocks)."""
    from ipcjax.newton import query_contacts

    anchor = jnp.asarray(x_start)
    free = m.free_particles
    if id(m) not in _SOLVERS:
        # jitted: op by op the query was hundreds of small compilations
        cs, _ = jax.jit(lambda a: query_contacts(a, a, m, cfg, cap))(anchor)

        def G(u, p):
            prob = rd.rest_problem(m, cfg, p, anchor, ctl, dt=dt, contacts=cs)
            return rd.rest_residual(anchor.at[free].set(u.reshape(-1, 3)), prob, cs)

        # G and its Jacobian in one program (two compiled the residual twice)
        _SOLVERS[id(m)] = (m, jax.jit(lambda u, p: (G(u, p), jax.jacfwd(G)(u, p))))
    _, G_dG = _SOLVERS[id(m)]
    u = anchor[free].reshape(-1)
    for _ in range(30):
        g, dg = G_dG(u, params)
        if float(jnp.max(jnp.abs(g))) < 1e-14:
            break
        u = u - jnp.linalg.solve(dg, g)
    assert float(jnp.max(jnp.abs(G_dG(u, params)[0]))) < 1e-13, "the static solve did not converge"
    return anchor.at[free].set(u.reshape(-1, 3))


def test_rest_jacobian_matches_central_differences_of_static_equilibria(cantilever):
    """dy/dz of make_rest_jacobian at an equilibrium x* equals central differences of the
    measurements of equilibria re-solved at θ·e^{±h}: E and kθ non-zero, μf exactly zero
    (no contact: no friction load)."""
    sc, m, cfg, cap, ctl, measure, jac = cantilever
    dt = 1 / 240
    p0 = Params.film_defaults()
    x_flat = jnp.asarray(sc.x, jnp.float64)
    x_star = _static_solve(m, cfg, cap, ctl, p0, x_flat, dt)
    assert float(jnp.min(x_star[:, 2])) < 0.05 - 1e-4  # it droops
    v = (x_star - x_flat) / dt                        # anchor = x* − dt·v = the flat start
    y, J, L, residual, force, overflow = jac(x_star, v, p0, ctl, jnp.asarray(dt))
    assert not bool(overflow) and bool(jnp.all(jnp.isfinite(L)))
    assert float(jnp.max(jnp.abs(residual))) < 1e-6 * float(force)   # an equilibrium, to round-off
    J = np.asarray(J)
    z0 = np.log([float(getattr(p0, n)) for n in NAMES])
    h = 1e-4
    for i, n in enumerate(NAMES):
        if n == "friction":
            assert np.all(J[:, i] == 0.0)
            continue
        ys = []
        for s in (+1, -1):
            z = z0.copy(); z[i] += s * h
            p = from_z(NAMES, jnp.asarray(z), p0)
            ys.append(np.asarray(measure(_static_solve(m, cfg, cap, ctl, p, x_flat, dt))))
        fd = (ys[0] - ys[1]) / (2 * h)
        assert np.max(np.abs(J[:, i])) > 1e-6, n                 # the parameter moves the plate
        np.testing.assert_allclose(J[:, i], fd, rtol=1e-5, atol=1e-9 * np.max(np.abs(fd)), err_msg=n)


def test_rest_jacobian_refuses_an_unstable_state(cantilever):
    """A plate squeezed to half its width with next to no bending stiffness: its membrane
    Hessian in compression is indefinite, and the Cholesky factor comes back non-finite
    (which run_node records as ``stable=False`` and check_rest refuses)."""
    sc, m, cfg, cap, ctl, measure, jac = cantilever
    x = jnp.asarray(sc.x, jnp.float64)
    free = ~np.asarray(m.fixed)
    xc = x.at[:, 0].set(jnp.where(jnp.asarray(free), 0.5 * x[:, 0] + 0.005, x[:, 0]))  # squeezed: membrane buckles
    _, _, L, _, _, _ = jac(xc, jnp.zeros_like(x), Params.film_defaults(bending_scale=1e-6), ctl, jnp.asarray(1 / 240))
    assert not bool(jnp.all(jnp.isfinite(L)))


# --------------------------------------------------------------------------- smoothing


def _node(z, y, J=None, *, stable=True, residual_ratio=0.0):
    return bag_nodes.NodeResult(z=np.asarray(z, float), y=np.asarray(y, float), J=np.zeros((3, 3)) if J is None else J,
                         residual_ratio=residual_ratio, stable=stable, max_speed=0.0, wall_s=0.0, run_dir="")


def test_check_rest_refuses_what_the_rest_derivative_cannot_use():
    z = np.log([315e6, 0.35, 1.0])
    bag_nodes.check_rest(_node(z, [0.04, 0.04, 0.015]))
    with pytest.raises(bag_nodes.NodeFailed, match="not a stable equilibrium"):
        bag_nodes.check_rest(_node(z, [0.04, 0.04, 0.015], stable=False))
    with pytest.raises(bag_nodes.NodeFailed, match=r"youngs_modulus = 3.15e\+08.*not at rest: unbalanced force 0.02"):
        bag_nodes.check_rest(_node(z, [0.04, 0.04, 0.015], residual_ratio=0.02))
    with pytest.raises(bag_nodes.NodeFailed, match="not finite"):
        bag_nodes.check_rest(_node(z, [0.04, 0.04, 0.015], np.full((3, 3), np.nan)))


def test_bspline_is_a_partition_of_unity_that_reproduces_lines():
    u = np.linspace(-3.0, 3.0, 601)
    j = np.arange(-6, 7)
    N = sm.bspline3(u[:, None] - j[None, :])
    assert np.all(N >= 0)
    np.testing.assert_allclose(N.sum(1), 1.0, rtol=0, atol=1e-14)
    np.testing.assert_allclose(N @ j, u, rtol=0, atol=1e-13)
    np.testing.assert_allclose(sm.bspline3(np.array([0.0, 1.0, 2.0])), [2 / 3, 1 / 6, 0.0], rtol=0, atol=1e-15)


@pytest.mark.parametrize("u", [-1.7, -1.25, -0.6, -0.2, 0.3, 0.8, 1.1, 1.6])
def test_bspline_derivative_matches_central_differences_inside_each_piece(u):
    """dN/du against central differences with h = 1e-6, at points at least 0.1 from the
    knots (one polynomial piece on both sides), float64."""
    h = 1e-6
    fd = (sm.bspline3(u + h) - sm.bspline3(u - h)) / (2 * h)
    d = sm.bspline3_derivative(u)
    assert abs(d) > 1e-3
    np.testing.assert_allclose(d, fd, rtol=1e-8)


def test_bspline_is_c2_across_its_knots():
    """Value, slope and (by differences of the slope) curvature agree on both sides of the
    knots 0, ±1, ±2."""
    e = 1e-7
    for k in (-2.0, -1.0, 0.0, 1.0, 2.0):
        assert abs(sm.bspline3(k + e) - sm.bspline3(k - e)) < 1e-6
        assert abs(sm.bspline3_derivative(k + e) - sm.bspline3_derivative(k - e)) < 1e-6
        c = lambda x: (sm.bspline3_derivative(x + 1e-4) - sm.bspline3_derivative(x - 1e-4)) / 2e-4
        assert abs(c(k + 1e-3) - c(k - 1e-3)) < 1e-2


@pytest.mark.parametrize("u, n", [([0.3], 4), ([2.0], 3), ([-0.4, 1.0], 12), ([0.5, 0.5], 16)])
def test_lattice_support_is_the_tensor_product_of_the_splines(u, n):
    idx, w, dw = sm.lattice_support(np.asarray(u))
    assert idx.shape == (n, len(u)) and w.shape == (n,) and dw.shape == (n, len(u))
    assert np.all(w > 0) and math.isclose(w.sum(), 1.0, rel_tol=1e-14)
    np.testing.assert_allclose(w @ idx, u, atol=1e-13)          # the lattice reproduces lines
    np.testing.assert_allclose(dw.sum(0), 0.0, atol=1e-13)       # Σ w stays 1
    for i in range(len(u)):                                      # ∂w/∂uᵢ against central differences
        du = np.zeros(len(u)); du[i] = 1e-6
        wp = dict(zip(map(tuple, sm.lattice_support(np.asarray(u) + du)[0]), sm.lattice_support(np.asarray(u) + du)[1]))
        wm = dict(zip(map(tuple, sm.lattice_support(np.asarray(u) - du)[0]), sm.lattice_support(np.asarray(u) - du)[1]))
        fd = np.array([(wp.get(tuple(j), 0.0) - wm.get(tuple(j), 0.0)) / 2e-6 for j in idx])
        np.testing.assert_allclose(dw[:, i], fd, rtol=1e-6, atol=1e-9)


def test_effective_runs_of_the_lattice_weights():
    assert sm.effective_runs(sm.lattice_support([0.0])[1]) == pytest.approx(2.0)
    assert sm.effective_runs(sm.lattice_support([0.5])[1]) == pytest.approx(1 / (2 * (23 / 48) ** 2 + 2 / 48**2))
    assert sm.effective_runs([0.25] * 4) == pytest.approx(4.0)


def test_lattice_smooth_of_a_line_is_the_line_and_its_slope():
    """For y(z) = a + b z the spline smoothing is exact (it reproduces lines): ȳ(z) = y(z)
    and J̄ = b at any z; the "rest" estimator averages the nodes' own derivatives with the
    weights, except for μf (path only), which always takes the spline's."""
    a, b = np.array([0.04, 0.03, 0.01]), np.array([0.2, 0.7, -1.1])
    h, z = 0.2, 0.37
    idx, w, dw = sm.lattice_support([z / h])
    for name in ("youngs_modulus", "friction"):
        k = NAMES.index(name)
        Y = np.stack([a + b * j * h for j in idx[:, 0]])           # (n, 3)
        J_rest = np.zeros((len(Y), 3, 3)); J_rest[:, :, k] = b        # (n, 3, 3) over BAG_NAMES
        ybar, Js = sm.lattice_smooth(Y, w, dw, (name,), h, J_rest=J_rest, estimator="spline")
        np.testing.assert_allclose(ybar, a + b * z, rtol=1e-12)
        np.testing.assert_allclose(Js[:, 0], b, rtol=1e-10)
        _, Jr = sm.lattice_smooth(Y, w, dw, (name,), h, J_rest=J_rest, estimator="rest")
        np.testing.assert_allclose(Jr[:, 0], b, rtol=1e-10)
    # a node derivative that disagrees with the values shows in "rest", not in "spline"
    Y, J_rest = np.stack([a + b * j * h for j in idx[:, 0]]), np.full((len(idx), 3, 3), 9.0)
    assert np.allclose(sm.lattice_smooth(Y, w, dw, ("youngs_modulus",), h, J_rest=J_rest, estimator="rest")[1], 9.0)
    np.testing.assert_allclose(sm.lattice_smooth(Y, w, dw, ("friction",), h, J_rest=J_rest, estimator="rest")[1][:, 0],
                               b, rtol=1e-10)
    with pytest.raises(ValueError, match="pass J_rest"):
        sm.lattice_smooth(Y, w, dw, ("youngs_modulus",), h, estimator="rest")


def test_lattice_smooth_turns_a_jump_into_a_smooth_ramp():
    """A unit step between the nodes 0 and 1 (y = 0 for j ≤ 0, 1 for j ≥ 1): ȳ rises
    monotonically from 0 to 1 over the three cells around it, its derivative is non-negative
    and agrees with central differences of ȳ everywhere, knots included (C²)."""
    h = 0.2

    def ybar_J(z):
        idx, w, dw = sm.lattice_support([z / h])
        Y = np.stack([np.full(3, float(j >= 1)) for j in idx[:, 0]])
        return sm.lattice_smooth(Y, w, dw, ("youngs_modulus",), h)

    assert ybar_J(-1.0 * h)[0][0] == 0.0 and ybar_J(2.0 * h)[0][0] == pytest.approx(1.0, abs=1e-15)
    zs = np.linspace(-0.99 * h, 1.99 * h, 81)   # the ramp: the nodes 0 and 1 both in the support
    yb = np.array([ybar_J(z)[0][0] for z in zs])
    J = np.array([ybar_J(z)[1][0, 0] for z in zs])
    assert np.all(np.diff(yb) > 0) and np.all(J > 0)
    fd = np.array([(ybar_J(z + 1e-7)[0][0] - ybar_J(z - 1e-7)[0][0]) / 2e-7 for z in zs])
    np.testing.assert_allclose(J, fd, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- what a fit says


def test_interval_is_the_gauss_newton_one_and_infinite_where_blind():
    J = np.array([[4.0], [3.0], [0.0]])                  # ‖J‖ = 5 mm per unit log
    iv = unc.interval(J, ("youngs_modulus",), {"youngs_modulus": 300e6}, 0.5)["youngs_modulus"]
    assert math.isclose(iv["sigma_log"], 0.1)
    assert math.isclose(iv["low"], 300e6 * math.exp(-0.1)) and math.isclose(iv["high"], 300e6 * math.exp(0.1))
    blind = unc.interval(np.array([[4.0, 0.0], [3.0, 0.0], [1.0, 0.0]]), ("youngs_modulus", "bending_scale"),
                        {"youngs_modulus": 1.0, "bending_scale": 1.0}, 0.5)
    assert math.isinf(blind["bending_scale"]["sigma_log"]) and math.isinf(blind["bending_scale"]["high"])
    ident = unc.identifiability(np.array([[4.0, 1e-3], [3.0, 0.0], [1.0, 0.0]]), ["youngs_modulus", "bending_scale"],
                               0.5)
    assert ident["below_noise"] == ["bending_scale"] and ident["condition_number"] > 1e3


def test_interval_weights_each_measurement_by_its_own_noise():
    J = np.array([[4.0], [3.0], [1.0]])
    iv = unc.interval(J, ("youngs_modulus",), {"youngs_modulus": 1.0}, [0.5, 1.0, 2.0])["youngs_modulus"]
    assert math.isclose(iv["sigma_log"], 1.0 / math.sqrt(16 / 0.25 + 9 / 1.0 + 1 / 4.0))
    with pytest.raises(ValueError, match="noise must be > 0 mm for every measurement"):
        unc.interval(J, ("youngs_modulus",), {"youngs_modulus": 1.0}, [0.5, 0.0, 1.0])


def test_scatter_budget_says_how_many_runs_a_node_needs_for_a_goal():
    """One run's scatter s per measurement, in a smoothed measurement with the variance of
    a mean of 2 runs (noise s/√2); K runs per node divide σ_z by √K, so a goal g needs
    ⌈(σ_z/log(1 + g))²⌉."""
    J = np.array([[15.0], [12.0], [-2.0]])
    s = (1.7, 3.3, 1.1)
    b = unc.scatter_budget(J, ("youngs_modulus",), {"youngs_modulus": 315e6}, s, effective_runs=2.0)
    sz = 1.0 / math.sqrt(2 * sum((j / si) ** 2 for j, si in zip(J[:, 0], s)))
    iv = b["interval_1sigma"]["youngs_modulus"]
    assert math.isclose(iv["sigma_log"], sz) and 0.05 < sz < 0.1
    need = b["runs_per_node_for"]["youngs_modulus"]
    assert need["2%"] == math.ceil((sz / math.log(1.02)) ** 2) > 1 and need["5%"] == math.ceil((sz / math.log(1.05)) ** 2)
    # K of them per node reach the goal, one fewer does not
    k = need["2%"]
    assert sz / math.sqrt(k) <= math.log(1.02) < sz / math.sqrt(k - 1)
    blind = unc.scatter_budget(np.array([[4.0, 0.0], [3.0, 0.0], [1.0, 0.0]]), ("youngs_modulus", "bending_scale"),
                              {"youngs_modulus": 1.0, "bending_scale": 1.0}, s, effective_runs=4.0)
    assert blind["runs_per_node_for"]["bending_scale"] == {"2%": None, "5%": None}
    with pytest.raises(ValueError, match="effective_runs must be > 0"):
        unc.scatter_budget(J, ("youngs_modulus",), {"youngs_modulus": 1.0}, s, effective_runs=0.0)
    # K runs per node: the interval of K × effective_runs runs; the runs asked for stay those of one
    four = unc.scatter_budget(J, ("youngs_modulus",), {"youngs_modulus": 1.0}, s, effective_runs=2.0, runs_per_node=4)
    once = unc.scatter_budget(J, ("youngs_modulus",), {"youngs_modulus": 1.0}, s, effective_runs=2.0)
    assert four["interval_1sigma"]["youngs_modulus"]["sigma_log"] == pytest.approx(
        once["interval_1sigma"]["youngs_modulus"]["sigma_log"] / 2, rel=1e-12)
    assert four["runs_per_node_for"] == once["runs_per_node_for"] and four["runs_per_node"] == 4
    with pytest.raises(ValueError, match="runs_per_node must be an integer ≥ 1"):
        unc.scatter_budget(J, ("youngs_modulus",), {"youngs_modulus": 1.0}, s, effective_runs=2.0, runs_per_node=0)


def test_runs_per_node_average_only_the_spread_they_show():
    """K runs per node that end within w of one another keep the rest of one run's scatter
    s: a node scatters by √(s² − w² + w²/K), so the interval K runs leave stops at the
    shared part's, and a goal below that floor is reached by no K (None), never by a
    finite count that would not deliver it."""
    J = np.array([[15.0], [12.0], [-2.0]])
    s, values = np.array([1.7, 3.3, 1.1]), {"youngs_modulus": 1.0}
    np.testing.assert_allclose(unc.node_scatter(s, [0.0, 0.0, 0.0], 9), s, rtol=1e-15)       # copies: no gain
    np.testing.assert_allclose(unc.node_scatter(s, s, 4), s / 2, rtol=1e-15)                # independent: 1/√K
    np.testing.assert_allclose(unc.node_scatter(s, None, 4), s / 2, rtol=1e-15)
    np.testing.assert_allclose(unc.node_scatter(s, [1.0, 3.0, 2.0], 4),
                               np.sqrt([1.7**2 - 1 + 0.25, 3.3**2 - 9 + 2.25, 4.0 / 4]), rtol=1e-14)
    copies = unc.scatter_budget(J, ("youngs_modulus",), values, s, effective_runs=2.0, runs_per_node=4,
                                within_mm=[0.02, 0.02, 0.0005])
    once = unc.scatter_budget(J, ("youngs_modulus",), values, s, effective_runs=2.0)
    sz1 = once["interval_1sigma"]["youngs_modulus"]["sigma_log"]
    sz4 = copies["interval_1sigma"]["youngs_modulus"]["sigma_log"]
    assert sz1 * 0.999 < sz4 < sz1 and math.log(1.02) < sz4   # four kicked copies: 2 % not reached
    assert copies["runs_per_node_for"]["youngs_modulus"] == {"2%": None, "5%": None}
    assert copies["floor_sigma_log"]["youngs_modulus"] == pytest.approx(sz1, rel=1e-3)
    assert copies["node_scatter_mm"] == pytest.approx(unc.node_scatter(s, [0.02, 0.02, 0.0005], 4).tolist())
    # three quarters of its variance in the starts: a goal above the floor needs the fewest K
    # whose interval reaches it
    w = s * math.sqrt(0.75)
    half = unc.scatter_budget(J, ("youngs_modulus",), values, s, effective_runs=2.0, within_mm=w)
    floor = half["floor_sigma_log"]["youngs_modulus"]
    assert floor == pytest.approx(sz1 / 2, rel=1e-12)
    goal = 0.05
    k = half["runs_per_node_for"]["youngs_modulus"]["5%"]
    at = lambda kk: unc.scatter_budget(J, ("youngs_modulus",), values, s, effective_runs=2.0, runs_per_node=kk,
                                       within_mm=w)["interval_1sigma"]["youngs_modulus"]["sigma_log"]
    assert floor < math.log1p(goal) < sz1 and at(k) <= math.log1p(goal) < at(k - 1)
    assert half["runs_per_node_for"]["youngs_modulus"]["2%"] is None and floor > math.log(1.02)
    with pytest.raises(ValueError, match="within_mm must be finite spreads ≥ 0 mm"):
        unc.node_scatter(s, [0.1, -0.1, 0.1], 2)


def _record(value, y, J):
    return br.EvaluationRecord(z=[math.log(value)], params={"youngs_modulus": value}, clipped=False, y=list(y),
                               J=[[j] for j in J], new_runs=0, effective_runs=2.0, wall_s=0.0, nodes=[], runs_per_node=1)


def test_reach_message_names_the_range_when_the_loss_falls_outward_at_its_end():
    bounds = {"youngs_modulus": (78.75e6, 1260e6)}
    t = np.array([38.83e-3, 37.20e-3, 18.43e-3])
    # at the lower end the neck is still too wide and grows with E: the loss falls below the range
    recs = [_record(300e6, [47e-3, 42e-3, 15.7e-3], [5e-3, 3e-3, 1e-3]),
            _record(80e6, [44e-3, 41e-3, 15e-3], [5e-3, 3e-3, 1e-3])]
    msg = unc.reach_message(("youngs_modulus",), bounds, recs, t)
    assert msg is not None and msg.startswith("no youngs_modulus in [7.875e+07, 1.26e+09] brings the neck")
    assert "44.00 × 41.00 mm" in msg
    # an interior minimum: no message
    recs = [_record(300e6, [38.9e-3, 37.1e-3, 18.4e-3], [5e-3, 3e-3, 1e-3])]
    assert unc.reach_message(("youngs_modulus",), bounds, recs, t) is None


# --------------------------------------------------------------------------- the problem's refusals


def test_problem_refuses_bad_settings_before_running(tmp_path):
    with pytest.raises(ValueError, match="fits one or more of youngs_modulus, friction, bending_scale"):
        br.BagRestProblem(("thickness",), br.DEFAULT_START, str(tmp_path))
    with pytest.raises(ValueError, match="step must be > 0"):
        br.BagRestProblem(("youngs_modulus",), br.DEFAULT_START, str(tmp_path), step=0.0)
    with pytest.raises(ValueError, match="estimator must be one of spline, rest"):
        br.BagRestProblem(("youngs_modulus",), br.DEFAULT_START, str(tmp_path), estimator="stein")
    with pytest.raises(FileNotFoundError, match="no such file"):
        br.BagRestProblem(("youngs_modulus",), str(tmp_path / "none.npz"), str(tmp_path))


def test_node_cache_names_a_nodes_folder_by_the_start_files_digest_and_the_values(tmp_path, monkeypatch):
    """node_<first 10 hex digits of the start file's SHA-256>_ and each of BAG_NAMES as
    {n}={v:.9g}: the names run folders had before NodeCache, so caches stay valid. The
    digest is taken once, when the cache is made; another start file gives other folders.
    The problem runs its nodes in its cache's folders."""
    import hashlib

    start = tmp_path / "start.npz"
    start.write_bytes(b"a start state")
    digest = hashlib.sha256(b"a start state").hexdigest()[:10]
    cache = bag_nodes.NodeCache(str(start), str(tmp_path / "nodes"))
    assert cache.digest == digest
    z = np.log([315e6, 0.35, 1.0])
    assert cache.folder(z) == str(tmp_path / "nodes" / f"node_{digest}_youngs_modulus=315000000_friction=0.35_"
                                                        "bending_scale=1")
    z = z + np.array([0.198, -0.4, 1.1])
    old = f"node_{digest}_" + "_".join(f"{n}={v:.9g}" for n, v in zip(NAMES, np.exp(z)))
    assert cache.folder(z) == os.path.join(str(tmp_path / "nodes"), old)
    start.write_bytes(b"another start state")
    assert cache.folder(z) == os.path.join(str(tmp_path / "nodes"), old)       # taken once
    other = bag_nodes.NodeCache(str(start), str(tmp_path / "nodes"))
    assert other.digest == hashlib.sha256(b"another start state").hexdigest()[:10] != digest
    assert other.folder(z) != cache.folder(z)
    outs = []
    monkeypatch.setattr(br, "_node_task", lambda task: (outs.append(task[2]), _node(task[1], np.zeros(3)))[1])
    pb = br.BagRestProblem(("youngs_modulus",), str(start), str(tmp_path / "nodes"), workers=1)
    pb.run(np.array([z[0]]))
    assert outs == [other.folder(np.r_[z[0], np.log([0.35, 1.0])])]


def test_node_cache_reuses_a_run_only_if_it_finished_with_the_same_params_and_end(tmp_path):
    import json

    run = tmp_path / "node"
    run.mkdir()
    p = Params.film_defaults(youngs_modulus=400e6)
    finished = lambda params=p, t_end=10.5: bag_nodes.NodeCache.finished(str(run), params, t_end)
    assert finished() is None                                             # no summary.json
    (run / "summary.json").write_text("{half a summary")
    assert finished() is None
    summary = dict(params={n: float(getattr(p, n)) for n in NAMES}, simulated_s=10.5, failure=None)
    (run / "summary.json").write_text(json.dumps(summary))
    assert finished() == summary and finished(t_end=10.5 + 5e-7) == summary
    assert finished(t_end=10.5 + 2e-6) is None and finished(t_end=8.4) is None
    assert finished(p._replace(youngs_modulus=400e6 * (1 + 1e-9))) is None
    assert finished(Params.film_defaults(youngs_modulus=400e6, friction=0.3)) is None
    failed = dict(summary, failure=dict(reason="step failed", time_s=9.0), simulated_s=9.0)
    (run / "summary.json").write_text(json.dumps(failed))
    assert finished() is None
    # asked for, a failed run with the same params is read back (it would fail again); never another's
    assert bag_nodes.NodeCache.finished(str(run), p, 10.5, failed=True) == failed
    assert bag_nodes.NodeCache.finished(str(run), p._replace(youngs_modulus=401e6), 10.5, failed=True) is None
    (run / "summary.json").write_text(json.dumps(summary))
    assert bag_nodes.NodeCache.finished(str(run), p, 10.5, failed=True) == summary   # a finished run too
    assert bag_nodes.NodeCache.finished(str(run), p, 8.4, failed=True) is None
    # an ensemble member's run: reused only for the same kick (rms and seed), never for none
    from scenes.perturb import describe

    kicked = dict(summary, perturbation=describe(0.3, 2))
    (run / "summary.json").write_text(json.dumps(kicked))
    assert finished() is None
    assert bag_nodes.NodeCache.finished(str(run), p, 10.5, describe(0.3, 2)) == kicked
    assert bag_nodes.NodeCache.finished(str(run), p, 10.5, describe(0.3, 1)) is None
    assert bag_nodes.NodeCache.finished(str(run), p, 10.5, describe(0.1, 2)) is None
    start = tmp_path / "start.npz"
    start.write_bytes(b"x")
    cache = bag_nodes.NodeCache(str(start), "r")
    assert cache.folder(np.zeros(3), 2) == cache.folder(np.zeros(3)) + "_member2"
    assert cache.folder(np.zeros(3), 0) == cache.folder(np.zeros(3))


def test_evaluation_record_writes_the_dict_fit_json_has():
    """EvaluationRecord.to_json(): fit.json's iterate, its keys in this order, the nodes'
    records as dicts in theirs, every value as the problem recorded it."""
    import json

    nd = dataclasses.replace(_node(np.log([400e6, 0.35, 1.0]), [0.04, 0.041, 0.015], np.eye(3) * 1e-3,
                                   residual_ratio=1e-3), max_speed=2e-3, wall_s=3.5, run_dir="nodes/x")
    node = br.NodeRecord.of((2,), np.float64(0.25), nd)
    rec = br.EvaluationRecord(z=[math.log(400e6)], params={"youngs_modulus": 400e6}, clipped=False,
                              y=[0.04, 0.041, 0.015], J=[[0.01], [0.0], [0.0]], new_runs=4, effective_runs=2.1,
                              wall_s=7.0, nodes=[node], runs_per_node=1)
    d = rec.to_json()
    assert list(d) == ["z", "params", "clipped", "y", "J", "new_runs", "effective_runs", "wall_s", "nodes",
                       "runs_per_node"]
    assert d == dict(z=[math.log(400e6)], params={"youngs_modulus": 400e6}, clipped=False, y=[0.04, 0.041, 0.015],
                     J=[[0.01], [0.0], [0.0]], new_runs=4, effective_runs=2.1, wall_s=7.0, nodes=[d["nodes"][0]],
                     runs_per_node=1)
    n = d["nodes"][0]
    assert list(n) == ["index", "weight", "params", "y", "J_rest", "residual_ratio", "max_speed_m_s", "wall_s",
                       "run_dir", "runs", "spread_m"]
    assert n == dict(index=[2], weight=0.25, params=dict(zip(NAMES, np.exp(nd.z).tolist())), y=[0.04, 0.041, 0.015],
                     J_rest=(np.eye(3) * 1e-3).tolist(), residual_ratio=1e-3, max_speed_m_s=2e-3, wall_s=3.5,
                     run_dir="nodes/x", runs=1, spread_m=None)
    assert type(n["weight"]) is float and json.loads(json.dumps(d)) == d
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.y = [0.0, 0.0, 0.0]


def _linear_nodes(monkeypatch, seen, slope=(0.01, 0.0, 0.0), col=0):
    """Fake node runs whose measurements are linear in z[col]; ``seen`` collects each run's z."""
    def fake(task):
        start, z, out, until, audit_every = task[:5]
        seen.append(np.asarray(z))
        return _node(z, np.array([0.04, 0.04, 0.015]) + np.asarray(slope) * (z[col] - math.log(315e6)))

    monkeypatch.setattr(br, "_node_task", fake)


def test_problem_runs_each_lattice_point_once_and_evaluates_past_its_range_at_the_end(tmp_path, monkeypatch):
    """The runs are at the lattice points z₀ + j h around z along the fitted parameter
    only, the others at the film defaults; a second evaluation in the same cell runs
    nothing; ȳ and J̄ of a line are the line and its slope; an iterate past the range is
    evaluated at the range's end and its record says so."""
    seen = []
    _linear_nodes(monkeypatch, seen)
    h = 0.1
    pb = br.BagRestProblem(("youngs_modulus",), br.DEFAULT_START, str(tmp_path), step=h, workers=1)
    d = np.log([float(getattr(Params.film_defaults(), n)) for n in NAMES])
    z = math.log(400e6)
    ev = pb(np.array([z]), None)
    u = (z - d[0]) / h
    js = sorted(round((s[0] - d[0]) / h) for s in seen)
    assert js == list(range(math.floor(u) - 1, math.floor(u) + 3))
    for s_ in seen:
        np.testing.assert_allclose(s_[0], d[0] + round((s_[0] - d[0]) / h) * h, rtol=0, atol=1e-12)
        np.testing.assert_allclose(s_[1:], d[1:], rtol=0, atol=0)
    np.testing.assert_allclose(ev.y, [0.04 + 0.01 * (z - d[0]), 0.04, 0.015], rtol=1e-12)
    np.testing.assert_allclose(ev.J[:, 0], [0.01, 0.0, 0.0], atol=1e-12)
    rec = pb.records[0]
    assert rec.params["youngs_modulus"] == pytest.approx(400e6) and not rec.clipped
    assert rec.new_runs == 4 and len(rec.nodes) == 4 and sum(n.weight for n in rec.nodes) == pytest.approx(1)
    pb(np.array([z + 0.2 * h]), None)   # the same cell: nothing new runs
    assert len(seen) == 4 and pb.records[1].new_runs == 0 and pb.runs == 4
    pb(np.array([math.log(2e9)]), None)                                     # the range ends at 4 × 315 MPa
    assert pb.records[2].clipped and pb.records[2].params["youngs_modulus"] == pytest.approx(1260e6)
    assert max(s_[0] for s_ in seen) == pytest.approx(d[0] + (math.floor((math.log(1260e6) - d[0]) / h) + 2) * h)
    nd = pb.run(np.array([z]))                                              # the fitted value's own run, off the lattice
    assert nd.z[0] == pytest.approx(z) and pb.runs == len(seen)
    # params as fit_measured passes them: the fitted E may be anything, the rest must be the
    # film defaults the runs hold; another μf is refused, not ignored
    pb(np.array([z]), Params.film_defaults(youngs_modulus=2e9))
    with pytest.raises(ValueError, match=r"does not fit at the film default; params has friction=0.3 "):
        pb(np.array([z]), Params.film_defaults(friction=0.3))
    assert isinstance(pb, MeasuredProblem)


def test_fit_bag_rest_writes_what_a_fit_says(tmp_path, monkeypatch):
    """``fitting.bag_rest_fit.fit_bag_rest`` on nodes whose rest shape is linear in log E (a fake
    node task writing a one-triangle trajectory): synthetic targets at 315 MPa are
    recovered from 2× off, and fit.json holds the iterates, the Jacobian, the interval for
    the measurement noise, the identifiability, what the model's own scatter allows and
    the fitted value's own run; the run folder holds fit.png and that run's final mesh."""
    import json

    from fitting import bag_rest_fit

    z0, slope = math.log(315e6), np.array([0.015, 0.012, -0.002])
    seen = []

    def fake(task):
        seen.append(task.z[0])
        _write_frame(task.out)
        nd = _node(task.z, np.array([0.04, 0.04, 0.015]) + slope * (task.z[0] - z0))
        return dataclasses.replace(nd, run_dir=task.out)

    monkeypatch.setattr(br, "_node_task", fake)
    out = tmp_path / "fit"
    rec = bag_rest_fit.fit_bag_rest(str(out), None, bag_rest_fit.BagFitOptions(iterations=6, start_factor=2.0, workers=1, progress=False))
    assert rec["converged"] and not rec["outside_reach"] and not rec["failed"]
    assert rec["fitted"]["youngs_modulus"] == pytest.approx(315e6, rel=1e-4)   # the fit stops at loss_tol
    assert json.loads((out / "fit.json").read_text())["fitted"] == rec["fitted"]
    np.testing.assert_allclose(rec["jacobian_mm_per_log"]["J"], slope[:, None] * 1e3, rtol=1e-9)
    best = min(rec["iterates"], key=lambda r: np.sum((np.asarray(r["y"]) - list(rec["target_m"].values())) ** 2))
    k = best["effective_runs"]
    assert 2.0 <= k <= 2.2
    sz = 1.0 / math.sqrt(k * np.sum((slope * 1e3 / np.asarray(unc.MODEL_SCATTER_MM)) ** 2))
    ms = rec["model_scatter"]
    assert ms["effective_runs"] == k and ms["scatter_mm"] == list(unc.MODEL_SCATTER_MM)
    assert ms["interval_1sigma"]["youngs_modulus"]["sigma_log"] == pytest.approx(sz, rel=1e-9)
    assert ms["runs_per_node_for"]["youngs_modulus"]["2%"] == math.ceil((sz / math.log(1.02)) ** 2)
    assert rec["interval_1sigma"]["youngs_modulus"]["sigma_log"] == pytest.approx(
        0.5 / np.linalg.norm(slope * 1e3), rel=1e-9)
    assert set(rec["identifiability"]) == {"smoothed", "rest_state"}
    assert rec["iterates"][0]["params"]["youngs_modulus"] == pytest.approx(630e6)
    # every run once: the lattice points the iterates needed, and the fitted value's own run last
    assert rec["runs"] == len(seen) == len(set(np.round(seen, 12)))
    assert seen[-1] == pytest.approx(math.log(rec["fitted"]["youngs_modulus"]))
    fr = rec["fitted_run"]
    assert fr["params"] == rec["fitted"] and fr["loss_mm2"] < 1e-3
    np.testing.assert_allclose(fr["y_mm"], rec["best"]["y_mm"], atol=1e-3)   # a line: the run is the smoothing
    assert (out / "fit.png").exists() and len(list((out / "mesh").glob("fitted_*.vtu"))) == 1
    gof = rec["goodness_of_fit"]   # synthetic targets: reached, χ² near zero over 3 − 1 dof
    assert gof["dof"] == 2 and gof["chi2"] < 1e-3 and gof["unreached"] == [] and rec["misfit"] is None
    # one measured bag: the tape, the bag's own scatter and the smoothed model's, together
    ob, bag = rec["one_bag"], np.asarray(unc.BAG_SCATTER_MM)
    sig = np.sqrt(0.25 + bag**2 + np.asarray(unc.MODEL_SCATTER_MM) ** 2 / k)
    np.testing.assert_allclose(ob["sigma_mm"], sig, rtol=1e-12)
    assert ob["interval_1sigma"]["youngs_modulus"]["sigma_log"] == pytest.approx(
        1.0 / np.linalg.norm(slope * 1e3 / sig), rel=1e-9)
    assert ob["interval_1sigma"]["youngs_modulus"]["sigma_log"] > ms["interval_1sigma"]["youngs_modulus"]["sigma_log"]
    assert gof["bag_scatter_mm"] == list(unc.BAG_SCATTER_MM)
    assert rec["history_bias"] is None   # synthetic targets come from the same start: no history to differ
    assert [m["sigma_mm"] for m in gof["measurements"].values()] == pytest.approx(sig.tolist(), rel=1e-12)


def test_one_bag_interval_by_hand():
    """σᵢ = √(noise² + bagᵢ² + nodeᵢ²/effective runs), then the Gauss–Newton interval;
    negative or NaN parts are refused."""
    J = np.array([[15.0], [12.0], [-2.0]])
    ob = unc.one_bag(J, ("youngs_modulus",), {"youngs_modulus": 1.0}, 0.5, (3.0, 2.0, 4.0), (1.6, 3.6, 1.1),
                     effective_runs=2.0)
    sig = np.sqrt([0.25 + 9 + 1.6**2 / 2, 0.25 + 4 + 3.6**2 / 2, 0.25 + 16 + 1.1**2 / 2])
    assert ob["sigma_mm"] == pytest.approx(sig.tolist(), rel=1e-12)
    assert ob["interval_1sigma"]["youngs_modulus"]["sigma_log"] == pytest.approx(
        1.0 / math.sqrt(np.sum((J[:, 0] / sig) ** 2)), rel=1e-12)
    with pytest.raises(ValueError, match="finite and ≥ 0 mm"):
        unc.one_bag(J, ("youngs_modulus",), {"youngs_modulus": 1.0}, 0.5, (3.0, -2.0, 4.0), 1.0, effective_runs=2.0)
    with pytest.raises(ValueError, match="effective_runs must be > 0"):
        unc.one_bag(J, ("youngs_modulus",), {"youngs_modulus": 1.0}, 0.5, 1.0, 1.0, effective_runs=0.0)
    gof = unc.goodness_of_fit([41.0, 40.0, 12.0], [40.0, 40.0, 15.0], 1, 0.5, (1.2, 2.0, 0.8), effective_runs=4.0,
                              bag_scatter_mm=(1.0, 0.0, 2.0))
    assert gof["measurements"]["flap"]["sigma_mm"] == pytest.approx(math.sqrt(0.25 + 4.0 + 0.16), rel=1e-12)
    assert gof["unreached"] == [] and gof["bag_scatter_mm"] == [1.0, 0.0, 2.0]   # 3 mm is 1.4 σ with the bag's own


def _write_frame(out):
    """A one-triangle trajectory.npz in ``out``: what fit_bag_rest reads of the fitted run."""
    from ipcjax.runfolder import Trajectory, write_trajectory
    from scenes.bag import SPHERE_RADII

    os.makedirs(out, exist_ok=True)
    write_trajectory(os.path.join(out, "trajectory.npz"), Trajectory(
        np.eye(3)[None], np.zeros((1, len(SPHERE_RADII), 3)), np.array([[0, 1, 2]]), np.array([10.5])))


def _fake_fit(tmp_path, monkeypatch, targets, slope, **options):
    """fit_bag_rest on fake nodes whose rest shape is linear in log E, y = (40, 40, 15) mm
    at 315 MPa plus ``slope`` (m per unit log E) times the distance in log E."""
    from fitting import bag_rest_fit

    z0 = math.log(315e6)

    def fake(task):
        _write_frame(task.out)
        return dataclasses.replace(_node(task.z, np.array([0.04, 0.04, 0.015]) + slope * (task.z[0] - z0)),
                                   run_dir=task.out)

    monkeypatch.setattr(br, "_node_task", fake)
    return bag_rest_fit.fit_bag_rest(str(tmp_path / "fit"), targets, bag_rest_fit.BagFitOptions(
        iterations=8, workers=1, progress=False, **options))


def test_a_flap_the_model_cannot_reach_is_said_with_its_distance(tmp_path, monkeypatch):
    """Targets whose flap lies 25 mm above what any E gives (the necks at 315 MPa): the fit
    keeps its best compromise, and fit.json's goodness of fit and ``misfit`` name the flap,
    its residual and how many σ of tape noise, one bag's own scatter and the model's that
    is; the necks, within their σ, are not named. A flap 10 mm above is within one bag's
    own scatter (4.92 mm, whole-history bags): not named. Fitted from the default tie
    checkpoint to measured targets, fit.json's ``history_bias`` says how far such fits
    landed from whole-history bags."""
    import json

    slope = np.array([0.015, 0.012, -0.002])
    near = _fake_fit(tmp_path / "near", monkeypatch, (0.04, 0.04, 0.025), slope)
    assert near["misfit"] is None and abs(near["goodness_of_fit"]["measurements"]["flap"]["sigmas"]) < 3
    assert near["history_bias"].startswith("every run starts from the tie checkpoint") and "30%" in near["history_bias"]
    rec = _fake_fit(tmp_path, monkeypatch, (0.04, 0.04, 0.040), slope)
    assert rec["fitted"] is not None and not rec["failed"] and not rec["outside_reach"]
    gof = rec["goodness_of_fit"]
    flap = gof["measurements"]["flap"]
    assert gof["unreached"] == ["flap"] and gof["dof"] == 2
    # the best compromise in log E minimises (15d)² + (12d)² + (−25 − 2d)² (mm, slopes in mm
    # per log E): d = −2·25/(15² + 12² + 2²), a softer film to lift the flap; flap ≈ −24.7 mm
    d = -50.0 / (15.0**2 + 12.0**2 + 2.0**2)
    assert flap["residual_mm"] == pytest.approx(-25.0 - 2.0 * d, abs=0.05)
    k = gof["effective_runs"]
    assert flap["sigma_mm"] == pytest.approx(
        math.sqrt(0.5**2 + unc.BAG_SCATTER_MM[2] ** 2 + unc.MODEL_SCATTER_MM[2] ** 2 / k), rel=1e-12)
    assert flap["sigmas"] == pytest.approx(flap["residual_mm"] / flap["sigma_mm"], rel=1e-12)
    assert gof["chi2"] == pytest.approx(sum(m["sigmas"] ** 2 for m in gof["measurements"].values()), rel=1e-12)
    assert gof["chi2_per_dof"] == pytest.approx(gof["chi2"] / 2, rel=1e-12) and gof["chi2_per_dof"] > 10
    said = rec["misfit"]
    assert said.startswith("the model does not reach the flap: fitted ") and "neck" not in said.split("(σ")[0]
    assert f"{flap['residual_mm']:+.2f} mm" in said and f"{abs(flap['sigmas']):.1f} σ" in said
    assert json.loads((tmp_path / "fit" / "fit.json").read_text())["misfit"] == said


def test_ensemble_nodes_are_the_mean_of_k_runs_from_kicked_starts(tmp_path, monkeypatch):
    """--runs-per-node 3: every lattice node runs three times from the same start, run 0
    unperturbed in the node's usual folder, runs 1 and 2 with the film's velocities kicked
    (seeds 1, 2) in folders of their own; the node is their mean, its record holds their
    spread, and the model's-scatter interval is that of 3 runs per node (1/√3 of one
    run's), the runs it asks for counted in single runs."""
    from fitting import bag_rest_fit

    z0, tasks = math.log(315e6), []
    offsets = {0: 0.0, 1: 1e-3, 2: -2e-3}   # m, on the flap: the runs' own scatter

    def fake(task):
        tasks.append(task)
        _write_frame(task.out)
        y = np.array([0.04, 0.04, 0.015]) + np.array([0.015, 0.012, -0.002]) * (task.z[0] - z0)
        return dataclasses.replace(_node(task.z, y + np.array([0.0, 0.0, offsets[task.seed]])), run_dir=task.out)

    monkeypatch.setattr(br, "_node_task", fake)
    one = bag_rest_fit.fit_bag_rest(str(tmp_path / "k1"), (0.041, 0.04, 0.015), bag_rest_fit.BagFitOptions(
        iterations=1, workers=1, progress=False))
    n1 = len(tasks)
    tasks.clear()
    rec = bag_rest_fit.fit_bag_rest(str(tmp_path / "k3"), (0.041, 0.04, 0.015), bag_rest_fit.BagFitOptions(
        iterations=1, workers=1, progress=False, runs_per_node=3, perturb=0.02))
    lattice = [t for t in tasks[:-1]]                      # the fitted value's own run last: one, unperturbed
    assert len(lattice) == 3 * (n1 - 1) and tasks[-1].seed == 0 and tasks[-1].perturb == 0.0
    assert rec["runs"] == len(tasks) and rec["runs_per_node"] == 3
    assert rec["perturbation"]["rms_m_s"] == 0.02 and rec["perturbation"]["seeds"] == [1, 2]
    for i in range(0, len(lattice), 3):
        a, b, c = lattice[i:i + 3]
        assert [a.seed, b.seed, c.seed] == [0, 1, 2] and [a.perturb, b.perturb, c.perturb] == [0.0, 0.02, 0.02]
        assert np.array_equal(a.z, b.z) and np.array_equal(a.z, c.z)
        assert b.out == a.out + "_member1" and c.out == a.out + "_member2" and "_member" not in a.out
    it = rec["iterates"][0]
    for nd in it["nodes"]:
        assert nd["runs"] == 3 and nd["run_dir"].endswith(tuple("0123456789"))   # member 0's folder
        assert nd["spread_m"] == pytest.approx([0.0, 0.0, np.std([0.0, 1e-3, -2e-3], ddof=1)], abs=1e-15)
    # the node is the mean: the flap 1/3 mm lower than the unperturbed runs', the necks the same
    np.testing.assert_allclose(np.asarray(it["y"]) - np.asarray(one["iterates"][0]["y"]), [0, 0, -1e-3 / 3],
                               atol=1e-12)
    assert it["effective_runs"] == one["iterates"][0]["effective_runs"] and it["runs_per_node"] == 3
    # only what the runs' spread shows averages away: the necks (no spread) keep one run's
    # scatter, the flap (spread 1.53 mm, above the assumed 1.10 mm) scatters by 1.53/√3
    w = np.std([0.0, 1.0, -2.0], ddof=1)
    assert rec["node_spread"]["rms_sd_mm"] == pytest.approx([0.0, 0.0, w], rel=1e-9)
    ms, s = rec["model_scatter"], np.asarray(unc.MODEL_SCATTER_MM)
    assert ms["within_mm"] == pytest.approx([0.0, 0.0, w]) and one["model_scatter"]["within_mm"] is None
    assert ms["node_scatter_mm"] == pytest.approx([s[0], s[1], w / math.sqrt(3)], rel=1e-12)
    Jfit, eff = np.asarray(rec["jacobian_mm_per_log"]["J"]), ms["effective_runs"]
    s3 = ms["interval_1sigma"]["youngs_modulus"]["sigma_log"]
    assert s3 == pytest.approx(unc.interval(Jfit, ("youngs_modulus",), rec["best"]["params"],
                                            np.asarray(ms["node_scatter_mm"]) / math.sqrt(eff))
                               ["youngs_modulus"]["sigma_log"], rel=1e-12)
    assert rec["goodness_of_fit"]["scatter_mm"] == pytest.approx(ms["node_scatter_mm"], rel=1e-12)
    assert one["node_spread"] is None and one["perturbation"] is None
    with pytest.raises(ValueError, match="runs_per_node must be a positive integer"):
        bag_rest_fit.BagFitOptions(runs_per_node=0).check()
    with pytest.raises(ValueError, match="perturb must be a finite speed > 0"):
        bag_rest_fit.BagFitOptions(runs_per_node=2, perturb=float("nan")).check()


def test_film_kick_is_seeded_smooth_and_of_the_asked_size():
    """scenes.perturb.film_kick: the same seed gives the same field, another seed another;
    its rms over the film is the asked one, it is zero off the film, and particles 0.1 mm
    apart (layers in contact) get nearly the same kick, particles half a wavelength apart
    different ones."""
    from scenes.perturb import WAVELENGTH, film_kick

    rng = np.random.default_rng(0)
    x = rng.uniform(-0.05, 0.05, size=(200, 3))
    x[100] = x[0] + [0.0, 0.0, 1e-4]
    film = np.arange(150)
    a, b, c = film_kick(x, film, 0.03, 1), film_kick(x, film, 0.03, 1), film_kick(x, film, 0.03, 2)
    assert np.array_equal(a, b) and not np.allclose(a, c)
    assert np.sqrt(np.mean(np.sum(a[film] ** 2, axis=1))) == pytest.approx(0.03, rel=1e-12)
    assert not np.any(a[150:])
    near = np.linalg.norm(a[100] - a[0]) / np.linalg.norm(a[0])
    assert near < 2 * np.pi * 1e-4 / WAVELENGTH * 8   # bounded by the modes' gradient
    assert not np.any(film_kick(x, film, 0.0, 1))
    with pytest.raises(ValueError, match="finite speed ≥ 0"):
        film_kick(x, film, -1.0, 1)


def test_goodness_of_fit_by_hand():
    """χ² against σᵢ = √(noise² + scatterᵢ²/K), per measurement and over m − k dof; none
    when the fit has as many parameters as measurements."""
    gof = unc.goodness_of_fit([41.0, 40.0, 12.0], [40.0, 40.0, 15.0], 1, 0.5, (1.2, 2.0, 0.8), effective_runs=4.0)
    s = [math.sqrt(0.25 + 1.44 / 4), math.sqrt(0.25 + 1.0), math.sqrt(0.25 + 0.16)]
    z = [1.0 / s[0], 0.0, -3.0 / s[2]]
    assert [gof["measurements"][n]["sigma_mm"] for n in unc.SHAPE_NAMES] == pytest.approx(s, rel=1e-12)
    assert [gof["measurements"][n]["sigmas"] for n in unc.SHAPE_NAMES] == pytest.approx(z, rel=1e-12)
    assert gof["chi2"] == pytest.approx(sum(v * v for v in z), rel=1e-12) and gof["dof"] == 2
    assert gof["unreached"] == ["flap"]          # 3/0.64 = 4.7 σ; neck x 1/0.78 = 1.3 σ
    assert unc.goodness_of_fit([1.0, 2.0, 3.0], [1.0, 2.0, 3.5], 3, 0.5, 1.0, effective_runs=1.0)["chi2_per_dof"] is None
    assert unc.misfit_message(unc.goodness_of_fit([40.0] * 3, [40.0] * 3, 1, 0.5, 1.0, effective_runs=2.0)) is None
    with pytest.raises(ValueError, match="effective_runs must be > 0"):
        unc.goodness_of_fit([1.0] * 3, [1.0] * 3, 1, 0.5, 1.0, effective_runs=0.0)

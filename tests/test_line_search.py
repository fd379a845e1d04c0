"""The line search's expansion (``Config.line_search_expansions``): its pieces on known
functions, and a Newton step of a buckling film with and without it; the step bound's
choice of the stencils it advances."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax.line_search import _smallest_bounds, box_limit, expand
from ipcjax.model import Config, Controls, Params, build_model
from ipcjax.step import advance, make_state
from scenes.film import film_grid, lumped_mass


def test_box_limit_is_the_first_face_the_segment_meets():
    x = jnp.zeros((2, 3))
    box = (jnp.zeros((2, 3)), jnp.ones((2, 3)))
    dx = jnp.zeros((2, 3)).at[0, 0].set(0.1).at[1, 2].set(-0.1)
    # +x leaves lo..hi+0.5 at α = 15; −z leaves lo−0.5 at α = 5
    assert float(box_limit(x, dx, box, 0.5)) == 5.0
    assert float(box_limit(x, dx.at[1, 2].set(0.0), box, 0.5)) == 15.0
    assert float(box_limit(x, jnp.zeros((2, 3)), box, 0.5)) == np.inf


@pytest.mark.parametrize("below", [0, 1, 63, 64, 65, 200])
def test_the_smallest_single_bounds_are_top_ks_rows_and_value(below):
    """The step bound advances the k smallest single bounds: the same rows as lax.top_k
    (ties to the lower row) and the same (k+1)-th value, with at most k rows below 1 (two
    compactions) and with more (top_k itself)."""
    rng = np.random.default_rng(below)
    n, k = 500, 64
    single = np.ones(n)
    rows = rng.choice(n, below, replace=False)
    single[rows] = rng.choice(np.array([0.0, 0.25, 0.9, 0.9]), below)  # ties below 1 too
    sel, rest = jax.jit(_smallest_bounds, static_argnums=1)(jnp.asarray(single), k)
    neg, ref = jax.lax.top_k(-jnp.asarray(single), k + 1)
    assert sorted(np.asarray(sel).tolist()) == sorted(np.asarray(ref[:k]).tolist())
    assert float(rest) == float(-neg[k]) == (1.0 if below <= k else float(np.sort(single)[k]))
    assert len(set(np.asarray(sel).tolist())) == k  # k distinct rows, no fill repeated


def _along(alpha_star):
    """Φ(x + αΔx) = (α − α*)² with x = 0, Δx = e₁; Φ(x) = α*², ∇Φ·Δx = −2α*."""
    phi = lambda z: (z[0] - alpha_star) ** 2
    return phi, jnp.zeros(1), jnp.ones(1), alpha_star ** 2, -2.0 * alpha_star


def test_expand_doubles_while_phi_falls_and_stops_at_its_limits():
    cfg = Config()
    phi, x, dx, phi0, slope = _along(5.0)
    # α: 1 → 2 (Φ 16 → 9) → 4 (→ 1) → 8 (Φ 9, rises): stops at 4 after 3 doublings tried
    a, v, trials = expand(phi, x, dx, cfg, phi0=phi0, phi1=phi(x + dx), slope=slope, alpha_max=64.0, doublings=6)
    assert (float(a), float(v), int(trials)) == (4.0, 1.0, 3)
    # the cap on α (step bound, candidate box) and on the doublings
    run = lambda cap, n: float(expand(phi, x, dx, cfg, phi0=phi0, phi1=phi(x + dx), slope=slope, alpha_max=cap,
                                      doublings=n)[0])
    assert run(3.9, 6) == 2.0 and run(64.0, 1) == 2.0
    # a minimum at α* = 1 (the Newton step of a quadratic): no doubling
    phi, x, dx, phi0, slope = _along(1.0)
    assert run(64.0, 6) == 1.0


@pytest.mark.slow  # two step programs (expansions 0 and 4), ≈ 90 s in the suite; the expansion is off by
# default and its pieces are checked on known functions above (test_expand_doubles_while_phi_falls_and_stops_at_its_limits)
def test_expanded_newton_step_reaches_the_same_minimiser_of_a_buckling_film():
    """A 6 × 6 film squeezed from two sides: the projected membrane tangent (S₊) is stiffer
    than Φ along the buckling mode, so full Newton steps fall further than predicted and
    the expansion takes some; the step ends at the minimiser the plain line search finds,
    within the Newton tolerance, with every gap kept."""
    n, tol, dt = 6, 1e-6, 1 / 240
    pos, tris = film_grid(n, 0.04, z=0.05)
    pos[:, 2] += 1e-5 * np.random.default_rng(0).standard_normal(len(pos))  # break the symmetry
    model = build_model(pos, tris, lumped_mass(pos, tris))
    cols = np.arange(len(pos)) % n
    idx = np.concatenate([np.flatnonzero(cols == 0), np.flatnonzero(cols == n - 1)])
    target = pos[idx].copy()
    target[:n, 0] += 0.1 * dt       # left edge in, right edge in, at 0.1 m/s
    target[n:, 0] -= 0.1 * dt
    ctl = Controls.empty(len(pos), tolerance=tol, n_supports=len(idx))._replace(
        support_index=jnp.asarray(idx, jnp.int32), support_k=jnp.full(len(idx), 50.0),
        support_target=jnp.asarray(target))
    out = {}
    for e in (0, 4):
        st, rep = advance(model, Params.film_defaults(), make_state(pos), ctl, dt,
                          config=Config(line_search_expansions=e))
        assert rep.ok, rep.reason
        out[e] = (np.asarray(st.x), rep)
    assert out[0][1].expansions == 0
    assert out[4][1].expansions >= 1
    moved = np.abs(out[0][0] - pos).max()
    assert moved > 1e-3  # the step did buckle the film (mm), far beyond the tolerance
    assert np.abs(out[4][0] - out[0][0]).max() < 2 * tol
    assert out[4][1].min_gap > Config().min_gap

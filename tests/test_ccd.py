"""Conservative step bound along the current separating normal (ipcjax.ccd).

The bound is checked against the exact distance on a dense sample of the path
x + α Δx, α ∈ [0, α_max]: it must never reach the offset.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ipcjax  # noqa: F401  (float64)
from ipcjax import ccd
from ipcjax import distance as D
from ipcjax.candidates import ContactKind as K
N_ALPHA = 65  # samples of α along each path

BATCH = 256  # batched calls are padded to this size: one compilation per function


def _padded(f):
    """Run batched ``f`` on inputs padded to BATCH rows (repeating row 0), trim the output."""

    def g(*args):
        n = len(args[0])
        assert n <= BATCH
        pad = [np.concatenate([np.asarray(a), np.repeat(np.asarray(a)[:1], BATCH - n, axis=0)]) for a in args]
        return np.asarray(f(*pad))[:n]

    return g


def _contact_weights(X, kind):
    """Current closest-point weights of a stencil of any kind (how a solver calls the bound)."""
    w_pt, _ = D.point_triangle_weights(*X)
    w_ee, _ = D.edge_edge_weights(*X)
    return jnp.where(kind == K.EE, w_ee, jnp.where(kind == K.SS, D.sphere_pair_weights(), w_pt))


def _contact_step(X, dX, offset, kind):
    return ccd.stencil_max_step(X, dX, _contact_weights(X, kind), offset, kind)


# one compiled function for all kinds: the step bound and the distance along the path
_step = _padded(jax.jit(jax.vmap(_contact_step)))
_weights = _padded(jax.jit(jax.vmap(_contact_weights)))
_pt_step = jax.jit(ccd.point_triangle_max_step)
_ee_step = jax.jit(ccd.edge_edge_max_step)
_sp_step = jax.jit(ccd.sphere_sphere_max_step)
_normal = _padded(jax.jit(jax.vmap(lambda X, w: D.stencil_distance(X, w)[1])))


def _path_distance(X, dX, kind, alphas):
    """Exact distance of the contact at X + α dX for every α."""
    def one(a):
        Y = X + a * dX
        return jnp.where(kind == K.EE, D.edge_edge_distance(*Y),
                         jnp.where(kind == K.SS, D.point_point_distance(Y[0], Y[1]),
                                   D.point_triangle_distance(*Y)))

    return jax.vmap(one)(alphas)


@_padded
@jax.jit
def _min_path_distance(X, dX, kind, alpha):
    """Minimum distance over a dense sample of α' ∈ [0, alpha], batched over contacts."""
    ts = jnp.linspace(0.0, 1.0, N_ALPHA)
    return jax.vmap(lambda x, dx, k, a: jnp.min(_path_distance(x, dx, k, a * ts)))(X, dX, kind, alpha)


def _contacts(rng, n, kind):
    """Random separated stencils of one kind, scaled 1e-4 .. 1 m."""
    scale = 10.0 ** rng.uniform(-4, 0, size=(n, 1, 1))
    X = rng.normal(size=(n, 4, 3)) * scale
    if kind == K.SS:
        X[:, 2] = X[:, 3] = X[:, 1]
    return X, scale


def _distance(X, kind):
    n = len(X)
    return np.asarray(_min_path_distance(X, np.zeros_like(X), np.full(n, kind, np.int32), np.zeros(n)))


def _random_motions(seed, kind):
    """BATCH separated stencils of one kind with offsets below their distance and
    displacements from a tenth to ten times the distance, in random directions.
    Returns (X, dX, d, offset, kinds)."""
    rng = np.random.default_rng(seed)
    n = BATCH
    X, _ = _contacts(rng, n, kind)
    d = _distance(X, kind)
    offset = d * rng.uniform(0.0, 0.9, size=n)
    dX = rng.normal(size=X.shape) * d[:, None, None] * 10.0 ** rng.uniform(-1, 1, size=(n, 1, 1))
    if kind == K.SS:
        dX[:, 2] = dX[:, 3] = dX[:, 1]
    return X, dX, d, offset, np.full(n, kind, np.int32)


@pytest.mark.parametrize("kind", list(K))
def test_random_motion_never_reaches_offset(kind):
    X, dX, d, offset, kinds = _random_motions(int(kind), kind)
    n = len(X)
    alpha = np.asarray(_step(X, dX, offset, kinds))
    assert np.all((alpha >= 0.0) & (alpha <= 1.0))
    assert np.sum(alpha < 1.0) >= n // 4, "the bound is active in a good share of the samples"
    assert np.all(alpha > 0.0), "a separated contact always allows some motion"
    dmin = np.asarray(_min_path_distance(X, dX, kinds, alpha))
    assert np.all(dmin > offset)


def _crossing(rng, n, kind):
    """Contacts at gap h driven straight through each other by twice the gap (+ sliding)."""
    X, dX, h = [], [], []
    for _ in range(n):
        s = 10.0 ** rng.uniform(-4, 0)
        g = s * 10.0 ** rng.uniform(-3, -1)
        slide = rng.normal(size=3) * 0.1 * g
        if kind in (K.VT, K.SF):  # a sphere centre against a face moves like a vertex
            T = rng.normal(size=(3, 3)) * s
            nrm = np.cross(T[1] - T[0], T[2] - T[0])
            nrm /= np.linalg.norm(nrm)
            slide -= (slide @ nrm) * nrm
            p = rng.dirichlet(np.ones(3) * 5) @ T + g * nrm
            x = np.stack([p, *T])
            dx = np.stack([-2 * g * nrm + slide, slide * 0.5, slide * 0.5, slide * 0.5])
        elif kind == K.EE:
            a0, a1, v = rng.normal(size=(3, 3)) * s
            nrm = np.cross(a1 - a0, v)
            nrm /= np.linalg.norm(nrm)
            slide -= (slide @ nrm) * nrm
            c = a0 + rng.uniform(0.2, 0.8) * (a1 - a0)
            lam = rng.uniform(0.2, 0.8)
            b0, b1 = c - lam * v - g * nrm, c + (1 - lam) * v - g * nrm
            x = np.stack([a0, a1, b0, b1])
            up = rng.uniform(0, 1)  # share the motion between the edges
            dx = np.stack([-2 * g * (1 - up) * nrm + slide] * 2 + [2 * g * up * nrm] * 2)
        else:
            c0 = rng.normal(size=3) * s
            nrm = rng.normal(size=3)
            nrm /= np.linalg.norm(nrm)
            x = np.stack([c0, c0 - g * nrm, c0 - g * nrm, c0 - g * nrm])
            dx = np.stack([-2 * g * nrm, np.zeros(3), np.zeros(3), np.zeros(3)])
        X.append(x)
        dX.append(dx)
        h.append(g)
    return np.array(X), np.array(dX), np.array(h)


@pytest.mark.parametrize("kind", list(K))
def test_fast_crossing_is_stopped_before_contact(kind):
    """Moving through the other primitive by twice the gap: the bound lies in (0, 0.5)."""
    n = 100
    X, dX, h = _crossing(np.random.default_rng(10 + int(kind)), n, kind)
    kinds = np.full(n, kind, np.int32)
    d = _distance(X, kind)
    assert np.allclose(d, h, rtol=1e-9)
    alpha = np.asarray(_step(X, dX, np.zeros(n), kinds))
    assert np.all((alpha > 0.0) & (alpha < 0.5))
    assert np.allclose(alpha, 0.45, rtol=1e-9), "pure normal approach at 2 g: 0.9 · g / (2 g)"
    # the unbounded step would pass through: the end point is on the other side
    assert np.all(_min_path_distance(X, dX, kinds, np.ones(n)) < 1e-9 * h)
    assert np.all(_min_path_distance(X, dX, kinds, alpha) > 0.0)


@pytest.mark.parametrize("kind", list(K))
def test_separating_motion_allows_full_step(kind):
    rng = np.random.default_rng(20 + int(kind))
    n = 100
    X, _ = _contacts(rng, n, kind)
    kinds = np.full(n, kind, np.int32)
    nrm = _normal(X, _weights(X, kinds))
    # first primitive moves along +n, second along −n, each by a large amount
    sign = np.array([1.0, 1.0, -1.0, -1.0]) if kind == K.EE else np.array([1.0, -1.0, -1.0, -1.0])
    dX = sign[None, :, None] * np.asarray(nrm)[:, None, :] * 10.0
    d = _distance(X, kinds[0])
    alpha = np.asarray(_step(X, dX, 0.5 * d, kinds))
    assert np.all(alpha == 1.0)
    assert np.all(np.asarray(_step(X, np.zeros_like(X), 0.5 * d, kinds)) == 1.0)


def test_approach_formulas_and_named_wrappers():
    """The per-primitive wrappers agree with the stencil form and the spec's formulas."""
    p, t0, t1, t2 = np.array([[0.2, 0.2, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    z = np.zeros(3)
    ez = np.array([0.0, 0.0, 1.0])
    # gap 1 − 0.25 = 0.75; u = (−1, 0, 0.5, 0) → approach 1.5 → 0.9 · 0.5
    a = _pt_step(p, t0, t1, t2, -ez, z, 0.5 * ez, z, 0.25)
    assert abs(float(a) - 0.45) <= 1e-15
    # slow approach (g / approach = 7.5 > 1) → the full step
    assert float(_pt_step(p, t0, t1, t2, -0.1 * ez, z, z, z, 0.25)) == 1.0
    # edges along x at z = 1 and along y at z = 0: EE approach max(u2, u3) − min(u0, u1)
    a0, a1, b0, b1 = [np.array(v, float) for v in ([-1, 0, 1], [1, 0, 1], [0, -1, 0], [0, 1, 0])]
    a = _ee_step(a0, a1, b0, b1, -ez, z, 0.2 * ez, z, 0.0)
    assert abs(float(a) - 0.9 / 1.2) <= 1e-15
    c0, c1 = np.array([0.0, 0.0, 3.0]), z
    a = _sp_step(c0, c1, -2 * ez, 2 * ez, 2.0)  # gap 1, approach 4
    assert abs(float(a) - 0.225) <= 1e-15
    u = jnp.array([0.1, -0.3, 0.4, 0.2])
    assert float(ccd.approach_speed(u, K.VT)) == pytest.approx(0.3)
    assert float(ccd.approach_speed(u, K.SF)) == pytest.approx(0.3)
    assert float(ccd.approach_speed(u, K.EE)) == pytest.approx(0.7)
    assert float(ccd.approach_speed(u, K.SS)) == pytest.approx(-0.4)


def test_mixed_kinds_vmap_and_infeasible_starts():
    rng = np.random.default_rng(30)
    X, dX = rng.normal(size=(2, 4, 4, 3))
    X[2, 2:] = X[2, 1]
    dX[2, 2:] = dX[2, 1]
    X[3], dX[3] = X[0], dX[0]
    kinds = np.array([K.VT, K.EE, K.SS, K.SF], np.int32)
    alpha = np.asarray(_step(X, dX, np.full(4, 0.01), kinds))
    ref = [
        _pt_step(*X[0], *dX[0], 0.01),
        _ee_step(*X[1], *dX[1], 0.01),
        _sp_step(X[2, 0], X[2, 1], dX[2, 0], dX[2, 1], 0.01),
        _pt_step(*X[0], *dX[0], 0.01),
    ]
    assert np.allclose(alpha, ref, rtol=1e-14, atol=0)
    assert np.any(alpha < 1.0)
    # already inside the offset: no approaching motion is allowed, separating motion is
    d = _distance(X[:1], K.VT)[0]
    nrm = _normal(X[:1], _weights(X[:1], kinds[:1]))[0]
    towards = np.stack([-nrm, np.zeros(3), np.zeros(3), np.zeros(3)])
    alpha = _step(X[[0, 0]], np.stack([towards, -towards]), np.full(2, 2 * d), kinds[[0, 0]])
    assert np.array_equal(alpha, [0.0, 1.0])
    # touching (d = 0): no separating normal, no step
    Y = np.stack([X[0, 1], *X[0, 1:]])
    assert _step(Y[None], dX[:1], np.zeros(1), kinds[:1])[0] == 0.0


# --------------------------------------------------------------- conservative advancement

PASSES = 16
_advance = _padded(jax.jit(jax.vmap(
    lambda X, dX, o, k, p: ccd.stencil_advance(X, dX, o, k, _contact_weights, p)[0])))


@pytest.mark.parametrize("kind", list(K))
def test_advancement_is_safe_and_never_below_the_single_bound(kind):
    """Random motions: more passes never shrink α, one pass is the single bound, and the
    path up to the advanced α keeps the distance above the offset (dense sampling)."""
    X, dX, d, offset, kinds = _random_motions(40 + int(kind), kind)
    n = len(X)
    single = np.asarray(_step(X, dX, offset, kinds))
    one = np.asarray(_advance(X, dX, offset, kinds, np.ones(n, np.int32)))
    many = np.asarray(_advance(X, dX, offset, kinds, np.full(n, PASSES, np.int32)))
    assert np.array_equal(one, single)
    assert np.all(many >= single) and np.all(many <= 1.0)
    if kind != K.SS:  # a sphere pair has one normal: rotation cannot fool the single bound
        assert np.sum(many > single * 1.01) >= n // 20, "advancement gains on a share of random motions"
    dmin = np.asarray(_min_path_distance(X, dX, kinds, many))
    g = d - offset
    # the floor it advances to: 10% of the starting gap (what the single bound allows too)
    assert np.all(dmin - offset > 0.1 * g * (1 - 1e-6) - 1e-15)


@pytest.mark.parametrize("kind", [K.VT, K.EE])
def test_rotation_about_the_contact_advances_to_the_full_step(kind):
    """A stencil turning about its closest point (the tie phase's limiting EE contact): the
    single bound sees the vertices' normal motion and allows ~10%; the closest points do
    not approach, so advancement reaches (nearly) the full step."""
    g = 10e-6
    if kind == K.VT:  # point above the centre of a triangle that tilts about its centroid
        T = np.array([[-1.0, -1.0, 0.0], [1.0, -1.0, 0.0], [0.0, 1.0, 0.0]]) * 0.005
        T -= T.mean(axis=0)
        X = np.vstack([[0.0, 0.0, g], T])
        dX = np.zeros((4, 3))
        dX[1:, 2] = 0.02 * T[:, 1]  # small tilt about x through the centroid: z += 0.02·y
    else:  # crossed edges; the lower edge rotates about the common normal's foot
        X = np.array([[-0.005, 0.0, g], [0.005, 0.0, g], [0.0, -0.005, 0.0], [0.0, 0.005, 0.0]])
        dX = np.zeros((4, 3))
        dX[2, 2], dX[3, 2] = -0.02 * 0.005, 0.02 * 0.005  # tilt about x through the origin
    Xb, dXb = X[None], dX[None]
    kinds = np.array([kind], np.int32)
    single = float(_step(Xb, dXb, np.zeros(1), kinds)[0])
    many = float(_advance(Xb, dXb, np.zeros(1), kinds, np.array([PASSES], np.int32))[0])
    assert single < 0.15
    assert many > 0.9
    assert float(_min_path_distance(Xb, dXb, kinds, np.array([many]))[0]) > 0.1 * g


@pytest.mark.parametrize("kind", list(K))
def test_advancement_stops_a_head_on_crossing_where_the_single_bound_does(kind):
    n = 50
    X, dX, h = _crossing(np.random.default_rng(60 + int(kind)), n, kind)
    kinds = np.full(n, kind, np.int32)
    many = np.asarray(_advance(X, dX, np.zeros(n), kinds, np.full(n, PASSES, np.int32)))
    # the crossings slide a little, so the closest points move: allow a few % over 0.45
    assert np.all((many >= 0.45 * (1 - 1e-9)) & (many < 0.5))
    assert np.all(_min_path_distance(X, dX, kinds, many) > 0.09 * h)

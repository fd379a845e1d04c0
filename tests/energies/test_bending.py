"""Bending: signed dihedral angle (Newton convention), its hand-derived gradient and Hessian,
the wrapped hinge energy, Discrete Shells (docs/spec.md §7 regression list) and hinge rest data."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax.energies.bending import (
    dihedral_angle,
    dihedral_angle_gradient,
    dihedral_angle_hessian,
    discrete_shell_energy,
    discrete_shell_gradient,
    discrete_shell_hessian,
    discrete_shell_hessian_psd,
    discrete_shell_kappa,
    discrete_shell_moment,
    discrete_shell_weight,
    flexural_rigidity,
    hinge_energy,
    hinge_gradient,
    hinge_hessian,
    hinge_hessian_psd,
    hinge_stiffness,
    hinges_rest,
)
from ipcjax.topology import hinge_topology
from tests.helpers import assert_nonzero, central_gradient, central_jacobian, rel_err


def _rotation(rng):
    Q, R = np.linalg.qr(rng.normal(size=(3, 3)))
    Q = Q * np.sign(np.diag(R))
    return Q if np.linalg.det(Q) > 0 else -Q


def _hinge(alpha, seed=0, scale=1.0, sa=0.4, sb=0.7, rigid=True):
    """Hinge (a, b, c, d) with edge c->d on the x axis, a in the xy half-plane y > 0, and b
    rotated about the edge by alpha from the flat position; theta = alpha by construction."""
    rng = np.random.default_rng(seed)
    c, d = np.zeros(3), np.array([1.0, 0.0, 0.0])
    a = np.array([sa, 0.8, 0.0])
    yb = 0.9
    b = np.array([sb, -yb * np.cos(alpha), -yb * np.sin(alpha)])
    X = scale * np.stack([a, b, c, d])
    if rigid:
        X = X @ _rotation(rng).T + scale * rng.normal(size=3)
    return X


def _newton_theta(X):
    """Newton's eval_bending angle, written out in NumPy: indices (i, j, k, l) = (a, b, c, d)."""
    x1, x2, x3, x4 = X
    n1 = np.cross(x3 - x1, x4 - x1)
    n2 = np.cross(x4 - x2, x3 - x2)
    e = x4 - x3
    n1, n2, e = n1 / np.linalg.norm(n1), n2 / np.linalg.norm(n2), e / np.linalg.norm(e)
    return np.arctan2(np.dot(np.cross(n1, n2), e), np.dot(n1, n2))


def _seed002_theta(x0, x1, x2, x3):
    """The Discrete Shells reference (docs/spec.md §7): arccos of oriented normals, negated when (n2 x n1).(x1 - x2) < 0."""
    n1 = np.cross(x1 - x0, x2 - x0)
    n2 = np.cross(x2 - x3, x1 - x3)
    t = np.arccos(np.clip(n1 @ n2 / (np.linalg.norm(n1) * np.linalg.norm(n2)), -1.0, 1.0))
    return -t if np.cross(n2, n1) @ (x1 - x2) < 0 else t


def _th(X):
    X = jnp.asarray(X)
    return dihedral_angle(X[0], X[1], X[2], X[3])


# Fold angles: flat, moderate both ways, sharp, and next to the +-pi branch of atan2.
ALPHAS = [0.0, 0.3, -1.2, 2.5, np.pi - 1e-3, -(np.pi - 1e-3)]
# Opposite-vertex feet: inside the edge, and beyond either end (obtuse faces).
FEET = [(0.4, 0.7), (-0.3, 1.4)]


# ---------------------------------------------------------------------------------------
# Angle convention and topology
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", ALPHAS)
def test_angle_matches_construction_newton_and_seed002(alpha):
    X = _hinge(alpha, seed=1)
    theta = float(_th(X))
    assert theta == pytest.approx(alpha, abs=1e-12)
    assert theta == pytest.approx(_newton_theta(X), abs=1e-12)
    # The reference's (x0, x1, x2, x3) is our (a, c, d, b).
    assert theta == pytest.approx(_seed002_theta(*X[[0, 2, 3, 1]]), abs=1e-7)


def test_angle_is_the_same_seen_from_the_other_face():
    """Swapping (a, b) and (c, d) together describes the same hinge: same signed angle."""
    for alpha in ALPHAS[1:]:
        X = _hinge(alpha, seed=2)
        assert float(_th(X[[1, 0, 3, 2]])) == pytest.approx(float(_th(X)), abs=1e-12)


def test_two_triangle_mesh_hinge_order_and_fold_sign():
    """hinge_topology follows Newton's MeshAdjacency: (o0, o1, v0, v1), v0->v1 in the first
    triangle's winding. Flat -> 0; folding b towards the faces' normal side -> theta < 0."""
    V = np.array([[0.5, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.5, -1.0, 0.0]])
    tris = np.array([[0, 1, 2], [2, 1, 3]])  # both wind counter-clockwise seen from +z
    h = hinge_topology(tris).hinges
    np.testing.assert_array_equal(h, [[0, 3, 1, 2]])
    assert float(_th(V[h[0]])) == 0.0
    up, down = V.copy(), V.copy()
    up[3, 2], down[3, 2] = 0.3, -0.3  # normals point to +z
    assert float(_th(up[h[0]])) < 0.0 and _newton_theta(up[h[0]]) < 0.0
    assert float(_th(down[h[0]])) > 0.0 and _newton_theta(down[h[0]]) > 0.0
    assert float(_th(up[h[0]])) == pytest.approx(-float(_th(down[h[0]])), abs=1e-15)


def _newton_edge_indices(tris):
    """Newton MeshAdjacency rule, restated: first occurrence sets (o0, v0, v1), second sets o1."""
    rows = {}
    for tri in tris:
        for k in range(3):
            v0, v1, o = int(tri[k]), int(tri[(k + 1) % 3]), int(tri[(k + 2) % 3])
            key = (min(v0, v1), max(v0, v1))
            if key in rows:
                rows[key][1] = o
            else:
                rows[key] = [o, -1, v0, v1]
    return {tuple(r) for r in rows.values() if r[1] >= 0}


def test_hinge_topology_matches_newton_rule_on_a_grid():
    n = 5
    idx = lambda i, j: i + n * j
    tris = []
    for j in range(n - 1):
        for i in range(n - 1):
            tris += [(idx(i, j), idx(i + 1, j), idx(i + 1, j + 1)), (idx(i, j), idx(i + 1, j + 1), idx(i, j + 1))]
    h = hinge_topology(np.array(tris)).hinges
    assert {tuple(r) for r in h.tolist()} == _newton_edge_indices(tris)


def test_sphere_hinges_are_convex_positive():
    """Outward-wound closed surface: every hinge folds away from the normals, theta > 0."""
    t = (1 + 5**0.5) / 2
    V = np.array([(-1, t, 0), (1, t, 0), (-1, -t, 0), (1, -t, 0), (0, -1, t), (0, 1, t),
                  (0, -1, -t), (0, 1, -t), (t, 0, -1), (t, 0, 1), (-t, 0, -1), (-t, 0, 1)], float)
    F = np.array([(0, 11, 5), (0, 5, 1), (0, 1, 7), (0, 7, 10), (0, 10, 11), (1, 5, 9), (5, 11, 4),
                  (11, 10, 2), (10, 7, 6), (7, 1, 8), (3, 9, 4), (3, 4, 2), (3, 2, 6), (3, 6, 8),
                  (3, 8, 9), (4, 9, 5), (2, 4, 11), (6, 2, 10), (8, 6, 7), (9, 8, 1)])
    theta0, edge_len, area_pair = hinges_rest(V, hinge_topology(F).hinges)
    assert theta0.shape == (30,)
    # Icosahedron: supplement of the dihedral angle arccos(-sqrt(5)/3).
    np.testing.assert_allclose(theta0, np.pi - np.arccos(-np.sqrt(5) / 3), rtol=1e-12)
    np.testing.assert_allclose(edge_len, 2.0, rtol=1e-12)
    np.testing.assert_allclose(area_pair, 2 * np.sqrt(3), rtol=1e-12)  # two faces of edge 2


# ---------------------------------------------------------------------------------------
# Angle derivatives
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("feet", FEET)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_angle_gradient_and_hessian(alpha, feet):
    X = _hinge(alpha, seed=4, sa=feet[0], sb=feet[1])
    x = X.reshape(12)
    f = lambda z: _th(jnp.reshape(z, (4, 3)))
    g = np.asarray(dihedral_angle_gradient(jnp.asarray(X))).reshape(12)
    H = np.asarray(dihedral_angle_hessian(jnp.asarray(X)))
    assert_nonzero(g)
    assert_nonzero(H, "Hessian")
    assert rel_err(g, jax.grad(f)(jnp.asarray(x))) < 1e-9
    assert rel_err(H, jax.hessian(f)(jnp.asarray(x))) < 1e-9
    assert rel_err(g, central_gradient(f, x, h=1e-6)) < 1e-6
    gfun = lambda z: np.asarray(dihedral_angle_gradient(jnp.asarray(z).reshape(4, 3))).reshape(12)
    assert rel_err(H, central_jacobian(gfun, x, h=1e-6)) < 1e-6
    # Translation and rotation invariance: the gradient sums to zero, and so does its moment.
    G = g.reshape(4, 3)
    assert np.max(np.abs(G.sum(0))) < 1e-12 * np.max(np.abs(G))
    assert np.max(np.abs(np.cross(X, G).sum(0))) < 1e-11 * np.max(np.abs(G)) * np.max(np.abs(X))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_angle_derivatives_scale(scale):
    X = _hinge(0.7, seed=5, scale=scale)
    g1 = np.asarray(dihedral_angle_gradient(jnp.asarray(X)))
    g0 = np.asarray(dihedral_angle_gradient(jnp.asarray(X / scale)))
    H1 = np.asarray(dihedral_angle_hessian(jnp.asarray(X)))
    H0 = np.asarray(dihedral_angle_hessian(jnp.asarray(X / scale)))
    assert rel_err(g1 * scale, g0) < 1e-12
    assert rel_err(H1 * scale**2, H0) < 1e-11


# ---------------------------------------------------------------------------------------
# The specification's hinge energy (docs/spec.md §3)
# ---------------------------------------------------------------------------------------
K_THETA = 2.5


@pytest.mark.parametrize(
    "alpha, theta0",
    [(0.3, 0.0), (-1.2, 0.4), (2.5, -0.5), (3.1, 3.0), (-3.1, 3.0), (np.pi - 1e-3, 0.0), (-(np.pi - 1e-3), 0.0)],
)
def test_hinge_energy_derivatives(alpha, theta0):
    """Includes theta crossing +-pi at theta0 = 3 (wrap keeps delta = 0.1 and 0.183) and
    wrap(theta - theta0) next to its own +-pi branch."""
    X = _hinge(alpha, seed=6)
    x = X.reshape(12)
    f = lambda z: hinge_energy(jnp.reshape(z, (4, 3)), theta0, K_THETA)
    g = np.asarray(hinge_gradient(jnp.asarray(X), theta0, K_THETA)).reshape(12)
    H = np.asarray(hinge_hessian(jnp.asarray(X), theta0, K_THETA))
    assert_nonzero(g)
    assert rel_err(g, jax.grad(f)(jnp.asarray(x))) < 1e-9
    assert rel_err(H, jax.hessian(f)(jnp.asarray(x))) < 1e-9
    assert rel_err(g, central_gradient(f, x, h=1e-6)) < 1e-6
    gfun = lambda z: np.asarray(hinge_gradient(jnp.asarray(z).reshape(4, 3), theta0, K_THETA)).reshape(12)
    assert rel_err(H, central_jacobian(gfun, x, h=1e-6)) < 1e-6
    delta = np.arctan2(np.sin(alpha - theta0), np.cos(alpha - theta0))
    assert float(f(x)) == pytest.approx(0.5 * K_THETA * delta**2, rel=1e-12)


def test_hinge_energy_wrap_is_continuous_through_pi():
    theta0 = 3.0
    e = [float(hinge_energy(jnp.asarray(_hinge(a, seed=7)), theta0, K_THETA)) for a in (np.pi - 1e-9, -np.pi + 1e-9)]
    assert e[0] == pytest.approx(e[1], rel=1e-7)
    assert e[0] == pytest.approx(0.5 * K_THETA * (np.pi - 3.0) ** 2, rel=1e-7)


@pytest.mark.parametrize("alpha", [0.0, 0.4, -2.0])
def test_hinge_zero_at_rest_and_rigid_invariance(alpha):
    X = _hinge(alpha, seed=8)
    assert float(hinge_energy(jnp.asarray(X), alpha, K_THETA)) == pytest.approx(0.0, abs=1e-24)
    assert float(jnp.max(jnp.abs(hinge_gradient(jnp.asarray(X), alpha, K_THETA)))) < 1e-12
    Q = _rotation(np.random.default_rng(9))
    Y = X @ Q.T + np.array([1.0, -2.0, 0.5])
    e0 = float(hinge_energy(jnp.asarray(X), alpha + 0.3, K_THETA))
    assert e0 > 0
    assert float(hinge_energy(jnp.asarray(Y), alpha + 0.3, K_THETA)) == pytest.approx(e0, rel=1e-10)


def test_hinge_gauss_newton_hessian():
    X = _hinge(0.9, seed=10)
    Hgn = np.asarray(hinge_hessian_psd(jnp.asarray(X), 0.2, K_THETA))
    w = np.linalg.eigvalsh(Hgn)
    assert w.min() >= -1e-12 * w.max() and np.sum(w > 1e-9 * w.max()) == 1  # PSD, rank 1
    # Equal to the exact Hessian at the rest angle (delta = 0).
    assert rel_err(Hgn, np.asarray(hinge_hessian(jnp.asarray(X), 0.9, K_THETA))) < 1e-12


def test_hinge_stiffness_film_numbers():
    # D = 315e6 * (30e-6)^3 / (12 * (1 - 0.45^2)) = 8.505e-6 / 9.57 = 8.887147335423197e-7 N m
    assert float(flexural_rigidity(315e6, 0.45, 30e-6)) == pytest.approx(8.887147335423197e-7, rel=1e-13)
    # l = 2 cm, A = 2 cm^2: k = 6 D l^2 / A = 6 * 8.887147e-7 * 4e-4 / 2e-4 = 1.0664576802507837e-5 N m
    k = hinge_stiffness(315e6, 0.45, 30e-6, 0.02, 2e-4)
    assert float(k) == pytest.approx(1.0664576802507837e-5, rel=1e-13)


# ---------------------------------------------------------------------------------------
# Discrete Shells (docs/spec.md §7 regression list)
# ---------------------------------------------------------------------------------------
def _shell_geometry(alpha):
    """Edge L0 = 2 cm, both apexes 1 cm from the edge: A1 + A2 = 2 cm^2, w = 3 L0^2/A = 6."""
    c, d = np.zeros(3), np.array([0.02, 0.0, 0.0])
    a = np.array([0.01, 0.01, 0.0])
    b = np.array([0.01, -0.01 * np.cos(alpha), -0.01 * np.sin(alpha)])
    return np.stack([a, b, c, d])


def test_discrete_shell_calibrated_energy_and_moment():
    # kappa = E h^3 / (24 (1 - nu^2)), h = r_i + r_j = 15 um + 15 um:
    #       = 315e6 * 2.7e-14 / (24 * 0.7975) = 8.505e-6 / 19.14 = 4.4435736677115987e-7 N m (= D/2)
    kappa = discrete_shell_kappa(315e6, 0.45, 15e-6 + 15e-6)
    assert float(kappa) == pytest.approx(4.4435736677115987e-7, rel=1e-13)
    theta0, edge_len, area_pair = hinges_rest(_shell_geometry(0.1), np.array([[0, 1, 2, 3]]))
    assert float(edge_len[0]) == pytest.approx(0.02, rel=1e-14)
    assert float(area_pair[0]) == pytest.approx(2e-4, rel=1e-14)
    assert float(theta0[0]) == pytest.approx(0.1, abs=1e-14)
    w = discrete_shell_weight(edge_len[0], area_pair[0])
    assert float(w) == pytest.approx(6.0, rel=1e-14)
    X = jnp.asarray(_shell_geometry(0.3))
    # E = kappa w (0.3 - 0.1)^2 = 4.4435736677115987e-7 * 6 * 0.04 = 1.0664576802507837e-7 J
    assert float(discrete_shell_energy(X, theta0[0], kappa, w)) == pytest.approx(1.0664576802507837e-7, rel=1e-12)
    # moment = -2 kappa w (0.2) = -1.0664576802507837e-6 N m
    assert float(discrete_shell_moment(X, theta0[0], kappa, w)) == pytest.approx(-1.0664576802507837e-6, rel=1e-12)
    # Uniform scaling of the rest hinge leaves w unchanged (docs/spec.md §7).
    assert float(discrete_shell_weight(10 * edge_len[0], 100 * area_pair[0])) == pytest.approx(6.0, rel=1e-14)
    # Same D: the specification's hinge is twice the shell (k_theta/2 = 6 D l^2/(2A) = D w = 2 kappa w).
    k_theta = hinge_stiffness(315e6, 0.45, 30e-6, edge_len[0], area_pair[0])
    assert float(hinge_energy(X, theta0[0], k_theta)) == pytest.approx(
        2 * float(discrete_shell_energy(X, theta0[0], kappa, w)), rel=1e-12)


@pytest.mark.parametrize("theta_bar", [0.0, 0.7, -1.1])  # flat and curved rest hinges
def test_discrete_shell_rest_and_both_fold_signs(theta_bar):
    kappa, w = 1.3e-6, 4.0
    X0 = jnp.asarray(_hinge(theta_bar, seed=13, scale=0.01))
    assert float(discrete_shell_energy(X0, theta_bar, kappa, w)) == pytest.approx(0.0, abs=1e-30)
    assert float(jnp.max(jnp.abs(discrete_shell_gradient(X0, theta_bar, kappa, w)))) < 1e-15
    Xp = jnp.asarray(_hinge(theta_bar + 0.2, seed=13, scale=0.01))
    Xm = jnp.asarray(_hinge(theta_bar - 0.2, seed=13, scale=0.01))
    ep, em = (float(discrete_shell_energy(X, theta_bar, kappa, w)) for X in (Xp, Xm))
    assert ep == pytest.approx(kappa * w * 0.04, rel=1e-10) and em == pytest.approx(ep, rel=1e-10)
    mp, mm = (float(discrete_shell_moment(X, theta_bar, kappa, w)) for X in (Xp, Xm))
    assert mp < 0.0 < mm and mp == pytest.approx(-mm, rel=1e-10)


def test_discrete_shell_does_not_wrap():
    """The Discrete Shells reference subtracts the angles directly: theta = -3, theta_bar = 3 costs kappa w 36."""
    X = jnp.asarray(_hinge(-3.0, seed=14))
    assert float(discrete_shell_energy(X, 3.0, 1.0, 1.0)) == pytest.approx(36.0, rel=1e-12)
    assert float(hinge_energy(X, 3.0, 2.0)) == pytest.approx((2 * np.pi - 6.0) ** 2, rel=1e-10)


def test_discrete_shell_rigid_motion_invariance():
    X = _hinge(0.8, seed=15, scale=0.01)
    Q = _rotation(np.random.default_rng(16))
    e0 = float(discrete_shell_energy(jnp.asarray(X), 0.1, 2e-6, 3.0))
    e1 = float(discrete_shell_energy(jnp.asarray(X @ Q.T + 0.3), 0.1, 2e-6, 3.0))
    assert e0 > 0 and e1 == pytest.approx(e0, rel=1e-10)


@pytest.mark.parametrize("alpha, theta_bar", [(0.5, 0.0), (-0.4, 0.6), (2.8, 2.0), (-(np.pi - 1e-3), -2.5)])
def test_discrete_shell_derivatives(alpha, theta_bar):
    kappa, w = 1.7, 2.2
    X = _hinge(alpha, seed=17, sa=-0.2, sb=0.6)
    x = X.reshape(12)
    f = lambda z: discrete_shell_energy(jnp.reshape(z, (4, 3)), theta_bar, kappa, w)
    g = np.asarray(discrete_shell_gradient(jnp.asarray(X), theta_bar, kappa, w)).reshape(12)
    H = np.asarray(discrete_shell_hessian(jnp.asarray(X), theta_bar, kappa, w))
    assert_nonzero(g)
    assert rel_err(g, jax.grad(f)(jnp.asarray(x))) < 1e-9
    assert rel_err(H, jax.hessian(f)(jnp.asarray(x))) < 1e-9
    assert rel_err(g, central_gradient(f, x, h=1e-6)) < 1e-6
    gfun = lambda z: np.asarray(discrete_shell_gradient(jnp.asarray(z).reshape(4, 3), theta_bar, kappa, w)).reshape(12)
    assert rel_err(H, central_jacobian(gfun, x, h=1e-6)) < 1e-6
    # make_spd: PSD, and the exact Hessian where that already is PSD.
    Hp = np.asarray(discrete_shell_hessian_psd(jnp.asarray(X), theta_bar, kappa, w))
    scale = np.max(np.abs(H))
    assert np.linalg.eigvalsh(Hp).min() >= -1e-12 * scale
    if np.linalg.eigvalsh(H).min() >= 0.0:
        assert rel_err(Hp, H) < 1e-12
    else:
        assert rel_err(Hp, H) > 1e-8


def test_discrete_shell_psd_equals_exact_at_rest():
    X = jnp.asarray(_hinge(0.6, seed=18))
    H = np.asarray(discrete_shell_hessian(X, 0.6, 1.0, 2.0))  # 2 kappa w g g^T: PSD
    assert rel_err(np.asarray(discrete_shell_hessian_psd(X, 0.6, 1.0, 2.0)), H) < 1e-12


def test_hinges_rest_rejects_degenerate_face_and_names_hinge():
    V = np.array([[0.5, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.5, -1.0, 0.0], [2.0, 0.0, 0.0]])
    hinges = np.array([[0, 3, 1, 2], [0, 4, 1, 2]])  # hinge 1: b = (2, 0, 0) is on the edge line
    with pytest.raises(ValueError, match=r"hinge 1\b"):
        hinges_rest(V, hinges)
    theta0, _, _ = hinges_rest(V, hinges[:1])
    assert float(theta0[0]) == 0.0

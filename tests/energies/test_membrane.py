"""Membrane energies: rest frame, StVK and Neo-Hookean against autodiff and central differences,
PSD tangents, invariances and the film's physical coefficients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax.energies.membrane import (
    NEO_HOOKEAN,
    STVK,
    deformation_gradient,
    lame_from_young,
    neo_hookean_energy,
    neo_hookean_gradient,
    neo_hookean_hessian,
    neo_hookean_hessian_psd,
    positive_part_sym2,
    project_psd,
    stvk_energy,
    stvk_gradient,
    stvk_hessian,
    stvk_hessian_psd,
    triangle_rest,
    triangles_rest,
)
from tests.helpers import assert_nonzero, central_gradient, central_jacobian, rel_err

MATERIALS = {
    "stvk": (stvk_energy, stvk_gradient, stvk_hessian, stvk_hessian_psd),
    "neo_hookean": (neo_hookean_energy, neo_hookean_gradient, neo_hookean_hessian, neo_hookean_hessian_psd),
}
# In-plane linear maps applied to the flat rest triangle before a rigid motion.
DEFORMATIONS = {
    "stretched": np.diag([1.3, 1.15, 1.0]),
    "compressed": np.diag([0.8, 0.9, 1.0]),
    "sheared": np.array([[1.0, 0.4, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]),
    "mixed": np.diag([1.2, 0.85, 1.0]),
    "general": np.array([[1.1, 0.2, 0.0], [-0.15, 0.95, 0.0], [0.05, 0.1, 1.0]]),
}
SCALES = [1.0, 1e-2]  # m: unit triangle and a 1 cm film triangle
MU, LAM = lame_from_young(315e6, 0.45, 30e-6)


def _rotation(rng):
    Q, R = np.linalg.qr(rng.normal(size=(3, 3)))
    Q = Q * np.sign(np.diag(R))
    return Q if np.linalg.det(Q) > 0 else -Q


def _case(name, scale, seed=0):
    """(X_rest, X) rows = vertices: a flat triangle, deformed in plane, then rotated + translated."""
    rng = np.random.default_rng(seed)
    P = scale * np.array([[0.0, 0.0, 0.0], [1.0, 0.1, 0.0], [0.3, 0.9, 0.0]])
    Q0, Q1 = _rotation(rng), _rotation(rng)
    X_rest = P @ Q0.T + scale * rng.normal(size=3)
    X = (P @ DEFORMATIONS[name].T) @ Q1.T + scale * rng.normal(size=3)
    return X_rest, X


def _flat(fn, Dm_inv, area, mu, lam):
    return lambda x: fn(jnp.reshape(x, (3, 3)), Dm_inv, area, mu, lam)


# ---------------------------------------------------------------------------------------
# Rest frame
# ---------------------------------------------------------------------------------------
def test_triangle_rest_newton_convention():
    """Dm = [x1-x0, x2-x0] in a frame with e1 along x1-x0: Dm upper triangular, F = I at rest."""
    X_rest, _ = _case("general", 0.05, seed=3)
    Dm_inv, area = triangle_rest(X_rest)
    Dm = np.linalg.inv(np.asarray(Dm_inv))
    q, r = X_rest[1] - X_rest[0], X_rest[2] - X_rest[0]
    assert Dm[1, 0] == pytest.approx(0.0, abs=1e-15)
    assert Dm[0, 0] == pytest.approx(np.linalg.norm(q), rel=1e-13)  # e1 . q = |q|
    assert Dm[0, 1] == pytest.approx(q @ r / np.linalg.norm(q), rel=1e-12)
    assert Dm[1, 1] > 0.0
    assert float(area) == pytest.approx(0.5 * np.linalg.norm(np.cross(q, r)), rel=1e-12)
    # F^T F = I at rest whatever the rigid placement; columns of Dm are the 2D edges.
    F = np.asarray(deformation_gradient(jnp.asarray(X_rest), Dm_inv))
    np.testing.assert_allclose(F.T @ F, np.eye(2), atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(Dm, axis=0), [np.linalg.norm(q), np.linalg.norm(r)], rtol=1e-12)


def test_triangles_rest_vectorized_matches_single():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(6, 3))
    tris = np.array([[0, 1, 2], [2, 3, 4], [1, 5, 3]])
    Dm_inv, area = triangles_rest(X, tris)
    for k, t in enumerate(tris):
        d, a = triangle_rest(X[t])
        np.testing.assert_allclose(Dm_inv[k], d, rtol=1e-14)
        assert float(area[k]) == pytest.approx(float(a), rel=1e-14)


@pytest.mark.parametrize(
    "bad_vertex, why",
    [((2.0, 0.0, 0.0), "collinear"), ((1.0, 1e-12, 0.0), "near-degenerate"), ((np.nan, 0.0, 0.0), "non-finite")],
)
def test_triangles_rest_rejects_degenerate_and_names_it(bad_vertex, why):
    X = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0], bad_vertex])
    tris = np.array([[0, 1, 2], [1, 3, 2], [0, 1, 4]])  # triangle 2 is bad
    with pytest.raises(ValueError, match=r"triangle 2\b"):
        triangles_rest(X, tris)
    triangles_rest(X, tris[:2])  # the good ones pass


# ---------------------------------------------------------------------------------------
# Physical coefficients (independent arithmetic, numbers written out)
# ---------------------------------------------------------------------------------------
def test_film_lame_coefficients():
    # E h = 315e6 Pa * 30e-6 m = 9450 N/m.
    # mu  = 9450 / (2 * 1.45)          = 9450 / 2.9    = 3258.6206896551724 N/m
    # lam = 9450 * 0.45 / (1 - 0.2025) = 4252.5 / 0.7975 = 5332.2884012539185 N/m
    mu, lam = lame_from_young(315e6, 0.45, 30e-6)
    assert mu == pytest.approx(3258.6206896551724, rel=1e-13)
    assert lam == pytest.approx(5332.2884012539185, rel=1e-13)


# ---------------------------------------------------------------------------------------
# Energies at rest, invariances
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mat", MATERIALS)
def test_zero_energy_and_gradient_at_rest(mat):
    energy, grad, _, _ = MATERIALS[mat]
    X_rest, _ = _case("general", 1e-2)
    Dm_inv, area = triangle_rest(X_rest)
    X_rest = jnp.asarray(X_rest)
    scale_g = area * MU / 1e-2  # N: typical force of a unit strain
    assert abs(float(energy(X_rest, Dm_inv, area, MU, LAM))) < 1e-12 * area * MU
    assert float(jnp.max(jnp.abs(grad(X_rest, Dm_inv, area, MU, LAM)))) < 1e-10 * scale_g
    # A rigidly moved rest triangle is also at rest.
    Q = _rotation(np.random.default_rng(7))
    X_moved = X_rest @ Q.T + jnp.array([0.3, -0.2, 0.1])
    assert abs(float(energy(X_moved, Dm_inv, area, MU, LAM))) < 1e-12 * area * MU


@pytest.mark.parametrize("mat", MATERIALS)
@pytest.mark.parametrize("name", DEFORMATIONS)
def test_rigid_motion_invariance(mat, name):
    energy, grad, _, _ = MATERIALS[mat]
    X_rest, X = _case(name, 1e-2)
    Dm_inv, area = triangle_rest(X_rest)
    Q = _rotation(np.random.default_rng(11))
    t = np.array([0.5, -1.0, 2.0])
    E0 = float(energy(jnp.asarray(X), Dm_inv, area, MU, LAM))
    E1 = float(energy(jnp.asarray(X @ Q.T + t), Dm_inv, area, MU, LAM))
    assert E0 > 0.0
    assert E1 == pytest.approx(E0, rel=1e-11)
    # The gradient rotates with the triangle (objectivity) and sums to zero (translation).
    g0 = np.asarray(grad(jnp.asarray(X), Dm_inv, area, MU, LAM))
    g1 = np.asarray(grad(jnp.asarray(X @ Q.T + t), Dm_inv, area, MU, LAM))
    assert rel_err(g1, g0 @ Q.T) < 1e-10
    assert np.max(np.abs(g0.sum(axis=0))) < 1e-10 * np.max(np.abs(g0))


# ---------------------------------------------------------------------------------------
# Derivatives
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("mat", MATERIALS)
@pytest.mark.parametrize("name", DEFORMATIONS)
def test_gradient_matches_autodiff_and_central_differences(mat, name, scale):
    energy, grad, _, _ = MATERIALS[mat]
    X_rest, X = _case(name, scale)
    Dm_inv, area = triangle_rest(X_rest)
    f = _flat(energy, Dm_inv, area, MU, LAM)
    g = np.asarray(grad(jnp.asarray(X), Dm_inv, area, MU, LAM)).reshape(9)
    assert_nonzero(g)
    assert rel_err(g, jax.grad(f)(jnp.asarray(X.reshape(9)))) < 1e-9
    assert rel_err(g, central_gradient(f, X.reshape(9), h=1e-6 * scale)) < 1e-6


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("mat", MATERIALS)
@pytest.mark.parametrize("name", DEFORMATIONS)
def test_hessian_matches_autodiff_and_central_differences(mat, name, scale):
    energy, grad, hess, _ = MATERIALS[mat]
    X_rest, X = _case(name, scale)
    Dm_inv, area = triangle_rest(X_rest)
    H = np.asarray(hess(jnp.asarray(X), Dm_inv, area, MU, LAM))
    assert_nonzero(H, "Hessian")
    assert rel_err(H, H.T) < 1e-13
    H_ad = jax.hessian(_flat(energy, Dm_inv, area, MU, LAM))(jnp.asarray(X.reshape(9)))
    assert rel_err(H, H_ad) < 1e-9
    g = lambda x: np.asarray(grad(jnp.asarray(x).reshape(3, 3), Dm_inv, area, MU, LAM)).reshape(9)
    assert rel_err(H, central_jacobian(g, X.reshape(9), h=1e-6 * scale)) < 1e-6


# ---------------------------------------------------------------------------------------
# PSD tangents
# ---------------------------------------------------------------------------------------
def _stress(mat, X, Dm_inv):
    F = np.asarray(deformation_gradient(jnp.asarray(X), Dm_inv))
    C = F.T @ F
    if mat == "stvk":
        eps = 0.5 * (C - np.eye(2))
        return 2 * MU * eps + LAM * np.trace(eps) * np.eye(2)
    logJ = 0.5 * np.log(np.linalg.det(C))
    return MU * np.eye(2) + (LAM * logJ - MU) * np.linalg.inv(C)


@pytest.mark.parametrize("mat", MATERIALS)
@pytest.mark.parametrize("name", DEFORMATIONS)
def test_psd_hessian_is_psd_and_exact_when_stress_is_psd(mat, name):
    _, _, hess, hess_psd = MATERIALS[mat]
    X_rest, X = _case(name, 1e-2)
    Dm_inv, area = triangle_rest(X_rest)
    H = np.asarray(hess(jnp.asarray(X), Dm_inv, area, MU, LAM))
    Hp = np.asarray(hess_psd(jnp.asarray(X), Dm_inv, area, MU, LAM))
    scale = np.max(np.abs(H))
    assert np.allclose(Hp, Hp.T, rtol=0, atol=1e-14 * scale)
    assert np.linalg.eigvalsh(Hp).min() >= -1e-12 * scale
    s_min = np.linalg.eigvalsh(_stress(mat, X, Dm_inv)).min()
    if s_min >= 0.0:  # all cases here keep J < exp(mu/lam) = 1.84: material tangent already PSD
        assert rel_err(Hp, H) < 1e-12
    else:
        assert np.linalg.eigvalsh(H).min() < -1e-12 * scale  # the exact one is indefinite here
        assert rel_err(Hp, H) > 1e-6


def _principal_case(eps1, eps2, seed=5):
    """Rest: flat unit-ish triangle; current: principal stretches sqrt(1 + 2 eps_i), rotated."""
    rng = np.random.default_rng(seed)
    P = np.array([[0.0, 0.0, 0.0], [1.0, 0.1, 0.0], [0.3, 0.9, 0.0]]) * 1e-2
    L = np.diag([np.sqrt(1 + 2 * eps1), np.sqrt(1 + 2 * eps2), 1.0])
    return P, (P @ L.T) @ _rotation(rng).T


@pytest.mark.parametrize("offset", [-1e-12, 0.0, 1e-12, -1e-6, 1e-6])
def test_stvk_psd_tangent_near_zero_stress_eigenvalue(offset):
    """S2 = 2 mu eps2 + lam (eps1 + eps2) crosses 0: the PSD tangent is continuous and PSD."""
    eps1 = 0.05
    eps2_zero = -LAM * eps1 / (2 * MU + LAM)
    results = []
    for off in (offset, 0.0):
        X_rest, X = _principal_case(eps1, eps2_zero + off)
        Dm_inv, area = triangle_rest(X_rest)
        Hp = np.asarray(stvk_hessian_psd(jnp.asarray(X), Dm_inv, area, MU, LAM))
        scale = np.max(np.abs(Hp))
        assert np.linalg.eigvalsh(Hp).min() >= -1e-12 * scale
        results.append(Hp)
    assert rel_err(results[0], results[1]) < 1e-5  # no jump across the S2 = 0 boundary


@pytest.mark.parametrize("offset", [-1e-9, 1e-9])
def test_neo_hookean_psd_tangent_near_zero_stress_eigenvalue(offset):
    """Find a uniaxial state with S2 ~ 0 (bisection) and check the PSD tangent around it."""
    eps1 = 0.08

    def s2(eps2):
        X_rest, X = _principal_case(eps1, eps2)
        Dm_inv, _ = triangle_rest(X_rest)
        return np.linalg.eigvalsh(_stress("neo_hookean", X, Dm_inv)).min()

    lo, hi = -0.2, 0.0  # s2(lo) < 0 < s2(hi)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if s2(mid) < 0 else (lo, mid)
    X_rest, X = _principal_case(eps1, 0.5 * (lo + hi) + offset)
    Dm_inv, area = triangle_rest(X_rest)
    H = np.asarray(neo_hookean_hessian(jnp.asarray(X), Dm_inv, area, MU, LAM))
    Hp = np.asarray(neo_hookean_hessian_psd(jnp.asarray(X), Dm_inv, area, MU, LAM))
    scale = np.max(np.abs(H))
    assert np.linalg.eigvalsh(Hp).min() >= -1e-12 * scale
    assert rel_err(Hp, H) < 1e-7  # |S2| ~ 1e-9 mu: the clamp changes next to nothing


def test_neo_hookean_material_tangent_clamped_beyond_exp_mu_over_lam():
    """Area ratio J > exp(mu/lam) (1.84) makes mu - lam log J < 0 and the material tangent Q
    indefinite; the PSD tangent clamps Q, so it stays PSD (and then differs from the exact
    Hessian even though S is PSD). Far outside the film's range (it yields at a few %)."""
    X_rest, X = _principal_case(1.2, 1.2)  # stretch ~1.84 per direction, J ~ 3.4
    Dm_inv, area = triangle_rest(X_rest)
    F = np.asarray(deformation_gradient(jnp.asarray(X), Dm_inv))
    logJ = 0.5 * np.log(np.linalg.det(F.T @ F))
    assert MU - LAM * logJ < 0.0
    assert np.linalg.eigvalsh(_stress("neo_hookean", X, Dm_inv)).min() > 0
    H = np.asarray(neo_hookean_hessian(jnp.asarray(X), Dm_inv, area, MU, LAM))
    Hp = np.asarray(neo_hookean_hessian_psd(jnp.asarray(X), Dm_inv, area, MU, LAM))
    scale = np.max(np.abs(H))
    assert np.linalg.eigvalsh(Hp).min() >= -1e-12 * scale
    assert rel_err(Hp, H) > 1e-3


@pytest.mark.parametrize(
    "S",
    [
        [[2.0, 0.5], [0.5, 1.0]],  # PD
        [[-2.0, 0.5], [0.5, -1.0]],  # ND
        [[2.0, 0.5], [0.5, -1.0]],  # indefinite
        [[1.0, 0.0], [0.0, -1e-14]],  # tiny negative eigenvalue
        [[1.0, 1.0], [1.0, 1.0]],  # singular PSD
        [[0.0, 0.0], [0.0, 0.0]],
    ],
)
def test_positive_part_sym2_matches_eigen_clamp(S):
    S = np.array(S)
    w, V = np.linalg.eigh(S)
    ref = (V * np.maximum(w, 0)) @ V.T
    got = np.asarray(positive_part_sym2(jnp.asarray(S)))
    assert np.max(np.abs(got - ref)) <= 1e-14 * max(1.0, np.max(np.abs(S)))
    assert np.max(np.abs(np.asarray(project_psd(jnp.asarray(S))) - ref)) <= 1e-14 * max(1.0, np.max(np.abs(S)))


def test_psd_hessians_jit_and_vmap():
    """The lead lifts the element functions with vmap; check they trace without Python branching."""
    cases = [_case(n, 1e-2) for n in DEFORMATIONS]
    Xr = np.stack([c[0] for c in cases])
    X = jnp.asarray(np.stack([c[1] for c in cases]))
    Dm_inv, area = jax.vmap(triangle_rest)(jnp.asarray(Xr))
    for fn in (stvk_hessian_psd, neo_hookean_hessian_psd, neo_hookean_energy):
        out = jax.jit(jax.vmap(fn, in_axes=(0, 0, 0, None, None)))(X, Dm_inv, area, MU, LAM)
        assert np.all(np.isfinite(np.asarray(out)))


@pytest.mark.parametrize("stretched_too", [False, True])
def test_every_elements_psd_tangent_at_once_is_each_elements(stretched_too):
    """``hessians_psd`` (the solver's: Q+ = Q without an eigendecomposition where
    mu - lam log J > 0) equals ``hessian_psd`` element by element, to round-off: for
    strains inside the film's range (no element needs the clamp) and with one element
    stretched past J = exp(mu/lam), which gets the clamp and only it."""
    cases = [_case(n, 1e-2) for n in DEFORMATIONS]
    if stretched_too:
        cases.append(_principal_case(1.2, 1.2))
    Xr = jnp.asarray(np.stack([c[0] for c in cases]))
    X = jnp.asarray(np.stack([c[1] for c in cases]))
    Dm_inv, area = jax.vmap(triangle_rest)(Xr)
    for model in (NEO_HOOKEAN, STVK):
        each = np.asarray(jax.vmap(model.hessian_psd, in_axes=(0, 0, 0, None, None))(X, Dm_inv, area, MU, LAM))
        at_once = np.asarray(jax.jit(model.hessians_psd)(X, Dm_inv, area, MU, LAM))
        assert_nonzero(at_once)
        scale = np.max(np.abs(each), axis=(1, 2), keepdims=True)
        assert np.max(np.abs(at_once - each) / scale) < 1e-13, model.name
        assert np.linalg.eigvalsh(at_once).min() >= -1e-12 * scale.max()
    if stretched_too:  # the stretched element's tangent really was clamped
        exact = np.asarray(neo_hookean_hessian(X[-1], Dm_inv[-1], area[-1], MU, LAM))
        clamped = np.asarray(NEO_HOOKEAN.hessians_psd(X, Dm_inv, area, MU, LAM))[-1]
        assert rel_err(clamped, exact) > 1e-3

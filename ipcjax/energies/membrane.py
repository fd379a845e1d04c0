"""Membrane (in-plane) energies of a triangle film: StVK and Neo-Hookean, with exact derivatives.

Every function here is per element: a pure function of one triangle's current positions
``X`` (3, 3) whose ROWS are the vertices (x0, x1, x2), in m, plus that triangle's rest data
(``Dm_inv``, ``area``) and material parameters. The mesh-level energy is a ``vmap`` over
static triangle index arrays; gradients are returned as (3, 3) rows per vertex and
Hessians as (9, 9) in vertex-major order (x0x, x0y, x0z, x1x, ...).

Kinematics (Newton's ``tri_poses`` convention). The rest triangle is flattened into an
orthonormal in-plane frame (e1 along x1 - x0, e2 = n x e1), ``Dm`` = [x1 - x0, x2 - x0] in
that frame (2D columns), and ``Dm_inv`` = Dm^-1 with rows b1, b2. With
B = [-b1 - b2; b1; b2] (3 x 2), the deformation gradient is F = X^T B (3 x 2; X^T has the
positions as columns), C = F^T F, eps = (C - I)/2 and log J = (1/2) log det C.

For either material with 2nd Piola-Kirchhoff stress S(C) and P = F S:

    grad = A0 B P^T                                      (rows per vertex, N)
    Hess = A0 [ m^T Q m  +  (B S B^T) (x) I3 ]           (N/m)

where m (3 x 9) maps dx to the strain increment dE = (dF^T F + F^T dF)/2 in Mandel form
(dE11, dE22, sqrt(2) dE12), Q (3 x 3) is the Mandel matrix of the material tangent
dS/dE, and (x) is the Kronecker product (vertex blocks times I3). The first term is the
material tangent, the second the geometric (initial-stress) tangent.

Reference: Bonet & Wood, Nonlinear Continuum Mechanics for FEA, ch. 5-6; Newton
``ModelBuilder.add_triangle`` (rest frame) and docs/spec.md §3.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ipcjax.energies import ElementModel, model_named
from ipcjax.topology import rest_positions

_SQRT2 = float(np.sqrt(2.0))
# Mandel basis of symmetric 2x2 tensors: E11, E22, (e1 e2^T + e2 e1^T)/sqrt(2).
_MANDEL = np.array(
    [[[1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 1.0]], [[0.0, 1.0 / _SQRT2], [1.0 / _SQRT2, 0.0]]]
)


# ---------------------------------------------------------------------------------------
# Generic helpers
# ---------------------------------------------------------------------------------------
def project_psd(H):
    """Nearest symmetric PSD matrix in Frobenius norm: V max(Lambda, 0) V^T of sym(H).

    Args:
        H: (n, n) matrix (any units); it is symmetrised first.
    Returns:
        (n, n) symmetric matrix with eigenvalues >= 0 (to rounding). Not differentiated
        through by the solver (it is a tangent approximation).
    """
    Hs = 0.5 * (H + H.T)
    w, V = jnp.linalg.eigh(Hs)
    return (V * jnp.maximum(w, 0.0)) @ V.T


def positive_part_sym2(S):
    """Positive-eigenvalue part S+ of a symmetric 2x2 matrix, closed form (no eigh).

    With eigenvalues l1 >= l2 of S: S+ = S if l2 >= 0, 0 if l1 <= 0, and otherwise
    l1 (S - l2 I)/(l1 - l2) (l1 times the projector on its eigenvector).
    """
    a, b, c = S[0, 0], 0.5 * (S[0, 1] + S[1, 0]), S[1, 1]
    m = 0.5 * (a + c)
    r = jnp.sqrt((0.5 * (a - c)) ** 2 + b * b)
    l1, l2 = m + r, m - r
    mixed = (l1 > 0.0) & (l2 < 0.0)  # then r > 0: the division below is safe
    r_safe = jnp.where(mixed, r, 1.0)
    Ssym = jnp.array([[a, b], [b, c]])
    S_mixed = l1 * (Ssym - l2 * jnp.eye(2, dtype=S.dtype)) / (2.0 * r_safe)
    return jnp.where(l2 >= 0.0, Ssym, jnp.where(l1 <= 0.0, jnp.zeros_like(Ssym), S_mixed))


# ---------------------------------------------------------------------------------------
# Rest state and material coefficients
# ---------------------------------------------------------------------------------------
def triangle_rest(X_ref):
    """Rest transform of one triangle: (Dm_inv (2, 2), area A0) in Newton's tri_poses convention.

    The triangle is flattened to 2D with e1 = (x1 - x0)/|x1 - x0|, n = (x1 - x0) x (x2 - x0),
    e2 = n x e1 / |n x e1|; Dm = [[e1.(x1-x0), e1.(x2-x0)], [0, e2.(x2-x0)]] (edges as
    columns), A0 = det(Dm)/2 > 0 for any non-degenerate triangle.

    Args:
        X_ref: (3, 3) rest positions, rows = vertices (m).
    Returns:
        Dm_inv: (2, 2) in 1/m, rows b1, b2. area: A0 in m^2.
    No validation here (traceable); use ``triangles_rest`` on host data to reject
    degenerate triangles.
    """
    X_ref = jnp.asarray(X_ref)
    q = X_ref[1] - X_ref[0]
    r = X_ref[2] - X_ref[0]
    n = jnp.cross(q, r)
    e1 = q / jnp.linalg.norm(q)
    t = jnp.cross(n, e1)
    e2 = t / jnp.linalg.norm(t)
    d00, d01, d11 = jnp.dot(e1, q), jnp.dot(e1, r), jnp.dot(e2, r)
    det = d00 * d11
    Dm_inv = jnp.array([[d11, -d01], [jnp.zeros_like(d00), d00]]) / det
    return Dm_inv, 0.5 * det


def triangles_rest(X_ref, triangles, min_relative_area=1e-8):
    """Rest transforms of all triangles, validated on the host.

    Args:
        X_ref: (N, 3) rest vertex positions (m).
        triangles: (T, 3) integer vertex indices.
        min_relative_area: a triangle is rejected when A0 <= min_relative_area * l_max^2,
            l_max its longest rest edge (A0 / l_max^2 is 0.433 for an equilateral triangle).
    Returns:
        Dm_inv (T, 2, 2) in 1/m and area (T,) in m^2, float64 JAX arrays.
    Raises:
        ValueError: naming the first triangle index that is degenerate, near-degenerate or
            has non-finite rest coordinates.
    """
    X = np.asarray(X_ref, dtype=np.float64)
    t = np.asarray(triangles)
    if X.ndim != 2 or X.shape[1] != 3:
        raise ValueError(f"X_ref must have shape (N, 3); got {X.shape}")
    if t.ndim != 2 or t.shape[1] != 3:
        raise ValueError(f"triangles must have shape (T, 3); got {t.shape}")
    P = rest_positions(X, t, "triangle")  # (T, 3, 3)
    e = P[:, [1, 2, 0]] - P  # edges x1-x0, x2-x1, x0-x2
    l2max = np.max(np.sum(e * e, axis=-1), axis=-1)
    A = 0.5 * np.linalg.norm(np.cross(P[:, 1] - P[:, 0], P[:, 2] - P[:, 0]), axis=-1)
    ok = (A > min_relative_area * l2max) & (l2max > 0.0)
    if not ok.all():
        bad = int(np.argmin(ok))
        raise ValueError(
            f"triangle {bad} {t[bad].tolist()} is degenerate at rest: area {A[bad]:.3e} m^2, "
            f"longest edge^2 {l2max[bad]:.3e} m^2 (need area > {min_relative_area:g} * edge^2)"
        )
    return jax.vmap(triangle_rest)(jnp.asarray(P))


def lame_from_young(E, nu, h):
    """Plane-stress Lame coefficients per unit reference area of a film of thickness h.

    mu = E h / (2 (1 + nu)),  lam = E h nu / (1 - nu^2).

    Args:
        E: Young's modulus (Pa). nu: Poisson's ratio (-). h: thickness (m).
    Returns:
        (mu, lam) in N/m.
    """
    return E * h / (2.0 * (1.0 + nu)), E * h * nu / (1.0 - nu * nu)


# ---------------------------------------------------------------------------------------
# Kinematics shared by both materials
# ---------------------------------------------------------------------------------------
def shape_matrix(Dm_inv):
    """B = [-b1 - b2; b1; b2] (3, 2) from Dm_inv with rows b1, b2 (1/m)."""
    b1, b2 = Dm_inv[0], Dm_inv[1]
    return jnp.stack([-b1 - b2, b1, b2])


def deformation_gradient(X, Dm_inv):
    """F = X^T B (3, 2), X rows = vertices (m). Dimensionless."""
    return X.T @ shape_matrix(Dm_inv)


def _green_strain_map(B, F):
    """m (3, 9): Mandel strain increment (dE11, dE22, sqrt2 dE12) per vertex-major dx."""
    # dE_ab = (B_va F_ib + F_ia B_vb)/2 for dx = unit vector at (vertex v, component i).
    M = 0.5 * (jnp.einsum("va,ib->abvi", B, F) + jnp.einsum("ia,vb->abvi", F, B))
    return jnp.einsum("kab,abvi->kvi", _MANDEL, M).reshape(3, 9)


def _assemble(X, Dm_inv, area, S, Q):
    """A0 [m^T Q m + (B S B^T) (x) I3]: element Hessian from a stress and a Mandel tangent."""
    B = shape_matrix(Dm_inv)
    F = X.T @ B
    m = _green_strain_map(B, F)
    material = m.T @ Q @ m
    geometric = jnp.kron(B @ S @ B.T, jnp.eye(3, dtype=X.dtype))
    return area * (material + geometric)


def _gradient_from_stress(X, Dm_inv, area, S):
    B = shape_matrix(Dm_inv)
    F = X.T @ B
    P = F @ S
    return area * (B @ P.T)


def _mandel_of(A):
    """Mandel vector (3,) of a symmetric 2x2 matrix."""
    return jnp.array([A[0, 0], A[1, 1], _SQRT2 * A[0, 1]])


# ---------------------------------------------------------------------------------------
# StVK
# ---------------------------------------------------------------------------------------
def _stvk_stress(X, Dm_inv, mu, lam):
    F = deformation_gradient(X, Dm_inv)
    eps = 0.5 * (F.T @ F - jnp.eye(2, dtype=F.dtype))
    return 2.0 * mu * eps + lam * jnp.trace(eps) * jnp.eye(2, dtype=F.dtype), eps


def stvk_energy(X, Dm_inv, area, mu, lam):
    """Saint Venant-Kirchhoff membrane energy of one triangle (J).

    E = A0 [mu ||eps||_F^2 + lam (tr eps)^2 / 2],  eps = (F^T F - I)/2.

    Args:
        X: (3, 3) current positions, rows = vertices x0, x1, x2 (m).
        Dm_inv: (2, 2) rest transform (1/m), ``triangle_rest``.
        area: A0 (m^2). mu, lam: plane-stress Lame coefficients (N/m).
    """
    _, eps = _stvk_stress(X, Dm_inv, mu, lam)
    tr = jnp.trace(eps)
    return area * (mu * jnp.sum(eps * eps) + 0.5 * lam * tr * tr)


def stvk_gradient(X, Dm_inv, area, mu, lam):
    """dE/dX (3, 3), rows per vertex (N): A0 B (F S)^T with S = 2 mu eps + lam tr(eps) I."""
    S, _ = _stvk_stress(X, Dm_inv, mu, lam)
    return _gradient_from_stress(X, Dm_inv, area, S)


def _stvk_tangent(mu, lam, dtype):
    # dS = 2 mu dE + lam tr(dE) I  ->  Q = 2 mu I3 + lam [1,1,0][1,1,0]^T (Mandel).
    one = jnp.array([1.0, 1.0, 0.0], dtype=dtype)
    return 2.0 * mu * jnp.eye(3, dtype=dtype) + lam * jnp.outer(one, one)


def stvk_hessian(X, Dm_inv, area, mu, lam):
    """Exact StVK Hessian (9, 9), vertex-major (N/m).

    H = A0 [m^T Q m + (B S B^T) (x) I3] with Q = 2 mu I + lam 11^T (Mandel of dS/dE).
    Indefinite under compression (S has negative eigenvalues).
    """
    S, _ = _stvk_stress(X, Dm_inv, mu, lam)
    return _assemble(X, Dm_inv, area, S, _stvk_tangent(mu, lam, X.dtype))


def stvk_hessian_psd(X, Dm_inv, area, mu, lam):
    """Solver tangent for StVK (9, 9), PSD: A0 [m^T Q+ m + (B S+ B^T) (x) I3].

    S+ is the positive-eigenvalue part of S (``positive_part_sym2``); Q+ is the
    eigenvalue-clamped material tangent (equal to Q whenever mu, lam >= 0). Both terms
    are PSD, so the sum is; it equals ``stvk_hessian`` whenever S is PSD.
    """
    S, _ = _stvk_stress(X, Dm_inv, mu, lam)
    Q = project_psd(_stvk_tangent(mu, lam, X.dtype))
    return _assemble(X, Dm_inv, area, positive_part_sym2(S), Q)


# ---------------------------------------------------------------------------------------
# Neo-Hookean
# ---------------------------------------------------------------------------------------
def _inv_sym2(C):
    det = C[0, 0] * C[1, 1] - C[0, 1] * C[1, 0]
    return jnp.array([[C[1, 1], -C[0, 1]], [-C[1, 0], C[0, 0]]]) / det, det


def _nh_parts(X, Dm_inv, mu, lam):
    F = deformation_gradient(X, Dm_inv)
    C = F.T @ F
    Cinv, detC = _inv_sym2(C)
    logJ = 0.5 * jnp.log(detC)
    S = mu * jnp.eye(2, dtype=F.dtype) + (lam * logJ - mu) * Cinv
    return C, Cinv, logJ, S


def neo_hookean_energy(X, Dm_inv, area, mu, lam):
    """Compressible Neo-Hookean membrane energy of one triangle (J).

    E = A0 [mu (tr eps - log J) + lam (log J)^2 / 2],  tr eps = (tr C - 2)/2,
    log J = (1/2) log det C. Zero with zero gradient at rest; +inf-barrier as J -> 0.

    Args as ``stvk_energy``: X (3, 3) rows = vertices (m), Dm_inv (1/m), area (m^2),
    mu, lam (N/m).
    """
    C, _, logJ, _ = _nh_parts(X, Dm_inv, mu, lam)
    tr_eps = 0.5 * (jnp.trace(C) - 2.0)
    return area * (mu * (tr_eps - logJ) + 0.5 * lam * logJ * logJ)


def neo_hookean_gradient(X, Dm_inv, area, mu, lam):
    """dE/dX (3, 3), rows per vertex (N): A0 B (F S)^T, S = mu I + (lam log J - mu) C^-1."""
    _, _, _, S = _nh_parts(X, Dm_inv, mu, lam)
    return _gradient_from_stress(X, Dm_inv, area, S)


def _nh_tangent(Cinv, logJ, mu, lam):
    # dS = lam (C^-1 : dE) C^-1 + 2 (mu - lam log J) C^-1 dE C^-1
    # -> Q = lam c c^T + 2 (mu - lam log J) T,  c = Mandel(C^-1), T = Mandel of dE -> C^-1 dE C^-1.
    c = _mandel_of(Cinv)
    T = jnp.einsum("iab,bc,jcd,da->ij", _MANDEL, Cinv, _MANDEL, Cinv)
    return lam * jnp.outer(c, c) + 2.0 * (mu - lam * logJ) * T


def neo_hookean_hessian(X, Dm_inv, area, mu, lam):
    """Exact Neo-Hookean Hessian (9, 9), vertex-major (N/m).

    H = A0 [m^T Q m + (B S B^T) (x) I3],
    Q = Mandel of lam C^-1 (x) C^-1 + 2 (mu - lam log J) C^-1 [.] C^-1.
    """
    _, Cinv, logJ, S = _nh_parts(X, Dm_inv, mu, lam)
    return _assemble(X, Dm_inv, area, S, _nh_tangent(Cinv, logJ, mu, lam))


def neo_hookean_hessian_psd(X, Dm_inv, area, mu, lam):
    """Solver tangent for Neo-Hookean (9, 9), PSD: A0 [m^T Q+ m + (B S+ B^T) (x) I3].

    S+: positive-eigenvalue part of S (geometric tangent, as in docs/spec.md §3).
    Q+: the 3x3 Mandel material tangent with negative eigenvalues clamped to 0. Q is PSD
    (so Q+ = Q) while mu - lam log J >= 0, i.e. area ratio J <= exp(mu/lam) (1.84 for
    nu = 0.45); beyond that the clamp keeps the material part PSD. The result equals
    ``neo_hookean_hessian`` whenever S and Q are both PSD.
    """
    _, Cinv, logJ, S = _nh_parts(X, Dm_inv, mu, lam)
    Q = project_psd(_nh_tangent(Cinv, logJ, mu, lam))
    return _assemble(X, Dm_inv, area, positive_part_sym2(S), Q)


# ---------------------------------------------------------------------------------------
# Every element at once: the solver tangents without an eigendecomposition per element
# ---------------------------------------------------------------------------------------
def _clamp_where_needed(Q, psd):
    """Q+ of a batch (E, 3, 3) of symmetric Mandel tangents, those flagged ``psd`` known to
    be PSD already (Q+ = Q): the eigendecomposition of ``project_psd`` runs only when some
    are not, and then only its result for those is used."""
    return jax.lax.cond(jnp.all(psd), lambda Q: Q,
                        lambda Q: jnp.where(psd[:, None, None], Q, jax.vmap(project_psd)(Q)), Q)


def neo_hookean_hessians_psd(Xt, Dm_inv, area, mu, lam):
    """``neo_hookean_hessian_psd`` of every element, (E, 9, 9) N/m, from Xt (E, 3, 3), Dm_inv
    (E, 2, 2), area (E,) and the shared mu, lam.

    Q = lam c c^T + 2 (mu - lam log J) T with T the Mandel form of dE -> C^-1 dE C^-1,
    positive definite for SPD C^-1, and c c^T PSD: so Q is PSD, and Q+ = Q, wherever
    lam >= 0 and mu - lam log J > 0. That holds for every element at the bag's strains
    (J < 1.84), and there no element pays for an eigendecomposition of its 3x3 Q (a
    batched ``eigh`` is a tenth of a Newton iteration's device time). Elsewhere Q+ is
    ``project_psd(Q)``, as per element.
    """
    _, Cinv, logJ, S = jax.vmap(_nh_parts, in_axes=(0, 0, None, None))(Xt, Dm_inv, mu, lam)
    Q = jax.vmap(_nh_tangent, in_axes=(0, 0, None, None))(Cinv, logJ, mu, lam)
    Q = _clamp_where_needed(0.5 * (Q + jnp.swapaxes(Q, 1, 2)), (lam >= 0.0) & (mu - lam * logJ > 0.0))
    return jax.vmap(lambda X, D, a, S, Q: _assemble(X, D, a, positive_part_sym2(S), Q))(Xt, Dm_inv, area, S, Q)


def stvk_hessians_psd(Xt, Dm_inv, area, mu, lam):
    """``stvk_hessian_psd`` of every element, (E, 9, 9) N/m: its Q+ is one matrix for all
    of them, clamped once."""
    Q = project_psd(_stvk_tangent(mu, lam, Xt.dtype))
    S = jax.vmap(lambda X, D: _stvk_stress(X, D, mu, lam)[0])(Xt, Dm_inv)
    return jax.vmap(lambda X, D, a, S: _assemble(X, D, a, positive_part_sym2(S), Q))(Xt, Dm_inv, area, S)


# ---------------------------------------------------------------------------------------
# The materials as objects
# ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MembraneModel(ElementModel):
    """A membrane material: element functions of ``(X, Dm_inv, area, mu, lam)``; gradients
    (3, 3) N, Hessians (9, 9) N/m. ``hessians_psd``: ``hessian_psd`` of every element at
    once, (Xt (E, 3, 3), Dm_inv, area (E, …), mu, lam) -> (E, 9, 9), which the solver calls."""

    hessians_psd: Callable


NEO_HOOKEAN = MembraneModel("neo_hookean", neo_hookean_energy, neo_hookean_gradient, neo_hookean_hessian,
                            neo_hookean_hessian_psd, neo_hookean_hessians_psd)
STVK = MembraneModel("stvk", stvk_energy, stvk_gradient, stvk_hessian, stvk_hessian_psd, stvk_hessians_psd)
#: The membrane models by name (``Config.membrane``).
MEMBRANE_MODELS = {m.name: m for m in (NEO_HOOKEAN, STVK)}


def membrane_model(name: str) -> MembraneModel:
    """The :class:`MembraneModel` called ``name`` (ValueError naming the known ones if none)."""
    return model_named(MEMBRANE_MODELS, "membrane", name)

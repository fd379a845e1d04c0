"""Bending energies on interior hinges: the specification's wrapped hinge
(docs/spec.md §3) and Discrete Shells (docs/spec.md §7).

A hinge is four vertices in Newton's ``edge_indices`` order (a, b, c, d): a and b are the
vertices opposite the shared edge, c -> d is the edge as it appears in the first
triangle's winding (c, d, a); the second triangle is (d, c, b). ``Xh`` is (4, 3) with
rows (xa, xb, xc, xd) in m. Gradients are (4, 3) rows per vertex; Hessians are (12, 12)
vertex-major (xa_x, xa_y, xa_z, xb_x, ...).

Signed dihedral angle (same as Newton's bending kernels):

    n1 = (xc - xa) x (xd - xa),   n2 = (xd - xb) x (xc - xb),   e = xd - xc,
    theta = atan2((n1 x n2) . e/|e|, n1 . n2)  in (-pi, pi].

theta = 0 for a flat hinge; theta < 0 when b is folded to the side n1 points to
(the surface bends towards its normal), theta > 0 when it folds away (a convex fold, e.g.
any hinge of a sphere whose triangles wind so the normals point outwards).

Reference: Bridson, Marino, Fedkiw, "Simulation of clothing with folds and wrinkles"
(SCA 2003) for the angle gradient; Tamstorf & Grinspun, "Discrete bending forces and
their Jacobians" (GMOD 2013) for the Hessian; Grinspun et al., "Discrete Shells"
(SCA 2003) for the energy weight.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ipcjax.energies import ElementModel, model_named
from ipcjax.energies.membrane import project_psd
from ipcjax.topology import rest_positions


def _skew(v):
    """[v]x with [v]x w = v x w."""
    z = jnp.zeros_like(v[0])
    return jnp.array([[z, -v[2], v[1]], [v[2], z, -v[0]], [-v[1], v[0], z]])


# ---------------------------------------------------------------------------------------
# Dihedral angle and its derivatives
# ---------------------------------------------------------------------------------------
def dihedral_angle(xa, xb, xc, xd):
    """Signed dihedral angle (rad) of hinge (a, b, c, d); see the module docstring.

    Args:
        xa, xb: (3,) opposite vertices (m). xc, xd: (3,) shared-edge endpoints (m).
    Returns:
        theta in (-pi, pi]. Undefined for degenerate faces (zero normals).
    """
    n1 = jnp.cross(xc - xa, xd - xa)
    n2 = jnp.cross(xd - xb, xc - xb)
    e = xd - xc
    sin_part = jnp.dot(jnp.cross(n1, n2), e) / jnp.linalg.norm(e)
    return jnp.arctan2(sin_part, jnp.dot(n1, n2))


def _angle_pieces(Xh):
    xa, xb, xc, xd = Xh[0], Xh[1], Xh[2], Xh[3]
    n1 = jnp.cross(xc - xa, xd - xa)
    n2 = jnp.cross(xd - xb, xc - xb)
    e = xd - xc
    L2 = jnp.dot(e, e)
    L = jnp.sqrt(L2)
    u1 = n1 / jnp.dot(n1, n1)
    u2 = n2 / jnp.dot(n2, n2)
    sa = jnp.dot(xa - xc, e) / L2  # foot of a on the edge, as a fraction from c to d
    sb = jnp.dot(xb - xc, e) / L2
    return dict(xa=xa, xb=xb, xc=xc, xd=xd, n1=n1, n2=n2, e=e, L=L, L2=L2, u1=u1, u2=u2, sa=sa, sb=sb)


def dihedral_angle_gradient(Xh):
    """d theta / d Xh (4, 3) in 1/m (Bridson et al. 2003; exact for any non-degenerate hinge).

        g_a = -|e| n1/|n1|^2,            g_b = -|e| n2/|n2|^2,
        g_c = -(1 - s_a) g_a - (1 - s_b) g_b,   g_d = -s_a g_a - s_b g_b,
        s_a = (xa - xc).e/|e|^2,  s_b = (xb - xc).e/|e|^2.

    The rows sum to zero (translation invariance).
    """
    p = _angle_pieces(Xh)
    ga = -p["L"] * p["u1"]
    gb = -p["L"] * p["u2"]
    gc = -(1.0 - p["sa"]) * ga - (1.0 - p["sb"]) * gb
    gd = -p["sa"] * ga - p["sb"] * gb
    return jnp.stack([ga, gb, gc, gd])


def dihedral_angle_hessian(Xh):
    """d^2 theta / d Xh^2 (12, 12) in 1/m^2, hand-derived by the chain rule on the gradient.

    With J(.) the 12-column Jacobian of a quantity and P_k = (I - 2 n^_k n^_k^T)/|n_k|^2:
        J n1 = [[e]x, 0, -[xd - xa]x, [xc - xa]x],   J n2 = [0, -[e]x, [xd - xb]x, -[xc - xb]x],
        J u_k = P_k J n_k,   J|e| = [0, 0, -e^, e^],
        J s_a = (J((xa - xc).e) - s_a J|e|^2)/|e|^2   (likewise s_b),
        J g_a = -u1 J|e| - |e| J u1,   J g_b = -u2 J|e| - |e| J u2,
        J g_c = g_a J s_a - (1 - s_a) J g_a + g_b J s_b - (1 - s_b) J g_b,
        J g_d = -g_a J s_a - s_a J g_a - g_b J s_b - s_b J g_b.
    Rows (J g_a; J g_b; J g_c; J g_d), symmetrised (it is symmetric in exact arithmetic).
    """
    p = _angle_pieces(Xh)
    dt = Xh.dtype
    I3, Z3 = jnp.eye(3, dtype=dt), jnp.zeros((3, 3), dt)
    xa, xb, xc, xd, e, L, L2 = p["xa"], p["xb"], p["xc"], p["xd"], p["e"], p["L"], p["L2"]
    ehat = e / L
    z = jnp.zeros(3, dt)

    Jn1 = jnp.concatenate([_skew(e), Z3, -_skew(xd - xa), _skew(xc - xa)], axis=1)
    Jn2 = jnp.concatenate([Z3, -_skew(e), _skew(xd - xb), -_skew(xc - xb)], axis=1)

    def unit_over_norm_jac(n, Jn):
        nn = jnp.dot(n, n)
        nhat = n / jnp.sqrt(nn)
        return (I3 - 2.0 * jnp.outer(nhat, nhat)) / nn @ Jn

    Ju1 = unit_over_norm_jac(p["n1"], Jn1)
    Ju2 = unit_over_norm_jac(p["n2"], Jn2)
    JL = jnp.concatenate([z, z, -ehat, ehat])
    JL2 = 2.0 * L * JL

    def foot_jac(xo, s, slot):
        # d[(xo - xc).e] = (dxo - dxc).e + (xo - xc).(dxd - dxc)
        w = xo - xc
        blocks = [z, z, -e - w, w]
        blocks[slot] = blocks[slot] + e
        return (jnp.concatenate(blocks) - s * JL2) / L2

    Jsa = foot_jac(xa, p["sa"], 0)
    Jsb = foot_jac(xb, p["sb"], 1)

    ga = -L * p["u1"]
    gb = -L * p["u2"]
    sa, sb = p["sa"], p["sb"]
    Jga = -jnp.outer(p["u1"], JL) - L * Ju1
    Jgb = -jnp.outer(p["u2"], JL) - L * Ju2
    Jgc = jnp.outer(ga, Jsa) - (1.0 - sa) * Jga + jnp.outer(gb, Jsb) - (1.0 - sb) * Jgb
    Jgd = -jnp.outer(ga, Jsa) - sa * Jga - jnp.outer(gb, Jsb) - sb * Jgb
    H = jnp.concatenate([Jga, Jgb, Jgc, Jgd], axis=0)
    return 0.5 * (H + H.T)


def _theta(Xh):
    return dihedral_angle(Xh[0], Xh[1], Xh[2], Xh[3])


def wrap_angle(x):
    """wrap(x) = atan2(sin x, cos x) in (-pi, pi]."""
    return jnp.arctan2(jnp.sin(x), jnp.cos(x))


# ---------------------------------------------------------------------------------------
# The specification's hinge energy (docs/spec.md §3): (1/2) k_theta wrap(theta - theta0)^2
# ---------------------------------------------------------------------------------------
def hinge_energy(Xh, theta0, k_theta):
    """Interior hinge energy (J): E = (1/2) k_theta wrap(theta - theta0)^2.

    Args:
        Xh: (4, 3) hinge positions, rows (a, b, c, d) (m).
        theta0: rest dihedral angle (rad). k_theta: stiffness (N m = J/rad^2),
            ``hinge_stiffness``.
    The energy is continuous where theta - theta0 crosses +-pi (both sides give
    k pi^2/2); its gradient flips sign there (the fold has gone all the way round).
    """
    d = wrap_angle(_theta(Xh) - theta0)
    return 0.5 * k_theta * d * d


def hinge_gradient(Xh, theta0, k_theta):
    """dE/dXh (4, 3) (N): k_theta wrap(theta - theta0) grad(theta)."""
    d = wrap_angle(_theta(Xh) - theta0)
    return k_theta * d * dihedral_angle_gradient(Xh)


def hinge_hessian(Xh, theta0, k_theta):
    """Exact hinge Hessian (12, 12) (N/m): k_theta [g g^T + wrap(theta - theta0) H_theta]."""
    d = wrap_angle(_theta(Xh) - theta0)
    g = dihedral_angle_gradient(Xh).reshape(12)
    return k_theta * (jnp.outer(g, g) + d * dihedral_angle_hessian(Xh))


def hinge_hessian_psd(Xh, theta0, k_theta):
    """Gauss-Newton hinge Hessian (12, 12) used by the solver (N/m): k_theta g g^T (PSD, rank 1)."""
    g = dihedral_angle_gradient(Xh).reshape(12)
    return k_theta * jnp.outer(g, g)


def flexural_rigidity(E, nu, h):
    """Plate flexural rigidity D = E h^3 / (12 (1 - nu^2)) (N m). E in Pa, h in m."""
    return E * h**3 / (12.0 * (1.0 - nu * nu))


def hinge_stiffness(E, nu, h, edge_len, area_pair):
    """The specification's hinge stiffness (docs/spec.md §3) k_theta = 6 D l^2 / A (N m), D = E h^3/(12 (1 - nu^2)).

    Newton's builder receives edge_ke = 6 D l / A and the energy coefficient is
    k_theta = edge_ke l. l = rest shared-edge length (m), A = combined rest area of the
    two faces (m^2). See docs (calibration): for the same D this is twice the Discrete
    Shells coefficient 2 kappa w = D w.
    """
    D = flexural_rigidity(E, nu, h)
    return 6.0 * D * edge_len**2 / area_pair


# ---------------------------------------------------------------------------------------
# Discrete Shells (docs/spec.md §7): kappa w (theta - theta_bar)^2, no wrap
# ---------------------------------------------------------------------------------------
def discrete_shell_weight(edge_len, area_pair):
    """Discrete Shells geometric weight w = 3 L0^2 / (A1 + A2) (dimensionless); L0 in m, A in m^2."""
    return 3.0 * edge_len**2 / area_pair


def discrete_shell_kappa(E_b, nu_b, h_e):
    """kappa = D/2 = E_b h_e^3 / (24 (1 - nu_b^2)) (N m); h_e = r_i + r_j full thickness (m)."""
    return E_b * h_e**3 / (24.0 * (1.0 - nu_b * nu_b))


def discrete_shell_energy(Xh, theta0, kappa, weight):
    """Discrete Shells hinge energy (J): E = kappa w (theta - theta_bar)^2, NOT wrapped.

    Args:
        Xh: (4, 3) rows (a, b, c, d) (m). The Discrete Shells reference's (x0, x1, x2, x3)
            (docs/spec.md §7) is our (a, c, d, b), i.e. x_ref = Xh[[0, 2, 3, 1]]; its
            arccos-and-sign angle equals ``dihedral_angle``.
        theta0: rest angle theta_bar (rad). kappa: ``discrete_shell_kappa`` (N m).
        weight: ``discrete_shell_weight`` (-).
    """
    d = _theta(Xh) - theta0
    return kappa * weight * d * d


def discrete_shell_gradient(Xh, theta0, kappa, weight):
    """dE/dXh (4, 3) (N): 2 kappa w (theta - theta_bar) grad(theta)."""
    d = _theta(Xh) - theta0
    return 2.0 * kappa * weight * d * dihedral_angle_gradient(Xh)


def discrete_shell_moment(Xh, theta0, kappa, weight):
    """Angular restoring moment -dE/dtheta = -2 kappa w (theta - theta_bar) (N m)."""
    return -2.0 * kappa * weight * (_theta(Xh) - theta0)


def discrete_shell_hessian(Xh, theta0, kappa, weight):
    """Exact Discrete Shells Hessian (12, 12) (N/m): 2 kappa w (g g^T + (theta - theta_bar) H_theta)."""
    d = _theta(Xh) - theta0
    g = dihedral_angle_gradient(Xh).reshape(12)
    return 2.0 * kappa * weight * (jnp.outer(g, g) + d * dihedral_angle_hessian(Xh))


def discrete_shell_hessian_psd(Xh, theta0, kappa, weight):
    """``discrete_shell_hessian`` with negative eigenvalues clamped to 0 (the Discrete Shells
    reference's make_spd, docs/spec.md §7)."""
    return project_psd(discrete_shell_hessian(Xh, theta0, kappa, weight))


# ---------------------------------------------------------------------------------------
# Rest data for all hinges
# ---------------------------------------------------------------------------------------
def hinges_rest(X_ref, hinges, min_relative_area=1e-8):
    """Rest angle, shared-edge length and combined face area of every hinge.

    Args:
        X_ref: (N, 3) rest positions (m). hinges: (H, 4) int (a, b, c, d),
            ``ipcjax.topology.hinge_topology(...).hinges``.
        min_relative_area: a face with area <= min_relative_area * (longest edge)^2 is
            rejected (as in ``triangles_rest``).
    Returns:
        theta0 (H,) rad, edge_len (H,) m, area_pair (H,) m^2 (A1 + A2), float64 JAX arrays.
    Raises:
        ValueError: naming the first hinge with a degenerate or non-finite face.
    """
    X = np.asarray(X_ref, dtype=np.float64)
    h = np.asarray(hinges)
    if h.ndim != 2 or h.shape[1] != 4:
        raise ValueError(f"hinges must have shape (H, 4); got {h.shape}")
    P = rest_positions(X, h, "hinge")  # (H, 4, 3)
    xa, xb, xc, xd = P[:, 0], P[:, 1], P[:, 2], P[:, 3]
    A1 = 0.5 * np.linalg.norm(np.cross(xc - xa, xd - xa), axis=-1)
    A2 = 0.5 * np.linalg.norm(np.cross(xd - xb, xc - xb), axis=-1)
    l2 = lambda u, v: np.sum((u - v) ** 2, axis=-1)
    lmax1 = np.maximum(np.maximum(l2(xc, xd), l2(xa, xc)), l2(xa, xd))
    lmax2 = np.maximum(np.maximum(l2(xc, xd), l2(xb, xc)), l2(xb, xd))
    ok = (A1 > min_relative_area * lmax1) & (A2 > min_relative_area * lmax2)
    if not ok.all():
        bad = int(np.argmin(ok))
        raise ValueError(
            f"hinge {bad} {h[bad].tolist()} has a degenerate rest face: areas {A1[bad]:.3e}, {A2[bad]:.3e} m^2"
        )
    Pj = jnp.asarray(P)
    theta0 = jax.vmap(_theta)(Pj)
    edge_len = jnp.linalg.norm(Pj[:, 3] - Pj[:, 2], axis=-1)
    return theta0, edge_len, jnp.asarray(A1 + A2)


# ---------------------------------------------------------------------------------------
# The bending models as objects
# ---------------------------------------------------------------------------------------
def _hinge_stiffness_of(params, model):
    """Per-hinge kθ = s·6Dℓ²/A (N m) of a Model's hinges for Params (s: bending_scale)."""
    return params.bending_scale * hinge_stiffness(
        params.youngs_modulus, params.poisson, params.thickness, model.hinge_length, model.hinge_area)


def _discrete_shell_stiffness_of(params, model):
    """Per-hinge κ·w = s·κ·3ℓ²/A (N m): the Discrete Shells weight folded into the stiffness."""
    kappa = params.bending_scale * discrete_shell_kappa(params.youngs_modulus, params.poisson, params.thickness)
    return kappa * 3.0 * model.hinge_length**2 / model.hinge_area


def _unit_weight(fn):
    """A Discrete Shells element function with its weight folded into κ (weight 1)."""
    return lambda Xh, theta0, k: fn(Xh, theta0, k, 1.0)


@dataclasses.dataclass(frozen=True)
class BendingModel(ElementModel):
    """A bending model: per-hinge element functions of ``(Xh (4, 3), theta0, k)``; gradients
    (4, 3) N, Hessians (12, 12) N/m; and the per-hinge stiffness k of a model's hinges."""

    stiffness: Callable = None  # (Params, Model) -> (H,) N m


HINGE = BendingModel("hinge", hinge_energy, hinge_gradient, hinge_hessian, hinge_hessian_psd, _hinge_stiffness_of)
DISCRETE_SHELL = BendingModel(
    "discrete_shell", _unit_weight(discrete_shell_energy), _unit_weight(discrete_shell_gradient),
    _unit_weight(discrete_shell_hessian), _unit_weight(discrete_shell_hessian_psd), _discrete_shell_stiffness_of)
#: The bending models by name (``Config.bending``).
BENDING_MODELS = {m.name: m for m in (HINGE, DISCRETE_SHELL)}


def bending_model(name: str) -> BendingModel:
    """The :class:`BendingModel` called ``name`` (ValueError naming the known ones if none)."""
    return model_named(BENDING_MODELS, "bending", name)

"""Distance-based log barrier (docs/spec.md §4), on the unsquared gap g = d − c in metres.

B(g)   = −k a² log(g/d̂),                  a = g − d̂,   0 < g < d̂
B′(g)  = −k [2a log(g/d̂) + a²/g]
B″(g)  = −k [2 log(g/d̂) + 4a/g − (a/g)²]

B is zero at or above the activation distance d̂ and +∞ for g ≤ 0 (outside the
feasible domain). k is the barrier stiffness in N/m, so B is in joules. Note that
this is a barrier on the distance, not on the squared distance used by IPC Toolkit:
substituting squared-distance derivatives changes the forces.

Per contact stencil (four particle indices, weights w summing to zero):
r = Σ wᵢ xᵢ, n = r/‖r‖, g = ‖r‖ − c; the gradient is B′(g) wᵢ n (exact, by the
envelope theorem on the closest points) and the solver's Hessian is
max(B″(g), 0) (w wᵀ) ⊗ (n nᵀ): only positive normal-direction curvature.
"""
from __future__ import annotations

import jax.numpy as jnp

from ipcjax.distance import stencil_distance


def _active(g, dhat):
    return (g > 0.0) & (g < dhat)


def barrier(g, dhat, k):
    """Barrier energy B(g) in J; 0 for g ≥ d̂, +∞ for g ≤ 0.

    Args:
        g: gap in m (distance minus offset).
        dhat: activation distance d̂ in m.
        k: barrier stiffness in N/m.
    """
    active = _active(g, dhat)
    gs = jnp.where(active, g, 0.5 * dhat)  # double-where: inactive branches stay NaN-free
    a = gs - dhat
    val = -k * a * a * jnp.log(gs / dhat)
    return jnp.where(active, val, jnp.where(g <= 0.0, jnp.inf, 0.0))


def barrier_first_derivative(g, dhat, k):
    """B′(g) = −k [2a log(g/d̂) + a²/g] in N; 0 outside (0, d̂)."""
    active = _active(g, dhat)
    gs = jnp.where(active, g, 0.5 * dhat)
    a = gs - dhat
    val = -k * (2.0 * a * jnp.log(gs / dhat) + a * a / gs)
    return jnp.where(active, val, 0.0)


def barrier_second_derivative(g, dhat, k):
    """B″(g) = −k [2 log(g/d̂) + 4a/g − (a/g)²] in N/m; 0 outside (0, d̂)."""
    active = _active(g, dhat)
    gs = jnp.where(active, g, 0.5 * dhat)
    a = gs - dhat
    val = -k * (2.0 * jnp.log(gs / dhat) + 4.0 * a / gs - (a / gs) ** 2)
    return jnp.where(active, val, 0.0)


def stencil_barrier_gradient(X, w, offset, dhat, k):
    """Gradient (4, 3) of B(‖Σ wᵢ xᵢ‖ − c) with the closest-point weights w held fixed.

    Args:
        X: (4, 3) stencil positions in m.  w: (4,) weights summing to zero.
        offset: c in m.  dhat: d̂ in m.  k: N/m.
    Returns:
        (4, 3) array B′(g) wᵢ n, in N.
    """
    d, n = stencil_distance(X, w)
    return barrier_first_derivative(d - offset, dhat, k) * w[:, None] * n[None, :]


def stencil_barrier_hessian_psd(X, w, offset, dhat, k):
    """Solver Hessian (12, 12) = max(B″, 0) (w wᵀ) ⊗ (n nᵀ): positive normal curvature only."""
    d, n = stencil_distance(X, w)
    b2 = jnp.maximum(barrier_second_derivative(d - offset, dhat, k), 0.0)
    j = (w[:, None] * n[None, :]).reshape(12)
    return b2 * jnp.outer(j, j)


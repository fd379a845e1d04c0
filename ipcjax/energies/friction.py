"""Lagged smoothed friction (docs/spec.md §4).

For each contact active at step start, the load λ = μf·(−B′(g₀)) (N), the closest-point
weights w₀ and the unit normal n₀ are frozen. The tangential relative displacement is

t = (I − n₀n₀ᵀ) Σᵢ w₀ᵢ (xᵢ − x₀ᵢ)            (m)

and the friction energy is λ·(√(t·t + ε²) − ε) with ε = dt · 0.001 m/s (J).
New contacts that appear within the step act through the barrier at once; their
friction loads enter in the following step.
"""
from __future__ import annotations

import jax.numpy as jnp

FRICTION_VELOCITY = 1e-3
"""Smoothing velocity in m/s: ε = dt · FRICTION_VELOCITY."""


def friction_eps(dt):
    """Smoothing length ε = dt · 0.001 m/s, in m."""
    return dt * FRICTION_VELOCITY


def _tangent(X, X0, w0, n0):
    u = w0 @ (X - X0)
    return u - jnp.dot(n0, u) * n0


def friction_energy(X, X0, w0, n0, load, *, eps):
    """Stencil friction energy load·(√(t·t+ε²) − ε) in J.

    Args:
        X: (4, 3) current stencil positions (m); X0: (4, 3) at step start (m).
        w0: (4,) frozen weights; n0: (3,) frozen unit normal; load: λ in N; eps: ε in m.
    """
    t = _tangent(X, X0, w0, n0)
    return load * (jnp.sqrt(jnp.dot(t, t) + eps * eps) - eps)


def friction_gradient(X, X0, w0, n0, load, *, eps):
    """∂/∂xᵢ = λ w₀ᵢ t/√(t·t+ε²), (4, 3) in N (t is already tangential)."""
    t = _tangent(X, X0, w0, n0)
    s = jnp.sqrt(jnp.dot(t, t) + eps * eps)
    return load * w0[:, None] * (t / s)[None, :]


def friction_hessian(X, X0, w0, n0, load, *, eps):
    """Exact Hessian (12, 12) = λ (w₀w₀ᵀ) ⊗ P (I − t tᵀ/s²)/s P with P = I − n₀n₀ᵀ, s = √(t·t+ε²).

    It is positive semi-definite: I − t tᵀ/s² has eigenvalues 1 and ε²/s² > 0.
    """
    t = _tangent(X, X0, w0, n0)
    s2 = jnp.dot(t, t) + eps * eps
    s = jnp.sqrt(s2)
    P = jnp.eye(3) - jnp.outer(n0, n0)
    M = P @ ((jnp.eye(3) - jnp.outer(t, t) / s2) / s) @ P
    return load * jnp.kron(jnp.outer(w0, w0), M)

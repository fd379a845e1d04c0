"""Temporary supports and tie springs (docs/spec.md §3).

Support:  ½ kᵢ ‖xᵢ − targetᵢ‖²            per supported particle, kᵢ in N/m (0 = released)
Tie:      ½ k (‖xᵢ − xⱼ‖ − Lᵢⱼ)²           per particle pair, k in N/m, L in m
"""
from __future__ import annotations

import jax.numpy as jnp


def support_energy(x, target, k):
    """½ k ‖x − target‖² for one particle (x, target: (3,) m; k: N/m), in J."""
    d = x - target
    return 0.5 * k * jnp.dot(d, d)


def support_gradient(x, target, k):
    """k (x − target), (3,) in N."""
    return k * (x - target)


def support_hessian(x, target, k):
    """k I₃ (3, 3) in N/m."""
    return k * jnp.eye(3)


def _length(d):
    sq = jnp.dot(d, d)
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), 0.0)


def tie_energy(xi, xj, rest, k):
    """½ k (‖xᵢ − xⱼ‖ − L)² for one pair, in J."""
    ell = _length(xi - xj)
    return 0.5 * k * (ell - rest) ** 2


def tie_gradient(xi, xj, rest, k):
    """(2, 3): ±k (ℓ − L) u with u = (xᵢ − xⱼ)/ℓ, in N."""
    d = xi - xj
    ell = _length(d)
    u = d / jnp.where(ell > 0, ell, 1.0)
    f = k * (ell - rest) * u
    return jnp.stack([f, -f])


def tie_hessian(xi, xj, rest, k):
    """Exact (6, 6) Hessian: [[K, −K], [−K, K]], K = k[u uᵀ + (1 − L/ℓ)(I − u uᵀ)]."""
    d = xi - xj
    ell = _length(d)
    u = d / jnp.where(ell > 0, ell, 1.0)
    uu = jnp.outer(u, u)
    K = k * (uu + (1.0 - rest / jnp.where(ell > 0, ell, 1.0)) * (jnp.eye(3) - uu))
    return jnp.block([[K, -K], [-K, K]])


def tie_hessian_psd(xi, xj, rest, k):
    """Solver Hessian: as tie_hessian with (1 − L/ℓ) clamped at 0 (a compressed spring adds no
    negative transverse stiffness), which makes K = k[u uᵀ + max(0, 1 − L/ℓ)(I − u uᵀ)] PSD."""
    d = xi - xj
    ell = _length(d)
    u = d / jnp.where(ell > 0, ell, 1.0)
    uu = jnp.outer(u, u)
    K = k * (uu + jnp.maximum(1.0 - rest / jnp.where(ell > 0, ell, 1.0), 0.0) * (jnp.eye(3) - uu))
    return jnp.block([[K, -K], [-K, K]])

"""Inertia term of the incremental potential (docs/spec.md §2).

Φ_inertia(x) = Σᵢ mᵢ ‖xᵢ − yᵢ‖² / (2 dt²)   (J)

with the inertial target yᵢ = x₀ᵢ + dt·v₀ᵢ + dt²·(g + fᵢ/mᵢ) for free particles with
mᵢ > 0; fixed or massless particles keep yᵢ = x₀ᵢ and contribute nothing.
"""
from __future__ import annotations

import jax.numpy as jnp


def inertial_target(x0, v0, dt, *, mass, free, gravity, force):
    """y = x₀ + dt·v₀ + dt²(g + f/m) for free particles with mass, x₀ otherwise.

    Args:
        x0, v0: (N, 3) positions (m) and velocities (m/s). dt: s. mass: (N,) kg.
        free: (N,) bool. gravity: (3,) m/s². force: (N, 3) N.
    """
    moving = free & (mass > 0)
    m = jnp.where(moving, mass, 1.0)[:, None]
    y = x0 + dt * v0 + dt * dt * (gravity[None, :] + force / m)
    return jnp.where(moving[:, None], y, x0)


def inertia_energy(x, y, mass, free, dt):
    """Σ mᵢ‖xᵢ − yᵢ‖²/(2dt²) over free particles, in J."""
    m = jnp.where(free, mass, 0.0)
    d = x - y
    return jnp.sum(m * jnp.sum(d * d, axis=1)) / (2.0 * dt * dt)


def inertia_gradient(x, y, mass, free, dt):
    """(N, 3): mᵢ (xᵢ − yᵢ)/dt² in N."""
    m = jnp.where(free, mass, 0.0)
    return m[:, None] * (x - y) / (dt * dt)


def inertia_hessian_diagonal(mass, free, dt):
    """Diagonal (N,) of the (block-diagonal, isotropic) inertia Hessian: mᵢ/dt² in N/m."""
    return jnp.where(free, mass, 0.0) / (dt * dt)

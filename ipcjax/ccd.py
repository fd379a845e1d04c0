"""Conservative step bound along the current separating normal (displacement bound).

For a contact stencil with closest-point weights w at the current positions X, the
unit normal n = r/‖r‖, r = Σ wᵢ xᵢ, points from the closest point of the second
primitive to the first. Both primitives are convex and the closest points are a
minimising pair, so the plane through them normal to n separates the primitives:

    n·(a − b) ≥ d    for every point a of the first primitive and b of the second.

Move every vertex along xᵢ + α Δxᵢ. Points of a primitive are convex combinations of
its vertices, so with uᵢ = n·Δxᵢ the separation along n changes by at least
α (min over first-primitive u − max over second-primitive u) = −α · approach:

    VT, SF (p | t0 t1 t2):   approach = max(u₁, u₂, u₃) − u₀
    EE (a0 a1 | b0 b1):      approach = max(u₂, u₃) − min(u₀, u₁)
    SS (i | j j j):          approach = u₁ − u₀

and the distance (at least the separation along n) stays above d − α·approach for every
α on the path, not only at its ends. With the gap g = d − offset, any α < g/approach
keeps d > offset. The bound starts at 90% of that: α = 0.9 g/approach when
g/approach ≤ 1, else the full step 1; a non-positive approach (separating motion)
allows the full step.

Conservative advancement (``stencil_advance``). The single bound above is exact for a head-on
approach but pessimistic when the stencil slides or rotates about its contact: the
vertex-wise approach then overstates how fast the closest points close in, and one such
contact at a few µm can clamp every Newton step of the whole system to ~10%. The bound is
therefore re-applied from where it stops: at α_k, recompute the closest points, normal and
gap g_k, and advance by δ = (g_k − g_floor)/a_k, where a_k is the approach of the same full
displacement along the new normal and g_floor = (1 − 0.9)·g₀ is the gap the single bound
would allow in its worst case. Each sub-segment [α_k, α_k + δ] is certified by the
separating-plane argument from its own start, so the distance stays ≥ g_floor + offset on
the whole path; the first pass is exactly the single bound, so the result is never
smaller; a real approach stops at once (g_k reaches g_floor), rotation and sliding advance
to the full step in a few passes.

Contacts are four-vertex stencils tagged with ``candidates.ContactKind`` (VT, EE, SF =
sphere centre–face, SS = sphere pair (i, j, j, j)), so the solver can vmap
``stencil_max_step`` over its candidate list and take the minimum; the minimum of the
per-contact fractions equals the specification's rule (docs/spec.md §4) applied to the
minimum g/approach.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ipcjax.candidates import ContactKind
from ipcjax.distance import (
    edge_edge_weights,
    point_triangle_weights,
    sphere_pair_weights,
    stencil_distance,
)

# Fraction of the exact along-normal bound g/approach taken as the first trial step.
STEP_SAFETY = 0.9
# Conservative advancement stops when a pass gains less than this (step fractions, relative
# and absolute): the remaining passes would not move it.
ADVANCE_PROGRESS_REL = 1e-6
ADVANCE_PROGRESS_ABS = 1e-12


def approach_speed(u, kind):
    """Largest decrease of the separation along n per unit step, from uᵢ = n·Δxᵢ.

    VT, SF (point | triangle): max(u₁, u₂, u₃) − u₀;  EE (edge | edge):
    max(u₂, u₃) − min(u₀, u₁);  SS (sphere pair (i, j, j, j)): u₁ − u₀.

    Args:
      u: (4,) normal displacement components (m).
      kind: ``candidates.ContactKind`` (int, may be traced).

    Returns:
      approach (m); positive when the primitives approach each other.
    """
    point_triangle = jnp.max(u[1:]) - u[0]
    edge_edge = jnp.max(u[2:]) - jnp.min(u[:2])
    sphere_pair = u[1] - u[0]
    return jnp.where(kind == ContactKind.EE, edge_edge,
                     jnp.where(kind == ContactKind.SS, sphere_pair, point_triangle))


def stencil_max_step(X, dX, w, offset, kind):
    """Allowed fraction of a displacement dX for one contact stencil with weights w.

    d, n = stencil_distance(X, w);  g = d − offset;  a = approach_speed(dX @ n, kind);
    α = 0.9 g/a if a > 0 and g/a ≤ 1; α = 1 if g/a > 1 or a ≤ 0.

    Guarantees d(X + α' dX) > offset for all α' ∈ [0, α] when g > 0 (see module docstring).
    An infeasible start (g ≤ 0) gives 0 for an approaching motion and 1 for a separating
    one; at d = 0 the normal is undefined and the result is 0.

    Args:
      X: (4, 3) stencil positions (m).
      dX: (4, 3) stencil displacements (m) for a full step.
      w: (4,) current closest-point weights (sum to zero).
      offset: distance c subtracted from d (m): min_gap, R + min_gap/2, or Rᵢ + Rⱼ.
      kind: ``candidates.ContactKind`` (int, may be traced).

    Returns:
      Step fraction in [0, 1] (float64).
    """
    d, n = stencil_distance(X, w)
    g = d - offset
    a = approach_speed(dX @ n, kind)
    approaching = a > 0.0
    ratio = g / jnp.where(approaching, a, 1.0)
    # ratio < 0 only from an infeasible start (g < 0): no approaching motion is allowed
    alpha = jnp.where(approaching & (ratio <= 1.0), STEP_SAFETY * jnp.maximum(ratio, 0.0), 1.0)
    return jnp.where(d > 0.0, alpha, 0.0)


def stencil_advance(X, dX, offset, kind, weights, passes):
    """Conservative advancement: the step fraction after up to ``passes`` re-applications of
    :func:`stencil_max_step` from the point where the previous one stopped.

    Args:
      X: (4, 3) stencil positions (m).
      dX: (4, 3) stencil displacements for a full step (m).
      offset: distance subtracted from d (m).
      kind: ``candidates.ContactKind``.
      weights: function (X, kind) → (4,) closest-point weights (the solver's ``stencil_weights``).
      passes: number of passes (int, may be traced); 1 gives ``stencil_max_step`` exactly.

    Returns:
      (α, passes used): α ∈ [0, 1] with d(X + α'dX) > offset for all α' ∈ [0, α] when the
      start is feasible; an infeasible start gives what ``stencil_max_step`` gives.
    """
    w0 = weights(X, kind)
    d0, _ = stencil_distance(X, w0)
    g0 = d0 - offset
    a_first = stencil_max_step(X, dX, w0, offset, kind)
    floor = (1.0 - STEP_SAFETY) * g0

    def cond(c):
        alpha, k, moving = c
        return moving & (alpha < 1.0) & (k < passes)

    def body(c):
        alpha, k, _ = c
        Y = X + alpha * dX
        d, n = stencil_distance(Y, weights(Y, kind))
        a = approach_speed(dX @ n, kind)
        room = d - offset - floor
        delta = jnp.where(a > 0.0, jnp.maximum(room, 0.0) / jnp.where(a > 0.0, a, 1.0), jnp.inf)
        delta = jnp.where(d > 0.0, delta, 0.0)
        new = jnp.minimum(alpha + delta, 1.0)
        return new, k + 1, new > alpha * (1.0 + ADVANCE_PROGRESS_REL) + ADVANCE_PROGRESS_ABS

    # feasible starts only; an infeasible one keeps the single bound's rule
    alpha, k, _ = jax.lax.while_loop(cond, body, (a_first, jnp.int32(1), (g0 > 0.0) & (a_first > 0.0)))
    return alpha, k


def point_triangle_max_step(p, t0, t1, t2, dp, dt0, dt1, dt2, offset):
    """Allowed fraction of the displacement of point p against triangle (t0, t1, t2).

    Args:
      p, t0, t1, t2: (3,) positions (m).
      dp, dt0, dt1, dt2: (3,) displacements for a full step (m).
      offset: distance subtracted from d (m).

    Returns:
      Step fraction in [0, 1].
    """
    w, _ = point_triangle_weights(p, t0, t1, t2)
    X, dX = jnp.stack([p, t0, t1, t2]), jnp.stack([dp, dt0, dt1, dt2])
    return stencil_max_step(X, dX, w, offset, ContactKind.VT)


def edge_edge_max_step(a0, a1, b0, b1, da0, da1, db0, db1, offset):
    """Allowed fraction in [0, 1] of the displacement of edge (a0, a1) against edge (b0, b1),
    as :func:`point_triangle_max_step`: positions a0, a1, b0, b1 and full-step displacements
    da0, da1, db0, db1, (3,) m each; ``offset`` (m) is subtracted from d."""
    w, _ = edge_edge_weights(a0, a1, b0, b1)
    X, dX = jnp.stack([a0, a1, b0, b1]), jnp.stack([da0, da1, db0, db1])
    return stencil_max_step(X, dX, w, offset, ContactKind.EE)


def sphere_sphere_max_step(c0, c1, dc0, dc1, offset):
    """Allowed fraction of the displacement of two sphere centres (stencil (i, j, j, j)).

    Args:
      c0, c1: (3,) centres (m).
      dc0, dc1: (3,) displacements for a full step (m).
      offset: distance subtracted from d (m), Rᵢ + Rⱼ (+ any gap).

    Returns:
      Step fraction in [0, 1].
    """
    X, dX = jnp.stack([c0, c1, c1, c1]), jnp.stack([dc0, dc1, dc1, dc1])
    return stencil_max_step(X, dX, sphere_pair_weights(), offset, ContactKind.SS)

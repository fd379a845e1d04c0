"""Closest points between contact primitives: point–triangle, edge–edge, sphere pairs.

Every contact is a four-vertex stencil X (4, 3) with weights w (4,) that sum to zero:

    r = Σ wᵢ xᵢ,    d = ‖r‖,    n = r / d

r points from the closest point on the second primitive to the first one:

    point–triangle (p, t0, t1, t2):   w = (1, −b0, −b1, −b2),   b barycentric, b ∈ [0, 1]³
    edge–edge      (a0, a1, b0, b1):  w = (1−s, s, t−1, −t),    s, t ∈ [0, 1]
    sphere pair    (i, j, j, j):      w = (1, −1, 0, 0)

Which feature pair is closest is a named branch (``PointTriangleType``,
``EdgeEdgeType``; IPC Toolkit's ``distance_type.hpp`` names). Inside a branch the
weights are smooth functions of the coordinates, so ``*_distance_fixed`` can be
differentiated (and finite-differenced) with the branch held fixed. By the envelope
theorem ∂d/∂xᵢ = wᵢ n: the weights minimise ‖r‖ over the branch's affine set, so the
derivative through w vanishes.

The automatic branch is the best of the feasible candidates (interior pair and the
clamped endpoint–segment pairs). Every feasible candidate is the length of a vector
between two actual points of the primitives, so it bounds the distance from above and
the minimum is exact; rounding in an ill-conditioned candidate can only make it lose.
Parallel or nearly parallel edges (and degenerate triangles) drop the interior
candidate, so no division by a vanishing determinant ever selects a branch. The weights
``*_weights`` return are the chosen candidate's, the same numbers as the named branch's
weights (a clamped parameter is the end vertex's constant weight): one set of candidate
formulas serves the choice and the weights, where a second evaluation of every branch's
formulas made a compiled step program about a tenth larger (docs/benchmarks.md, "The
closest-point weights from the chosen candidate").

All functions are pure JAX, float64, vmappable, and take ``dtype`` as a traced int.
Gradients are NaN-free everywhere (double-``where`` guards), including d = 0.
"""
from __future__ import annotations

from enum import IntEnum

import jax
import jax.numpy as jnp

# Edges are treated as parallel (and triangles as degenerate) when sin²θ between their
# directions is below this: ‖u×v‖² < PARALLEL_SIN2 ‖u‖²‖v‖². The same relative threshold
# as IPC Toolkit, so branch choices agree off branch boundaries.
PARALLEL_SIN2 = 2.5e-16


class PointTriangleType(IntEnum):
    """Closest feature of a triangle (t0, t1, t2) to a point; edge i runs t_i → t_{i+1}."""

    P_T0 = 0  # vertex t0
    P_T1 = 1  # vertex t1
    P_T2 = 2  # vertex t2
    P_E0 = 3  # edge t0–t1
    P_E1 = 4  # edge t1–t2
    P_E2 = 5  # edge t2–t0
    P_T = 6  # triangle interior


class EdgeEdgeType(IntEnum):
    """Closest feature pair of edges A = (a0, a1) and B = (b0, b1); ``EA``/``EB`` mean interior."""

    EA0_EB0 = 0
    EA0_EB1 = 1
    EA1_EB0 = 2
    EA1_EB1 = 3
    EA_EB0 = 4
    EA_EB1 = 5
    EA0_EB = 6
    EA1_EB = 7
    EA_EB = 8


# --------------------------------------------------------------------------- helpers


def _safe_div(num, den):
    """num / den where den > 0, else 0; gradients stay finite (double-where)."""
    ok = den > 0.0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def _safe_norm(r):
    """‖r‖ with a zero (not NaN) gradient at r = 0 (double-where)."""
    sq = jnp.dot(r, r)
    ok = sq > 0.0
    return jnp.where(ok, jnp.sqrt(jnp.where(ok, sq, 1.0)), 0.0)


def _segment_parameter(p, e0, e1):
    """Unclamped parameter s of the projection of p on the line e0 + s (e1 − e0).

    s = (p − e0)·e / (e·e), e = e1 − e0; s = 0 for a zero-length edge.
    """
    e = e1 - e0
    return _safe_div(jnp.dot(p - e0, e), jnp.dot(e, e))


def stencil_distance(X, w):
    """Distance and unit normal of a weighted four-vertex stencil.

    r = Σ wᵢ (xᵢ − x₀) (= Σ wᵢ xᵢ since Σ wᵢ = 0; relative to x₀ so that large
    absolute coordinates do not cost precision), d = ‖r‖, n = r / d (n = 0 at d = 0).

    Args:
      X: (4, 3) stencil vertex positions (m).
      w: (4,) weights summing to zero.

    Returns:
      (d, n): distance (m) and unit normal (4-vertex stencil's first primitive side).
    """
    r = jnp.dot(w, X - X[0])
    d = _safe_norm(r)
    n = jnp.where(d > 0.0, r / jnp.where(d > 0.0, d, 1.0), 0.0)
    return d, n


def point_point_distance(p, q):
    """Euclidean distance ‖p − q‖ (m), with zero gradient at p = q.

    Args:
      p, q: (3,) points (m).

    Returns:
      Distance (m).
    """
    return _safe_norm(p - q)


def point_edge_distance(p, e0, e1):
    """Distance from point p to segment [e0, e1].

    d = ‖p − ((1 − s) e0 + s e1)‖, s = clamp((p − e0)·e / e·e, 0, 1), e = e1 − e0.

    Args:
      p: (3,) point (m).
      e0, e1: (3,) segment end points (m).

    Returns:
      Distance (m).
    """
    s = jnp.clip(_segment_parameter(p, e0, e1), 0.0, 1.0)
    return _safe_norm((p - e0) - s * (e1 - e0))


def sphere_pair_weights():
    """Weights (1, −1, 0, 0) of a sphere-centre pair written as the stencil (i, j, j, j)."""
    return jnp.array([1.0, -1.0, 0.0, 0.0])


# --------------------------------------------------------------------- point–triangle


def _triangle_barycentric(p, t0, t1, t2):
    """Barycentric coordinates (b0, b1, b2) of p's projection on the triangle plane.

    With e1 = t1 − t0, e2 = t2 − t0, v = p − t0, N = e1 × e2:
    b1 = (v × e2)·N / N·N,  b2 = (e1 × v)·N / N·N,  b0 = 1 − b1 − b2.
    Returns b = (1, 0, 0) for a zero-area triangle, and N·N, e1·e1, e2·e2.
    """
    e1, e2, v = t1 - t0, t2 - t0, p - t0
    N = jnp.cross(e1, e2)
    nn = jnp.dot(N, N)
    b1 = _safe_div(jnp.dot(jnp.cross(v, e2), N), nn)
    b2 = _safe_div(jnp.dot(jnp.cross(e1, v), N), nn)
    return jnp.stack([1.0 - b1 - b2, b1, b2]), nn, jnp.dot(e1, e1), jnp.dot(e2, e2)


def _point_triangle_branch_weights(p, t0, t1, t2):
    """(7, 4) weights of every PointTriangleType branch, rows in enum order (unclamped)."""
    s0 = _segment_parameter(p, t0, t1)
    s1 = _segment_parameter(p, t1, t2)
    s2 = _segment_parameter(p, t2, t0)
    b, _, _, _ = _triangle_barycentric(p, t0, t1, t2)
    one, zero = jnp.ones_like(s0), jnp.zeros_like(s0)
    rows = [
        [one, -one, zero, zero],  # P_T0
        [one, zero, -one, zero],  # P_T1
        [one, zero, zero, -one],  # P_T2
        [one, s0 - 1.0, -s0, zero],  # P_E0: q = (1 − s0) t0 + s0 t1
        [one, zero, s1 - 1.0, -s1],  # P_E1: q = (1 − s1) t1 + s1 t2
        [one, -s2, zero, s2 - 1.0],  # P_E2: q = (1 − s2) t2 + s2 t0
        [one, -b[0], -b[1], -b[2]],  # P_T
    ]
    return jnp.stack([jnp.stack(r) for r in rows])


def _clamp01(s):
    """s clamped to [0, 1] with a zero derivative at and beyond either end (where the branch
    is an end point's, whose weights are constant)."""
    return jnp.where(s <= 0.0, 0.0, jnp.where(s >= 1.0, 1.0, s))


def _closest_candidate(X, w, interior_ok):
    """Row of the shortest candidate ‖Σⱼ w[k, j] (Xⱼ − X₀)‖ of stencil X (4, 3), the
    interior one (row 0) only where ``interior_ok``; on ``stop_gradient`` values, so that a
    derivative of the chosen row's weights stays inside its branch."""
    Xs, ws = jax.lax.stop_gradient(X), jax.lax.stop_gradient(w)
    r = ws @ (Xs - Xs[0])
    sq = jnp.sum(r * r, axis=1)
    sq = sq.at[0].set(jnp.where(jax.lax.stop_gradient(interior_ok), sq[0], jnp.inf))
    return jnp.argmin(sq)


def _point_triangle_candidates(p, t0, t1, t2):
    """The candidates of the point–triangle branch choice, and which one is closest.

    Returns (w (4, 4): the weights of the interior projection and of the clamped
    projections on edges t0–t1, t1–t2, t2–t0, rows in that order; s (3,) the edges' clamped
    parameters; best: the row of the closest feasible candidate). The choice is made on
    ``stop_gradient`` values, so a derivative of ``w[best]`` stays inside the branch.
    """
    X = jnp.stack([p, t0, t1, t2])
    b, nn, l1, l2 = _triangle_barycentric(p, t0, t1, t2)
    edges = ((t0, t1), (t1, t2), (t2, t0))
    s = jnp.stack([_clamp01(_segment_parameter(p, a, c)) for a, c in edges])
    zero = jnp.zeros_like(s[0])
    one = jnp.ones_like(s[0])
    w = jnp.stack([
        jnp.stack([one, -b[0], -b[1], -b[2]]),
        jnp.stack([one, s[0] - 1.0, -s[0], zero]),
        jnp.stack([one, zero, s[1] - 1.0, -s[1]]),
        jnp.stack([one, -s[2], zero, s[2] - 1.0]),
    ])
    interior_ok = (nn > PARALLEL_SIN2 * l1 * l2) & jnp.all(b >= 0.0)
    return w, jax.lax.stop_gradient(s), _closest_candidate(X, w, interior_ok)


def _point_triangle_type(s, best):
    """``PointTriangleType`` of candidate ``best`` (an edge candidate clamped to an end
    point names that vertex)."""
    T = PointTriangleType
    edge_type = jnp.array([T.P_E0, T.P_E1, T.P_E2], jnp.int32)
    start_vertex = jnp.array([T.P_T0, T.P_T1, T.P_T2], jnp.int32)
    end_vertex = jnp.array([T.P_T1, T.P_T2, T.P_T0], jnp.int32)
    k = jnp.maximum(best - 1, 0)
    sk = s[k]
    on_edge = jnp.where(sk <= 0.0, start_vertex[k], jnp.where(sk >= 1.0, end_vertex[k], edge_type[k]))
    return jnp.where(best == 0, jnp.int32(T.P_T), on_edge).astype(jnp.int32)


def point_triangle_distance_type(p, t0, t1, t2):
    """Closest-feature branch (``PointTriangleType``) of point p and triangle (t0, t1, t2).

    The best feasible candidate among the interior projection (if it lies in the triangle
    and the triangle is not degenerate) and the three clamped point–edge projections;
    an edge candidate clamped to an end point names that vertex.

    Args:
      p, t0, t1, t2: (3,) positions (m).

    Returns:
      int32 branch index.
    """
    _, s, best = _point_triangle_candidates(*(jax.lax.stop_gradient(x) for x in (p, t0, t1, t2)))
    return _point_triangle_type(s, best)


def point_triangle_distance_fixed(p, t0, t1, t2, dtype):
    """Point–triangle distance with the branch held fixed (smooth inside the branch).

    d = ‖p − q‖ with q the closest point of the branch's feature, extended beyond the
    feature (unclamped), e.g. P_E0: q = (1 − s) t0 + s t1, s = (p − t0)·e / e·e; P_T:
    d = |n̂·(p − t0)|.

    Args:
      p, t0, t1, t2: (3,) positions (m).
      dtype: ``PointTriangleType`` (int, may be traced).

    Returns:
      Distance (m).
    """
    w = _point_triangle_branch_weights(p, t0, t1, t2)[dtype]
    return stencil_distance(jnp.stack([p, t0, t1, t2]), w)[0]


def point_triangle_weights(p, t0, t1, t2):
    """Closest-point weights of point p and triangle (t0, t1, t2).

    w = (1, −b0, −b1, −b2), b the barycentric coordinates of the closest point q on the
    triangle, so Σ wᵢ xᵢ = p − q.

    Args:
      p, t0, t1, t2: (3,) positions (m).

    Returns:
      (w (4,), dtype int32 ``PointTriangleType``).
    """
    w, s, best = _point_triangle_candidates(p, t0, t1, t2)
    return w[best], _point_triangle_type(s, best)


def point_triangle_distance(p, t0, t1, t2):
    """Unsquared Euclidean distance from point p to triangle (t0, t1, t2).

    d = min over q in the triangle of ‖p − q‖ = ‖Σ wᵢ xᵢ‖ with the closest-point weights;
    ∂d/∂xᵢ = wᵢ n.

    Args:
      p, t0, t1, t2: (3,) positions (m).

    Returns:
      Distance (m).
    """
    return point_triangle_distance_fixed(p, t0, t1, t2, point_triangle_distance_type(p, t0, t1, t2))


# ------------------------------------------------------------------------- edge–edge


def _line_line_parameters(a0, a1, b0, b1):
    """Parameters (s, t) of the closest points of the lines through edges A and B.

    With u = a1 − a0, v = b1 − b0, m = b0 − a0, N = u × v:
    s = (m × v)·N / N·N,  t = (m × u)·N / N·N  (cross products keep precision when the
    edges are nearly parallel, where u·u v·v − (u·v)² cancels). Also returns N·N, u·u, v·v.
    """
    u, v, m = a1 - a0, b1 - b0, b0 - a0
    N = jnp.cross(u, v)
    nn = jnp.dot(N, N)
    s = _safe_div(jnp.dot(jnp.cross(m, v), N), nn)
    t = _safe_div(jnp.dot(jnp.cross(m, u), N), nn)
    return s, t, nn, jnp.dot(u, u), jnp.dot(v, v)


def _edge_edge_branch_weights(a0, a1, b0, b1):
    """(9, 4) weights of every EdgeEdgeType branch, rows in enum order (unclamped)."""
    sb0 = _segment_parameter(b0, a0, a1)
    sb1 = _segment_parameter(b1, a0, a1)
    ta0 = _segment_parameter(a0, b0, b1)
    ta1 = _segment_parameter(a1, b0, b1)
    s, t, _, _, _ = _line_line_parameters(a0, a1, b0, b1)
    one, zero = jnp.ones_like(s), jnp.zeros_like(s)
    rows = [
        [one, zero, -one, zero],  # EA0_EB0
        [one, zero, zero, -one],  # EA0_EB1
        [zero, one, -one, zero],  # EA1_EB0
        [zero, one, zero, -one],  # EA1_EB1
        [1.0 - sb0, sb0, -one, zero],  # EA_EB0
        [1.0 - sb1, sb1, zero, -one],  # EA_EB1
        [one, zero, ta0 - 1.0, -ta0],  # EA0_EB
        [zero, one, ta1 - 1.0, -ta1],  # EA1_EB
        [1.0 - s, s, t - 1.0, -t],  # EA_EB
    ]
    return jnp.stack([jnp.stack(r) for r in rows])


def _edge_edge_candidates(a0, a1, b0, b1):
    """The candidates of the edge–edge branch choice, and which one is closest.

    Returns (w (5, 4): the weights of the interior line–line pair and of the clamped
    end point–segment pairs a0–B, a1–B, b0–A, b1–A, rows in that order; c (4,) those
    pairs' clamped parameters; best: the row of the closest feasible candidate), the choice
    made on ``stop_gradient`` values as for the point–triangle candidates.
    """
    X = jnp.stack([a0, a1, b0, b1])
    s, t, nn, uu, vv = _line_line_parameters(a0, a1, b0, b1)
    interior_ok = (nn >= PARALLEL_SIN2 * uu * vv) & (nn > 0.0)
    interior_ok &= (s >= 0.0) & (s <= 1.0) & (t >= 0.0) & (t <= 1.0)
    c = jnp.stack([
        _clamp01(_segment_parameter(a0, b0, b1)),
        _clamp01(_segment_parameter(a1, b0, b1)),
        _clamp01(_segment_parameter(b0, a0, a1)),
        _clamp01(_segment_parameter(b1, a0, a1)),
    ])
    one, zero = jnp.ones_like(s), jnp.zeros_like(s)
    w = jnp.stack([
        jnp.stack([1.0 - s, s, t - 1.0, -t]),
        jnp.stack([one, zero, c[0] - 1.0, -c[0]]),
        jnp.stack([zero, one, c[1] - 1.0, -c[1]]),
        jnp.stack([1.0 - c[2], c[2], -one, zero]),
        jnp.stack([1.0 - c[3], c[3], zero, -one]),
    ])
    return w, jax.lax.stop_gradient(c), _closest_candidate(X, w, interior_ok)


def _edge_edge_type(c, best):
    """``EdgeEdgeType`` of candidate ``best`` (a clamped parameter names the end vertex)."""
    T = EdgeEdgeType
    # per endpoint candidate: (clamped at 0, clamped at 1, interior)
    table = jnp.array([
        [T.EA0_EB0, T.EA0_EB1, T.EA0_EB],
        [T.EA1_EB0, T.EA1_EB1, T.EA1_EB],
        [T.EA0_EB0, T.EA1_EB0, T.EA_EB0],
        [T.EA0_EB1, T.EA1_EB1, T.EA_EB1],
    ], jnp.int32)
    k = jnp.maximum(best - 1, 0)
    ck = c[k]
    col = jnp.where(ck <= 0.0, 0, jnp.where(ck >= 1.0, 1, 2))
    return jnp.where(best == 0, jnp.int32(T.EA_EB), table[k, col]).astype(jnp.int32)


def edge_edge_distance_type(a0, a1, b0, b1):
    """Closest-feature branch (``EdgeEdgeType``) of edges A = (a0, a1) and B = (b0, b1).

    The best feasible candidate among the interior line–line pair (only if the edges are
    not parallel, sin²θ ≥ PARALLEL_SIN2, and both parameters lie in [0, 1]) and the four
    clamped endpoint–segment pairs; a clamped parameter names the end vertex.

    Positions a0, a1, b0, b1: (3,) m. Returns the int32 branch index.
    """
    _, c, best = _edge_edge_candidates(*(jax.lax.stop_gradient(x) for x in (a0, a1, b0, b1)))
    return _edge_edge_type(c, best)


def edge_edge_distance_fixed(a0, a1, b0, b1, dtype):
    """Edge–edge distance with the branch held fixed (smooth inside the branch).

    d = ‖(1 − s) a0 + s a1 − (1 − t) b0 − t b1‖ with the branch's unclamped parameters,
    e.g. EA_EB: the line–line closest points, d = |N̂·(a0 − b0)|, N = u × v.

    Positions a0, a1, b0, b1: (3,) m; dtype: ``EdgeEdgeType`` (int, may be traced). Returns
    distance (m).
    """
    w = _edge_edge_branch_weights(a0, a1, b0, b1)[dtype]
    return stencil_distance(jnp.stack([a0, a1, b0, b1]), w)[0]


def edge_edge_weights(a0, a1, b0, b1):
    """Closest-point weights of edges A = (a0, a1) and B = (b0, b1).

    w = (1 − s, s, t − 1, −t) with s, t ∈ [0, 1] the segment parameters of the closest
    points, so Σ wᵢ xᵢ = pA − pB.

    Positions a0, a1, b0, b1: (3,) m. Returns (w (4,), dtype int32 ``EdgeEdgeType``).
    """
    w, c, best = _edge_edge_candidates(a0, a1, b0, b1)
    return w[best], _edge_edge_type(c, best)


def edge_edge_distance(a0, a1, b0, b1):
    """Unsquared Euclidean distance between segments [a0, a1] and [b0, b1].

    d = min over s, t ∈ [0, 1] of ‖(1 − s) a0 + s a1 − (1 − t) b0 − t b1‖;
    ∂d/∂xᵢ = wᵢ n.

    Positions a0, a1, b0, b1: (3,) m. Returns distance (m).
    """
    return edge_edge_distance_fixed(a0, a1, b0, b1, edge_edge_distance_type(a0, a1, b0, b1))

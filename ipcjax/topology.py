"""Static mesh topology derived once from triangle connectivity (host-side, NumPy).

Everything here is computed on the host when a model is built; the results are
static int32 index arrays that the jitted energies gather through.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class HingeTopology(NamedTuple):
    """Interior hinges and the edges left out of them.

    hinges:       (H, 4) int32, order (opposite a, opposite b, shared c, shared d).
                  Face 1 is (c, d, a) and face 2 is (d, c, b) in the winding of the
                  first triangle that contains the edge.
    boundary:     (Eb, 2) int32 edges with a single adjacent triangle (no hinge).
    nonmanifold:  (En, 2) int32 edges with three or more adjacent triangles (no hinge).
    """

    hinges: np.ndarray
    boundary: np.ndarray
    nonmanifold: np.ndarray


def rest_positions(X_ref: np.ndarray, elements: np.ndarray, name: str) -> np.ndarray:
    """(E, k, 3) rest positions (m) of elements (E, k), checked finite.

    Raises:
        ValueError: naming the first ``name`` (e.g. "triangle") with a non-finite coordinate.
    """
    P = X_ref[elements]
    finite = np.isfinite(P).all(axis=(1, 2))
    if not finite.all():
        bad = int(np.argmin(finite))
        raise ValueError(f"{name} {bad} {elements[bad].tolist()} has non-finite rest positions: {P[bad].tolist()}")
    return P


def as_triangles(triangles, n_vertices: int | None = None) -> np.ndarray:
    """Validate triangle connectivity and return it as a C-contiguous (T, 3) int32 array.

    Raises:
        ValueError: wrong shape or dtype, negative or out-of-range indices, or a
            triangle that repeats a vertex.
    """
    t = np.asarray(triangles)
    if t.ndim != 2 or t.shape[1] != 3:
        raise ValueError(f"triangles must have shape (T, 3); got {t.shape}")
    if not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"triangles must be an integer array; got dtype {t.dtype}")
    if t.size and t.min() < 0:
        bad = int(np.argwhere((t < 0).any(axis=1))[0, 0])
        raise ValueError(f"triangle {bad} has a negative vertex index: {t[bad].tolist()}")
    if n_vertices is not None and t.size and t.max() >= n_vertices:
        bad = int(np.argwhere((t >= n_vertices).any(axis=1))[0, 0])
        raise ValueError(
            f"triangle {bad} indexes vertex {int(t[bad].max())} but there are only {n_vertices} vertices"
        )
    rep = (t[:, 0] == t[:, 1]) | (t[:, 1] == t[:, 2]) | (t[:, 0] == t[:, 2])
    if rep.any():
        bad = int(np.argwhere(rep)[0, 0])
        raise ValueError(f"triangle {bad} repeats a vertex: {t[bad].tolist()}")
    return np.ascontiguousarray(t, dtype=np.int32)


def mesh_edges(triangles) -> np.ndarray:
    """Unique undirected edges (E, 2) int32, each stored with the smaller index first, sorted."""
    t = np.asarray(triangles, dtype=np.int64)
    if t.size == 0:
        return np.zeros((0, 2), np.int32)
    e = np.concatenate([t[:, [0, 1]], t[:, [1, 2]], t[:, [2, 0]]], axis=0)
    e = np.sort(e, axis=1)
    e = np.unique(e, axis=0)
    return e.astype(np.int32)


def hinge_topology(triangles) -> HingeTopology:
    """Interior hinges of a triangle mesh, in the (a, b, c, d) order used by the bending energies.

    For an edge shared by exactly two triangles, c→d is the edge as it appears in the
    first triangle's winding (c, d, a), and b is the vertex of the second triangle
    opposite the edge. Edges with one triangle are boundary edges; edges with three
    or more are non-manifold and are reported, not bent.
    """
    t = np.asarray(triangles, dtype=np.int64)
    adj: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for tri in t:
        for k in range(3):
            c, d, a = int(tri[k]), int(tri[(k + 1) % 3]), int(tri[(k + 2) % 3])
            adj.setdefault((min(c, d), max(c, d)), []).append((c, d, a))
    hinges, boundary, nonmanifold = [], [], []
    for key in sorted(adj):
        faces = adj[key]
        if len(faces) == 1:
            boundary.append(key)
        elif len(faces) == 2:
            (c, d, a), (_, _, b) = faces
            hinges.append((a, b, c, d))
        else:
            nonmanifold.append(key)
    as_arr = lambda rows, k: np.asarray(rows, dtype=np.int32).reshape(-1, k)
    return HingeTopology(as_arr(hinges, 4), as_arr(boundary, 2), as_arr(nonmanifold, 2))

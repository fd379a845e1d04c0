"""Triangle meshes: the bag's film, the disk topology (docs/spec.md §5) laid flat
(:func:`bag_mesh`, the pouch scene's film) or on a sphere (:func:`pouch_mesh`, the bag's
round pouch); and :func:`quad_grid_triangles`, the one triangulation of a grid of quad cells
(the square films, the bin and floor, the Verlet cloth).

Vertex 0 is the centre; ring r = 1..R holds C points at angles 2π c / C, vertex index
1 + (r − 1) C + c (:func:`ring_index`). Defaults R = 15, C = 32 give 481 vertices and
C + 2C(R − 1) = 928 triangles; the rim is ring R and the neck ring is ring 11 of 15, the
same proportion otherwise (:func:`neck_ring_of`). Along each column the reference edges
from the neck ring to the rim sum to ``NECK_TO_RIM``. SI units; z up. Why a pouch, and
its sizes: docs/design.md, "The bag scene".
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

DISK_RADIUS = 0.24           # m: the flat disk of bag_mesh (the pouch scene's film)
POUCH_RADIUS = 0.09          # m: the bag's reference shape, a sphere of this radius ...
POUCH_RIM_POLAR = np.radians(160.0)  # ... from its bottom pole up to the rim at this polar angle
NECK_TO_RIM = 0.030          # m: along each column, the reference edges from the neck ring to the rim


class BagMesh(NamedTuple):
    x: np.ndarray          # (1 + R C, 3) reference positions (vertex 0 at the origin), m
    triangles: np.ndarray  # (C + 2C(R − 1), 3) int32
    ring_radius: np.ndarray  # (R + 1,) horizontal radius of ring r (ring 0 = centre), m
    rings: int
    columns: int
    neck_ring: int
    rim: np.ndarray        # (C,) indices of ring R
    neck: np.ndarray       # (C,) indices of the neck ring


def quad_grid_triangles(nu: int, nv: int, vertex, *, u_outer: bool = False, alternate: bool = False,
                        dtype=np.int32) -> np.ndarray:
    """The two triangles of each cell of an nu × nv grid of quad cells, (2 nu nv, 3).

    Cell (i, j), i < nu along u and j < nv along v, has corners p00 = vertex(i, j),
    p10 = vertex(i + 1, j), p01 = vertex(i, j + 1), p11 = vertex(i + 1, j + 1), where
    ``vertex`` maps grid node (i, j) to its index. Each cell is split along p00–p11 into
    (p00, p10, p11) and (p00, p11, p01), or, with ``alternate``, where i + j is odd along
    p10–p01 into (p00, p10, p01) and (p10, p11, p01), so that the diagonals alternate.
    Cells are listed with j (v) as the outer loop, or i (u) with ``u_outer``.
    """
    cells = ((i, j) for i in range(nu) for j in range(nv)) if u_outer else \
        ((i, j) for j in range(nv) for i in range(nu))
    tris = []
    for i, j in cells:
        p00, p10, p01, p11 = vertex(i, j), vertex(i + 1, j), vertex(i, j + 1), vertex(i + 1, j + 1)
        if alternate and (i + j) % 2:
            tris += [(p00, p10, p01), (p10, p11, p01)]
        else:
            tris += [(p00, p10, p11), (p00, p11, p01)]
    return np.asarray(tris, dtype).reshape(-1, 3)


def ring_index(ring: int, column, columns: int):
    """Vertex index of (ring ≥ 1, column) in :func:`bag_mesh`'s numbering."""
    return 1 + (ring - 1) * columns + np.mod(column, columns)


def neck_ring_of(rings: int) -> int:
    """The neck ring for a bag of ``rings`` rings: ring 11 of 15, same proportion otherwise."""
    neck = int(round(11 * rings / 15))
    return min(max(neck, 1), rings - 1)


def _disk_triangles(rings: int, columns: int) -> np.ndarray:
    """The disk topology: a fan round the centre, then two triangles per quad between
    rings; the diagonal alternates with (ring + column) parity so the mesh has no spiral
    bias. Counter-clockwise seen from +z when the rings lie flat."""
    tris = []
    for k in range(columns):
        tris.append((0, ring_index(1, k, columns), ring_index(1, k + 1, columns)))
    for r in range(1, rings):
        for k in range(columns):
            a, b = ring_index(r, k, columns), ring_index(r, k + 1, columns)
            A, B = ring_index(r + 1, k, columns), ring_index(r + 1, k + 1, columns)
            if (r + k) % 2 == 0:
                tris += [(a, A, B), (a, B, b)]
            else:
                tris += [(a, A, b), (b, A, B)]
    return np.asarray(tris, np.int32)


def _check_rings(rings, columns):
    if rings < 2 or columns < 3:
        raise ValueError(f"a bag needs rings ≥ 2 and columns ≥ 3; got rings={rings}, columns={columns}")


def _mesh(x, rr, rings, columns):
    neck = neck_ring_of(rings)
    return BagMesh(x=np.asarray(x, np.float64), triangles=_disk_triangles(rings, columns), ring_radius=rr,
                   rings=rings, columns=columns, neck_ring=neck,
                   rim=ring_index(rings, np.arange(columns), columns),
                   neck=ring_index(neck, np.arange(columns), columns))


def bag_mesh(rings: int = 15, columns: int = 32, radius: float = DISK_RADIUS,
             neck_to_rim: float = NECK_TO_RIM) -> BagMesh:
    """Flat disk: a centre vertex and ``rings`` rings of ``columns`` points at z = 0.

    Ring radii: rings neck…R equally spaced with (R − neck) edges summing to
    ``neck_to_rim`` (m); rings 1…neck equally spaced from 0 to ``radius − neck_to_rim``.
    (The pouch scene's film; the bag's film is :func:`pouch_mesh`, the same topology.)
    """
    _check_rings(rings, columns)
    if not 0 < neck_to_rim < radius:
        raise ValueError(f"need 0 < neck_to_rim < radius; got {neck_to_rim}, {radius}")
    neck = neck_ring_of(rings)
    r_neck = radius - neck_to_rim
    rr = np.empty(rings + 1)
    rr[: neck + 1] = np.linspace(0.0, r_neck, neck + 1)
    rr[neck:] = np.linspace(r_neck, radius, rings - neck + 1)
    ang = 2 * np.pi * np.arange(columns) / columns
    x = [np.zeros(3)]
    for r in range(1, rings + 1):
        x += list(np.stack([rr[r] * np.cos(ang), rr[r] * np.sin(ang), np.zeros(columns)], axis=1))
    return _mesh(x, rr, rings, columns)


def pouch_polar_angles(rings: int, radius: float = POUCH_RADIUS, rim_polar: float = POUCH_RIM_POLAR,
                       neck_to_rim: float = NECK_TO_RIM) -> np.ndarray:
    """(R + 1,) polar angle (rad, from the bottom pole) of each ring of :func:`pouch_mesh`:
    rings neck…R equally spaced below ``rim_polar`` so that the chords along a column from
    the neck ring to the rim sum to ``neck_to_rim``; rings 0…neck equally spaced from the
    pole to the neck."""
    neck = neck_ring_of(rings)
    edge = neck_to_rim / (rings - neck)
    if not 0 < edge < 2 * radius:
        raise ValueError(f"neck_to_rim {neck_to_rim} m does not fit a sphere of radius {radius} m")
    phi_neck = rim_polar - (rings - neck) * 2.0 * np.arcsin(edge / (2.0 * radius))
    if not 0 < phi_neck < rim_polar < np.pi:
        raise ValueError(f"need 0 < neck polar angle < rim polar angle < π; got rim_polar={rim_polar}, "
                         f"neck_to_rim/radius={neck_to_rim / radius}")
    phi = np.empty(rings + 1)
    phi[: neck + 1] = np.linspace(0.0, phi_neck, neck + 1)
    phi[neck:] = np.linspace(phi_neck, rim_polar, rings - neck + 1)
    return phi


def pouch_mesh(rings: int = 15, columns: int = 32, radius: float = POUCH_RADIUS,
               rim_polar: float = POUCH_RIM_POLAR, neck_to_rim: float = NECK_TO_RIM) -> BagMesh:
    """The bag's film: the disk topology of :func:`bag_mesh` laid on a sphere of ``radius``
    (m) from its bottom pole (vertex 0, at z = 0) up to the rim at polar angle
    ``rim_polar`` (rad): a round pouch open at the top.

    Ring r lies at the polar angle of :func:`pouch_polar_angles`; along each column the
    reference edges from the neck ring to the rim sum to ``neck_to_rim``. ``ring_radius``
    holds each ring's horizontal radius.
    """
    _check_rings(rings, columns)
    phi = pouch_polar_angles(rings, radius, rim_polar, neck_to_rim)
    rr = radius * np.sin(phi)
    ang = 2 * np.pi * np.arange(columns) / columns
    x = [np.zeros(3)]
    for r in range(1, rings + 1):
        z = radius * (1.0 - np.cos(phi[r]))
        x += list(np.stack([rr[r] * np.cos(ang), rr[r] * np.sin(ang), np.full(columns, z)], axis=1))
    return _mesh(x, rr, rings, columns)

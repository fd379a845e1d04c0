"""Static capacities of the broad phase (:mod:`ipcjax.candidates`): the buffer sizes a query
compiles with, a first guess from the topology, and their growth above what an overflowing
query reported."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from ipcjax.candidates import ContactTopology

_MAX_BUFFER = 1 << 28  # the host refuses to allocate a buffer above this (entries)


class GridCapacity(NamedTuple):
    """Static sizes of the intermediate buffers of one grid search (entries).

    insert: (cell, element) entries of the inserted boxes.
    lookup: (query box, cell) entries.
    tests:  box-pair tests (sum over lookups of the elements stored in the cell).
    """

    insert: int
    lookup: int
    tests: int


class Capacity(NamedTuple):
    """Static capacities (hashable; a jit static argument). Changing them recompiles.

    vt, ee, sf: rows of the candidate buffers.
    face_grid: intermediate buffers of the search of vertex and sphere-centre boxes
        against triangle boxes (VT and SF share one grid).
    edge_grid: intermediate buffers of the edge-against-edge search (EE).
    active: rows of the Newton Hessian's contact terms — barrier stencils inside d̂ at an
        iterate, friction stencils with a load at step start — which the assembly
        compacts out of all the candidate rows (the rest add exactly zero). The Newton
        loop compacts the rows its assembly, step bound and line search need by kind:
        each kind gets its own slots, :func:`kind_slots` of ``active``, so that each row
        computes only its own kind's closest point (:mod:`ipcjax.newton`). More rows than
        ``active`` in all, or more of one kind than its slots, is an overflow (except in
        reach of a line search's segment, which is cut where its rows fit:
        :func:`ipcjax.line_search.reach_scale`).
        None: no compaction, every candidate row is assembled and searched.
    None grids pick a size from the topology; any size is safe (too small only raises
    the overflow flag).
    """

    vt: int
    ee: int
    sf: int
    face_grid: GridCapacity | None = None
    edge_grid: GridCapacity | None = None
    active: int | None = None


#: Slots every kind of contact row gets in the Newton loop's compacted sets beyond its
#: share of ``Capacity.active`` (:func:`kind_slots`).
KIND_SLACK = 32

#: Every kind gets at least ``Capacity.active`` / KIND_FLOOR slots (:func:`kind_slots`).
KIND_FLOOR = 4


def kind_slots(active: int, blocks) -> tuple[int, ...]:
    """Static slots per kind (VT, EE, SF, SS) of the Newton loop's compacted contact sets.

    ``blocks``: the candidate rows of each kind (``ContactSet.blocks``). Each kind gets its
    share of ``active`` in proportion to its candidate rows, rounded up, plus
    :data:`KIND_SLACK`, and at least ``active`` / :data:`KIND_FLOOR` (rounded up), but never
    more than its candidate rows. Near a film the rows spread over VT and EE much as the
    candidates do, so those slots add up to little more than ``active``, and a row computes
    only its own kind's closest point instead of every kind's. Sphere rows can be far more
    than their share: the SF block is small (256 of the bag's 14,181 candidate rows), and
    when the spheres settle on the film (step 262 of the protocol) holding its near rows by
    share alone grew ``Capacity.active`` from 1,878 to 5,299, which made every set larger
    and the whole protocol 1.4 times slower (docs/benchmarks.md); with the floor it stays
    at 1,878. The smallest ``active`` whose slots hold given counts is
    :func:`ipcjax.line_search.slots_needed`.
    """
    total = sum(int(b) for b in blocks)
    floor = -(-int(active) // KIND_FLOOR)
    return tuple(0 if b == 0 else min(int(b), max(-(-int(active) * int(b) // total) + KIND_SLACK, floor))
                 for b in blocks)


def resolve_capacity(capacity: Capacity, topo: ContactTopology) -> Capacity:
    """Fill unspecified intermediate capacities from the topology sizes."""
    P, T, E, S = (len(topo.points), len(topo.triangles), len(topo.edges), len(topo.spheres))
    vt, ee, sf = int(capacity.vt), int(capacity.ee), int(capacity.sf)
    face = capacity.face_grid or GridCapacity(
        8 * T + 1024, 8 * P + 4096 * S + 1024, 4 * (vt + sf) + 32 * (P + S) + 1024)
    edge = capacity.edge_grid or GridCapacity(8 * E + 1024, 8 * E + 1024, 8 * ee + 32 * E + 1024)
    return Capacity(vt, ee, sf, face, edge, capacity.active)


def initial_capacity(topo: ContactTopology, x=None) -> Capacity:
    """A starting capacity from the topology sizes (the host helper grows it on overflow).

    Active contact rows start at two per point (+64), above the peak number of stencils
    inside d̂ of the bag run (about 2.3 per film vertex; a small share of the candidate rows).
    Sphere–face rows start at 16 per sphere (+64), and at no fewer than min(S·T, 256):
    every sphere–triangle pair of a small scene, so small scenes never start short. With
    the positions ``x`` (N, 3), they also start at no fewer than :func:`wrapped_sphere_rows`
    (+64, at most S·T): every sphere wrapped in film. A capacity that grows later
    costs a compilation of the step program (12 s for the pouch bag, whose spheres settle
    into the film at 3.1 s and needed one row more than 256; wrapped, its seven spheres
    start at 432). The candidates are boxes, not the film's surface, so this is no bound:
    a scene can need more, and then grows.
    """
    P, E, S, T = len(topo.points), len(topo.edges), len(topo.spheres), len(topo.triangles)
    sf = max(16 * S + 64, min(S * T, 256))
    if x is not None:
        sf = max(sf, min(S * T, wrapped_sphere_rows(topo, x) + 64))
    return resolve_capacity(Capacity(4 * P + 64, 4 * E + 64, sf, active=2 * P + 64), topo)


def wrapped_sphere_rows(topo: ContactTopology, x) -> int:
    """Sphere–face rows when every sphere is wrapped in film, the most film a sphere can
    touch: Σ 4πr²/ā over the spheres (radius r), ā the mean area at ``x`` (N, 3) of the
    triangles with a particle that moves (of every triangle when none does). 0 without
    spheres or triangles, or where ``x`` is not finite or the mean area is not positive
    (validation names those)."""
    tris, spheres = np.asarray(topo.triangles), np.asarray(topo.spheres)
    if len(tris) == 0 or len(spheres) == 0:
        return 0
    x = np.asarray(x, np.float64)
    moving = ~np.all(np.asarray(topo.fixed)[tris], axis=1)
    t = tris[moving] if moving.any() else tris
    a, b, c = x[t[:, 0]], x[t[:, 1]], x[t[:, 2]]
    area = 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1)
    mean = float(np.mean(area)) if np.all(np.isfinite(area)) else 0.0
    if not mean > 0:
        return 0
    r = np.asarray(topo.radius, np.float64)[spheres]
    return int(np.ceil(np.sum(4.0 * np.pi * r * r) / mean))


def check_capacity(capacity) -> Capacity:
    """Reject a capacity that cannot hold a single row (or is not a :class:`Capacity`).

    Raises:
        TypeError: not a Capacity. ValueError: vt, ee, sf or active below 1, naming it.
    """
    if not isinstance(capacity, Capacity):
        raise TypeError(f"capacity must be an ipcjax.candidates.Capacity; got {type(capacity).__name__}")
    for name in ("vt", "ee", "sf", "active"):
        v = getattr(capacity, name)
        if name == "active" and v is None:
            continue
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"capacity.{name} must be an integer ≥ 1; got {v!r}")
    for grid in (capacity.face_grid, capacity.edge_grid):
        if grid is not None and any(not isinstance(g, (int, np.integer)) or g < 1 for g in grid):
            raise ValueError(f"grid capacities must be integers ≥ 1; got {tuple(grid)}")
    return capacity


def _grow(n: int, old: int) -> int:
    return old if n <= old else int(1.5 * n) + 64


def grow_capacity(capacity: Capacity, n_vt: int, n_ee: int, n_sf: int, work, *, n_active: int = 0) -> Capacity:
    """A capacity above the needs an overflowing query reported (×1.5 + 64 where short).

    Args:
        capacity: the capacity of the query (grids None count as 0).
        n_vt, n_ee, n_sf: its reported counts (maxima over several queries are fine).
        work: its (2, 3) `Candidates.work`.
        n_active: the ``Capacity.active`` the Newton solve needed (``StepInfo.n_active``:
            its contact rows, or more where its compacted sets are blocked by kind; ignored
            when ``Capacity.active`` is None).

    After an intermediate overflow the later stages report lower bounds, so a cold start
    may take up to four rounds (insert/lookup, tests, pairs); callers keep the result.

    Raises:
        ValueError: a buffer would exceed 2^28 entries (a box covering a huge number of
            cells: positions have probably exploded).
    """
    work = np.asarray(work)
    olds = [g if g is not None else GridCapacity(0, 0, 0)
            for g in (capacity.face_grid, capacity.edge_grid)]
    grids = [GridCapacity(*(_grow(int(n), int(o)) for n, o in zip(work[k], old)))
             for k, old in enumerate(olds)]
    biggest = max(max(g) for g in grids)
    if biggest > _MAX_BUFFER:
        raise ValueError(
            f"candidate search needs a buffer of {biggest} entries (limit {_MAX_BUFFER}); "
            "a box covers too many grid cells. Entries needed (insert, lookup, tests) by "
            f"the face grid and the edge grid: {work.tolist()}"
        )
    active = None if capacity.active is None else _grow(int(n_active), int(capacity.active))
    return Capacity(_grow(int(n_vt), int(capacity.vt)), _grow(int(n_ee), int(capacity.ee)),
                    _grow(int(n_sf), int(capacity.sf)), *grids, active)

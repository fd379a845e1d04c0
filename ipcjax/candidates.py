"""Broad phase: contact candidates for one swept move, with static capacity and an overflow flag.

Every element gets an axis-aligned box over its vertices at the start and at the end
of the proposed move (per-axis min/max over both). Candidate kinds (docs/spec.md §4):

    VT  (vertex p, triangle t)   p not a vertex of t          gap tolerance  dhat + min_gap
    EE  (edge i, edge j), i < j  no shared vertex, once        gap tolerance  dhat + min_gap
    SF  (sphere s, triangle t)                                gap tolerance  R_s + dhat + min_gap
    SS  (sphere i, sphere j), i < j, every pair, static

"Gap tolerance" w: a pair is a candidate when its two boxes are at most w apart along
every axis. It is realised by widening boxes before the overlap test: the VT vertex box
by w, the SF sphere-centre box by R + w, and each of the two EE edge boxes by w/2 (the
same total tolerance, and a test that is symmetric in i and j, so each unordered pair
has one answer). Any pair whose primitives come within distance w at some instant of
the linear move is therefore found. After widening, every bound is moved outward by
4·eps32·(1 + |coord|) so that positions rounded to FP32 cannot fall outside the box.
Pairs whose vertices are all fixed are skipped (their gap cannot change).

The search is a sort-based uniform grid, pure JAX under jit, with static buffer sizes
(jax-md `partition.py` style): the result carries the true counts and an overflow flag,
and `find_candidates_host` reallocates above the true counts and queries again (the
capacities: :mod:`ipcjax.capacity`, imported from here too). No pair is ever dropped
silently. `brute_force_candidates` is the all-pairs NumPy reference.
"""
from __future__ import annotations

import enum
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ipcjax.capacity import (  # the capacity API, also imported from here
    Capacity, GridCapacity, check_capacity, grow_capacity, initial_capacity, resolve_capacity)
from ipcjax.topology import as_triangles, mesh_edges

EPS32 = float(np.finfo(np.float32).eps)
FP32_PAD = 4.0 * EPS32  # relative outward expansion of every box bound

_KEY_BITS = 62  # a packed grid key (cell coordinates, then the owner) stays below 2^62
_MIN_CELL_M = 1e-30  # m: the grid cell edge is never zero (all boxes degenerate to one point)
_NO_KEY = np.iinfo(np.int64).max  # sorts after every real key
_MAX_SEGMENT = 1 << 40  # per-box cell counts are clipped here (still far above any buffer)


class ContactKind(enum.IntEnum):
    """Kind of a contact stencil (row of `stencils`)."""

    VT = 0  # (p, t0, t1, t2)
    EE = 1  # (a0, a1, b0, b1)
    SF = 2  # (s, t0, t1, t2)
    SS = 3  # (i, j, j, j)


class ContactTopology(NamedTuple):
    """Static contact topology, built once on the host by `contact_topology`.

    triangles: (T, 3) int32 contact triangles (film and fixed obstacles).
    edges:     (E, 2) int32 `mesh_edges(triangles)`, smaller index first, sorted.
    points:    (P,) int32 sorted vertices referenced by a triangle (vertex–triangle queries).
    spheres:   (S,) int32 sorted independent sphere centres (radius > 0, in no triangle).
    radius:    (N,) float64 sphere radius per particle (m), 0 for film and obstacles.
    fixed:     (N,) bool, True for particles that never move.
    """

    triangles: np.ndarray
    edges: np.ndarray
    points: np.ndarray
    spheres: np.ndarray
    radius: np.ndarray
    fixed: np.ndarray


class Candidates(NamedTuple):
    """Result of one broad-phase query (a pytree).

    vt: (cap_vt, 2) int32 rows (vertex p, triangle t), sorted; unused rows −1.
    ee: (cap_ee, 2) int32 rows (edge i, edge j), i < j, sorted; unused rows −1.
    sf: (cap_sf, 2) int32 rows (sphere-centre particle s, triangle t), sorted; unused −1.
    ss: (S(S−1)/2, 2) int32 rows (particle i, particle j), i < j, sorted; pairs of two
        fixed spheres are −1 rows at the end (static shape).
    n_vt, n_ee, n_sf: int32 true number of candidate pairs (also when above capacity;
        a lower bound only when an intermediate buffer overflowed).
    overflow: bool, any count above its buffer, intermediate buffers included.
    work: (2, 3) int64 entries needed by the intermediate buffers, rows (face grid,
        edge grid), columns (insert, lookup, tests); used by the host to reallocate.
    """

    vt: jax.Array
    ee: jax.Array
    sf: jax.Array
    ss: jax.Array
    n_vt: jax.Array
    n_ee: jax.Array
    n_sf: jax.Array
    overflow: jax.Array
    work: jax.Array


# --------------------------------------------------------------------------- topology


def contact_topology(triangles, n_particles: int, radius, fixed) -> ContactTopology:
    """Build the static contact topology on the host.

    Args:
        triangles: (T, 3) int contact triangles (film and fixed obstacles).
        n_particles: N, number of particles.
        radius: (N,) sphere radius (m); > 0 only for independent sphere centres.
        fixed: (N,) bool fixed flags.

    Raises:
        ValueError: bad shapes, or a particle with radius > 0 that belongs to a triangle.
    """
    tri = as_triangles(np.asarray(triangles).reshape(-1, 3), n_particles)
    radius = np.asarray(radius, dtype=np.float64)
    fixed = np.asarray(fixed, dtype=bool)
    if radius.shape != (n_particles,) or fixed.shape != (n_particles,):
        raise ValueError(
            f"radius and fixed must have shape ({n_particles},); got {radius.shape} and {fixed.shape}"
        )
    if not np.all(np.isfinite(radius)) or np.any(radius < 0):
        raise ValueError("radius must be finite and non-negative")
    points = np.unique(tri).astype(np.int32)
    on_surface = np.zeros(n_particles, bool)
    on_surface[points] = True
    bad = np.flatnonzero(on_surface & (radius > 0))
    if bad.size:
        raise ValueError(f"particle {int(bad[0])} has radius > 0 but belongs to a triangle")
    spheres = np.flatnonzero(radius > 0).astype(np.int32)
    return ContactTopology(tri, mesh_edges(tri), points, spheres, radius, fixed)


def sphere_pairs(topo: ContactTopology) -> np.ndarray:
    """Static SS rows (i < j) as `find_candidates` returns them: −1 rows (two fixed) last."""
    s = np.asarray(topo.spheres, np.int64)
    a, b = np.triu_indices(s.size, k=1)
    pairs = np.stack([s[a], s[b]], axis=1)
    both_fixed = topo.fixed[pairs[:, 0]] & topo.fixed[pairs[:, 1]] if pairs.size else np.zeros(0, bool)
    out = np.concatenate([pairs[~both_fixed], np.full((int(both_fixed.sum()), 2), -1)], axis=0)
    return out.reshape(-1, 2).astype(np.int32)


# --------------------------------------------------------------------------- boxes


def _pad_fp32(lo, hi, xp):
    """Move bounds outward by 4·eps32·(1+|c|): FP32 rounding of a position stays inside."""
    return lo - FP32_PAD * (1.0 + xp.abs(lo)), hi + FP32_PAD * (1.0 + xp.abs(hi))


def _widths(dhat, min_gap, radius_of_query):
    """Per-kind box widening (m): VT vertex w, EE each edge w/2, SF sphere R + w."""
    w = dhat + min_gap
    return w, 0.5 * w, radius_of_query + w


# --------------------------------------------------------------------------- grid


def _segment_expand(counts, cap: int):
    """Expand segments of lengths `counts` (K,) into `cap` slots.

    Slot s belongs to segment owner[s] at position local[s] in it; valid[s] = s < total.
    Count → cumsum → one scatter-add of segment starts → cumsum gives the owner, O(K + cap)
    with no search. Returns (owner int32, local int64, valid bool, total int64).
    """
    counts = jnp.minimum(counts.astype(jnp.int64), _MAX_SEGMENT)  # no int64 wrap in the sum
    ends = jnp.cumsum(counts)
    starts = ends - counts
    total = ends[-1]
    marks = jnp.zeros(cap, jnp.int32).at[starts].add(1, mode="drop")
    owner = jnp.clip(jnp.cumsum(marks) - 1, 0, counts.shape[0] - 1)
    slot = jnp.arange(cap, dtype=jnp.int64)
    return owner, slot - starts[owner], slot < total, total


def _key_layout(n_owners: int):
    """(owner bits, bits per cell axis) of the packed grid keys for ``n_owners`` targets.

    A key is (cell x, cell y, cell z, owner), packed high to low into one int64 below
    2^62, so that one sort of plain int64 keys orders the entries by cell and, within a
    cell, by owner: XLA's CPU sort of one int64 array is about 4 times as fast as its sort
    of (key, owner) pairs (docs/benchmarks.md). Cell coordinates are clipped to
    [0, 2^(axis bits − 1)] (:func:`_cell_range`).
    """
    owner_bits = max(1, int(n_owners - 1).bit_length())
    axis_bits = (_KEY_BITS - owner_bits) // 3
    if axis_bits < 8:
        raise ValueError(f"a grid search of {n_owners} boxes leaves {axis_bits} bits per cell axis (need 8)")
    return owner_bits, axis_bits


def _cell_range(lo, hi, origin, cell, max_cell: int):
    """Integer cell coordinates (int64, clipped to [0, max_cell]) of box corners; monotone in lo/hi."""

    def to_cell(v):
        f = jnp.nan_to_num((v - origin) / cell, nan=0.0, posinf=max_cell, neginf=0.0)
        return jnp.clip(jnp.floor(f), 0, max_cell).astype(jnp.int64)

    c_lo, c_hi = to_cell(lo), to_cell(hi)
    return c_lo, jnp.maximum(c_hi, c_lo)


def _cell_key(c, axis_bits: int):
    return (c[..., 0] << (2 * axis_bits)) | (c[..., 1] << axis_bits) | c[..., 2]


def _median(a):
    """``jnp.median`` of a 1-D array of non-negative floats (NaN if any is NaN), bit for bit.

    Sorted as their int64 bit patterns, which order non-negative floats as their values:
    XLA's CPU sort of int64 is about 4 times as fast as of float64 (docs/benchmarks.md).
    """
    n = a.shape[0]
    if n == 0:
        return jnp.asarray(jnp.nan, a.dtype)
    s = jax.lax.bitcast_convert_type(jnp.sort(jax.lax.bitcast_convert_type(a, jnp.int64)), a.dtype)
    mid = (s[(n - 1) // 2] + s[n // 2]) * jnp.asarray(0.5, a.dtype)
    return jnp.where(jnp.any(jnp.isnan(a)), jnp.asarray(jnp.nan, a.dtype), mid)


def _cells_of(c_lo, span, owner, local):
    """The `local`-th cell (row-major) of box `owner` spanning `span` cells per axis."""
    s = span[owner]
    k = local % s[:, 2]
    r = local // s[:, 2]
    return c_lo[owner] + jnp.stack([r // s[:, 1], r % s[:, 1], k], axis=1)


def _first_above(sorted_owner, first, last, q, n_steps: int):
    """Per lookup, the first index in [first, last) whose owner exceeds q (bisection).

    Within a cell the entries are sorted by owner (the packed key's low bits).
    """

    def step(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) // 2
        below = sorted_owner[jnp.clip(mid, 0, sorted_owner.shape[0] - 1)] <= q
        open_ = lo < hi
        return jnp.where(open_ & below, mid + 1, lo), jnp.where(open_ & ~below, mid, hi)

    return jax.lax.fori_loop(0, n_steps, step, (first, last))[0]


def _grid_pairs(q_box, t_box, keep, *, cap: GridCapacity, same_set: bool = False):
    """All (query, target) index pairs whose boxes overlap and that `keep(q, t)` accepts.

    ``q_box``, ``t_box``: (lo, hi) corners, each (n, 3) m, of the query and target boxes.

    Uniform grid. The cell edge is the larger of the median query-box and median
    target-box extents, so a typical box touches at most two cells per axis; outsized
    boxes (bin walls, fast spheres) are entered into every cell they cover. Targets are
    inserted as (cell, target) entries, each packed into one int64 key (:func:`_key_layout`),
    and sorted; each query box looks up every cell it covers (two searchsorted calls per
    cell); the tests are the concatenated cell ranges. A pair sharing several cells is
    kept only in the cell holding the min corner of the two boxes' intersection, i.e. the
    componentwise max of their min cells (exact integer comparison, as floor is monotone).

    With `same_set` (queries and targets are the same boxes) each query only tests the
    entries of a cell with a larger index, so every unordered pair is tested once per
    shared cell instead of twice.

    Returns (q, t, hit, work) with hit a mask over the `cap.tests` slots and
    work = (insert, lookup, tests) entries needed (int64).
    """
    (q_lo, q_hi), (t_lo, t_hi) = q_box, t_box
    n_t = t_lo.shape[0]
    owner_bits, axis_bits = _key_layout(n_t)
    max_cell = 1 << (axis_bits - 1)
    q_ext = jnp.max(q_hi - q_lo, axis=1)
    t_ext = jnp.max(t_hi - t_lo, axis=1)
    origin = jnp.minimum(q_lo.min(0), t_lo.min(0))
    top = jnp.maximum(q_hi.max(0), t_hi.max(0))
    span_all = jnp.max(top - origin)
    cell = jnp.maximum(_median(q_ext), _median(t_ext))
    # at most max_cell / 2 cells per axis (keys fit their bits); never zero
    cell = jnp.maximum(jnp.maximum(cell, span_all * (2.0 / max_cell)), _MIN_CELL_M)

    tc_lo, tc_hi = _cell_range(t_lo, t_hi, origin, cell, max_cell)
    qc_lo, qc_hi = _cell_range(q_lo, q_hi, origin, cell, max_cell)
    t_span, q_span = tc_hi - tc_lo + 1, qc_hi - qc_lo + 1

    # insert targets into every cell they cover, sorted by (cell, owner) in one packed key
    ti, tl, tv, n_insert = _segment_expand(jnp.prod(t_span, axis=1), cap.insert)
    t_cell = _cell_key(_cells_of(tc_lo, t_span, ti, tl), axis_bits)
    t_key = jnp.sort(jnp.where(tv, (t_cell << owner_bits) | ti.astype(jnp.int64), _NO_KEY))
    t_owner = jnp.minimum(t_key & ((1 << owner_bits) - 1), n_t - 1).astype(ti.dtype)

    # each query looks up every cell it covers: the entries with keys in [cell, cell + 1)
    qi, ql, qv, n_lookup = _segment_expand(jnp.prod(q_span, axis=1), cap.lookup)
    q_cell = _cells_of(qc_lo, q_span, qi, ql)
    q_key = _cell_key(q_cell, axis_bits)
    first = jnp.searchsorted(t_key, q_key << owner_bits, side="left")
    last = jnp.searchsorted(t_key, (q_key + 1) << owner_bits, side="left")
    if same_set:
        first = _first_above(t_owner, first, last, qi, int(cap.insert).bit_length() + 1)
    in_cell = jnp.where(qv, last - first, 0)

    # one test per (lookup, entry of its cell)
    li, ll, lv, n_tests = _segment_expand(in_cell, cap.tests)
    q = qi[li]
    t = t_owner[jnp.clip(first[li] + ll, 0, cap.insert - 1)]
    overlap = jnp.all((q_lo[q] <= t_hi[t]) & (t_lo[t] <= q_hi[q]), axis=1)
    home = jnp.all(q_cell[li] == jnp.maximum(qc_lo[q], tc_lo[t]), axis=1)
    hit = lv & overlap & home & keep(q, t)
    return q, t, hit, jnp.stack([n_insert, n_lookup, n_tests])


def _compact(a, b, hit, cap: int, n_b: int):
    """Scatter hit pairs (a, b) into a (cap, 2) buffer sorted by (a, b); unused rows −1."""
    count = jnp.sum(hit, dtype=jnp.int64)
    pos = jnp.where(hit, jnp.cumsum(hit) - 1, cap)
    key = jnp.full(cap, _NO_KEY, jnp.int64).at[pos].set(
        a.astype(jnp.int64) * n_b + b.astype(jnp.int64), mode="drop"
    )
    key = jnp.sort(key)
    used = key != _NO_KEY
    rows = jnp.stack([jnp.where(used, key // n_b, -1), jnp.where(used, key % n_b, -1)], axis=1)
    return rows.astype(jnp.int32), count


# --------------------------------------------------------------------------- query


@functools.partial(jax.jit, static_argnames=("capacity",))
def find_candidates(x_start, x_end, topo: ContactTopology, dhat, min_gap, *, capacity: Capacity) -> Candidates:
    """Broad-phase candidates for the move x_start → x_end (jitted; pure JAX).

    VT and SF share one grid search (vertex boxes and sphere-centre boxes, the latter
    widened by R, against triangle boxes); EE is a second search of edge boxes
    against themselves.

    Args:
        x_start, x_end: (N, 3) positions (m) at the start and the end of the proposed move.
        topo: ContactTopology (its arrays are traced; only their shapes are static).
        dhat: barrier activation distance (m).
        min_gap: minimum separation subtracted from distances (m).
        capacity: static Capacity; changing it recompiles.

    Returns:
        Candidates. Check `overflow`, or call `find_candidates_host`, which reallocates.
    """
    cap = resolve_capacity(capacity, topo)
    x0 = jnp.asarray(x_start).astype(jnp.float64)
    x1 = jnp.asarray(x_end).astype(jnp.float64)
    tri, edges = jnp.asarray(topo.triangles), jnp.asarray(topo.edges)
    points, spheres = jnp.asarray(topo.points), jnp.asarray(topo.spheres)
    radius, fixed = jnp.asarray(topo.radius, jnp.float64), jnp.asarray(topo.fixed)
    w_vt, w_ee, w_sf = _widths(
        jnp.asarray(dhat, jnp.float64), jnp.asarray(min_gap, jnp.float64), radius[spheres]
    )
    T, E, P, S = tri.shape[0], edges.shape[0], points.shape[0], spheres.shape[0]

    def box(idx, widen):
        widen = jnp.broadcast_to(widen, (idx.shape[0],))[:, None]
        lo = jnp.minimum(x0[idx].min(1), x1[idx].min(1)) - widen
        hi = jnp.maximum(x0[idx].max(1), x1[idx].max(1)) + widen
        return _pad_fp32(lo, hi, jnp)

    def not_all_fixed(a, b):
        return ~(jnp.all(fixed[a], axis=1) & jnp.all(fixed[b], axis=1))

    def empty(cap_rows):
        return jnp.full((cap_rows, 2), -1, jnp.int32), jnp.int64(0)

    # VT + SF: vertex boxes (widened by w) and sphere-centre boxes (by R + w) vs triangles
    if P + S and T:
        vertex = jnp.concatenate([points, spheres])
        q_lo, q_hi = (jnp.concatenate(z) for z in zip(box(points[:, None], w_vt),
                                                       box(spheres[:, None], w_sf)))

        def keep_face(q, t):
            v, tv = vertex[q], tri[t]
            return jnp.all(tv != v[:, None], axis=1) & not_all_fixed(v[:, None], tv)

        q, t, hit, work_face = _grid_pairs((q_lo, q_hi), box(tri, 0.0), keep_face, cap=cap.face_grid)
        (vt, n_vt), (sf, n_sf) = (_compact(vertex[q], t, hit & m, c, T)
                                  for m, c in (((q < P), cap.vt), ((q >= P), cap.sf)))
    else:
        (vt, n_vt), (sf, n_sf), work_face = empty(cap.vt), empty(cap.sf), jnp.zeros(3, jnp.int64)

    # EE: edges against edges, each unordered pair once (i < j)
    if E:
        def keep_ee(i, j):
            a, b = edges[i], edges[j]
            disjoint = jnp.all(a[:, :, None] != b[:, None, :], axis=(1, 2))
            return (i < j) & disjoint & not_all_fixed(a, b)

        ee_box = box(edges, w_ee)
        i, j, hit, work_edge = _grid_pairs(ee_box, ee_box, keep_ee, cap=cap.edge_grid, same_set=True)
        ee, n_ee = _compact(i, j, hit, cap.ee, E)
    else:
        (ee, n_ee), work_edge = empty(cap.ee), jnp.zeros(3, jnp.int64)

    # SS: static, every pair; pairs of two fixed spheres become trailing −1 rows
    a, b = np.triu_indices(S, k=1)
    ss = jnp.stack([spheres[a], spheres[b]], axis=1)
    both_fixed = fixed[ss[:, 0]] & fixed[ss[:, 1]]
    order = jnp.argsort(both_fixed, stable=True)
    ss = jnp.where(both_fixed[order, None], -1, ss[order]).astype(jnp.int32)

    work = jnp.stack([work_face, work_edge])
    limits = jnp.asarray([list(cap.face_grid), list(cap.edge_grid)], jnp.int64)
    overflow = jnp.any(work > limits) | (n_vt > cap.vt) | (n_ee > cap.ee) | (n_sf > cap.sf)
    as_i32 = lambda n: jnp.minimum(n, np.iinfo(np.int32).max).astype(jnp.int32)
    return Candidates(vt, ee, sf, ss, as_i32(n_vt), as_i32(n_ee), as_i32(n_sf), overflow, work)


def find_candidates_host(x_start, x_end, topo: ContactTopology, dhat, min_gap, *, capacity=None,
                         max_rounds: int = 6):
    """Query, and on overflow reallocate above the true counts and query again.

    Returns (Candidates, Capacity): reuse the capacity on later calls to avoid recompiling.

    Raises:
        ValueError: non-finite positions, or a buffer that would exceed 2^28 entries
            (a box covering a huge number of cells: positions have probably exploded).
        RuntimeError: still overflowing after `max_rounds` reallocations.
    """
    # float64 on the host: FP32 inputs are exact in it and share the compiled query
    x_start, x_end = np.asarray(x_start, np.float64), np.asarray(x_end, np.float64)
    if not (np.all(np.isfinite(x_start)) and np.all(np.isfinite(x_end))):
        raise ValueError("find_candidates_host: positions must be finite")
    cap = resolve_capacity(capacity if capacity is not None else initial_capacity(topo), topo)
    for _ in range(max_rounds):
        cands = find_candidates(x_start, x_end, topo, dhat, min_gap, capacity=cap)
        if not bool(cands.overflow):
            return cands, cap
        cap = grow_capacity(cap, int(cands.n_vt), int(cands.n_ee), int(cands.n_sf), cands.work)
    raise RuntimeError(f"candidate buffers still overflow after {max_rounds} reallocations")


# --------------------------------------------------------------------------- stencils


def stencils(cands: Candidates, topo: ContactTopology):
    """Contact stencils from candidates (jittable).

    Rows VT (p, t0, t1, t2), EE (a0, a1, b0, b1), SF (s, t0, t1, t2), SS (i, j, j, j),
    in that block order.

    Returns:
        idx (M, 4) int32, kind (M,) int8 ContactKind, valid (M,) bool; padding rows
        have index 0 and valid False. M = cap_vt + cap_ee + cap_sf + S(S−1)/2.
    """
    tri, edges = jnp.asarray(topo.triangles), jnp.asarray(topo.edges)

    def block(pairs, build, kind):
        ok = pairs[:, 0] >= 0
        safe = jnp.where(ok[:, None], pairs, 0)
        idx = build(safe[:, 0], safe[:, 1]) if pairs.shape[0] else jnp.zeros((0, 4), jnp.int32)
        idx = jnp.where(ok[:, None], idx, 0).astype(jnp.int32)
        return idx, jnp.full(pairs.shape[0], int(kind), jnp.int8), ok

    def safe_gather(table, i):
        return table[i] if table.shape[0] else jnp.zeros((i.shape[0],) + table.shape[1:], jnp.int32)

    parts = [
        block(cands.vt, lambda p, t: jnp.concatenate([p[:, None], safe_gather(tri, t)], 1), ContactKind.VT),
        block(cands.ee, lambda i, j: jnp.concatenate([safe_gather(edges, i), safe_gather(edges, j)], 1),
              ContactKind.EE),
        block(cands.sf, lambda s, t: jnp.concatenate([s[:, None], safe_gather(tri, t)], 1), ContactKind.SF),
        block(cands.ss, lambda i, j: jnp.stack([i, j, j, j], 1), ContactKind.SS),
    ]
    return tuple(jnp.concatenate(z, axis=0) for z in zip(*parts))


# --------------------------------------------------------------------------- reference


def brute_force_candidates(x_start, x_end, topo: ContactTopology, dhat, min_gap) -> Candidates:
    """All-pairs NumPy reference with the same box definition (the tests' oracle).

    Returns Candidates whose buffers have exactly the found rows (no padding),
    overflow False and work zeros.
    """
    x0 = np.asarray(x_start, np.float64)
    x1 = np.asarray(x_end, np.float64)
    tri = np.asarray(topo.triangles, np.int64)
    edges = np.asarray(topo.edges, np.int64)
    points = np.asarray(topo.points, np.int64)
    spheres = np.asarray(topo.spheres, np.int64)
    fixed = np.asarray(topo.fixed, bool)
    radius = np.asarray(topo.radius, np.float64)
    w_vt, w_ee, w_sf = _widths(np.float64(dhat), np.float64(min_gap), radius[spheres])

    def box(idx, widen):
        both = np.concatenate([x0[idx], x1[idx]], axis=1)  # (M, 2k, 3)
        lo = both.min(axis=1) - np.broadcast_to(widen, (len(idx),))[:, None]
        hi = both.max(axis=1) + np.broadcast_to(widen, (len(idx),))[:, None]
        return _pad_fp32(lo, hi, np)

    def all_pairs(a_box, a_verts, b_box, b_verts, keep):
        rows = []
        for s in range(0, len(a_verts), 256):
            alo, ahi = a_box[0][s:s + 256], a_box[1][s:s + 256]
            hit = np.all((alo[:, None] <= b_box[1][None]) & (b_box[0][None] <= ahi[:, None]), axis=2)
            for i, j in np.argwhere(hit):
                i += s
                va, vb = a_verts[i], b_verts[j]
                if fixed[va].all() and fixed[vb].all():
                    continue
                if keep(i, j, va, vb):
                    rows.append((i, j))
        return np.asarray(rows, np.int64).reshape(-1, 2)

    tri_box = box(tri, 0.0)
    pt = points[:, None]
    vt = all_pairs(box(pt, w_vt), pt, tri_box, tri, lambda i, j, p, t: p[0] not in t)
    vt[:, 0] = points[vt[:, 0]]
    ee = all_pairs(box(edges, w_ee), edges, box(edges, w_ee), edges,
                   lambda i, j, a, b: i < j and not set(a) & set(b))
    sp = spheres[:, None]
    sf = all_pairs(box(sp, w_sf), sp, tri_box, tri, lambda i, j, s, t: True)
    sf[:, 0] = spheres[sf[:, 0]]

    def lex(r):
        return r[np.lexsort((r[:, 1], r[:, 0]))].astype(np.int32)

    return Candidates(
        lex(vt), lex(ee), lex(sf), sphere_pairs(topo),
        np.int32(len(vt)), np.int32(len(ee)), np.int32(len(sf)), np.bool_(False),
        np.zeros((2, 3), np.int64),
    )

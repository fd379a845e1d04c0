"""Self-intersection and gap audit of any trajectory (ours, Newton VBD's, an imported one).

Host-side NumPy, independent of the solver's own contact code, so that it can judge
the solver: a frame self-intersects when an edge of one film triangle passes through
another film triangle that shares no vertex with it (edge through face).
:class:`BackgroundAudit` runs the same audit in a worker process while a simulation is
still producing its frames.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

import numpy as np

from ipcjax.topology import as_triangles, mesh_edges


def _boxes(x, elems):
    p = x[elems]
    return p.min(axis=1), p.max(axis=1)


def _box_pairs(lo_a, hi_a, lo_b, hi_b):
    """All (i, j) with overlapping boxes, by sort and sweep along x.

    The b boxes are sorted by their lower x; box i can only overlap those whose lower x
    lies in [lo_a[i].x − (widest b box in x), hi_a[i].x], found by two binary searches,
    and only those candidates are tested in all three axes (one pass over the candidate
    pairs, where the chunked comparison before tested every pair of a chunk's window).
    Pairs come ordered by i, then by b's lower x.
    """
    if len(lo_a) == 0 or len(lo_b) == 0:
        return np.zeros((0, 2), np.int64)
    order = np.argsort(lo_b[:, 0], kind="stable")
    lo_b_s, hi_b_s = lo_b[order], hi_b[order]
    max_w = float(np.max(hi_b[:, 0] - lo_b[:, 0]))
    start = np.searchsorted(lo_b_s[:, 0], lo_a[:, 0] - max_w, side="left")
    end = np.searchsorted(lo_b_s[:, 0], hi_a[:, 0], side="right")
    count = np.maximum(end - start, 0)
    total = int(count.sum())
    if total == 0:
        return np.zeros((0, 2), np.int64)
    i = np.repeat(np.arange(len(lo_a)), count)
    first = np.cumsum(count) - count  # where each i's candidates begin
    jj = np.arange(total) - np.repeat(first, count) + np.repeat(start, count)
    ov = np.all((lo_a[i] <= hi_b_s[jj]) & (lo_b_s[jj] <= hi_a[i]), axis=1)
    return np.stack([i[ov], order[jj[ov]]], axis=1).astype(np.int64)


def segment_triangle_intersect(p0, p1, t0, t1, t2, *, eps=0.0):
    """Vectorised test: does segment p0→p1 cross triangle (t0, t1, t2)? (bool array)

    Möller–Trumbore in FP64: the segment parameter and the barycentrics must lie in
    [0, 1] (widened by eps). Coplanar (parallel) pairs are reported as not crossing.
    """
    d = p1 - p0
    e1, e2 = t1 - t0, t2 - t0
    h = np.cross(d, e2)
    a = np.einsum("ij,ij->i", e1, h)
    scale = np.linalg.norm(d, axis=1) * np.linalg.norm(e1, axis=1) * np.linalg.norm(e2, axis=1)
    ok = np.abs(a) > 1e-14 * np.maximum(scale, 1e-300)
    f = np.where(ok, 1.0 / np.where(ok, a, 1.0), 0.0)
    s = p0 - t0
    u = f * np.einsum("ij,ij->i", s, h)
    q = np.cross(s, e1)
    v = f * np.einsum("ij,ij->i", d, q)
    t = f * np.einsum("ij,ij->i", e2, q)
    return ok & (u >= -eps) & (v >= -eps) & (u + v <= 1 + eps) & (t >= -eps) & (t <= 1 + eps)


def edge_face_intersections(x, triangles, edges=None) -> np.ndarray:
    """(K, 2) pairs (edge index, triangle index) where an edge passes through a triangle
    that shares no vertex with it."""
    x = np.asarray(x, dtype=np.float64)
    tris = as_triangles(triangles, x.shape[0])
    edges = mesh_edges(tris) if edges is None else np.asarray(edges)
    if len(tris) == 0 or len(edges) == 0:
        return np.zeros((0, 2), np.int64)
    pairs = _box_pairs(*_boxes(x, edges), *_boxes(x, tris))
    if len(pairs) == 0:
        return pairs
    e, t = edges[pairs[:, 0]], tris[pairs[:, 1]]
    shares = (e[:, :1] == t).any(axis=1) | (e[:, 1:] == t).any(axis=1)
    pairs, e, t = pairs[~shares], e[~shares], t[~shares]
    hit = segment_triangle_intersect(x[e[:, 0]], x[e[:, 1]], x[t[:, 0]], x[t[:, 1]], x[t[:, 2]])
    return pairs[hit]


class FrameAudit(NamedTuple):
    intersecting_pairs: int
    min_film_film: float     # smallest vertex–triangle / edge–edge distance between non-adjacent film primitives, m
    min_film_sphere: float   # smallest sphere-surface to film distance (centre distance − R), m


def _point_triangle_dist(p, a, b, c):
    """Vectorised unsigned point–triangle distance (Ericson's region tests), FP64."""
    ab, ac, ap = b - a, c - a, p - a
    d1, d2 = np.einsum("ij,ij->i", ab, ap), np.einsum("ij,ij->i", ac, ap)
    bp = p - b
    d3, d4 = np.einsum("ij,ij->i", ab, bp), np.einsum("ij,ij->i", ac, bp)
    cp = p - c
    d5, d6 = np.einsum("ij,ij->i", ab, cp), np.einsum("ij,ij->i", ac, cp)
    va = d3 * d6 - d5 * d4
    vb = d5 * d2 - d1 * d6
    vc = d1 * d4 - d3 * d2
    denom = va + vb + vc
    denom = np.where(np.abs(denom) > 0, denom, 1.0)
    v = vb / denom
    w = vc / denom
    q = a + ab * v[:, None] + ac * w[:, None]
    # edges and vertices: clamp by projecting onto each edge and taking the minimum
    def seg(p, s0, s1):
        d = s1 - s0
        tt = np.clip(np.einsum("ij,ij->i", p - s0, d) / np.maximum(np.einsum("ij,ij->i", d, d), 1e-300), 0, 1)
        return np.linalg.norm(p - (s0 + d * tt[:, None]), axis=1)
    inside = (va >= 0) & (vb >= 0) & (vc >= 0)
    d_in = np.linalg.norm(p - q, axis=1)
    d_edge = np.minimum(np.minimum(seg(p, a, b), seg(p, b, c)), seg(p, c, a))
    return np.where(inside, np.minimum(d_in, d_edge), d_edge)


def audit_frame(x, film_triangles, sphere_index=(), sphere_radius=(), search=5e-3) -> FrameAudit:
    """Audit one frame: edge-through-face count, min film–film and film–sphere distances.

    Distances are computed only between primitives whose boxes lie within ``search`` (m);
    farther pairs report +inf.
    """
    x = np.asarray(x, dtype=np.float64)
    tris = as_triangles(film_triangles, x.shape[0])
    hits = edge_face_intersections(x, tris)
    verts = np.unique(tris)
    lo_t, hi_t = _boxes(x, tris)
    pv = x[verts]
    pairs = _box_pairs(pv - search, pv + search, lo_t, hi_t)
    mff = np.inf
    if len(pairs):
        vi, ti = verts[pairs[:, 0]], pairs[:, 1]
        keep = ~(tris[ti] == vi[:, None]).any(axis=1)
        if keep.any():
            t = tris[ti[keep]]
            mff = float(_point_triangle_dist(x[vi[keep]], x[t[:, 0]], x[t[:, 1]], x[t[:, 2]]).min())
    return FrameAudit(int(len(hits)), mff, _min_film_sphere(x, tris, (lo_t, hi_t), sphere_index, sphere_radius,
                                                            search=search))


def _min_film_sphere(x, tris, boxes, sphere_index, sphere_radius, *, search):
    """Smallest sphere-surface–triangle distance (m) among pairs whose boxes lie within
    ``search``; +inf with no such pair or no sphere."""
    sphere_index = np.asarray(sphere_index, dtype=np.int64).reshape(-1)
    sphere_radius = np.asarray(sphere_radius, dtype=np.float64).reshape(-1)
    if not sphere_index.size:
        return np.inf
    c, r = x[sphere_index], sphere_radius
    pairs = _box_pairs(c - (r + search)[:, None], c + (r + search)[:, None], *boxes)
    if not len(pairs):
        return np.inf
    s, t = pairs[:, 0], tris[pairs[:, 1]]
    return float((_point_triangle_dist(c[s], x[t[:, 0]], x[t[:, 1]], x[t[:, 2]]) - r[s]).min())


def min_film_sphere(x, film_triangles, sphere_index, sphere_radius, search=5e-3) -> float:
    """:func:`audit_frame`'s ``min_film_sphere`` of one frame alone (m), without its
    intersection test and film–film distance."""
    x = np.asarray(x, dtype=np.float64)
    tris = as_triangles(film_triangles, x.shape[0])
    return _min_film_sphere(x, tris, _boxes(x, tris), sphere_index, sphere_radius, search=search)


def audit_trajectory(frames, film_triangles, sphere_index=(), sphere_radius=(), search=5e-3):
    """Audit every frame (T, N, 3). Returns a dict with per-frame arrays and the totals."""
    res = [audit_frame(f, film_triangles, sphere_index, sphere_radius, search) for f in np.asarray(frames)]
    inter = np.array([r.intersecting_pairs for r in res])
    return dict(
        frames=len(res),
        frames_with_self_intersection=int((inter > 0).sum()),
        intersecting_pairs=inter,
        min_film_film=np.array([r.min_film_film for r in res]),
        min_film_sphere=np.array([r.min_film_sphere for r in res]),
    )


def merge_audits(parts) -> dict:
    """One :func:`audit_trajectory` result from those of consecutive runs of frames."""
    parts = list(parts)
    cat = lambda key, dtype: np.concatenate([np.asarray(p[key], dtype) for p in parts]) if parts else np.zeros(0, dtype)
    return dict(frames=sum(p["frames"] for p in parts),
                frames_with_self_intersection=sum(p["frames_with_self_intersection"] for p in parts),
                intersecting_pairs=cat("intersecting_pairs", np.int64),
                min_film_film=cat("min_film_film", np.float64),
                min_film_sphere=cat("min_film_sphere", np.float64))


class BackgroundAudit:
    """:func:`audit_trajectory` of frames handed over one at a time, run in a worker process.

    A simulation's host driver keeps one of the two cores of a small machine busy, and
    the audit of its frames is independent of the stepping. ``add`` collects frames and
    hands every ``chunk`` of them to one worker process (``spawn``: JAX's threads make
    ``fork`` unsafe; a few seconds to start), so that at the end only the last chunk is
    left to wait for; :meth:`result` audits what is left and returns exactly what
    ``audit_trajectory`` of all frames in order returns. A worker that fails raises its
    error from :meth:`result`; nothing is dropped. Use it as a context manager, or call
    :meth:`close`, so that the worker stops when the run does.
    """

    def __init__(self, film_triangles, sphere_index=(), sphere_radius=(), search=5e-3, *, chunk: int = 24):
        if chunk < 1:
            raise ValueError(f"chunk must be ≥ 1 frame, got {chunk}")
        self._args = (np.asarray(film_triangles), np.asarray(sphere_index), np.asarray(sphere_radius), search)
        self._chunk = int(chunk)
        self._pending, self._futures, self.frames = [], [], 0
        # at the lowest priority: it takes the cycles the stepping leaves, not the stepping's
        self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=os.nice, initargs=(19,))

    def add(self, frame) -> None:
        """One frame (N, 3), the next in the trajectory's order."""
        self._pending.append(np.array(frame, copy=True))
        self.frames += 1
        if len(self._pending) >= self._chunk:
            self._submit()

    def _submit(self) -> None:
        if self._pending:
            self._futures.append(self._pool.submit(audit_trajectory, np.stack(self._pending), *self._args))
            self._pending = []

    def result(self) -> dict:
        """The audit of every frame added, in order (waits for the worker)."""
        self._submit()
        out = merge_audits(f.result() for f in self._futures)
        if out["frames"] != self.frames:
            raise RuntimeError(f"background audit: {out['frames']} frames audited of {self.frames} added")
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

"""Self-intersection audit, cross-checked against ipctk's edge–triangle intersection test."""
import ipctk
import numpy as np

from ipcjax.audit import _box_pairs, audit_frame, audit_trajectory, edge_face_intersections, segment_triangle_intersect
from scenes.film import film_grid


def test_segment_triangle_test_agrees_with_ipctk():
    rng = np.random.default_rng(0)
    n = 3000
    p0, p1 = rng.normal(size=(n, 3)), rng.normal(size=(n, 3))
    t0, t1, t2 = rng.normal(size=(n, 3)), rng.normal(size=(n, 3)), rng.normal(size=(n, 3))
    ours = segment_triangle_intersect(p0, p1, t0, t1, t2)
    ref = np.array([ipctk.is_edge_intersecting_triangle(p0[i], p1[i], t0[i], t1[i], t2[i]) for i in range(n)])
    assert ours.sum() > 100  # the sample has plenty of crossings
    assert np.array_equal(ours, ref)


def test_box_pairs_are_every_overlapping_pair_in_order():
    """The sweep's pairs are exactly the brute-force all-pairs overlaps (touching boxes
    included), ordered by the first box; none for empty inputs or far-apart boxes."""
    rng = np.random.default_rng(1)
    for na, nb, spread in ((300, 200, 1.0), (50, 400, 0.2), (1, 2, 1.0)):
        lo_a = rng.uniform(0, spread, size=(na, 3))
        hi_a = lo_a + rng.uniform(0, 0.1, size=(na, 3))
        lo_b = rng.uniform(0, spread, size=(nb, 3))
        hi_b = lo_b + rng.uniform(0, 0.3, size=(nb, 3))
        hi_b[0] = lo_b[0]  # a degenerate (point) box
        lo_a[0], hi_a[0] = lo_b[1], lo_b[1]  # touching a corner exactly
        pairs = _box_pairs(lo_a, hi_a, lo_b, hi_b)
        ov = np.all((lo_a[:, None] <= hi_b[None]) & (lo_b[None] <= hi_a[:, None]), axis=2)
        ref = np.argwhere(ov)
        assert len(ref) > 0
        assert np.array_equal(np.unique(pairs, axis=0), ref) and len(pairs) == len(ref)
        assert np.all(np.diff(pairs[:, 0]) >= 0)
    z = np.zeros((0, 3))
    assert _box_pairs(z, z, lo_b, hi_b).shape == (0, 2) and _box_pairs(lo_a, hi_a, z, z).shape == (0, 2)
    assert _box_pairs(lo_a, hi_a, lo_b + 10.0, hi_b + 10.0).shape == (0, 2)


def _folded_sheet(gap):
    """A grid folded flat onto itself with the two layers `gap` apart (no crossing)."""
    pos, tris = film_grid(6, 0.05)
    n = len(pos)
    top = pos.copy(); top[:, 2] += gap
    x = np.vstack([pos, top])
    return x, np.vstack([tris, tris + n])


def test_built_cases_are_caught():
    x, tris = _folded_sheet(1e-3)
    assert len(edge_face_intersections(x, tris)) == 0
    # push one vertex of the upper layer through the lower one
    bad = x.copy()
    v = 36 + 14  # an interior vertex of the upper layer
    bad[v, 2] = -1e-3
    hits = edge_face_intersections(bad, tris)
    assert len(hits) > 0
    # every reported pair is confirmed by ipctk, and ipctk finds no pair we missed
    from ipcjax.topology import mesh_edges
    edges = mesh_edges(tris)
    ref = set()
    for ei, (a, b) in enumerate(edges):
        for ti, t in enumerate(tris):
            if a in t or b in t:
                continue
            if ipctk.is_edge_intersecting_triangle(bad[a], bad[b], *bad[t]):
                ref.add((ei, ti))
    assert set(map(tuple, hits.tolist())) == ref


def test_audit_trajectory_counts_frames_and_distances():
    x_ok, tris = _folded_sheet(1e-3)
    x_bad = x_ok.copy(); x_bad[50, 2] = -1e-3
    out = audit_trajectory(np.stack([x_ok, x_bad, x_ok]), tris)
    assert out["frames"] == 3 and out["frames_with_self_intersection"] == 1
    assert abs(out["min_film_film"][0] - 1e-3) < 1e-12
    # film–sphere distance against ipctk
    c = np.array([[0.0, 0.0, 0.02]])
    fa = audit_frame(np.vstack([x_ok, c]), tris, sphere_index=[len(x_ok)], sphere_radius=[0.015])
    ref = min(np.sqrt(ipctk.point_triangle_distance(c[0], *x_ok[t])) for t in tris) - 0.015
    assert abs(fa.min_film_sphere - ref) < 1e-12

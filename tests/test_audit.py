"""Self-intersection audit, cross-checked against ipctk's edge–triangle intersection test."""
import ipctk
import numpy as np

import pytest

from ipcjax.audit import (BackgroundAudit, _box_pairs, audit_frame, audit_trajectory, edge_face_intersections,
                          min_film_sphere, segment_triangle_intersect)
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
    # the same distance alone (the bag's measurements take it so), and none without a sphere
    assert min_film_sphere(np.vstack([x_ok, c]), tris, [len(x_ok)], [0.015]) == fa.min_film_sphere
    assert min_film_sphere(x_ok, tris, [], []) == np.inf


def test_background_audit_equals_the_audit_of_all_frames_and_never_drops_a_failure():
    """Frames handed to a worker process a few at a time give audit_trajectory's result for
    all of them in order (a self-intersecting frame, sphere distances, a last partial
    chunk); a worker's error reaches the caller; a chunk below one frame is refused."""
    x_ok, tris = _folded_sheet(1e-3)
    c = np.array([[0.0, 0.0, 0.02]])
    rng = np.random.default_rng(2)
    frames = [np.vstack([x_ok + rng.normal(size=x_ok.shape) * 1e-5 * k, c]) for k in range(7)]
    frames[4][50, 2] = -1e-3  # one frame pushes a vertex through the other layer
    ref = audit_trajectory(np.stack(frames), tris, [len(x_ok)], [0.015])
    assert ref["frames_with_self_intersection"] == 1
    with BackgroundAudit(tris, [len(x_ok)], [0.015], chunk=3) as bg:
        for f in frames:
            bg.add(f)
        out = bg.result()
    assert set(out) == set(ref)
    for key in ref:
        assert np.array_equal(out[key], ref[key]), key
    with BackgroundAudit(tris + 1000, chunk=2) as bg:  # triangles index past the frame
        bg.add(frames[0])
        with pytest.raises(ValueError, match="indexes vertex 1007 but there are only 73 vertices"):
            bg.result()
    with pytest.raises(ValueError, match="chunk must be ≥ 1 frame"):
        BackgroundAudit(tris, chunk=0)


def test_bag_run_frames_reach_the_audit_in_trajectory_order():
    """scenes.bag_run's frame store hands a resumed trajectory's frames, then each new one,
    to the background audit as film then spheres: its result is the audit of the
    trajectory the run writes."""
    from types import SimpleNamespace

    from scenes.bag_run import _Frames

    x_ok, tris = _folded_sheet(1e-3)
    n = len(x_ok)
    sc = SimpleNamespace(film=np.arange(n), spheres=np.array([n]), faces=tris)
    rng = np.random.default_rng(3)
    xs = [np.vstack([x_ok + rng.normal(size=x_ok.shape) * 1e-5, [[0.0, 0.0, 0.02 + 1e-3 * k]]]) for k in range(5)]
    xs[1][50, 2] = -1e-3  # a resumed frame that self-intersects
    with BackgroundAudit(tris, [n], [0.015], chunk=2) as bg:
        frames = _Frames(sc, bg)
        frames.extend([x[:n] for x in xs[:3]], [x[n:] for x in xs[:3]], [0.0, 0.1, 0.2])  # the resumed part
        for k in (3, 4):
            frames.add(xs[k], 0.1 * k)
        out = bg.result()
    traj = frames.trajectory()
    ref = audit_trajectory(np.concatenate([traj.film, traj.spheres], axis=1), tris, [n], [0.015])
    assert out["frames"] == 5 and out["frames_with_self_intersection"] == 1
    for key in ref:
        assert np.array_equal(out[key], ref[key]), key

"""Broad phase (ipcjax/candidates.py; its capacities: ipcjax/capacity.py) against the
all-pairs NumPy reference."""
from __future__ import annotations

import io
import logging

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipcjax.candidates import (
    Capacity,
    ContactKind,
    GridCapacity,
    brute_force_candidates,
    contact_topology,
    find_candidates,
    find_candidates_host,
    grow_capacity,
    resolve_capacity,
    stencils,
)

DHAT, MIN_GAP = 1.0e-3, 3.0e-5
KINDS = ("vt", "ee", "sf")


# --------------------------------------------------------------------------- scenes


def soup_scene(seed, n_vertices=40, n_triangles=40, n_spheres=3, size=8e-3, move=1e-3):
    """Random triangles over a shared vertex pool (many shared vertices), a few spheres.

    The connectivity is drawn once (seed 0) so that every soup has the same array shapes
    and shares one compilation; positions, radii and fixed flags vary with the seed.
    """
    tri_rng = np.random.default_rng(0)
    tri = np.stack([tri_rng.choice(n_vertices, 3, replace=False) for _ in range(n_triangles)])
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(0.0, size, (n_vertices + n_spheres, 3))
    x1 = x0 + rng.normal(0.0, move, x0.shape)
    radius = np.zeros(n_vertices + n_spheres)
    radius[n_vertices:] = rng.uniform(0.5e-3, 2e-3, n_spheres)
    fixed = rng.uniform(size=n_vertices + n_spheres) < 0.3
    x1[fixed] = x0[fixed]
    return x0, x1, contact_topology(tri, len(x0), radius, fixed)


def crumpled_scene(seed, n=12, spacing=2e-3, n_spheres=4):
    """A grid folded onto itself and crumpled, a pinned row, spheres, two big fixed triangles.

    The fold puts the two layers ~1 mm apart (inside dhat), so VT/EE candidates between
    layers abound; the floor and wall triangles are ~25× the film triangles.
    """
    rng = np.random.default_rng(seed)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    u, v = i.ravel() * spacing, j.ravel() * spacing
    half = (n - 1) * spacing / 2
    folded = u > half
    x = np.where(folded, 2 * half - u, u)
    z = np.where(folded, 1.2e-3, 0.0) + 0.3e-3 * np.sin(7 * u / half + seed) * np.cos(5 * v / half)
    film = np.stack([x, v, z], 1) + rng.normal(0, 0.15e-3, (n * n, 3))
    idx = (i * n + j)[:-1, :-1].ravel()
    quads = np.stack([idx, idx + n, idx + n + 1, idx + 1], 1)
    film_tri = np.concatenate([quads[:, [0, 1, 2]], quads[:, [0, 2, 3]]])

    L = n * spacing * 3
    obstacle = np.array([[-L / 3, -L / 3, -1.1e-3], [L, -L / 3, -1.1e-3], [-L / 3, L, -1.1e-3],
                         [-0.8e-3, -L / 3, -L / 3], [-0.8e-3, L, -L / 3], [-0.8e-3, -L / 3, L]])
    centres = np.column_stack([rng.uniform(0, half, n_spheres), rng.uniform(0, 2 * half, n_spheres),
                               rng.uniform(3e-3, 6e-3, n_spheres)])
    x0 = np.concatenate([film, obstacle, centres])
    nf, no = n * n, len(obstacle)
    tri = np.concatenate([film_tri, nf + np.array([[0, 1, 2], [3, 4, 5]])])
    radius = np.zeros(len(x0))
    radius[nf + no:] = rng.uniform(2e-3, 4e-3, n_spheres)
    fixed = np.zeros(len(x0), bool)
    fixed[nf:nf + no] = True
    fixed[:n] = True  # a pinned row of the film, next to the fixed wall
    x1 = x0 + np.where(fixed[:, None], 0.0, rng.normal(0, 0.4e-3, x0.shape) + [0, 0, -0.3e-3])
    return x0, x1, contact_topology(tri, len(x0), radius, fixed)


# Capacities ample for every test scene: all queries share one compilation per scene shape.
BIG = Capacity(4_000, 8_000, 1_000, GridCapacity(20_000, 20_000, 60_000), GridCapacity(20_000, 20_000, 150_000))


def rows(cands, kind):
    return np.asarray(getattr(cands, kind))[: int(getattr(cands, "n_" + kind))]


def assert_matches_brute_force(cands, x0, x1, topo):
    ref = brute_force_candidates(x0, x1, topo, DHAT, MIN_GAP)
    assert not bool(cands.overflow)
    for k in KINDS:
        got = np.asarray(getattr(cands, k))
        n = int(getattr(cands, "n_" + k))
        assert n == int(getattr(ref, "n_" + k)), k
        np.testing.assert_array_equal(got[:n], getattr(ref, k), err_msg=k)
        assert np.all(got[n:] == -1), k
    np.testing.assert_array_equal(np.asarray(cands.ss), ref.ss)
    return ref


# --------------------------------------------------------------------------- equality


@pytest.mark.parametrize("seed", range(4))
def test_soup_equals_brute_force(seed):
    x0, x1, topo = soup_scene(seed)
    ref = assert_matches_brute_force(find_candidates(x0, x1, topo, DHAT, MIN_GAP, capacity=BIG), x0, x1, topo)
    assert ref.n_vt > 0 and ref.n_ee > 0 and ref.n_sf > 0


@pytest.mark.parametrize("seed", range(3))
def test_crumpled_grid_equals_brute_force(seed):
    x0, x1, topo = crumpled_scene(seed)
    cands, _ = find_candidates_host(x0, x1, topo, DHAT, MIN_GAP, capacity=BIG)
    ref = assert_matches_brute_force(cands, x0, x1, topo)
    assert ref.n_vt > 100 and ref.n_ee > 100 and ref.n_sf > 0
    # the big obstacle triangles (last two) take part
    assert np.any(ref.vt[:, 1] >= len(topo.triangles) - 2)


def test_float32_positions_equal_brute_force():
    x0, x1, topo = crumpled_scene(7)
    x0, x1 = x0.astype(np.float32), x1.astype(np.float32)
    cands, _ = find_candidates_host(x0, x1, topo, DHAT, MIN_GAP, capacity=BIG)
    assert_matches_brute_force(cands, x0, x1, topo)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dhat=st.floats(1e-5, 3e-3),
       move=st.floats(0.0, 3e-3), offset=st.floats(-20.0, 20.0))
def test_soup_property(seed, dhat, move, offset):
    """Any scale of dhat and motion, far from the origin (larger FP32 padding): exact."""
    x0, x1, topo = soup_scene(seed, move=move)
    x0, x1 = x0 + offset, x1 + offset
    c = find_candidates(x0, x1, topo, dhat, MIN_GAP, capacity=BIG)
    ref = brute_force_candidates(x0, x1, topo, dhat, MIN_GAP)
    assert not bool(c.overflow)
    for k in KINDS:
        np.testing.assert_array_equal(rows(c, k), getattr(ref, k), err_msg=k)


# --------------------------------------------------------------------------- overflow


def test_overflow_reports_true_counts_and_host_reallocates():
    x0, x1, topo = crumpled_scene(1)
    ref = brute_force_candidates(x0, x1, topo, DHAT, MIN_GAP)
    ample = find_candidates(x0, x1, topo, DHAT, MIN_GAP, capacity=BIG)
    # tiny output buffers, ample intermediate buffers: true counts, flag set, rows kept
    c = find_candidates(x0, x1, topo, DHAT, MIN_GAP, capacity=BIG._replace(vt=5, ee=5, sf=1))
    assert bool(c.overflow)
    assert (int(c.n_vt), int(c.n_ee), int(c.n_sf)) == (ref.n_vt, ref.n_ee, ref.n_sf)
    assert c.vt.shape == (5, 2) and np.all(np.asarray(c.vt) >= 0)
    # every buffer tiny, intermediate ones included: flagged; insert and lookup needs are
    # exact even so (the tests need is then a lower bound)
    t = GridCapacity(1, 1, 1)
    tiny = Capacity(1, 1, 1, t, t)
    c = find_candidates(x0, x1, topo, DHAT, MIN_GAP, capacity=tiny)
    assert bool(c.overflow)
    np.testing.assert_array_equal(np.asarray(c.work)[:, :2], np.asarray(ample.work)[:, :2])
    # the host helper grows all of them and then equals the brute force
    cands, cap = find_candidates_host(x0, x1, topo, DHAT, MIN_GAP, capacity=tiny)
    assert_matches_brute_force(cands, x0, x1, topo)
    assert cap.vt >= ref.n_vt and cap.ee >= ref.n_ee and cap.sf >= ref.n_sf
    assert np.all(np.asarray(cands.work) <= np.asarray([cap.face_grid, cap.edge_grid]))


def test_short_tests_buffer_is_flagged():
    """Complete grid tables but too few test slots: flagged, never silently short."""
    x0, x1, topo = crumpled_scene(2)
    ample = np.asarray(find_candidates(x0, x1, topo, DHAT, MIN_GAP, capacity=BIG).work)
    short = BIG._replace(face_grid=BIG.face_grid._replace(tests=50),
                         edge_grid=BIG.edge_grid._replace(tests=50))
    c = find_candidates(x0, x1, topo, DHAT, MIN_GAP, capacity=short)
    assert bool(c.overflow)
    np.testing.assert_array_equal(np.asarray(c.work), ample)


def test_exploded_positions_raise():
    x0, x1, topo = crumpled_scene(0)
    x1 = x1.copy()
    x1[0] = [1e3, 1e3, 1e3]  # one film vertex flies 1 km: walls would cover ~10^12 cells
    with pytest.raises(ValueError, match="grid cells"):
        find_candidates_host(x0, x1, topo, DHAT, MIN_GAP, capacity=BIG)
    x1[0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        find_candidates_host(x0, x1, topo, DHAT, MIN_GAP, capacity=BIG)


# --------------------------------------------------------------------------- exclusions


def test_exclusions():
    x0, x1, topo = soup_scene(11)
    cands, _ = find_candidates_host(x0, x1, topo, DHAT, MIN_GAP, capacity=BIG)
    tri, edges, fixed = topo.triangles, topo.edges, topo.fixed
    vt, ee, sf = rows(cands, "vt"), rows(cands, "ee"), rows(cands, "sf")
    assert len(vt) and len(ee) and len(sf)
    assert not np.any(tri[vt[:, 1]] == vt[:, :1])
    a, b = edges[ee[:, 0]], edges[ee[:, 1]]
    assert not np.any(a[:, :, None] == b[:, None, :])
    assert np.all(ee[:, 0] < ee[:, 1])
    assert len(np.unique(ee, axis=0)) == len(ee)
    assert not np.any(fixed[vt[:, 0]] & fixed[tri[vt[:, 1]]].all(1))
    assert not np.any(fixed[a].all(1) & fixed[b].all(1))
    assert not np.any(fixed[sf[:, 0]] & fixed[tri[sf[:, 1]]].all(1))
    assert set(sf[:, 0]) <= set(topo.spheres)


def test_all_fixed_pairs_skipped_but_free_ones_kept():
    # two coincident triangles: everything fixed -> nothing; free one vertex -> pairs appear
    x = np.array([[0, 0, 0], [1e-3, 0, 0], [0, 1e-3, 0]] * 2 + [[0, 0, 1], [0, 0, 2]], float)
    tri = [[0, 1, 2], [3, 4, 5]]
    radius = [0] * 6 + [1e-3, 1e-3]  # two far spheres (same shapes as the next test's scene)
    fixed = np.ones(8, bool)
    c, _ = find_candidates_host(x, x, contact_topology(tri, 8, radius, fixed), DHAT, MIN_GAP)
    assert (int(c.n_vt), int(c.n_ee)) == (0, 0)
    fixed[3] = False
    topo = contact_topology(tri, 8, radius, fixed)
    c, _ = find_candidates_host(x, x, topo, DHAT, MIN_GAP)
    assert int(c.n_vt) == 4 and int(c.n_ee) == 6  # pairs touching vertex 3
    assert_matches_brute_force(c, x, x, topo)


def test_sphere_pairs_and_stencils():
    x0, x1, topo = crumpled_scene(3, n_spheres=4)
    fixed = topo.fixed.copy()
    fixed[topo.spheres[:2]] = True  # two fixed spheres: their pair is skipped
    topo = topo._replace(fixed=fixed)
    cands, _ = find_candidates_host(x0, x1, topo, DHAT, MIN_GAP, capacity=BIG)
    s = topo.spheres
    assert cands.ss.shape == (6, 2)
    ss = np.asarray(cands.ss)
    assert ss[-1].tolist() == [-1, -1]
    assert sorted(map(tuple, ss[:-1].tolist())) == sorted(
        (int(s[a]), int(s[b])) for a in range(4) for b in range(a + 1, 4) if (a, b) != (0, 1))

    idx, kind, valid = jax.jit(stencils)(cands, topo)
    idx, kind, valid = np.asarray(idx), np.asarray(kind), np.asarray(valid)
    caps = [len(cands.vt), len(cands.ee), len(cands.sf), len(cands.ss)]
    assert idx.shape == (sum(caps), 4) and idx.dtype == np.int32 and kind.dtype == np.int8
    np.testing.assert_array_equal(kind, np.repeat(list(map(int, ContactKind)), caps))
    assert np.all(idx[~valid] == 0)
    assert valid.sum() == int(cands.n_vt) + int(cands.n_ee) + int(cands.n_sf) + 5
    vt, ee, sf = rows(cands, "vt"), rows(cands, "ee"), rows(cands, "sf")
    o = np.cumsum([0] + caps)
    np.testing.assert_array_equal(idx[o[0]:o[0] + len(vt)], np.column_stack([vt[:, 0], topo.triangles[vt[:, 1]]]))
    np.testing.assert_array_equal(idx[o[1]:o[1] + len(ee)], np.column_stack([topo.edges[ee[:, 0]], topo.edges[ee[:, 1]]]))
    np.testing.assert_array_equal(idx[o[2]:o[2] + len(sf)], np.column_stack([sf[:, 0], topo.triangles[sf[:, 1]]]))
    np.testing.assert_array_equal(idx[o[3]:o[3] + 5], np.column_stack([ss[:5, 0], ss[:5, 1], ss[:5, 1], ss[:5, 1]]))


def test_contact_topology_rejects_sphere_on_surface():
    with pytest.raises(ValueError, match="radius"):
        contact_topology([[0, 1, 2]], 3, [0.0, 1e-3, 0.0], np.zeros(3, bool))


# --------------------------------------------------------------------------- FP32 bounds


@pytest.mark.parametrize("offset", [0.0, 0.37, -12.5])
def test_pair_at_exactly_the_query_width_is_found(offset):
    """VT, EE and SF pairs at distance (R +) dhat + min_gap, ±1 ulp, are candidates.

    Triangle A lies in the plane z = offset. Triangle B has vertex p at height w above A
    (VT) and an edge at height w crossing over A's edge along x (EE); a sphere centre sits
    R + w above A (SF). Lifted by 0.1 mm (≫ the FP32 padding) nothing is found.
    """
    w, R = DHAT + MIN_GAP, 2e-3
    topo = contact_topology([[0, 1, 2], [3, 4, 5]], 8, [0] * 6 + [R, R], np.zeros(8, bool))

    def scene(h, hs):
        x = np.array([[0, 0, 0], [20e-3, 0, 0], [0, 20e-3, 0],          # A
                      [3e-3, 3e-3, 0], [3e-3, 3e-3, 20e-3], [3e-3, -5e-3, 0],  # B: p, q, r
                      [12e-3, 3e-3, 0], [0, 0, 1.0]]) + offset          # sphere, far sphere
        x[3:6, 2] += h - offset
        x[6, 2] = hs
        return x

    for direction in (-np.inf, None, np.inf):
        h, hs = offset + w, offset + w + R
        if direction is not None:
            h, hs = np.nextafter(h, direction), np.nextafter(hs, direction)
        x = scene(h, hs)
        c, _ = find_candidates_host(x, x, topo, DHAT, MIN_GAP)
        assert rows(c, "vt").tolist() == [[3, 0]], direction
        assert [0, 4] in rows(c, "ee").tolist(), direction  # A's x-axis edge under p–r
        assert rows(c, "sf").tolist() == [[6, 0]], direction
        assert_matches_brute_force(c, x, x, topo)
    x = scene(offset + w + 1e-4, offset + w + R + 1e-4)
    c, _ = find_candidates_host(x, x, topo, DHAT, MIN_GAP)
    assert (int(c.n_vt), int(c.n_ee), int(c.n_sf)) == (0, 0, 0)


# --------------------------------------------------------------------------- jit


def test_second_call_does_not_recompile_and_is_deterministic():
    x0, x1, topo = crumpled_scene(4)
    first, cap = find_candidates_host(x0, x1, topo, DHAT, MIN_GAP, capacity=BIG)
    assert cap == BIG
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            # new positions, new dhat: same shapes and capacity, so no new compilation
            second = find_candidates(x0, x1, topo, DHAT, MIN_GAP, capacity=BIG)
            third = find_candidates(x0 + 1e-4, x1 - 1e-4, topo, 0.9 * DHAT, MIN_GAP, capacity=BIG)
    finally:
        logger.removeHandler(handler)
    assert "Compiling" not in stream.getvalue(), stream.getvalue()
    assert not bool(third.overflow)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_scenes_without_spheres_or_without_triangles():
    x0, x1, topo = soup_scene(5, n_spheres=0)
    cands, _ = find_candidates_host(x0, x1, topo, DHAT, MIN_GAP, capacity=BIG)
    assert cands.ss.shape == (0, 2) and int(cands.n_sf) == 0
    assert_matches_brute_force(cands, x0, x1, topo)
    # spheres only: no grid search at all, every sphere pair
    x = np.random.default_rng(0).uniform(size=(4, 3))
    topo = contact_topology(np.zeros((0, 3), int), 4, [1e-3] * 4, np.zeros(4, bool))
    cands, _ = find_candidates_host(x, x, topo, DHAT, MIN_GAP)
    assert (int(cands.n_vt), int(cands.n_ee), int(cands.n_sf)) == (0, 0, 0)
    assert cands.ss.shape == (6, 2)
    assert_matches_brute_force(cands, x, x, topo)


def test_grow_capacity():
    g = GridCapacity(10, 10, 10)
    cap = Capacity(10, 10, 10, g, g)
    work = np.array([[5, 20, 10], [10, 10, 100]])
    new = grow_capacity(cap, 4, 11, 10, work)
    assert new == Capacity(10, 11 * 3 // 2 + 64, 10, GridCapacity(10, 94, 10), GridCapacity(10, 10, 214))
    # active contact rows grow like the buffers; None (no compaction) stays None
    with_active = cap._replace(active=20)
    assert grow_capacity(with_active, 0, 0, 0, np.zeros((2, 3)), n_active=20).active == 20
    assert grow_capacity(with_active, 0, 0, 0, np.zeros((2, 3)), n_active=30).active == 30 * 3 // 2 + 64
    assert grow_capacity(cap, 0, 0, 0, np.zeros((2, 3)), n_active=30).active is None
    with pytest.raises(ValueError, match="grid cells"):
        grow_capacity(cap, 0, 0, 0, np.array([[2**30, 0, 0], [0, 0, 0]]))


def test_sphere_face_rows_start_at_a_sphere_wrapped_in_film():
    """``initial_capacity(topo, x)``: sphere–face rows start at the rows of every sphere
    wrapped in film (4πr² over the film's mean triangle area, +64), so a film draped over
    a sphere's top, 0.4 mm off it, finds its candidates in the first buffer; the size from
    the topology alone (256 here) is short of them and would grow (a compilation)."""
    from ipcjax.capacity import initial_capacity, wrapped_sphere_rows
    from ipcjax.model import Config
    from ipcjax.newton import query_contacts
    from scenes.film import drape_scene

    n, R, gap = 31, 0.02, 0.4e-3
    sc = drape_scene(n=n, size=0.12, sphere_radius=R, gap=gap)
    topo, film = sc.model.topology, np.arange(n * n)
    x = np.asarray(sc.x).copy()
    r = np.hypot(x[film, 0], x[film, 1])
    # over the top: onto the sphere at the gap; outside its footprint: down and away from it
    on_top = r <= R + gap
    x[film, 2] = np.where(on_top, np.sqrt(np.maximum((R + gap) ** 2 - r ** 2, 0.0)), R - r)
    area = 0.12 ** 2 / (2 * (n - 1) ** 2)  # the flat grid's triangles
    assert wrapped_sphere_rows(topo, sc.x) == int(np.ceil(4 * np.pi * R ** 2 / area))
    start, from_sizes = initial_capacity(topo, sc.x), initial_capacity(topo)
    roomy = resolve_capacity(start._replace(vt=40_000, ee=80_000, sf=len(topo.triangles)), topo)
    _, stats = jax.jit(lambda a: query_contacts(a, a, sc.model, Config(), roomy, skin=Config().skin))(x)
    need = int(stats.n_sf)
    assert not bool(stats.overflow) and on_top.sum() > 50
    assert from_sizes.sf < need <= start.sf < len(topo.triangles)


@pytest.mark.parametrize("n", [1, 2, 7, 2537])
def test_grid_cell_median_is_jnp_median_bit_for_bit(n):
    """The grid's cell edge comes from the median box extent, sorted as int64 bit patterns
    (ipcjax.candidates._median): the same float as jnp.median, and NaN where any is NaN."""
    import jax.numpy as jnp

    from ipcjax.candidates import _median

    rng = np.random.default_rng(n)
    ext = jnp.asarray(np.concatenate([rng.exponential(3e-3, n - 1), [0.0]]) if n > 1 else [0.0])
    assert float(jax.jit(_median)(ext)) == float(jnp.median(ext))
    assert np.isnan(float(jax.jit(_median)(ext.at[0].set(jnp.nan))))

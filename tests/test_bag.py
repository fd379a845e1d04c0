"""The bag experiment (docs/spec.md §5): mesh, scene, the specification's 2-step check, choreography, measurements."""
import jax
import numpy as np
import pytest

from ipcjax.audit import audit_trajectory
from ipcjax.step import make_state, simulate
from scenes import bag as B


def _column_lengths(mesh):
    """(C,) sum of the reference edges along each column from the neck ring to the rim."""
    C = mesh.columns
    total = np.zeros(C)
    for r in range(mesh.neck_ring, mesh.rings):
        a = mesh.x[B.ring_index(r, np.arange(C), C)]
        b = mesh.x[B.ring_index(r + 1, np.arange(C), C)]
        total += np.linalg.norm(b - a, axis=1)
    return total


def _areas_and_normals(mesh):
    p = mesh.x[mesh.triangles]
    n = np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])
    return 0.5 * np.linalg.norm(n, axis=1), n


def test_full_mesh_counts_rim_neck_and_column_sum():
    mesh = B.bag_mesh()
    assert mesh.x.shape == (481, 3) and mesh.triangles.shape == (928, 3)
    assert mesh.triangles.min() == 0 and mesh.triangles.max() == 480
    assert np.array_equal(mesh.rim, np.arange(449, 481))
    assert np.array_equal(mesh.neck, np.arange(321, 353))
    assert mesh.neck_ring == 11 and mesh.rings - mesh.neck_ring == 4  # four edges across five rings
    np.testing.assert_allclose(_column_lengths(mesh), 0.030, rtol=0, atol=1e-12)
    area, n = _areas_and_normals(mesh)
    # non-degenerate, and every triangle counter-clockwise seen from +z
    assert area.min() > 1e-6 and np.all(n[:, 2] > 0)
    assert len({tuple(sorted(t)) for t in mesh.triangles.tolist()}) == 928


def test_coarse_mesh_counts():
    mesh = B.bag_mesh(rings=7, columns=12)
    assert mesh.x.shape == (85, 3) and mesh.triangles.shape == (12 + 2 * 12 * 6, 3)
    assert mesh.neck_ring == 5  # round(11·7/15)
    assert np.array_equal(mesh.rim, np.arange(73, 85))
    assert np.array_equal(mesh.neck, np.arange(49, 61))
    np.testing.assert_allclose(_column_lengths(mesh), 0.030, atol=1e-12)
    area, n = _areas_and_normals(mesh)
    assert area.min() > 1e-5 and np.all(n[:, 2] > 0)


def test_pouch_mesh_lies_on_its_sphere_with_the_spec_counts_and_column_sum():
    for rings, columns in ((15, 32), (7, 12)):
        mesh = B.pouch_mesh(rings, columns)
        flat = B.bag_mesh(rings, columns)
        assert np.array_equal(mesh.triangles, flat.triangles)  # the same disk topology
        assert np.array_equal(mesh.rim, flat.rim) and np.array_equal(mesh.neck, flat.neck)
        np.testing.assert_allclose(_column_lengths(mesh), 0.030, rtol=0, atol=1e-12)
        a = B.POUCH_RADIUS
        centre = np.array([0.0, 0.0, a])  # vertex 0, the bottom pole, is at the origin
        np.testing.assert_allclose(np.linalg.norm(mesh.x - centre, axis=1), a, atol=1e-12)
        polar = np.arccos(np.clip((a - mesh.x[:, 2]) / a, -1, 1))
        assert polar[mesh.rim] == pytest.approx(B.POUCH_RIM_POLAR, abs=1e-12)
        np.testing.assert_allclose(mesh.ring_radius[mesh.neck_ring], np.linalg.norm(mesh.x[mesh.neck, :2], axis=1))
        area, _ = _areas_and_normals(mesh)
        assert area.min() > 1e-6
    mesh = B.pouch_mesh()
    # the mouth takes a 52 mm sphere; the neck ring is shorter than the flat disk's
    assert 2 * mesh.ring_radius[-1] > 2 * 0.026 + 0.008
    assert mesh.x[mesh.rim[0], 2] > mesh.x[mesh.neck[0], 2]  # the rim rises over the neck
    with pytest.raises(ValueError, match="polar angle"):
        B.pouch_mesh(rim_polar=0.1)


def test_bad_mesh_arguments_are_rejected():
    with pytest.raises(ValueError, match="rings ≥ 2"):
        B.bag_mesh(rings=1)
    with pytest.raises(ValueError, match="neck_to_rim"):
        B.bag_mesh(radius=0.02, neck_to_rim=0.03)
    with pytest.raises(ValueError, match="resolution"):
        B.bag_scene("medium")


def test_scene_materials_bodies_and_index_sets():
    sc = B.bag_scene("coarse")
    m = sc.model
    mass, fixed, radius = np.asarray(m.mass), np.asarray(m.fixed), np.asarray(m.radius)
    film, sph = sc.film, sc.spheres
    # film: areal density 0.02775 kg/m² lumped onto the vertices, free, no radius
    ref_area = _areas_and_normals(sc.mesh)[0].sum()
    assert mass[film].sum() == pytest.approx(0.02775 * ref_area, rel=1e-12)
    assert not fixed[film].any() and np.all(radius[film] == 0)
    # seven spheres: radii and masses 250 kg/m³ · 4πR³/3
    np.testing.assert_allclose(radius[sph], [0.026, 0.026, 0.026, 0.012, 0.012, 0.012, 0.025])
    np.testing.assert_allclose(mass[sph], 250 * 4 / 3 * np.pi * radius[sph] ** 3, rtol=1e-12)
    # bin and floor: fixed zero-mass triangle vertices; the bin is 106 mm tall
    for key in ("bin", "floor"):
        idx = getattr(sc, key)
        assert len(idx) and fixed[idx].all() and np.all(mass[idx] == 0) and np.all(radius[idx] == 0)
    assert np.ptp(sc.x[sc.bin, 2]) == pytest.approx(0.106)
    assert np.all(sc.x[sc.floor, 2] == 0)
    # material and solver settings of the specification (docs/spec.md §3, §4)
    p, cfg = sc.params, sc.config
    assert cfg.membrane == "neo_hookean" and cfg.bending == "hinge"
    assert (cfg.dhat, cfg.min_gap, cfg.max_newton) == (1.0e-3, 0.030e-3, 150)
    assert float(p.youngs_modulus) == 315e6 and float(p.poisson) == 0.45 and float(p.thickness) == 30e-6
    assert float(p.friction) == 0.35 and float(p.barrier_stiffness) == 1000.0 and float(p.drag) == 12.0
    assert sc.dt == pytest.approx(1 / 240)


def test_spec_two_step_bag_check_full_resolution():
    """docs/spec.md §6 bag integration: 2 steps of the 481-vertex scene, Neo-Hookean, seven spheres,
    bin and floor; output shapes (3, 481, 3), (3, 7, 3), (928, 3); audit finds no intersection."""
    sc = B.bag_scene("full")
    m, ch = sc.model, sc.choreography
    assert sc.config.membrane == "neo_hookean"
    assert len(sc.spheres) == 7 and len(sc.bin) > 0 and len(sc.floor) > 0
    ch.observe(0.0, sc.x)  # the place hands grab the rim where it starts
    frames, times, reps = simulate(m, sc.params, make_state(sc.x), ch.controls_at, 2, dt=sc.dt, config=sc.config)
    film, spheres, faces = frames[:, sc.film], frames[:, sc.spheres], sc.faces
    assert film.shape == (3, 481, 3) and spheres.shape == (3, 7, 3) and faces.shape == (928, 3)
    np.testing.assert_allclose(times, [0, 1 / 240, 2 / 240])
    assert all(r.ok for r in reps) and min(r.min_gap for r in reps) > 0
    audit = audit_trajectory(np.concatenate([film, spheres], axis=1), faces, np.arange(481, 488), sc.sphere_radius)
    assert audit["frames_with_self_intersection"] == 0
    # spheres wait (gravity cancelled), the film falls and is pulled by the rim supports
    np.testing.assert_allclose(spheres[-1], spheres[0], atol=1e-7)
    assert film[-1, 0, 2] < film[0, 0, 2]


# --------------------------------------------------------------------------- choreography

def _all_captured(sc):
    ch = sc.choreography
    ch.observe(sc.t_end, sc.x)  # stand-in grab positions for every track
    return ch


def test_controls_have_fixed_shapes_and_do_not_recompile():
    sc = B.bag_scene("coarse")
    ch = _all_captured(sc)
    dt = sc.dt
    total = jax.jit(lambda c: c.support_k.sum() + c.tie_k.sum() + c.force.sum() + c.support_target.sum())
    shapes = None
    for i in range(0, int(round(sc.t_end / dt)) + 1, 7):
        c = ch.controls_at(i, i * dt)
        s = jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), c)
        shapes = s if shapes is None else shapes
        assert s == shapes
        total(c)
    assert total._cache_size() == 1


# (protocol, release s, fade start s, tie on s, tie full s, end s, steps): docs/spec.md §5
SCHEDULES = [("full", 9.40, 9.00, 8.40, 8.75, 10.50, 2520), ("short", 7.35, 7.10, 6.95, 7.10, 8.45, 2028)]


@pytest.mark.parametrize("protocol, release, fade_from, tie_on, tie_full, t_end, n_steps", SCHEDULES)
def test_supports_ties_gravity_and_tolerance_schedule(protocol, release, fade_from, tie_on, tie_full, t_end,
                                                      n_steps):
    sc = B.bag_scene("coarse", protocol=protocol)
    ch = _all_captured(sc)
    dt = sc.dt
    assert sc.t_end == t_end and int(round(sc.t_end / dt)) == n_steps and ch.phases[-1] == ("released", release, t_end)
    assert all(a[2] == b[1] for a, b in zip(ch.phases, ch.phases[1:]))  # phases tile the protocol
    at = lambda t: ch.controls_at(int(round(t / dt)), t)
    steps = np.arange(int(round(sc.t_end / dt)))
    k_support = np.array([float(np.max(at(i * dt).support_k)) for i in steps])
    t = steps * dt
    assert np.all(k_support[t >= release - 1e-9] == 0)     # all external support released
    assert np.all(k_support[t < fade_from - 1e-9] > 0)     # some hand holds the film until the fade
    fade = (t >= fade_from - dt - 1e-9) & (t < release - 1e-9)
    assert np.all(np.diff(k_support[fade]) < 0) and k_support[fade][-1] == 0  # k falls to 0 smoothly
    assert np.max(np.diff(k_support[fade])) > -0.05 * B.CINCH_K               # no step lets go at once
    tie_k = np.array([float(np.max(at(i * dt).tie_k)) for i in steps])
    assert np.all(tie_k[t < tie_on - 1e-9] == 0) and np.all(tie_k[t >= tie_on - 1e-9] == 250.0)
    # tie lengths: captured when the tie starts, at target (never lengthened) when it is full
    cap = ch.captures["tie"]
    goal = np.minimum(cap, ch.tie.target)
    np.testing.assert_allclose(np.asarray(at(tie_full).tie_length), goal, atol=1e-12)
    np.testing.assert_allclose(np.asarray(at(t_end - 0.5).tie_length), goal, atol=1e-12)
    # the first tied step starts from the captured lengths: a smoothstep of dt / span of the way
    s1 = float(B.smoothstep(dt / (tie_full - tie_on)))
    np.testing.assert_allclose(np.asarray(at(tie_on).tie_length), cap + s1 * (goal - cap), atol=1e-12)
    assert s1 < 3e-3
    # gravity cancelled on each sphere until its drop, never on the film
    g = ch.gravity
    for j, s in enumerate(ch.sphere_index):
        before = np.asarray(at(ch.drop_times[j] - dt).force)[s]
        after = np.asarray(at(ch.drop_times[j] + dt).force)[s]
        np.testing.assert_allclose(before, -ch.sphere_mass[j] * g)
        assert np.all(after == 0)
    assert 0.89 == pytest.approx(ch.drop_times[0]) and 1.60 == pytest.approx(ch.drop_times[-1])
    assert np.all(np.asarray(at(0.0).force)[sc.film] == 0)
    assert float(at(release - 0.01).tolerance) == 0.012e-3 and float(at(release).tolerance) == 0.0005e-3


def test_both_protocols_are_the_same_until_the_unfold_check():
    full, short = (B.bag_scene("coarse", protocol=p) for p in ("full", "short"))
    x = full.x.copy()
    for sc in (full, short):
        sc.choreography.observe(B.SHARED_UNTIL - full.dt, x)  # every track that starts before 6.05 s
    for i in range(0, int(round(B.SHARED_UNTIL / full.dt)), 5):
        a, b = (sc.choreography.controls_at(i, i * full.dt) for sc in (full, short))
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    with pytest.raises(ValueError, match="protocol must be one of"):
        B.bag_scene("coarse", protocol="medium")


def test_grabbing_tracks_start_where_the_film_is_and_need_a_capture():
    sc = B.bag_scene("coarse")
    ch = sc.choreography
    with pytest.raises(RuntimeError, match="'neck'.*observe"):
        ch.controls_at(0, 4.80)
    x = sc.x.copy()
    x[sc.rim] += np.array([0.3, 0.0, -0.1])  # wherever the rim happens to be at 4.70 s
    ch.observe(4.70, x)
    c = ch.controls_at(int(round(4.70 / sc.dt)), 4.70)
    sl = ch.slots("unfold")
    np.testing.assert_allclose(np.asarray(c.support_target)[sl], x[sc.rim], atol=1e-4)
    assert np.all(np.asarray(c.support_k)[sl] > 0)
    assert np.all(np.asarray(c.support_k)[ch.slots("lift")] == 0)  # the carrying hands let go


def test_unfold_check_names_the_failing_columns():
    mesh = B.bag_mesh(rings=7, columns=12)
    x = mesh.x.copy()
    r = np.linalg.norm(x[:, :2], axis=1)
    x[:, 2] = np.maximum(r - mesh.ring_radius[mesh.neck_ring], 0) + 0.01 * r  # rises outward everywhere
    assert B.check_unfolded(x, mesh)
    x[mesh.rim[[3, 7]], 2] = 0.0  # two columns folded back down
    with pytest.raises(B.UnfoldIncomplete, match=r"2 of 12 columns.*\[3, 7\]") as e:
        B.check_unfolded(x, mesh)
    assert e.value.columns == [3, 7]


# --------------------------------------------------------------------------- measurements

def test_neck_width_and_flap_height_on_built_positions():
    mesh = B.bag_mesh()
    x = np.zeros((481, 3))
    ang = 2 * np.pi * np.arange(32) / 32
    x[mesh.neck] = np.stack([0.3 + 0.019 * np.cos(ang), -0.1 + 0.021 * np.sin(ang), 0.10 + 0.002 * np.cos(ang)], 1)
    rim_z = np.linspace(0.11, 0.13, 32)  # median 0.12
    x[mesh.rim, 2] = rim_z[::-1]
    wx, wy = B.neck_width(x, mesh.neck)
    assert wx == pytest.approx(0.038) and wy == pytest.approx(0.042)
    assert B.flap_height(x, mesh.rim, mesh.neck) == pytest.approx(0.02)


def test_sphere_measurements_on_known_motions():
    dt = 1 / 240
    times = np.arange(0, 2521) * dt  # 10.5 s
    spheres = np.zeros((len(times), 7, 3))
    spheres[:, :, 2] = 0.05
    spheres[:, 0, 2] += 0.002 * np.sin(2 * np.pi * 3 * times)  # ±2 mm at 3 Hz
    spheres[:, 1, 0] = 0.01 * times                              # drifts at 10 mm/s
    hr = B.sphere_height_range(spheres, times, 1.0)
    assert hr[0] == pytest.approx(0.004, rel=1e-3) and np.all(hr[1:] == 0)
    mot = B.sphere_motion(spheres, times, 1.10)
    assert mot["max_speed"][1] == pytest.approx(0.01) and mot["final_speed"][1] == pytest.approx(0.01)
    assert mot["max_displacement"][1] == pytest.approx(0.011, rel=1e-9)
    assert mot["max_speed"][0] == pytest.approx(2 * np.pi * 3 * 0.002, rel=2e-3)
    assert np.all(mot["max_speed"][2:] == 0) and np.all(mot["max_displacement"][2:] == 0)


def test_min_film_sphere_gap_on_built_positions():
    mesh = B.bag_mesh(rings=7, columns=12)
    film = np.stack([mesh.x, mesh.x])  # two frames of the flat disk at z = 0
    spheres = np.zeros((2, 7, 3))
    spheres[:, :, 0] = np.linspace(-0.15, 0.15, 7)
    radii = np.asarray(B.SPHERE_RADII)
    spheres[0, :, 2] = radii + 0.004     # 4 mm above the film
    spheres[1, :, 2] = radii + 0.0025    # 2.5 mm in the last frame
    spheres[1, 6, 2] = radii[6] + 0.001  # the 25 mm sphere 1 mm above
    gap = B.min_film_sphere_gap(film, spheres, mesh.triangles, radii)
    assert gap == pytest.approx(0.001, abs=1e-12)
    assert B.min_film_sphere_gap(film[:1], spheres[:1], mesh.triangles, radii) == pytest.approx(0.004, abs=1e-12)


def test_relative_keyframes_follow_where_the_film_is_when_the_track_starts():
    sc = B.bag_scene("coarse")
    ch, mesh = sc.choreography, sc.mesh
    C = mesh.columns
    ang = 2 * np.pi * np.arange(C) / C
    x = sc.x.copy()
    shift = np.array([0.37, -0.02, -0.01])
    x[sc.film] += shift                                  # the bag stands somewhere else
    x[sc.spheres] = shift + np.array([0.004, 0.0, 0.05])  # contents a little off its axis
    centre = x[sc.spheres, :2].mean(axis=0)
    neck_z = x[mesh.neck, 2].mean()
    ch.observe(4.70, x)
    keys = ch.keyframes("unfold")
    np.testing.assert_allclose(keys[0][1], x[sc.rim])  # grabs the rim where it lies
    # unfold: neck ring and rim onto their rest circles round the contents, the neck at its
    # own height, the rim its rest height over it
    neck_goal, rim_goal = ch.keyframes("neck")[-1][1], keys[-1][1]
    circle = lambda r: centre + r * np.stack([np.cos(ang), np.sin(ang)], 1)
    np.testing.assert_allclose(neck_goal[:, :2], circle(mesh.ring_radius[mesh.neck_ring]), atol=1e-12)
    np.testing.assert_allclose(rim_goal[:, :2], circle(mesh.ring_radius[mesh.rings]), atol=1e-12)
    np.testing.assert_allclose(neck_goal[:, 2], neck_z, atol=1e-12)
    rest_rise = mesh.x[mesh.rim[0], 2] - mesh.x[mesh.neck[0], 2]
    np.testing.assert_allclose(rim_goal[:, 2] - neck_goal[:, 2], rest_rise, atol=1e-12)
    # gather / cinch stars are centred over the contents as they lie when the track starts,
    # the cinched neck band at a set height over the contents' top
    x2 = x.copy()
    x2[sc.spheres] += np.array([0.01, 0.02, 0.0])
    x2[mesh.neck, 2] += 0.004
    centre2 = x2[sc.spheres, :2].mean(axis=0)
    ch.observe(7.40, x2)
    cinch = ch.keyframes("cinch")[-1][1]
    r = np.linalg.norm(cinch[:, :2] - centre2, axis=1)
    np.testing.assert_allclose(r[:C][::2], B.CINCH_OUTER, atol=1e-12)  # outer folds
    assert np.all(r[:C][1::2] < B.CINCH_OUTER) and np.all(r[:C][1::2] >= B.STAR_MIN_INNER)
    top = np.max(x2[sc.spheres, 2] + sc.sphere_radius)  # the contents' top at 7.40 s
    np.testing.assert_allclose(cinch[:C, 2], top + B.CINCH_OVER_TOP, atol=1e-12)
    assert np.all(cinch[C:, 2] < cinch[:C, 2])  # the lower band below the neck band
    flap = ch.keyframes("flap")
    np.testing.assert_allclose(flap[0][1], x2[ch.track("flap").index])  # grabs the rim where it is
    np.testing.assert_allclose(flap[-1][1][:, 2] - cinch[:C, 2], B.FLAP_RISE, atol=1e-12)  # over the neck


def test_loading_captures_of_the_wrong_shape_is_refused(tmp_path):
    sc = B.bag_scene("coarse")
    ch = sc.choreography
    np.savez(tmp_path / "s.npz", capture_unfold=np.zeros((12, 3)))  # an old per-track capture
    with pytest.raises(ValueError, match=r"capture 'unfold' has shape \(12, 3\).*older choreography"):
        ch.load_captures(np.load(tmp_path / "s.npz"))
    ch.observe(7.5, sc.x)
    np.savez(tmp_path / "ok.npz", **ch.captures_npz())
    ch2 = B.bag_scene("coarse")["choreography"]
    ch2.load_captures(np.load(tmp_path / "ok.npz"))
    for name in ("neck", "unfold", "gather", "cinch", "flap"):
        np.testing.assert_allclose(ch2.keyframes(name)[-1][1], ch.keyframes(name)[-1][1])


def test_stars_keep_their_sides_at_the_asked_length():
    for C in (12, 32):
        mesh = B.pouch_mesh(rings=7 if C == 12 else 15, columns=C)
        for ring, outer, frac in ((mesh.rings, B.GATHER_OUTER, B.GATHER_EDGE),
                                  (mesh.neck_ring, B.CINCH_OUTER, B.CINCH_EDGE)):
            edge = frac * 2 * mesh.ring_radius[ring] * np.sin(np.pi / C)
            r = B.star_outer(C, outer, edge)
            a = 2 * np.pi * np.arange(C) / C
            p = np.stack([r * np.cos(a), r * np.sin(a)], 1)
            d = np.linalg.norm(p - np.roll(p, -1, axis=0), axis=1)
            assert np.all(r[::2] == outer) and np.all(r[1::2] < outer)
            if r[1] > B.STAR_MIN_INNER:  # reachable in the plane: the sides have the asked length
                np.testing.assert_allclose(d, edge, rtol=1e-12)
            else:                        # clamped: shorter in the plane, the rest goes into height
                assert np.all(d < edge)
    # the full bag's stars are reachable in the plane
    mesh = B.pouch_mesh()
    assert B.star_outer(32, B.CINCH_OUTER, B.CINCH_EDGE * 2 * mesh.ring_radius[mesh.neck_ring]
                        * np.sin(np.pi / 32))[1] > B.STAR_MIN_INNER

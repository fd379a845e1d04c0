"""Newton VBD driver for the bag (baselines/vbd_bag.py).

The NumPy parts (material mapping, support folding, frame checks) run in the default suite
(the side-by-side table is scenes/compare.py's, tests/test_compare.py). Model building and the
0.1 s run need the ``newton`` extra (they are skipped without it); the coarse model check
and the run are marked slow (``pytest -m slow``), the short protocol's build is not.
"""
import json

import numpy as np
import pytest

from baselines import vbd_bag as V

E, NU, H = 315e6, 0.45, 30e-6


def test_membrane_lame_is_plane_stress_lame_times_thickness():
    mu, lam = V.membrane_lame(E, NU, H)
    # E h = 9450 N/m; μ = E h / 2.9, λ = 0.45 E h / 0.7975
    assert mu == pytest.approx(3258.6206896551726, rel=1e-14)
    assert lam == pytest.approx(5332.288401253919, rel=1e-14)
    # small-strain check: 2D Young's modulus and Poisson ratio come back
    E2 = 4 * mu * (mu + lam) / (2 * mu + lam)
    assert E2 == pytest.approx(E * H, rel=1e-12)
    assert lam / (2 * mu + lam) == pytest.approx(NU, rel=1e-12)


def test_edge_bending_stiffness_reproduces_ipcjax_hinge_coefficient():
    from ipcjax.energies.bending import hinge_stiffness
    from scenes.bag import bag_scene

    sc = bag_scene("coarse")
    m = sc.model
    hinges = np.asarray(m.hinges)  # ipcjax (a, b, c, d) is Newton's (i, j, k, l)
    ke = V.edge_bending_stiffness(np.asarray(m.x_ref), hinges, E, NU, H)
    k_theta = np.asarray(hinge_stiffness(E, NU, H, np.asarray(m.hinge_length), np.asarray(m.hinge_area)))
    np.testing.assert_allclose(ke * np.asarray(m.hinge_length), k_theta, rtol=1e-12)
    assert ke.min() > 0
    # boundary edges (an opposite vertex −1) do not bend
    edges = np.concatenate([hinges, [[-1, hinges[0, 1], hinges[0, 2], hinges[0, 3]]]])
    assert V.edge_bending_stiffness(np.asarray(m.x_ref), edges, E, NU, H)[-1] == 0.0


def test_anchor_springs_fold_slots_into_one_spring_with_the_same_energy():
    idx = np.array([5, 9, 5, 9])
    k = np.array([20.0, 0.0, 50.0, 10.0])
    tgt = np.array([[0, 0, 1.0], [9, 9, 9], [0, 1.0, 0], [1.0, 0, 0]])
    K, T = V.anchor_springs(idx, k, tgt, np.array([5, 9]))
    np.testing.assert_allclose(K, [70.0, 10.0])
    np.testing.assert_allclose(T, [[0, 50 / 70, 20 / 70], [1, 0, 0]])
    # the energies differ by a constant: same gradient at two points
    for x in (np.zeros(3), np.array([0.3, -0.2, 0.7])):
        g_slots = sum(ks * (x - t) for i, ks, t in zip(idx, k, tgt) if i == 5)
        np.testing.assert_allclose(K[0] * (x - T[0]), g_slots, atol=1e-12)
    K0, T0 = V.anchor_springs(idx, np.zeros(4), tgt, np.array([5, 9]))
    assert np.all(K0 == 0) and np.all(T0 == 0)


def test_frame_problem_names_non_finite_and_blow_up():
    film, sph, v = np.zeros((4, 3)), np.zeros((2, 3)), np.zeros((4, 3))
    assert V.frame_problem(film, sph, v) is None
    film[1, 2] = np.nan
    assert "non-finite" in V.frame_problem(film, sph, v)
    film[1, 2] = 20.0
    assert "coordinate" in V.frame_problem(film, sph, v)
    film[1, 2] = 0.0
    v[3] = [0, 0, 60.0]
    assert "speed" in V.frame_problem(film, sph, v)


# --------------------------------------------------------------------------- with newton

@pytest.mark.slow
def test_newton_model_matches_the_ipc_scene():
    import newton  # noqa: F401  (the test extra installs it: pyproject.toml)
    v = V.build_vbd_bag("coarse")
    sc, model = v.sc, v.model
    nf = len(sc.film)
    assert v.n_film == nf == 85
    assert model.tri_count == len(sc.faces) == 156
    np.testing.assert_array_equal(model.tri_indices.numpy(), sc.faces)
    # film particles first, then one kinematic anchor per supported film point
    assert model.particle_count == nf + len(v.anchored)
    np.testing.assert_allclose(model.particle_q.numpy()[:nf], sc.x[:nf], atol=1e-7)
    np.testing.assert_allclose(model.particle_mass.numpy()[:nf], np.asarray(sc.model.mass)[:nf], rtol=1e-6)
    assert np.all(model.particle_mass.numpy()[nf:] == 0) and np.all(model.particle_flags.numpy()[nf:] == 0)
    assert model.body_count == 7
    np.testing.assert_allclose(model.body_mass.numpy(), np.asarray(sc.model.mass)[sc.spheres], rtol=1e-6)
    # material: tri_ke = μ, tri_ka = λ, no damping; per-edge bending from the hinge coefficient
    mu, lam = V.membrane_lame(E, NU, H)
    mats = model.tri_materials.numpy()
    np.testing.assert_allclose(mats[:, 0], mu, rtol=1e-6)
    np.testing.assert_allclose(mats[:, 1], lam, rtol=1e-6)
    assert np.all(mats[:, 2] == 0)
    edges = model.edge_indices.numpy()
    interior = (edges[:, 0] >= 0) & (edges[:, 1] >= 0)
    assert interior.sum() == len(np.asarray(sc.model.hinges))
    bend = model.edge_bending_properties.numpy()
    np.testing.assert_allclose(bend[:, 0], V.edge_bending_stiffness(sc.x[:nf], edges, E, NU, H), rtol=1e-6)
    assert np.all(bend[~interior, 0] == 0) and np.all(bend[:, 1] == 0)
    # springs: one per anchor, then the tie pairs
    assert model.spring_count == len(v.anchored) + len(v.tie_pairs)


def test_the_short_protocol_drives_newton_with_the_same_choreography_as_ipcjax():
    import newton  # noqa: F401  (the test extra installs it: pyproject.toml)
    from scenes.bag import bag_scene

    v = V.build_vbd_bag("coarse", protocol="short")
    ch, ref = v.sc.choreography, bag_scene("coarse", protocol="short").choreography
    assert ch.protocol == "short" and ch.t_release == 7.35 and v.sc.t_end == 8.45
    assert [(t.name, t.t_on, t.t_off, t.fade_from) for t in ch.tracks] == \
        [(t.name, t.t_on, t.t_off, t.fade_from) for t in ref.tracks]
    np.testing.assert_array_equal(v.tie_pairs, ref.tie.pairs)
    assert (ch.tie.t_on, ch.tie.t_full) == (6.95, 7.10)


@pytest.mark.slow
def test_short_coarse_run_is_finite_spheres_wait_and_the_film_follows_supports(tmp_path):
    import newton  # noqa: F401  (the test extra installs it: pyproject.toml)
    s = V.run_vbd("coarse", until=0.1, out=str(tmp_path), progress=False)
    assert s["failure"] is None
    tr = np.load(tmp_path / "trajectory.npz")
    assert tr["film"].shape == (25, 85, 3) and tr["spheres"].shape == (25, 7, 3)
    assert tr["faces"].shape == (156, 3)
    np.testing.assert_allclose(tr["time"], np.arange(25) / 240, atol=1e-12)
    assert np.isfinite(tr["film"]).all() and np.isfinite(tr["spheres"]).all()
    # gravity cancelled until the first drop at 0.89 s
    np.testing.assert_allclose(tr["spheres"][-1], tr["spheres"][0], atol=1e-6)
    # the place hands lower the rim along their path (docs/design.md, "The bag scene", track "place")
    from scenes.bag import PLACE_LOWER, bag_scene, smoothstep
    rim = bag_scene("coarse").rim
    drop = PLACE_LOWER * float(smoothstep(0.1 / 0.72))  # the hands' descent by 0.1 s (1.3 mm)
    dz = tr["film"][-1][rim, 2] - tr["film"][0][rim, 2]
    assert np.all(dz < -0.5 * drop) and np.all(dz > -drop - 2e-3), dz
    r0 = np.linalg.norm(tr["film"][0][rim, :2], axis=1)
    r1 = np.linalg.norm(tr["film"][-1][rim, :2], axis=1)
    np.testing.assert_allclose(r1, r0, atol=0.5e-3)  # the hands move straight down
    assert s["audit"]["frames"] == 25 and s["audit"]["frames_with_self_intersection"] == 0
    assert json.load(open(tmp_path / "summary.json"))["solver"] == "newton-vbd"

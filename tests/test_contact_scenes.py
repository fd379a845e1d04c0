"""Film-on-sphere drape and film-on-film fold with friction: zero penetration, checked
independently by the audit (ipcjax.audit) on every frame."""
import numpy as np
import pytest

from ipcjax.audit import audit_trajectory
from ipcjax.model import Config, Controls, Params
from ipcjax.step import make_state, simulate
from scenes.film import drape_scene, fold_scene

DT = 1.0 / 240.0


def _drape(n, steps):
    sc = drape_scene(n=n, size=0.06, sphere_radius=0.02, gap=1.5e-3)
    m = sc.model
    frames, times, reps = simulate(m, Params.film_defaults(), make_state(sc.x),
                                   Controls.empty(m.n_particles, tolerance=5e-6), steps, dt=DT, config=Config())
    audit = audit_trajectory(frames, sc.film_triangles, [sc.sphere], [0.02])
    return frames, reps, audit


def test_short_drape_touches_the_sphere_without_penetration():
    frames, reps, audit = _drape(6, 40)
    assert audit["frames_with_self_intersection"] == 0
    assert np.all(audit["min_film_sphere"] > 0)
    assert np.min(audit["min_film_sphere"]) < 1e-3 + 15e-6  # the barrier is engaged
    assert min(r.min_gap for r in reps) > 0


@pytest.mark.slow
def test_drape_200_steps():
    frames, reps, audit = _drape(10, 200)
    assert audit["frames"] == 201 and audit["frames_with_self_intersection"] == 0
    assert np.all(audit["min_film_sphere"] > 0)
    print("drape: min film–sphere gap %.1f µm, Newton iterations %d, deepest subdivision %d" % (
        1e6 * np.min(audit["min_film_sphere"]), sum(r.iterations for r in reps), max(r.max_depth for r in reps)))


@pytest.mark.slow
def test_fold_200_steps_film_on_film():
    sc = fold_scene()
    m = sc.model
    frames, times, reps = simulate(m, Params.film_defaults(), make_state(sc.x), sc.controls, 200, dt=DT, config=Config())
    nf = len(np.unique(sc.film_triangles))
    audit = audit_trajectory(frames[:, :nf], sc.film_triangles)
    assert audit["frames_with_self_intersection"] == 0
    assert np.min(audit["min_film_film"]) < Config().dhat + Config().min_gap  # layers within barrier range
    assert np.min(audit["min_film_film"]) > Config().min_gap
    assert min(r.min_gap for r in reps) > 0
    print("fold: min film–film distance %.1f µm" % (1e6 * np.min(audit["min_film_film"])))

"""Model building: rest data, the static/dynamic split, and clear errors on bad input."""
import numpy as np
import pytest

from ipcjax.model import Config, Params, build_model
from scenes.film import film_grid, lumped_mass


def _grid(n=4):
    pos, tris = film_grid(n, 0.03)
    return pos, tris, lumped_mass(pos, tris)


def test_rest_data_of_a_flat_grid():
    pos, tris, m = _grid()
    model = build_model(pos, tris, m)
    assert model.film_triangles.shape == (18, 3) and model.dm_inv.shape == (18, 2, 2)
    assert np.allclose(np.asarray(model.rest_area).sum(), 0.03**2)
    assert np.allclose(np.asarray(model.theta0), 0.0)
    assert model.hinges.shape[0] == (12 + 12 + 9) - 12  # 4×4 grid: 33 edges, 12 on the boundary
    assert np.asarray(model.mass).sum() == pytest.approx(0.03**2 * 30e-6 * 925.0)
    assert model.n_free == 16


def test_params_defaults_are_the_spec_film():
    p = Params.film_defaults()
    assert float(p.youngs_modulus) == 315e6 and float(p.poisson) == 0.45
    assert float(p.thickness) == 30e-6 and float(p.friction) == 0.35 and float(p.barrier_stiffness) == 1000.0


@pytest.mark.parametrize("mutate, match", [
    (lambda p, t, m: (p[:, :2], t, m), r"x_ref must have shape \(N, 3\)"),
    (lambda p, t, m: (np.where(np.arange(len(p))[:, None] == 5, np.nan, p), t, m), r"x_ref\[5\] is not finite"),
    (lambda p, t, m: (p, t.astype(float), m), "integer array"),
    (lambda p, t, m: (p, np.vstack([t, [[0, 1, 99]]]), m), "triangle 18 indexes vertex 99"),
    (lambda p, t, m: (p, np.vstack([t, [[0, 1, 1]]]), m), "triangle 18 repeats a vertex"),
    (lambda p, t, m: (p, np.vstack([t, [[0, 5, 2]]]), m), r"non-manifold film edge.*\(0, 5\)"),
    (lambda p, t, m: (p, t, m[:-1]), r"mass must have shape"),
    (lambda p, t, m: (p, t, np.where(np.arange(len(m)) == 3, 0.0, m)), "free particle 3 has zero mass"),
])
def test_bad_input_is_named(mutate, match):
    pos, tris, m = _grid()
    with pytest.raises(ValueError, match=match):
        build_model(*mutate(pos, tris, m))


def test_degenerate_rest_triangle_is_named():
    pos, tris, m = _grid()
    pos = pos.copy()
    a, b, c = tris[7]
    pos[c] = 0.5 * (pos[a] + pos[b])  # collapse triangle 7 onto its edge
    with pytest.raises(ValueError, match="triangle"):
        build_model(pos, tris, m)


def test_sphere_must_be_independent_and_radius_valid():
    pos, tris, m = _grid()
    r = np.zeros(len(pos)); r[0] = 0.01
    with pytest.raises(ValueError, match="particle 0 has radius > 0 but is a triangle vertex"):
        build_model(pos, tris, m, radius=r)
    with pytest.raises(ValueError, match="radius"):
        build_model(pos, tris, m, radius=-np.ones(len(pos)))


def test_nonmanifold_edges_can_be_left_out_with_a_warning():
    pos, tris, m = _grid()
    extra = np.vstack([pos, [[0.0, 0.0, 0.01]]])
    t2 = np.vstack([tris, [[0, 5, len(pos)]]])  # a third triangle on the interior edge (0, 5)
    with pytest.warns(UserWarning, match=r"\(0, 5\)"):
        model = build_model(extra, t2, np.append(m, 1e-6), allow_nonmanifold=True)
    assert model.hinges.shape[0] == 20  # 21 interior edges less the non-manifold one


def test_config_rejects_unknown_models():
    with pytest.raises(ValueError, match="membrane"):
        Config(membrane="linear")
    with pytest.raises(ValueError, match="bending"):
        Config(bending="cubic")

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
    with pytest.raises(ValueError, match=r"membrane must be one of \('neo_hookean', 'stvk'\); got 'linear'"):
        Config(membrane="linear")
    with pytest.raises(ValueError, match=r"bending must be one of \('hinge', 'discrete_shell'\); got 'cubic'"):
        Config(bending="cubic")


def test_config_rejects_bad_line_search_expansions():
    for bad in (-1, 17, 2.0, True):
        with pytest.raises(ValueError, match=r"line_search_expansions must be an integer in \[0, 16\]"):
            Config(line_search_expansions=bad)
    assert Config().line_search_expansions == 0  # off unless a scene asks for it


def test_config_rejects_an_unknown_newton_tangent():
    with pytest.raises(ValueError, match=r"newton_tangent must be one of \('projected', 'exact_first'\); got 'exact'"):
        Config(newton_tangent="exact")
    assert Config().newton_tangent == "projected"  # the specification's, unless a scene asks


def test_names_resolve_to_one_object_each():
    """Config's strings name the model and solver objects; the Hessian projection has one
    name, PSDProjection, whose string values are the old ones, and unknown names raise."""
    from ipcjax.energies import PSDProjection
    from ipcjax.energies.bending import HINGE, bending_model
    from ipcjax.energies.membrane import STVK, membrane_model
    from ipcjax.implicit import make_rollout
    from ipcjax.linear_solvers import BlockJacobiCG, DenseCholesky, SparseLDL, linear_solver

    assert membrane_model("stvk") is STVK and bending_model("hinge") is HINGE
    assert isinstance(linear_solver(Config()), DenseCholesky)
    assert isinstance(linear_solver(Config(linear_solver="sparse")), SparseLDL)
    cg = linear_solver(Config(linear_solver="cg", cg_tolerance=1e-6, cg_max_iterations=7))
    assert isinstance(cg, BlockJacobiCG) and (cg.tolerance, cg.max_iterations) == (1e-6, 7)
    assert PSDProjection("exact") is PSDProjection.NONE and PSDProjection("projected") is PSDProjection.PER_ELEMENT
    assert STVK.element_hessian("exact") is STVK.hessian and STVK.element_hessian("projected") is STVK.hessian_psd
    with pytest.raises(ValueError, match="one of 'exact', 'projected'.*got 'approximate'"):
        PSDProjection("approximate")
    pos, tris, m = _grid()
    with pytest.raises(ValueError, match="got 'approximate'"):
        make_rollout(build_model(pos, tris, m), Config(), hessian="approximate")


def test_set_code_sets_one_bit():
    import jax.numpy as jnp

    from ipcjax.result import StepCode, set_code

    code = jnp.int32(int(StepCode.ITERATION_CAP))
    assert int(set_code(code, StepCode.NON_FINITE, where=jnp.bool_(True))) == StepCode.ITERATION_CAP | StepCode.NON_FINITE
    assert int(set_code(code, StepCode.NON_FINITE, where=jnp.bool_(False))) == StepCode.ITERATION_CAP
    assert int(set_code(code, StepCode.NON_FINITE, unless=jnp.bool_(True))) == StepCode.ITERATION_CAP
    assert int(set_code(code, StepCode.NON_FINITE, unless=jnp.bool_(False))) == StepCode.ITERATION_CAP | StepCode.NON_FINITE

"""The Newton direction's tangent ``Config.newton_tangent="exact_first"``: the exact
element Hessians of the terms ``potential.EXACT_FIRST`` names (the membrane's) factorized
first, the projected tangent where that fails (ipcjax/newton.py, docs/design.md "The exact tangent first")."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax import candidates as C
from ipcjax.model import Config, Controls, Params
from ipcjax.potential import EXACT_FIRST, dense_hessian, gradient_and_blocks, projected_blocks
from ipcjax.problem import StepInputs
from ipcjax.ensemble import ensemble_advance, stack
from ipcjax.step import advance, make_state, solve_positions, step_problem
from ipcjax.newton import query_contacts
from scenes.film import drape_scene
from tests.helpers import rel_err

DT = 1.0 / 240.0
N = 6


def film(squeeze: float):
    """A 6×6 film 5 mm above a sphere (no contact inside d̂), its plane scaled by
    ``squeeze`` about its centre and its heights perturbed by 10 µm: (model, x, capacity)."""
    sc = drape_scene(n=N, size=0.04, sphere_radius=0.02, gap=5e-3)
    x = np.array(sc.x)
    c = x[:N * N, :2].mean(axis=0)
    x[:N * N, :2] = c + squeeze * (x[:N * N, :2] - c)
    x[:N * N, 2] += np.random.default_rng(3).normal(size=N * N) * 1e-5
    return sc.model, jnp.asarray(x), C.Capacity(4 * N * N, 16 * N * N, 4 * N * N)


def inputs(model, x):
    p = Params.film_defaults()
    return StepInputs(p, x, jnp.zeros_like(x), Controls.empty(model.n_particles, tolerance=1e-8), jnp.asarray(DT))


def tangents(linear_solver):
    base = Config(linear_solver=linear_solver)
    return base, dataclasses.replace(base, newton_tangent="exact_first")


@pytest.fixture(scope="module")
def squeezed():
    """The film squeezed to 97 %: its membrane is in compression, so its exact tangent is
    indefinite where the projected one is not."""
    return film(0.97)


def test_the_exact_first_blocks_are_the_exact_elastic_ones_and_fall_back_to_every_projected_one(squeezed):
    model, x, cap = squeezed
    projected, exact_first = tangents("dense")
    cs, _ = jax.jit(lambda a: query_contacts(a, a, model, exact_first, cap))(x)
    pb = step_problem(model, exact_first, inputs(model, x), cs)
    blocks = jax.jit(lambda **kw: gradient_and_blocks(x, pb, cs, **kw), static_argnames=("projection", "exact"))
    g_p, hb_p = blocks()
    g_x, hb_x = blocks(projection="exact")
    g_e, hb_e = blocks(exact=EXACT_FIRST)
    names = ("membrane", "bending", "barrier", "friction", "support", "tie")
    assert len(hb_e.blocks) == len(names)
    for name, bp, bx, be in zip(names, hb_p.blocks, hb_x.blocks, hb_e.blocks):
        want = bx if name in EXACT_FIRST else bp
        assert np.array_equal(np.asarray(be), np.asarray(want)), name
    assert not np.array_equal(np.asarray(hb_e.blocks[0]), np.asarray(hb_p.blocks[0]))  # the tangents differ here
    assert np.array_equal(np.asarray(g_e), np.asarray(g_p)) and np.array_equal(np.asarray(g_x), np.asarray(g_p))
    assert np.linalg.eigvalsh(np.asarray(dense_hessian(hb_e))).min() < 0   # indefinite: the fallback's case
    assert np.linalg.eigvalsh(np.asarray(dense_hessian(hb_p))).min() > 0
    back = jax.jit(lambda hb: projected_blocks(x, pb, hb, EXACT_FIRST))(hb_e)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(hb_p)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match=r"no terms named \['stretch'\]"):
        projected_blocks(x, pb, hb_e, ("stretch",))


@pytest.mark.parametrize("linear_solver", ["dense", "sparse"])
def test_where_the_exact_tangent_is_indefinite_the_direction_is_the_projected_one(squeezed, linear_solver):
    """One Newton iteration from the squeezed film: the exact tangent fails to factorize,
    the fallback counts it, and the iterate is the projected tangent's bit for bit."""
    model, x, cap = squeezed
    one = lambda c: dataclasses.replace(c, max_newton=1)
    projected, exact_first = (one(c) for c in tangents(linear_solver))
    solve = jax.jit(solve_positions, static_argnames=("capacity",))  # Config's numbers traced: one program per tangent
    x_p, *_, info_p, _ = solve(model, inputs(model, x), projected, cap)
    x_e, *_, info_e, _ = solve(model, inputs(model, x), exact_first, cap)
    assert int(info_p.iterations) == int(info_e.iterations) == 1
    assert int(info_p.projected) == 0 and int(info_e.projected) == 1
    assert np.max(np.abs(np.asarray(x_p - x))) > 1e-6  # the iteration moved the film
    assert np.array_equal(np.asarray(x_e), np.asarray(x_p))


@pytest.mark.parametrize("linear_solver", ["dense", "sparse"])
def test_where_the_exact_tangent_is_positive_definite_the_first_direction_is_exact_newtons(linear_solver):
    """The film squeezed to 99.9 % and 10⁴ times as heavy: its membrane is in compression, so
    the exact tangent differs from the projected one, but the inertia keeps the exact-first
    H positive definite, and one Newton iteration takes the exact tangent's direction."""
    model, x, cap = film(0.999)
    model = model._replace(mass=model.mass * 1e4)
    one = lambda c: dataclasses.replace(c, max_newton=1)
    projected, exact_first = (one(c) for c in tangents(linear_solver))
    cs, _ = jax.jit(lambda a: query_contacts(a, a, model, exact_first, cap))(x)
    pb = step_problem(model, exact_first, inputs(model, x), cs)
    g, hb_e = jax.jit(lambda: gradient_and_blocks(x, pb, cs, exact=EXACT_FIRST))()
    H_e = np.asarray(dense_hessian(hb_e))
    assert np.linalg.eigvalsh(H_e).min() > 0
    newton = np.linalg.solve(H_e, -np.asarray(g))  # exact Newton's direction, here by numpy
    solve = jax.jit(solve_positions, static_argnames=("capacity",))  # Config's numbers traced: one program per tangent
    x_p, *_, info_p, _ = solve(model, inputs(model, x), projected, cap)
    x_e, *_, info_e, _ = solve(model, inputs(model, x), exact_first, cap)
    assert int(info_e.iterations) == 1 and int(info_e.projected) == 0
    free = np.asarray(model.free_particles)
    step_p, step_e = (np.asarray(a - x)[free].reshape(-1) for a in (x_p, x_e))
    assert np.max(np.abs(step_e)) > 1e-6  # a full step, far from any contact
    assert rel_err(step_e, newton) < 1e-9 and rel_err(step_p, newton) > 1e-6, (rel_err(step_e, newton),
                                                                              rel_err(step_p, newton))


# slow: two step programs per solver and an ensemble program (62 s on the dense path alone,
# 2026-12-07); the default suite's one-iteration tests above check the fallback bit for bit
# and the exact direction on both paths (docs/tests.md)
@pytest.mark.slow
@pytest.mark.parametrize("linear_solver", ["dense", "sparse"])
def test_exact_first_steps_a_squeezed_and_a_stretched_film_to_the_projected_tangents_minimiser(linear_solver):
    """Whole steps through the host driver, squeezed (the exact tangent fails and falls
    back) and stretched: both tangents end on the same minimiser of Φ, to the stopping
    tolerance; the squeezed step as a one-member ensemble counts the same fallbacks."""
    projected, exact_first = tangents(linear_solver)
    for squeeze in (0.97, 1.03):
        model, x, cap = film(squeeze)
        st = make_state(x)
        ctl = Controls.empty(model.n_particles, tolerance=1e-8)
        p = Params.film_defaults()
        out_p, rep_p = advance(model, p, st, ctl, DT, config=projected, capacity=cap)
        out_e, rep_e = advance(model, p, st, ctl, DT, config=exact_first, capacity=cap)
        assert rep_p.ok and rep_e.ok and rep_p.projected == 0
        assert rep_e.projected < rep_e.iterations  # some directions were the exact tangent's
        if squeeze < 1:
            assert rep_e.projected > 0
        moved = np.max(np.abs(np.asarray(out_p.x) - np.asarray(x)))
        diff = np.max(np.abs(np.asarray(out_e.x) - np.asarray(out_p.x)))
        print(f"squeeze {squeeze}: iterations {rep_p.iterations} projected, {rep_e.iterations} exact first "
              f"({rep_e.projected} fell back); moved {moved:.3g} m, apart {diff:.3g} m")
        assert moved > 1e-5 and diff < 1e-7  # FP32-stored positions, tolerance 1e-8 m
        if squeeze < 1:  # an ensemble member counts the same fallbacks (MemberReport.projected)
            st_k, rep_k, _ = ensemble_advance(model, stack([p]), stack([st]), stack([ctl]), DT,
                                              config=exact_first, capacity=cap)
            assert int(rep_k.code[0]) == 0 and int(rep_k.projected[0]) == rep_e.projected > 0
            assert int(rep_k.iterations[0]) == rep_e.iterations


def test_a_direction_longer_than_max_direction_is_cut_to_it_after_the_stopping_test(squeezed):
    """One Newton iteration with ``max_direction`` a tenth of the direction's length: the
    iterate changes no coordinate by more than that, the stopping rule still reads the whole
    direction (``last_step_norm``), and without the cap the same iteration moves further."""
    model, x, cap = squeezed
    solve = jax.jit(solve_positions, static_argnames=("capacity",))  # Config's numbers traced: one program per tangent
    free = Config(linear_solver="sparse", max_newton=1)
    x_free, *_, info_free, _ = solve(model, inputs(model, x), free, cap)
    norm = float(info_free.last_step_norm)
    limit = 0.1 * norm
    x_cut, *_, info_cut, _ = solve(model, inputs(model, x), dataclasses.replace(free, max_direction=limit), cap)
    assert float(info_cut.last_step_norm) == norm > 0
    moved_free = np.max(np.abs(np.asarray(x_free - x)))
    moved_cut = np.max(np.abs(np.asarray(x_cut - x)))
    assert 0 < moved_cut <= limit * (1 + 1e-12) < moved_free, (moved_cut, limit, moved_free)
    with pytest.raises(ValueError, match=r"max_direction must be > 0 \(m; inf: no limit\); got nan"):
        Config(max_direction=float("nan"))
    with pytest.raises(ValueError, match=r"max_direction must be > 0"):
        Config(max_direction=0.0)

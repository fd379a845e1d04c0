"""Ensembles in lockstep (ipcjax/ensemble.py): K members' step as one vmapped program with
no host callback, each member equal to its own single step, failures named, the host
solver refused."""
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax import capacity as C
from ipcjax import ensemble as E
from ipcjax.model import Config, Controls, Params
from ipcjax.result import StepCode
from ipcjax.step import advance, make_state, step
from scenes.film import vertex_triangle_scene

DT = 1 / 240


def _members_equal_their_single_steps(model, params, states, controls, config, cap):
    """One ensemble step against each member's own step at capacity ``cap``; returns the
    largest |Δx| between them (m)."""
    args = (E.stack(params), E.stack(states), E.stack(controls))
    out, info = E.ensemble_step(model, *args, DT, config=config, capacity=cap)
    E.check_members(info)
    diff = 0.0
    for k in range(len(states)):
        single, sinfo = step(model, params[k], states[k], controls[k], DT, config=config, capacity=cap)
        assert int(sinfo.code) == 0 and int(np.asarray(info.iterations)[k]) == int(sinfo.iterations)
        diff = max(diff, float(np.max(np.abs(np.asarray(out.x[k]) - np.asarray(single.x)))))
        assert np.max(np.abs(np.asarray(out.x[k]) - np.asarray(states[k].x))) > 1e-6  # the member moved
    # the program never calls the host: no pure_callback, no debug callback
    assert E.host_callbacks(lambda *a: E.ensemble_step(model, *a, DT, config=config, capacity=cap), *args) == []
    return diff


def test_two_members_of_a_contact_scene_equal_their_single_steps():
    """A vertex falling onto a triangle, two members with different speeds and stiffnesses:
    each equals its own step to round-off (measured 0 m on this CPU)."""
    sc = vertex_triangle_scene()
    m = sc.model
    ctl = Controls.empty(m.n_particles, tolerance=1e-9)
    s0 = make_state(sc.x, sc.v)
    s1 = make_state(sc.x, sc.v * 1.5)
    p0 = Params.film_defaults()
    cap = C.initial_capacity(m.topology)
    diff = _members_equal_their_single_steps(
        m, [p0, p0._replace(youngs_modulus=jnp.asarray(2 * 315e6))], [s0, s1], [ctl, ctl], Config(), cap)
    assert diff < 1e-12, diff

    # a member whose step fails (a non-finite velocity) keeps its input state and is named,
    # beside a member that steps; the same program
    P = E.stack([p0, p0])
    S = E.stack([s0, s1._replace(v=s1.v.at[0, 2].set(jnp.nan))])
    Cs = E.stack([ctl, ctl])
    out, info = E.ensemble_step(m, P, S, Cs, DT, config=Config(), capacity=cap)
    codes = np.asarray(info.code)
    assert codes[0] == 0 and codes[1] != 0, codes  # the NaN fails the factorization (measured)
    np.testing.assert_array_equal(np.asarray(out.x[1]), np.asarray(S.x[1]))
    assert np.max(np.abs(np.asarray(out.x[0]) - np.asarray(s0.x))) > 1e-6
    with pytest.raises(E.MemberFailed, match=f"ensemble member 1 failed its step: {StepCode.describe(codes[1])}"):
        E.check_members(info)
    with pytest.raises(ValueError, match="linear solve inside XLA"):
        E.ensemble_step(m, P, S, Cs, DT, config=Config(linear_solver="sparse"), capacity=cap)
    with pytest.raises(ValueError, match="fixed capacity"):
        E.ensemble_step(m, P, S, Cs, DT, config=Config(), capacity=None)
    with pytest.raises(ValueError, match="same number of members"):
        E.ensemble_step(m, E.stack([p0] * 3), S, Cs, DT, config=Config(), capacity=cap)


@pytest.mark.slow  # a coarse-bag step program, its vmapped twin and the driver's growth (≈ 1.5 min)
def test_two_coarse_bag_members_equal_their_single_steps():
    """The 85-vertex bag at 8.50 s (tying), dense solver: member 0 as saved, member 1 with a
    seeded kick of 1 mm/s rms (scenes/perturb.py), the same controls: each equals its own
    step to round-off (measured 0 m on this CPU), and the program has no host callback."""
    from scenes.bag import bag_scene
    from scenes.bag_run import read_bag_state
    from scenes.perturb import film_kick

    sc = bag_scene("coarse", linear_solver="dense")
    rs = read_bag_state("tests/data/bag_coarse_8p50.npz", sc, "coarse")
    s0 = make_state(rs["x"], rs["v"], float(rs["t"]))
    s1 = s0._replace(v=s0.v + jnp.asarray(film_kick(np.asarray(s0.x), sc.film, 1e-3, 1)))
    sc.choreography.observe(float(s0.t), np.asarray(s0.x))
    ctl = sc.choreography.controls_at(int(rs["step"]), float(s0.t))
    _, rep = advance(sc.model, sc.params, s0, ctl, sc.dt, config=sc.config, capacity=None, validate=False)
    assert rep.ok  # the capacity this step grew to serves the ensemble
    diff = _members_equal_their_single_steps(sc.model, [sc.params] * 2, [s0, s1], [ctl, ctl], sc.config,
                                             rep.capacity)
    assert diff < 1e-12, diff

"""Ensembles in lockstep (ipcjax/ensemble.py) on the coarse bag (slow); the default suite's
test, on the vertex–triangle scene, is in tests/test_step.py, where its single step's
program is already compiled: K members' step as one vmapped program with no host callback,
each member equal to its own single step."""
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax import ensemble as E
from ipcjax.step import advance, make_state, step

DT = 1 / 240


def members_equal_their_single_steps(model, params, states, controls, config, cap):
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
    diff = members_equal_their_single_steps(sc.model, [sc.params] * 2, [s0, s1], [ctl, ctl], sc.config,
                                             rep.capacity)
    assert diff < 1e-12, diff

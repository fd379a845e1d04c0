"""Ensembles in lockstep (ipcjax/ensemble.py) on the coarse bag (slow); the default suite's
test, on the vertex–triangle scene, is in tests/test_step.py, where its single step's
program is already compiled: K members' step as one vmapped program with no host callback,
each member equal to its own single step."""
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax import ensemble as E
from ipcjax.capacity import Capacity, GridCapacity, grow_capacity
from ipcjax.model import Config
from ipcjax.result import StepCode
from tests.helpers import fp32_ulp
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


def test_an_overflowing_member_grows_the_capacity_and_the_whole_step_reruns(monkeypatch):
    """ensemble_advance's host loop, with a stand-in for the compiled program: a member's
    overflow grows the capacity above the largest counts any member reported and reruns
    every member from the same inputs; the capacity returned is the one that ran. The real
    program's growth is the slow coarse-bag test below."""
    calls = []
    small = Capacity(8, 8, 8, GridCapacity(64, 64, 64), GridCapacity(64, 64, 64), active=8)

    def program(model, params, states, aux, schedule, *, dt, config, capacity, steps, keep_every):
        calls.append((capacity, states))
        n = len(calls)
        code = np.array([0, StepCode.CAPACITY_OVERFLOW if n == 1 else 0, 0], np.int32)
        col = lambda *a: np.array(a)[:, None]  # noqa: E731  (K = 3 members, 1 step)
        rep = E.MemberReport(code[:, None], *(np.zeros((3, 1), np.int32),) * 7, np.ones((3, 1)), np.ones((3, 1)),
                             col(3, 20, 5), col(9, 2, 1), col(1, 1, 4), col(6, 30, 2), np.full((3, 1, 2, 3), 10 * n))
        return E.Rollout(states, aux, None, None, rep, np.where(code, 0, -1), code)

    monkeypatch.setattr(E, "_rollout", program)
    states = E.stack([np.zeros(2)] * 3)
    _, rep, cap = E.ensemble_advance(None, states, states, states, 0.01, config=Config(), capacity=small)
    assert len(calls) == 2 and calls[1][1] is states  # one rerun, from the same inputs
    want = grow_capacity(small, 20, 9, 5, np.full((2, 3), 10), n_active=30)
    assert cap == want == calls[1][0] and cap.vt == int(1.5 * 20) + 64 and cap.sf == 8
    assert not np.asarray(rep.code).any()


def coarse_bag_tying():
    """The 85-vertex bag at 8.50 s (tying) on the dense solver: (scene, the saved state, the
    same with a seeded kick of 1 mm/s rms (scenes/perturb.py), the step's controls)."""
    from scenes.bag import bag_scene
    from scenes.bag_run import read_bag_state
    from scenes.perturb import film_kick

    sc = bag_scene("coarse", linear_solver="dense")
    rs = read_bag_state("tests/data/bag_coarse_8p50.npz", sc, "coarse")
    s0 = make_state(rs["x"], rs["v"], float(rs["t"]))
    s1 = s0._replace(v=s0.v + jnp.asarray(film_kick(np.asarray(s0.x), sc.film, 1e-3, 1)))
    sc.choreography.observe(float(s0.t), np.asarray(s0.x))
    return sc, s0, s1, sc.choreography.controls_at(int(rs["step"]), float(s0.t))


@pytest.mark.slow  # a coarse-bag step program, its vmapped twin and the driver's growth (≈ 1.5 min)
def test_two_coarse_bag_members_equal_their_single_steps():
    """The 85-vertex bag at 8.50 s (tying), dense solver: member 0 as saved, member 1 with a
    seeded kick of 1 mm/s rms (scenes/perturb.py), the same controls: each equals its own
    step to round-off (measured 0 m on this CPU), and the program has no host callback."""
    sc, s0, s1, ctl = coarse_bag_tying()
    _, rep = advance(sc.model, sc.params, s0, ctl, sc.dt, config=sc.config, capacity=None, validate=False)
    assert rep.ok  # the capacity this step grew to serves the ensemble
    diff = members_equal_their_single_steps(sc.model, [sc.params] * 2, [s0, s1], [ctl, ctl], sc.config,
                                             rep.capacity)
    assert diff <= 4 * fp32_ulp(s0.x), diff  # to four FP32 steps: batched code may round otherwise


@pytest.mark.slow  # the coarse bag's subdivided ensemble program at two capacities (≈ 2 min)
def test_coarse_bag_ensemble_grows_its_capacity_and_equals_the_host_driver():
    """ensemble_advance on the 85-vertex bag at 8.50 s (tying), dense solver, from the
    topology's first-guess capacity: the program overflows, the host grows the capacity
    and reruns both members, and each member then equals advance() at the capacity that
    ran: the same substeps and iterations, positions to four FP32 steps (bit for bit on
    this CPU)."""
    from ipcjax.candidates import initial_capacity

    sc, s0, s1, ctl = coarse_bag_tying()
    first = initial_capacity(sc.model.topology)._replace(vt=8, ee=8)  # far fewer rows than the candidates
    out, rep, cap = E.ensemble_advance(sc.model, E.stack([sc.params] * 2), E.stack([s0, s1]), E.stack([ctl] * 2),
                                       sc.dt, config=sc.config, capacity=first)
    assert cap != first  # it overflowed and grew
    E.check_members(rep)
    for k, s in enumerate((s0, s1)):
        single, r = advance(sc.model, sc.params, s, ctl, sc.dt, config=sc.config, capacity=cap, validate=False)
        assert r.ok and r.reallocations == 0
        assert (int(rep.substeps[k]), int(rep.iterations[k])) == (r.substeps, r.iterations)
        assert np.abs(np.asarray(out.x[k]) - np.asarray(single.x)).max() <= 4 * fp32_ulp(single.x)  # measured 0
        assert float(out.t[k]) == float(single.t)
    assert np.max(np.abs(np.asarray(out.x[1]) - np.asarray(out.x[0]))) > 1e-9  # the kick shows


SHARDED = """
import jax, numpy as np
from ipcjax import candidates as C, ensemble as E
from ipcjax.model import Config, Controls, Params
from ipcjax.step import make_state
from scenes.film import vertex_triangle_scene
assert len(jax.devices()) == 2
sc = vertex_triangle_scene()
m, p0 = sc.model, Params.film_defaults()
ctl = Controls.empty(m.n_particles, tolerance=1e-9)
args = (E.stack([p0] * 2), E.stack([make_state(sc.x, sc.v * 4), make_state(sc.x, sc.v)]), E.stack([ctl] * 2),
        E.Constant())
kw = dict(dt=1 / 240, steps=2, config=Config(max_newton=6), capacity=C.initial_capacity(m.topology))
split, _ = E.ensemble_rollout(m, *args, **kw)
assert len(split.state.x.sharding.device_set) == 2 and not np.asarray(split.code).any()
one, _ = E.ensemble_rollout(m, *args, **kw, devices=jax.devices()[:1])
assert len(one.state.x.sharding.device_set) == 1
# one member a device rounds as K = 1 does, two on one device as K = 2: to a few FP32 steps
# (measured 1.5e-9 m, member 1), with the same substeps and iterations
ulp = float(np.spacing(np.float32(np.abs(np.asarray(one.frames)).max())))
assert np.abs(np.asarray(split.frames) - np.asarray(one.frames)).max() <= 4 * ulp
np.testing.assert_array_equal(np.asarray(split.times), np.asarray(one.times))
for f in ("code", "substeps", "max_depth", "iterations"):
    np.testing.assert_array_equal(np.asarray(getattr(split.reports, f)), np.asarray(getattr(one.reports, f)))
assert np.abs(np.asarray(split.frames[1]) - np.asarray(split.frames[0])).max() > 1e-4  # the members differ
try:
    E.ensemble_rollout(m, *(E.stack([x] * 3) for x in (p0, make_state(sc.x, sc.v), ctl)), E.Constant(), **kw)
    raise SystemExit("three members on two devices were not refused")
except ValueError as e:
    assert "3 ensemble members do not split over 2 devices" in str(e), e
print("ok")
"""


@pytest.mark.slow  # a subprocess with two forced CPU devices compiles two rollout programs (≈ 1 min)
def test_a_rollout_split_over_two_devices_equals_one_device():
    """ensemble_rollout with its members split over two CPU devices (jax.sharding) gives
    what one device gives, to four FP32 steps, with the same substeps and iterations;
    members that do not split are refused. The fast
    sibling is tests/test_step.py's rollout test (the same program on one device)."""
    from tests.test_sweep import _run_on_two_cpu_devices

    _run_on_two_cpu_devices(SHARDED)


DISTRIBUTED = """
import sys
import jax
pid, port = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid, initialization_timeout=120)
import numpy as np
from ipcjax import candidates as C, ensemble as E
from ipcjax.model import Config, Controls, Params
from ipcjax.step import make_state
from scenes.film import vertex_triangle_scene
assert jax.process_count() == 2 and len(jax.devices()) == 2
sc = vertex_triangle_scene()
m, p0 = sc.model, Params.film_defaults()
ctl = Controls.empty(m.n_particles, tolerance=1e-9)
states = [make_state(sc.x, sc.v * 4), make_state(sc.x, sc.v)]
args = (E.stack([p0] * 2), E.stack(states), E.stack([ctl] * 2), E.Constant())
kw = dict(dt=1 / 240, steps=2, config=Config(max_newton=6), capacity=C.initial_capacity(m.topology))
split, _ = E.ensemble_rollout(m, *args, **kw)  # one member in each process
assert isinstance(split.state.x, np.ndarray) and not np.asarray(split.code).any()
one, _ = E.ensemble_rollout(m, *args, **kw, devices=jax.local_devices()[:1])  # both here
ulp = float(np.spacing(np.float32(np.abs(np.asarray(one.frames)).max())))
assert np.abs(np.asarray(split.frames) - np.asarray(one.frames)).max() <= 4 * ulp
for f in ("code", "substeps", "max_depth", "iterations"):
    np.testing.assert_array_equal(np.asarray(getattr(split.reports, f)), np.asarray(getattr(one.reports, f)))
assert np.abs(np.asarray(split.frames[1]) - np.asarray(split.frames[0])).max() > 1e-4
refused = ""  # members that differ between the processes are refused in both
try:
    E.ensemble_rollout(m, args[0], E.stack([make_state(sc.x, sc.v * (1 + pid))] * 2), *args[2:], **kw)
except ValueError as e:
    refused = str(e)
assert "members over several processes must be the same in every process" in refused, refused
jax.distributed.shutdown()
print("ok")
"""


@pytest.mark.slow  # a rollout compiled in each of two processes, twice (≈ 1.5 min)
def test_a_rollout_over_two_processes_with_jax_distributed():
    """ensemble_rollout over two processes joined with jax.distributed, one CPU device each:
    every process gets both members' results (NumPy), equal to both run on one device to
    four FP32 steps with the same substeps and iterations; members that differ between the
    processes are refused in both. The fast sibling is tests/test_sweep.py's distributed
    sweep, which places and gathers with the same ipcjax.ensemble.place and gather."""
    import os

    from tests.test_sweep import _run_two_processes

    _run_two_processes(DISTRIBUTED, dict(os.environ, JAX_PLATFORMS="cpu"))

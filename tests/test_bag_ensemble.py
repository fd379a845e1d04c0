"""``ipcjax bag --ensemble K`` (scenes/bag_ensemble.py): the host loop around the batched
program with a stand-in for it, and (slow) a K = 2 coarse-bag ensemble against two single
runs of ``ipcjax bag``."""
import json

import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax import ensemble as E
from ipcjax.result import StepCode
from scenes import bag_ensemble as BE
from scenes.bag_run import BagRunOptions, read_bag_state, run_bag
from tests.helpers import fp32_ulp

BAG_STATE = "tests/data/bag_coarse_8p50.npz"  # a coarse `ipcjax bag` state at 8.50 s (tying)
BASE = dict(resolution="coarse", resume=BAG_STATE, linear_solver="dense", progress=False, pictures=False,
            mesh_every=0, perturb=1e-3)


def test_chunks_have_one_length_and_stop_at_the_unfold_check():
    assert list(BE._chunks(0, 40, 30)) == [(0, 12), (12, 24), (24, 30), (30, 36), (36, 40)]
    assert list(BE._chunks(2040, 2064, None)) == [(2040, 2052), (2052, 2064)]
    assert list(BE._chunks(5, 30, 5)) == [(5, 12), (12, 24), (24, 30)]  # a check at the start is the loop's
    steps = [b - a for a, b in BE._chunks(0, 2520, 1452)]  # the full protocol: one program
    assert set(steps) == {BE.CHUNK} and sum(steps) == 2520


def stand_in_rollout(calls):
    """A stand-in for the program: member j's positions grow by (j + 1)·0.01 % a step;
    member 1 fails at the 4th step of the second call."""

    def rollout(model, params, states, aux, schedule, *, dt, steps, config, capacity, keep_every=1):
        calls.append(steps)
        k = np.arange(1, steps + 1)
        grow = 1 + 1e-4 * np.arange(1, 3)[:, None, None, None] * k[None, :, None, None]
        frames = np.asarray(states.x, np.float64)[:, None] * grow
        times = np.asarray(states.t)[:, None] + dt * k[None]
        failed_at = np.array([-1, 3 if len(calls) == 2 else -1])
        code = np.where(failed_at >= 0, int(StepCode.ITERATION_CAP), 0)
        last = np.where(failed_at >= 0, failed_at - 1, steps - 1)
        end = states._replace(x=jnp.asarray(np.where(failed_at[:, None, None] == 0, states.x,
                                                     frames[np.arange(2), last])).astype(jnp.float32),
                              t=jnp.asarray(np.where(failed_at >= 0, times[np.arange(2), np.maximum(last, 0)],
                                                     times[:, -1])))
        z = np.zeros((2, steps), np.int32)
        rep = E.MemberReport(z + code[:, None], z + 1, z, z + 1, z + 5, z, z, z + 2, np.ones((2, steps)),
                             np.full((2, steps), 4e-4), z, z, z, z, np.zeros((2, steps, 2, 3), np.int32))
        return E.Rollout(end, aux, jnp.asarray(frames, jnp.float32), jnp.asarray(times), rep, failed_at, code), capacity

    return rollout


def test_the_host_loop_keeps_frames_names_the_failed_member_and_writes_every_member(monkeypatch, tmp_path, capsys):
    """A stand-in for the program: member j's positions grow by (j + 1)·0.01 % a step
    (about the origin: nothing intersects that did not); member 1 fails at the 4th
    step of the second chunk. The job stops there, names member 1, its step, time and
    reason, keeps each member's frames up to its last good step (every 2nd, save_every),
    writes both members' folders and the mean and sd of their measurements."""
    calls = []
    monkeypatch.setattr(E, "ensemble_rollout", stand_in_rollout(calls))
    opts = BagRunOptions(out=str(tmp_path / "ens"), until=8.60, save_every=2, **dict(BASE, progress=True))
    res = BE.run_bag_ensemble(opts, 2)
    s = res.summary
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("bag ensemble: t = 8.550 of 8.60 s, step 12/24") and "ETA" not in lines[0]
    assert lines[1].startswith("bag ensemble: t = 8.600 of 8.60 s, step 15/24") and "ETA" in lines[1]
    assert lines[2] == (f"bag ensemble: member 1 stopped in phase 'tie' at t = 8.5625 s: "
                        f"{StepCode.describe(StepCode.ITERATION_CAP)}") and len(lines) == 3
    assert calls == [12, 12] and not res.ok
    f = s["failure"]
    assert (f["member"], f["step"], f["reason"]) == (1, 2040 + 12 + 3, StepCode.describe(StepCode.ITERATION_CAP))
    assert f["time_s"] == pytest.approx(8.50 + 15 / 240)  # the start of the failed step
    assert s["step_index"] == 2055 and s["ensemble"] == 2
    from ipcjax.audit import audit_trajectory
    from scenes.bag import bag_scene

    sc = bag_scene("coarse")
    spheres = np.arange(len(sc.film), len(sc.film) + len(sc.spheres))
    for j, frames in ((0, 1 + 12), (1, 1 + 6 + 1)):  # the start, then steps 2, 4, … up to the last good one
        with np.load(tmp_path / "ens" / f"member{j}" / "trajectory.npz") as tr:
            assert tr["film"].shape[0] == frames == s["members"][j]["audit"]["frames"], j
            own = audit_trajectory(np.concatenate([tr["film"], tr["spheres"]], axis=1), sc.faces, spheres,
                                   sc.sphere_radius)  # the member's audit is of its own frames
        assert s["members"][j]["audit"]["min_film_film_m"] == float(np.min(own["min_film_film"])), j
        assert s["members"][j]["audit"]["min_film_sphere_m"] == float(np.min(own["min_film_sphere"])), j
        with open(tmp_path / "ens" / f"member{j}" / "summary.json") as fh:
            assert json.load(fh)["member"] == j
        rs = read_bag_state(str(tmp_path / "ens" / f"member{j}" / "state.npz"), sc, "coarse")  # resumable
        assert int(rs["step"]) == (2064, 2055)[j]  # member 0 ran its chunk out, member 1 stopped
    assert s["members"][0]["newton_iterations"] == 5 * 24 and s["members"][1]["newton_iterations"] == 5 * 15
    assert s["members"][0]["projected_directions"] == 2 * 24 and s["members"][1]["projected_directions"] == 2 * 15
    assert s["members"][1]["perturbation"]["seed"] == 1 and s["members"][0]["perturbation"] is None
    neck = np.array([m["measurements"]["neck_width_mm"] for m in s["members"]])
    np.testing.assert_allclose(s["measurements_mean_sd"]["neck_width_mm"]["mean"], neck.mean(axis=0))
    np.testing.assert_allclose(s["measurements_mean_sd"]["neck_width_mm"]["sd"], neck.std(axis=0, ddof=1))
    assert np.all(np.asarray(s["measurements_mean_sd"]["neck_width_mm"]["sd"]) > 0)


def members_equal_single_runs(tmp_path) -> dict:
    """`ipcjax bag --ensemble 2 --perturb 1e-3` from the coarse bag at 8.50 s (tying) over
    12 steps against `ipcjax bag` without a kick and with --perturb 1e-3 --seed 1, all on
    the dense solver, in folders under ``tmp_path``: every kept frame of each member equals
    its single run's to four FP32 steps, with the same Newton iterations, and the members
    differ (the kick shows). Returns the ensemble's summary."""
    base = dict(BASE, until=8.55)
    res = BE.run_bag_ensemble(BagRunOptions(out=str(tmp_path / "ens"), **base), 2)
    assert res.ok and res.summary["failure"] is None
    films = []
    for j in (0, 1):
        single = run_bag(BagRunOptions(out=str(tmp_path / f"single{j}"), seed=j, **dict(base, perturb=1e-3 if j else 0)))
        with np.load(tmp_path / "ens" / f"member{j}" / "trajectory.npz") as a, \
                np.load(tmp_path / f"single{j}" / "trajectory.npz") as b:
            assert a["film"].shape == b["film"].shape == (13, 85, 3)
            np.testing.assert_array_equal(a["time"], b["time"])
            tol = 4 * fp32_ulp(b["film"])  # a few FP32 steps; measured 0 on this CPU
            assert np.abs(a["film"] - b["film"]).max() <= tol and np.abs(a["spheres"] - b["spheres"]).max() <= tol
            films.append(a["film"][-1])
        assert res.summary["members"][j]["newton_iterations"] == single.summary["newton_iterations"]
        assert res.summary["members"][j]["projected_directions"] == single.summary["projected_directions"]
    assert np.abs(films[1] - films[0]).max() > 1e-8
    return res.summary


@pytest.mark.slow  # the coarse bag's ensemble program and two single runs, in a process of its own (≈ 2.5 min)
def test_two_coarse_bag_members_on_two_devices_equal_two_single_runs():
    """members_equal_single_runs in a process with two forced CPU devices, one member on
    each (summary.json's ``devices``): measured bit for bit against the single runs."""
    from tests.test_sweep import _run_on_two_cpu_devices

    _run_on_two_cpu_devices("""
import pathlib, tempfile
import jax
from tests.test_bag_ensemble import members_equal_single_runs
assert len(jax.devices()) == 2
with tempfile.TemporaryDirectory() as d:
    assert members_equal_single_runs(pathlib.Path(d))["devices"] == 2
print("ok")
""")


def test_members_that_do_not_split_over_the_devices_are_refused_before_anything_runs():
    """With two (forced CPU) devices, `--ensemble 3` is refused by the option check, naming
    both counts; `--ensemble 2` passes it."""
    from tests.test_sweep import _run_on_two_cpu_devices

    _run_on_two_cpu_devices("""
from scenes.bag_ensemble import check_ensemble_options
from scenes.bag_run import BagRunOptions
opts = BagRunOptions(linear_solver="dense", perturb=0.1)
check_ensemble_options(opts, 2, None)
try:
    check_ensemble_options(opts, 3, None)
    raise SystemExit("three members on two devices passed")
except ValueError as e:
    assert "3 ensemble members do not split over 2 devices" in str(e), e
print("ok")
""")


def test_a_process_other_than_the_first_writes_nothing_and_returns_the_first_ones_audit(monkeypatch, tmp_path,
                                                                                        capsys):
    """Over several processes (jax.distributed) process 0 audits, writes and prints the
    progress; another process runs the same loop, writes no folder, prints no progress,
    and takes every member's audit from process 0 (a stand-in for the broadcast here, as
    for the program), so its summary and status are process 0's. The two-process run
    itself: the slow test below."""
    import jax

    monkeypatch.setattr(E, "ensemble_rollout", stand_in_rollout([]))
    lead = BE.run_bag_ensemble(BagRunOptions(out=str(tmp_path / "lead"), until=8.60, save_every=2, **BASE), 2)
    first = lead.summary["members"]
    sent, prepared = [], []

    def from_process_0(x):   # what process 0 holds: its folder prepared, then the members' fields in order
        if not prepared:
            prepared.append(x.copy())
            return np.ones_like(x)
        j, i = divmod(len(sent), len(BE.AUDIT_FIELDS))
        k = BE.AUDIT_FIELDS[i][0]
        sent.append((x.shape, x.dtype))
        own = {"intersecting_pairs": np.zeros(x.shape, np.int64) + (k == "intersecting_pairs") * (j == 1),
               "min_film_film": np.full(x.shape, first[j]["audit"]["min_film_film_m"]),
               "min_film_sphere": np.full(x.shape, first[j]["audit"]["min_film_sphere_m"])}[k]
        return own

    monkeypatch.setattr(BE, "_broadcast", from_process_0)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(E, "ensemble_rollout", stand_in_rollout([]))
    capsys.readouterr()
    other = BE.run_bag_ensemble(BagRunOptions(out=str(tmp_path / "other"), until=8.60, save_every=2,
                                              **dict(BASE, progress=True)), 2)
    assert not (tmp_path / "other").exists()
    err = capsys.readouterr().err
    assert "step 12/24" not in err and "member 1 stopped" in err
    assert prepared[0].tolist() == [1]   # this process had no folder to prepare: it sends "prepared"
    assert [shape for shape, _ in sent] == [(m["audit"]["frames"],) for m in first for _ in BE.AUDIT_FIELDS]
    assert [str(dt) for _, dt in sent] == [str(np.dtype(dt)) for _ in first for _, dt in BE.AUDIT_FIELDS]
    s = other.summary
    assert s["processes"] == 2 and lead.summary["processes"] == 1
    assert s["members"][1]["audit"]["frames_with_self_intersection"] == first[1]["audit"]["frames"]  # process 0's
    assert s["members"][0]["audit"] == first[0]["audit"]
    assert s["failure"] == lead.summary["failure"] and not other.ok
    assert s["members"][1]["measurements"] == first[1]["measurements"]


def test_a_run_folder_process_0_cannot_write_stops_every_process_before_any_step(monkeypatch, tmp_path):
    """Over several processes, when process 0 cannot prepare --out (its broadcast says so),
    another process raises too, naming process 0, before the program runs: it does not
    wait in the program for a process that has gone."""
    import jax

    calls = []
    monkeypatch.setattr(E, "ensemble_rollout", stand_in_rollout(calls))
    monkeypatch.setattr(BE, "_broadcast", lambda x: np.zeros_like(x))   # process 0: not prepared
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(OSError, match="process 0 could not prepare the run folder"):
        BE.run_bag_ensemble(BagRunOptions(out=str(tmp_path / "o"), until=8.60, **BASE), 2)
    assert calls == [] and not (tmp_path / "o").exists()


def test_the_process_flags_go_together_and_with_an_ensemble(capsys):
    from jobs import cli

    base = ["bag", "--resolution", "coarse", "--linear-solver", "dense", "--perturb", "0.01"]
    for extra, why in (
            (["--coordinator", "localhost:1234"], "--coordinator, --processes and --process-id go together"),
            (["--coordinator", "localhost:1234", "--processes", "2", "--process-id", "0"],
             "--coordinator joins the processes of one --ensemble K run"),
            (["--ensemble", "2", "--coordinator", "h:1", "--processes", "1", "--process-id", "0"],
             "--processes must be ≥ 2; got 1"),
            (["--ensemble", "2", "--coordinator", "h:1", "--processes", "2", "--process-id", "2"],
             "--process-id must be in 0 … 1; got 2")):
        assert cli.main(base + extra) == 2
        assert why in capsys.readouterr().err, extra


@pytest.mark.slow  # the coarse bag's ensemble program in each of two processes, and two single runs (≈ 3 min)
def test_the_bag_ensemble_job_over_two_processes(tmp_path):
    """`ipcjax bag --ensemble 2 --coordinator … --processes 2 --process-id I` in two
    processes of one CPU device each, one member on each: process 0 writes the run folder
    (process 1, given another --out, writes none), both exit 0, and the members equal
    their single runs as in members_equal_single_runs."""
    import os
    import textwrap

    from tests.test_sweep import _run_two_processes

    script = textwrap.dedent(f"""
        import sys
        from jobs import cli
        pid, port = int(sys.argv[1]), int(sys.argv[2])
        out = {str(tmp_path)!r} + ("/ens" if pid == 0 else "/other")
        status = cli.main(["bag", "--ensemble", "2", "--resolution", "coarse", "--resume", {BAG_STATE!r},
                           "--until", "8.55", "--linear-solver", "dense", "--perturb", "1e-3", "--out", out,
                           "--coordinator", f"localhost:{{port}}", "--processes", "2", "--process-id", str(pid)])
        assert status == 0, status
        print("ok")
    """)
    _run_two_processes(script, dict(os.environ, JAX_PLATFORMS="cpu"))
    assert not (tmp_path / "other").exists()
    with open(tmp_path / "ens" / "summary.json") as f:
        s = json.load(f)
    assert s["processes"] == 2 and s["devices"] == 2 and s["failure"] is None
    base = dict(BASE, until=8.55)
    for j in (0, 1):
        single = run_bag(BagRunOptions(out=str(tmp_path / f"single{j}"), seed=j, **dict(base, perturb=1e-3 if j else 0)))
        with np.load(tmp_path / "ens" / f"member{j}" / "trajectory.npz") as a, \
                np.load(tmp_path / f"single{j}" / "trajectory.npz") as b:
            assert a["film"].shape == b["film"].shape == (13, 85, 3)
            tol = 4 * fp32_ulp(b["film"])
            assert np.abs(a["film"] - b["film"]).max() <= tol and np.abs(a["spheres"] - b["spheres"]).max() <= tol
        assert s["members"][j]["newton_iterations"] == single.summary["newton_iterations"]
        assert s["members"][j]["audit"]["frames_with_self_intersection"] == 0

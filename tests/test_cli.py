"""The README's main job runs end to end (tiny settings) and writes its outputs."""
import json

import numpy as np
import pytest

from jobs.cli import main


def test_drape_job_writes_trajectory_summary_snapshots_and_meshes(tmp_path, capsys):
    """`ipcjax drape` (tiny): trajectory and summary, PNGs of the first and last frames, and
    the mesh sequence (.vtu + frame.pvd, .obj) through scenes.outputs, and it says where."""
    import meshio

    out = tmp_path / "drape"
    rc = main(["drape", "--resolution", "4", "--steps", "3", "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["frames_with_self_intersection"] == 0
    traj = np.load(out / "trajectory.npz")
    assert traj["film"].shape == (4, 16, 3) and traj["faces"].shape == (18, 3)
    snaps = sorted(p.name for p in (out / "snapshots").iterdir())
    assert snaps == ["snapshot_00000.png", "snapshot_00003.png"]
    for name in snaps:
        assert (out / "snapshots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    meshes = sorted(p.name for p in (out / "meshes").iterdir())
    assert meshes == sorted([f"frame_{i:05d}.{e}" for i in range(4) for e in ("vtu", "obj")] + ["frame.pvd"])
    m = meshio.read(out / "meshes" / "frame_00003.vtu")
    np.testing.assert_allclose(m.points[:16], traj["film"][3], atol=1e-12)
    assert set(np.unique(m.point_data["body"])) == {0, 1}  # the film and the sphere
    assert (out / "meshes" / "frame.pvd").read_text().count("<DataSet") == 4
    assert summary["outputs"]["snapshots"] == ["snapshots/snapshot_00000.png", "snapshots/snapshot_00003.png"]
    assert summary["outputs"]["meshes"]["files"] == 9
    printed = capsys.readouterr().out
    for path in ("trajectory.npz", "summary.json", "snapshots/snapshot_00003.png", "meshes/frame.pvd"):
        assert str(out / path) in printed, path


def test_drape_mesh_every_zero_writes_no_meshes(tmp_path):
    out = tmp_path / "drape"
    assert main(["drape", "--resolution", "4", "--steps", "2", "--mesh-every", "0", "--out", str(out)]) == 0
    assert not (out / "meshes").exists() and len(list((out / "snapshots").iterdir())) == 2


def test_bag_job_records_its_solver_and_first_step(tmp_path):
    """`ipcjax bag` (coarse, 3 steps): the sparse linear solve by default, by the CHOLMOD
    custom call, the first step's wall (jit compilation) split off the rate, the Newton
    iterations by phase, no self-intersection."""
    out = tmp_path / "bag"
    rc = main(["bag", "--resolution", "coarse", "--until", str(3 / 240), "--out", str(out),
               "--mesh-every", "0", "--no-pictures"])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["linear_solver"] == "sparse" and s["steps_this_run"] == 3 and s["failure"] is None
    assert s["sparse_solve"] == "custom call"
    assert 0 < s["first_step_s"] < s["wall_s"]
    assert s["wall_s_per_simulated_s_after_first_step"] == pytest.approx(
        (s["wall_s"] - s["first_step_s"]) / (2 / 240))
    assert s["audit"]["frames_with_self_intersection"] == 0
    # the Newton iterations by phase add up to the total, one histogram entry per step
    (phase, d), = s["newton_iterations_by_phase"].items()
    assert phase == "place" and d["steps"] == 3 and d["iterations"] == s["newton_iterations"] > 0
    assert sum(d["histogram"].values()) == 3
    assert sum(int(k) * v for k, v in d["histogram"].items()) == d["iterations"]
    # the first step queries its candidates; the next ones start from the last step's set
    assert 1 <= s["candidate_queries"] < 3 + d["iterations"]
    with pytest.raises(SystemExit):
        main(["bag", "--linear-solver", "lu", "--out", str(out)])


def test_bag_run_records_its_protocol_and_parameters(tmp_path):
    """run_bag with the short protocol and another film (2 coarse steps): summary.json and
    state.npz name the protocol, the summary the film's E, μf and kθ scale, from Python
    (BagRunOptions.params) and from the command line's film flags alike. The result holds
    the run's end as state.npz does, its scene (at that E) and the measurements; the
    command's --perturb/--seed kick is recorded in summary.json."""
    from ipcjax.model import Params
    from scenes.bag_run import BagRunOptions, run_bag

    out = tmp_path / "short"
    res = run_bag(BagRunOptions(out=str(out), resolution="coarse", protocol="short", until=2 / 240, mesh_every=0,
                                pictures=False, progress=False, params=Params.film_defaults(youngs_modulus=630e6)))
    s = res.summary
    assert res.ok and s["protocol"] == "short" and s["steps_this_run"] == 2
    assert s["params"] == dict(youngs_modulus=630e6, friction=0.35, bending_scale=1.0)
    with np.load(out / "state.npz") as st:
        assert str(st["protocol"]) == "short"
        assert res.step == int(st["step"]) == 2 and float(res.state.t) == float(st["t"])
        assert np.array_equal(np.asarray(res.state.x), st["x"]) and np.array_equal(np.asarray(res.state.v), st["v"])
    assert float(res.scene.params.youngs_modulus) == 630e6 and res.measurements == s["measurements"]
    cli = tmp_path / "cli"
    assert res.summary["perturbation"] is None
    assert main(["bag", "--resolution", "coarse", "--protocol", "short", "--until", str(2 / 240), "--out", str(cli),
                 "--mesh-every", "0", "--no-pictures", "--youngs-modulus", "630e6", "--friction", "0.2",
                 "--bending-scale", "2", "--perturb", "0.05", "--seed", "3"]) == 0
    s = json.loads((cli / "summary.json").read_text())
    assert s["protocol"] == "short" and s["params"] == dict(youngs_modulus=630e6, friction=0.2, bending_scale=2.0)
    assert s["perturbation"]["rms_m_s"] == 0.05 and s["perturbation"]["seed"] == 3   # the start's kick


def test_help_lists_every_job_with_one_line_and_an_example(capsys):
    """`ipcjax --help`: each job, what it does and an example whose flags the job takes."""
    from jobs.cli import JOBS

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ipcjax JOB [options]")
    lines = out.splitlines()
    assert set(JOBS) == {"drape", "bag", "fit", "compare", "verlet"}
    for job, (_, what, example) in JOBS.items():
        i = next(k for k, ln in enumerate(lines) if ln.split()[:1] == [job])
        assert lines[i].split(None, 1)[1] == what and lines[i + 1].strip() == f"e.g. {example}"
        assert example.startswith(f"ipcjax {job}")
        with pytest.raises(SystemExit) as e:
            main([job, "--help"])
        assert e.value.code == 0
        options = capsys.readouterr().out
        for flag in (w for w in example.split() if w.startswith("--")):
            assert flag in options, (job, flag)


def test_no_job_or_an_unknown_one_is_an_error_with_the_usage(capsys):
    assert main(["nonsense"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ipcjax: error: no job 'nonsense'; choose one of drape, bag, fit, compare, verlet")
    assert "usage: ipcjax" in err and "e.g. ipcjax drape" in err
    assert main([]) == 2
    assert capsys.readouterr().err.startswith("usage: ipcjax")


def test_compare_job_on_two_run_folders(tmp_path):
    """`ipcjax compare --ipc A --vbd B` writes the table, JSON and picture (synthetic runs)."""
    from scenes.bag import bag_scene
    from tests.test_compare import ipc_summary, vbd_summary, write_run

    sc = bag_scene("coarse")
    ipc = write_run(tmp_path / "ipc", sc, 9, (2,), ipc_summary(9, 3.0))
    vbd = write_run(tmp_path / "vbd", sc, 11, (2,), vbd_summary(11, 2.0))
    out = tmp_path / "cmp"
    assert main(["compare", "--ipc", str(ipc), "--vbd", str(vbd), "--out", str(out)]) == 0
    data = json.loads((out / "comparison.json").read_text())
    assert data["instant_s"] == pytest.approx(8 / 240) and data["same_session"] is False
    assert "not measured by this command" in " ".join(data["notes"])
    assert "1 / 9" in (out / "comparison.md").read_text()
    assert (out / "comparison.png").exists()
    assert main(["compare", "--ipc", str(ipc), "--vbd", str(tmp_path / "nowhere"), "--out", str(out)]) == 2


def test_compare_job_needs_run_or_both_folders():
    with pytest.raises(SystemExit):
        main(["compare", "--ipc", "runs/x"])
    with pytest.raises(SystemExit):
        main(["compare", "--run", "--ipc", "runs/x", "--vbd", "runs/y"])


def test_fit_rejects_incomplete_or_bad_targets_before_compiling(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--neck-x", "0.038"])
    assert "give all three of --neck-x, --neck-y and --flap" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fit", "--neck-x", "nan", "--neck-y", "0.037", "--flap", "0.018"])
    assert "targets must be finite" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fit", "--scene", "cantilever", "--param", "friction"])
    assert "no contact" in capsys.readouterr().err


@pytest.mark.slow
def test_fit_default_recovers_each_pouch_parameter_from_two_times_off(tmp_path):
    out = tmp_path / "fit"
    assert main(["fit", "--quiet", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["scene"] == "pouch" and s["synthetic"]
    assert [f["params"] for f in s["fits"]] == [["youngs_modulus"], ["friction"], ["bending_scale"]]
    for f in s["fits"]:
        (err,) = f["relative_error"].values()
        assert err < 0.01, f
    assert len(s["jacobian_mm_per_log"]["singular_values"]) == 3


BAG_STATE = "tests/data/bag_coarse_8p50.npz"  # a coarse `ipcjax bag` state at 8.50 s (tying)


def test_fit_bag_needs_a_readable_bag_state(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--scene", "bag", "--window", "4"])
    assert "--scene bag --window needs --state" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fit", "--scene", "bag", "--state", str(tmp_path / "none.npz"), "--window", "4"])
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fit", "--scene", "bag", "--state", BAG_STATE, "--window", "0"])
    assert "--window must be ≥ 1" in capsys.readouterr().err
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((3, 3)))
    assert main(["fit", "--scene", "bag", "--state", str(bad), "--window", "4", "--quiet",
                 "--out", str(tmp_path / "o")]) == 1
    assert "not an `ipcjax bag` state file: missing v, t, step, resolution" in capsys.readouterr().err
    # the rest-shape fit (no --window) reads its start state before any run starts
    assert main(["fit", "--scene", "bag", "--state", str(bad), "--quiet", "--out", str(tmp_path / "o")]) == 2
    assert "not an `ipcjax bag` state file: missing v, t, step, resolution" in capsys.readouterr().err
    assert main(["fit", "--scene", "bag", "--state", str(tmp_path / "none.npz"), "--quiet"]) == 2
    assert "none.npz" in capsys.readouterr().err


@pytest.mark.slow
def test_fit_bag_window_moves_youngs_modulus_towards_the_truth(tmp_path):
    """Synthetic targets from the reference window; E from 2× off on the coarse bag.

    The window is four steps of tying, where pleats snap and contacts switch: the
    measurements are a rough function of E (docs/differentiation.md), so this checks that
    the gradients drive the fit most of the way, not a 1% recovery (the pouch's test)."""
    out = tmp_path / "fitbag"
    assert main(["fit", "--scene", "bag", "--state", BAG_STATE, "--window", "4", "--param", "youngs_modulus",
                 "--iterations", "8", "--quiet", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["scene"] == "bag" and s["resolution"] == "coarse" and s["window"]["steps"] == 4
    assert s["window"]["phases"] == ["tie"]
    J = np.asarray(s["jacobian_mm_per_log"]["J"])
    assert np.all(np.abs(J[:, 0]) > 0), "neck and flap respond to E"
    (f,) = s["fits"]
    h = json.loads((out / "fit_youngs_modulus.json").read_text())["history"]
    assert f["final_loss"] < 0.05 * h[0]["loss"], f
    assert f["relative_error"]["youngs_modulus"] < 0.15, f  # from 1.0 (2× off)

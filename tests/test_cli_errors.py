"""Bad command-line input: one line on stderr, exit status 2, before anything is simulated.

Every case here must fail before the first step: ``advance`` is replaced by a function
that fails the test, so a check that came after the simulation started would show.
"""
import json
import re
import time

import numpy as np
import pytest

from ipcjax import runfolder
from jobs.cli import main

BAG_STATE = "tests/data/bag_coarse_8p50.npz"  # a coarse `ipcjax bag` state at 8.50 s
# generous for a loaded 2-core machine: the point is "before compiling" (a first step
# compiles for 60-100 s); the bag cases include building the scene (~1.5 s)
QUICK_S = 10.0


@pytest.fixture(autouse=True)
def no_simulation(monkeypatch):
    def advance(*a, **k):
        raise AssertionError("the job started simulating before refusing its input")
    monkeypatch.setattr("ipcjax.step.advance", advance)
    monkeypatch.setattr("ipcjax.ensemble.ensemble_rollout", advance)


def refused(capsys, argv, *expect):
    """Run ``ipcjax ARGV``; assert status 2, one stderr line naming the job and containing
    each of ``expect``, no traceback, and that it took less than QUICK_S."""
    capsys.readouterr()
    t0 = time.perf_counter()
    rc = main(argv)
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    (line,) = lines
    assert line.startswith(f"ipcjax {argv[0]}: error: "), line
    for e in expect:
        assert e in line, line
    assert took < QUICK_S, f"{took:.1f} s"
    return line


# --------------------------------------------------------------------------- drape

@pytest.mark.parametrize("flags, expect", [
    (["--steps", "0"], "--steps must be ≥ 1; got 0"),
    (["--steps", "-3"], "--steps must be ≥ 1"),
    (["--resolution", "1"], "--resolution must be ≥ 2"),
    (["--mesh-every", "-1"], "--mesh-every must be ≥ 0; got -1"),
    (["--size", "0"], "--size must be a finite number > 0"),
    (["--size", "nan"], "--size must be a finite number > 0; got nan"),
    (["--radius", "-0.02"], "--radius must be a finite number > 0"),
    (["--radius", "inf"], "--radius must be a finite number > 0; got inf"),
])
def test_drape_refuses_out_of_range_flags(capsys, tmp_path, flags, expect):
    refused(capsys, ["drape", *flags, "--out", str(tmp_path / "d")], expect)
    assert not (tmp_path / "d").exists(), "nothing is written for a refused job"


def test_drape_refuses_an_unwritable_out_folder_before_simulating(capsys):
    refused(capsys, ["drape", "--resolution", "4", "--steps", "2", "--out", "/proc/ipcjax-test/x"],
            "cannot write the run folder '/proc/ipcjax-test/x'")


def test_out_that_is_a_file_is_refused(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("not a folder")
    refused(capsys, ["drape", "--out", str(f)], "cannot write the run folder", str(f))


# --------------------------------------------------------------------------- bag

@pytest.mark.parametrize("flags, expect", [
    (["--until", "-1"], "--until must be a finite number > 0; got -1.0"),
    (["--until", "0"], "--until must be a finite number > 0"),
    (["--until", "nan"], "--until must be a finite number > 0; got nan"),
    (["--save-every", "0"], "--save-every must be ≥ 1"),
    (["--checkpoint-every", "0"], "--checkpoint-every must be ≥ 1"),
    (["--mesh-every", "-1"], "--mesh-every must be ≥ 0"),
    (["--youngs-modulus", "0"], "--youngs-modulus must be a finite number > 0 Pa; got 0.0"),
    (["--friction", "-0.1"], "--friction must be a finite number ≥ 0; got -0.1"),
    (["--bending-scale", "nan"], "--bending-scale must be a finite number ≥ 0; got nan"),
    (["--perturb", "-0.1"], "--perturb must be a finite speed ≥ 0 m/s; got -0.1"),
    (["--perturb", "inf"], "--perturb must be a finite speed ≥ 0 m/s; got inf"),
    (["--seed", "3"], "--seed chooses the kick of --perturb V > 0; without one it would change nothing"),
    (["--ensemble", "0", "--linear-solver", "dense"], "--ensemble needs an integer number of members ≥ 1; got 0"),
    (["--ensemble", "2", "--perturb", "0.1"], "--ensemble runs its linear solve inside XLA: give --linear-solver "
                                              "dense (or cg)"),
    (["--ensemble", "2", "--linear-solver", "dense"], "--ensemble 2 without --perturb V (or parameter sets) would "
                                                      "run 2 identical bags"),
    (["--ensemble", "2", "--linear-solver", "dense", "--perturb", "0.1", "--mesh-every", "0", "--no-pictures"],
     "--ensemble writes no checkpoints, meshes or pictures; drop --mesh-every, --no-pictures"),
])
def test_bag_refuses_out_of_range_flags(capsys, tmp_path, flags, expect):
    refused(capsys, ["bag", "--resolution", "coarse", *flags, "--out", str(tmp_path / "b")], expect)
    assert not (tmp_path / "b").exists(), "no run folder from zero steps"


def test_bag_refuses_an_end_time_with_no_step_to_run(capsys, tmp_path):
    refused(capsys, ["bag", "--resolution", "coarse", "--until", "0.001", "--out", str(tmp_path / "b")],
            "--until 0.001 s leaves no step to run after t = 0.0000 s")
    refused(capsys, ["bag", "--resolution", "coarse", "--resume", BAG_STATE, "--until", "8",
                     "--out", str(tmp_path / "b")], "--until 8 s leaves no step to run after t = 8.5000 s")
    refused(capsys, ["bag", "--resolution", "coarse", "--resume", BAG_STATE, "--until", "8", "--ensemble", "2",
                     "--linear-solver", "dense", "--perturb", "0.1", "--out", str(tmp_path / "b")],
            "--until 8 s leaves no step to run after t = 8.5000 s")
    assert not (tmp_path / "b").exists()


def state_arrays():
    with np.load(BAG_STATE) as z:
        return {k: z[k] for k in z.files}


def bad_state(tmp_path, name, **change):
    """BAG_STATE with keys replaced (a value of None drops the key), saved as NAME."""
    d = state_arrays()
    for k, v in change.items():
        if v is None:
            del d[k]
        else:
            d[k] = v
    path = tmp_path / name
    np.savez(path, **d)
    return path


def x_with_nan():
    x = state_arrays()["x"].copy()
    x[5, 2] = np.nan
    return x


def corrupt(tmp_path):
    p = tmp_path / "corrupt.npz"
    p.write_bytes(b"not an npz\n" * 20)
    return p


def truncated(tmp_path):
    p = tmp_path / "truncated.npz"
    data = open(BAG_STATE, "rb").read()
    p.write_bytes(data[: len(data) // 2])
    return p


def only_x(tmp_path):
    p = tmp_path / "only_x.npz"
    np.savez(p, x=state_arrays()["x"])
    return p


def object_array(tmp_path):
    p = tmp_path / "object.npz"
    np.savez(p, x=np.array([None, 1.0], dtype=object))
    return p


def single_npy(tmp_path):
    p = tmp_path / "x.npy"
    np.save(p, state_arrays()["x"])
    return p


def empty(tmp_path):
    p = tmp_path / "empty.npz"
    p.write_bytes(b"")
    return p


RESUME_CASES = {
    "missing": (lambda p: p / "nowhere.npz", "nowhere.npz: no such file"),
    "corrupt": (corrupt, "not an .npz file"),
    "truncated": (truncated, "unreadable or corrupt .npz"),
    "empty": (empty, "unreadable or corrupt .npz"),
    "object arrays": (object_array, "holds object arrays, which only pickle could read"),
    "single .npy": (single_npy, "a single .npy array, not an .npz archive"),
    "only x": (only_x, "not an `ipcjax bag` state file: missing v, t, step, unfold_checked, resolution"),
    "wrong-shaped x": (lambda p: bad_state(p, "short.npz", x=state_arrays()["x"][:100]),
                       "x has shape (100, 3); this scene needs (518, 3)"),
    "flat x": (lambda p: bad_state(p, "flat.npz", x=state_arrays()["x"].ravel()),
               "x has shape (1554,)"),
    "non-finite x": (lambda p: bad_state(p, "nan.npz", x=x_with_nan()), "x is not finite (1 of its 1554 values)"),
    "text x": (lambda p: bad_state(p, "text.npz", x=np.full((518, 3), "a")), "x holds <U1 values"),
    "non-finite t": (lambda p: bad_state(p, "t.npz", t=np.float64(np.inf)), "t is not finite"),
    "step against t": (lambda p: bad_state(p, "step.npz", step=np.int64(7)), "step 7 does not match t = 8.5"),
    "missing capture": (lambda p: bad_state(p, "cap.npz", **{"capture_tie": None, "capture_cinch": None}),
                        "missing capture_cinch, capture_tie"),
    "wrong-shaped capture": (lambda p: bad_state(p, "capshape.npz", capture_lift=np.zeros((3, 3))),
                             "capture 'lift' has shape (3, 3)"),
    "other resolution": (lambda p: bad_state(p, "full.npz", resolution=np.str_("full")),
                         "the state is for resolution 'full', not 'coarse'"),
}


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_bag_resume_refuses_a_bad_state_file_before_anything_runs(capsys, tmp_path, case):
    make, expect = RESUME_CASES[case]
    path = make(tmp_path)
    out = tmp_path / "run"
    refused(capsys, ["bag", "--resolution", "coarse", "--resume", str(path), "--out", str(out)],
            f"--resume {path}", expect)
    assert not out.exists(), "a refused resume writes nothing"


def test_bag_resume_refuses_a_corrupt_trajectory_in_its_out_folder(capsys, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "trajectory.npz").write_bytes(b"garbage")
    refused(capsys, ["bag", "--resolution", "coarse", "--resume", BAG_STATE, "--out", str(out)],
            f"--out holds {out / 'trajectory.npz'}")
    np.savez(out / "trajectory.npz", film=np.zeros((2, 9, 3)), spheres=np.zeros((2, 7, 3)), time=np.zeros(2))
    refused(capsys, ["bag", "--resolution", "coarse", "--resume", BAG_STATE, "--out", str(out)],
            "this scene needs (T, 85, 3)")


def test_bag_resume_refuses_a_state_of_the_other_protocol_after_they_part(capsys, tmp_path):
    """BAG_STATE (8.50 s, written before states named their protocol: the full one) cannot
    continue the short protocol; a state from before 6.05 s, where both are the same, can."""
    from scenes.bag import SHARED_UNTIL, bag_scene
    from scenes.bag_run import read_bag_state, write_state

    refused(capsys, ["bag", "--resolution", "coarse", "--protocol", "short", "--resume", BAG_STATE,
                     "--out", str(tmp_path / "b")],
            "the state is of the 'full' protocol at t = 8.5000 s; the 'short' protocol departs from it after 6.05 s")
    assert not (tmp_path / "b").exists()
    d = state_arrays()
    step = int(round(SHARED_UNTIL / (1 / 240)))
    caps = {k: v for k, v in d.items() if k.startswith("capture_") and k[8:] in ("place", "lift", "neck", "unfold")}
    early = tmp_path / "early.npz"
    write_state(early, d["x"], d["v"], step / 240, step=step, unfold_checked=True, resolution="coarse",
                captures=caps, protocol="full")
    sc = bag_scene("coarse", protocol="short")
    assert float(read_bag_state(early, sc, "coarse")["t"]) == pytest.approx(SHARED_UNTIL)


def test_the_reference_state_passes_the_checks():
    """The state the checks are made against is itself accepted (no false refusals)."""
    from scenes.bag import bag_scene
    from scenes.bag_run import read_bag_state

    sc = bag_scene("coarse")
    rs = read_bag_state(BAG_STATE, sc, "coarse")
    assert int(rs["step"]) == 2040 and "tie" in sc.choreography.captures


def test_write_state_round_trips_through_read_state(tmp_path):
    from scenes.bag_run import read_state, write_state

    d = state_arrays()
    caps = {k: v for k, v in d.items() if k.startswith("capture_")}
    path = tmp_path / "state.npz"
    write_state(path, d["x"], d["v"], d["t"], step=d["step"], unfold_checked=d["unfold_checked"],
                resolution="coarse", captures=caps)
    rs = read_state(path, len(d["x"]), "coarse")
    assert sorted(rs.files) == sorted({*d, "protocol"}) and str(rs["protocol"]) == "full"
    for k in d:
        np.testing.assert_array_equal(rs[k], d[k])
        assert rs[k].dtype == d[k].dtype, k


# --------------------------------------------------------------------------- fit

@pytest.fixture
def fits(monkeypatch):
    """Each fit job replaced by one that records its arguments and returns a minimal record
    (what jobs/fit.py prints and reads): nothing is fitted or compiled."""
    calls = []

    def fake(name, record):
        def job(*args, **kwargs):
            calls.append((name, args, kwargs))
            return record
        return job

    for name, record in FIT_RECORDS.items():
        module = "bag_rest_fit" if name == "fit_bag_rest" else "rollout_fit"
        monkeypatch.setattr(f"fitting.{module}.{name}", fake(name, record))
    return calls


FIT_RECORDS = {"fit_bag_rest": dict(fitted={"youngs_modulus": 3e8}, failed=None, outside_reach=None, misfit=None, history_bias=None),
               "fit_pouch": dict(fits=[]), "fit_bag_state": dict(fits=[]), "fit_cantilever": dict(fitted=1.0)}


def fit_refused(capsys, argv):
    """``ipcjax fit ARGV`` refused by its parser: status 2 before anything runs; the error line."""
    capsys.readouterr()
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        main(["fit", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: ipcjax fit") and "Traceback" not in err, err
    assert time.perf_counter() - t0 < QUICK_S
    return err.strip().splitlines()[-1]


def test_bag_fit_refuses_a_kick_without_an_ensemble(capsys, fits):
    """--perturb kicks the ensemble's runs 1 … K − 1: with one run per node it would do
    nothing, so it is refused, not ignored; with --runs-per-node 2 it reaches the options."""
    from jobs import fit

    line = fit_refused(capsys, ["--scene", "bag", "--perturb", "0.1"])
    assert line.endswith("--perturb kicks the runs 1 … K − 1 of --runs-per-node K; with one run per node there "
                         "is none to kick")
    assert fit.run(["--scene", "bag", "--runs-per-node", "2", "--perturb", "0.1", "--quiet"]) == 0
    ((_, args, _),) = fits
    assert args[-1].runs_per_node == 2 and args[-1].perturb == 0.1


POUCH, REST, WINDOW = "--scene pouch (the pouch fit)", "--scene bag without --window", "--scene bag --window K"


@pytest.mark.parametrize("argv, line", [
    (["--pair", "youngs_modulus,friction"], f"{POUCH}: not --pair, which is only for {REST} (the rest-shape fit)"),
    (["--pai", "youngs_modulus,friction"], f"{POUCH}: not --pair, which is only for {REST} (the rest-shape fit)"),
    (["--scene", "cantilever", "--window", "3"],
     f"--scene cantilever (the cantilever fit): not --window, which is only for {WINDOW} (the bag window fit)"),
    (["--scene", "bag", "--lr", "0.2"],
     f"{REST} (the rest-shape fit): not --lr, which is only for --scene cantilever (the cantilever fit)"),
    (["--scene", "bag", "--joint"],
     f"{REST} (the rest-shape fit): not --joint, which is only for --scene pouch and {WINDOW}"),
    (["--scene", "bag", "--window", "4", "--state", BAG_STATE, "--synthetic"],
     f"{WINDOW} (the bag window fit): not --synthetic, which is only for {REST} (the rest-shape fit)"),
    (["--scene", "cantilever", "--neck-x-mm", "38.83", "--neck-y-mm", "37.2", "--flap-mm", "18.43", "--state=s.npz"],
     f"--scene cantilever (the cantilever fit): not --neck-x-mm, --neck-y-mm, --flap-mm, which are only for "
     f"--scene pouch, {REST} and {WINDOW}; not --state, which is only for {REST} and {WINDOW}"),
    (["--target", "0.01", "--steps", "3"],
     f"{POUCH}: not --target, --steps, which are only for --scene cantilever (the cantilever fit)"),
    (["--scene", "bag", "--bogus", "1"], "unrecognized arguments: --bogus 1"),
    (["--s", "bag"],
     "ambiguous option: --s could match --scene, --start, --start-factor, --state, --steps, --synthetic"),
    (["--scene", "cantilever", "--param", "friction"],
     "argument --param: the cantilever has no contact: friction cannot be fitted there"),
])
def test_fit_refuses_a_flag_of_another_fit_job_naming_the_job_that_takes_it(capsys, fits, argv, line):
    assert fit_refused(capsys, argv) == f"ipcjax fit: error: {line}"
    assert fits == [], "nothing is fitted"


def listed(help_text):
    """The flags a parser's --help lists in its options."""
    return set(re.findall(r"^  (--[\w-]+)", help_text, re.MULTILINE))


@pytest.mark.parametrize("argv, own, others", [
    ([], {"--scene", "--param", "--joint", "--start", "--start-factor", "--targets", "--neck-x", "--flap-mm",
          "--iterations", "--quiet", "--out"}, {"--pair", "--window", "--state", "--lr", "--synthetic", "--target"}),
    (["--scene", "bag"], {"--scene", "--state", "--pair", "--synthetic", "--lattice-step", "--noise", "--model-scatter",
                          "--workers", "--param", "--start-factor", "--neck-y-mm"}, {"--joint", "--window", "--lr"}),
    (["--scene", "bag", "--window", "4"], {"--scene", "--window", "--state", "--joint", "--param", "--targets"},
     {"--pair", "--synthetic", "--workers", "--lr", "--steps"}),
    (["--scene", "cantilever"], {"--scene", "--param", "--start", "--target", "--steps", "--lr", "--iterations"},
     {"--targets", "--neck-x", "--start-factor", "--joint", "--pair", "--window", "--state"}),
])
def test_each_fit_job_helps_with_its_own_flags_only(capsys, fits, argv, own, others):
    with pytest.raises(SystemExit) as e:
        main(["fit", *argv, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and fits == []
    assert own <= listed(out) and not others & listed(out), sorted(listed(out))
    jobs = {"ipcjax fit --help", "ipcjax fit --scene bag --help", "ipcjax fit --scene bag --window K --help",
            "ipcjax fit --scene cantilever --help"}  # each help names the other three
    this = " ".join(["ipcjax fit", *argv, "--help"]).replace("--window 4", "--window K")
    assert {job for job in jobs if job in " ".join(out.split())} == jobs - {this}


def test_fit_help_gives_each_job_its_defaults_and_choices(capsys):
    helps = {}
    for scene in ("pouch", "bag", "cantilever"):
        with pytest.raises(SystemExit):
            main(["fit", "--scene", scene, "--help"])
        helps[scene] = " ".join(capsys.readouterr().out.split())
    assert "--start-factor START_FACTOR otherwise start at this × the film default (default 2)" in helps["pouch"]
    assert "(default 1)" in helps["bag"] and "maximum iterations (default 30)" in helps["bag"]
    assert "--param {bending_scale,youngs_modulus,thickness}" in helps["cantilever"]
    assert "maximum iterations (default 80)" in helps["cantilever"]
    assert "--param {youngs_modulus,friction,bending_scale}" in helps["pouch"]


def test_each_fit_job_builds_the_options_it_built_with_one_parser(capsys, fits, tmp_path):
    """Valid commands of the four jobs give the options and arguments the single parser of
    before gave (checked against it command by command when the parsers were split)."""
    from fitting.bag_rest import SPEC_TARGETS
    from fitting.bag_rest_fit import BagFitOptions
    from fitting.rollout_fit import ShapeFitOptions
    from fitting.smoothing import DEFAULT_STEP
    from jobs import fit

    out = str(tmp_path / "o")
    mm = ["--neck-x-mm", "38.83", "--neck-y-mm", "37.20", "--flap-mm", "18.43"]
    cases = [
        ([], "fit_pouch", ("runs/fit", None, ShapeFitOptions()), {}),
        (["--joint", "--start-factor", "3", "--iterations", "5", "--quiet", "--out", out, *mm], "fit_pouch",
         (out, np.asarray(SPEC_TARGETS),
          ShapeFitOptions(joint=True, start_factor=3.0, iterations=5, progress=False)), {}),
        (["--scene", "pouch", "--param", "friction", "--start", "0.3"], "fit_pouch",
         ("runs/fit", None, ShapeFitOptions(param="friction", start=0.3)), {}),
        (["--scene", "bag"], "fit_bag_rest", ("runs/fit", SPEC_TARGETS, BagFitOptions()), {}),
        (["--scene", "bag", "--pair", "youngs_modulus,friction", "--synthetic", "--model-scatter", "1.5,2.5,0.5",
          "--lattice-step", "0.3", "--noise", "0.7", "--workers", "2", "--state", BAG_STATE, "--start-factor", "2",
          "--iterations", "4", "--quiet", "--out", out, "--bag-scatter", "4,3,5"], "fit_bag_rest",
         (out, None, BagFitOptions(names=("youngs_modulus", "friction"), start=BAG_STATE, start_factor=2.0,
                                   iterations=4, step=0.3, noise_mm=0.7, model_scatter_mm=(1.5, 2.5, 0.5),
                                   bag_scatter_mm=(4.0, 3.0, 5.0), workers=2, progress=False)), {}),
        (["--scen", "bag", "--synth", "--param", "bending_scale", "--start", "1.5", "--quie"], "fit_bag_rest",
         ("runs/fit", None, BagFitOptions(names=("bending_scale",), start_value=1.5, progress=False)), {}),
        (["--scene", "bag", "--state", BAG_STATE, "--window", "4"], "fit_bag_state",
         ("runs/fit", BAG_STATE, 4, None, ShapeFitOptions()), {}),
        (["--scene", "bag", "--state", BAG_STATE, "--window=6", "--param", "youngs_modulus", "--start", "2e8",
          "--iterations", "8", "--quiet", "--out", out, *mm], "fit_bag_state",
         (out, BAG_STATE, 6, np.asarray(SPEC_TARGETS), ShapeFitOptions(param="youngs_modulus", start=2e8,
                                                                       iterations=8, progress=False)), {}),
        (["--scene", "cantilever"], "fit_cantilever", ("runs/fit", "bending_scale"),
         dict(target=None, start=None, steps=6, iterations=80, lr=0.1, progress=True)),
        (["--scene", "cantilever", "--param", "thickness", "--target", "0.01", "--steps", "3", "--iterations", "5",
          "--lr", "0.2", "--start", "1e-4", "--quiet", "--out", out], "fit_cantilever", (out, "thickness"),
         dict(target=0.01, start=1e-4, steps=3, iterations=5, lr=0.2, progress=False)),
    ]
    assert BagFitOptions().step == DEFAULT_STEP and BagFitOptions().start_factor == 1.0
    capsys.readouterr()
    for argv, name, args, kwargs in cases:
        fits.clear()
        assert fit.run(argv) == 0, argv
        assert json.loads(capsys.readouterr().out) == FIT_RECORDS[name], argv  # the record, printed
        ((called, got_args, got_kwargs),) = fits
        assert called == name and got_kwargs == kwargs, argv
        assert len(got_args) == len(args), argv
        for got, want in zip(got_args, args):
            if isinstance(want, np.ndarray):
                np.testing.assert_allclose(got, want, rtol=1e-12)
            else:
                assert got == want and type(got) is type(want), (argv, got, want)
        for options in got_args[-1:]:
            if isinstance(options, tuple):
                assert [type(v) for v in options] == [type(v) for v in args[-1]], argv


# --------------------------------------------------------------------------- compare

@pytest.mark.parametrize("flags, expect", [
    (["--ipc", "{tmp}", "--vbd", "{tmp}", "--at", "-1"], "--at must be a finite time ≥ 0 s; got -1.0"),
    (["--ipc", "{tmp}", "--vbd", "{tmp}", "--at", "nan"], "--at must be a finite time ≥ 0 s; got nan"),
    (["--run", "--until", "0"], "--until must be a finite number > 0; got 0.0"),
    (["--run", "--until=-inf"], "--until must be a finite number > 0"),
    (["--ipc", "{tmp}/nowhere", "--vbd", "{tmp}"], "nowhere: no such folder"),
    (["--ipc", "{tmp}", "--vbd", "{tmp}"], "no trajectory.npz"),
    (["--ipc", "{tmp}", "--vbd", "{tmp}", "--protocol", "short"], "--protocol chooses what --run runs"),
])
def test_compare_refuses_bad_flags_and_folders(capsys, tmp_path, flags, expect):
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    refused(capsys, ["compare", *flags, "--out", str(tmp_path / "cmp")], expect)


def test_compare_refuses_an_unwritable_out_folder(capsys, tmp_path):
    refused(capsys, ["compare", "--ipc", str(tmp_path), "--vbd", str(tmp_path), "--out", "/proc/ipcjax-test"],
            "cannot write the run folder")


# --------------------------------------------------------------------------- main

def test_usage_errors_show_a_traceback_only_when_asked(monkeypatch, capsys):
    monkeypatch.setenv("IPCJAX_TRACEBACK", "1")
    with pytest.raises(ValueError, match="--steps must be ≥ 1"):
        main(["drape", "--steps", "0"])


def test_a_system_oserror_names_its_file(monkeypatch, capsys, tmp_path):
    def deny(out):
        raise PermissionError(13, "Permission denied", str(tmp_path / "x"))
    monkeypatch.setattr(runfolder, "prepare", deny)
    line = refused(capsys, ["drape", "--out", str(tmp_path / "x")])
    assert line == f"ipcjax drape: error: {tmp_path / 'x'}: Permission denied"


# --------------------------------------------------------------------------- JSON

def test_dumps_writes_strict_json():
    def no_constants(name):
        raise AssertionError(f"{name} in the JSON")

    obj = {"inf": np.inf, "ninf": -np.inf, "nan": float("nan"), "f32": np.float32(0.5), "i64": np.int64(7),
           "b": np.bool_(True), "a": np.array([[1.0, np.nan], [np.inf, 2.0]]), "ai": np.arange(3),
           "t": (np.float64(1.5), None), 3: "int key"}
    back = json.loads(runfolder.dumps(obj), parse_constant=no_constants)
    assert back == {"inf": None, "ninf": None, "nan": None, "f32": 0.5, "i64": 7, "b": True,
                    "a": [[1.0, None], [None, 2.0]], "ai": [0, 1, 2], "t": [1.5, None], "3": "int key"}


def test_write_json_writes_what_it_returns(tmp_path):
    path = tmp_path / "s.json"
    text = runfolder.write_json(path, {"min_gap_m": np.inf})
    assert path.read_text() == text + "\n"
    assert json.loads(text) == {"min_gap_m": None}


def test_compare_names_a_corrupt_trajectory_in_one_line(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trajectory.npz").write_bytes(b"garbage")
    refused(capsys, ["compare", "--ipc", str(run), "--vbd", str(run), "--out", str(tmp_path / "cmp")],
            str(run / "trajectory.npz"), "not an .npz file")
    np.savez(run / "trajectory.npz", film=np.zeros((2, 9, 3)), spheres=np.zeros((3, 7, 3)), time=np.zeros(2))
    refused(capsys, ["compare", "--ipc", str(run), "--vbd", str(run), "--out", str(tmp_path / "cmp")],
            str(run / "trajectory.npz"), "of one length")


def test_an_unknown_xla_threads_setting_is_refused(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("IPCJAX_XLA_THREADS", "many")
    refused(capsys, ["drape", "--out", str(tmp_path / "d")], "IPCJAX_XLA_THREADS='many'", "'single'", "'default'")
    assert not (tmp_path / "d").exists()

"""The fit jobs (fitting/targets.py, fitting/rollout_fit.py, fitting/bag_rest_fit.py): input
mistakes caught before any compilation, and the default pouch fit compiled once for all
three parameters."""
import json
import time

import numpy as np
import pytest

from fitting import bag_rest_fit, rollout_fit
from fitting.targets import FlagError, load_targets, targets_from
from jobs.cli import main
from tests.test_fitting import compilations_of, xla_compilations


@pytest.fixture
def no_fit(monkeypatch):
    """Make any fit job fail loudly: the tests below must stop before one starts."""
    def refuse(*a, **k):
        raise AssertionError("a fit job started (and would compile) despite a bad input")

    for module, job in ((rollout_fit, "fit_pouch"), (rollout_fit, "fit_bag"), (bag_rest_fit, "fit_bag_rest"),
                        (rollout_fit, "fit_cantilever")):
        monkeypatch.setattr(module, job, refuse)


def _write(path, text):
    path.write_text(text)
    return str(path)


def test_targets_file_mistakes_each_give_one_error_naming_the_file(tmp_path):
    missing = str(tmp_path / "none.json")
    with pytest.raises(FileNotFoundError, match=f"targets file {missing}: no such file"):
        load_targets(missing)
    bad = _write(tmp_path / "bad.json", '{"neck_x_m": 0.03,')
    with pytest.raises(ValueError, match=f"targets file {bad}: not valid JSON"):
        load_targets(bad)
    lst = _write(tmp_path / "list.json", "[0.03, 0.016, 0.0076]")
    with pytest.raises(ValueError, match=f"targets file {lst}: expected a JSON object .* got a JSON list"):
        load_targets(lst)
    partial = _write(tmp_path / "partial.json", '{"neck_x_m": 0.03, "neck_y_m": 0.016}')
    with pytest.raises(ValueError, match="needs neck_x_m, neck_y_m, flap_m .* missing 'flap_m'"):
        load_targets(partial)
    text = _write(tmp_path / "text.json", '{"neck_x_m": "wide", "neck_y_m": 0.016, "flap_m": 0.007}')
    with pytest.raises(ValueError, match=f"targets file {text}: targets must be three numbers"):
        load_targets(text)
    neg = _write(tmp_path / "neg.json", '{"neck_x_m": -0.03, "neck_y_m": 0.016, "flap_m": 0.007}')
    with pytest.raises(ValueError, match="finite with positive neck widths"):
        load_targets(neg)
    nan = _write(tmp_path / "nan.json", '{"neck_x_m": NaN, "neck_y_m": 0.016, "flap_m": 0.007}')
    with pytest.raises(ValueError, match="finite with positive neck widths"):
        load_targets(nan)
    width = _write(tmp_path / "width.json", '{"neck_width_mm": 31.8, "flap_height_mm": 7.6}')
    with pytest.raises(ValueError, match=r"neck_width_mm must be \[x, y\] in mm"):
        load_targets(width)


def test_targets_file_in_metres_or_as_a_bag_summary(tmp_path):
    m = _write(tmp_path / "m.json", '{"neck_x_m": 0.0318, "neck_y_m": 0.0159, "flap_m": 0.0076}')
    np.testing.assert_allclose(load_targets(m), [0.0318, 0.0159, 0.0076])
    bag = _write(tmp_path / "summary.json", json.dumps(
        {"measurements": {"neck_width_mm": [31.8, 15.9], "flap_height_mm": 7.6}, "wall_s": 1.0}))
    np.testing.assert_allclose(load_targets(bag), [0.0318, 0.0159, 0.0076])


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ('{"neck_x_m": 0.03,', "not valid JSON"),
    ("[0.03, 0.016, 0.0076]", "got a JSON list"),
])
def test_cli_fit_targets_mistake_is_one_line_with_status_2_before_compiling(tmp_path, capsys, no_fit, content,
                                                                             message):
    path = tmp_path / "targets.json"
    if content is not None:
        path.write_text(content)
    t0 = time.perf_counter()
    assert main(["fit", "--targets", str(path), "--quiet", "--out", str(tmp_path / "out")]) == 2
    assert time.perf_counter() - t0 < 5.0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ipcjax fit: error: targets file {path}: "), err
    assert message in err[0]


def test_shape_fit_options_are_checked_before_any_compilation(tmp_path):
    with pytest.raises(ValueError, match="param must be one of"):
        rollout_fit.ShapeFitOptions(param="thickness").groups()
    with pytest.raises(ValueError, match="leave out param"):
        rollout_fit.ShapeFitOptions(param="friction", joint=True).groups()
    with pytest.raises(ValueError, match="start_factor must be > 0"):
        rollout_fit.ShapeFitOptions(start_factor=0.0).groups()
    with pytest.raises(ValueError, match="start must be > 0"):
        rollout_fit.ShapeFitOptions(param="friction", start=-0.3).groups()
    with pytest.raises(ValueError, match="iterations must be a positive integer"):
        rollout_fit.ShapeFitOptions(iterations=0).groups()
    assert rollout_fit.ShapeFitOptions().groups() == [["youngs_modulus"], ["friction"], ["bending_scale"]]
    assert rollout_fit.ShapeFitOptions(joint=True).groups() == [list(rollout_fit.POUCH_PARAMS)]
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="targets: targets must be finite"):
        rollout_fit.fit_pouch(str(tmp_path / "o"), targets=[0.03, np.inf, 0.007])
    with pytest.raises(ValueError, match="start must be > 0"):
        rollout_fit.fit_cantilever(str(tmp_path / "o"), start=0.0)
    assert time.perf_counter() - t0 < 5.0


def test_bag_fit_defaults_to_e_against_the_specification_from_the_tie_checkpoint(tmp_path, monkeypatch):
    """``ipcjax fit --scene bag``: E, the specification's targets, the tie checkpoint; the
    exit status is 1 when no value was fitted (outside the model's reach or failed)."""
    from fitting.bag_rest import SPEC_TARGETS
    from fitting.smoothing import DEFAULT_STEP

    seen = {}

    def fake(out, targets, options):
        seen.update(out=out, targets=targets, options=options)
        return dict(fitted=None, failed=None, outside_reach="no youngs_modulus in [a, b] brings the neck …", misfit=None, history_bias=None)

    monkeypatch.setattr(bag_rest_fit, "fit_bag_rest", fake)
    assert main(["fit", "--scene", "bag", "--quiet", "--out", str(tmp_path / "o")]) == 1
    assert seen["targets"] == SPEC_TARGETS and seen["options"].names == ("youngs_modulus",)
    assert seen["options"].start is None and seen["options"].step == DEFAULT_STEP
    assert seen["options"].iterations == 30 and seen["options"].noise_mm == 0.5
    assert seen["options"].model_scatter_mm is None and seen["options"].start_factor == 1.0   # the nominal film
    main(["fit", "--scene", "bag", "--pair", "youngs_modulus,friction", "--synthetic", "--quiet",
          "--model-scatter", "1.5,2.5,0.5"])
    assert seen["targets"] is None and seen["options"].names == ("youngs_modulus", "friction")
    assert seen["options"].model_scatter_mm == (1.5, 2.5, 0.5)


def test_bag_fit_says_which_measurement_the_model_does_not_reach(tmp_path, monkeypatch, capsys):
    """A fit whose best value leaves a measurement far from its target keeps the fitted
    value (status 0) and says which measurement and by how much on stderr, as fit.json's
    ``misfit`` does; and the history bias of a fit from the tie checkpoint after it."""
    said = "the model does not reach the flap: fitted 8.40 mm against 28.43 mm, -20.03 mm, 4.1 σ"
    bias = "every run starts from the tie checkpoint, whose gather, cinch and tie ran at 315 MPa; …"
    monkeypatch.setattr(bag_rest_fit, "fit_bag_rest", lambda out, targets, options: dict(
        fitted={"youngs_modulus": 3e8}, failed=None, outside_reach=None, misfit=said, history_bias=bias))
    assert main(["fit", "--scene", "bag", "--quiet", "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().err.strip().splitlines() == [f"fit: {said}", f"fit: {bias}"]


@pytest.mark.parametrize("argv", [["--scene", "pouch", "--lattice-step", "0.1"], ["--synthetic"],
                                  ["--scene", "bag", "--window", "2", "--state", "s.npz", "--model-scatter", "1,2,3"],
                                  ["--scene", "bag", "--window", "2", "--state", "s.npz", "--bag-scatter", "4,3,5"],
                                  ["--pair", "youngs_modulus,friction"], ["--workers", "2"]])
def test_rest_fit_flags_are_refused_where_they_would_be_ignored(tmp_path, capsys, no_fit, argv):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--quiet", "--out", str(tmp_path / "o"), *argv])
    assert e.value.code == 2 and "only for --scene bag without --window" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--joint"], "not --joint"),
    (["--param", "friction", "--pair", "youngs_modulus,friction"], "give --param or --pair, not both"),
    (["--synthetic", "--neck-x", "0.04", "--neck-y", "0.04", "--flap", "0.02"], "--synthetic makes the targets"),
    (["--neck-x", "0.04"], "give all three of --neck-x, --neck-y and --flap"),
    (["--model-scatter", "1.7,3.3"], "--model-scatter takes three values > 0"),
    (["--model-scatter", "1.7,-3.3,1"], "--model-scatter takes three values > 0"),
    (["--bag-scatter", "4.3,3.1"], "--bag-scatter takes three values > 0"),
])
def test_bag_fit_flag_mistakes_are_usage_errors(tmp_path, capsys, no_fit, argv, message):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--scene", "bag", "--quiet", "--out", str(tmp_path / "o"), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("options, message", [
    (dict(names=("thickness",)), "fits one of youngs_modulus, friction, bending_scale or a pair"),
    (dict(names=("youngs_modulus", "friction", "bending_scale")), "or a pair of them"),
    (dict(step=0.0), "step must be > 0"),
    (dict(noise_mm=-1.0), "noise_mm must be > 0"),
    (dict(start_value=1e8, names=("youngs_modulus", "friction")), "for a single parameter"),
    (dict(iterations=0), "iterations must be a positive integer"),
    (dict(estimator="adjoint"), "estimator must be one of spline, rest"),
    (dict(model_scatter_mm=(1.7, 0.0, 1.0)), "model_scatter_mm must be three values > 0"),
    (dict(model_scatter_mm=(1.7, 3.3)), "model_scatter_mm must be three values > 0"),
    (dict(bag_scatter_mm=(4.3, float("nan"), 4.9)), "bag_scatter_mm must be three values > 0"),
])
def test_bag_fit_options_are_checked_before_any_run(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        bag_rest_fit.fit_bag_rest(str(tmp_path / "o"), None, bag_rest_fit.BagFitOptions(**options))
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_default_fit_compiles_once_and_recovers_each_parameter(tmp_path):
    """The default job (E, μf, kθ each from 2× off): one XLA compilation of the
    measurement-and-Jacobian program for the Jacobian at the known values and all three
    fits, and each parameter within 1 %."""
    out = tmp_path / "fit"
    with xla_compilations() as compiled:
        s = rollout_fit.fit_pouch(str(out), options=rollout_fit.ShapeFitOptions(progress=False))
    assert compilations_of(compiled, "measurements_and_jacobian") == 1, compiled
    assert s["compiles"] == 1 and s["compile_s"] > 0 and s["evaluations"] >= 4
    assert [f["params"] for f in s["fits"]] == [["youngs_modulus"], ["friction"], ["bending_scale"]]
    for f in s["fits"]:
        (err,) = f["relative_error"].values()
        assert err < 0.01, f
    assert json.loads((out / "summary.json").read_text())["compiles"] == 1


# --------------------------------------------------------------------------- targets in mm


@pytest.mark.parametrize("values, values_mm", [
    (("0.03883", "0.03720", "0.01843"), (None, None, None)),       # metres, as before
    ((0.03883, 0.03720, 0.01843), (None, None, None)),              # numbers from Python
    ((None, None, None), ("38.83", "37.20", "18.43")),              # --neck-x-mm …
    (("38.83mm", "37.20 mm", "0.01843m"), (None, None, None)),      # units stated in the value
    (("38.83mm", None, "0.01843"), (None, "37.2", None)),           # mixed
])
def test_targets_in_metres_or_millimetres_give_the_same_metres(values, values_mm):
    np.testing.assert_allclose(targets_from(None, values, values_mm), [0.03883, 0.03720, 0.01843], rtol=1e-12)


@pytest.mark.parametrize("values, values_mm, message", [
    (("38.83", "37.20", "18.43"), (None,) * 3,
     "--neck-x 38.83: a neck width along x of 38.83 m is implausible (expected 0.1 mm to 1 m); it is almost "
     "surely in mm: write --neck-x-mm 38.83 or --neck-x 38.83mm"),
    (("0.03883", "0.0372", "18.43"), (None,) * 3, "--flap 18.43: a flap height of 18.43 m is implausible"),
    ((None,) * 3, ("0.03883", "37.2", "18.43"),
     "--neck-x-mm 0.03883: a neck width along x of 0.03883 mm is implausible (expected 0.1 mm to 1 m); it is "
     "almost surely in m: write --neck-x 0.03883 or --neck-x-mm 38.83"),
    (("38830mm", "0.0372", "0.018"), (None,) * 3, "38830 mm is implausible (expected 0.1 mm to 1 m)"),
    (("0.03883", "wide", "0.018"), (None,) * 3, "--neck-y 'wide': not a length"),
    (("0.03883", "0.0372", "0.018"), ("38.83", None, None), "give --neck-x (m) or --neck-x-mm (mm), not both"),
    ((None, None, None), ("38.83", "37.2", None), "give all three of --neck-x, --neck-y and --flap"),
])
def test_implausible_or_ambiguous_targets_are_refused_with_a_hint(values, values_mm, message):
    with pytest.raises(FlagError) as e:
        targets_from(None, values, values_mm)
    assert message in str(e.value)


def test_cli_fit_takes_millimetres_and_refuses_metres_that_are_millimetres(tmp_path, capsys, monkeypatch):
    seen = {}
    monkeypatch.setattr(rollout_fit, "fit_pouch", lambda out, targets, options: seen.update(targets=targets) or
                        dict(fits=[]))
    assert main(["fit", "--quiet", "--out", str(tmp_path / "o"),
                 "--neck-x-mm", "31.8", "--neck-y", "15.9mm", "--flap-mm", "7.6"]) == 0
    np.testing.assert_allclose(seen["targets"], [0.0318, 0.0159, 0.0076], rtol=1e-12)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["fit", "--scene", "bag", "--quiet", "--out", str(tmp_path / "o"),
              "--neck-x", "38.83", "--neck-y", "37.20", "--flap", "18.43"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "almost surely in mm: write --neck-x-mm 38.83 or --neck-x 38.83mm" in err


def test_bag_fit_takes_the_specification_in_millimetres(tmp_path, monkeypatch):
    from fitting.bag_rest import SPEC_TARGETS

    seen = {}
    monkeypatch.setattr(bag_rest_fit, "fit_bag_rest", lambda out, targets, options: seen.update(targets=targets) or
                        dict(fitted=None, failed="not run", outside_reach=None, misfit=None, history_bias=None))
    main(["fit", "--scene", "bag", "--quiet", "--out", str(tmp_path / "o"),
          "--neck-x-mm", "38.83", "--neck-y-mm", "37.20", "--flap-mm", "18.43"])
    np.testing.assert_allclose(seen["targets"], SPEC_TARGETS, rtol=1e-12)

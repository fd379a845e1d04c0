"""benchmarks/bag_sweep.py's report on made-up sweep lines (no bag runs)."""
from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bag_sweep  # noqa: E402


def _write(folder, ks, param="friction", scatter=0.1):
    slope = np.array([1.0, -0.5, 0.25])                              # mm per unit log-parameter
    with open(os.path.join(folder, "sweep.jsonl"), "w") as f:
        for k in ks:
            z = k * bag_sweep.STEP
            y = np.array([45.0, 43.0, 15.0]) + slope * z + scatter * (-1) ** k   # a trend and a ±0.1 mm scatter
            f.write(json.dumps(dict(param=param, factor=math.exp(z), y_mm=y.tolist(),
                                    J_rest_mm=np.outer(2 * slope, [0.0, 1.0, 0.0]).tolist())) + "\n")
    return slope


def test_report_gives_the_trend_and_the_scatter_and_the_signs_on_a_full_grid(tmp_path):
    """On the lattice (even k) the made-up runs lie on a line, so the smoothed loss is a
    quadratic in log μf: its central differences are its derivative, and the spline
    gradient has the slope's sign at every point (a wrong derivative would not); the
    rest-state one, the nodes' own derivatives (twice the line's slope here), too: it is
    twice the spline's, also for μf, whose fit takes the spline's derivative."""
    slope = _write(tmp_path, range(-9, 10))
    r = bag_sweep.report(str(tmp_path), "friction", target=(0.040, 0.045, 0.016), width=2)
    np.testing.assert_allclose(r["trend"]["slope_mm_per_log"], slope, atol=0.02)
    np.testing.assert_allclose(r["trend"]["scatter_mm"], 0.1, rtol=0.1)
    # nodes k = −8 … 8 give the smoothed loss at k = −6 … 6 (k = ±7 would need ±10)
    assert [round(math.log(p["factor"]) / bag_sweep.STEP) for p in r["points"]] == list(range(-6, 7))
    assert r["sign_points"] == 13 and r["sign_match_rest"] == 1.0 and r["sign_match_spline"] == 1.0
    inner = [p for p in r["points"] if abs(round(math.log(p["factor"]) / bag_sweep.STEP)) < 6]
    for p in inner:   # a quadratic: the central difference is the derivative
        assert p["spline"] == pytest.approx(p["slope"], rel=1e-9, abs=1e-9)
    for p in r["points"]:
        assert p["rest"] == pytest.approx(2 * p["spline"], rel=1e-9) and p["rest"] != 0


def test_report_says_the_signs_were_not_measured_without_neighbours(tmp_path):
    """A sweep run with --k=-2,0,2 gives the smoothed loss at k = 0 only (k = ±1 need the
    node at ±4): no neighbouring point to take the slope from, so the sign agreement is
    None, not 0 %."""
    _write(tmp_path, (-2, 0, 2))
    r = bag_sweep.report(str(tmp_path), "friction", width=2)
    assert r["sign_points"] == 0 and r["sign_match_spline"] is None and r["sign_match_rest"] is None
    assert len(r["points"]) == 1 and r["trend"]["sigma_log_from_scatter"] is None   # no scatter off the line


def test_the_sweep_runs_the_lattice_nodes_of_its_span():
    assert bag_sweep.lattice_ks(7, 2) == list(range(-10, 11, 2))
    assert bag_sweep.lattice_ks(7, 1) == list(range(-8, 9))


def test_compare_gives_each_twins_largest_difference(tmp_path):
    _write(tmp_path, (-2, 0, 2))
    other = tmp_path / "other.jsonl"
    rows = [json.loads(line) for line in open(tmp_path / "sweep.jsonl")]
    rows[1]["y_mm"][2] += 3e-4
    rows.append(dict(param="friction", factor=9.0, y_mm=[0.0, 0.0, 0.0]))    # no twin: left out
    other.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = bag_sweep.compare(str(other), str(tmp_path))
    assert [round(math.log(f) / bag_sweep.STEP) for _, f, _ in got] == [-2, 0, 2]
    assert [d for *_, d in got] == [0.0, pytest.approx(3e-4), 0.0]


def test_recover_finds_each_runs_parameter_on_a_line_and_misses_it_by_the_scatter(tmp_path):
    """Runs on a straight line (no scatter): the smoothed loss against any interior run is
    zero at that run's own parameter, so the recovery is exact to the scan's resolution
    (1/100 grid step: 0.1 %). With a ±0.1 mm alternating scatter the lattice nodes (even k)
    all lie 0.1 mm above the line, so the smoothed curve is the line shifted by (0.1, 0.1,
    0.1) mm: the even runs are found exactly, and each odd run, 0.2 mm below, at the curve's
    closest point, 0.2 (s·1)/|s|² in log-parameter away (s the slope).
    The nodes k = −8 … 8 give the curve over k = −6 … 6, so the runs k = −5 … 5 are scanned."""
    slope = _write(tmp_path, range(-9, 10), scatter=0.0)
    r = bag_sweep.recover(str(tmp_path), "friction")
    assert [round(math.log(p["factor"]) / bag_sweep.STEP) for p in r["runs"]] == list(range(-5, 6))
    assert r["rms_error"] < 1e-3 and r["within_2pct"] == 11
    _write(tmp_path, range(-9, 10), scatter=0.1)
    r = bag_sweep.recover(str(tmp_path), "friction")
    expected = 0.2 * abs(slope.sum()) / (slope @ slope)   # 0.114: log-parameter offset of the closest point
    # k = −5's closest point lies past the curve's end (k = −6.15): found at the end
    assert [round(math.log(p["factor"]) / bag_sweep.STEP) for p in r["runs"] if p["at_scan_end"]] == [-5]
    for p in r["runs"][1:]:
        k = round(math.log(p["factor"]) / bag_sweep.STEP)
        assert abs(math.log1p(p["error"])) == pytest.approx(expected if k % 2 else 0.0, abs=2.5e-3)
    assert r["within_2pct"] == 5                        # the even runs; the odd ones are 10–12 % off


def test_recover_takes_outside_targets_and_says_whether_the_interval_holds_the_truth(tmp_path):
    """--targets: runs the sweep never made (e.g. a whole history at E) as the targets. On
    a straight line of runs a target on the line is found at its own factor, inside its
    interval (the fit's model_scatter there: fitting.uncertainty.scatter_budget with the
    spline's Jacobian and effective runs); the same target 2 mm wider in neck x is found
    elsewhere, and the interval says by how many σ the truth lies away. Targets past the
    span are left out; K = 4 runs per node whose spread is measured as nothing leave the
    interval of one."""
    from fitting.smoothing import effective_runs, lattice_support
    from fitting.uncertainty import scatter_budget

    slope = _write(tmp_path, range(-9, 10), scatter=0.0)
    line = lambda k: (np.array([45.0, 43.0, 15.0]) + slope * k * bag_sweep.STEP).tolist()
    k_true = 2.5
    targets = [dict(factor=math.exp(k_true * bag_sweep.STEP), y_mm=line(k_true), label="whole history"),
               dict(factor=math.exp(k_true * bag_sweep.STEP), y_mm=(np.add(line(k_true), [2.0, 0, 0])).tolist()),
               dict(factor=math.exp(9 * bag_sweep.STEP), y_mm=line(9))]                   # past the span
    r = bag_sweep.recover(str(tmp_path), "friction", targets=targets, scatter_mm=(0.1, 0.1, 0.1))
    on, off = r["runs"]
    assert on["label"] == "whole history" and abs(on["error"]) < 1e-3 and on["inside"] and abs(on["sigmas"]) < 0.1
    u = math.log(on["found"]) / bag_sweep.STEP
    eff = effective_runs(lattice_support([u / 2])[1])
    want = scatter_budget(np.array([slope]).T, ("friction",), {"friction": on["found"]}, (0.1, 0.1, 0.1),
                          effective_runs=eff)["interval_1sigma"]["friction"]
    assert on["sigma_log"] == pytest.approx(want["sigma_log"], rel=1e-9) and on["sigma_log"] > 0
    assert on["low"] < targets[0]["factor"] < on["high"]
    miss = math.log(off["factor"] / off["found"])
    assert off["found"] > off["factor"] and not off["inside"] and off["sigmas"] == pytest.approx(
        miss / off["sigma_log"], rel=1e-12) and off["sigmas"] < -1
    assert r["inside_1sigma"] == 1 and r["within_2pct"] == 1
    copies = bag_sweep.recover(str(tmp_path), "friction", targets=targets[:1], scatter_mm=(0.1, 0.1, 0.1),
                               runs_per_node=4, within_mm=(0.0, 0.0, 0.0))
    assert copies["runs"][0]["sigma_log"] == pytest.approx(on["sigma_log"], rel=1e-12)


def test_whole_history_targets_refuse_what_is_no_whole_history(tmp_path):
    """benchmarks/whole_history.py: a line from a finished whole run, and a clear refusal
    for a failed, kicked, resumed or self-intersecting one."""
    import whole_history

    from scenes.bag import DT, PROTOCOLS

    s = dict(resolution="full", protocol="full", steps_this_run=round(PROTOCOLS["full"].t_end / DT),
             simulated_s=PROTOCOLS["full"].t_end, failure=None, perturbation=None, unfold_checked=True,
             newton_iterations=10, wall_s=1.0, params=dict(youngs_modulus=630e6, friction=0.35, bending_scale=1.0),
             audit=dict(frames_with_self_intersection=0),
             measurements=dict(neck_width_mm=[40.0, 41.0], flap_height_mm=14.0))
    line = whole_history.target_line(s, "x/summary.json")
    assert line["factor"] == pytest.approx(2.0, rel=1e-12) and line["y_mm"] == [40.0, 41.0, 14.0]
    for bad, why in ((dict(steps_this_run=504), "not a whole full-protocol run"),
                     (dict(resolution="coarse"), "not a whole full-protocol run"),
                     (dict(perturbation=dict(rms_m_s=0.1, seed=1)), "a kicked run")):
        with pytest.raises(ValueError, match=why):
            whole_history.target_line(dict(s, **bad), "x/summary.json")
    # a bag the protocol does not make at that E: a line with its error, which recover leaves out and names
    unfold = whole_history.target_line(dict(s, failure=dict(phase="unfold", reason="unfold check: 3 of 32 columns"),
                                            steps_this_run=1452), "y/summary.json")
    crossed = whole_history.target_line(dict(s, audit=dict(frames_with_self_intersection=2)), "z/summary.json")
    assert unfold["error"] == "unfold check: 3 of 32 columns" and "y_mm" not in unfold
    assert crossed["error"] == "2 self-intersecting frames"
    _write(tmp_path, range(-9, 10), scatter=0.0)
    r = bag_sweep.recover(str(tmp_path), "friction", targets=[dict(unfold, factor=1.1), line | dict(factor=1.2)])
    assert [t["factor"] for t in r["failed_targets"]] == [1.1] and len(r["runs"]) == 1

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

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


def _write(folder, ks, param="friction"):
    slope = np.array([1.0, -0.5, 0.25])                              # mm per unit log-parameter
    with open(os.path.join(folder, "sweep.jsonl"), "w") as f:
        for k in ks:
            z = k * bag_sweep.STEP
            y = np.array([45.0, 43.0, 15.0]) + slope * z + 0.1 * (-1) ** k   # a trend and a ±0.1 mm scatter
            f.write(json.dumps(dict(param=param, factor=math.exp(z), y_mm=y.tolist(),
                                    J_rest_mm=np.outer(slope, [0.0, 1.0, 0.0]).tolist())) + "\n")
    return slope


def test_report_gives_the_trend_and_the_scatter_and_the_signs_on_a_full_grid(tmp_path):
    slope = _write(tmp_path, range(-9, 10))
    r = bag_sweep.report(str(tmp_path), "friction", target=(0.040, 0.045, 0.016), width=2)
    np.testing.assert_allclose(r["trend"]["slope_mm_per_log"], slope, atol=0.02)
    np.testing.assert_allclose(r["trend"]["scatter_mm"], 0.1, rtol=0.1)
    assert r["sign_points"] == 15 and r["sign_match_rest"] == 1.0 and 0.0 < r["sign_match_stein"] <= 1.0


def test_report_says_the_signs_were_not_measured_on_a_coarse_grid(tmp_path):
    """A sweep run with --k=-6,-3,0,3,6 has no neighbouring points to take the loss slope
    from: the sign agreement is None, not 0 %."""
    _write(tmp_path, range(-9, 10, 3))
    r = bag_sweep.report(str(tmp_path), "friction", width=3)
    assert r["sign_points"] == 0 and r["sign_match_stein"] is None and r["sign_match_rest"] is None
    assert len(r["points"]) == 5

"""The bag fit on the 481-vertex bag (slow: each forward run from the tie checkpoint to
10.50 s takes about 4 minutes on the project's 2-core CPU).

    python3 -m pytest -q -m slow tests/test_bag_fit_slow.py

* The smoothed gradient (Stein's estimate on the nodes z ± σ, fitting/bag_rest.py) beside
  central differences of the same smoothed loss at three values of E (15 runs: 55 min on
  2026-12-02; ``-s`` prints each pair).
* ``ipcjax fit --scene bag`` for two iterations against the specification's bag: the run
  folder holds what the issue asks for (fit.json with iterates, Jacobian, interval and
  identifiability; fit.png; the final meshes).
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from fitting import bag_rest as br

pytestmark = pytest.mark.slow
SPEC = np.asarray(br.SPEC_TARGETS)


def _loss_and_gradient(problem, z):
    ev = problem(np.array([z]), None)
    r = (ev.y - SPEC) / 1e-3
    return float(r @ r), float(2.0 * (ev.J[:, 0] / 1e-3) @ r)


@pytest.mark.parametrize("factor", [0.6, 1.0, 1.6])
def test_smoothed_gradient_matches_central_differences_of_the_smoothed_loss(tmp_path_factory, factor):
    """At E = factor × 315 MPa: dL/dlogE from the nodes against (L(z + σ) − L(z − σ))/(2σ)
    of the same smoothed loss L (spec targets). The step is σ, so the nodes are shared:
    z ± σ, z ± 2σ and z (run once: fitting.bag_rest.node_folder). Two runs per node leave
    the scatter of single runs in both (docs/differentiation.md: on the E sweep the ratio
    of the two ranged from 0.03 to 1.96 at nine points, with the same sign at all nine), so
    this checks the sign, not the 1e-4 of the step tests."""
    out = str(tmp_path_factory.mktemp("grad"))
    z = math.log(315e6 * factor)
    pb = br.BagRestProblem(("youngs_modulus",), br.DEFAULT_START, out)
    try:
        sigma = pb.sigma
        _, g = _loss_and_gradient(pb, z)
        lp, _ = _loss_and_gradient(pb, z + sigma)
        lm, _ = _loss_and_gradient(pb, z - sigma)
    finally:
        pb.close()
    cd = (lp - lm) / (2 * sigma)
    print(f"\nE = {factor} x 315 MPa: smoothed loss's Stein gradient {g:+.1f}, central difference {cd:+.1f} "
          f"mm² per unit log E (ratio {g / cd:.2f})")
    assert g != 0.0 and cd != 0.0
    assert np.sign(g) == np.sign(cd), (g, cd)


def test_ipcjax_fit_bag_writes_the_run_folder(tmp_path):
    from ipcjax.cli import main

    out = tmp_path / "fit"
    rc = main(["fit", "--scene", "bag", "--iterations", "2", "--quiet", "--start-factor", "1", "--out", str(out)])
    rec = json.loads((out / "fit.json").read_text())
    assert rec["target_m"] == dict(zip(("neck_x", "neck_y", "flap"), br.SPEC_TARGETS))
    assert len(rec["iterates"]) == 2 and all(len(it["nodes"]) == 2 for it in rec["iterates"])
    J = np.asarray(rec["jacobian_mm_per_log"]["J"])
    assert J.shape == (3, 1) and np.all(np.isfinite(J)) and np.any(J != 0)
    iv = rec["interval_1sigma"]["youngs_modulus"]
    assert iv["low"] < iv["value"] < iv["high"]
    assert set(rec["identifiability"]) == {"smoothed", "rest_state"}
    assert (out / "fit.png").exists() and len(list((out / "mesh").glob("node_*.vtu"))) == 2
    assert (rc == 0) == (rec["fitted"] is not None)
    assert rec["fitted"] is not None or rec["outside_reach"] or rec["failed"]
    assert all(os.path.isdir(nd["run_dir"]) for it in rec["iterates"] for nd in it["nodes"])

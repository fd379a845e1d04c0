"""The bag's final shape is a rest state that round-off does not decide (docs/spec.md §5).

Slow: three copies of the 481-vertex bag resume from the committed tie-start checkpoint
(``scenes/data/bag_full_tie.npz``, 8.40 s), each with its film positions moved by 1e-9 m
in random directions, and run to 10.50 s. Their neck widths and flap heights must agree
within 2 mm. ``python3 -m pytest -q -m slow tests/test_bag_rest.py -s`` prints the spread.
"""
import os

import numpy as np
import pytest

from scenes import bag as B
from scenes.bag_run import BagRunOptions, run_bag

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIE_STATE = os.path.join(ROOT, "scenes", "data", "bag_full_tie.npz")  # the bag fit's default start
CINCH_STATE = os.path.join(ROOT, "tests", "data", "bag_full_cinch.npz")
PERTURBATION = 1e-9  # m, each film vertex
AGREE = 2e-3         # m


def test_checkpoints_are_full_bag_states_at_the_cinch_and_the_tie():
    sc = B.bag_scene("full")
    for path, name in ((CINCH_STATE, "cinch"), (TIE_STATE, "tie")):
        st = np.load(path)
        assert st["x"].shape == (sc.model.n_particles, 3) and str(st["resolution"]) == "full"
        assert float(st["t"]) == pytest.approx(B.CHECKPOINTS[name], abs=1e-9)
        assert int(st["step"]) == int(round(B.CHECKPOINTS[name] / sc.dt))
        assert bool(st["unfold_checked"])
    # the tie start has every track's grab positions and the tie's start lengths
    st = np.load(TIE_STATE)
    assert {"capture_cinch", "capture_flap", "capture_tie"} <= set(st.files)
    # and it is the bag fit's default start, shipped in the scenes package (not read from tests/)
    from fitting import bag_rest as br
    assert os.path.samefile(br.DEFAULT_START, TIE_STATE)


def _perturbed(src, dst, seed, n_film):
    st = dict(np.load(src))
    d = np.random.default_rng(seed).standard_normal((n_film, 3))
    d *= PERTURBATION / np.linalg.norm(d, axis=1, keepdims=True)
    st["x"] = st["x"].copy()
    st["x"][:n_film] += d
    np.savez(dst, **st)


@pytest.mark.slow
def test_three_perturbed_copies_from_the_tie_start_agree(tmp_path):
    n_film = len(B.pouch_mesh().x)
    rows = []
    for seed in range(3):
        start = tmp_path / f"tie_{seed}.npz"
        _perturbed(TIE_STATE, start, seed, n_film)
        res = run_bag(BagRunOptions(out=str(tmp_path / f"run{seed}"), resume=str(start), until=B.T_END,
                                    mesh_every=0, pictures=False, progress=False))
        assert res.ok, res.summary["failure"]
        m = res.summary["measurements"]
        rows.append([*m["neck_width_mm"], m["flap_height_mm"]])
    rows = np.asarray(rows)
    spread = rows.max(axis=0) - rows.min(axis=0)
    print(f"\nneck x, neck y, flap (mm) per copy:\n{np.round(rows, 3)}\nspread (mm): {np.round(spread, 3)}")
    assert np.all(np.isfinite(rows))
    assert np.all(spread <= 1e3 * AGREE), spread

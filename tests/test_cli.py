"""The README's main job runs end to end (tiny settings) and writes its outputs."""
import json

import numpy as np

from ipcjax.cli import main


def test_drape_job_writes_trajectory_and_summary(tmp_path):
    out = tmp_path / "drape"
    rc = main(["drape", "--resolution", "4", "--steps", "3", "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["frames_with_self_intersection"] == 0
    traj = np.load(out / "trajectory.npz")
    assert traj["film"].shape == (4, 16, 3) and traj["faces"].shape == (18, 3)


def test_unknown_job_prints_usage(capsys):
    assert main(["nonsense"]) == 2
    assert "usage: ipcjax" in capsys.readouterr().out

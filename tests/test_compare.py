"""Side-by-side comparison of two bag runs (scenes/compare.py, jobs/compare.py and `ipcjax compare`).

Synthetic run folders in both solvers' formats (the IPC job's and the VBD driver's
summary.json differ) hold the same built frames, among them edge-through-face crossings, so
the same code must report the same numbers in both columns.
"""
import json

import numpy as np
import pytest

from ipcjax.audit import audit_trajectory
from scenes import compare as C

FPS = 240.0


@pytest.fixture(scope="module")
def coarse():
    from scenes.bag import bag_scene

    return bag_scene("coarse")


def crossing_frame(sc):
    """The flat film with one edge pushed through a triangle that shares none of its vertices."""
    from ipcjax.topology import mesh_edges

    x = np.asarray(sc.x)[sc.film].copy()
    faces = np.asarray(sc.faces)
    t = faces[len(faces) // 2]
    centre = x[t].mean(axis=0)
    edges = mesh_edges(faces)
    # an edge far from the triangle: its endpoints become one above, one below the centroid
    far = [e for e in edges if not set(e) & set(t)
           and min(np.linalg.norm(x[e] - centre, axis=1)) > 0.08]
    p, q = far[0]
    x[p] = centre + [0.0, 0.0, 0.004]
    x[q] = centre + [0.0, 0.0, -0.004]
    return x


def frames(sc, n, crossing_at=()):
    """n frames at 1/240 s: the film sagging slowly, spheres falling, crossings at given frames."""
    x0 = np.asarray(sc.x)[sc.film]
    s0 = np.asarray(sc.x)[sc.spheres]
    bad = crossing_frame(sc)
    t = np.arange(n) / FPS
    film = np.stack([x0 - [0, 0, 0.0005 * k] for k in range(n)])
    for k in crossing_at:
        film[k] = bad
    spheres = np.stack([s0 - [0, 0, 0.5 * 9.81 * tk ** 2] for tk in t])
    return film.astype(np.float32), spheres.astype(np.float32), t


def write_run(folder, sc, n, crossing_at, summary):
    folder.mkdir(parents=True, exist_ok=True)
    film, spheres, t = frames(sc, n, crossing_at)
    np.savez_compressed(folder / "trajectory.npz", film=film, spheres=spheres,
                        faces=np.asarray(sc.faces, np.int32), time=t)
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def ipc_summary(n, wall):
    return dict(resolution="coarse", steps_this_run=n - 1, simulated_s=(n - 1) / FPS, wall_s=wall,
                steps_per_s=(n - 1) / wall, failure=None, first_step_s=0.5 * wall,
                wall_s_per_simulated_s_after_first_step=0.5 * wall / ((n - 2) / FPS))


def vbd_summary(n, wall):
    return dict(solver="newton-vbd", resolution="coarse", frames_this_run=n - 1, simulated_s=(n - 1) / FPS,
                wall_s=wall, wall_s_per_simulated_s=wall / ((n - 1) / FPS), failure=None)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, coarse):
    root = tmp_path_factory.mktemp("runs")
    # IPC reaches 12/240 s; VBD goes on to 20/240 s and crosses again after the common instant
    ipc = write_run(root / "ipc", coarse, 13, (3, 4, 9), ipc_summary(13, 6.0))
    vbd = write_run(root / "vbd", coarse, 21, (3, 4, 9, 15, 16), vbd_summary(21, 4.0))
    return ipc, vbd


def test_cut_at_keeps_frames_up_to_the_instant(two_runs):
    run = C.load_run(two_runs[1])
    cut = C.cut_at(run, 12 / FPS)
    assert len(cut.time) == 13 and cut.time[-1] == pytest.approx(12 / FPS)
    np.testing.assert_array_equal(cut.film, run.film[:13])
    np.testing.assert_array_equal(cut.spheres, run.spheres[:13])
    assert len(C.cut_at(run, 0.0).time) == 1
    with pytest.raises(ValueError, match="before t"):
        C.cut_at(run, 1.0)
    with pytest.raises(ValueError, match="no saved frame"):
        C.cut_at(run, 12.5 / FPS)


def test_common_instant_is_the_latest_time_both_reached(two_runs):
    runs = [C.load_run(f) for f in two_runs]
    assert C.common_instant(runs) == pytest.approx(12 / FPS)
    assert C.common_instant(runs, 5 / FPS) == pytest.approx(5 / FPS)
    with pytest.raises(ValueError, match="after the end"):
        C.common_instant(runs, 0.5)


def test_wall_rate_from_either_summary_format():
    assert C.wall_rate(ipc_summary(241, 120.0)) == pytest.approx(120.0)
    assert C.wall_rate(vbd_summary(241, 60.0)) == pytest.approx(60.0)
    assert C.wall_rate({}) is None


def test_audit_counts_built_crossings_identically_on_both_runs(two_runs, coarse, tmp_path):
    # the built frame really self-intersects
    bad = crossing_frame(coarse)
    assert audit_trajectory(bad[None], coarse["faces"])["frames_with_self_intersection"] == 1
    runs = {"ipcjax IPC": C.load_run(two_runs[0]), "Newton VBD": C.load_run(two_runs[1])}
    data = C.compare_runs(runs, str(tmp_path / "cmp"), timing_note="synthetic")
    ipc, vbd = data["results"]["ipcjax IPC"], data["results"]["Newton VBD"]
    assert ipc["audit"]["frames_with_self_intersection"] == vbd["audit"]["frames_with_self_intersection"] == 3
    assert ipc["audit"]["frames"] == vbd["audit"]["frames"] == 13
    assert ipc["audit"]["first_self_intersection_s"] == vbd["audit"]["first_self_intersection_s"] \
        == pytest.approx(3 / FPS)
    assert ipc["measurements"] == vbd["measurements"]   # same frames → same measurements
    assert ipc["wall_s_per_simulated_s"] == pytest.approx(6.0 / (12 / FPS))
    assert vbd["wall_s_per_simulated_s"] == pytest.approx(4.0 / (20 / FPS))
    rows = dict((r[0], r[1:]) for r in C.table_rows(data["results"]))
    assert rows["frames with self-intersection / total"] == ("3 / 13", "3 / 13")
    assert rows["compared at (s)"] == ("0.050", "0.050")
    assert rows["wall s per simulated s"] == ("120.0", "48.0")
    # IPC's summary splits off its first step; the synthetic VBD one does not
    assert rows["the same after the first step (compile, kernel loading)"] == ("65.5", "—")
    out = tmp_path / "cmp"
    assert (out / "comparison.png").stat().st_size > 10_000
    md = (out / "comparison.md").read_text()
    assert "| frames with self-intersection / total" in md and "synthetic" in md
    js = json.loads((out / "comparison.json").read_text())
    assert js["instant_s"] == pytest.approx(0.05) and js["table"] == data["table"]


def test_table_has_one_row_per_quantity_and_aligned_columns():
    r = dict(time_s=2.0, measurements=dict(neck_width_mm=[345.29, 398.58], flap_height_mm=5.06,
                                           max_sphere_height_range_final_1s_mm=182.5),
             audit=dict(frames=481, frames_with_self_intersection=0, first_self_intersection_s=None,
                        min_film_film_m=8.03e-4, min_film_sphere_m=None),
             wall_s_per_simulated_s=None)
    text = C.markdown_table({"A": r, "B": r})
    lines = text.splitlines()
    assert len(lines) == 2 + len(C.ROW_LABELS)
    assert len({len(line) for line in lines}) == 1
    assert "345.29 × 398.58" in text and "0 / 481" in text and "0.8030" in text and "none" in text


def test_the_specification_columns_appear_only_beside_its_own_experiment():
    r = dict(time_s=8.45, measurements=dict(neck_width_mm=[40.42, 48.94], flap_height_mm=16.83,
                                            max_sphere_height_range_final_1s_mm=0.53),
             audit=dict(frames=2029, frames_with_self_intersection=0, first_self_intersection_s=None,
                        min_film_film_m=2.1e-4, min_film_sphere_m=6.0e-4),
             wall_s_per_simulated_s=None, protocol="short")
    runs = {"ipcjax IPC": r, "Newton VBD": r}
    assert C.spec_columns(runs, "full", 8.45) == C.SPEC_SHORT
    assert C.spec_columns(runs, "coarse", 8.45) == {}                                  # another bag
    assert C.spec_columns(runs, "full", 8.0) == {}                                     # another instant
    assert C.spec_columns({k: dict(r, protocol="full") for k in runs}, "full", 8.45) == {}  # another protocol
    lines = C.markdown_table(runs, C.SPEC_SHORT).splitlines()
    assert len({len(line) for line in lines}) == 1 and len(lines) == 2 + len(C.ROW_LABELS)
    row = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines[2:]}
    assert row["neck width x × y (mm)"] == ["40.42 × 48.94", "40.42 × 48.94", "38.45 × 42.01", "31.04 × 32.04"]
    assert row["frames with self-intersection / total"][2:] == ["0 / 2029", "1197 / 2029"]
    assert row["max sphere-centre height range, final 1 s (mm)"][2:] == ["0.80", "23.76"]
    assert row["flap height (mm)"][2:] == ["13.47", "1.54"]
    assert row["min film–film distance (mm)"][2:] == ["", ""]  # the specification gives no number


def test_mismatched_meshes_are_refused(two_runs, tmp_path):
    run = C.load_run(two_runs[0])
    other = run._replace(faces=run.faces[:, [0, 2, 1]], folder="x")
    with pytest.raises(ValueError, match="faces are not those"):
        C.scene_for([run, other])
    with pytest.raises(FileNotFoundError, match="no trajectory.npz"):
        C.load_run(tmp_path)


def test_compare_run_defaults_follow_the_protocol():
    from jobs.compare import run_options

    o = run_options("short", None, None, "sparse")
    assert (o.protocol, o.resolution, o.until) == ("short", "full", 8.45)
    o = run_options(None, None, None, "dense")
    assert (o.protocol, o.resolution, o.until, o.linear_solver) == ("full", "coarse", 0.5, "dense")
    o = run_options("full", "coarse", 2.0, "sparse")
    assert (o.protocol, o.resolution, o.until) == ("full", "coarse", 2.0)

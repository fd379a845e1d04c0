"""Side-by-side comparison of two bag runs (ipcjax IPC and Newton VBD) at one instant.

Both run folders hold the same ``trajectory.npz`` (film (T, N_f, 3), spheres (T, 7, 3),
faces, time) and ``summary.json``. :func:`evaluate` cuts a trajectory at an instant and
judges it with the same code for both solvers: :func:`scenes.bag.measurements` on the cut
frames and :func:`ipcjax.audit.audit_trajectory` over them. Only the wall-time rate is read
from each run's ``summary.json``, since it cannot be recomputed afterwards.

``ipcjax compare`` (``jobs/compare.py``, which can also make both runs first) is the
front end; docs/comparison.md shows its output for the coarse bag.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from ipcjax import runfolder
from scenes.bag import BagScene

TIME_TOL = 1e-6  # s: frame times are multiples of 1/240 s accumulated in float64


class Run(NamedTuple):
    """One run folder's trajectory and summary."""

    film: np.ndarray      # (T, N_f, 3) m
    spheres: np.ndarray   # (T, S, 3) m
    faces: np.ndarray     # (F, 3)
    time: np.ndarray      # (T,) s
    summary: dict         # summary.json ({} if absent)
    folder: str


def load_run(folder) -> Run:
    """Read ``trajectory.npz`` (and ``summary.json`` if present) from a run folder.

    Raises:
        FileNotFoundError: no trajectory.npz. ValueError: a corrupt or inconsistent
            trajectory.npz, or a summary.json that is not JSON (one line naming the file).
    """
    path = os.path.join(folder, "trajectory.npz")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{folder}: no trajectory.npz (is it a run folder of `ipcjax bag` or "
                                f"`python -m baselines.vbd_bag`?)")
    tr = runfolder.read_trajectory(path, "run")
    if tr.faces is None:
        raise ValueError(f"run {path} without faces: not a bag run's trajectory")
    summary = runfolder.read_json(os.path.join(folder, "summary.json"))
    return Run(tr.film, tr.spheres, tr.faces, tr.time, summary, str(folder))


def cut_at(run: Run, t: float) -> Run:
    """The frames of ``run`` with time ≤ t (to within 1 µs). The last kept frame is the one at t.

    Raises:
        ValueError: the run did not reach t (its last frame is earlier), or no saved frame
            lies at t (with ``--save-every`` > 1 the instants are coarser).
    """
    time = np.asarray(run.time, np.float64)
    if len(time) == 0 or time[-1] < t - TIME_TOL:
        last = float(time[-1]) if len(time) else float("nan")
        raise ValueError(f"{run.folder}: run ends at {last:.4f} s, before t = {t:.4f} s")
    keep = time <= t + TIME_TOL
    if not keep.any() or abs(time[keep][-1] - t) > TIME_TOL:
        near = float(time[np.argmin(np.abs(time - t))])
        raise ValueError(f"{run.folder}: no saved frame at t = {t:.6f} s (nearest {near:.6f} s)")
    n = int(keep.sum())
    return run._replace(film=run.film[:n], spheres=run.spheres[:n], time=time[:n])


def common_instant(runs, at: float | None = None) -> float:
    """The instant to compare at: ``at`` if given, else the latest time every run reached.

    With ``at`` given, each run must have a saved frame there (checked by :func:`cut_at`).
    """
    last = min(float(r.time[-1]) for r in runs)
    if at is None:
        return last
    if at > last + TIME_TOL:
        raise ValueError(f"--at {at} s is after the end of the shorter run ({last:.4f} s)")
    return float(at)


def wall_rate(summary: dict):
    """Wall seconds per simulated second of the run that wrote ``summary`` (None if unknown).

    Uses ``wall_s_per_simulated_s`` when present (the VBD driver), else wall_s over the
    simulated time of this run: ``steps_this_run`` / 240 for ``ipcjax bag`` (a resumed run
    times only its own steps), else ``simulated_s``.
    """
    if summary.get("wall_s_per_simulated_s"):
        return float(summary["wall_s_per_simulated_s"])
    wall = summary.get("wall_s")
    if not wall:
        return None
    if summary.get("steps_this_run"):
        simulated = summary["steps_this_run"] / 240.0
    else:
        simulated = summary.get("simulated_s") or 0.0
    return float(wall) / simulated if simulated > 0 else None


def resolution_of(run: Run) -> str:
    """The bag resolution a run was made at (from its summary, else from its film vertex count)."""
    from scenes.bag import RESOLUTIONS, bag_mesh

    res = run.summary.get("resolution")
    if res in RESOLUTIONS:
        return res
    n = run.film.shape[1]
    res = next((k for k, (r, c) in RESOLUTIONS.items() if len(bag_mesh(r, c).x) == n), None)
    if res is None:
        raise ValueError(f"{run.folder}: {n} film vertices match no bag resolution {sorted(RESOLUTIONS)}")
    return res


def scene_for(runs) -> BagScene:
    """The one :func:`scenes.bag.bag_scene` all runs were made of (their faces must be its faces)."""
    from scenes.bag import bag_scene

    res = {resolution_of(r) for r in runs}
    if len(res) != 1:
        raise ValueError(f"the runs are of different bag resolutions: {sorted(res)}")
    sc = bag_scene(res.pop())
    for r in runs:
        if r.faces.shape != sc.faces.shape or not np.array_equal(r.faces, sc.faces):
            raise ValueError(f"{r.folder}: its faces are not those of the {sc.resolution} bag mesh")
    return sc


def evaluate(run: Run, t: float, scene: BagScene) -> dict:
    """Measurements and self-intersection audit of ``run`` cut at ``t`` (same code for any solver).

    Returns a dict: time_s, frames, measurements (:func:`scenes.bag.measurements` of the cut
    trajectory: neck width x × y and flap height at t, sphere-centre height range over the
    final 1 s before t, ...), audit (frames, frames_with_self_intersection, min_film_film_m,
    min_film_sphere_m over the cut frames; first_self_intersection_s), wall_s_per_simulated_s
    (from summary.json, over the whole run), wall_s_per_simulated_s_after_first_step (the
    same without the first step, which carries IPC's jit compilation and Warp's kernel
    loading; None for runs that did not record it), failure (from summary.json).
    """
    from ipcjax.audit import audit_trajectory
    from scenes.bag import measurements

    cut = cut_at(run, t)
    nf, ns = cut.film.shape[1], cut.spheres.shape[1]
    audit = audit_trajectory(np.concatenate([cut.film, cut.spheres], axis=1), cut.faces,
                             np.arange(nf, nf + ns), scene.sphere_radius)
    inter = np.asarray(audit["intersecting_pairs"])
    first = float(cut.time[np.argmax(inter > 0)]) if (inter > 0).any() else None
    return dict(
        folder=run.folder, time_s=float(cut.time[-1]), frames=len(cut.time),
        measurements=measurements(cut.film, cut.spheres, cut.time, scene),
        audit=dict(frames=audit["frames"], frames_with_self_intersection=audit["frames_with_self_intersection"],
                   first_self_intersection_s=first,
                   min_film_film_m=float(np.min(audit["min_film_film"])),
                   min_film_sphere_m=float(np.min(audit["min_film_sphere"]))),
        run_simulated_s=float(run.time[-1]),
        wall_s=run.summary.get("wall_s"), wall_s_per_simulated_s=wall_rate(run.summary),
        wall_s_per_simulated_s_after_first_step=run.summary.get("wall_s_per_simulated_s_after_first_step"),
        failure=run.summary.get("failure"), protocol=run.summary.get("protocol"),
    )


def _mm(x, digits):
    return "—" if x is None or not np.isfinite(x) else f"{1e3 * x:.{digits}f}"


ROW_LABELS = (
    "compared at (s)", "neck width x × y (mm)", "flap height (mm)", "frames with self-intersection / total",
    "first self-intersecting frame (s)", "max sphere-centre height range, final 1 s (mm)",
    "min film–film distance (mm)", "min film–sphere gap (mm)", "wall s per simulated s",
    "the same after the first step (compile, kernel loading)",
)


def table_rows(results: dict) -> list:
    """Rows (label, value per solver) of the comparison table, from :func:`evaluate` dicts."""
    def one(r):
        m, a = r["measurements"], r["audit"]
        rate = r.get("wall_s_per_simulated_s")
        rate_after = r.get("wall_s_per_simulated_s_after_first_step")
        first = a.get("first_self_intersection_s")
        return [
            f"{r['time_s']:.3f}",
            "{:.2f} × {:.2f}".format(*m["neck_width_mm"]),
            f"{m['flap_height_mm']:.2f}",
            f"{a['frames_with_self_intersection']} / {a['frames']}",
            "none" if first is None else f"{first:.3f}",
            f"{m['max_sphere_height_range_final_1s_mm']:.2f}",
            _mm(a["min_film_film_m"], 4),
            _mm(a["min_film_sphere_m"], 4),
            "—" if rate is None else f"{rate:.1f}",
            "—" if rate_after is None else f"{rate_after:.1f}",
        ]
    cols = [one(r) for r in results.values()]
    return [(label, *(c[i] for c in cols)) for i, label in enumerate(ROW_LABELS)]


# The specification's side-by-side numbers of the short protocol (docs/spec.md §9: the
# 481-vertex bag at 8.45 s), shown beside a comparison of the same protocol and instant.
SPEC_SHORT = {
    "specification IPC": dict(neck="38.45 × 42.01", flap="13.47", frames="0 / 2029", range="0.80"),
    "specification VBD": dict(neck="31.04 × 32.04", flap="1.54", frames="1197 / 2029", range="23.76"),
}
SPEC_ROWS = {1: "neck", 2: "flap", 3: "frames", 5: "range"}  # ROW_LABELS index -> SPEC_SHORT key


def spec_columns(results: dict, resolution: str, t: float) -> dict:
    """The specification's columns (:data:`SPEC_SHORT`) when ``results`` are of its
    experiment: the full-resolution short protocol compared at 8.45 s; else {}."""
    protocols = {r.get("protocol") for r in results.values()}
    return SPEC_SHORT if (protocols == {"short"} and resolution == "full" and abs(t - 8.45) < TIME_TOL) else {}


def markdown_table(results: dict, spec: dict | None = None) -> str:
    """The comparison as a Markdown table, one column per solver (keys of ``results``),
    then the ``spec`` columns ({name: {row key: value}}, :data:`SPEC_SHORT`; "" where the
    specification gives no number)."""
    spec = spec or {}
    head = ("measurement", *results, *spec)
    rows = [head] + [(*row, *(s.get(SPEC_ROWS.get(i), "") for s in spec.values()))
                     for i, row in enumerate(table_rows(results))]
    w = [max(len(str(r[c])) for r in rows) for c in range(len(head))]
    line = lambda r: "| " + " | ".join(str(v).ljust(w[c]) for c, v in enumerate(r)) + " |"
    return "\n".join([line(head), "|" + "|".join("-" * (x + 2) for x in w) + "|", *map(line, rows[1:])])


def side_by_side(path, runs: dict, t: float, scene: BagScene) -> str:
    """One PNG with the two shapes at ``t``, one panel per solver, same axes and bin outline.

    Each panel is drawn by :func:`scenes.outputs.render_frame` (into a temporary PNG next to
    ``path``) and the panels are placed side by side.
    """
    from scenes.outputs import _plt, render_frame

    plt = _plt()
    cuts = {name: cut_at(run, t) for name, run in runs.items()}
    pts = np.concatenate([np.concatenate([c.film[-1], c.spheres[-1]]) for c in cuts.values()])
    r = float(np.max(scene.sphere_radius))
    lo, hi = pts.min(axis=0) - r, pts.max(axis=0) + r
    mid, half = (lo + hi) / 2, float(np.max(hi - lo)) / 2 * 1.05
    bounds = (mid - half, mid + half)
    obstacles = (np.asarray(scene.x), np.asarray(scene.bin_triangles))
    panels = []
    for name, c in cuts.items():
        tmp = f"{path}.{len(panels)}.tmp.png"
        render_frame(tmp, c.film[-1], c.faces, spheres=c.spheres[-1], sphere_radius=scene.sphere_radius,
                     obstacles=obstacles,
                     title=f"{name}, t = {c.time[-1]:.3f} s", bounds=bounds)
        panels.append(tmp)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 5))
    for ax, p in zip(np.atleast_1d(axes), panels):
        ax.imshow(plt.imread(p))
        ax.axis("off")
        os.remove(p)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def compare_runs(runs: dict, out: str, at: float | None = None, timing_note: str = "") -> dict:
    """Evaluate named runs at one instant and write comparison.md, comparison.json and
    comparison.png to ``out``.

    Args:
        runs: {column name: :class:`Run`}, e.g. {"ipcjax IPC": ..., "Newton VBD": ...}.
        out: output folder. at: instant, s (default: the latest time all runs reached).
        timing_note: how the wall times were measured (goes under the table and into the JSON).
    Returns:
        The JSON dict (instant, per-run results, table, notes, paths).
    """
    t = common_instant(list(runs.values()), at)
    scene = scene_for(list(runs.values()))
    results = {name: evaluate(r, t, scene) for name, r in runs.items()}
    spec = spec_columns(results, scene.resolution, t)
    table = markdown_table(results, spec)
    notes = [
        f"Both trajectories are cut at t = {t:.3f} s and judged by the same code: scenes.bag.measurements "
        f"(neck width and flap height at t, sphere-centre height range over [t − 1 s, t]) and "
        f"ipcjax.audit.audit_trajectory over every saved frame up to t.",
        "Wall s per simulated s is each run's own rate over its whole run, from its summary.json. "
        + (timing_note or ""),
    ] + (["The specification columns are docs/spec.md §9's numbers for the same protocol, bag and instant."]
         if spec else [])
    os.makedirs(out, exist_ok=True)
    png = side_by_side(os.path.join(out, "comparison.png"), runs, t, scene)
    md = f"# Bag, {scene.resolution}: side by side at t = {t:.3f} s\n\n{table}\n\n" + \
        "\n".join(f"* {n}" for n in notes) + "\n\n![shapes at t](comparison.png)\n"
    with open(os.path.join(out, "comparison.md"), "w") as f:
        f.write(md)
    data = dict(instant_s=t, resolution=scene.resolution, results=results, table=table, notes=notes,
                markdown="comparison.md", picture=os.path.basename(png))
    data = runfolder.json_safe(data)
    runfolder.write_json(os.path.join(out, "comparison.json"), data)
    return data


"""Does the Newton tangent move where the bag ends, or is one run's end one draw of its
round-off? Whole bags (t = 0 to 10.50 s) per tangent, each at E × (1 + k·δ) for a few k:
a change of E far too small to matter to the physics (δ = 1e-6 moves the ends by about
2e-5 mm along the E trend of docs/differentiation.md) that still changes every step's
round-off, which the first 7 s of the protocol carry to millimetres at the end.

    python3 benchmarks/tangent_ensemble.py --out runs/tangent_ensemble [--ks -3,-2,-1,0,1,2,3]
        [--delta 1e-6] [--tangents projected,exact_first] [--workers 2]
        [--json docs/figures/tangent_ensemble_60.json]

The tangents:

* ``exact_first``: the bag's Config of stop 59 (``newton_tangent="exact_first"``,
  ``max_direction=3e-3``);
* ``projected``: the bag's Config before stop 59 and again since stop 60
  (``newton_tangent="projected"``, ``max_direction=inf``).

Each is set here on the scene that ``run_bag`` builds; summary.json records
``newton_tangent``, and a run whose summary names another tangent is an error.

Each run is ``run_bag`` in its own folder under ``--out`` (``<tangent>/k=<k>``; a folder
whose run finished with the same E and tangent is read back, not run again),
``--workers`` at a time in separate processes, one XLA thread each. Prints, and writes with
``--json``, each run's neck x, neck y and flap (mm), and per tangent the mean and the
sample standard deviation of each over its runs that finished (a run that failed, e.g. the
unfold check at 6.05 s, is counted apart), the difference of the two means and its standard
error. Exits 1 if a run failed or has a self-intersecting frame. The runs keep every 6th
frame, which the self-intersection audit checks.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import math
import multiprocessing as mp
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.newton_tangent import STOP59_CAP  # noqa: E402

TANGENTS = ("projected", "exact_first")
#: each tangent's (newton_tangent, max_direction) on the bag's Config
SETTINGS = {"projected": ("projected", float("inf")), "exact_first": ("exact_first", STOP59_CAP)}


def _scene_with(tangent):
    """scenes.bag.bag_scene, with the bag's Config changed to ``tangent``'s (to be called
    while ``scenes.bag.bag_scene`` is the library's own)."""
    import scenes.bag as B
    build = B.bag_scene

    name, cap = SETTINGS[tangent]

    def bag_scene(*a, **k):
        sc = build(*a, **k)
        return dataclasses.replace(sc, config=dataclasses.replace(sc.config, newton_tangent=name, max_direction=cap))
    return bag_scene


def _run(task):
    """(tangent, factor, folder) -> the run's measurements, audit and wall time."""
    tangent, factor, out = task
    import scenes.bag as B
    from ipcjax.model import Params
    from scenes.bag_run import BagRunOptions, run_bag

    params = Params.film_defaults(youngs_modulus=factor * float(Params.film_defaults().youngs_modulus))
    path = os.path.join(out, "summary.json")
    s, wall = None, None
    if os.path.exists(path):
        old = json.load(open(path))
        if (old.get("newton_tangent") == tangent and old["params"]["youngs_modulus"] == params.youngs_modulus
                and (old["failure"] or abs(old.get("simulated_s", 0) - B.PROTOCOLS["full"].t_end) < 1e-6)):
            s = old
    if s is None:
        build = B.bag_scene
        B.bag_scene = _scene_with(tangent)  # run_bag imports it from scenes.bag when called
        try:
            t0 = time.perf_counter()
            s = run_bag(BagRunOptions(out=out, params=params, save_every=6, mesh_every=0, pictures=False,
                                      progress=False)).summary
            wall = time.perf_counter() - t0
        finally:  # a worker runs several tasks: the next one wraps the library's bag_scene, not this
            B.bag_scene = build
    if s.get("newton_tangent") != tangent:
        raise RuntimeError(f"{out}: summary.json says newton_tangent={s.get('newton_tangent')!r}, not {tangent!r}")
    m = s["measurements"]
    return dict(tangent=tangent, factor=factor, out=out, failure=s["failure"],
                self_intersecting=s["audit"]["frames_with_self_intersection"],
                y_mm=[*m["neck_width_mm"], m["flap_height_mm"]], newton_iterations=s["newton_iterations"],
                projected_directions=s.get("projected_directions"), wall_s=wall)


def _stats(rows):
    """Mean and sample standard deviation of the ends of the runs that finished without a
    failure or a self-intersecting frame; the others are counted, not measured."""
    ok = [r for r in rows if not (r["failure"] or r["self_intersecting"])]
    y = np.asarray([r["y_mm"] for r in ok]).reshape(-1, 3)
    sd = y.std(axis=0, ddof=1) if len(y) > 1 else np.full(3, np.nan)
    mean = y.mean(axis=0) if len(y) else np.full(3, np.nan)
    return dict(n=len(y), failed=len(rows) - len(ok), mean_mm=mean.tolist(), sd_mm=sd.tolist())


def main(argv=None) -> int:
    from ipcjax import xla_threads

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/tangent_ensemble")
    ap.add_argument("--ks", default="-3,-2,-1,0,1,2,3", help="E × (1 + k·delta) for each k")
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--tangents", default=",".join(TANGENTS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    ks = [int(v) for v in a.ks.split(",")]
    tangents = a.tangents.split(",")
    if not set(tangents) <= set(TANGENTS):
        ap.error(f"--tangents must be from {TANGENTS}; got {a.tangents!r}")
    if not (math.isfinite(a.delta) and 0 < a.delta < 1e-3):
        ap.error(f"--delta must lie in (0, 1e-3); got {a.delta}")
    # one XLA thread per program, as the command-line jobs run (ipcjax.xla_threads); the
    # spawned workers inherit the environment
    os.environ["XLA_FLAGS"] = xla_threads.with_flags(os.environ.get("XLA_FLAGS", ""))
    # alternate the tangents, so that a change of the machine's load falls on both
    tasks = [(t, 1.0 + k * a.delta, os.path.join(a.out, t, f"k={k}")) for k in ks for t in tangents]
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(a.workers, mp_context=mp.get_context("spawn")) as pool:
        runs = list(pool.map(_run, tasks))
    for r in runs:
        print(f"{r['tangent']:>11} E × (1 {(r['factor'] - 1) / a.delta:+.0f}·{a.delta:g}): neck "
              f"{r['y_mm'][0]:.2f} × {r['y_mm'][1]:.2f} mm, flap {r['y_mm'][2]:.2f} mm, "
              f"{r['newton_iterations']} iterations"
              + (f"; FAILED {r['failure']}" if r["failure"] else "")
              + (f"; {r['self_intersecting']} self-intersecting frames" if r["self_intersecting"] else ""))
    per = {t: _stats([r for r in runs if r["tangent"] == t]) for t in tangents}
    for t, st in per.items():
        print(f"{t:>11}: {st['n']} runs finished, {st['failed']} failed; mean " + ", ".join(f"{v:.2f}" for v in st["mean_mm"])
              + " mm, sd " + ", ".join(f"{v:.2f}" for v in st["sd_mm"]) + " mm (neck x, neck y, flap)")
    record = dict(command="python3 benchmarks/tangent_ensemble.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  delta=a.delta, ks=ks, runs=runs, per_tangent=per, wall_s=time.perf_counter() - t0,
                  load_average=list(os.getloadavg()), cpus=os.cpu_count())
    if len(per) == 2:
        p, e = (per[t] for t in TANGENTS)
        diff = np.subtract(e["mean_mm"], p["mean_mm"])
        se = np.sqrt(np.square(e["sd_mm"]) / e["n"] + np.square(p["sd_mm"]) / p["n"])
        record["exact_first_minus_projected_mm"] = diff.tolist()
        record["standard_error_mm"] = se.tolist()
        print("exact_first − projected: " + ", ".join(f"{d:+.2f} ± {s:.2f}" for d, s in zip(diff, se))
              + " mm (difference of the means ± its standard error)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(record, f, indent=1)
    bad = [r for r in runs if r["failure"] or r["self_intersecting"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

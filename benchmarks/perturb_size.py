"""Which start kick changes the bag's pleats? Runs from one saved state, unperturbed and
with the film's velocities kicked (scenes/perturb.py) at a few sizes and seeds, and the
spread of their end measurements against one run's scatter about the E trend
(fitting.uncertainty.MODEL_SCATTER_MM).

    python3 benchmarks/perturb_size.py --out runs/perturb [--sizes 0.01,0.03,0.1] [--seeds 1,2]
        [--state scenes/data/bag_full_tie.npz] [--workers 2] [--json docs/figures/perturb_size_35.json]

Each run is ``run_bag`` from ``--state`` to the protocol's end at the film defaults, in its
own folder under ``--out`` (a folder whose run already finished with the same kick is
read back, not run again), ``--workers`` at a time in separate processes. Prints, and
writes with ``--json``, per run its neck x, neck y and flap (mm) and their difference
from the unperturbed run, and per size the rms of those differences over the seeds, in
units of MODEL_SCATTER_MM too: a kick too small to change the pleats leaves the
measurements within a small fraction of that scatter; one that changes them moves them
by about the scatter (√2 × it, as the difference of two runs).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _run(task):
    """One run (size, seed, folder, state) -> its summary's measurements and wall time."""
    size, seed, out, state = task
    from fitting.bag_nodes import NodeCache
    from ipcjax.model import Params
    from scenes.bag import PROTOCOLS
    from scenes.bag_run import BagRunOptions, run_bag
    from scenes.perturb import describe

    t_end = PROTOCOLS["full"].t_end
    s = NodeCache.finished(out, Params.film_defaults(), t_end, describe(size, seed))
    t0 = time.perf_counter()
    if s is None:
        s = run_bag(BagRunOptions(out=out, resume=state, save_every=6, mesh_every=0, pictures=False,
                                  progress=False, perturb=size, seed=seed)).summary
    m = s["measurements"]
    return dict(size_m_s=size, seed=seed, out=out, failure=s["failure"],
                self_intersecting=s["audit"]["frames_with_self_intersection"],
                y_mm=[*m["neck_width_mm"], m["flap_height_mm"]], newton_iterations=s["newton_iterations"],
                wall_s=time.perf_counter() - t0)


def main(argv=None) -> int:
    from fitting.uncertainty import MODEL_SCATTER_MM

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/perturb")
    ap.add_argument("--sizes", default="0.01,0.03,0.1", help="rms kicks, m/s")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--state", default=os.path.join(ROOT, "scenes", "data", "bag_full_tie.npz"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    sizes = [float(v) for v in a.sizes.split(",")]
    seeds = [int(v) for v in a.seeds.split(",")]
    tasks = [(0.0, 0, os.path.join(a.out, "unperturbed"), a.state)]
    tasks += [(s, k, os.path.join(a.out, f"kick{s:g}_seed{k}"), a.state) for s in sizes for k in seeds]
    with cf.ProcessPoolExecutor(a.workers, mp_context=mp.get_context("spawn")) as pool:
        runs = list(pool.map(_run, tasks))
    base = np.asarray(runs[0]["y_mm"])
    scatter = np.asarray(MODEL_SCATTER_MM)
    for r in runs:
        r["minus_unperturbed_mm"] = (np.asarray(r["y_mm"]) - base).tolist()
        print(f"kick {r['size_m_s']:g} m/s seed {r['seed']}: neck {r['y_mm'][0]:.2f} x {r['y_mm'][1]:.2f} mm, "
              f"flap {r['y_mm'][2]:.2f} mm; minus unperturbed "
              + ", ".join(f"{d:+.2f}" for d in r["minus_unperturbed_mm"]) + " mm"
              + (f"; FAILED {r['failure']}" if r["failure"] else "")
              + (f"; {r['self_intersecting']} self-intersecting frames" if r["self_intersecting"] else ""))
    by_size = {}
    for s in sizes:
        d = np.asarray([r["minus_unperturbed_mm"] for r in runs if r["size_m_s"] == s])
        rms = np.sqrt(np.mean(d**2, axis=0))
        by_size[f"{s:g}"] = dict(rms_minus_unperturbed_mm=rms.tolist(),
                                 in_model_scatter=(rms / scatter).tolist())
        print(f"kick {s:g} m/s: rms difference from the unperturbed run " + ", ".join(f"{v:.2f}" for v in rms)
              + " mm = " + ", ".join(f"{v:.2f}" for v in rms / scatter) + " × one run's scatter "
              + f"({', '.join(f'{v:g}' for v in scatter)} mm)")
    record = dict(command="python3 benchmarks/perturb_size.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  state=a.state, model_scatter_mm=scatter.tolist(), runs=runs, by_size=by_size,
                  load_average=list(os.getloadavg()), cpus=os.cpu_count())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(record, f, indent=1)
    bad = [r for r in runs if r["failure"] or r["self_intersecting"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

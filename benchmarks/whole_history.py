"""Bags whose whole history ran at one E: recovery targets that the fit's runs from the
tie checkpoint (made at 315 MPa) have never seen.

    python3 benchmarks/whole_history.py --factors 1.104,1.346 --out runs/whole_E \
        --jsonl docs/figures/bag_sweep_E_whole/sweep.jsonl [--workers 2]
    python3 benchmarks/whole_history.py --summaries RUN/summary.json ... --jsonl FILE

The first form runs the whole protocol (t = 0 to 10.50 s, ``ipcjax bag --youngs-modulus
E``: the gather, the cinch, the tie and the release all at E = factor × 315 MPa) in
``OUT/youngs_modulus=<factor>/``, ``--workers`` at a time in separate processes (a folder
whose run already finished or failed at that E is read back, not run again); the second reads
finished runs' summaries. Either appends one JSON line per run to ``--jsonl``: ``factor``
(the truth, × the film default), ``y_mm`` (neck x, neck y, flap at 10.50 s), the audit
and wall time; or, for a run that failed, its ``error``. ``python3 benchmarks/bag_sweep.py --recover --targets FILE --out
docs/figures/bag_sweep_E`` then says where the fit's smoothed loss over the tie-start
lattice puts each of them (docs/differentiation.md, "A whole history at E").
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def target_line(summary: dict, source: str) -> dict:
    """One targets line from a whole-protocol run's summary. A run that failed (the unfold
    check, a step) or has a self-intersecting frame gives a line with its ``error`` and no
    measurements: a bag the protocol does not make at that E, which is no target
    (``bag_sweep.py`` leaves such lines out and names them). Refuses (ValueError) a run that
    is not a whole full-protocol run from t = 0, or a kicked one."""
    from ipcjax.model import Params
    from scenes.bag import DT, PROTOCOLS

    e0 = float(Params.film_defaults().youngs_modulus)
    factor = summary["params"]["youngs_modulus"] / e0
    if summary.get("perturbation") is not None:
        raise ValueError(f"{source}: a kicked run; a target's history is the protocol's own")
    if summary.get("protocol") != "full" or summary.get("resolution") != "full":
        raise ValueError(f"{source}: not a whole full-protocol run of the 481-vertex bag from t = 0")
    if summary.get("failure") or summary["audit"]["frames_with_self_intersection"]:
        why = (summary["failure"] or {}).get("reason") or \
            f"{summary['audit']['frames_with_self_intersection']} self-intersecting frames"
        return dict(param="youngs_modulus", factor=factor, error=why, source=source)
    t_end = PROTOCOLS["full"].t_end
    if summary["steps_this_run"] != round(t_end / DT) or abs(summary["simulated_s"] - t_end) > 1e-6:
        raise ValueError(f"{source}: not a whole full-protocol run of the 481-vertex bag from t = 0")
    m = summary["measurements"]
    return dict(param="youngs_modulus", factor=factor,
                y_mm=[*m["neck_width_mm"], m["flap_height_mm"]], label="whole history", source=source,
                params=summary["params"], frames_self_intersecting=summary["audit"]["frames_with_self_intersection"],
                unfold_checked=summary.get("unfold_checked"), newton_iterations=summary.get("newton_iterations"),
                wall_s=summary.get("wall_s"))


def _run(task):
    """(factor, folder) -> the finished run's summary (run now unless already there)."""
    factor, out = task
    from fitting.bag_nodes import NodeCache
    from ipcjax.model import Params
    from scenes.bag import PROTOCOLS
    from scenes.bag_run import BagRunOptions, run_bag

    params = Params.film_defaults(youngs_modulus=factor * float(Params.film_defaults().youngs_modulus))
    # a run that failed at this E fails again: read back too, not rerun
    s = NodeCache.finished(out, params, PROTOCOLS["full"].t_end, failed=True)
    if s is None:
        t0 = time.perf_counter()
        s = run_bag(BagRunOptions(out=out, params=params, mesh_every=0, pictures=False, progress=False)).summary
        s = dict(s, wall_s=time.perf_counter() - t0)
    return s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--factors", help="E / 315 MPa of each whole run, comma-separated")
    ap.add_argument("--summaries", nargs="+", help="finished runs' summary.json files, in place of --factors")
    ap.add_argument("--out", default="runs/whole_E")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--jsonl", required=True, help="append the targets' lines here")
    a = ap.parse_args(argv)
    if bool(a.factors) == bool(a.summaries):
        ap.error("give either --factors or --summaries")
    if a.summaries:
        found = [(json.load(open(p)), p) for p in a.summaries]
    else:
        try:
            factors = [float(v) for v in a.factors.split(",")]
        except ValueError:
            ap.error(f"--factors takes comma-separated numbers; got {a.factors!r}")
        if not all(math.isfinite(f) and f > 0 for f in factors):
            ap.error(f"--factors must be > 0; got {a.factors!r}")
        tasks = [(f, os.path.join(a.out, f"youngs_modulus={f:.6g}")) for f in factors]
        with cf.ProcessPoolExecutor(a.workers, mp_context=mp.get_context("spawn")) as pool:
            found = [(s, os.path.join(out, "summary.json")) for s, (_, out) in zip(pool.map(_run, tasks), tasks)]
    lines = [target_line(s, src) for s, src in found]
    with open(a.jsonl, "a") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
            print(f"E × {line['factor']:.4f}: " + (f"FAILED, {line['error']}" if "error" in line else
                  f"neck {line['y_mm'][0]:.2f} × {line['y_mm'][1]:.2f} mm, flap {line['y_mm'][2]:.2f} mm")
                  + f" ({line['source']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

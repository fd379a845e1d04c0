"""The bag's rest shape over one parameter: the sweep behind docs/differentiation.md's
bag-fit section.

    python3 benchmarks/bag_sweep.py --param youngs_modulus --out runs/sweep_E

Runs the bag from the tie checkpoint (tests/data/bag_full_tie.npz, 8.40 s) to 10.50 s at
the factors 2^(k/7) of the parameter's film default, k = −8 … 8: one grid step is the fit's
smoothing width σ = ln 2 / 7 (fitting.bag_rest.DEFAULT_SIGMA), so the 15 points k = −7 … 7
(× 0.5 … 2.0) each have their two smoothing nodes on the grid. Each run is
:func:`fitting.bag_rest.run_node` in ``--workers`` processes, and appends one JSON line
per run to ``OUT/sweep.jsonl`` (factor, measurements in mm, the rest-state Jacobian in mm
per unit log-parameter, wall time; or the error). A sweep stopped part-way continues
where it stopped; its run folders are named as the fit's nodes
(fitting.bag_rest.node_folder), so ``ipcjax fit --scene bag --out D`` reuses the runs of a
sweep with ``--out D/nodes`` wherever a node falls on the grid. ``python3 benchmarks/bag_sweep.py --report OUT`` prints the table: each
value, the measurements, the two-node smoothed loss against a target and its slope beside
the smoothed gradient (fitting.bag_rest).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _one(args):
    import ipcjax  # noqa: F401  (float64)
    from fitting.bag_rest import BAG_NAMES, NodeFailed, _full_z, node_folder, run_node

    param, factor, out, start = args
    z = _full_z((param,), [math.log(factor) + _full_z((), [])[BAG_NAMES.index(param)]])
    try:
        nd = run_node(start, z, os.path.join(out, node_folder(z, start)), reuse=True)
    except NodeFailed as e:
        return dict(param=param, factor=factor, error=str(e))
    return dict(param=param, factor=factor, y_mm=(nd.y * 1e3).tolist(), J_rest_mm=(nd.J * 1e3).tolist(),
                residual_ratio=nd.residual_ratio, stable=nd.stable, max_speed_m_s=nd.max_speed, wall_s=nd.wall_s)


def grid(half: int, step: float):
    """Factors e^{k·step}, k = −half−1 … half+1: 2·half + 1 sweep points, each with its two
    smoothing nodes on the grid (the outer two are nodes only)."""
    return [math.exp(k * step) for k in range(-half - 1, half + 2)]


def report(folder, param="youngs_modulus", target=None, png=None) -> dict:
    """The smoothed loss along the sweep and its two gradient estimates, from sweep.jsonl.

    At sweep point k (nodes k ± 1): ȳ = (y₋ + y₊)/2, L = Σ ((ȳ − t)/1 mm)², Stein's gradient
    2 rᵀ(y₊ − y₋)/(2σ) and the rest-state one 2 rᵀ(J₋ + J₊)/2, in mm² per unit log-parameter;
    the slope is the central difference of L over the neighbouring points (one-sided at
    the ends). ``target`` (m): default the smoothed measurement at the film default (k = 0).
    """
    from fitting.bag_rest import BAG_NAMES, DEFAULT_SIGMA

    rows = [r for r in map(json.loads, open(os.path.join(folder, "sweep.jsonl"))) if r["param"] == param]
    by_k = {round(math.log(r["factor"]) / DEFAULT_SIGMA): r for r in rows}
    bad = {k: r["error"] for k, r in by_k.items() if "error" in r}
    ks = sorted(k for k in by_k if k - 1 in by_k and k + 1 in by_k and not {k - 1, k + 1} & set(bad))
    col = BAG_NAMES.index(param)
    Y = {k: np.asarray(r["y_mm"]) for k, r in by_k.items() if k not in bad}
    Jr = {k: np.asarray(r["J_rest_mm"])[:, col] for k, r in by_k.items() if k not in bad}
    ybar = {k: 0.5 * (Y[k - 1] + Y[k + 1]) for k in ks}
    t = ybar[0] if target is None else np.asarray(target) * 1e3
    loss = {k: float(np.sum((ybar[k] - t) ** 2)) for k in ks}
    stein = {k: float(2 * (ybar[k] - t) @ (Y[k + 1] - Y[k - 1]) / (2 * DEFAULT_SIGMA)) for k in ks}
    rest = {k: float(2 * (ybar[k] - t) @ (0.5 * (Jr[k - 1] + Jr[k + 1]))) for k in ks}
    slope = {}
    for k in ks:
        lo, hi = (k - 1 if k - 1 in loss else k), (k + 1 if k + 1 in loss else k)
        if hi > lo:
            slope[k] = (loss[hi] - loss[lo]) / ((hi - lo) * DEFAULT_SIGMA)
    match = lambda g: sum(np.sign(g[k]) == np.sign(slope[k]) for k in slope) / max(len(slope), 1)
    table = [dict(factor=math.exp(k * DEFAULT_SIGMA), y_mm=Y[k].tolist(), y_smoothed_mm=ybar[k].tolist(),
                  loss_mm2=loss[k], slope=slope.get(k), stein=stein[k], rest=rest[k]) for k in ks]
    out = dict(param=param, target_mm=t.tolist(), points=table, failed=bad,
               sign_match_stein=float(match(stein)), sign_match_rest=float(match(rest)))
    if png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        f = [r["factor"] for r in table]
        fig, ax = plt.subplots(3, 1, figsize=(6.5, 8), sharex=True)
        allk = sorted(Y)
        for i, name in enumerate(("neck x", "neck y", "flap")):
            ax[0].plot([math.exp(k * DEFAULT_SIGMA) for k in allk], [Y[k][i] for k in allk], "o:", ms=3,
                       label=f"{name} (one run)")
            ax[0].plot(f, [r["y_smoothed_mm"][i] for r in table], "-", color=ax[0].lines[-1].get_color())
        ax[0].set_ylabel("mm"); ax[0].legend(fontsize=7, ncol=3)
        ax[1].plot(f, [r["loss_mm2"] for r in table], "k.-"); ax[1].set_ylabel("smoothed loss, mm²")
        ax[2].plot(f, [r["stein"] for r in table], "b.-", label="Stein (fit)")
        ax[2].plot(f, [r["rest"] for r in table], "g.--", label="rest-state IFT")
        ax[2].plot([math.exp(k * DEFAULT_SIGMA) for k in slope], list(slope.values()), "r+", label="loss slope")
        ax[2].axhline(0, color="0.6", lw=0.5); ax[2].set_ylabel("dL/dlog p, mm²"); ax[2].legend(fontsize=7)
        ax[2].set_xscale("log"); ax[2].set_xlabel(f"{param} / film default")
        fig.tight_layout(); fig.savefig(png); plt.close(fig)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--param", default="youngs_modulus", choices=("youngs_modulus", "friction", "bending_scale"))
    ap.add_argument("--half", type=int, default=7, help="sweep points each side of the film default (7: 15 points)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--start", default="tests/data/bag_full_tie.npz")
    ap.add_argument("--out", default="runs/sweep")
    ap.add_argument("--report", action="store_true", help="print the table of OUT/sweep.jsonl and write OUT/sweep.png")
    ap.add_argument("--spec-targets", action="store_true", help="report: the loss against the specification's bag")
    a = ap.parse_args(argv)
    if a.report:
        from fitting.bag_rest import SPEC_TARGETS

        r = report(a.out, a.param, SPEC_TARGETS if a.spec_targets else None,
                   os.path.join(a.out, "sweep_spec.png" if a.spec_targets else "sweep.png"))
        print(f"{'factor':>7} {'neck x':>7} {'neck y':>7} {'flap':>6} | {'x̄':>6} {'ȳ':>6} {'flap̄':>6} "
              f"{'loss':>8} {'slope':>8} {'Stein':>8} {'rest':>8}")
        for p in r["points"]:
            sl = "" if p["slope"] is None else f"{p['slope']:8.1f}"
            print(f"{p['factor']:7.3f} " + " ".join(f"{v:7.2f}" for v in p["y_mm"]) + " | "
                  + " ".join(f"{v:6.2f}" for v in p["y_smoothed_mm"])
                  + f" {p['loss_mm2']:8.2f} {sl:>8} {p['stein']:8.1f} {p['rest']:8.1f}")
        print(f"sign of the gradient = sign of the loss slope: Stein {r['sign_match_stein']:.0%}, "
              f"rest-state {r['sign_match_rest']:.0%}; target {np.round(r['target_mm'], 2).tolist()} mm"
              + (f"; failed runs: {r['failed']}" if r["failed"] else ""))
        return
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "sweep.jsonl")
    done = set()
    if os.path.exists(path):
        done = {(r["param"], round(r["factor"], 9)) for r in map(json.loads, open(path)) if "error" not in r}
    from fitting.bag_rest import DEFAULT_SIGMA

    factors = grid(a.half, DEFAULT_SIGMA)
    todo = [(a.param, f, a.out, a.start) for f in factors if (a.param, round(f, 9)) not in done]
    with cf.ProcessPoolExecutor(a.workers, mp_context=mp.get_context("spawn")) as pool:
        for r in pool.map(_one, todo):
            with open(path, "a") as fh:
                fh.write(json.dumps(r) + "\n")
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()

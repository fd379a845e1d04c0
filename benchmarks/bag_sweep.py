"""The bag's rest shape over one parameter: the sweep behind docs/differentiation.md's
bag-fit section.

    python3 benchmarks/bag_sweep.py --param youngs_modulus --out runs/sweep_E

Runs the bag from the tie checkpoint (tests/data/bag_full_tie.npz, 8.40 s) to 10.50 s at
the factors 2^(k/7) of the parameter's film default, k = −7 − w … 7 + w: a smoothing width
of w grid steps (``--width``, default 2: the fit's σ = 2 ln 2 / 7,
fitting.bag_rest.DEFAULT_SIGMA) gives the 15 points k = −7 … 7 (× 0.5 … 2.0) their two
smoothing nodes on the grid. Each run is
:func:`fitting.bag_rest.run_node` in ``--workers`` processes, and appends one JSON line
per run to ``OUT/sweep.jsonl`` (factor, measurements in mm, the rest-state Jacobian in mm
per unit log-parameter, wall time; or the error). A sweep stopped part-way continues
where it stopped, and ``--k=K1,K2,…`` runs only those grid points (a coarse sweep); its run folders are named as the fit's nodes
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
    """Factors e^{k·step}, k = −half − 1 … half + 1."""
    return [math.exp(k * step) for k in range(-half - 1, half + 2)]


STEP = math.log(2.0) / 7  # the grid step in log-parameters (fitting.bag_rest.DEFAULT_SIGMA is 2 steps)


def report(folder, param="youngs_modulus", target=None, png=None, width: int = 2) -> dict:
    """The smoothed loss along the sweep and its two gradient estimates, from sweep.jsonl.

    Smoothing width σ = ``width`` grid steps. At sweep point k (nodes k ± width):
    ȳ = (y₋ + y₊)/2, L = Σ ((ȳ − t)/1 mm)², Stein's gradient 2 rᵀ(y₊ − y₋)/(2σ) and the
    rest-state one 2 rᵀ(J₋ + J₊)/2, in mm² per unit log-parameter; the slope is the central
    difference of L over the neighbouring points (one-sided at the ends). ``target`` (m):
    default the smoothed measurement at the film default (k = 0).
    """
    from fitting.bag_rest import BAG_NAMES

    w = int(width)
    sigma = w * STEP
    rows = [r for r in map(json.loads, open(os.path.join(folder, "sweep.jsonl"))) if r["param"] == param]
    by_k = {round(math.log(r["factor"]) / STEP): r for r in rows}
    bad = {k: r["error"] for k, r in by_k.items() if "error" in r}
    ks = sorted(k for k in by_k if k - w in by_k and k + w in by_k and not {k - w, k + w} & set(bad))
    col = BAG_NAMES.index(param)
    Y = {k: np.asarray(r["y_mm"]) for k, r in by_k.items() if k not in bad}
    Jr = {k: np.asarray(r["J_rest_mm"])[:, col] for k, r in by_k.items() if k not in bad}
    ybar = {k: 0.5 * (Y[k - w] + Y[k + w]) for k in ks}
    t = ybar[0] if target is None else np.asarray(target) * 1e3
    loss = {k: float(np.sum((ybar[k] - t) ** 2)) for k in ks}
    stein = {k: float(2 * (ybar[k] - t) @ (Y[k + w] - Y[k - w]) / (2 * sigma)) for k in ks}
    rest = {k: float(2 * (ybar[k] - t) @ (0.5 * (Jr[k - w] + Jr[k + w]))) for k in ks}
    slope = {}
    for k in ks:
        lo, hi = (k - 1 if k - 1 in loss else k), (k + 1 if k + 1 in loss else k)
        if hi > lo:
            slope[k] = (loss[hi] - loss[lo]) / ((hi - lo) * STEP)
    # None, not 0 %, where no point has a neighbour to take the slope from (a sweep run with --k)
    match = lambda g: (sum(np.sign(g[k]) == np.sign(slope[k]) for k in slope) / len(slope)) if slope else None
    table = [dict(factor=math.exp(k * STEP), y_mm=Y[k].tolist(), y_smoothed_mm=ybar[k].tolist(),
                  loss_mm2=loss[k], slope=slope.get(k), stein=stein[k], rest=rest[k]) for k in ks]
    # one line per measurement over every run: its trend and the runs' scatter about it
    kk = np.array(sorted(Y)) * STEP
    Ym = np.stack([Y[k] for k in sorted(Y)])
    A = np.stack([np.ones_like(kk), kk], axis=1)
    coef, *_ = np.linalg.lstsq(A, Ym, rcond=None)
    scatter = np.std(Ym - A @ coef, axis=0, ddof=2)
    trend = dict(slope_mm_per_log=coef[1].tolist(), scatter_mm=scatter.tolist(),
                 sigma_log_from_scatter=float(1.0 / np.sqrt(np.sum(coef[1] ** 2 / scatter**2))))
    out = dict(param=param, sigma=sigma, target_mm=t.tolist(), points=table, failed=bad, trend=trend,
               sign_match_stein=match(stein), sign_match_rest=match(rest), sign_points=len(slope))
    if png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        f = [r["factor"] for r in table]
        fig, ax = plt.subplots(3, 1, figsize=(6.5, 8), sharex=True)
        allk = sorted(Y)
        for i, name in enumerate(("neck x", "neck y", "flap")):
            ax[0].plot([math.exp(k * STEP) for k in allk], [Y[k][i] for k in allk], "o:", ms=3,
                       label=f"{name} (one run)")
            ax[0].plot(f, [r["y_smoothed_mm"][i] for r in table], "-", color=ax[0].lines[-1].get_color())
        ax[0].set_ylabel("mm"); ax[0].legend(fontsize=7, ncol=3)
        ax[1].plot(f, [r["loss_mm2"] for r in table], "k.-"); ax[1].set_ylabel("smoothed loss, mm²")
        ax[2].plot(f, [r["stein"] for r in table], "b.-", label="Stein (fit)")
        ax[2].plot(f, [r["rest"] for r in table], "g.--", label="rest-state IFT")
        ax[2].plot([math.exp(k * STEP) for k in slope], list(slope.values()), "r+", label="loss slope")
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
    ap.add_argument("--width", type=int, default=2, help="smoothing width σ in grid steps of ln 2 / 7 (default 2, "
                    "the fit's); the sweep runs k = −7 − w … 7 + w")
    ap.add_argument("--k", help="run only these grid points, e.g. --k=-3,0,3 (factors 2^(k/7)); default the whole "
                    "grid, in ascending order")
    a = ap.parse_args(argv)
    if a.report:
        from fitting.bag_rest import SPEC_TARGETS

        name = f"sweep_w{a.width}" + ("_spec" if a.spec_targets else "")
        r = report(a.out, a.param, SPEC_TARGETS if a.spec_targets else None, os.path.join(a.out, name + ".png"),
                   a.width)
        with open(os.path.join(a.out, name + ".json"), "w") as f:
            json.dump(r, f, indent=1)
        print(f"{'factor':>7} {'neck x':>7} {'neck y':>7} {'flap':>6} | {'x̄':>6} {'ȳ':>6} {'flap̄':>6} "
              f"{'loss':>8} {'slope':>8} {'Stein':>8} {'rest':>8}")
        for p in r["points"]:
            sl = "" if p["slope"] is None else f"{p['slope']:8.1f}"
            print(f"{p['factor']:7.3f} " + " ".join(f"{v:7.2f}" for v in p["y_mm"]) + " | "
                  + " ".join(f"{v:6.2f}" for v in p["y_smoothed_mm"])
                  + f" {p['loss_mm2']:8.2f} {sl:>8} {p['stein']:8.1f} {p['rest']:8.1f}")
        sign = (f"Stein {r['sign_match_stein']:.0%}, rest-state {r['sign_match_rest']:.0%} of "
                f"{r['sign_points']} points" if r["sign_points"] else
                "not measured (no sweep point has a neighbour on the grid to take the loss slope from)")
        print(f"sign of the gradient = sign of the loss slope: {sign}; target {np.round(r['target_mm'], 2).tolist()} mm"
              + (f"; failed runs: {r['failed']}" if r["failed"] else ""))
        tr = r["trend"]
        print("trend over all runs (mm per unit log-parameter): "
              + ", ".join(f"{n} {a:+.2f} ± scatter {b:.2f} mm" for n, a, b in
                          zip(("neck x", "neck y", "flap"), tr["slope_mm_per_log"], tr["scatter_mm"]))
              + f"; one run's scatter alone pins the log-parameter to ±{tr['sigma_log_from_scatter']:.3f}")
        return
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "sweep.jsonl")
    done = set()
    if os.path.exists(path):
        done = {(r["param"], round(r["factor"], 9)) for r in map(json.loads, open(path)) if "error" not in r}
    factors = grid(a.half + a.width - 1, STEP)  # k = −half − width … half + width
    if a.k:
        try:
            ks = [int(t) for t in a.k.split(",")]
        except ValueError:
            ap.error(f"--k takes comma-separated integers, e.g. --k=-3,0,3; got {a.k!r}")
        factors = [math.exp(k * STEP) for k in ks]
    todo = [(a.param, f, a.out, a.start) for f in factors if (a.param, round(f, 9)) not in done]
    with cf.ProcessPoolExecutor(a.workers, mp_context=mp.get_context("spawn")) as pool:
        for r in pool.map(_one, todo):
            with open(path, "a") as fh:
                fh.write(json.dumps(r) + "\n")
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()

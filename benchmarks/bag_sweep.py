"""The bag's rest shape over one parameter: the sweep behind docs/differentiation.md's
bag-fit section.

    python3 benchmarks/bag_sweep.py --param youngs_modulus --out runs/sweep_E

Runs the bag from the tie checkpoint (scenes/data/bag_full_tie.npz, 8.40 s) to 10.50 s at
the fit's lattice points 2^(k/7) × the parameter's film default, k a multiple of w
(``--width``, default 2: the fit's lattice step 2 ln 2 / 7, fitting.smoothing.DEFAULT_STEP),
from the lattice nodes of k = −7 (× 0.5) to those of k = 7 (× 2.0): k = −10, −8, … 10 for
w = 2. Each run is :func:`fitting.bag_nodes.run_node` in ``--workers`` processes, and appends
one JSON line per run to ``OUT/sweep.jsonl`` (factor, measurements in mm, the rest-state
Jacobian in mm per unit log-parameter, wall time; or the error). A sweep stopped part-way
continues where it stopped, and ``--k=K1,K2,…`` runs only those grid points (any k, on the
lattice or not); its run folders are named as the fit's nodes
(fitting.bag_nodes.NodeCache), so ``ipcjax fit --scene bag --out D`` reuses the runs of a
sweep with ``--out D/nodes``. ``python3 benchmarks/bag_sweep.py --report --out OUT`` prints
the table: at each grid point k = −7 … 7 the single run (where there is one), the fit's
spline-smoothed measurements and loss against a target, the loss's slope between
neighbouring points beside the smoothed loss's own gradient and the rest-state one
(fitting.smoothing), and the trend and scatter of the single runs. ``--recover`` takes each
single run as a fit's targets and prints where the smoothed loss is smallest, with the
interval the fit's ``model_scatter`` gives there and whether it holds the truth: what one
run's scatter does to a fit whose targets are one bag. ``--recover --targets FILE`` takes
other runs instead, e.g. bags whose whole history ran at their E
(benchmarks/whole_history.py); ``--runs-per-node K --within X,Y,F`` gives the interval of
K runs per node with that measured spread, ``--model-scatter X,Y,F`` another run-to-run
scatter. A folder of whole-history runs (lines without rest-state Jacobians) is a lattice
too. ``--compare FILE`` prints how far the runs of another sweep file lie from their twins
here (reruns).
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
    from fitting.bag_nodes import NodeCache, NodeFailed, full_z, run_node
    from fitting.rest_derivative import BAG_NAMES

    param, factor, out, start = args
    z = full_z((param,), [math.log(factor) + full_z((), [])[BAG_NAMES.index(param)]])
    try:
        nd = run_node(start, z, NodeCache(start, out).folder(z), reuse=True)
    except NodeFailed as e:
        return dict(param=param, factor=factor, error=str(e))
    return dict(param=param, factor=factor, y_mm=(nd.y * 1e3).tolist(), J_rest_mm=(nd.J * 1e3).tolist(),
                residual_ratio=nd.residual_ratio, stable=nd.stable, max_speed_m_s=nd.max_speed, wall_s=nd.wall_s)


STEP = math.log(2.0) / 7  # the grid step in log-parameters (fitting.smoothing.DEFAULT_STEP is 2 steps)


def lattice_ks(half: int, width: int) -> list:
    """The grid points k (multiples of ``width``) of the lattice nodes that the smoothed
    measurements at k = −half … half need."""
    from fitting.smoothing import lattice_support

    top = int(lattice_support([half / width])[0].max())
    return [j * width for j in range(-top, top + 1)]


def _lattice(folder, param, width: int):
    """The sweep's single runs Y {k: y (mm)}, its failed runs {k: error}, and the fit's
    smoothing over its lattice nodes (every ``width``-th grid point): ``smoothed(u)`` at
    u grid steps (any real u) gives (ȳ, its spline derivative, the nodes' weighted
    rest-state derivative) in mm per unit log-parameter, or None where a node is missing."""
    from fitting.rest_derivative import BAG_NAMES
    from fitting.smoothing import lattice_smooth, lattice_support

    h = width * STEP
    rows = [r for r in map(json.loads, open(os.path.join(folder, "sweep.jsonl"))) if r["param"] == param]
    by_k = {round(math.log(r["factor"]) / STEP): r for r in rows}
    bad = {k: r["error"] for k, r in by_k.items() if "error" in r}
    col = BAG_NAMES.index(param)
    Y = {k: np.asarray(r["y_mm"]) for k, r in by_k.items() if k not in bad}
    # the lattice nodes' (3, 3); NaN for runs that did not take it (benchmarks/whole_history.py)
    J_rest = {k: np.asarray(by_k[k].get("J_rest_mm", np.full((3, 3), np.nan))) for k in Y if k % width == 0}

    def smoothed(u):
        idx, w, dw = lattice_support([u / width])
        ks = [int(j) * width for j in idx[:, 0]]
        if any(kk not in J_rest for kk in ks):
            return None
        y, J = lattice_smooth(np.stack([Y[kk] for kk in ks]), w, dw, (param,), h, estimator="spline")
        # the nodes' own rest-state derivatives, also for μf (the fit's "rest" estimator
        # takes the spline's for PATH_ONLY parameters; the report shows what the IFT says)
        Jr = np.asarray(w) @ np.stack([J_rest[kk][:, col] for kk in ks])
        return y, J[:, 0], Jr

    return Y, bad, smoothed


def recover(folder, param="youngs_modulus", width: int = 2, per_step: int = 100, targets=None, *,
            scatter_mm=None, runs_per_node: int = 1, within_mm=None, bag_scatter_mm=None) -> dict:
    """Runs taken as the targets of a fit: where the fit's smoothed loss Σ((ȳ(z) − y)/1 mm)²
    has its smallest value, on a scan of ``per_step`` points per grid step over the span
    where the lattice nodes have run, and the interval the model's scatter leaves there.

    ``targets`` None takes each single run of the sweep (runs at the span's ends, with no
    scan point past them, are left out): what one run's scatter does to a fit whose targets
    are one bag, as against synthetic targets made by the smoothed model itself. Otherwise
    a list of dicts with ``factor`` (the truth, × the film default) and ``y_mm``, e.g. runs
    whose whole history is at that parameter (``--targets``); those the scan does not cover
    are left out. Each row's interval is the fit's ``model_scatter`` at the answer
    (:func:`fitting.uncertainty.scatter_budget` with the spline's Jacobian and effective
    runs there, one run's scatter ``scatter_mm`` (default MODEL_SCATTER_MM), K =
    ``runs_per_node`` runs per node with measured spread ``within_mm``): ``sigma_log``,
    ``low`` and ``high`` (× the film default), ``sigmas`` = log(truth / answer) / σ, and
    ``inside``, the truth within 1σ; ``one_bag``, the same for the fit's ``one_bag`` interval
    (:func:`fitting.uncertainty.one_bag`: the tape's 0.5 mm, one bag's own scatter
    ``bag_scatter_mm``, default BAG_SCATTER_MM, and the model's)."""
    from fitting.smoothing import effective_runs, lattice_support
    from fitting.uncertainty import BAG_SCATTER_MM, DEFAULT_NOISE, MODEL_SCATTER_MM, one_bag, scatter_budget

    Y, _, smoothed = _lattice(folder, param, int(width))
    us = np.arange(min(Y) * per_step, max(Y) * per_step + 1) / per_step
    curve = [(u, v[0], v[1]) for u in us if (v := smoothed(u)) is not None]
    if not curve:
        raise ValueError(f"{folder}: no point where all four lattice nodes of {param} have run")
    U = np.array([u for u, *_ in curve])
    Ys = np.stack([y for _, y, _ in curve])
    failed = []
    if targets is None:
        cases = [dict(factor=math.exp(k * STEP), y_mm=Y[k]) for k in sorted(Y)]
    else:
        failed = [dict(factor=float(t["factor"]), error=t["error"]) for t in targets if "error" in t]
        cases = [dict(t, factor=float(t["factor"]), y_mm=np.asarray(t["y_mm"], np.float64))
                 for t in targets if "error" not in t]
    scatter = MODEL_SCATTER_MM if scatter_mm is None else scatter_mm
    rows = []
    for c in cases:
        k = math.log(c["factor"]) / STEP
        if not (U[0] < k < U[-1]):
            continue
        L = np.sum((Ys - c["y_mm"]) ** 2, axis=1)
        i = int(np.argmin(L))
        found = math.exp(U[i] * STEP)
        eff = effective_runs(lattice_support([U[i] / int(width)])[1])
        budget = scatter_budget(curve[i][2][:, None], (param,), {param: found}, scatter, effective_runs=eff,
                                runs_per_node=runs_per_node, within_mm=within_mm)
        iv = budget["interval_1sigma"][param]
        miss = math.log(c["factor"] / found)
        ob = one_bag(curve[i][2][:, None], (param,), {param: found}, DEFAULT_NOISE * 1e3,
                     BAG_SCATTER_MM if bag_scatter_mm is None else bag_scatter_mm,
                     budget["node_scatter_mm"], effective_runs=eff)["interval_1sigma"][param]
        extra = {key: v for key, v in c.items() if key not in ("factor", "y_mm")}
        rows.append(dict(extra, factor=c["factor"], y_mm=np.asarray(c["y_mm"]).tolist(), found=found,
                         error=math.exp(-miss) - 1.0, loss_mm2=float(L[i]), at_scan_end=bool(i in (0, len(U) - 1)),
                         sigma_log=iv["sigma_log"], low=iv["low"], high=iv["high"],
                         sigmas=miss / iv["sigma_log"] if iv["sigma_log"] > 0 else math.inf,
                         inside=bool(abs(miss) <= iv["sigma_log"]),
                         one_bag=dict(sigma_log=ob["sigma_log"], low=ob["low"], high=ob["high"],
                                      sigmas=miss / ob["sigma_log"], inside=bool(abs(miss) <= ob["sigma_log"]))))
    err = np.array([r["error"] for r in rows])
    return dict(param=param, runs=rows, rms_error=float(np.sqrt(np.mean(err**2))) if rows else None,
                within_2pct=int(np.sum(np.abs(err) <= 0.02)), within_5pct=int(np.sum(np.abs(err) <= 0.05)),
                inside_1sigma=sum(r["inside"] for r in rows), inside_one_bag=sum(r["one_bag"]["inside"] for r in rows),
                failed_targets=failed, runs_per_node=int(runs_per_node),
                within_mm=None if within_mm is None else list(within_mm), scatter_mm=list(scatter))


def report(folder, param="youngs_modulus", target=None, png=None, width: int = 2, span: int = 7) -> dict:
    """The smoothed loss along the sweep and its two gradients, from sweep.jsonl.

    The fit's smoothing (fitting.smoothing.lattice_smooth) on the lattice of every
    ``width``-th grid point (step h = ``width`` grid steps; the fit's default is 2), evaluated
    at the grid points k = −span … span whose four lattice nodes have all run:
    ȳ = Σ w_j y_j, L = Σ ((ȳ − t)/1 mm)², the spline gradient 2 rᵀ Σ y_j ∂w_j/∂z (the fit's)
    and the rest-state one 2 rᵀ Σ w_j J_j, in mm² per unit log-parameter; the slope is the
    central difference of L over the neighbouring grid points (one-sided at the ends).
    ``target`` (m): default the smoothed measurement at the film default (k = 0).
    """
    w_ = int(width)
    Y, bad, smoothed = _lattice(folder, param, w_)
    h = w_ * STEP
    sm = {k: v for k in range(-span, span + 1) if (v := smoothed(k)) is not None}
    ks = sorted(sm)
    if target is None and smoothed(0) is None:
        raise ValueError(f"{folder}: the default target is the smoothed bag at the film default, and not all "
                         f"four lattice nodes around it have run for {param}; run them or give a target")
    t = smoothed(0)[0] if target is None else np.asarray(target) * 1e3
    loss = {k: float(np.sum((sm[k][0] - t) ** 2)) for k in ks}
    spline = {k: float(2 * (sm[k][0] - t) @ sm[k][1]) for k in ks}
    rest = {k: float(2 * (sm[k][0] - t) @ sm[k][2]) for k in ks}
    slope = {}
    for k in ks:
        lo, hi = (k - 1 if k - 1 in loss else k), (k + 1 if k + 1 in loss else k)
        if hi > lo:
            slope[k] = (loss[hi] - loss[lo]) / ((hi - lo) * STEP)
    # None, not 0 %, where no point has a neighbour to take the slope from (a sweep run with --k)
    # None, too, for a derivative the runs did not take (NaN: whole-history runs have no rest-state one)
    match = lambda g: ((sum(np.sign(g[k]) == np.sign(slope[k]) for k in slope) / len(slope))
                       if slope and not any(math.isnan(g[k]) for k in slope) else None)
    table = [dict(factor=math.exp(k * STEP), y_mm=Y[k].tolist() if k in Y else None, y_smoothed_mm=sm[k][0].tolist(),
                  loss_mm2=loss[k], slope=slope.get(k), spline=spline[k], rest=rest[k]) for k in ks]
    # one line per measurement over every run: its trend and the runs' scatter about it
    kk = np.array(sorted(Y)) * STEP
    Ym = np.stack([Y[k] for k in sorted(Y)])
    A = np.stack([np.ones_like(kk), kk], axis=1)
    coef, *_ = np.linalg.lstsq(A, Ym, rcond=None)
    scatter = np.std(Ym - A @ coef, axis=0, ddof=2)
    # None where the runs show no scatter to judge by (too few of them, or none off the line)
    pin = float(1.0 / np.sqrt(np.sum(coef[1] ** 2 / scatter**2))) if np.all(scatter > 0) else None
    trend = dict(slope_mm_per_log=coef[1].tolist(), scatter_mm=scatter.tolist(), sigma_log_from_scatter=pin)
    out = dict(param=param, lattice_step=h, target_mm=np.asarray(t).tolist(), points=table, failed=bad, trend=trend,
               sign_match_spline=match(spline), sign_match_rest=match(rest), sign_points=len(slope))
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
        ax[2].plot(f, [r["spline"] for r in table], "b.-", label="spline derivative (fit)")
        ax[2].plot(f, [r["rest"] for r in table], "g.--", label="rest-state IFT")
        ax[2].plot([math.exp(k * STEP) for k in slope], list(slope.values()), "r+", label="loss slope")
        ax[2].axhline(0, color="0.6", lw=0.5); ax[2].set_ylabel("dL/dlog p, mm²"); ax[2].legend(fontsize=7)
        ax[2].set_xscale("log"); ax[2].set_xlabel(f"{param} / film default")
        fig.tight_layout(); fig.savefig(png); plt.close(fig)
    return out


def compare(path, folder) -> list:
    """Each line of the sweep file ``path`` that has a twin (same parameter and factor) in
    ``folder``/sweep.jsonl: (param, factor, largest |Δy| in mm) — how closely runs repeat."""
    mine = {(r["param"], round(r["factor"], 9)): r for r in map(json.loads, open(os.path.join(folder, "sweep.jsonl")))
            if "error" not in r}
    out = []
    for r in map(json.loads, open(path)):
        twin = mine.get((r["param"], round(r["factor"], 9)))
        if twin is not None and "error" not in r:
            out.append((r["param"], r["factor"], float(np.max(np.abs(np.subtract(r["y_mm"], twin["y_mm"]))))))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--param", default="youngs_modulus", choices=("youngs_modulus", "friction", "bending_scale"))
    ap.add_argument("--half", type=int, default=7, help="sweep points each side of the film default (7: 15 points)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--start", default="scenes/data/bag_full_tie.npz")
    ap.add_argument("--out", default="runs/sweep")
    ap.add_argument("--report", action="store_true", help="print the table of OUT/sweep.jsonl and write "
                    "OUT/sweep_wW[_spec].json and .png (W = --width)")
    ap.add_argument("--spec-targets", action="store_true", help="report: the loss against the specification's bag")
    ap.add_argument("--width", type=int, default=2, help="the lattice step in grid steps of ln 2 / 7 (default 2, "
                    "the fit's); the sweep runs the lattice nodes of k = −half … half")
    ap.add_argument("--k", help="run only these grid points, e.g. --k=-3,0,3 (factors 2^(k/7)); default the whole "
                    "grid, in ascending order")
    ap.add_argument("--recover", action="store_true", help="take each run of OUT/sweep.jsonl as a fit's targets "
                    "and print where the smoothed loss is smallest (one run's scatter in a fit to one bag)")
    ap.add_argument("--targets", metavar="FILE", help="recover: JSON lines with the truth's factor and y_mm "
                    "(e.g. docs/figures/bag_sweep_E_whole/sweep.jsonl) as the targets, in place of the sweep's own runs")
    ap.add_argument("--runs-per-node", type=int, default=1, help="recover: the interval of K runs per node")
    ap.add_argument("--within", help="recover: the K runs' measured spread, mm (neck x, neck y, flap); default "
                    "none measured, the runs assumed independent")
    ap.add_argument("--model-scatter", help="recover: one run's scatter about the trend, mm (neck x, neck y, flap); "
                    "default fitting.uncertainty.MODEL_SCATTER_MM, the tie-start E sweep's")
    ap.add_argument("--bag-scatter", help="recover: one bag's own scatter, mm (neck x, neck y, flap), for the "
                    "one-bag interval; default fitting.uncertainty.BAG_SCATTER_MM")
    ap.add_argument("--json", help="recover: write the table here")
    ap.add_argument("--compare", metavar="FILE", help="print how far the runs of the sweep file FILE lie from "
                    "their twins in OUT/sweep.jsonl (same parameter and factor)")
    a = ap.parse_args(argv)
    if a.compare:
        rows = compare(a.compare, a.out)
        for param, factor, d in rows:
            print(f"{param} × {factor:.4f}: largest difference {d:.3g} mm")
        print(f"{len(rows)} runs with a twin; the largest difference {max((d for *_, d in rows), default=0.0):.3g} mm")
        return
    if a.recover:
        targets = None if a.targets is None else [json.loads(line) for line in open(a.targets) if line.strip()]
        def three(flag, text, zero_ok=False):   # "X,Y,F" in mm: finite, > 0 (≥ 0 where zero_ok)
            try:
                v = None if text is None else [float(t) for t in text.split(",")]
            except ValueError:
                v = []
            if v is not None and (len(v) != 3 or not all(math.isfinite(x) and (x > 0 or zero_ok and x == 0)
                                                         for x in v)):
                ap.error(f"{flag} takes three values {'≥' if zero_ok else '>'} 0 in mm (neck x, neck y, flap); "
                         f"got {text!r}")
            return v

        if a.runs_per_node < 1:
            ap.error(f"--runs-per-node must be ≥ 1; got {a.runs_per_node}")
        within = three("--within", a.within, zero_ok=True)
        scatter, bag = three("--model-scatter", a.model_scatter), three("--bag-scatter", a.bag_scatter)
        r = recover(a.out, a.param, a.width, targets=targets, scatter_mm=scatter, runs_per_node=a.runs_per_node,
                    within_mm=within, bag_scatter_mm=bag)
        for t in r["failed_targets"]:
            print(f"targets: the run at {a.param} × {t['factor']:.3f} failed, no target: {t['error']}")
        if not r["runs"]:
            print(f"no target lies inside the span the lattice nodes of {a.out} cover", file=sys.stderr)
            return 1
        for row in r["runs"]:
            print(f"targets: {row.get('label', 'the run')} at {a.param} × {row['factor']:.3f}: the smoothed loss "
                  f"is smallest at × {row['found']:.3f} ({row['error']:+.1%}), {row['loss_mm2']:.2f} mm²"
                  + (" (the scan's end)" if row["at_scan_end"] else "")
                  + f"; model 1σ ±{math.expm1(row['sigma_log']):.1%}, the truth {row['sigmas']:+.1f} σ away; one bag "
                  + f"±{math.expm1(row['one_bag']['sigma_log']):.1%}, {row['one_bag']['sigmas']:+.1f} σ")
        print(f"{len(r['runs'])} targets: rms error {r['rms_error']:.1%}; within 2 %: {r['within_2pct']}, "
              f"within 5 %: {r['within_5pct']}; the truth inside the 1σ interval: {r['inside_1sigma']} (model), "
              f"{r['inside_one_bag']} (one bag) "
              f"(one run's scatter {', '.join(f'{v:g}' for v in r['scatter_mm'])} mm; K = {r['runs_per_node']} "
              f"runs per node"
              + (", their spread assumed independent)" if within is None else f", their spread {a.within} mm)"))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(r, command="python3 benchmarks/bag_sweep.py " + " ".join(
                    argv if argv is not None else sys.argv[1:])), f, indent=1)
        return 0
    if a.report:
        from fitting.bag_rest import SPEC_TARGETS

        name = f"sweep_w{a.width}" + ("_spec" if a.spec_targets else "")
        r = report(a.out, a.param, SPEC_TARGETS if a.spec_targets else None, os.path.join(a.out, name + ".png"),
                   a.width, a.half)
        with open(os.path.join(a.out, name + ".json"), "w") as f:
            json.dump(r, f, indent=1)
        print(f"{'factor':>7} {'neck x':>7} {'neck y':>7} {'flap':>6} | {'x̄':>6} {'ȳ':>6} {'flap̄':>6} "
              f"{'loss':>8} {'slope':>8} {'spline':>8} {'rest':>8}")
        for p in r["points"]:
            sl = "" if p["slope"] is None else f"{p['slope']:8.1f}"
            one = " ".join(f"{v:7.2f}" for v in p["y_mm"]) if p["y_mm"] else " " * 23
            print(f"{p['factor']:7.3f} " + one + " | "
                  + " ".join(f"{v:6.2f}" for v in p["y_smoothed_mm"])
                  + f" {p['loss_mm2']:8.2f} {sl:>8} {p['spline']:8.1f} {p['rest']:8.1f}")
        pct = lambda v: "not taken" if v is None else f"{v:.0%}"   # noqa: E731
        sign = (f"spline {pct(r['sign_match_spline'])}, rest-state {pct(r['sign_match_rest'])} of "
                f"{r['sign_points']} points" if r["sign_points"] else
                "not measured (no sweep point has a neighbour on the grid to take the loss slope from)")
        print(f"sign of the gradient = sign of the loss slope: {sign}; target {np.round(r['target_mm'], 2).tolist()} mm"
              + (f"; failed runs: {r['failed']}" if r["failed"] else ""))
        tr = r["trend"]
        print("trend over all runs (mm per unit log-parameter): "
              + ", ".join(f"{n} {a:+.2f} ± scatter {b:.2f} mm" for n, a, b in
                          zip(("neck x", "neck y", "flap"), tr["slope_mm_per_log"], tr["scatter_mm"]))
              + ("" if tr["sigma_log_from_scatter"] is None else
                 f"; one run's scatter alone pins the log-parameter to ±{tr['sigma_log_from_scatter']:.3f}"))
        return
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "sweep.jsonl")
    done = set()
    if os.path.exists(path):
        done = {(r["param"], round(r["factor"], 9)) for r in map(json.loads, open(path)) if "error" not in r}
    factors = [math.exp(k * STEP) for k in lattice_ks(a.half, a.width)]
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
    sys.exit(main())

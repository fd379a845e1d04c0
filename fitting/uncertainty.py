"""What a bag fit's answer is worth: its 1σ interval for the measurement noise, what the
model's own scatter allows, which parameters the measurements see, whether the answer
lies inside the parameter range, and whether the model reaches the measurements at all
(the goodness of fit)."""
from __future__ import annotations

import math

import numpy as np

#: Measurement noise of the error bar, m (one standard deviation of each measurement).
DEFAULT_NOISE = 0.5e-3


def interval(J_mm, names, values, noise_mm) -> dict:
    """1σ intervals of the fitted parameters for independent measurement noise ``noise_mm``
    (one value for every measurement, or one per measurement row of J).

    With J (m × k) in mm per unit log-parameter and W = diag(noise⁻²), the Gauss–Newton
    covariance of z is (JᵀWJ)⁻¹; each parameter's interval is value · exp(±σ_z). A
    rank-deficient J gives infinite intervals for the parameters it cannot see, never a
    finite guess.
    """
    J = np.asarray(J_mm, np.float64)
    noise = np.broadcast_to(np.asarray(noise_mm, np.float64), (J.shape[0],))
    if not np.all(np.isfinite(noise) & (noise > 0)):
        raise ValueError(f"noise must be > 0 mm for every measurement; got {noise.tolist()}")
    Jw = J / noise[:, None]
    A = Jw.T @ Jw
    out = {}
    try:
        if np.linalg.cond(A) > 1e12:
            raise np.linalg.LinAlgError
        C = np.linalg.inv(A)
    except np.linalg.LinAlgError:
        C = np.full((len(names), len(names)), np.inf)
    for i, n in enumerate(names):
        sz = float(np.sqrt(C[i, i])) if np.isfinite(C[i, i]) and C[i, i] >= 0 else math.inf
        v = float(values[n])
        out[n] = dict(value=v, sigma_log=sz, low=v * math.exp(-sz) if math.isfinite(sz) else 0.0,
                      high=v * math.exp(sz) if math.isfinite(sz) else math.inf,
                      relative=math.expm1(sz) if math.isfinite(sz) else math.inf)
    return out


#: One forward run's scatter about the trend of the rest shape in E (neck x, neck y, flap;
#: mm, one standard deviation): the 19-run E sweep, docs/figures/bag_sweep_E/sweep_w2.json
#: ("trend"), reprinted by ``python3 benchmarks/bag_sweep.py --report --out
#: docs/figures/bag_sweep_E``. The model's own noise: pleats snap shut or not.
MODEL_SCATTER_MM = (1.62, 3.56, 1.10)
#: Relative 1σ accuracies for which :func:`scatter_budget` says how many runs each node needs.
ACCURACY_GOALS = (0.02, 0.05)


#: One measured bag's own scatter about the trend of bags whose whole history ran at their
#: E (neck x, neck y, flap; mm, one standard deviation): the 11 whole-protocol runs at
#: E × 0.45 … 2.21 of docs/figures/bag_sweep_E_whole ("trend", reprinted by ``python3
#: benchmarks/bag_sweep.py --report --out docs/figures/bag_sweep_E_whole``). A measured bag
#: is one history: the gather, the cinch and the tie at its E, whose pleats the fit's runs
#: from the tie checkpoint do not share. No number of model runs averages it away.
BAG_SCATTER_MM = (4.31, 3.13, 4.92)


def one_bag(J_mm, names, values, noise_mm, bag_scatter_mm, node_scatter_mm, *, effective_runs: float) -> dict:
    """The 1σ interval of a fit to one measured bag: each measurement's σ combines the tape
    noise, the bag's own scatter (``bag_scatter_mm``, :data:`BAG_SCATTER_MM`) and the
    smoothed model's (``node_scatter_mm`` over √effective_runs, :func:`scatter_budget`), as
    independent: σᵢ = √(noiseᵢ² + bagᵢ² + nodeᵢ²/effective_runs)."""
    m = np.asarray(J_mm).shape[0]
    if not (np.isfinite(effective_runs) and effective_runs > 0):
        raise ValueError(f"effective_runs must be > 0; got {effective_runs}")
    parts = [np.broadcast_to(np.asarray(v, np.float64), (m,)) for v in (noise_mm, bag_scatter_mm, node_scatter_mm)]
    if not all(np.all(np.isfinite(p) & (p >= 0)) for p in parts):
        raise ValueError(f"noise and scatters must be finite and ≥ 0 mm; got {[p.tolist() for p in parts]}")
    noise, bag, node = parts
    sigma = np.sqrt(noise**2 + bag**2 + node**2 / effective_runs)
    return dict(noise_mm=noise.tolist(), bag_scatter_mm=bag.tolist(), node_scatter_mm=node.tolist(),
                effective_runs=float(effective_runs), sigma_mm=sigma.tolist(),
                interval_1sigma=interval(J_mm, names, values, sigma))


#: How far a fit from the committed tie checkpoint (made at 315 MPa) lands from bags whose
#: whole history ran at their E: the rms of answer / truth − 1 over ``targets`` such bags,
#: and how many of them its one-bag interval held (``command`` reprints it;
#: docs/differentiation.md, "A whole history at E").
TIE_START_RECOVERY = dict(rms_error=0.297, targets=9, inside_one_bag=4,
                          command="python3 benchmarks/bag_sweep.py --recover --out docs/figures/bag_sweep_E "
                                  "--targets docs/figures/bag_sweep_E_whole/sweep.jsonl")


def history_message(default_start: bool, synthetic: bool) -> str | None:
    """What a fit from the tie checkpoint must say about a measured bag: its runs share the
    checkpoint's history at 315 MPa, a real bag's gather, cinch and tie happened at its own
    E, and no interval of the fit holds that bias. None for another start (not measured)
    or for synthetic targets (made from the same start)."""
    if not default_start or synthetic:
        return None
    r = TIE_START_RECOVERY
    return (f"every run starts from the tie checkpoint, whose gather, cinch and tie ran at 315 MPa; bags whose whole "
            f"history ran at their own E were recovered from it with an rms error of {r['rms_error']:.0%} "
            f"({r['targets']} bags, {r['inside_one_bag']} inside their one-bag interval; {r['command']}), a bias "
            "that no interval here holds; a start whose history is the bag's own is --state of a run at t = 1/240 s "
            "(docs/differentiation.md, \"A whole history at E\")")


#: The most runs per node :func:`scatter_budget` looks for before it says no K reaches a goal.
MAX_RUNS_PER_NODE = 4096


def node_scatter(scatter_mm, within_mm, runs_per_node: int) -> np.ndarray:
    """The scatter of one lattice node that is the mean of K = ``runs_per_node`` runs.

    One run's scatter s (``scatter_mm``, per measurement) splits into the part its K runs
    share, b = √max(s² − w², 0), and the part in which they differ, their spread w
    (``within_mm``, measured at the nodes): the mean keeps b and divides w by √K, so the
    node scatters by √(b² + w²/K). A spread larger than s says s was too small: the node
    scatters by w/√K. ``within_mm`` None (no spread measured) assumes the K runs are
    independent (w = s): s/√K. From the tie checkpoint, kicked runs end within 0.02 mm of
    one another (docs/differentiation.md, "Ensembles"): there w ≪ s and K runs per node
    leave nearly all of s.
    """
    s = np.asarray(scatter_mm, np.float64)
    if int(runs_per_node) != runs_per_node or runs_per_node < 1:
        raise ValueError(f"runs_per_node must be an integer ≥ 1; got {runs_per_node}")
    if within_mm is None:
        return s / math.sqrt(runs_per_node)
    w = np.broadcast_to(np.asarray(within_mm, np.float64), s.shape)
    if not np.all(np.isfinite(w) & (w >= 0)):
        raise ValueError(f"within_mm must be finite spreads ≥ 0 mm; got {w.tolist()}")
    return np.sqrt(np.maximum(s * s - w * w, 0.0) + w * w / runs_per_node)


def scatter_budget(J_mm, names, values, scatter_mm, *, effective_runs: float, runs_per_node: int = 1,
                   within_mm=None, goals=ACCURACY_GOALS) -> dict:
    """What the model's own scatter allows: the 1σ interval when each smoothed measurement
    is a mean over ``effective_runs`` nodes (:func:`fitting.smoothing.effective_runs`) whose
    scatter is :func:`node_scatter` of one run's ``scatter_mm`` with K = ``runs_per_node``
    runs per node and their measured spread ``within_mm`` (None: not measured, the K runs
    assumed independent); its noise is that node scatter / √effective_runs.

    Per parameter and relative 1σ goal g, ``runs_per_node_for`` gives the fewest runs per
    node whose interval reaches g (1 where one run already does). It is None where no
    number of runs does: a parameter the measurements cannot see, or a shared part of the
    scatter (√(s² − w²)) whose interval alone, ``floor_sigma_log``, is wider than g (or that
    leaves g out of reach within MAX_RUNS_PER_NODE runs). Without
    a measured spread, K = ⌈(σ_z,1 / log(1 + g))²⌉ with σ_z,1 the interval of one run per
    node. It treats the runs' scatter as independent between nodes, which neighbouring
    runs that share a pleat pattern are not, so it gives the order, not a bound.
    """
    s = np.broadcast_to(np.asarray(scatter_mm, np.float64), (np.asarray(J_mm).shape[0],))
    if not (np.isfinite(effective_runs) and effective_runs > 0):
        raise ValueError(f"effective_runs must be > 0; got {effective_runs}")
    root = math.sqrt(effective_runs)

    def sigma(k):
        return interval(J_mm, names, values, node_scatter(s, within_mm, k) / root)

    iv = sigma(runs_per_node)
    if within_mm is None:
        floor = {n: 0.0 for n in names}
    else:
        b = np.sqrt(np.maximum(s * s - np.broadcast_to(np.asarray(within_mm, np.float64), s.shape) ** 2, 0.0))
        floor = ({n: v["sigma_log"] for n, v in interval(J_mm, names, values, b / root).items()}
                 if np.all(b > 0) else {n: 0.0 for n in names})
    one = {n: v["sigma_log"] for n, v in sigma(1).items()}

    def fewest(n, g):
        goal = math.log1p(g)
        if not math.isfinite(one[n]) or floor[n] > goal:
            return None
        if one[n] <= goal:
            return 1
        if within_mm is None:                       # σ_z falls as 1/√K exactly
            return math.ceil((one[n] / goal) ** 2)
        lo, hi = 1, MAX_RUNS_PER_NODE               # σ_z(lo) > goal; find the first K with σ_z(K) ≤ goal
        if sigma(hi)[n]["sigma_log"] > goal:
            return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if sigma(mid)[n]["sigma_log"] <= goal else (mid, hi)
        return hi

    need = {n: {f"{g:.0%}": fewest(n, g) for g in goals} for n in names}
    return dict(scatter_mm=s.tolist(), effective_runs=float(effective_runs), runs_per_node=int(runs_per_node),
                within_mm=None if within_mm is None else np.broadcast_to(
                    np.asarray(within_mm, np.float64), s.shape).tolist(),
                node_scatter_mm=node_scatter(s, within_mm, runs_per_node).tolist(),
                interval_1sigma=iv, floor_sigma_log=floor, runs_per_node_for=need)


def identifiability(J_mm, names, noise_mm: float) -> dict:
    """Singular values of J (mm per unit log-parameter), the weakest direction, and which
    parameters move the measurements by less than the noise over a factor e."""
    J = np.asarray(J_mm, np.float64)
    _, sv, Vt = np.linalg.svd(J, full_matrices=False)
    col = np.linalg.norm(J, axis=0)
    return dict(columns=list(names), singular_values_mm=sv.tolist(),
                condition_number=float(sv[0] / sv[-1]) if sv[-1] > 0 else math.inf,
                weakest_direction=dict(zip(names, Vt[-1].tolist())),
                sensitivity_mm_per_log=dict(zip(names, col.tolist())),
                below_noise=[n for n, c in zip(names, col) if c < noise_mm])


#: A fitted measurement this many standard deviations (tape noise and the model's scatter
#: together, :func:`goodness_of_fit`) or more from its target is one the model does not
#: reach: the fit says so, in fit.json and on stderr.
MISFIT_SIGMAS = 3.0
SHAPE_NAMES = ("neck x", "neck y", "flap")


def goodness_of_fit(y_mm, target_mm, n_params: int, noise_mm, scatter_mm, *, effective_runs: float,
                    bag_scatter_mm=0.0) -> dict:
    """How far the fitted measurements lie from the targets, against what could explain it.

    Each measurement's standard deviation combines the tape noise ``noise_mm``, the
    measured bag's own scatter ``bag_scatter_mm`` (:func:`one_bag`) and the model's scatter
    as the smoothed measurements carry it, ``scatter_mm`` (one node's, :func:`node_scatter`)
    / √effective_runs, as independent: σᵢ = √(noiseᵢ² + bagᵢ² + scatterᵢ²/effective_runs).
    Returns per measurement (``SHAPE_NAMES``) the residual y − t and σ in mm and their ratio
    ``sigmas``; χ² = Σ (rᵢ/σᵢ)², its degrees of freedom m − k (``n_params`` = k fitted) and
    χ²/dof (None when dof = 0: as many parameters as measurements, the fit can always pass
    through them); and ``unreached``: the measurements at ``MISFIT_SIGMAS`` σ or more.
    """
    y, t = np.asarray(y_mm, np.float64), np.asarray(target_mm, np.float64)
    m = y.shape[0]
    noise = np.broadcast_to(np.asarray(noise_mm, np.float64), (m,))
    scatter = np.broadcast_to(np.asarray(scatter_mm, np.float64), (m,))
    bag = np.broadcast_to(np.asarray(bag_scatter_mm, np.float64), (m,))
    if not (np.isfinite(effective_runs) and effective_runs > 0):
        raise ValueError(f"effective_runs must be > 0; got {effective_runs}")
    sigma = np.sqrt(noise**2 + bag**2 + scatter**2 / effective_runs)
    r = y - t
    z = r / sigma
    chi2, dof = float(np.sum(z**2)), m - int(n_params)
    per = {name: dict(fitted_mm=float(yi), target_mm=float(ti), residual_mm=float(ri), sigma_mm=float(si),
                      sigmas=float(zi))
           for name, yi, ti, ri, si, zi in zip(SHAPE_NAMES, y, t, r, sigma, z)}
    return dict(measurements=per, chi2=chi2, dof=dof, chi2_per_dof=chi2 / dof if dof > 0 else None,
                noise_mm=noise.tolist(), scatter_mm=scatter.tolist(), bag_scatter_mm=bag.tolist(),
                effective_runs=float(effective_runs),
                unreached=[n for n, zi in zip(SHAPE_NAMES, z) if abs(zi) >= MISFIT_SIGMAS])


def misfit_message(fit: dict) -> str | None:
    """The plain sentence for a :func:`goodness_of_fit` with unreached measurements, else None."""
    if not fit["unreached"]:
        return None
    parts = []
    for name in fit["unreached"]:
        d = fit["measurements"][name]
        parts.append(f"the {name}: fitted {d['fitted_mm']:.2f} mm against {d['target_mm']:.2f} mm, "
                     f"{d['residual_mm']:+.2f} mm, {abs(d['sigmas']):.1f} σ (σ = {d['sigma_mm']:.2f} mm)")
    chi = "" if fit["chi2_per_dof"] is None else f"; χ²/dof = {fit['chi2_per_dof']:.3g} over {fit['dof']} dof"
    return ("the model does not reach " + "; ".join(parts) + f" (σ: tape noise, one bag's own scatter and the "
            f"model's, {MISFIT_SIGMAS:g} σ or more is beyond them{chi}); the fitted value is the best compromise, "
            "not a match")


def reach_message(names, bounds, records, target) -> str | None:
    """The sentence an answer outside the model's reach needs, or None.

    Said when the best evaluation lies on a range end and the smoothed gradient there still
    points outward (the loss would fall beyond the range): "no E in [a, b] brings the neck
    and flap to the targets: the closest, at E = b, is …". ``records``: the evaluations'
    :class:`fitting.bag_rest.EvaluationRecord` (``y``, ``J`` and ``params`` read).
    """
    if not records:
        return None
    t = np.asarray(target) * 1e3
    best = min(records, key=lambda r: float(np.sum((np.asarray(r.y) * 1e3 - t) ** 2)))
    y = np.asarray(best.y) * 1e3
    g = 2.0 * (np.asarray(best.J) * 1e3).T @ (y - t)      # ∇ of Σ (y − t)² in log-parameters
    outward = []
    for i, n in enumerate(names):
        lo, hi = bounds[n]
        v = best.params[n]
        near_lo, near_hi = v <= lo * 1.25, v >= hi / 1.25   # within one smoothing width (×1.25) of an end
        if (near_lo and g[i] > 0) or (near_hi and g[i] < 0):
            outward.append((n, lo, hi, v))
    if not outward:
        return None
    what = "; ".join(f"no {n} in [{lo:.4g}, {hi:.4g}]" for n, lo, hi, _ in outward)
    at = ", ".join(f"{n} = {v:.4g}" for n, _, _, v in outward)
    return (f"{what} brings the neck and flap to the targets ({t[0]:.2f} × {t[1]:.2f} mm, flap {t[2]:.2f} mm): "
            f"the closest, at {at}, is neck {y[0]:.2f} × {y[1]:.2f} mm, flap {y[2]:.2f} mm, and the loss "
            f"still falls toward the end of the range")

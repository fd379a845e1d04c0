"""The bag fit (docs/spec.md §5): film parameters from the rest shape after release.

A user measures the bag after it has been tied and released: neck width x × y and flap
height. :class:`BagRestProblem` gives the fit loop (:func:`fitting.fit.fit_measured`)
those three measurements of the simulated bag, smoothed, and their Jacobian in the log
of the fitted parameters (E, μf, kθ):

1. **Forward** (:mod:`fitting.bag_nodes`): every node runs the bag from a committed checkpoint
   (``scenes/data/bag_full_tie.npz`` by default: 8.40 s, the start of the tie) to the end of
   the protocol (10.50 s, the measured instant) with the host driver of ``ipcjax bag``
   (:func:`scenes.bag_run.run_bag`: capacity growth, subdivision, the self-intersection
   audit of every ``audit_every``-th frame). By then the bag has settled (the fastest
   particle at 0.5–12 mm/s over the E sweep of docs/differentiation.md).
2. **Smoothing** (:mod:`fitting.smoothing`): one trajectory's measurements are piecewise in the parameters (pleats
   snap shut or not; docs/differentiation.md: on the E sweep the neck jumps by up to 7 mm
   between neighbouring runs 10 % apart). The runs repeat (the same parameters give the
   same measurements, mostly to under a micrometre: docs/differentiation.md), so every
   run is made at a point of a fixed lattice z₀ + j h in log-parameter space (z₀ the film defaults' logs, h =
   ``step``), once, and the fitted quantity is their cubic B-spline smoothing

       ȳ(z) = Σ_j w_j(z) y(z₀ + j h),   w_j(z) = Πᵢ N((zᵢ − z₀ᵢ)/h − jᵢ),

   N the cubic B-spline (:func:`fitting.smoothing.bspline3`): Schoenberg's variation-diminishing spline
   approximation (M. Marsden and I. J. Schoenberg 1966, "On variation diminishing spline
   approximation methods"; C. de Boor, "A Practical Guide to Splines", 2001, ch. XI). It is C² in z, reproduces straight lines, and has no more wiggles than the runs'
   own sequence: a jump between two nodes becomes a smooth ramp over four. Its Jacobian is
   its exact derivative Σ_j y_j ∂w_j/∂z, so the fit's gradient is the gradient of the
   loss it minimises and points the way its values go. An evaluation needs the 4^d lattice
   points around z (3^d on the lattice); a fit that moves by less than a lattice step
   reuses them, so the last iterations of a fit cost no run. The lattice, not a random
   draw, fixes which runs are averaged (common random numbers). The kernel N, the
   four-fold convolution of the unit box, is close to a Gaussian of standard deviation
   h/√3; the runs' scatter remains in ȳ as in the mean of 2.0 to 2.2 independent runs
   (:func:`fitting.smoothing.effective_runs`).
3. **Rest-state derivative** (:mod:`fitting.rest_derivative`; reported beside it; ``estimator="rest"`` fits with it): at
   the final positions x the step's optimality less its inertia is the static balance
   G(x; θ) = ∇(V + D)(x; θ) − M g − f = 0, V the membrane, bending, barrier, support and
   tie energies and D the friction lagged at the previous step's positions x − dt·v. The
   implicit function theorem (Blondel et al. 2022, "Efficient and modular implicit
   differentiation"; :mod:`ipcjax.implicit` without the step's inertia) gives

       dy/dz = −(∂y/∂x) H⁻¹ ∂G/∂z,     H = ∂G/∂x = ∇²(V + D)(x),

   one dense Cholesky factorisation and one VJP of G per measurement. It holds the
   friction anchors, so it is the response of a bag whose loaded contacts stick; on the
   bag it has the sign of the values' trend in E but a third of its size, and it is
   nearly blind to μf and kθ (docs/differentiation.md): that is why the fit uses the
   spline's derivative. In the "rest" mode μf (PATH_ONLY) still takes the spline's. The derivative is only used where H is
   positive definite and ‖G‖∞ is below REST_RESIDUAL_TOL (:func:`fitting.bag_nodes.check_rest`).

Every run is made in a worker process (``workers``, default all cores), and a node met
again, in this fit or in a sweep or fit that wrote to the same folder, reuses its finished
run (:class:`fitting.bag_nodes.NodeCache`). A failed node (a failed step, a
self-intersecting frame) raises :class:`fitting.bag_nodes.NodeFailed` naming the node's parameters and the
reason; an iterate outside the parameter range is evaluated at the range's end. What a
fit's answer is worth (interval, identifiability, reach): :mod:`fitting.uncertainty`.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import math
import multiprocessing as mp
import os
import time
from typing import NamedTuple

import numpy as np

from fitting.bag_nodes import NodeCache, NodeResult, check_rest, full_z, mean_node, run_node
from fitting.fit import Evaluation
from fitting.rest_derivative import BAG_NAMES
from fitting.smoothing import DEFAULT_STEP, ESTIMATORS, effective_runs, lattice_smooth, lattice_support
from scenes.perturb import ENSEMBLE_KICK

#: Default start of every forward run: the full-resolution tie checkpoint (8.40 s), package
#: data of scenes/ (the bag's state.npz; pyproject.toml ships it with the package).
DEFAULT_START = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "scenes", "data", "bag_full_tie.npz")
#: Default range of each fitted parameter, × its film default.
DEFAULT_RANGE = (0.25, 4.0)
#: The specification's measured bag after release (docs/spec.md §5): neck x, neck y, flap, m.
SPEC_TARGETS = (38.83e-3, 37.20e-3, 18.43e-3)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeRecord:
    """One lattice node of an evaluation as its :class:`EvaluationRecord` holds it and
    fit.json writes it (``iterates[i]["nodes"][j]``: :meth:`to_json`, fields in this order)."""

    index: list[int]           # the lattice point j over the fitted names
    weight: float              # w_j, its B-spline weight in the evaluation (the nodes' weights sum to 1)
    params: dict[str, float]   # over BAG_NAMES at the node: E in Pa, μf and kθ dimensionless
    y: list[float]             # (3,) neck x, neck y, flap of its run, m
    J_rest: list[list[float]]  # (3, 3) its rest-state dy/dz over BAG_NAMES, m per unit log-parameter
    residual_ratio: float      # ‖G(x)‖∞ / the largest force of one energy term on one particle
    max_speed_m_s: float       # the fastest particle at the end of its run, m/s
    wall_s: float              # its run (or reading a finished one back), s
    run_dir: str               # its run folder (fitting.bag_nodes.NodeCache.folder; member 0's)
    runs: int                  # forward runs it is the mean of (fitting.bag_nodes.mean_node)
    spread_m: list[float] | None  # (3,) their sample standard deviation, m (None for one run)

    @classmethod
    def of(cls, index, weight, node: NodeResult) -> NodeRecord:
        """The record of ``node`` at the lattice point ``index`` with the weight ``weight``."""
        return cls(index=list(index), weight=float(weight), params=dict(zip(BAG_NAMES, np.exp(node.z).tolist())),
                   y=node.y.tolist(), J_rest=node.J.tolist(), residual_ratio=node.residual_ratio,
                   max_speed_m_s=node.max_speed, wall_s=node.wall_s, run_dir=node.run_dir, runs=node.runs,
                   spread_m=None if node.spread is None else node.spread.tolist())

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvaluationRecord:
    """One evaluation of :class:`BagRestProblem` (``problem.records``) as fit.json writes it
    (``iterates[i]``, ``synthetic_evaluation``: :meth:`to_json`, fields in this order, the
    nodes' records as dicts)."""

    z: list[float]             # (k,) the evaluated log-parameters over ``names`` (the asked ones clipped to the range)
    params: dict[str, float]   # exp(z) over ``names``: E in Pa, μf and kθ dimensionless
    clipped: bool              # the asked iterate lay outside the range and was evaluated at its end
    y: list[float]             # (3,) the smoothed neck x, neck y, flap ȳ, m
    J: list[list[float]]       # (3, k) the smoothed Jacobian J̄ over ``names``, m per unit log-parameter
    new_runs: int              # forward runs this evaluation made (lattice points none had run before, × K)
    effective_runs: float      # 1/Σ w² (fitting.smoothing.effective_runs), in nodes
    wall_s: float              # the evaluation, its runs included, s
    nodes: list[NodeRecord]    # the lattice points of non-zero weight, in the weights' order
    runs_per_node: int         # K: each node the mean of K runs (1 unperturbed, K − 1 kicked)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class NodeTask(NamedTuple):
    """One forward run of a node, as a worker process receives it (:func:`_node_task`)."""

    start: str              # the state file it starts from
    z: np.ndarray           # (3,) log-parameters over BAG_NAMES
    out: str                # its run folder (NodeCache.folder)
    until: float | None     # end time, s (None: the protocol's end)
    audit_every: int
    perturb: float = 0.0    # rms m/s of its start's film velocity kick (0: the unperturbed member)
    seed: int = 0           # the kick's seed: the member's number


def _node_task(task: NodeTask):
    return run_node(task.start, task.z, task.out, until=task.until, audit_every=task.audit_every, reuse=True,
                    perturb=task.perturb, seed=task.seed)


class BagRestProblem:
    """Smoothed rest-shape measurements of the bag and their Jacobian (module docstring).

    A :class:`fitting.fit.MeasuredProblem` for :func:`fitting.fit.fit_measured`: ``names``,
    and ``problem(z, params) -> Evaluation(y, J, wall_s)`` over ``names``. Its runs hold
    every parameter it does not fit at the film defaults, so ``params`` must too (None
    stands for them); a ``params`` that differs there is refused, not ignored.

    Args:
        names: the fitted parameters (a subset of BAG_NAMES; the lattice spans these only,
            the others stay at their film defaults).
        start: the state file every forward run starts from.
        out: folder for the nodes' run folders (:class:`fitting.bag_nodes.NodeCache`; a node
            met again, in this fit or an earlier one with the same ``out``, reuses its finished
            run).
        step: the lattice step h in log-parameter space; the lattice is z₀ + j h, z₀ the
            film defaults' logs.
        bounds: {name: (lo, hi)} in the parameters' units (default DEFAULT_RANGE × film
            default); an iterate outside is evaluated at the range's end (its record says
            ``clipped``), and :func:`fitting.uncertainty.reach_message` reads the records
            (:class:`EvaluationRecord`).
        workers: worker processes for the runs (default: the machine's cores).
        until: end time of the forward runs (default: the protocol's end).
        audit_every: audit every n-th step's frame for self-intersection.
        estimator: "spline" (every column the derivative of the smoothed measurements) or
            "rest" (the weighted mean of the nodes' rest-state derivatives; the spline's for
            PATH_ONLY parameters).
        runs_per_node: K, each lattice node the mean of K runs (:func:`fitting.bag_nodes.mean_node`):
            the unperturbed one and K − 1 from the start with the film's velocities kicked
            (``perturb`` m/s rms, seeds 1 … K − 1: :func:`scenes.perturb.film_kick`).
    """

    def __init__(self, names, start: str = DEFAULT_START, out: str = "runs/fit_bag", *, step: float = DEFAULT_STEP,
                 bounds: dict | None = None, workers: int | None = None, until: float | None = None,
                 audit_every: int = 6, estimator: str = "spline", runs_per_node: int = 1,
                 perturb: float = ENSEMBLE_KICK):
        from ipcjax.model import Params

        names = tuple(names)
        bad = [n for n in names if n not in BAG_NAMES]
        if not names or bad or len(set(names)) != len(names):
            raise ValueError(f"the bag fit fits one or more of {', '.join(BAG_NAMES)}, each once; got {names}")
        if not (np.isfinite(step) and step > 0):
            raise ValueError(f"step must be > 0 (the lattice step in log-parameter space); got {step}")
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}; got {estimator!r}")
        if not os.path.exists(start):
            raise FileNotFoundError(f"bag fit start state {start}: no such file")
        if int(runs_per_node) != runs_per_node or runs_per_node < 1:
            raise ValueError(f"runs_per_node must be an integer ≥ 1; got {runs_per_node}")
        if runs_per_node > 1 and not (np.isfinite(perturb) and perturb > 0):
            raise ValueError(f"an ensemble of {runs_per_node} runs per node needs a kick > 0 m/s; got {perturb}")
        self.names, self.start, self.out, self.step = names, start, out, float(step)
        self.cache = NodeCache(start, out)  # the nodes' run folders, by the start file's digest
        self.until, self.audit_every, self.estimator = until, int(audit_every), estimator
        self.runs_per_node, self.perturb = int(runs_per_node), float(perturb)
        d0 = Params.film_defaults()
        self.bounds = {n: tuple(float(getattr(d0, n)) * f for f in DEFAULT_RANGE) for n in names}
        self.bounds.update(bounds or {})
        self.cols = [BAG_NAMES.index(n) for n in names]
        self.origin = full_z((), [])      # z₀ over BAG_NAMES: the lattice's point j = 0
        self.workers = max(1, int(workers or os.cpu_count() or 1))
        self._pool = None
        self.nodes: dict = {}             # lattice index (tuple over names) -> NodeResult
        self.records: list[EvaluationRecord] = []  # one per evaluation
        self.evaluations, self.runs, self.run_s = 0, 0, 0.0

    # the pool lives as long as the problem: each worker compiles the step once
    def _map(self, tasks):
        if self.workers == 1 or len(tasks) == 1 and self._pool is None:
            return [_node_task(t) for t in tasks]
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
        return list(self._pool.map(_node_task, tasks))

    def close(self):
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _tasks(self, zfull, members: int = 1) -> list[NodeTask]:
        """The runs of the node at zfull: member 0 unperturbed, member j ≥ 1 kicked with seed j."""
        return [NodeTask(self.start, zfull, self.cache.folder(zfull, j), self.until, self.audit_every,
                         self.perturb if j else 0.0, j) for j in range(members)]

    def lattice_z(self, index) -> np.ndarray:
        """z over BAG_NAMES of the lattice point ``index`` (over ``names``)."""
        z = self.origin.copy()
        z[self.cols] += np.asarray(index, np.float64) * self.step
        return z

    def run(self, z) -> NodeResult:
        """One forward run at the log-parameters z (over ``names``), off the lattice too (the
        fitted value's own run); counted in ``runs``."""
        zfull = self.origin.copy()
        zfull[self.cols] = np.asarray(z, np.float64)
        self.runs += 1
        return self._map(self._tasks(zfull))[0]

    def _check_unfitted(self, params) -> None:
        if params is None:
            return
        from ipcjax.model import Params

        d0 = Params.film_defaults()
        off = [f"{n}={np.asarray(getattr(params, n)).tolist()} (film default {np.asarray(getattr(d0, n)).tolist()})"
               for n in Params._fields if n not in self.names
               and not np.array_equal(np.asarray(getattr(params, n), np.float64), np.asarray(getattr(d0, n), np.float64))]
        if off:
            raise ValueError("the bag fit runs every parameter it does not fit at the film default; params has "
                             + ", ".join(off))

    def __call__(self, z, params) -> Evaluation:
        """(ȳ, J̄) at the log-parameters z (over ``names``), running the lattice points it
        needs that have not run yet; the parameters not fitted are the film defaults'.

        Raises:
            ValueError: ``params`` (None, or what :func:`fit_measured` passes) differs from
                the film defaults in a parameter not in ``names``: the runs could not honour it.
        """
        self._check_unfitted(params)
        t0 = time.perf_counter()
        z_asked = np.asarray(z, np.float64).reshape(len(self.names))
        lo, hi = (np.log([self.bounds[n][i] for n in self.names]) for i in (0, 1))
        z = np.clip(z_asked, lo, hi)   # an iterate past the range is evaluated at its end
        index, w, dw = lattice_support((z - self.origin[self.cols]) / self.step)
        keys = [tuple(int(v) for v in j) for j in index]
        missing = [k for k in keys if k not in self.nodes]
        K = self.runs_per_node
        try:
            done = self._map([t for k in missing for t in self._tasks(self.lattice_z(k), K)])
            for i, k in enumerate(missing):
                self.nodes[k] = mean_node(done[i * K:(i + 1) * K])
        finally:
            self.evaluations += 1
            self.runs += len(missing) * K
            self.run_s += time.perf_counter() - t0
        nodes = [self.nodes[k] for k in keys]
        if self.estimator == "rest":
            for nd in nodes:
                check_rest(nd)
        Y, J_rest = np.stack([nd.y for nd in nodes]), np.stack([nd.J for nd in nodes])   # (n, 3), (n, 3, 3)
        y, J = lattice_smooth(Y, w, dw, self.names, self.step, J_rest=J_rest, estimator=self.estimator)
        self.records.append(EvaluationRecord(
            z=z.tolist(), params={n: math.exp(v) for n, v in zip(self.names, z)}, clipped=bool(np.any(z != z_asked)),
            y=y.tolist(), J=J.tolist(), new_runs=len(missing) * K, effective_runs=effective_runs(w),
            wall_s=time.perf_counter() - t0, nodes=[NodeRecord.of(k, wk, nd) for k, wk, nd in zip(keys, w, nodes)],
            runs_per_node=K))
        return Evaluation(y, J, time.perf_counter() - t0)

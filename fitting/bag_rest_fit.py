"""``ipcjax fit --scene bag`` as a library function: E, μf or kθ, or a pair, from the
481-vertex bag's rest shape after release, smoothed over the parameters
(:mod:`fitting.bag_rest`); writes ``out/fit.json``. The job checks its inputs before it
starts the forward runs, which run in worker processes."""
from __future__ import annotations

import os
import time
from typing import NamedTuple

import numpy as np

from fitting.fit import FitFailed, fit_measured, levenberg_marquardt, plot_history, to_z
from fitting.rollout_fit import SHAPE_ROWS, SHAPE_SCALE, float64_params
from fitting.smoothing import DEFAULT_STEP
from fitting.targets import check_targets
from ipcjax.runfolder import prepare, write_json
from scenes.perturb import ENSEMBLE_KICK


class BagFitOptions(NamedTuple):
    """What ``ipcjax fit --scene bag`` fits from the rest shape (``fitting.bag_rest``)."""

    names: tuple = ("youngs_modulus",)  # one of BAG_NAMES, or a pair
    start: str | None = None            # state file every forward run starts from (None: the tie checkpoint)
    start_value: float | None = None    # start value of a single parameter
    start_factor: float = 1.0           # otherwise start at this × the film default (the nominal film)
    iterations: int = 30                # maximum evaluations (one inside known lattice cells runs nothing)
    step: float = DEFAULT_STEP          # lattice step of the smoothing in log-parameter space (2 ln 2 / 7)
    noise_mm: float = 0.5               # measurement noise of the error bar, mm
    model_scatter_mm: tuple | None = None  # one run's scatter (neck x, y, flap), mm (None: uncertainty.MODEL_SCATTER_MM)
    bag_scatter_mm: tuple | None = None    # one measured bag's own scatter, mm (None: uncertainty.BAG_SCATTER_MM)
    estimator: str = "spline"           # the smoothed Jacobian (fitting.smoothing.ESTIMATORS)
    workers: int | None = None          # node processes (None: the cores)
    progress: bool = True
    runs_per_node: int = 1              # K: each lattice node the mean of K runs (K − 1 from kicked starts)
    perturb: float = ENSEMBLE_KICK      # rms m/s of the kicked members' film velocity kick (scenes/perturb.py)

    def check(self) -> None:
        """ValueError naming the option that is unusable."""
        from fitting.rest_derivative import BAG_NAMES
        from fitting.smoothing import ESTIMATORS

        names = tuple(self.names)
        if not 1 <= len(names) <= 2 or any(n not in BAG_NAMES for n in names) or len(set(names)) != len(names):
            raise ValueError(f"the bag fit fits one of {', '.join(BAG_NAMES)} or a pair of them; got {names}")
        if self.start is not None:
            from fitting.bag import load_state

            load_state(self.start)  # FileNotFoundError / ValueError naming the file
        for what, v in (("start_factor", self.start_factor), ("step", self.step), ("noise_mm", self.noise_mm)):
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"{what} must be > 0; got {v}")
        if self.start_value is not None and (len(names) != 1 or not (np.isfinite(self.start_value)
                                                                      and self.start_value > 0)):
            raise ValueError(f"start must be one value > 0 for a single parameter; got {self.start_value}")
        if int(self.iterations) != self.iterations or self.iterations < 1:
            raise ValueError(f"iterations must be a positive integer; got {self.iterations}")
        if int(self.runs_per_node) != self.runs_per_node or self.runs_per_node < 1:
            raise ValueError(f"runs_per_node must be a positive integer; got {self.runs_per_node}")
        if not (np.isfinite(self.perturb) and self.perturb > 0):
            raise ValueError(f"perturb must be a finite speed > 0 m/s; got {self.perturb}")
        for what, v in (("model_scatter_mm", self.model_scatter_mm), ("bag_scatter_mm", self.bag_scatter_mm)):
            s = None if v is None else np.asarray(v, np.float64)
            if s is not None and (s.shape != (3,) or not np.all(np.isfinite(s) & (s > 0))):
                raise ValueError(f"{what} must be three values > 0 (neck x, neck y, flap, mm); got {v}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}; got {self.estimator!r}")


def node_spread(record) -> dict | None:
    """The runs' own scatter at an evaluation's nodes (an ensemble of K ≥ 2 runs per node):
    per measurement the root mean square, over the nodes, of their runs' sample standard
    deviations, in mm, and the runs it rests on; None for one run per node. It is the part
    of one run's scatter (``model_scatter_mm``) that K runs per node average away
    (:func:`fitting.uncertainty.node_scatter`), measured from few runs."""
    spreads = [nd.spread_m for nd in record.nodes if nd.spread_m is not None]
    if not spreads:
        return None
    rms = np.sqrt(np.mean(np.square(np.asarray(spreads)), axis=0)) * 1e3
    return dict(rms_sd_mm=rms.tolist(), nodes=len(spreads), runs=int(sum(nd.runs for nd in record.nodes)))


def fit_bag_rest(out: str, targets=None, options: BagFitOptions = BagFitOptions()) -> dict:
    """``ipcjax fit --scene bag``: E, μf or kθ (or a pair) from the bag's rest shape.

    Every forward run goes from ``options.start`` (default the tie checkpoint, 8.40 s) to
    10.50 s at a point of a fixed lattice in log-parameter space; an evaluation is the
    cubic B-spline smoothing of the runs at the lattice points around it, each run once
    (:class:`fitting.bag_rest.BagRestProblem`), and Levenberg–Marquardt steps from the
    smoothed measurements' Jacobian. After the fit one more run at the best value gives the
    fitted run's own measurements and final mesh.

    Args:
        out: run folder: ``fit.json`` (iterates, final values, Jacobian, 1σ interval for
            the measurement noise, identifiability, what the model's own scatter allows
            (:func:`fitting.uncertainty.scatter_budget`; with K ≥ 2 runs per node only their
            measured spread, ``node_spread``, averages away), ``one_bag``: the interval of a fit
            to one measured bag, with the tape noise, that scatter and the bag's own
            (:func:`fitting.uncertainty.one_bag`), the goodness of fit against the same three
            (:func:`fitting.uncertainty.goodness_of_fit`), the
            fitted run, the reach message if any and ``misfit``, the measurements the model
            does not reach, if any), ``fit.png``, ``mesh/fitted_*`` (the fitted run's final frame) and
            ``nodes/`` (each run's folder).
        targets: measured (neck x, neck y, flap) in m; None: synthetic, the smoothed
            measurements at the film defaults (one more evaluation).
    Returns:
        the contents of fit.json. ``fitted`` is None when the answer lies outside the
        model's reach (``outside_reach`` says why) or the fit failed (``failed``). A
        ``misfit`` keeps ``fitted`` (the best compromise) and says which measurement
        stays ``MISFIT_SIGMAS`` σ or more from its target, and by how much.
        ``history_bias``, for measured targets fitted from the default tie checkpoint,
        says how far such fits landed from bags whose whole history ran at their E
        (:func:`fitting.uncertainty.history_message`); it too keeps ``fitted``.
    """
    from fitting import bag_rest as br
    from fitting.bag_nodes import NodeFailed
    from fitting.fit import FitIterate, FitResult
    from fitting.rest_derivative import BAG_NAMES
    from fitting.uncertainty import (BAG_SCATTER_MM, MODEL_SCATTER_MM, goodness_of_fit, history_message,
                                     identifiability, interval, misfit_message, node_scatter, one_bag, reach_message,
                                     scatter_budget)
    from ipcjax.model import Params
    from ipcjax.runfolder import Trajectory, read_npz
    from scenes.bag import SPHERE_RADII
    from scenes.outputs import export_meshes
    from scenes.perturb import describe_ensemble

    options.check()
    names = tuple(options.names)
    targets = None if targets is None else check_targets(targets, "targets")
    prepare(out)
    t_start = time.perf_counter()
    start = options.start or br.DEFAULT_START
    known = float64_params(Params.film_defaults())
    problem = br.BagRestProblem(names, start, os.path.join(out, "nodes"), step=options.step,
                                workers=options.workers, estimator=options.estimator,
                                runs_per_node=options.runs_per_node, perturb=options.perturb)
    record = dict(scene="bag", method="rest shape, cubic B-spline smoothing over a lattice in log-parameters "
                                      "(fitting/bag_rest.py)",
                  params=list(names), start_state=os.path.abspath(start), lattice_step_log=options.step,
                  estimator=options.estimator, noise_mm=options.noise_mm,
                  runs_per_node=options.runs_per_node,
                  perturbation=describe_ensemble(options.perturb, options.runs_per_node),
                  bounds={n: list(problem.bounds[n]) for n in names},
                  known_params={n: float(getattr(known, n)) for n in BAG_NAMES})
    synthetic = targets is None
    result, failed, outside, misfit, fitted_run, bias = None, None, None, None, None, None
    try:
        if synthetic:
            targets = problem(to_z(names, known), known).y
            record["synthetic_evaluation"] = problem.records.pop().to_json()
        record.update(synthetic=synthetic, target_m=dict(zip(SHAPE_ROWS, map(float, targets))))
        if options.start_value is not None:
            starts = {names[0]: options.start_value}
        else:
            starts = {n: options.start_factor * float(getattr(known, n)) for n in names}
        p0 = known._replace(**{n: np.float64(v) for n, v in starts.items()})
        record["start"] = starts
        result = fit_measured(problem, targets, p0, names, optimizer=levenberg_marquardt(),
                              iterations=options.iterations, loss_tol=1e-4, rel_tol=1e-6, scale=SHAPE_SCALE,
                              progress=options.progress)
    except (NodeFailed, FitFailed) as e:
        failed = str(e)
    recs = problem.records
    record["iterates"] = [r.to_json() for r in recs]
    t_mm = None if targets is None else np.asarray(targets) * 1e3
    loss = lambda r: float(np.sum((np.asarray(r.y) * 1e3 - t_mm) ** 2))
    best = min(recs, key=loss) if recs else None
    try:
        if best is not None and not failed:
            nd = problem.run(np.asarray(best.z))   # the fitted value's own run
            fitted_run = dict(params=best.params, y_mm=(nd.y * 1e3).tolist(), run_dir=nd.run_dir,
                              loss_mm2=float(np.sum((nd.y * 1e3 - t_mm) ** 2)), wall_s=nd.wall_s)
            tr = read_npz(os.path.join(nd.run_dir, "trajectory.npz"), "fitted run trajectory")
            last = Trajectory(tr["film"][-1:], tr["spheres"][-1:], tr["faces"], tr["time"][-1:])
            export_meshes(os.path.join(out, "mesh"), last, SPHERE_RADII, prefix="fitted")
    except NodeFailed as e:
        failed = f"the fitted value's own run: {e}"
    finally:
        problem.close()
    if best is not None:
        J = np.asarray(best.J) * 1e3
        w = np.asarray([nd.weight for nd in best.nodes])
        J_rest = np.tensordot(w, np.asarray([nd.J_rest for nd in best.nodes]), axes=1) * 1e3
        outside = reach_message(names, problem.bounds, recs, targets)
        # K ≥ 2 runs per node: only the part of the scatter in which they differ averages away
        scatter, spread = options.model_scatter_mm or MODEL_SCATTER_MM, node_spread(best)
        bag = options.bag_scatter_mm or BAG_SCATTER_MM
        within = None if spread is None else spread["rms_sd_mm"]
        record.update(
            best=dict(params=best.params, y_mm=(np.asarray(best.y) * 1e3).tolist(), loss_mm2=loss(best)),
            fitted_run=fitted_run,
            jacobian_mm_per_log=dict(rows=list(SHAPE_ROWS), cols=list(names), J=J.tolist()),
            interval_1sigma=interval(J, names, best.params, options.noise_mm),
            identifiability=dict(smoothed=identifiability(J, names, options.noise_mm),
                                 rest_state=identifiability(J_rest, list(BAG_NAMES), options.noise_mm)),
            model_scatter=scatter_budget(J, names, best.params, scatter, effective_runs=best.effective_runs,
                                         runs_per_node=best.runs_per_node, within_mm=within),
            node_spread=spread,
            one_bag=one_bag(J, names, best.params, options.noise_mm, bag, node_scatter(scatter, within, best.runs_per_node),
                            effective_runs=best.effective_runs),
            goodness_of_fit=goodness_of_fit(np.asarray(best.y) * 1e3, t_mm, len(names), options.noise_mm,
                                            node_scatter(scatter, within, best.runs_per_node),
                                            effective_runs=best.effective_runs, bag_scatter_mm=bag))
        misfit = misfit_message(record["goodness_of_fit"])
        bias = history_message(os.path.abspath(start) == os.path.abspath(br.DEFAULT_START), synthetic)
        history = [FitIterate(iteration=i, loss=loss(r), params=r.params, wall_s=r.wall_s)
                   for i, r in enumerate(recs)]
        try:
            plot_history(FitResult(None, history, False), os.path.join(out, "fit.png"))
        except ImportError:
            pass
    record.update(converged=bool(result.converged) if result is not None else False, failed=failed,
                  outside_reach=outside, misfit=misfit, history_bias=bias,
                  fitted=None if (failed or outside or not recs) else dict(best.params),
                  evaluations=problem.evaluations, runs=problem.runs,
                  seconds_per_evaluation=problem.run_s / problem.evaluations if problem.evaluations else None,
                  wall_s=time.perf_counter() - t_start, cpus=os.cpu_count(), load_average=list(os.getloadavg()))
    write_json(os.path.join(out, "fit.json"), record)
    return record

"""The fit application: the jobs behind ``ipcjax fit`` as library functions.

* :func:`fit_pouch` (the default): E, μf and kθ from the neck width (x, y) and flap height
  of the small pouch in ``scenes/pouch.py``, each alone or jointly, against synthetic or
  measured targets.
* :func:`fit_bag_rest` (``ipcjax fit --scene bag``): E, μf or kθ, or a pair, from the
  481-vertex bag's rest shape after release, Gaussian-smoothed over the parameters
  (``fitting.bag_rest``); writes ``out/fit.json``.
* :func:`fit_bag`: the same three over a window of steps of the bag (``fitting.bag``;
  ``--window``).
* :func:`fit_cantilever`: one parameter from a clamped film's tip height, with adam.

Each rollout job builds one :class:`fitting.fit.MeasuredRollout` over all the parameters
it may fit, so the rollout's forward and reverse passes compile once for every fit the
job runs, and checks its inputs (targets, options, run folder) before that compilation;
each returns the summary it wrote to ``out/summary.json``. The rest-shape job runs its
forward runs in worker processes and checks its inputs before starting them.
"""
from __future__ import annotations

import json
import os
import time
from typing import NamedTuple

import numpy as np

from fitting.fit import FitFailed, MeasuredRollout, fit_measured, levenberg_marquardt, plot_history, to_z
from fitting.smoothing import DEFAULT_STEP
from ipcjax.runfolder import prepare, write_json

POUCH_PARAMS = ("youngs_modulus", "friction", "bending_scale")
SHAPE_ROWS = ("neck_x", "neck_y", "flap")
SHAPE_SCALE = 1e-3  # residuals in mm


class ShapeFitOptions(NamedTuple):
    """What the pouch and bag jobs fit, and from where."""

    param: str | None = None     # fit only this one of POUCH_PARAMS; None: each in turn
    joint: bool = False          # fit all three together
    start: float | None = None   # start value of a single parameter
    start_factor: float = 2.0    # otherwise start at this × the known value
    iterations: int = 30         # maximum evaluations per fit
    progress: bool = True        # progress bars

    def groups(self) -> list:
        """The parameter groups to fit, in order; raises ValueError on a bad combination."""
        if self.param is not None and self.param not in POUCH_PARAMS:
            raise ValueError(f"param must be one of {', '.join(POUCH_PARAMS)}; got {self.param!r}")
        if self.joint and self.param:
            raise ValueError("joint fits all three; leave out param")
        if not (np.isfinite(self.start_factor) and self.start_factor > 0):
            raise ValueError(f"start_factor must be > 0; got {self.start_factor}")
        if self.start is not None and not (np.isfinite(self.start) and self.start > 0):
            raise ValueError(f"start must be > 0; got {self.start}")
        if int(self.iterations) != self.iterations or self.iterations < 1:
            raise ValueError(f"iterations must be a positive integer; got {self.iterations}")
        if self.joint:
            return [list(POUCH_PARAMS)]
        if self.param:
            return [[self.param]]
        return [[n] for n in POUCH_PARAMS]

    def start_values(self, names, known) -> dict:
        return {n: (self.start if self.start is not None and len(names) == 1
                    else self.start_factor * float(getattr(known, n))) for n in names}


# --------------------------------------------------------------------------- targets


def check_targets(t, source: str) -> np.ndarray:
    """(neck x, neck y, flap) in m as a float array; ValueError naming ``source`` otherwise."""
    if isinstance(t, (list, tuple)) and any(isinstance(v, (str, bool)) for v in t):
        raise ValueError(f"{source}: targets must be three numbers (m), not strings or booleans; got {t!r}")
    try:
        t = np.asarray(t, np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{source}: targets must be three numbers (m); got {t!r}") from None
    if t.shape != (3,) or not np.all(np.isfinite(t)) or t[0] <= 0 or t[1] <= 0:
        raise ValueError(f"{source}: targets must be finite with positive neck widths; got {t.tolist()}")
    return t


class FlagError(ValueError):
    """Target flags given in a combination that means nothing (a usage error)."""


TARGET_FLAGS = (("--neck-x", "neck width along x"), ("--neck-y", "neck width along y"), ("--flap", "flap height"))
PLAUSIBLE_M = (1e-4, 1.0)  # m: a neck width or flap height outside 0.1 mm … 1 m is almost surely in the other unit


def parse_length(value, flag: str, what: str, unit: str = "m") -> float:
    """One measurement flag's value in m.

    ``value`` is a number in ``unit`` ("m" for ``--neck-x``, "mm" for ``--neck-x-mm``) or a
    string: a number, taken in ``unit``, or a number with its unit (``38.83mm``,
    ``0.03883m``), which wins over the flag's. Non-finite values pass (the target check
    refuses them); None (not given) stays None.

    Raises:
        FlagError: not a number, or a magnitude outside 0.1 mm … 1 m: the message says which
            unit the value was almost surely meant in (a neck of 38.83 m is 38.83 mm).
    """
    if value is None:
        return None
    text = str(value).strip().lower()
    for suffix in ("mm", "m"):
        if text.endswith(suffix):
            text, unit = text[:-len(suffix)].strip(), suffix
            break
    try:
        number = float(text)
    except ValueError:
        raise FlagError(f"{flag} {value!r}: not a length; give a number in {unit}, or a number with its unit "
                        f"(38.83mm, 0.03883m)") from None
    metres = number * (1e-3 if unit == "mm" else 1.0)
    lo, hi = PLAUSIBLE_M
    if not np.isfinite(metres) or metres == 0 or lo <= abs(metres) < hi:
        return metres
    base = flag[:-3] if flag.endswith("-mm") else flag
    message = f"{flag} {value}: a {what} of {number:g} {unit} is implausible (expected 0.1 mm to 1 m)"
    if unit == "m" and lo <= abs(number) * 1e-3 < hi:
        message += f"; it is almost surely in mm: write {base}-mm {number:g} or {base} {number:g}mm"
    elif unit == "mm" and lo <= abs(number) < hi:
        message += f"; it is almost surely in m: write {base} {number:g} or {base}-mm {number * 1e3:g}"
    raise FlagError(message)


def targets_from(path: str | None, values, values_mm=(None, None, None)) -> np.ndarray | None:
    """The measured targets of ``ipcjax fit``, in m: from the JSON file ``path``
    (``--targets``), or from ``values`` (``--neck-x``, ``--neck-y``, ``--flap``: m, or with a
    unit, ``38.83mm``) and ``values_mm`` (``--neck-x-mm``, ``--neck-y-mm``, ``--flap-mm``:
    mm), None where not given (:func:`parse_length`), or None (synthetic targets) when
    none is given.

    Raises:
        FlagError: both sources, a measurement in both units, only some of the three,
            values out of range or implausible for their unit.
        ValueError, OSError: from :func:`load_targets`.
    """
    for (flag, _), v, v_mm in zip(TARGET_FLAGS, values, values_mm):
        if v is not None and v_mm is not None:
            raise FlagError(f"give {flag} (m) or {flag}-mm (mm), not both")
    values = [parse_length(v, flag, what) if v_mm is None else parse_length(v_mm, f"{flag}-mm", what, "mm")
              for (flag, what), v, v_mm in zip(TARGET_FLAGS, values, values_mm)]
    given = [v is not None for v in values]
    if path is not None:
        if any(given):
            raise FlagError("give --targets or --neck-x, --neck-y and --flap, not both")
        return load_targets(path)
    if not any(given):
        return None
    if not all(given):
        raise FlagError("give all three of --neck-x, --neck-y and --flap (in m, or their -mm forms in mm)")
    try:
        return check_targets(tuple(values), "--neck-x, --neck-y, --flap")
    except ValueError as e:
        raise FlagError(str(e)) from None


def check_window_flags(state_path: str | None, steps: int) -> None:
    """The ``--state`` and ``--window`` of ``ipcjax fit --scene bag``; FlagError if unusable."""
    if state_path is None:
        raise FlagError("--scene bag --window needs --state: a state.npz written by `ipcjax bag` "
                        "(e.g. runs/bag/state.npz)")
    if not os.path.exists(state_path):
        raise FlagError(f"--state {state_path}: no such file")
    if steps < 1:
        raise FlagError(f"--window must be ≥ 1; got {steps}")


def load_targets(path: str) -> np.ndarray:
    """Measured (neck x, neck y, flap) in m from a JSON file.

    The file holds an object with ``neck_x_m``, ``neck_y_m`` and ``flap_m`` (m), or with
    ``neck_width_mm`` ([x, y]) and ``flap_height_mm`` (mm), at the top level or under
    ``measurements`` (so an ``ipcjax bag`` summary.json works as is).

    Raises:
        FileNotFoundError / OSError: the file cannot be read (the message names it).
        ValueError: not JSON, not an object, keys missing, or values not finite numbers.
    """
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"targets file {path}: no such file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"targets file {path}: not a text file ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise OSError(f"targets file {path}: cannot read it ({e.strerror or e})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"targets file {path}: not valid JSON ({e.msg} at line {e.lineno}, "
                         f"column {e.colno})") from None
    if isinstance(d, dict) and isinstance(d.get("measurements"), dict):
        d = d["measurements"]
    if not isinstance(d, dict):
        raise ValueError(f"targets file {path}: expected a JSON object with neck_x_m, neck_y_m, flap_m; "
                         f"got a JSON {type(d).__name__}")
    try:
        if "neck_width_mm" in d:
            w = d["neck_width_mm"]
            if not isinstance(w, (list, tuple)) or len(w) != 2:
                raise ValueError(f"targets file {path}: neck_width_mm must be [x, y] in mm; got {w!r}")
            t = [1e-3 * w[0], 1e-3 * w[1], 1e-3 * d["flap_height_mm"]]
        else:
            t = [d["neck_x_m"], d["neck_y_m"], d["flap_m"]]
    except KeyError as e:
        raise ValueError(f"targets file {path}: needs neck_x_m, neck_y_m, flap_m (m) or neck_width_mm, "
                         f"flap_height_mm (mm); missing {e}") from None
    except TypeError:
        raise ValueError(f"targets file {path}: the measurements must be numbers; got {d!r}") from None
    return check_targets(t, f"targets file {path}")


# --------------------------------------------------------------------------- pouch and bag


def fit_pouch(out: str, targets=None, options: ShapeFitOptions = ShapeFitOptions()) -> dict:
    """Default ``ipcjax fit``: E, μf, kθ from the pouch's neck width (x, y) and flap height.

    Args:
        out: run folder (summary.json, fit_<params>.json/.png).
        targets: measured (neck x, neck y, flap) in m; None: simulated at the film defaults.
        options: which parameters, from where, how many iterations.
    """
    import jax.numpy as jnp

    from ipcjax.candidates import initial_capacity
    from ipcjax.implicit import make_rollout
    from scenes.pouch import measure as pouch_measure, pouch_scene

    groups = options.groups()  # every input is checked before any compilation
    targets = None if targets is None else check_targets(targets, "targets")
    prepare(out)
    t_start = time.perf_counter()
    sc = pouch_scene()
    m = sc.model
    cap = sc.capacity or initial_capacity(m.topology)
    roll = make_rollout(m, sc.config, cap, round_fp32=False)
    x0, ctl, dt = jnp.asarray(sc.x), sc.controls, sc.dt
    neck, rim = sc.neck, sc.rim

    def rollout(p):
        frames, _, codes = roll(p, x0, jnp.zeros_like(x0), ctl, dt)
        return frames[-1:], codes  # the measurements need the final frame only

    measure = lambda frames: pouch_measure(frames[-1], neck, rim)
    return fit_shape(out, "pouch", rollout, measure, sc.params, targets=targets, options=options, groups=groups,
                     t_start=t_start, extra={})


def fit_bag(out: str, window: "fitting.bag.BagWindow", targets=None, options: ShapeFitOptions = ShapeFitOptions(),
            state_path: str | None = None) -> dict:
    """``ipcjax fit --scene bag``: E, μf, kθ from the bag's neck and flap over a window of
    steps from a saved ``ipcjax bag`` state.

    Args:
        window: from :func:`fitting.bag.bag_window` (scene, controls, reference capacity).
        state_path: the state file the window started from (recorded in the summary).
        out, targets, options: as in :func:`fit_pouch`.
    """
    import jax
    import jax.numpy as jnp

    from ipcjax.implicit import make_rollout
    from scenes.pouch import measure as shape_measure

    groups = options.groups()
    targets = None if targets is None else check_targets(targets, "targets")
    prepare(out)
    t_start = time.perf_counter()
    sc = window.scene
    roll = make_rollout(sc.model, window.rollout_config, window.capacity, round_fp32=False)
    x0, v0 = jnp.asarray(window.x0), jnp.asarray(window.v0)
    ctl, dt = window.controls, window.dt
    neck, rim = jnp.asarray(sc.neck), jnp.asarray(sc.rim)

    def rollout(p):
        frames, _, codes = roll(p, x0, v0, ctl, dt)
        return frames[-1:], codes

    measure = lambda frames: shape_measure(frames[-1], neck, rim)
    extra = dict(state=None if state_path is None else os.path.abspath(state_path), resolution=sc.resolution,
                 window=dict(steps=len(jax.tree_util.tree_leaves(ctl)[0]), t0_s=window.t0,
                             t1_s=window.t1, phases=window.phases))
    return fit_shape(out, "bag", rollout, measure, window.params, targets=targets, options=options, groups=groups,
                     t_start=t_start, extra=extra)


def fit_bag_state(out: str, state_path: str, steps: int, targets=None,
                  options: ShapeFitOptions = ShapeFitOptions()) -> dict | None:
    """``ipcjax fit --scene bag``: :func:`fitting.bag.bag_window` of ``steps`` steps from the
    ``ipcjax bag`` state at ``state_path``, then :func:`fit_bag`. Returns None (and says why
    on stderr) when the state cannot be read or the window's reference run fails."""
    import sys

    from fitting.bag import WindowFailed, bag_window

    prepare(out)
    try:
        window = bag_window(state_path, steps)
    except (ValueError, WindowFailed) as e:
        print(f"fit: {e}", file=sys.stderr)
        return None
    return fit_bag(out, window, targets, options, state_path=state_path)


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
    estimator: str = "spline"           # the smoothed Jacobian (fitting.smoothing.ESTIMATORS)
    workers: int | None = None          # node processes (None: the cores)
    progress: bool = True

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
        if self.model_scatter_mm is not None:
            s = np.asarray(self.model_scatter_mm, np.float64)
            if s.shape != (3,) or not np.all(np.isfinite(s) & (s > 0)):
                raise ValueError("model_scatter_mm must be three values > 0 (neck x, neck y, flap, mm); "
                                 f"got {self.model_scatter_mm}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}; got {self.estimator!r}")


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
            (:func:`fitting.uncertainty.scatter_budget`), the fitted run, the reach message if
            any), ``fit.png``, ``mesh/fitted_*`` (the fitted run's final frame) and
            ``nodes/`` (each run's folder).
        targets: measured (neck x, neck y, flap) in m; None: synthetic, the smoothed
            measurements at the film defaults (one more evaluation).
    Returns:
        the contents of fit.json. ``fitted`` is None when the answer lies outside the
        model's reach (``outside_reach`` says why) or the fit failed (``failed``).
    """
    from fitting import bag_rest as br
    from fitting.bag_nodes import NodeFailed
    from fitting.fit import FitResult
    from fitting.rest_derivative import BAG_NAMES
    from fitting.uncertainty import MODEL_SCATTER_MM, identifiability, interval, reach_message, scatter_budget
    from ipcjax.model import Params
    from ipcjax.runfolder import Trajectory, read_npz
    from scenes.bag import SPHERE_RADII
    from scenes.outputs import export_meshes

    options.check()
    names = tuple(options.names)
    targets = None if targets is None else check_targets(targets, "targets")
    prepare(out)
    t_start = time.perf_counter()
    start = options.start or br.DEFAULT_START
    known = _float64_params(Params.film_defaults())
    problem = br.BagRestProblem(names, start, os.path.join(out, "nodes"), step=options.step,
                                workers=options.workers, estimator=options.estimator)
    record = dict(scene="bag", method="rest shape, cubic B-spline smoothing over a lattice in log-parameters "
                                      "(fitting/bag_rest.py)",
                  params=list(names), start_state=os.path.abspath(start), lattice_step_log=options.step,
                  estimator=options.estimator, noise_mm=options.noise_mm,
                  bounds={n: list(problem.bounds[n]) for n in names},
                  known_params={n: float(getattr(known, n)) for n in BAG_NAMES})
    synthetic = targets is None
    result, failed, outside, fitted_run = None, None, None, None
    try:
        if synthetic:
            targets = problem(to_z(names, known), known).y
            record["synthetic_evaluation"] = problem.records.pop()
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
    record["iterates"] = recs
    t_mm = None if targets is None else np.asarray(targets) * 1e3
    loss = lambda r: float(np.sum((np.asarray(r["y"]) * 1e3 - t_mm) ** 2))
    best = min(recs, key=loss) if recs else None
    try:
        if best is not None and not failed:
            nd = problem.run(np.asarray(best["z"]))   # the fitted value's own run
            fitted_run = dict(params=best["params"], y_mm=(nd.y * 1e3).tolist(), run_dir=nd.run_dir,
                              loss_mm2=float(np.sum((nd.y * 1e3 - t_mm) ** 2)), wall_s=nd.wall_s)
            tr = read_npz(os.path.join(nd.run_dir, "trajectory.npz"), "fitted run trajectory")
            last = Trajectory(tr["film"][-1:], tr["spheres"][-1:], tr["faces"], tr["time"][-1:])
            export_meshes(os.path.join(out, "mesh"), last, SPHERE_RADII, prefix="fitted")
    except NodeFailed as e:
        failed = f"the fitted value's own run: {e}"
    finally:
        problem.close()
    if best is not None:
        J = np.asarray(best["J"]) * 1e3
        w = np.asarray([nd["weight"] for nd in best["nodes"]])
        J_rest = np.tensordot(w, np.asarray([nd["J_rest"] for nd in best["nodes"]]), axes=1) * 1e3
        outside = reach_message(names, problem.bounds, recs, targets)
        record.update(
            best=dict(params=best["params"], y_mm=(np.asarray(best["y"]) * 1e3).tolist(), loss_mm2=loss(best)),
            fitted_run=fitted_run,
            jacobian_mm_per_log=dict(rows=list(SHAPE_ROWS), cols=list(names), J=J.tolist()),
            interval_1sigma=interval(J, names, best["params"], options.noise_mm),
            identifiability=dict(smoothed=identifiability(J, names, options.noise_mm),
                                 rest_state=identifiability(J_rest, list(BAG_NAMES), options.noise_mm)),
            model_scatter=scatter_budget(J, names, best["params"], options.model_scatter_mm or MODEL_SCATTER_MM,
                                         effective_runs=best["effective_runs"]))
        history = [dict(iteration=i, loss=loss(r), params=r["params"], wall_s=r["wall_s"]) for i, r in enumerate(recs)]
        try:
            plot_history(FitResult(None, history, False), os.path.join(out, "fit.png"))
        except ImportError:
            pass
    record.update(converged=bool(result.converged) if result is not None else False, failed=failed,
                  outside_reach=outside,
                  fitted=None if (failed or outside or not recs) else dict(best["params"]),
                  evaluations=problem.evaluations, runs=problem.runs,
                  seconds_per_evaluation=problem.run_s / problem.evaluations if problem.evaluations else None,
                  wall_s=time.perf_counter() - t_start, cpus=os.cpu_count(), load_average=list(os.getloadavg()))
    write_json(os.path.join(out, "fit.json"), record)
    return record


def fit_shape(out, scene, rollout, measure, known, *, targets, options, groups, t_start, extra) -> dict:
    """Fit each group of POUCH_PARAMS to (neck x, neck y, flap) of ``rollout``'s last frame.

    One :class:`MeasuredRollout` over all three log-parameters serves the Jacobian at the
    known parameters (which gives the synthetic targets and the identifiability figures)
    and every fit, so the rollout compiles once. Each fit starts from its own start
    values and runs Levenberg–Marquardt steps from the Jacobian at each iterate.

    Raises:
        FitFailed: the rollout at the known parameters failed (a failed fit is recorded
            in its entry of ``fits`` instead).
    """
    known = _float64_params(known)
    starts = [options.start_values(names, known) for names in groups]
    problem = MeasuredRollout(rollout, measure, POUCH_PARAMS)
    try:
        ev = problem(to_z(POUCH_PARAMS, known), known)
    except FitFailed as e:
        raise FitFailed(e.step, f"{e.reason} (the {scene} rollout at the known parameters)",
                        code=int(e.code)) from e
    J = ev.J / SHAPE_SCALE  # mm per unit log-parameter
    _, sv, Vt = np.linalg.svd(J)
    synthetic = targets is None
    target = ev.y if synthetic else np.asarray(targets)

    fits = []
    for names, start in zip(groups, starts):
        p0 = known._replace(**{n: np.float64(v) for n, v in start.items()})
        tag = "+".join(names)
        t0 = time.perf_counter()
        try:
            res = fit_measured(problem, target, p0, names, optimizer=levenberg_marquardt(),
                               iterations=options.iterations, loss_tol=1e-10 if len(names) == 1 else 1e-12,
                               scale=SHAPE_SCALE, progress=options.progress)
        except FitFailed as e:
            fits.append(dict(params=names, start=start, failed=str(e), wall_s=time.perf_counter() - t0))
            continue
        wall = time.perf_counter() - t0
        res.to_json(os.path.join(out, f"fit_{tag}.json"))
        try:
            plot_history(res, os.path.join(out, f"fit_{tag}.png"))
        except ImportError:
            pass
        best = min(res.history, key=lambda h: h["loss"])
        rec = dict(params=names, start=start, fitted={n: float(getattr(res.params, n)) for n in names},
                   iterations=len(res.history), final_loss=best["loss"], converged=res.converged, wall_s=wall)
        if synthetic:
            rec["relative_error"] = {n: abs(rec["fitted"][n] / float(getattr(known, n)) - 1.0) for n in names}
        fits.append(rec)
    summary = dict(
        scene=scene, **extra, synthetic=synthetic, target_m=dict(zip(SHAPE_ROWS, map(float, target))),
        known_params={n: float(getattr(known, n)) for n in POUCH_PARAMS},
        jacobian_mm_per_log=dict(rows=list(SHAPE_ROWS), cols=list(POUCH_PARAMS), J=J.tolist(),
                                 singular_values=sv.tolist(), condition_number=float(sv[0] / sv[-1]),
                                 weakest_direction=dict(zip(POUCH_PARAMS, Vt[-1].tolist()))),
        fits=fits, **_timing(problem, t_start))
    write_json(os.path.join(out, "summary.json"), summary)
    return summary


# --------------------------------------------------------------------------- cantilever


def fit_cantilever(out: str, param: str = "bending_scale", *, target: float | None = None, start: float | None = None,
                   steps: int = 6, iterations: int = 80, lr: float = 0.1, progress: bool = True) -> dict:
    """One parameter of a clamped film from its tip height after ``steps`` steps of 1/240 s.

    Args:
        param: bending_scale, youngs_modulus or thickness (the cantilever has no contact).
        target: measured mean tip height, m (default: simulated at the film defaults).
        start: start value (default 2× the film default).
        iterations: maximum evaluations; lr: adam's learning rate on the log-parameter.
    """
    import jax.numpy as jnp
    import optax

    from ipcjax.candidates import initial_capacity
    from ipcjax.implicit import make_rollout, stack_controls
    from ipcjax.model import Config, Controls, Params
    from scenes.film import cantilever_scene

    if param == "friction":
        raise ValueError("the cantilever has no contact: friction cannot be fitted there")
    truth = _float64_params(Params.film_defaults())
    true_value = float(getattr(truth, param))
    start = 2.0 * true_value if start is None else start
    if not (np.isfinite(start) and start > 0):
        raise ValueError(f"start must be > 0; got {start}")
    if target is not None and not np.isfinite(target):
        raise ValueError(f"target must be a finite tip height in m; got {target}")
    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be a positive integer; got {steps}")
    prepare(out)
    t_start = time.perf_counter()
    sc = cantilever_scene()
    m = sc.model
    roll = make_rollout(m, Config(), initial_capacity(m.topology), round_fp32=False)
    ctl = stack_controls([Controls.empty(m.n_particles, tolerance=1e-10)] * int(steps))
    x0 = jnp.asarray(sc.x)
    tip = jnp.asarray(sc.tip)

    def rollout(p):
        frames, _, codes = roll(p, x0, jnp.zeros_like(x0), ctl, 1 / 240)
        return frames, codes

    measure = lambda frames: jnp.mean(frames[-1, tip, 2])
    problem = MeasuredRollout(rollout, measure, [param])
    synthetic = target is None
    if synthetic:
        target = float(problem(to_z([param], truth), truth).y[0])
    p0 = truth._replace(**{param: np.float64(start)})
    res = fit_measured(problem, target, p0, optimizer=optax.adam(lr, b1=0.5), iterations=iterations,
                       loss_tol=1e-14, scale=1e-3, progress=progress)
    res.to_json(os.path.join(out, "fit.json"))
    try:
        plot_history(res, os.path.join(out, "fit.png"))
    except ImportError:
        pass
    fitted = float(getattr(res.params, param))
    summary = dict(scene="cantilever", param=param, start=start, fitted=fitted, target_tip_height_m=target,
                   iterations=len(res.history), final_loss=min(h["loss"] for h in res.history),
                   converged=res.converged)
    if synthetic:
        summary["true_value"] = true_value
        summary["relative_error"] = abs(fitted - true_value) / abs(true_value)
    summary.update(_timing(problem, t_start))
    write_json(os.path.join(out, "summary.json"), summary)
    return summary


# --------------------------------------------------------------------------- helpers


def _float64_params(params):
    """``params`` with every field a float64 NumPy value."""
    return type(params)(*(np.asarray(v, np.float64) for v in params))


def _timing(problem: MeasuredRollout, t_start: float) -> dict:
    return dict(compiles=problem.compiles, compile_s=problem.compile_s, evaluations=problem.evaluations,
                seconds_per_evaluation=problem.run_s / problem.evaluations if problem.evaluations else None,
                wall_s=time.perf_counter() - t_start, cpus=os.cpu_count(),
                load_average=list(os.getloadavg()))

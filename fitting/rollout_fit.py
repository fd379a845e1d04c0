"""The fit jobs behind ``ipcjax fit`` that differentiate a rollout, as library functions.

* :func:`fit_pouch` (the default): E, μf and kθ from the neck width (x, y) and flap height
  of the small pouch in ``scenes/pouch.py``, each alone or jointly, against synthetic or
  measured targets.
* :func:`fit_bag`: the same three over a window of steps of the bag (``fitting.bag``;
  ``--window``).
* :func:`fit_cantilever`: one parameter from a clamped film's tip height, with adam.

Each job builds one :class:`fitting.fit.MeasuredRollout` over all the parameters it may
fit, so the rollout's forward and reverse passes compile once for every fit the job runs,
and checks its inputs (targets, options, run folder) before that compilation; each
returns the summary it wrote to ``out/summary.json``. The bag's rest-shape fit
(``ipcjax fit --scene bag``) is :mod:`fitting.bag_rest_fit`.
"""
from __future__ import annotations

import os
import time
from typing import NamedTuple

import numpy as np

from fitting.fit import FitFailed, MeasuredRollout, fit_measured, levenberg_marquardt, plot_history, to_z
from fitting.targets import check_targets
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
    known = float64_params(known)
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
        best = min(res.history, key=lambda h: h.loss)
        rec = dict(params=names, start=start, fitted={n: float(getattr(res.params, n)) for n in names},
                   iterations=len(res.history), final_loss=best.loss, converged=res.converged, wall_s=wall)
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
    truth = float64_params(Params.film_defaults())
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
                   iterations=len(res.history), final_loss=min(h.loss for h in res.history),
                   converged=res.converged)
    if synthetic:
        summary["true_value"] = true_value
        summary["relative_error"] = abs(fitted - true_value) / abs(true_value)
    summary.update(_timing(problem, t_start))
    write_json(os.path.join(out, "summary.json"), summary)
    return summary


# --------------------------------------------------------------------------- helpers


def float64_params(params):
    """``params`` with every field a float64 NumPy value."""
    return type(params)(*(np.asarray(v, np.float64) for v in params))


def _timing(problem: MeasuredRollout, t_start: float) -> dict:
    return dict(compiles=problem.compiles, compile_s=problem.compile_s, evaluations=problem.evaluations,
                seconds_per_evaluation=problem.run_s / problem.evaluations if problem.evaluations else None,
                wall_s=time.perf_counter() - t_start, cpus=os.cpu_count(),
                load_average=list(os.getloadavg()))

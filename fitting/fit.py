"""Fit material parameters to measurements of simulated trajectories with optax.

One compiled program per problem. :class:`MeasuredRollout` maps log-parameters z to the
measurements y = measure(rollout(params(z))) and their Jacobian J = ∂y/∂z, with
``jax.jacrev`` (one VJP per measurement, vmapped over one forward pass) inside one
``jax.jit``. Every z is a traced argument, and so are the parameters held fixed, so a
fit of E alone, μf alone, kθ alone or all three, from any start, runs the same
executable: the loss and its gradient follow from (y, J) on the host,

    r = (y − t)/s,    L = Σ rᵢ²,    ∇L = 2 Jᵀ (r/s),

and a fit of a subset of the names takes J's columns for that subset.

Positive parameters are fitted as log p, Poisson's ratio as logit(2ν). Every iteration is
recorded (loss, parameters, gradient norm, wall time); the loop stops early when the
loss or its relative change is small; the progress bar shows each evaluation's loss, its
parameters and the step max |Δz| that led to it. A failed step inside a rollout stops the
fit with the step index and the reason (:class:`FitFailed`); parameters never become NaN.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, NamedTuple, Protocol, Sequence, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ipcjax import compile_guard
from ipcjax.model import Params
from ipcjax.result import StepCode
from ipcjax.runfolder import write_json
from ipcjax.step import StepFailed

# Parameters fitted in log space: those of ipcjax.model.Params, then the spring and chain
# relaxation factors of baselines.verlet_cloth.VerletParams (from_z/to_z read and set any
# NamedTuple's fields by name).
POSITIVE = ("youngs_modulus", "thickness", "bending_scale", "friction", "barrier_stiffness", "drag",
            "stiffness", "bend_stiffness")
FITTABLE = POSITIVE + ("poisson",)


class FitFailed(StepFailed):
    """A rollout step failed during the fit: ``step`` (−1 when no step is known) and
    ``reason`` say where and why, ``code`` is its StepCode; ``iteration`` is None for an
    evaluation outside the fit loop."""

    def __init__(self, step: int, reason: str, iteration: int | None = None, code: int = 0):
        where = "" if iteration is None else f"fit iteration {iteration}: "
        what = f"rollout step {step} failed" if step >= 0 else "rollout failed"
        super().__init__(f"{where}{what}: {reason}", code)
        self.step, self.reason, self.iteration = step, reason, iteration


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitIterate:
    """One evaluation of a fit: what its history records and its JSON writes (fields in
    this order)."""

    iteration: int
    loss: float                     # Σ ((y − target)/scale)² at this iterate
    grad_norm: float | None = None  # ‖∇loss‖ in the log-parameters; None where not computed
    wall_s: float                   # seconds since the fit started
    params: dict                    # the fitted parameters' values, by name

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class FitResult(NamedTuple):
    """params: the evaluated iterate with the lowest loss; history: one
    :class:`FitIterate` per evaluation; converged: whether a tolerance stopped the loop."""

    params: Params
    history: list
    converged: bool

    def to_json(self, path):
        """Write the fitted values and the per-iteration history as JSON."""
        write_json(path, dict(params={k: np.asarray(v).tolist() for k, v in self.params._asdict().items()},
                              history=[h.to_json() for h in self.history], converged=self.converged))


# --------------------------------------------------------------------------- parameters in z


def _check_names(names) -> tuple:
    names = tuple(names)
    if not names:
        raise ValueError("nothing to fit: give at least one parameter name")
    for n in names:
        if n not in FITTABLE:
            raise ValueError(f"cannot fit {n!r}; fittable parameters are {', '.join(FITTABLE)}")
    if len(set(names)) != len(names):
        raise ValueError(f"each parameter once, please; got {', '.join(names)}")
    return names


def _check_values(names, p: Params):
    for n in names:
        v = np.asarray(getattr(p, n))
        if v.shape != () or not np.isfinite(v):
            raise ValueError(f"initial {n} must be a finite scalar; got {v}")
        if n in POSITIVE and v <= 0:
            raise ValueError(f"initial {n} must be > 0 (it is fitted in log space); got {float(v)}")
        if n == "poisson" and not 0 < v < 0.5:
            raise ValueError(f"initial poisson must lie in (0, 0.5); got {float(v)}")


def to_z(names, p: Params) -> np.ndarray:
    """Log-parameters of ``names`` in ``p``: log p, or log(ν/(0.5 − ν)) for Poisson's ratio."""
    z = []
    for n in names:
        v = float(getattr(p, n))
        z.append(math.log(v) if n in POSITIVE else math.log(v / (0.5 - v)))
    return np.asarray(z, np.float64)


def from_z(names, z, p0: Params) -> Params:
    """``p0`` with ``names`` set from log-parameters z (the inverse of :func:`to_z`)."""
    upd = {}
    for i, n in enumerate(names):
        upd[n] = jnp.exp(z[i]) if n in POSITIVE else 0.5 * jax.nn.sigmoid(z[i])
    return p0._replace(**upd)


def _as_float64(params: Params) -> Params:
    # one dtype and no weak types, so that every call hits the same executable
    return jax.tree_util.tree_map(lambda v: jnp.asarray(v, jnp.float64), params)


# --------------------------------------------------------------------------- rollout failures


def rollout_failure(exc: BaseException):
    """The rollout failure (with ``step`` and ``reason``) behind ``exc``, or None.

    A rollout that raises on a failed step does so as ``ipcjax.implicit.RolloutFailed``
    (or ``BackwardFailed``) on the host and as a ``JaxRuntimeError`` carrying the same
    text inside jit; ``ipcjax.implicit.rollout_failure`` maps either back. Where that
    function does not exist (rollouts that only report codes), this returns None.
    """
    try:
        from ipcjax.implicit import rollout_failure as from_exception
    except ImportError:
        return None
    return from_exception(exc)


def _raise_on_codes(codes):
    codes = np.asarray(codes)
    bad = np.flatnonzero(codes)
    if bad.size:
        code = int(codes[bad[0]])
        raise FitFailed(int(bad[0]), StepCode.describe(code), code=code)


# --------------------------------------------------------------------------- one compiled problem


class Evaluation(NamedTuple):
    y: np.ndarray       # (m,) measurements
    J: np.ndarray       # (m, k) ∂y/∂z over the problem's k names
    wall_s: float       # this evaluation's wall time (incl. compilation on the first call)


@runtime_checkable
class MeasuredProblem(Protocol):
    """What :func:`fit_measured` needs of a problem: the parameters its log-parameters z
    hold, and the measurements with their Jacobian at z. :class:`MeasuredRollout` (one
    compiled rollout) and :class:`fitting.bag_rest.BagRestProblem` (smoothed bag runs)
    honour it."""

    names: tuple[str, ...]

    def __call__(self, z, params: Params) -> Evaluation:
        """(y, J = ∂y/∂z) at log-parameters z over ``names``, the other parameters from
        ``params``; raises FitFailed when a run it needs failed."""
        ...


class MeasuredRollout:
    """Measurements of a rollout and their Jacobian in log-parameters, compiled once.

    y(z) = measure(rollout(p(z))), p(z) = ``params`` with ``names[i]`` = exp(zᵢ)
    (Poisson's ratio: 0.5·sigmoid(zᵢ)); J = ∂y/∂z by ``jax.jacrev``. z and ``params`` are
    both traced, so every start point and every subset of ``names`` runs one executable
    (compiled ahead of time on the first call; ``compiles`` counts, ``compile_s`` times it).

    Args:
        rollout: ``params -> (frames, codes)``, differentiable (e.g. from make_rollout);
            codes (T,) int, non-zero for a failed step.
        measure: ``frames -> measurements`` (any shape; flattened to (m,)), differentiable.
        names: the parameters that z holds (see FITTABLE).

    Cost per call: one forward rollout and m reverse passes, batched by vmap over the one
    forward pass.
    """

    def __init__(self, rollout: Callable, measure: Callable, names: Sequence[str]):
        self.names = _check_names(names)

        def measurements_and_jacobian(z, params):
            def y_of_z(z):
                frames, codes = rollout(from_z(self.names, z, params))
                y = jnp.ravel(jnp.asarray(measure(frames), jnp.float64))
                return y, (y, codes)

            J, (y, codes) = jax.jacrev(y_of_z, has_aux=True)(z)
            return y, J, codes

        self._jit = jax.jit(measurements_and_jacobian)
        self._executable = None
        self.compiles = 0        # XLA compilations of the program (0 or 1)
        self.compile_s = 0.0     # wall of tracing, lowering and compiling it, s
        self.evaluations = 0     # calls
        self.run_s = 0.0         # their wall without the compilation, s

    def __call__(self, z, params: Params) -> Evaluation:
        """(y, J) at log-parameters z, the other values from ``params``.

        Raises:
            FitFailed: a rollout step failed (its index and reason; ``iteration`` None).
        """
        t0 = time.perf_counter()
        z = jnp.asarray(z, jnp.float64).reshape(len(self.names))
        params = _as_float64(params)
        if self._executable is None:
            self._executable = self._jit.lower(z, params).compile()
            self.compiles += 1
            self.compile_s = time.perf_counter() - t0
        t_run = time.perf_counter()
        try:
            y, J, codes = self._executable(z, params)
            y, J, codes = np.asarray(y), np.asarray(J), np.asarray(codes)
        except Exception as e:  # a rollout that raises on a failed step
            failed = rollout_failure(e)
            if failed is None:
                raise
            raise FitFailed(int(getattr(failed, "step", -1)), str(getattr(failed, "reason", failed)),
                            code=int(getattr(failed, "code", 0))) from e
        finally:
            self.evaluations += 1
            self.run_s += time.perf_counter() - t_run
        _raise_on_codes(codes)
        return Evaluation(y, J, time.perf_counter() - t0)


# --------------------------------------------------------------------------- Levenberg–Marquardt


class LevenbergMarquardtState(NamedTuple):
    z: jnp.ndarray        # (k,) the accepted iterate, the base of the next step
    loss: jnp.ndarray     # () its loss (inf before the first update)
    grad: jnp.ndarray     # (k,) its gradient 2 Jᵀr
    jtj: jnp.ndarray      # (k, k) its Gauss–Newton matrix JᵀJ
    damping: jnp.ndarray  # () λ of the next step
    radius: jnp.ndarray   # () the largest |Δᵢ| of the next step


def levenberg_marquardt(damping: float = 1e-3, increase: float = 10.0, decrease: float = 0.3,
                        max_step: float = 0.5) -> optax.GradientTransformationExtraArgs:
    """Levenberg–Marquardt steps on a least-squares loss L = Σ rᵢ², as an optax transformation.

    ``update(g, state, z, value=L, jacobian=J)`` takes the gradient g = 2 Jᵀr, the loss
    and the residual Jacobian J (m × k) at z, all of which the fit loop has from one
    evaluation. The step from the accepted iterate (z, g, A = JᵀJ) is

        Δ = −(2 (A + λ D))⁻¹ g,    D = diag(A) + 1e-12 · max diag(A)   (Marquardt's scaling),

    scaled down so that max |Δᵢ| ≤ radius. The first call accepts z, with λ = ``damping``
    and radius = ``max_step`` (in log: 0.5 is a factor e^0.5 ≈ 1.65). Later, if L is no
    larger than the accepted loss, z is accepted, λ ← decrease·λ and the radius doubles
    (up to ``max_step``); otherwise the step is retried from the accepted iterate with
    λ ← increase·λ and the radius half the rejected step's, so that a small λ cannot
    repeat nearly the same rejected step. Pure ``jnp`` (``jnp.where`` for the accept
    test), so ``update`` jits.
    """

    def init(params):
        z = jnp.asarray(params, jnp.float64)
        k = z.shape[0]
        return LevenbergMarquardtState(z, jnp.asarray(jnp.inf), jnp.zeros(k), jnp.zeros((k, k)),
                                       jnp.asarray(damping, jnp.float64), jnp.asarray(max_step, jnp.float64))

    def update(updates, state, params=None, *, value=None, jacobian=None, **extra_args):
        del extra_args
        if params is None or value is None or jacobian is None:
            raise ValueError("levenberg_marquardt needs update(g, state, z, value=loss, jacobian=J)")
        g = jnp.asarray(updates, jnp.float64)
        z = jnp.asarray(params, jnp.float64)
        J = jnp.asarray(jacobian, jnp.float64)
        first = jnp.isinf(state.loss)
        accept = value <= state.loss
        base = jnp.where(accept, z, state.z)
        grad = jnp.where(accept, g, state.grad)
        A = jnp.where(accept, J.T @ J, state.jtj)
        loss = jnp.where(accept, value, state.loss)
        lam = jnp.where(first, state.damping,
                        jnp.where(accept, decrease * state.damping, increase * state.damping))
        rejected = jnp.max(jnp.abs(z - state.z))
        radius = jnp.where(first, max_step, jnp.where(accept, jnp.minimum(max_step, 2.0 * state.radius),
                                                      0.5 * jnp.minimum(state.radius, rejected)))
        d = jnp.diag(A)
        D = jnp.diag(d + 1e-12 * jnp.max(d))
        step = -jnp.linalg.solve(2.0 * (A + lam * D), grad)
        step = step * jnp.minimum(1.0, radius / jnp.maximum(jnp.max(jnp.abs(step)), 1e-300))
        return base + step - z, LevenbergMarquardtState(base, loss, grad, A, lam, radius)

    return optax.GradientTransformationExtraArgs(init, update)


# --------------------------------------------------------------------------- the fit loop


def fit(rollout: Callable, measure: Callable, target, params0: Params, names: Sequence[str], *,
        optimizer: optax.GradientTransformation | None = None, iterations: int = 60,
        loss_tol: float = 1e-10, rel_tol: float = 0.0, scale=None, progress: bool = True) -> FitResult:
    """Fit ``names`` of ``params0`` so that ``measure(trajectory)`` matches ``target``.

    Builds a :class:`MeasuredRollout` over ``names`` and runs :func:`fit_measured`; to
    fit several subsets on one compiled program, build the MeasuredRollout once and call
    :func:`fit_measured` for each.

    Args:
        rollout: ``params -> (frames, codes)``, differentiable (e.g. from make_rollout).
        measure: ``frames -> measurements`` (any shape, same as target), differentiable.
        target: measured values (any units; compared after division by ``scale``).
        names: parameter names (see FITTABLE); fitted in log space (ν in a logistic map).
        optimizer: an optax transformation on the log-parameters (default adam(0.1)); its
            update is called with ``value=`` (the loss) and ``jacobian=`` (of the scaled
            residuals), which :func:`levenberg_marquardt` uses and others ignore.
        iterations: maximum evaluations; loss_tol / rel_tol: early stopping.
        scale: per-measurement scale for the residuals (default |target| or 1).
    Returns:
        FitResult with the fitted Params, a history of :class:`FitIterate` (iteration,
        loss, grad_norm, wall_s, params) and whether it stopped early on a tolerance.
    Raises:
        ValueError: bad names, non-finite or non-positive initial values, bad targets.
        FitFailed: a rollout step failed (with its index and reason).
    """
    return fit_measured(MeasuredRollout(rollout, measure, names), target, params0, names,
                        optimizer=optimizer, iterations=iterations, loss_tol=loss_tol, rel_tol=rel_tol,
                        scale=scale, progress=progress)


def _check_target(target) -> np.ndarray:
    t = np.ravel(np.asarray(target, dtype=np.float64))
    if not np.all(np.isfinite(t)):
        raise ValueError(f"targets must be finite; got {t}")
    return t


def fit_measured(problem: MeasuredProblem, target, params0: Params, names: Sequence[str] | None = None, *,
                 optimizer: optax.GradientTransformation | None = None, iterations: int = 60,
                 loss_tol: float = 1e-10, rel_tol: float = 0.0, scale=None,
                 progress: bool = True) -> FitResult:
    """Fit ``names`` (default: all of ``problem.names``) on one compiled ``problem``.

    The parameters of ``problem.names`` that are not fitted stay at their values in
    ``params0``. Arguments, result and errors as in :func:`fit`; ``problem`` is any
    :class:`MeasuredProblem`.
    """
    if not isinstance(problem, MeasuredProblem):
        raise TypeError(f"problem must be a MeasuredProblem (names and __call__(z, params) -> Evaluation); "
                        f"got {type(problem).__name__}")
    compile_guard.release_if_crowded()
    names = problem.names if names is None else _check_names(names)
    extra = [n for n in names if n not in problem.names]
    if extra:
        raise ValueError(f"{', '.join(extra)} not among the problem's parameters {', '.join(problem.names)}")
    _check_values(problem.names, params0)
    t = _check_target(target)
    if scale is None:
        s = np.where(np.abs(t) > 0, np.abs(t), 1.0)
    else:
        s = np.broadcast_to(np.asarray(scale, np.float64), t.shape)
        if not np.all(np.isfinite(s) & (s > 0)):
            raise ValueError(f"scale must be finite and > 0; got {scale}")
    cols = [problem.names.index(n) for n in names]
    z_all = to_z(problem.names, params0)
    opt = optax.with_extra_args_support(optimizer or optax.adam(0.1))
    z = jnp.asarray(z_all[cols])
    state = opt.init(z)

    history, converged, prev = [], False, None
    best = (np.inf, z_all)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=iterations, desc="fit", unit="it")
    t0 = time.perf_counter()
    try:
        for it in range(iterations):
            z_all = z_all.copy()
            z_all[cols] = np.asarray(z)
            try:
                ev = problem(z_all, params0)
            except FitFailed as e:
                raise FitFailed(e.step, e.reason, it, int(e.code)) from e
            if ev.y.shape != t.shape:
                raise ValueError(f"measure gives {ev.y.size} values; the target has {t.size}")
            r = (ev.y - t) / s
            Jr = ev.J[:, cols] / s[:, None]
            loss = float(r @ r)
            g = 2.0 * Jr.T @ r
            p = from_z(problem.names, z_all, params0)
            history.append(FitIterate(iteration=it, loss=loss, grad_norm=float(np.linalg.norm(g)),
                                      wall_s=time.perf_counter() - t0,
                                      params={n: float(getattr(p, n)) for n in names}))
            if loss < best[0]:
                best = (loss, z_all)
            if bar:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3e}", **{n: f"{v:.4g}" for n, v in history[-1].params.items()},
                                step="-" if prev is None else f"{np.max(np.abs(np.asarray(z) - z_prev)):.3g}")
            if loss < loss_tol or (prev is not None and rel_tol > 0 and abs(prev - loss) <= rel_tol * prev):
                converged = True
                break
            if not np.all(np.isfinite(g)):
                raise FitFailed(-1, "non-finite gradient", it)
            upd, state = opt.update(jnp.asarray(g), state, z, value=jnp.asarray(loss), jacobian=jnp.asarray(Jr))
            z_prev = np.asarray(z)
            z = optax.apply_updates(z, upd)
            prev = loss
    finally:
        if bar:
            bar.close()
    return FitResult(from_z(names, best[1][cols], params0), history, converged)


def plot_history(result: FitResult, path: str):
    """Plot loss and each fitted parameter per iteration to a PNG (needs matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = result.history
    names = list(h[0].params) if h else []
    fig, axes = plt.subplots(1 + len(names), 1, figsize=(6, 2.2 * (1 + len(names))), sharex=True)
    axes = np.atleast_1d(axes)
    it = [r.iteration for r in h]
    axes[0].semilogy(it, [r.loss for r in h]); axes[0].set_ylabel("loss")
    for ax, n in zip(axes[1:], names):
        ax.plot(it, [r.params[n] for r in h]); ax.set_ylabel(n)
    axes[-1].set_xlabel("iteration")
    fig.tight_layout(); fig.savefig(path); plt.close(fig)

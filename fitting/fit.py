"""Fit material parameters to measurements of simulated trajectories with optax.

The loop differentiates a rollout with the implicit VJP (``ipcjax.implicit``), works on
log-parameters so positive quantities stay positive, records every iteration (loss,
parameters, gradient norm, wall time) and stops early when the loss or its relative
change is small. A failed step inside a rollout stops the fit with the step index and the
reason; parameters never become NaN.
"""
from __future__ import annotations

import json
import math
import time
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ipcjax.model import Params
from ipcjax.result import StepCode

POSITIVE = ("youngs_modulus", "thickness", "bending_scale", "friction", "barrier_stiffness", "drag")
FITTABLE = POSITIVE + ("poisson",)


class FitFailed(RuntimeError):
    """A rollout step failed during the fit (``step`` and ``reason`` say where and why)."""

    def __init__(self, step: int, reason: str, iteration: int):
        super().__init__(f"fit iteration {iteration}: rollout step {step} failed: {reason}")
        self.step, self.reason, self.iteration = step, reason, iteration


class FitResult(NamedTuple):
    params: Params
    history: list
    converged: bool

    def to_json(self, path):
        """Write the fitted values and the per-iteration history as JSON."""
        with open(path, "w") as f:
            json.dump(dict(params={k: np.asarray(v).tolist() for k, v in self.params._asdict().items()},
                           history=self.history, converged=self.converged), f, indent=2)


def _check(names, params0: Params, target):
    if not names:
        raise ValueError("nothing to fit: give at least one parameter name")
    for n in names:
        if n not in FITTABLE:
            raise ValueError(f"cannot fit {n!r}; fittable parameters are {', '.join(FITTABLE)}")
        v = np.asarray(getattr(params0, n))
        if v.shape != () or not np.isfinite(v):
            raise ValueError(f"initial {n} must be a finite scalar; got {v}")
        if n in POSITIVE and v <= 0:
            raise ValueError(f"initial {n} must be > 0 (it is fitted in log space); got {float(v)}")
        if n == "poisson" and not 0 < v < 0.5:
            raise ValueError(f"initial poisson must lie in (0, 0.5); got {float(v)}")
    t = np.asarray(target, dtype=np.float64)
    if not np.all(np.isfinite(t)):
        raise ValueError(f"targets must be finite; got {t}")
    return jnp.asarray(t)


def _to_z(names, p: Params):
    z = []
    for n in names:
        v = float(getattr(p, n))
        z.append(math.log(v) if n in POSITIVE else math.log(v / (0.5 - v)))  # logit-like for ν
    return jnp.asarray(z)


def _from_z(names, z, p0: Params) -> Params:
    upd = {}
    for i, n in enumerate(names):
        upd[n] = jnp.exp(z[i]) if n in POSITIVE else 0.5 * jax.nn.sigmoid(z[i])
    return p0._replace(**upd)


def fit(rollout: Callable, measure: Callable, target, params0: Params, names: Sequence[str], *,
        optimizer: optax.GradientTransformation | None = None, iterations: int = 60,
        loss_tol: float = 1e-10, rel_tol: float = 0.0, scale=None, progress: bool = True) -> FitResult:
    """Fit ``names`` of ``params0`` so that ``measure(trajectory)`` matches ``target``.

    Args:
        rollout: ``params -> (frames, codes)``, differentiable (e.g. from make_rollout).
        measure: ``frames -> measurements`` (any shape, same as target), differentiable.
        target: measured values (any units; compared after division by ``scale``).
        names: parameter names (see FITTABLE); fitted in log space (ν in a logistic map).
        optimizer: an optax transformation on the log-parameters (default adam(0.1)).
        iterations: maximum iterations; loss_tol / rel_tol: early stopping.
        scale: per-measurement scale for the residuals (default |target| or 1).
    Returns:
        FitResult with the fitted Params, a history of dicts (iteration, loss, params,
        grad_norm, wall_s) and whether it stopped early on a tolerance.
    Raises:
        ValueError: bad names, non-finite or non-positive initial values, bad targets.
        FitFailed: a rollout step failed (with its index and reason).
    """
    names = tuple(names)
    target = _check(names, params0, target)
    scale = jnp.where(jnp.abs(target) > 0, jnp.abs(target), 1.0) if scale is None else jnp.asarray(scale)
    opt = optimizer or optax.adam(0.1)

    def loss_fn(z):
        frames, codes = rollout(_from_z(names, z, params0))
        r = (measure(frames) - target) / scale
        return jnp.sum(r * r), codes

    vg = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
    z = _to_z(names, params0)
    state = opt.init(z)
    history, converged, prev = [], False, None
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=iterations, desc="fit", unit="it")
    t0 = time.perf_counter()
    for it in range(iterations):
        (loss, codes), g = vg(z)
        codes = np.asarray(codes)
        bad = np.flatnonzero(codes)
        if bad.size:
            if bar:
                bar.close()
            raise FitFailed(int(bad[0]), StepCode.describe(int(codes[bad[0]])), it)
        loss = float(loss)
        p = _from_z(names, z, params0)
        history.append(dict(iteration=it, loss=loss, grad_norm=float(jnp.linalg.norm(g)),
                            wall_s=time.perf_counter() - t0, params={n: float(getattr(p, n)) for n in names}))
        if bar:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3e}")
        if loss < loss_tol or (prev is not None and rel_tol > 0 and abs(prev - loss) <= rel_tol * prev):
            converged = True
            break
        if not np.all(np.isfinite(np.asarray(g))):
            raise FitFailed(-1, "non-finite gradient", it)
        upd, state = opt.update(g, state, z)
        z = optax.apply_updates(z, upd)
        prev = loss
    if bar:
        bar.close()
    return FitResult(_from_z(names, z, params0), history, converged)


class QuasiNewtonState(NamedTuple):
    z_prev: jnp.ndarray
    g_prev: jnp.ndarray
    inverse_hessian: jnp.ndarray
    started: jnp.ndarray


def gauss_newton_bfgs(jacobian, damping: float = 1e-10) -> optax.GradientTransformation:
    """Quasi-Newton steps on a least-squares loss Σ rᵢ², as an optax transformation.

    The first step is Gauss–Newton, Δz = −(2 (JᵀJ + λI))⁻¹ g with the residual Jacobian J
    (m × p) at the start and λ = damping · max diag(JᵀJ); afterwards the inverse Hessian is
    updated by BFGS from the gradients the loop computes anyway (s = Δz, y = Δg; an update
    with sᵀy ≤ 0 is skipped). So the curvature follows the loss as the parameters move,
    while the start needs only one Jacobian. Chain with ``optax.clip`` to bound the steps.
    """
    J = jnp.asarray(jacobian, jnp.float64)
    A = J.T @ J
    A = A + damping * jnp.max(jnp.diag(A)) * jnp.eye(A.shape[0])
    H0 = 0.5 * jnp.linalg.inv(A)

    def init(params):
        z = jnp.zeros_like(jnp.asarray(params, jnp.float64))
        return QuasiNewtonState(z, z, H0, jnp.asarray(False))

    def update(g, state, params=None):
        if params is None:
            raise ValueError("gauss_newton_bfgs needs the current parameters in update()")
        g = jnp.asarray(g, jnp.float64)
        z = jnp.asarray(params, jnp.float64)
        H = state.inverse_hessian
        if bool(state.started):
            s, y = z - state.z_prev, g - state.g_prev
            sy = float(s @ y)
            if sy > 1e-12 * float(jnp.linalg.norm(s) * jnp.linalg.norm(y)) and sy > 0:
                rho = 1.0 / sy
                I = jnp.eye(len(z))
                H = (I - rho * jnp.outer(s, y)) @ H @ (I - rho * jnp.outer(y, s)) + rho * jnp.outer(s, s)
        return -H @ g, QuasiNewtonState(z, g, H, jnp.asarray(True))

    return optax.GradientTransformation(init, update)


def plot_history(result: FitResult, path: str):
    """Plot loss and each fitted parameter per iteration to a PNG (needs matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = result.history
    names = list(h[0]["params"]) if h else []
    fig, axes = plt.subplots(1 + len(names), 1, figsize=(6, 2.2 * (1 + len(names))), sharex=True)
    axes = np.atleast_1d(axes)
    it = [r["iteration"] for r in h]
    axes[0].semilogy(it, [r["loss"] for r in h]); axes[0].set_ylabel("loss")
    for ax, n in zip(axes[1:], names):
        ax.plot(it, [r["params"][n] for r in h]); ax.set_ylabel(n)
    axes[-1].set_xlabel("iteration")
    fig.tight_layout(); fig.savefig(path); plt.close(fig)

"""Shared numerical helpers for the test-suite: central differences, the Taylor-remainder
test (docs/differentiation.md, "Checking a derivative") and tree comparison."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


def central_gradient(f, x, h=1e-6):
    """Central-difference gradient of scalar ``f`` at ``x`` (any shape), in float64."""
    x = np.asarray(x, dtype=np.float64)
    g = np.zeros_like(x)
    flat = x.reshape(-1)
    gf = g.reshape(-1)
    for i in range(flat.size):
        xp = flat.copy(); xp[i] += h
        xm = flat.copy(); xm[i] -= h
        gf[i] = (float(f(xp.reshape(x.shape))) - float(f(xm.reshape(x.shape)))) / (2 * h)
    return g


def central_jacobian(f, x, h=1e-6):
    """Central-difference Jacobian of array-valued ``f``: shape f(x).shape + x.shape."""
    x = np.asarray(x, dtype=np.float64)
    f0 = np.asarray(f(x))
    J = np.zeros(f0.shape + (x.size,))
    flat = x.reshape(-1)
    for i in range(flat.size):
        xp = flat.copy(); xp[i] += h
        xm = flat.copy(); xm[i] -= h
        J[..., i] = (np.asarray(f(xp.reshape(x.shape))) - np.asarray(f(xm.reshape(x.shape)))) / (2 * h)
    return J.reshape(f0.shape + x.shape)


def central_hessian(f, x, h=1e-5):
    """Central-difference Hessian of scalar ``f`` from differences of its autodiff gradient.

    Returned flattened: (x.size, x.size).
    """
    g = jax.grad(f)
    x = np.asarray(x, dtype=np.float64)
    J = central_jacobian(lambda z: np.asarray(g(jnp.asarray(z))).reshape(-1), x, h)
    return J.reshape(x.size, x.size)


def fp32_ulp(x):
    """The FP32 spacing at the largest |entry| of x: one step of the stored precision (m for
    positions). A batched program may round differently from its single twin by that much
    (docs/usage.md, "Ensembles in lockstep")."""
    return float(np.spacing(np.float32(np.abs(np.asarray(x)).max())))


def rel_err(a, b):
    """max|a-b| / max(max|b|, tiny): the relative error used throughout the tests."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def tree_allclose(a, b, rtol=1e-10, atol=0.0):
    """True when every leaf of two pytrees agrees to the given tolerance."""
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    if len(la) != len(lb):
        return False
    return all(np.allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol) for x, y in zip(la, lb))


def assert_nonzero(g, what="gradient"):
    """Derivative tests must fail when the derivative vanishes identically."""
    g = np.asarray(g)
    assert np.all(np.isfinite(g)), f"{what} has non-finite entries"
    assert np.max(np.abs(g)) > 0.0, f"{what} is identically zero"


# --------------------------------------------------------------------------- Taylor test

class TaylorResult(NamedTuple):
    """What :func:`taylor_test` measured.

    ``h`` the steps, ``r`` the remainders, ``slopes[k]`` the local log-log slope between
    ``h[k]`` and ``h[k+1]``; ``window`` = (i, j), the steps h[j] … h[i] judged in (None when
    none qualified); ``slope`` the least-squares slope of log r against log h over it;
    ``error_bound`` = r[j] / |h[j]·dfd|, the remainder against the first-order term at the
    window's smallest step (the first-order term's relative error is below it)."""

    h: np.ndarray
    r: np.ndarray
    slopes: np.ndarray
    window: tuple | None
    slope: float
    error_bound: float

    def __str__(self):
        rows = " ".join(f"{s:.2f}" for s in self.slopes)
        if self.window is None:
            return f"Taylor test: no window of order 2 (local slopes {rows}; h {self.h[0]:.1e} … {self.h[-1]:.1e})"
        i, j = self.window
        return (f"Taylor test: slope {self.slope:.2f} over h = {self.h[j]:.2e} … {self.h[i]:.2e} "
                f"({np.log10(self.h[i] / self.h[j]):.1f} decades); remainder / first-order term at the "
                f"smallest h {self.error_bound:.1e}; local slopes {rows}")


def taylor_test(f, dfd, h0, *, n=12, ratio=2.0, f0=None, slope_tol=0.25, linear_frac=0.1, decades=1.0,
                rtol=1e-2):
    """Taylor-remainder check of a directional derivative (dolfin-adjoint's ``taylor_test``).

    For a scalar ``f(s) = L(x + s·d)`` and the claimed ``dfd = ∇L(x)·d``, the remainder
    r(h) = |f(h) − f(0) − h·dfd| falls as h² when dfd is right, and only as h once h is small
    enough that a wrong dfd's error e·h exceeds the curvature term. Steps h = h0·ratio^{-k},
    k = 0 … n−1. The verdict is a property of the convergence, not of one step: there must be
    a window of consecutive steps spanning at least ``decades`` decades in which

    * the expansion holds: r ≤ ``linear_frac``·|h·dfd| at the window's largest step (so a
      wrong dfd cannot hide under a curvature term that dominates at large h);
    * every local slope lies between 1 and 3: r falls faster than first order, and no faster
      than a cancellation against noise or a kink would make it;
    * the least-squares slope of log r against log h is 2 ± ``slope_tol``.

    Above such a window the steps may cross a branch of a piecewise function or leave the
    asymptotic range; below it the remainder reaches f's noise floor (a solver's tolerance,
    round-off), where it stops falling. Neither decides the verdict, so it does not hang on
    a step picked on one machine. Of the qualifying windows the longest is taken (ties: the
    one reaching the smallest step), and its ``error_bound`` must be ≤ ``rtol``.

    Returns a :class:`TaylorResult`; raises AssertionError, with the table, on failure.
    """
    f0 = float(f(0.0)) if f0 is None else float(f0)
    dfd = float(dfd)
    assert np.isfinite(dfd) and dfd != 0.0, f"the directional derivative is {dfd}: nothing to check"
    h = h0 * ratio ** -np.arange(n, dtype=np.float64)
    r = np.array([abs(float(f(s)) - f0 - s * dfd) for s in h])
    assert np.all(np.isfinite(r)), f"non-finite remainder: {r}"
    with np.errstate(divide="ignore", invalid="ignore"):
        logr = np.log(r)
        slopes = (logr[:-1] - logr[1:]) / np.log(ratio)
    need = int(np.ceil(decades * np.log(10.0) / np.log(ratio) - 1e-9))   # intervals spanning `decades`
    best, best_slope = None, float("nan")
    for i in range(n - need):
        if not r[i] <= linear_frac * abs(h[i] * dfd):
            continue
        j = i
        while j < n - 1 and 1.0 < slopes[j] < 3.0:
            j += 1
        for jj in range(j, i + need - 1, -1):       # the longest qualifying window from i
            fit = np.polyfit(np.log(h[i:jj + 1]), logr[i:jj + 1], 1)[0]
            if abs(fit - 2.0) <= slope_tol:
                if best is None or (jj - i, jj) > (best[1] - best[0], best[1]):
                    best, best_slope = (i, jj), float(fit)
                break
    bound = float(r[best[1]] / abs(h[best[1]] * dfd)) if best else float("nan")
    res = TaylorResult(h, r, slopes, best, best_slope, bound)
    assert best is not None and bound <= rtol, str(res)
    return res

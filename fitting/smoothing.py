"""The bag fit's smoothing: cubic B-spline weights on a lattice in log-parameter space, and
the smoothed measurements and Jacobian of the runs at its points (the method:
fitting/bag_rest.py's docstring, item 2)."""
from __future__ import annotations

import math

import numpy as np

from fitting.rest_derivative import BAG_NAMES, PATH_ONLY

#: The smoothed Jacobian's estimators (BagRestProblem, lattice_smooth).
ESTIMATORS = ("spline", "rest")
#: Default lattice step h in log-parameter space: 2 ln 2 / 7 ≈ 0.198 (neighbouring nodes a
#: factor 2^(2/7) ≈ 1.22 apart), every second point of benchmarks/bag_sweep.py's grid
#: 2^(k/7), whose runs are then nodes. At one grid step the smoothed loss against synthetic
#: targets has a second minimum near E × 0.74 (docs/differentiation.md).
DEFAULT_STEP = 2 * math.log(2.0) / 7


def bspline3(u):
    """The cubic B-spline N(u) of unit knot spacing, centred at 0 (u in lattice steps):

        N(u) = 2/3 − u² + |u|³/2      for |u| < 1,
               (2 − |u|)³/6           for 1 ≤ |u| < 2,
               0                      beyond.

    Non-negative, C² in u, and on the integer lattice a partition of unity that reproduces
    straight lines: Σⱼ N(u − j) = 1 and Σⱼ j N(u − j) = u for every u (de Boor, "A
    Practical Guide to Splines", 2001, ch. IX and XI).
    """
    a = np.abs(np.asarray(u, np.float64))
    return np.where(a < 1, 2.0 / 3.0 - a**2 + 0.5 * a**3, np.where(a < 2, (2.0 - a) ** 3 / 6.0, 0.0))


def bspline3_derivative(u):
    """dN/du of :func:`bspline3`: −2u + 3u|u|/2 for |u| < 1, −sign(u)(2 − |u|)²/2 for
    1 ≤ |u| < 2, 0 beyond (continuous, as N is C²)."""
    u = np.asarray(u, np.float64)
    a = np.abs(u)
    return np.where(a < 1, -2.0 * u + 1.5 * u * a, np.where(a < 2, -np.sign(u) * 0.5 * (2.0 - a) ** 2, 0.0))


def lattice_support(u) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lattice points of non-zero weight at the point u (d,) in lattice steps.

    Returns (index (n, d) int, w (n,), dw (n, d)): the tensor-product weights
    w_j = Πᵢ N(uᵢ − jᵢ) (:func:`bspline3`; at most 4^d points, 3^d where u lies on the
    lattice) and their gradients ∂w_j/∂u. Σ w = 1.
    """
    import itertools

    u = np.asarray(u, np.float64).reshape(-1)
    axes = []
    for ui in u:
        base = math.floor(ui)
        js = [j for j in range(base - 1, base + 3) if bspline3(ui - j) > 0]
        axes.append([(j, float(bspline3(ui - j)), float(bspline3_derivative(ui - j))) for j in js])
    index, w, dw = [], [], []
    for combo in itertools.product(*axes):
        index.append([c[0] for c in combo])
        vals = [c[1] for c in combo]
        w.append(math.prod(vals))
        dw.append([c[2] * math.prod(vals[:i] + vals[i + 1:]) for i, c in enumerate(combo)])
    return np.asarray(index, np.int64), np.asarray(w), np.asarray(dw)


def lattice_smooth(Y, w, dw, names, step, *, J_rest=None, estimator="spline"):
    """ȳ (m,) = Σ_j w_j y_j and J̄ (m, len(names)): per column the derivative of ȳ,
    Σ_j y_j ∂w_j/∂zᵢ = Σ_j y_j (∂w_j/∂uᵢ)/h, or (``estimator="rest"``) the weighted mean
    Σ_j w_j ∂y_j/∂zᵢ of the nodes' rest-state derivatives, except for PATH_ONLY parameters.

    Args:
        Y: (n, m) the measurements y_j of the n lattice points of ``w``, one row each.
        w: (n,) their weights; dw: (n, len(names)) their gradients in lattice steps
            (:func:`lattice_support`).
        names: the parameters of the columns of J̄ (of BAG_NAMES); ``step`` = h.
        J_rest: (n, m, len(BAG_NAMES)) the nodes' rest-state derivatives ∂y_j/∂z over
            BAG_NAMES, in the rows' order; only the "rest" estimator reads them (and needs them).
    """
    Y = np.asarray(Y)                                            # (n, m)
    w, dw = np.asarray(w), np.asarray(dw).reshape(Y.shape[0], len(names))
    if estimator == "rest" and J_rest is None:
        raise ValueError('the "rest" estimator averages the nodes\' rest-state derivatives: pass J_rest')
    y = w @ Y
    J = np.zeros((Y.shape[1], len(names)))
    for i, n in enumerate(names):
        if estimator == "spline" or n in PATH_ONLY:
            J[:, i] = dw[:, i] @ Y / step
        else:
            J[:, i] = w @ np.ascontiguousarray(np.asarray(J_rest)[:, :, BAG_NAMES.index(n)])   # (n, m)
    return y, J


def effective_runs(w) -> float:
    """1/Σ w²: the number of equally weighted independent runs whose mean has the variance
    of Σ w_j y_j (in 1-D 2.0 on a lattice point, 2.17 half-way between two)."""
    w = np.asarray(w, np.float64)
    return float(1.0 / np.sum(w**2))

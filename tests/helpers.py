"""Shared numerical helpers for the test-suite: central differences and tree comparison."""
from __future__ import annotations

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

"""The bag's shape measurements (docs/spec.md §5), written once for NumPy and JAX.

Each function takes one frame x (N, 3) or a stack of frames (..., N, 3) and works in the
array module of its input: NumPy arrays give NumPy results (the run summaries, plots and
comparisons), JAX arrays and tracers give ``jnp`` results (the differentiable fit
measurements of ``scenes.pouch`` and ``fitting``), by the same expressions.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def _xp(x):
    return np if isinstance(x, np.ndarray) else jnp


def neck_width(x, neck):
    """(..., 2) (wx, wy), m: max − min of x and of y over the neck-ring points ``neck``."""
    xp = _xp(x)
    p = x[..., xp.asarray(neck), :2]
    return xp.max(p, axis=-2) - xp.min(p, axis=-2)


def flap_height(x, rim, neck):
    """(...) m: median z of the rim points minus mean z of the neck-ring points."""
    xp = _xp(x)
    return xp.median(x[..., xp.asarray(rim), 2], axis=-1) - xp.mean(x[..., xp.asarray(neck), 2], axis=-1)


def shape(x, neck, rim):
    """(..., 3) (neck width x, neck width y, flap height), m: the fits' measurement vector."""
    xp = _xp(x)
    return xp.concatenate([neck_width(x, neck), flap_height(x, rim, neck)[..., None]], axis=-1)

"""Shared timing helpers for the benchmark scripts."""
import time

import jax
import numpy as np


def _times(fn, repeat):
    """Wall seconds of ``repeat`` runs of ``fn()``, after one compile-and-warm call."""
    jax.block_until_ready(fn())
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    return ts


def median_time(fn, repeat):
    """Median wall seconds of ``fn()`` over ``repeat`` runs, after one compile-and-warm call."""
    return float(np.median(_times(fn, repeat)))


def best_time(fn, repeat):
    """Least wall seconds of ``fn()`` over ``repeat`` runs, after one compile-and-warm call:
    on a shared machine, what a call takes when nothing else holds the core."""
    return float(np.min(_times(fn, repeat)))

"""Shared timing helper for the benchmark scripts."""
import time

import jax
import numpy as np


def median_time(fn, repeat):
    """Median wall seconds of ``fn()`` over ``repeat`` runs, after one compile-and-warm call."""
    jax.block_until_ready(fn())
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))

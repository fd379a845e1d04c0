"""Sparse direct solve of H u = b from the element blocks: LDLᵀ on the host, reached from ``jit``.

``config.linear_solver = "sparse"`` selects it, as :class:`ipcjax.linear_solvers.SparseLDL`,
the object the Newton direction and the implicit VJP both call. The film's Hessian is
sparse — a few per cent of its entries are non-zero (docs/benchmarks.md) — so its
factorization costs a fraction of the dense Cholesky, and no (3F)² matrix is ever formed.

Inside the traced computation, :func:`sparse_solve` is one ``jax.pure_callback``; the
host function

1. turns the element blocks (:class:`ipcjax.potential.HessianBlocks`) into the upper
   triangle of H in coordinate form, dropping the rows of fixed particles and the exact
   zeros of unused (padded) contact rows, and sums duplicates into a CSC matrix
   (``scipy.sparse``);
2. factorizes it as P H Pᵀ = L D Lᵀ with QDLDL (``qdldl``: approximate-minimum-degree
   ordering P, no pivoting) and solves.

Without pivoting, the pivots D are those of a Cholesky factorization squared into the
diagonal, so H is positive definite exactly when every D > 0. With ``require_pd`` (the
Newton direction and the projected implicit solve) a pivot ≤ 0 is a failure, like a
failed Cholesky; otherwise (the exact implicit Hessian, which may be indefinite away from
a minimiser) only a zero or non-finite pivot is. A failure returns NaNs and False: the
Newton loop reports it as ``FACTORIZATION_FAILED`` and the backward pass as a NaN
cotangent, never a silently wrong answer.

The callback has no derivative rule and needs none: the Newton solve is differentiated
by the implicit-function VJP (:mod:`ipcjax.implicit`), whose backward solve calls this
same function. Under ``vmap`` it runs once per batch member.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ipcjax.potential import HessianBlocks


def upper_triangle(diag, rows, blocks):
    """Host: (r, c, v) of H's upper triangle in coordinate form (duplicates not yet summed).

    ``diag`` (n,), ``rows`` per group (E, 3k) with fixed-particle rows ≥ n, ``blocks`` per
    group (E, 3k, 3k). Entries that are exactly zero are dropped (padded contact rows);
    the diagonal is always present.
    """
    n = diag.shape[0]
    rs, cs, vs = [np.arange(n)], [np.arange(n)], [np.asarray(diag)]
    for r, B in zip(rows, blocks):
        r, B = np.asarray(r), np.asarray(B)
        if r.shape[0] == 0:
            continue
        # most contact rows are padding (zero blocks): one pass finds the others
        used = np.flatnonzero(B.reshape(B.shape[0], -1).any(axis=1))
        if used.shape[0] < r.shape[0]:
            r, B = r[used], B[used]
        rr = np.broadcast_to(r[:, :, None], B.shape)
        cc = np.broadcast_to(r[:, None, :], B.shape)
        keep = (rr <= cc) & (cc < n) & (B != 0)
        rs.append(rr[keep])
        cs.append(cc[keep])
        vs.append(B[keep])
    return np.concatenate(rs), np.concatenate(cs), np.concatenate(vs)


def host_solve(diag, rows, blocks, rhs, require_pd=True):
    """Host: (u, ok) for H u = rhs by sparse LDLᵀ; u is NaN where ok is False."""
    import qdldl
    import scipy.sparse as sp

    n = diag.shape[0]
    rhs = np.asarray(rhs, np.float64)
    fail = np.full(rhs.shape, np.nan), np.bool_(False)
    r, c, v = upper_triangle(diag, rows, blocks)
    if not (np.all(np.isfinite(v)) and np.all(np.isfinite(rhs))):
        return fail
    U = sp.csc_matrix((v.astype(np.float64), (r, c)), shape=(n, n))
    try:
        solver = qdldl.Solver(U, upper=True)
    except (ValueError, RuntimeError):  # a zero pivot
        return fail
    D = solver.factors()[1]
    good = np.all(np.isfinite(D)) & (np.all(D > 0) if require_pd else np.all(D != 0))
    if not good:
        return fail
    u = solver.solve(rhs)
    if not np.all(np.isfinite(u)):
        return fail
    return u, np.bool_(True)


def sparse_solve(hb: HessianBlocks, rhs, require_pd: bool = True):
    """u = H⁻¹ rhs over the free DOFs by host sparse LDLᵀ; returns (u, ok).

    Traceable (``jax.pure_callback``); ``u`` is NaN where ``ok`` is False (see the module
    docstring for what counts as a failure).
    """
    out = (jax.ShapeDtypeStruct(rhs.shape, jnp.float64), jax.ShapeDtypeStruct((), jnp.bool_))
    return jax.pure_callback(lambda d, r, b, y: host_solve(d, r, b, y, require_pd), out,
                             hb.diag, hb.rows, hb.blocks, rhs, vmap_method="sequential")


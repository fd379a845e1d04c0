"""Sparse direct solve of H u = b from the element blocks, on the host, reached from ``jit``.

``config.linear_solver = "sparse"`` selects the sparse path, as
:class:`ipcjax.linear_solvers.SparseLDL`, the object the Newton direction and the implicit
VJP both call. The film's Hessian is sparse — a few per cent of its entries are non-zero
(docs/benchmarks.md) — so its factorization costs a fraction of the dense Cholesky, and
no (3F)² matrix is ever formed. Where H must be positive definite, the solve runs inside
XLA as a custom call (:mod:`ipcjax.cholmod_ffi`); this module is the host path: the exact
implicit Hessian's LDLᵀ always, and the positive definite solves where the custom call
is not available (no C compiler, ``IPCJAX_NATIVE=0``).

Inside the traced computation, :func:`sparse_solve` is one ``jax.pure_callback``; the
host function

1. turns the element blocks (:class:`ipcjax.potential.HessianBlocks`) into the upper
   triangle of H as a CSC matrix (``scipy.sparse``), rows of fixed particles dropped
   (:func:`upper_csc`): the diagonal and the model's own groups (membrane and bending,
   whose rows never change for a model) through a scatter map into a CSC pattern that is
   built once per set of rows and kept (:class:`StaticPattern`); the other groups
   (contacts, friction, supports, ties) in coordinate form without the exact zeros of
   unused (padded) contact rows, duplicates summed, added to it;
2. where H must be positive definite (the Newton direction, the projected implicit
   solve), factorizes it as P H Pᵀ = L Lᵀ with CHOLMOD's supernodal Cholesky
   (``cvxopt.cholmod``), whose symbolic analysis (AMD ordering P, supernodes) is kept
   per pattern: within a step the pattern repeats until a stencil enters or leaves d̂
   (:func:`cholmod_solve`); a factorization that fails is retried by QDLDL's LDLᵀ,
   which names why (below);
3. otherwise (the exact implicit Hessian, which may be indefinite away from a
   minimiser) factorizes it as P H Pᵀ = L D Lᵀ with QDLDL (``qdldl``: AMD ordering, no
   pivoting), and solves.

Without pivoting, QDLDL's pivots D are those of a Cholesky factorization squared into
the diagonal, so H is positive definite exactly when every D > 0: a zero pivot is
SINGULAR, a negative one NOT_POSITIVE_DEFINITE where the solve needs H > 0; without that
requirement only a zero or non-finite pivot is a failure. A failure returns NaNs and its
:class:`~ipcjax.result.LinearStatus` (non-finite input, singular, not positive
definite): the Newton loop reports it as ``FACTORIZATION_FAILED`` and the backward pass
raises ``BackwardFailed`` naming it, never a silently wrong answer.

The callback has no derivative rule and needs none: the Newton solve is differentiated
by the implicit-function VJP (:mod:`ipcjax.implicit`), whose backward solve calls this
same function. Under ``vmap`` it runs once per batch member.
"""
from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from ipcjax.potential import HessianBlocks
from ipcjax.result import LinearStatus


def _upper_coo(n, rows, blocks, *, drop_zeros=True):
    """Host: (r, c, v) of the element blocks' upper-triangle entries inside the n free
    DOFs, in coordinate form, duplicates not summed; padded (all-zero) element rows left
    out, and with ``drop_zeros`` every exactly-zero entry."""
    rs, cs, vs = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
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
        keep = (rr <= cc) & (cc < n)
        if drop_zeros:
            keep &= B != 0
        rs.append(rr[keep])
        cs.append(cc[keep])
        vs.append(B[keep])
    return np.concatenate(rs), np.concatenate(cs), np.concatenate(vs)


def upper_triangle(diag, rows, blocks):
    """Host: (r, c, v) of H's upper triangle in coordinate form (duplicates not yet summed).

    ``diag`` (n,), ``rows`` per group (E, 3k) with fixed-particle rows ≥ n, ``blocks`` per
    group (E, 3k, 3k). Entries that are exactly zero are dropped (padded contact rows);
    the diagonal is always present.
    """
    n = diag.shape[0]
    r, c, v = _upper_coo(n, rows, blocks)
    return (np.concatenate([np.arange(n), r]), np.concatenate([np.arange(n), c]),
            np.concatenate([np.asarray(diag), v]))


#: Element groups of :class:`~ipcjax.potential.HessianBlocks`, counted from the first,
#: that go through a kept :class:`StaticPattern`: membrane and bending, whose rows are the
#: model's and the same in every solve. Which groups they are only decides the speed; the
#: pattern is keyed on the rows themselves, so any rows give the right matrix.
STATIC_GROUPS = 2

#: Patterns kept (a fit or a notebook may step a few models in one process).
_PATTERN_CACHE_SIZE = 8
_PATTERNS: dict = {}


class StaticPattern:
    """The upper triangle of diag(n) + Σ Pᵀ B P over fixed element rows as a CSC pattern.

    Built once for a set of rows (an ``np.unique`` over their coordinates); afterwards a
    matrix with new values is one gather of each block's upper-triangle entries and one
    ``np.bincount`` into the pattern's data — no sort. Structural entries are kept when
    their value is zero.
    """

    def __init__(self, n, rows):
        rs, cs = [np.arange(n)], [np.arange(n)]
        self.take = []  # per group: flat indices of the kept entries of its (E, 3k, 3k) blocks
        for r in rows:
            r = np.asarray(r)
            E, k = r.shape
            rr = np.broadcast_to(r[:, :, None], (E, k, k)).reshape(-1)
            cc = np.broadcast_to(r[:, None, :], (E, k, k)).reshape(-1)
            keep = np.flatnonzero((rr <= cc) & (cc < n))
            self.take.append(keep)
            rs.append(rr[keep])
            cs.append(cc[keep])
        key = np.concatenate(cs).astype(np.int64) * n + np.concatenate(rs)
        uniq, where = np.unique(key, return_inverse=True)
        self.n, self.nnz = n, uniq.shape[0]
        self.indices = (uniq % n).astype(np.int32)
        self.indptr = np.searchsorted(uniq // n, np.arange(n + 1)).astype(np.int32)
        self.diag_at = where[:n]
        self.block_at = where[n:]

    def matrix(self, diag, blocks):
        """The CSC matrix (scipy) with these values (``blocks`` of the same rows)."""
        import scipy.sparse as sp

        vals = [np.asarray(B).reshape(-1)[t] for B, t in zip(blocks, self.take)]
        data = (np.bincount(self.block_at, weights=np.concatenate(vals), minlength=self.nnz) if vals
                else np.zeros(self.nnz))
        data[self.diag_at] += np.asarray(diag, np.float64)
        return sp.csc_matrix((data, self.indices, self.indptr), shape=(self.n, self.n))


def static_pattern(n, rows):
    """The kept :class:`StaticPattern` of these rows, built on first use."""
    h = hashlib.blake2b(digest_size=16)
    for r in rows:
        r = np.ascontiguousarray(r)
        h.update(repr((r.shape, r.dtype.str)).encode())
        h.update(r.tobytes())
    key = (n, h.digest())
    pat = _PATTERNS.get(key)
    if pat is None:
        if len(_PATTERNS) >= _PATTERN_CACHE_SIZE:
            _PATTERNS.pop(next(iter(_PATTERNS)))
        pat = _PATTERNS[key] = StaticPattern(n, rows)
    return pat


def upper_csc(diag, rows, blocks):
    """Host: H's upper triangle as a scipy CSC matrix with sorted indices, duplicates summed.

    The diagonal and the first :data:`STATIC_GROUPS` groups through their kept
    :class:`StaticPattern`, the rest through coordinate form (padded rows and exact zeros
    left out); the two added.
    """
    import scipy.sparse as sp

    n = diag.shape[0]
    k = min(STATIC_GROUPS, len(rows))
    U = static_pattern(n, rows[:k]).matrix(diag, blocks[:k])
    r, c, v = _upper_coo(n, rows[k:], blocks[k:])
    if v.shape[0]:
        U = U + sp.csc_matrix((v.astype(np.float64), (r, c)), shape=(n, n))
    U.sort_indices()
    return U


#: Symbolic analyses (ordering, supernodes) kept, keyed on the CSC pattern: within a step
#: the pattern repeats while no stencil enters or leaves d̂ and the friction set is frozen.
_ANALYSIS_CACHE_SIZE = 4
_ANALYSES: dict = {}


def _pattern_key(U):
    return U.shape[0], hashlib.blake2b(U.indptr.tobytes() + U.indices.tobytes(), digest_size=16).digest()


def _analysis(U):
    """(CHOLMOD's symbolic factor, row and column index vectors) of U's pattern, kept."""
    from cvxopt import cholmod, matrix, spmatrix

    key = _pattern_key(U)
    hit = _ANALYSES.get(key)
    if hit is None:
        n = U.shape[0]
        rows = matrix(U.indices.astype(np.int64))
        cols = matrix(np.repeat(np.arange(n, dtype=np.int64), np.diff(U.indptr)))
        A = spmatrix(matrix(U.data), rows, cols, (n, n))
        with _CholmodOptions():
            F = cholmod.symbolic(A, uplo="U")
        if len(_ANALYSES) >= _ANALYSIS_CACHE_SIZE:
            _ANALYSES.pop(next(iter(_ANALYSES)))
        hit = _ANALYSES[key] = (F, rows, cols)
    return hit


class _CholmodOptions:
    """CHOLMOD's options inside a ``with`` (by default this module's: supernodal LLᵀ),
    restored after: ``cvxopt.cholmod.options`` is one dict for the whole process."""

    def __init__(self, supernodal=2):
        self.options = dict(supernodal=supernodal)

    def __enter__(self):
        from cvxopt import cholmod

        self.saved = dict(cholmod.options)
        cholmod.options.clear()
        cholmod.options.update(self.options)

    def __exit__(self, *exc):
        from cvxopt import cholmod

        cholmod.options.clear()
        cholmod.options.update(self.saved)


def cholmod_solve(U, rhs):
    """Host: u for U u = rhs by CHOLMOD's supernodal Cholesky (``cvxopt.cholmod``), U the
    finite upper triangle (scipy CSC, sorted) of a symmetric matrix; None where CHOLMOD
    finds it not positive definite (a pivot ≤ 0). The symbolic analysis (AMD ordering,
    supernodes) is kept per pattern (:func:`_analysis`); only the numeric factorization
    and the triangular solves run for a pattern seen before."""
    from cvxopt import cholmod, matrix, spmatrix

    F, rows, cols = _analysis(U)
    n = U.shape[0]
    A = spmatrix(matrix(U.data), rows, cols, (n, n))
    b = matrix(np.array(rhs, np.float64, copy=True))
    try:
        with _CholmodOptions():
            cholmod.numeric(A, F)
    except ArithmeticError:  # the kept analysis serves the pattern's next matrix all the same (tested)
        return None
    cholmod.solve(F, b)
    return np.asarray(b, np.float64).reshape(rhs.shape)


def host_solve(diag, rows, blocks, rhs, require_pd=True):
    """Host: (u, status) for H u = rhs; u is NaN where the
    :class:`~ipcjax.result.LinearStatus` ``status`` is not SUCCESSFUL.

    With ``require_pd`` (the Newton direction, the projected implicit solve) by CHOLMOD's
    supernodal Cholesky (:func:`cholmod_solve`); where CHOLMOD finds H not positive
    definite, QDLDL's LDLᵀ of the same matrix names the failure (a zero pivot: SINGULAR,
    a negative one: NOT_POSITIVE_DEFINITE) and, should every pivot be positive there
    after all (a matrix at the edge of definiteness, where the two round differently),
    gives the answer. Without it (the exact implicit Hessian, which may be indefinite)
    by QDLDL's LDLᵀ, where only a zero or non-finite pivot is a failure.
    """
    rhs = np.asarray(rhs, np.float64)

    def fail(status):
        return np.full(rhs.shape, np.nan), np.int32(status)

    U = upper_csc(diag, rows, blocks)
    if not (np.all(np.isfinite(U.data)) and np.all(np.isfinite(rhs))):
        return fail(LinearStatus.NON_FINITE_INPUT)
    u = cholmod_solve(U, rhs) if require_pd else None
    if u is None:
        u, status = _qdldl_solve(U, rhs, require_pd)
        if status != LinearStatus.SUCCESSFUL:
            return fail(status)
    if not np.all(np.isfinite(u)):
        return fail(LinearStatus.SINGULAR)
    return u, np.int32(LinearStatus.SUCCESSFUL)


def _qdldl_solve(U, rhs, require_pd):
    """Host: (u, status) by QDLDL's LDLᵀ (AMD ordering, no pivoting) of the finite upper
    triangle U; a pivot D ≤ 0 is a failure with ``require_pd``, otherwise only D = 0 or a
    non-finite one."""
    import qdldl

    try:
        solver = qdldl.Solver(U, upper=True)
    except (ValueError, RuntimeError):  # a zero pivot
        return None, LinearStatus.SINGULAR
    D = solver.factors()[1]
    if not np.all(np.isfinite(D)) or np.any(D == 0):
        return None, LinearStatus.SINGULAR
    if require_pd and np.any(D < 0):
        return None, LinearStatus.NOT_POSITIVE_DEFINITE
    return solver.solve(rhs), LinearStatus.SUCCESSFUL


def sparse_solve(hb: HessianBlocks, rhs, require_pd: bool = True):
    """u = H⁻¹ rhs over the free DOFs by the host's sparse factorization (:func:`host_solve`);
    returns (u, status).

    Traceable (``jax.pure_callback``); ``status`` is an int32
    :class:`~ipcjax.result.LinearStatus`, and ``u`` is NaN where it is not SUCCESSFUL (see
    the module docstring for what counts as a failure).
    """
    out = (jax.ShapeDtypeStruct(rhs.shape, jnp.float64), jax.ShapeDtypeStruct((), jnp.int32))
    return jax.pure_callback(lambda d, r, b, y: host_solve(d, r, b, y, require_pd), out,
                             hb.diag, hb.rows, hb.blocks, rhs, vmap_method="sequential")

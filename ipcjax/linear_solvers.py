"""The linear solves of the Newton direction and of the implicit VJP, as objects.

Every solver is a :class:`LinearSolver`: the lineax-style trio the library needs from it.

* ``init(hb)``: the operator in the solver's form, from the element blocks
  (:class:`ipcjax.potential.HessianBlocks`): the scattered dense matrix, or the blocks;
* ``direction(g, op, name_failure=True) -> LinearSolution``: the Newton direction
  H Δx = −g; its ``value`` is 0 unless the status is SUCCESSFUL (H positive definite, or
  the iteration converged); ``name_failure=False`` lets the sparse solver call a failed
  factorization NOT_POSITIVE_DEFINITE without the work of telling SINGULAR from it (the
  exact tangent tried first, :mod:`ipcjax.newton`);
* ``solve(op, rhs, projection) -> LinearSolution``: u = H⁻¹ rhs for the implicit VJP;
  its ``value`` is NaN unless the status is SUCCESSFUL.

A :class:`LinearSolution` carries the answer, an int32
:class:`~ipcjax.result.LinearStatus` that says why there is none (non-finite input, not
positive definite, singular, CG's iteration cap or breakdown) and the
:class:`LinearSolveInfo` counts. SUCCESSFUL implies a finite ``value``. The Newton loop
(:mod:`ipcjax.newton`) stops on any other status with ``FACTORIZATION_FAILED``; the
implicit VJP (:mod:`ipcjax.implicit`) raises ``BackwardFailed`` naming it. The benchmarks
call the same objects; :func:`linear_solver` gives the one ``Config`` names.

=============== ============================= ============================================
``"dense"``     :class:`DenseCholesky`        direction: Cholesky of D H D, D = diag(H)^(−½);
                                              solve: LU (exact H, possibly indefinite away
                                              from a minimiser) or Cholesky (projected)
``"sparse"``    :class:`SparseLDL`            sparse Cholesky (projected H) inside XLA
                                              (:mod:`ipcjax.cholmod_ffi`) or host LDLᵀ
                                              (exact H, :mod:`ipcjax.ldl`); a pivot ≤ 0
                                              fails (a zero one for exact H)
``"cg"``        :class:`BlockJacobiCG`        block-Jacobi PCG on the blocks, never forming
                                              H; missing the tolerance fails
=============== ============================= ============================================
"""
from __future__ import annotations

import abc
import dataclasses
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from ipcjax import cholmod_ffi
from ipcjax.energies import PSDProjection
from ipcjax.ldl import sparse_solve
from ipcjax.model import LINEAR_SOLVERS, Config
from ipcjax.potential import HessianBlocks, dense_hessian, hessian_block_diagonal, hessian_matvec
from ipcjax.result import LinearStatus


class LinearSolveInfo(NamedTuple):
    iterations: jnp.ndarray  # () int32: CG iterations (matrix–vector products); 0 for direct solves
    residual: jnp.ndarray    # () CG's relative residual ‖b − A z‖/‖b‖ (recurrence); NaN for direct solves


class LinearSolution(NamedTuple):
    """What a :class:`LinearSolver` returns (a pytree: it passes through jit and vmap)."""

    value: jnp.ndarray       # (3F,) the solution; 0 (direction) or NaN (solve) unless successful
    status: jnp.ndarray      # () int32 LinearStatus; SUCCESSFUL implies a finite value
    stats: LinearSolveInfo

    @property
    def ok(self):
        """() bool: status is SUCCESSFUL."""
        return self.status == int(LinearStatus.SUCCESSFUL)

    @classmethod
    def masked(cls, value, status, stats, fill: float) -> "LinearSolution":
        """The solution with ``value`` replaced by ``fill`` (0 or NaN) unless ``status`` is SUCCESSFUL."""
        return cls(jnp.where(status == int(LinearStatus.SUCCESSFUL), value, fill), status, stats)


def _direct_info():
    return LinearSolveInfo(jnp.int32(0), jnp.asarray(jnp.nan))


def _status(*cases):
    """The status of the first (condition, LinearStatus) pair that holds, else SUCCESSFUL."""
    out = jnp.int32(LinearStatus.SUCCESSFUL)
    for cond, status in reversed(cases):
        out = jnp.where(cond, jnp.int32(status), out)
    return out


def _finite(*arrays):
    return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(a)) for a in arrays]))


class LinearSolver(abc.ABC):
    """The base of the linear solvers: ``init``, ``direction`` and ``solve`` (module docstring)."""

    name: str

    @abc.abstractmethod
    def init(self, hb: HessianBlocks):
        """The operator in this solver's form."""

    @abc.abstractmethod
    def direction(self, g, op, name_failure: bool = True) -> LinearSolution:
        """Δx with H Δx = −g, H positive definite; ``value`` 0 unless successful (module doc)."""

    @abc.abstractmethod
    def solve(self, op, rhs, projection: PSDProjection) -> LinearSolution:
        """u = H⁻¹ rhs (exact or projected H); ``value`` NaN unless successful."""


# --------------------------------------------------------------------------- dense

def equilibrated_cholesky_direction(g, H):
    """Δx over the free DOFs from (D H D) z = −D g, D = diag(H)^(−½); also a success flag."""
    d = jnp.diag(H)
    D = jnp.where(d > 0, 1.0 / jnp.sqrt(jnp.where(d > 0, d, 1.0)), 1.0)
    A = D[:, None] * H * D[None, :]
    cf = jsl.cho_factor(A, lower=True)
    z = jsl.cho_solve(cf, -D * g)
    dx = D * z
    # a failed factorization (H not positive definite) comes back as NaNs, which reach dx
    ok = jnp.all(jnp.isfinite(dx))
    return jnp.where(ok, dx, 0.0), ok


class DenseCholesky(LinearSolver):
    """The dense (3F, 3F) Hessian (8·(3F)² bytes), factorized by Cholesky (or LU)."""

    name = "dense"

    def init(self, hb: HessianBlocks):
        return dense_hessian(hb)

    def direction(self, g, H, name_failure: bool = True) -> LinearSolution:
        dx, ok = equilibrated_cholesky_direction(g, H)
        status = _status((~_finite(g, H), LinearStatus.NON_FINITE_INPUT), (~ok, LinearStatus.NOT_POSITIVE_DEFINITE))
        return LinearSolution(dx, status, _direct_info())

    def solve(self, H, rhs, projection: PSDProjection) -> LinearSolution:
        if PSDProjection(projection) is PSDProjection.NONE:
            u, failed = jnp.linalg.solve(H, rhs), LinearStatus.SINGULAR
        else:
            u, failed = jsl.cho_solve(jsl.cho_factor(H, lower=True), rhs), LinearStatus.NOT_POSITIVE_DEFINITE
        status = _status((~_finite(H, rhs), LinearStatus.NON_FINITE_INPUT), (~_finite(u), failed))
        return LinearSolution.masked(u, status, _direct_info(), jnp.nan)


# --------------------------------------------------------------------------- sparse

_fallback_warned = False


def positive_definite_solve(hb: HessianBlocks, rhs, name_failure: bool = True):
    """(u, status) of H u = rhs, H positive definite, by CHOLMOD: inside XLA as a custom
    call (:mod:`ipcjax.cholmod_ffi`; ``name_failure=False``: any failed factorization is
    NOT_POSITIVE_DEFINITE, without the custom call's LDLᵀ) where it is available, else through the host callback
    (:func:`ipcjax.ldl.sparse_solve`), with one warning per process naming why unless the
    user switched it off (``IPCJAX_NATIVE=0``). The custom call is registered for the CPU:
    a program lowered for another platform (a GPU) takes the host callback there
    (``jax.lax.platform_dependent``; only the branch of the platform lowered for is in
    the compiled program)."""
    global _fallback_warned
    if cholmod_ffi.available():
        host = lambda hb, rhs: sparse_solve(hb, rhs, require_pd=True)
        native = lambda hb, rhs: cholmod_ffi.solve(hb, rhs, name_failure=name_failure)
        return jax.lax.platform_dependent(hb, rhs, cpu=native, default=host)
    if not _fallback_warned and not cholmod_ffi.switched_off_by_choice():
        _fallback_warned = True
        warnings.warn(f"ipcjax: the sparse solve goes through a host callback, slower and never in the "
                      f"persistent compilation cache: {cholmod_ffi.why_not()}", RuntimeWarning, stacklevel=2)
    return sparse_solve(hb, rhs, require_pd=True)


class SparseLDL(LinearSolver):
    """The sparse Hessian factorized by CHOLMOD (P H Pᵀ = L Lᵀ) where H must be positive
    definite, inside XLA (:func:`positive_definite_solve`), and by QDLDL on the host
    (P H Pᵀ = L D Lᵀ, :mod:`ipcjax.ldl`) for the exact implicit Hessian."""

    name = "sparse"

    def init(self, hb: HessianBlocks):
        return hb

    def direction(self, g, hb: HessianBlocks, name_failure: bool = True) -> LinearSolution:
        dx, status = positive_definite_solve(hb, -g, name_failure)
        return LinearSolution.masked(dx, status, _direct_info(), 0.0)

    def solve(self, hb: HessianBlocks, rhs, projection: PSDProjection) -> LinearSolution:
        if PSDProjection(projection) is PSDProjection.PER_ELEMENT:
            u, status = positive_definite_solve(hb, rhs)
        else:
            u, status = sparse_solve(hb, rhs, require_pd=False)
        return LinearSolution(u, status, _direct_info())


# --------------------------------------------------------------------------- CG

def pcg(matvec, b, precond, tol, max_iterations):
    """Preconditioned conjugate gradients for A z = b, A SPD, from z = 0.

    Stops when ‖r‖ ≤ tol·‖b‖ or after ``max_iterations``; a non-positive or non-finite
    curvature pᵀAp (A not SPD) stops it as a breakdown. Returns (z, status,
    LinearSolveInfo); ``status`` (int32 :class:`~ipcjax.result.LinearStatus`) is
    NON_FINITE_INPUT for a non-finite b, BREAKDOWN, MAX_ITERATIONS, SINGULAR for a
    non-finite z, or SUCCESSFUL.
    """
    bnorm = jnp.linalg.norm(b)
    s = precond(b)
    init = (jnp.zeros_like(b), b, s, jnp.dot(b, s), jnp.int32(0), jnp.bool_(False))

    def cond(c):
        _, r, _, _, k, broke = c
        return (jnp.linalg.norm(r) > tol * bnorm) & (k < max_iterations) & ~broke

    def body(c):
        z, r, p, rs, k, _ = c
        q = matvec(p)
        pq = jnp.dot(p, q)
        broke = ~(jnp.isfinite(pq) & (pq > 0))
        alpha = jnp.where(broke, 0.0, rs / jnp.where(broke, 1.0, pq))
        z = z + alpha * p
        r = r - alpha * q
        s = precond(r)
        rs2 = jnp.dot(r, s)
        p = s + (rs2 / rs) * p
        return z, r, p, rs2, k + 1, broke

    z, r, _, _, k, broke = jax.lax.while_loop(cond, body, init)
    rnorm = jnp.linalg.norm(r)
    converged = (rnorm <= tol * bnorm) & ~broke
    status = _status((~jnp.isfinite(bnorm), LinearStatus.NON_FINITE_INPUT), (broke, LinearStatus.BREAKDOWN),
                     (~converged, LinearStatus.MAX_ITERATIONS), (~_finite(z), LinearStatus.SINGULAR))
    return z, status, LinearSolveInfo(k, rnorm / jnp.where(bnorm > 0, bnorm, 1.0))


def block_jacobi(hb: HessianBlocks):
    """r ↦ P⁻¹r with P the 3×3 diagonal blocks of H, one per free particle."""
    Pinv = jnp.linalg.inv(hessian_block_diagonal(hb))
    return lambda r: jnp.einsum("fij,fj->fi", Pinv, r.reshape(-1, 3)).reshape(-1)


@dataclasses.dataclass(frozen=True)
class BlockJacobiCG(LinearSolver):
    """Block-Jacobi preconditioned CG on the element blocks; H is never formed.

    Block-Jacobi preconditioning makes CG invariant to the dense path's diagonal
    equilibration, so none is applied. At a minimiser the exact ∇²Φ is positive
    semidefinite and the inertia makes it definite, so CG serves the implicit VJP too.
    """

    tolerance: float       # relative residual ‖H z − b‖/‖b‖ to reach
    max_iterations: int    # CG iterations before it counts as failed

    name = "cg"

    def init(self, hb: HessianBlocks):
        return hb

    def _pcg(self, hb, b):
        z, status, info = pcg(lambda v: hessian_matvec(hb, v), b, block_jacobi(hb), self.tolerance,
                              self.max_iterations)
        # a NaN in H shows up inside CG as a breakdown; name it for what it is
        status = jnp.where(_finite(hb.diag, *hb.blocks), status, jnp.int32(LinearStatus.NON_FINITE_INPUT))
        return z, status, info

    def direction(self, g, hb: HessianBlocks, name_failure: bool = True) -> LinearSolution:
        dx, status, info = self._pcg(hb, -g)
        return LinearSolution.masked(dx, status, info, 0.0)

    def solve(self, hb: HessianBlocks, rhs, projection: PSDProjection) -> LinearSolution:
        u, status, info = self._pcg(hb, rhs)
        return LinearSolution.masked(u, status, info, jnp.nan)


def linear_solver(config: Config) -> LinearSolver:
    """The solver object ``config.linear_solver`` names (CG with the config's tolerance and cap)."""
    if config.linear_solver == "cg":
        return BlockJacobiCG(config.cg_tolerance, config.cg_max_iterations)
    return _DIRECT[config.linear_solver]


_DIRECT = {"dense": DenseCholesky(), "sparse": SparseLDL()}
if set(_DIRECT) | {"cg"} != set(LINEAR_SOLVERS):  # a solver named in model.py must exist here
    raise ImportError(f"linear_solvers.py serves {sorted(set(_DIRECT) | {'cg'})}, model.py names {LINEAR_SOLVERS}")

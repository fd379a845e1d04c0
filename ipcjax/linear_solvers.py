"""The linear solves of the Newton direction and of the implicit VJP, as objects.

Each solver is one object with the lineax-style pair the library needs from it:

* ``init(hb)``: the operator in the solver's form, from the element blocks
  (:class:`ipcjax.potential.HessianBlocks`): the scattered dense matrix, or the blocks;
* ``direction(g, op) -> (Δx, ok, LinearSolveInfo)``: the Newton direction H Δx = −g with
  a success flag (H positive definite, or the iteration converged); Δx is 0 where not ok;
* ``solve(op, rhs, projection) -> u``: u = H⁻¹ rhs for the implicit VJP, NaN on failure.

The Newton loop (:mod:`ipcjax.newton`), the implicit VJP (:mod:`ipcjax.implicit`) and the
benchmarks all call these objects; :func:`linear_solver` gives the one ``Config`` names.

=============== ============================= ============================================
``"dense"``     :class:`DenseCholesky`        direction: Cholesky of D H D, D = diag(H)^(−½);
                                              solve: LU (exact H, possibly indefinite away
                                              from a minimiser) or Cholesky (projected)
``"sparse"``    :class:`SparseLDL`            host LDLᵀ of the sparse H (:mod:`ipcjax.ldl`);
                                              a pivot ≤ 0 fails (a zero one for exact H)
``"cg"``        :class:`BlockJacobiCG`        block-Jacobi PCG on the blocks, never forming
                                              H; missing the tolerance fails
=============== ============================= ============================================
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from ipcjax.energies import PSDProjection
from ipcjax.ldl import sparse_solve
from ipcjax.model import LINEAR_SOLVERS, Config
from ipcjax.potential import HessianBlocks, dense_hessian, hessian_block_diagonal, hessian_matvec


class LinearSolveInfo(NamedTuple):
    iterations: jnp.ndarray  # () int32: CG iterations (matrix–vector products); 0 for direct solves
    residual: jnp.ndarray    # () CG's relative residual ‖b − A z‖/‖b‖ (recurrence); NaN for direct solves


def _direct_info():
    return LinearSolveInfo(jnp.int32(0), jnp.asarray(jnp.nan))


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


class DenseCholesky:
    """The dense (3F, 3F) Hessian (8·(3F)² bytes), factorized by Cholesky (or LU)."""

    name = "dense"

    def init(self, hb: HessianBlocks):
        return dense_hessian(hb)

    def direction(self, g, H):
        dx, ok = equilibrated_cholesky_direction(g, H)
        return dx, ok, _direct_info()

    def solve(self, H, rhs, projection: PSDProjection):
        if PSDProjection(projection) is PSDProjection.NONE:
            return jnp.linalg.solve(H, rhs)
        return jsl.cho_solve(jsl.cho_factor(H, lower=True), rhs)


# --------------------------------------------------------------------------- sparse

class SparseLDL:
    """The sparse Hessian factorized as P H Pᵀ = L D Lᵀ on the host (:mod:`ipcjax.ldl`)."""

    name = "sparse"

    def init(self, hb: HessianBlocks):
        return hb

    def direction(self, g, hb: HessianBlocks):
        dx, ok = sparse_solve(hb, -g, require_pd=True)
        return jnp.where(ok, dx, 0.0), ok, _direct_info()

    def solve(self, hb: HessianBlocks, rhs, projection: PSDProjection):
        return sparse_solve(hb, rhs, require_pd=PSDProjection(projection) is PSDProjection.PER_ELEMENT)[0]


# --------------------------------------------------------------------------- CG

def pcg(matvec, b, precond, tol, max_iterations):
    """Preconditioned conjugate gradients for A z = b, A SPD, from z = 0.

    Stops when ‖r‖ ≤ tol·‖b‖ or after ``max_iterations``; a non-positive or non-finite
    curvature pᵀAp (A not SPD) stops it as a breakdown. Returns (z, converged,
    LinearSolveInfo); ``converged`` is False on breakdown, on the iteration cap and on
    non-finite input.
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
    return z, converged, LinearSolveInfo(k, rnorm / jnp.where(bnorm > 0, bnorm, 1.0))


def block_jacobi(hb: HessianBlocks):
    """r ↦ P⁻¹r with P the 3×3 diagonal blocks of H, one per free particle."""
    Pinv = jnp.linalg.inv(hessian_block_diagonal(hb))
    return lambda r: jnp.einsum("fij,fj->fi", Pinv, r.reshape(-1, 3)).reshape(-1)


@dataclasses.dataclass(frozen=True)
class BlockJacobiCG:
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
        return pcg(lambda v: hessian_matvec(hb, v), b, block_jacobi(hb), self.tolerance, self.max_iterations)

    def direction(self, g, hb: HessianBlocks):
        dx, conv, info = self._pcg(hb, -g)
        ok = conv & jnp.all(jnp.isfinite(dx))
        return jnp.where(ok, dx, 0.0), ok, info

    def solve(self, hb: HessianBlocks, rhs, projection: PSDProjection):
        u, conv, _ = self._pcg(hb, rhs)
        return jnp.where(conv, u, jnp.nan)


def linear_solver(config: Config):
    """The solver object ``config.linear_solver`` names (CG with the config's tolerance and cap)."""
    if config.linear_solver == "cg":
        return BlockJacobiCG(config.cg_tolerance, config.cg_max_iterations)
    return _DIRECT[config.linear_solver]


_DIRECT = {"dense": DenseCholesky(), "sparse": SparseLDL()}
assert set(_DIRECT) | {"cg"} == set(LINEAR_SOLVERS)

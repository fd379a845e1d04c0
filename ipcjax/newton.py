"""The Newton solve of one timestep: direction, conservative step bound, Armijo line search.

One bounded ``lax.while_loop``; each iteration

1. assembles ∇Φ and the PSD Hessian H over the free DOFs (FP64) as element blocks,
2. solves H Δx = −∇Φ by the path ``config.linear_solver`` selects: ``"dense"`` scatters
   the blocks into the (3F, 3F) matrix, equilibrates with D = diag(H)^(−½) and solves
   (D H D) z = −D∇Φ by Cholesky (``jax.scipy.linalg.cho_factor``), Δx = D z; ``"cg"``
   never forms the matrix and runs block-Jacobi preconditioned conjugate gradients with
   H·v applied block by block (a direction that misses ``config.cg_tolerance`` within
   ``config.cg_max_iterations`` is reported like a failed factorization); ``"sparse"``
   factorizes the sparse H by LDLᵀ on the host (:mod:`ipcjax.ldl`; a pivot ≤ 0 is a
   failed factorization, as for Cholesky),
3. stops after this iteration when max|Δx| < tolerance (m) — the last small step is
   still taken when the line search accepts it,
4. makes sure the contact candidates cover the swept boxes x → x + Δx (complete for
   every trial point of the line search, since trial points lie on that segment): the
   set of the last query, made with an extra ``config.skin`` (1.5 mm) of search width, is
   reused while every particle's swept box stays within skin/2 of the box it was
   queried with; otherwise the candidates are queried again,
5. bounds the step along each candidate's current separating normal (ccd), and
6. backtracks from that bound until Φ(x+αΔx) ≤ Φ(x) + 10⁻⁴ α ∇Φ·Δx (≤ 48 halvings).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from ipcjax import candidates as _cand
from ipcjax import ccd as _ccd
from ipcjax.ldl import sparse_direction
from ipcjax.model import Config, Controls, Model, Params
from ipcjax.potential import (
    ContactSet, HessianBlocks, StencilGeometry, StepContext, dense_hessian, gradient_and_blocks,
    hessian_block_diagonal, hessian_matvec, incremental_potential, stencil_geometry, stencil_weights,
)
from ipcjax.result import StepCode


class CandidateStats(NamedTuple):
    """Largest candidate counts seen (for host reallocation) and whether any query overflowed."""

    n_vt: jnp.ndarray
    n_ee: jnp.ndarray
    n_sf: jnp.ndarray
    overflow: jnp.ndarray
    work: jnp.ndarray  # (2, 3) intermediate grid-buffer entries needed (see candidates.Candidates)
    n_active: jnp.ndarray  # active contact rows the Hessian assembly needed (Capacity.active)

    @staticmethod
    def of(c) -> "CandidateStats":
        return CandidateStats(c.n_vt, c.n_ee, c.n_sf, c.overflow, c.work, jnp.int32(0))

    def merge(self, other: "CandidateStats") -> "CandidateStats":
        return CandidateStats(jnp.maximum(self.n_vt, other.n_vt), jnp.maximum(self.n_ee, other.n_ee),
                              jnp.maximum(self.n_sf, other.n_sf), self.overflow | other.overflow,
                              jnp.maximum(self.work, other.work), jnp.maximum(self.n_active, other.n_active))

    def with_active(self, n_active, size) -> "CandidateStats":
        """Record an assembly's active-row count; above ``size`` (not None) it is an overflow."""
        over = jnp.bool_(False) if size is None else n_active > size
        return self._replace(n_active=jnp.maximum(self.n_active, n_active), overflow=self.overflow | over)


def active_size(capacity):
    """``Capacity.active`` (static), or None for capacities without one."""
    return getattr(capacity, "active", None)


def query_contacts(x_start, x_end, model: Model, config: Config, capacity, skin=0.0):
    """Candidates for the swept boxes x_start → x_end as a :class:`ContactSet` plus stats.

    ``skin`` (m) widens the search beyond d̂ + min_gap so the set can be reused while every
    particle stays within skin/2 of its queried box (see :func:`newton_solve`).
    """
    c = _cand.find_candidates(x_start, x_end, model.topology, config.dhat + skin, config.min_gap, capacity)
    idx, kind, valid = _cand.stencils(c, model.topology)
    blocks = (c.vt.shape[0], c.ee.shape[0], c.sf.shape[0], c.ss.shape[0])  # stencils' row order
    return ContactSet(idx, kind, valid, blocks), CandidateStats.of(c)


def newton_direction(g, H):
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


class CGInfo(NamedTuple):
    iterations: jnp.ndarray  # CG iterations (matrix–vector products)
    residual: jnp.ndarray    # relative residual ‖b − A z‖/‖b‖ (recurrence value)


def pcg(matvec, b, precond, tol, max_iterations):
    """Preconditioned conjugate gradients for A z = b, A SPD, from z = 0.

    Stops when ‖r‖ ≤ tol·‖b‖ or after ``max_iterations``; a non-positive or non-finite
    curvature pᵀAp (A not SPD) stops it as a breakdown. Returns (z, converged, CGInfo);
    ``converged`` is False on breakdown, on the iteration cap and on non-finite input.
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
    return z, converged, CGInfo(k, rnorm / jnp.where(bnorm > 0, bnorm, 1.0))


def block_jacobi(hb: HessianBlocks):
    """r ↦ P⁻¹r with P the 3×3 diagonal blocks of H, one per free particle."""
    Pinv = jnp.linalg.inv(hessian_block_diagonal(hb))
    return lambda r: jnp.einsum("fij,fj->fi", Pinv, r.reshape(-1, 3)).reshape(-1)


def cg_direction(g, hb: HessianBlocks, config: Config):
    """Δx over the free DOFs from H Δx = −g by block-Jacobi PCG on the element blocks.

    Block-Jacobi preconditioning makes CG invariant to the dense path's diagonal
    equilibration, so none is applied. Returns (Δx, success flag, CGInfo); the flag is
    False when CG misses ``config.cg_tolerance`` within ``config.cg_max_iterations``,
    breaks down or yields non-finite values.
    """
    dx, conv, info = pcg(lambda v: hessian_matvec(hb, v), -g, block_jacobi(hb),
                         config.cg_tolerance, config.cg_max_iterations)
    ok = conv & jnp.all(jnp.isfinite(dx))
    return jnp.where(ok, dx, 0.0), ok, info


def solve_direction(x, model: Model, params: Params, controls: Controls, ctx: StepContext,
                    contacts: ContactSet, config: Config, geometry: StencilGeometry | None = None,
                    active: int | None = None):
    """∇Φ, the Newton direction over the free DOFs, its success flag and the assembly's
    active-row count, by ``config.linear_solver`` (``active``: see :func:`gradient_and_blocks`)."""
    g, hb = gradient_and_blocks(x, model, params, controls, ctx, contacts, config, geometry=geometry,
                                active=active)
    if config.linear_solver == "cg":
        dx, ok, _ = cg_direction(g, hb, config)
    elif config.linear_solver == "sparse":
        dx, ok = sparse_direction(g, hb)
    else:
        dx, ok = newton_direction(g, dense_hessian(hb))
    return g, dx, ok, hb.n_active


# stencils re-bounded by conservative advancement per Newton iteration (the smallest
# single bounds); the rest keep their single bound
ADVANCE_STENCILS = 64


def step_bound(x, dx, contacts: ContactSet, radius, config: Config, geometry: StencilGeometry | None = None):
    """Largest first trial α ∈ [0, 1] keeping every candidate's gap positive along x + αΔx.

    Every stencil's single bound (:func:`ipcjax.ccd.stencil_max_step`: 90% of g/approach
    along the current separating normal when that is ≤ 1, spec §4); the ``ADVANCE_STENCILS``
    smallest are then re-bounded by conservative advancement
    (:func:`ipcjax.ccd.stencil_advance`, up to ``config.ccd_passes`` passes), and the
    result is the minimum of those and the next-smallest single bound. ``geometry``: the
    stencils at x (:func:`ipcjax.potential.stencil_geometry`) when the caller has them.
    """
    if geometry is None:
        geometry = stencil_geometry(x, contacts, radius, config.min_gap)
    X, w, off = geometry
    dX = dx[contacts.idx]
    single = jax.vmap(_ccd.stencil_max_step)(X, dX, w, off, contacts.kind)
    single = jnp.where(contacts.valid, single, 1.0)
    n = single.shape[0]
    if n == 0:
        return jnp.asarray(1.0, x.dtype)
    # advance only the most limiting stencils; every other one keeps its single bound,
    # so the result is min(advanced few, next-smallest single bound) — still conservative
    k = min(ADVANCE_STENCILS, n)
    if k < n:
        neg, sel = jax.lax.top_k(-single, k + 1)
        sel, rest = sel[:k], -neg[k]
    else:
        _, sel = jax.lax.top_k(-single, n)
        rest = jnp.asarray(1.0, single.dtype)
    passes = config.ccd_passes
    adv, _ = jax.vmap(lambda X, dX, o, kd: _ccd.stencil_advance(X, dX, o, kd, stencil_weights, passes))(
        X[sel], dX[sel], off[sel], contacts.kind[sel])
    adv = jnp.where(contacts.valid[sel], adv, 1.0)
    return jnp.minimum(jnp.min(adv), rest)


def armijo(phi, x, dx, phi0, slope, alpha0, config: Config):
    """Backtracking from alpha0: first α with Φ(x+αΔx) ≤ Φ(x) + c α ∇Φ·Δx, ≤ max halvings.

    Near convergence the predicted decrease α|∇Φ·Δx| falls below the round-off of Φ
    itself (a sum of many terms, some computed with cancellation), and the Armijo test
    becomes a coin toss. In that regime — predicted decrease below 1e-9·|Φ(x)| — a
    trial is also accepted when the directional derivative ∇Φ(x+αΔx)·Δx is still
    negative: the energy is still decreasing along Δx at the trial point. Returns
    (α, trials, accepted, Φ(x+αΔx)) — the last is Φ at the accepted trial (at the last
    rejected one when none was accepted).
    """
    noise = 1e-9 * jnp.abs(phi0)

    def cond(c):
        a, k, ok, _ = c
        return (~ok) & (k < config.max_line_search)

    def body(c):
        a, k, _, _ = c
        z = x + a * dx
        val = phi(z)
        ok = jnp.isfinite(val) & (val <= phi0 + config.armijo * a * slope)
        tiny = jnp.isfinite(val) & (a * jnp.abs(slope) < noise)
        descending = jax.lax.cond(tiny & ~ok, lambda: jax.jvp(phi, (z,), (dx,))[1] < 0.0, lambda: False)
        ok = ok | (tiny & descending)
        return jnp.where(ok, a, 0.5 * a), k + 1, ok, val

    a, k, ok, val = jax.lax.while_loop(cond, body, (alpha0, jnp.int32(0), jnp.bool_(False), phi0))
    return a, k, ok, val


class SolveInfo(NamedTuple):
    code: jnp.ndarray            # StepCode bits
    iterations: jnp.ndarray      # Newton iterations
    line_search_trials: jnp.ndarray
    min_step_bound: jnp.ndarray  # smallest ccd α₀ over the iterations
    last_step_norm: jnp.ndarray  # max|Δx| of the last direction, m
    stats: CandidateStats


def newton_solve(x_init, model: Model, params: Params, controls: Controls, ctx: StepContext,
                 contacts: ContactSet, stats: CandidateStats, config: Config, capacity):
    """Minimise Φ from x_init (feasible). Returns (x*, contacts at x*, SolveInfo).

    ``contacts`` must have been queried at x_init with ``skin=config.skin``.
    """
    F = model.n_free
    fp = model.free_particles

    def to_full(v):
        return jnp.zeros_like(x_init).at[fp].set(v.reshape(F, 3))

    half_skin = 0.5 * config.skin
    radius, min_gap = model.radius, config.min_gap
    active = active_size(capacity)

    def potential(contacts):
        return lambda z: incremental_potential(z, model, params, controls, ctx, contacts, config)

    def cond(c):
        x, cs, st, it, done, code, lst, amin, step, box, phi_x = c
        return (~done) & (code == 0) & (it < config.max_newton)

    def body(c):
        # phi_x = Φ(x), carried from the line search that accepted x: Φ does not depend on
        # which complete candidate set evaluates it, since stencils beyond d̂ add exactly 0
        x, cs, st, it, done, code, lst, amin, _, box, phi_x = c
        geom = stencil_geometry(x, cs, radius, min_gap)
        g, dxf, fact_ok, n_active = solve_direction(x, model, params, controls, ctx, cs, config, geom, active)
        # more active contact rows than Capacity.active: the direction misses some; stop
        # with the overflow (the host grows the capacity and redoes the step)
        st = st.with_active(n_active, active)
        over = st.overflow
        dx = to_full(dxf)
        step_norm = jnp.max(jnp.abs(dxf), initial=0.0)
        converged = fact_ok & ~over & (step_norm < controls.tolerance)

        def move(_):
            lo, hi = jnp.minimum(x, x + dx), jnp.maximum(x, x + dx)
            inside = jnp.all(lo >= box[0] - half_skin) & jnp.all(hi <= box[1] + half_skin)

            def requery(_):
                c2, s2 = query_contacts(x, x + dx, model, config, capacity, config.skin)
                return c2, st.merge(s2), (lo, hi), stencil_geometry(x, c2, radius, min_gap)

            cs2, st2, box2, geom2 = jax.lax.cond(inside, lambda _: (cs, st, box, geom), requery, None)
            a0 = step_bound(x, dx, cs2, radius, config, geom2)
            slope = jnp.dot(g, dxf)
            a, k, ok, phi_a = armijo(potential(cs2), x, dx, phi_x, slope, a0, config)
            bad = (~ok) | (slope >= 0)
            code2 = jnp.where(st2.overflow, int(StepCode.CAPACITY_OVERFLOW),
                              jnp.where(a0 <= 0, int(StepCode.ZERO_STEP_BOUND),
                                        jnp.where(bad, int(StepCode.LINE_SEARCH_EXHAUSTED), 0))).astype(jnp.int32)
            x2 = jnp.where(code2 == 0, x + a * dx, x)
            return x2, cs2, st2, k, a0, code2, box2, jnp.where(code2 == 0, phi_a, phi_x)

        def stay(_):
            return x, cs, st, jnp.int32(0), jnp.asarray(1.0, x.dtype), jnp.int32(0), box, phi_x

        # The last, sub-tolerance direction is still taken (when the line search accepts it),
        # so that motion slower than tolerance/dt is not quantised away; a rejected final
        # step just leaves x where it is.
        x2, cs2, st2, k, a0, code2, box2, phi2 = jax.lax.cond(fact_ok & ~over, move, stay, None)
        code2 = jnp.where(converged, code2 & int(StepCode.CAPACITY_OVERFLOW), code2)
        code2 = code2 | jnp.where(fact_ok | over, 0, int(StepCode.FACTORIZATION_FAILED)).astype(jnp.int32)
        code2 = code2 | jnp.where(over, int(StepCode.CAPACITY_OVERFLOW), 0).astype(jnp.int32)
        code2 = code2 | jnp.where(jnp.all(jnp.isfinite(x2)), 0, int(StepCode.NON_FINITE)).astype(jnp.int32)
        return (x2, cs2, st2, it + 1, converged, code2, lst + k, jnp.minimum(amin, a0), step_norm, box2, phi2)

    init = (x_init, contacts, stats, jnp.int32(0), jnp.bool_(False), jnp.int32(0), jnp.int32(0),
            jnp.asarray(1.0, x_init.dtype), jnp.asarray(jnp.inf, x_init.dtype), (x_init, x_init),
            potential(contacts)(x_init))
    x, cs, st, it, done, code, lst, amin, step, _, _ = jax.lax.while_loop(cond, body, init)
    code = code | jnp.where(done | (code != 0), 0, int(StepCode.ITERATION_CAP)).astype(jnp.int32)
    return x, cs, SolveInfo(code, it, lst, amin, step, st)

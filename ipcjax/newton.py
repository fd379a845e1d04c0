"""The Newton solve of one timestep: direction, conservative step bound, Armijo line search.

One bounded ``lax.while_loop`` over a :class:`NewtonState`; each iteration

1. assembles ∇Φ and the PSD Hessian H over the free DOFs (FP64) as element blocks
   (:func:`ipcjax.potential.gradient_and_blocks`),
2. solves H Δx = −∇Φ with the linear solver object ``config.linear_solver`` names
   (:mod:`ipcjax.linear_solvers`: dense equilibrated Cholesky, host sparse LDLᵀ, or
   block-Jacobi CG); a failed factorization, or CG short of its tolerance, stops the
   solve with ``FACTORIZATION_FAILED``,
3. stops after this iteration when max|Δx| < tolerance (m) — the last small step is
   still taken when the line search accepts it,
4. makes sure the contact candidates cover the swept boxes x → x + Δx (complete for
   every trial point of the line search, since trial points lie on that segment): the
   set of the last query, made with an extra ``config.skin`` (1.5 mm) of search width, is
   reused while every particle's swept box stays within skin/2 of the box it was
   queried with; otherwise the candidates are queried again,
5. bounds the step along each candidate's current separating normal
   (:func:`ipcjax.line_search.step_bound`), and
6. backtracks from that bound until Φ(x+αΔx) ≤ Φ(x) + 10⁻⁴ α ∇Φ·Δx (≤ 48 halvings,
   :func:`ipcjax.line_search.armijo`).

Steps 5 and 6 run over the candidate rows that can come within d̂ along x → x + Δx
(:func:`ipcjax.line_search.reach_contacts`, compacted into ``Capacity.active`` slots):
every other row has a barrier of exactly 0 and a step bound of exactly 1 there, so
bound and Φ are the same as over every row, Φ up to the order of its sum. When more rows
can reach than the slots hold, that iteration uses every candidate row instead.

Every function takes the step's :class:`~ipcjax.problem.StepProblem` beside x and the
contact set.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ipcjax import candidates as _cand
from ipcjax.line_search import armijo, reach_contacts, step_bound
from ipcjax.linear_solvers import linear_solver
from ipcjax.model import Config, Model
from ipcjax.potential import (
    ContactSet, StencilGeometry, gradient_and_blocks, incremental_potential, stencil_geometry,
)
from ipcjax.problem import StepProblem
from ipcjax.result import StepCode, set_code


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


def query_contacts(x_start, x_end, model: Model, config: Config, capacity, *, skin=0.0):
    """Candidates for the swept boxes x_start → x_end as a :class:`ContactSet` plus stats.

    ``skin`` (m) widens the search beyond d̂ + min_gap so the set can be reused while every
    particle stays within skin/2 of its queried box (see :func:`newton_solve`).
    """
    c = _cand.find_candidates(x_start, x_end, model.topology, config.dhat + skin, config.min_gap, capacity=capacity)
    idx, kind, valid = _cand.stencils(c, model.topology)
    blocks = (c.vt.shape[0], c.ee.shape[0], c.sf.shape[0], c.ss.shape[0])  # stencils' row order
    return ContactSet(idx, kind, valid, blocks), CandidateStats.of(c)


def solve_direction(x, problem: StepProblem, contacts: ContactSet, *, geometry: StencilGeometry | None = None,
                    active: int | None = None):
    """∇Φ, the Newton direction over the free DOFs, its success flag and the assembly's
    active-row count, by the linear solver ``config.linear_solver`` names (``active``: see
    :func:`~ipcjax.potential.gradient_and_blocks`)."""
    g, hb = gradient_and_blocks(x, problem, contacts, geometry=geometry, active=active)
    solver = linear_solver(problem.config)
    dx, ok, _ = solver.direction(g, solver.init(hb))
    return g, dx, ok, hb.n_active


class SolveInfo(NamedTuple):
    code: jnp.ndarray            # () int32 StepCode bits
    iterations: jnp.ndarray      # () int32 Newton iterations
    line_search_trials: jnp.ndarray  # () int32
    min_step_bound: jnp.ndarray  # () smallest ccd α₀ over the iterations
    last_step_norm: jnp.ndarray  # () max|Δx| of the last direction, m
    stats: CandidateStats


class NewtonState(NamedTuple):
    """The carry of the Newton ``while_loop`` (N particles, M candidate rows)."""

    x: jnp.ndarray               # (N, 3) iterate, m (FP64)
    contacts: ContactSet         # (M rows) candidates of the last query, complete for box ± skin/2
    stats: CandidateStats        # largest candidate counts seen, overflow
    iteration: jnp.ndarray       # () int32 Newton iterations done
    converged: jnp.ndarray       # () bool: the last direction was below tolerance
    code: jnp.ndarray            # () int32 StepCode bits
    trials: jnp.ndarray          # () int32 line-search trials, summed
    min_bound: jnp.ndarray       # () smallest step bound α₀ so far
    step_norm: jnp.ndarray       # () max|Δx| of the last direction, m
    box: tuple                   # ((N, 3), (N, 3)) swept box of the last query, m
    phi: jnp.ndarray             # () Φ(x), J


def newton_solve(x_init, problem: StepProblem, contacts: ContactSet, stats: CandidateStats, *, capacity):
    """Minimise Φ from x_init (feasible). Returns (x*, contacts at x*, SolveInfo).

    ``contacts`` must have been queried at x_init with ``skin=config.skin``; ``capacity``
    (static) sizes the candidate queries and the active rows.
    """
    model, config = problem.model, problem.config
    F = model.n_free
    fp = model.free_particles

    def to_full(v):
        return jnp.zeros_like(x_init).at[fp].set(v.reshape(F, 3))

    half_skin = 0.5 * config.skin
    radius, min_gap = model.radius, config.min_gap
    active = active_size(capacity)

    def potential(contacts):
        return lambda z: incremental_potential(z, problem, contacts)

    def cond(s: NewtonState):
        return (~s.converged) & (s.code == 0) & (s.iteration < config.max_newton)

    def body(s: NewtonState):
        # s.phi = Φ(x), carried from the line search that accepted x: Φ does not depend on
        # which complete candidate set evaluates it, since stencils beyond d̂ add exactly 0
        x, cs, box, phi_x = s.x, s.contacts, s.box, s.phi
        geom = stencil_geometry(x, cs, radius, min_gap)
        g, dxf, fact_ok, n_active = solve_direction(x, problem, cs, geometry=geom, active=active)
        # more active contact rows than Capacity.active: the direction misses some; stop
        # with the overflow (the host grows the capacity and redoes the step)
        st = s.stats.with_active(n_active, active)
        over = st.overflow
        dx = to_full(dxf)
        step_norm = jnp.max(jnp.abs(dxf), initial=0.0)
        converged = fact_ok & ~over & (step_norm < problem.controls.tolerance)

        # both branches: (x, contacts, stats, trials, step bound α₀, code, box, Φ(x))
        def move(_):
            lo, hi = jnp.minimum(x, x + dx), jnp.maximum(x, x + dx)
            inside = jnp.all(lo >= box[0] - half_skin) & jnp.all(hi <= box[1] + half_skin)

            def requery(_):
                c2, s2 = query_contacts(x, x + dx, model, config, capacity, skin=config.skin)
                return c2, st.merge(s2), (lo, hi), stencil_geometry(x, c2, radius, min_gap)

            cs2, st2, box2, geom2 = jax.lax.cond(inside, lambda _: (cs, st, box, geom), requery, None)
            slope = jnp.dot(g, dxf)

            def over_all_rows(_):
                a0 = step_bound(x, dx, cs2, problem, geometry=geom2)
                return (a0,) + armijo(potential(cs2), x, dx, config, phi0=phi_x, slope=slope, alpha0=a0)

            if active is None or active >= cs2.idx.shape[0]:
                a0, a, k, ok, phi_a = over_all_rows(None)
            else:
                sub, sgeom, n_reach = reach_contacts(dx, cs2, geom2, config.dhat, active)

                def over_reach(_):
                    a0 = step_bound(x, dx, sub, problem, geometry=sgeom)
                    phi = potential(sub)  # Φ(x) on the same rows, so both sides of Armijo sum alike
                    return (a0,) + armijo(phi, x, dx, config, phi0=phi(x), slope=slope, alpha0=a0)

                a0, a, k, ok, phi_a = jax.lax.cond(n_reach <= active, over_reach, over_all_rows, None)
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
        code2 = set_code(code2, StepCode.FACTORIZATION_FAILED, unless=fact_ok | over)
        code2 = set_code(code2, StepCode.CAPACITY_OVERFLOW, where=over)
        code2 = set_code(code2, StepCode.NON_FINITE, unless=jnp.all(jnp.isfinite(x2)))
        return NewtonState(x=x2, contacts=cs2, stats=st2, iteration=s.iteration + 1, converged=converged,
                           code=code2, trials=s.trials + k, min_bound=jnp.minimum(s.min_bound, a0),
                           step_norm=step_norm, box=box2, phi=phi2)

    init = NewtonState(x=x_init, contacts=contacts, stats=stats, iteration=jnp.int32(0), converged=jnp.bool_(False),
                       code=jnp.int32(0), trials=jnp.int32(0), min_bound=jnp.asarray(1.0, x_init.dtype),
                       step_norm=jnp.asarray(jnp.inf, x_init.dtype), box=(x_init, x_init),
                       phi=potential(contacts)(x_init))
    s = jax.lax.while_loop(cond, body, init)
    code = set_code(s.code, StepCode.ITERATION_CAP, unless=s.converged | (s.code != 0))
    return s.x, s.contacts, SolveInfo(code, s.iteration, s.trials, s.min_bound, s.step_norm, s.stats)

"""The Newton solve of one timestep: direction, conservative step bound, Armijo line search.

One bounded ``lax.while_loop`` over a :class:`NewtonState`. Its first pass queries the
candidates at x₀ (with ``config.skin``), takes their gaps (returned: a gap ≤ 0 is an
initial overlap) and freezes the lagged friction set from the same closest points; then
each iteration

1. assembles ∇Φ and the PSD Hessian H over the free DOFs (FP64) as element blocks
   (:func:`ipcjax.potential.gradient_and_blocks`); with ``config.newton_tangent =
   "exact_first"`` the membrane's blocks are its exact element Hessians
   (:data:`~ipcjax.potential.EXACT_FIRST`), the rest projected,
2. solves H Δx = −∇Φ with the linear solver object ``config.linear_solver`` names
   (:mod:`ipcjax.linear_solvers`: dense equilibrated Cholesky, sparse Cholesky, or
   block-Jacobi CG); with ``"exact_first"``, where that solve fails (H not positive
   definite), H with those blocks projected (:func:`~ipcjax.potential.projected_blocks`)
   is solved instead, and ``SolveInfo.projected`` counts it; a solve whose
   :class:`~ipcjax.result.LinearStatus` is not SUCCESSFUL (a failed factorization, CG
   short of its tolerance) stops the solve with ``FACTORIZATION_FAILED``,
3. stops after this iteration when max|Δx| < tolerance (m) — the last small step is
   still taken when the line search accepts it; a direction with max|Δx| above
   ``config.max_direction`` (m; ∞ by default) is then scaled down to it, so that steps
   4–6 see the shorter segment,
4. makes sure the contact candidates cover the swept boxes x → x + Δx (complete for
   every trial point of the line search, since trial points lie on that segment): the
   set of the last query, made with an extra ``config.skin`` (1.5 mm) of search width, is
   reused while every particle's swept box stays within skin/2 of the box it was
   queried with; otherwise the candidates are queried again,
5. bounds the step along each candidate's current separating normal
   (:func:`ipcjax.line_search.step_bound`), and
6. backtracks from that bound until Φ(x+αΔx) ≤ Φ(x) + 10⁻⁴ α ∇Φ·Δx (≤ 48 halvings,
   :func:`ipcjax.line_search.armijo`); with ``config.line_search_expansions`` > 0, a full
   step taken at the first trial that lowered Φ by ≥ :data:`~ipcjax.line_search.EXPAND_RATIO`
   of |∇Φ·Δx| is doubled while Φ keeps falling (:func:`ipcjax.line_search.expand`),
   within the step bound and the candidates' box ± skin/2 of the longer segment, so
   steps 4 and 5 hold for it too (docs/design.md).

Only a few of the M candidate rows matter to an iteration (at the pouch bag's tie 475 of
14,445 lie inside d̂). With ``Capacity.active`` below M, an iteration does not look at
every row: the solve keeps a reference — the rows' gaps at a recent iterate, taken at
x_init, after each requery, and again whenever the bound below lets more rows through
than the slots hold — and bounds each row's gap at x from below by it
(:func:`ipcjax.line_search.gap_lower_bound`). Step 1 assembles the rows whose bound is
below d̂, compacted into ``Capacity.active`` slots (rows beyond d̂ add exactly 0 to ∇Φ
and H; more rows inside d̂ than slots is a ``CAPACITY_OVERFLOW``, and the host grows the
capacity). Steps 5 and 6 run over the rows whose bound is below d̂ + 2·max‖Δxᵢ‖ of their
stencil (:func:`ipcjax.line_search.reach_contacts`): every other row has a barrier of
exactly 0 and a step bound of exactly 1 along the whole segment, so bound and Φ are
those over every row, Φ up to the order of its sum. More rows in reach than slots (by
the exact gaps: the reference is retaken at x first) shortens the segment to
x → x + sΔx, just short of the first row that would not fit
(:func:`ipcjax.line_search.reach_scale`), and steps 5 and 6 run on that; only where the
rows inside d̂ take more than half the slots is it a ``CAPACITY_OVERFLOW`` like more rows
inside d̂, and the host grows the slots to hold them.
Each Armijo comparison takes Φ(x) on the same rows as its trial points. Both sets are
compacted kind by kind (:func:`ipcjax.line_search.compact_contacts`: VT, EE, SF and SS rows
in slots of their own, :func:`ipcjax.capacity.kind_slots` of ``Capacity.active``), so each
row computes only its own kind's closest point; "more rows than slots" then means more
than ``Capacity.active`` in all or more of one kind than its slots, and the count the host
grows the capacity by is :func:`ipcjax.line_search.slots_needed`.

Every function takes the step's :class:`~ipcjax.problem.StepProblem` beside x and the
contact set.

Each pass of the loop runs one phase of an iteration (a switch): QUERY (the
step-start query and every requery), DIRECTION (steps 1–3) and SEARCH (steps 5–6). So the
candidate query, the largest piece of the program after the closest-point code, is
compiled once, not once before the loop and once in it: a step program's LLVM code is
13 % smaller (docs/benchmarks.md "One copy of the candidate query"). The gaps over every
candidate row are compiled once too: QUERY takes them for the reference, for the
overlap check and for the friction set, retakes the reference when DIRECTION asks it to,
and, as the solve's last pass, takes them at x* rounded to FP32 (the storage recheck,
``SolveInfo.rounded_gap``). A direction
whose swept box leaves the last query's box ± skin/2 is carried, unchanged, through QUERY
to SEARCH, so the iterates are bit for bit those of a loop that ran a whole iteration per
pass. The switch is :func:`ipcjax.lockstep.switch`: a ``lax.switch`` here, and under
``vmap`` (an ensemble) it runs only the phases some member is in, where ``lax.switch``
would run all three for every member on every pass; the same for QUERY's choice between
a query and keeping the candidates (a retaken reference, the last pass's recheck, and the
step start on a set carried over from the last step: :func:`carried_solve`).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ipcjax import candidates as _cand
from ipcjax import distance as _dist
from ipcjax import lockstep
from ipcjax.line_search import (EXPAND_RATIO, armijo, box_limit, compact_contacts, expand, gap_lower_bound,
                                block_counts, reach_contacts, reach_need, reach_scale,
                                slots_needed, step_bound)
from ipcjax.linear_solvers import linear_solver
from ipcjax.model import Config, Model
from ipcjax.potential import EXACT_FIRST, gradient_and_blocks, projected_blocks
from ipcjax.used_rows import line_search_potential
from ipcjax.problem import FrictionSet, StepProblem
from ipcjax.result import StepCode, set_code
from ipcjax.stencils import ContactSet, contact_gaps, stencil_geometry, used_row_gaps


class CandidateStats(NamedTuple):
    """Largest candidate counts seen (for host reallocation) and whether any query overflowed."""

    n_vt: jnp.ndarray
    n_ee: jnp.ndarray
    n_sf: jnp.ndarray
    overflow: jnp.ndarray
    work: jnp.ndarray  # (2, 3) intermediate grid-buffer entries needed (see candidates.Candidates)
    n_active: jnp.ndarray  # the Capacity.active the compacted contact rows needed (line_search.slots_needed)

    @staticmethod
    def of(c) -> "CandidateStats":
        return CandidateStats(c.n_vt, c.n_ee, c.n_sf, c.overflow, c.work, jnp.int32(0))

    def merge(self, other: "CandidateStats") -> "CandidateStats":
        return CandidateStats(jnp.maximum(self.n_vt, other.n_vt), jnp.maximum(self.n_ee, other.n_ee),
                              jnp.maximum(self.n_sf, other.n_sf), self.overflow | other.overflow,
                              jnp.maximum(self.work, other.work), jnp.maximum(self.n_active, other.n_active))

    def with_active(self, n_active, size) -> "CandidateStats":
        """Record the ``Capacity.active`` some compacted rows needed; above ``size`` (not None) it
        is an overflow."""
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


class SolveInfo(NamedTuple):
    code: jnp.ndarray            # () int32 StepCode bits
    iterations: jnp.ndarray      # () int32 Newton iterations
    line_search_trials: jnp.ndarray  # () int32
    min_step_bound: jnp.ndarray  # () smallest ccd α₀ over the iterations
    last_step_norm: jnp.ndarray  # () max|Δx| of the last direction, m
    stats: CandidateStats
    expansions: jnp.ndarray      # () int32 iterations whose step went beyond α = 1 (Config.line_search_expansions)
    rounded_gap: jnp.ndarray     # () smallest gap (m) at x* rounded to FP32, over the last candidate set
    queries: jnp.ndarray         # () int32 candidate queries made: the step start's (0 on a carried set) and requeries
    projected: jnp.ndarray       # () int32 directions whose exact tangent failed to factorize and that took the
                                 # projected one (Config.newton_tangent="exact_first"; 0 otherwise)


class CandidateCarry(NamedTuple):
    """A solve's last candidate set, handed to the next step's solve (:func:`carried_solve`)."""

    contacts: ContactSet         # the candidates of the last query, complete for box ± skin/2
    box: tuple                   # ((N, 3), (N, 3)) the swept box that query was made for, m
    stats: CandidateStats        # that query's counts (no overflow, n_active 0)
    held: jnp.ndarray            # () bool: holds a solved step's set; False: empty, the next solve queries


#: What a pass of the Newton loop does (:class:`NewtonState`'s ``phase``).
QUERY, DIRECTION, SEARCH = 0, 1, 2


class NewtonState(NamedTuple):
    """The carry of the Newton ``while_loop`` (N particles, M candidate rows).

    A pass of the loop is one of three phases, so that each is compiled once: QUERY (the
    candidates of the swept box x → x + dx and their gaps at x: the step-start query at
    x₀, which also freezes the friction set, every requery, and the reference gaps retaken
    without a query), DIRECTION (assembly and linear solve) and SEARCH (step bound and line
    search along dx). A Newton iteration is DIRECTION, then QUERY when x + dx leaves the
    last query's box ± skin/2, then SEARCH; a DIRECTION or a SEARCH whose reference lets
    more rows through (near x, or in reach of the segment) than the slots hold goes through
    QUERY to retake it at x first, and the last iteration ends in a QUERY pass that takes
    the gaps at x rounded to FP32.
    """

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
    ref_x: jnp.ndarray           # (N, 3) where ref_gap was taken, m
    ref_gap: jnp.ndarray         # (M,) gaps of the contact rows at ref_x (+∞ for padding), m
    expansions: jnp.ndarray      # () int32 iterations that took an expanded step (α > 1)
    phase: jnp.ndarray           # () int32 the next pass: QUERY, DIRECTION or SEARCH
    dx: jnp.ndarray              # (N, 3) the direction waiting for its query and search, m
    slope: jnp.ndarray           # () ∇Φ·Δx of that direction
    friction: FrictionSet        # the lagged friction set, frozen by the step-start query
    contacts0: ContactSet        # the step-start candidates
    gaps0: jnp.ndarray           # (M,) the step-start contacts' gaps at x₀ (+∞ for padding), m
    started: jnp.ndarray         # () bool: the step-start query is done
    ref_here: jnp.ndarray        # () bool: ref_x is x (the reference was taken at this iterate)
    regap: jnp.ndarray           # () int32: 0, or the next QUERY pass only retakes the reference gaps and
                                 # goes on to this phase (DIRECTION, or SEARCH with the same direction)
    recheck: jnp.ndarray         # () bool: the next QUERY pass is the last: the gaps at x rounded to FP32
    rounded_gap: jnp.ndarray     # () the smallest of those gaps, m
    queries: jnp.ndarray         # () int32 candidate queries made so far
    projected: jnp.ndarray       # () int32 directions taken with the projected tangent after the exact one failed


def newton_solve(x_init, problem: StepProblem, make_friction, *, capacity):
    """Minimise Φ from x_init (feasible). Returns (x*, contacts at x*, SolveInfo,
    step-start contacts, their gaps at x_init); a step-start gap ≤ 0 is an initial overlap.

    The loop's first pass queries the candidates at x_init with ``skin=config.skin``
    (``capacity``, static, sizes them and the active rows), takes their
    :func:`~ipcjax.stencils.used_row_gaps` ``(g, w, n)`` and freezes the friction set
    ``make_friction(contacts, (g, w, n))`` (a :class:`~ipcjax.problem.FrictionSet`), which
    replaces ``problem.context.friction`` for the whole solve.
    """
    return carried_solve(x_init, problem, make_friction, capacity=capacity, carry=None)[:5]


def empty_carry(x, model: Model, config: Config, capacity) -> CandidateCarry:
    """A :class:`CandidateCarry` that holds nothing, shaped for ``capacity``: the first step's."""
    contacts, stats = jax.eval_shape(lambda a: query_contacts(a, a, model, config, capacity, skin=config.skin), x)
    zeros = lambda tree: jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), tree)
    return CandidateCarry(zeros(contacts), (x, x), zeros(stats), jnp.bool_(False))


def carried_solve(x_init, problem: StepProblem, make_friction, *, capacity, carry: CandidateCarry | None):
    """:func:`newton_solve` that starts from the last step's candidate set where that holds:
    returns its five results and the :class:`CandidateCarry` for the next step.

    The step-start query is skipped when ``carry`` holds a set and x_init lies inside its
    box ± skin/2: a query made with ``config.skin`` holds every stencil that can come within
    d̂ while each particle stays there (the loop's reuse test), so that set is complete at
    x_init as the fresh query is, and the first direction's swept box is tested against that
    box as every later one is. The gaps at x_init, the friction set, the step-start contacts
    and the overlap check are then taken on it; they are the fresh query's up to the order
    of the rows. ``carry`` must come from a solve of the same model, config and capacity
    (:func:`ipcjax.step.advance` keeps it so); None queries, as :func:`newton_solve` does.
    The carry returned holds the solve's last set when the solve succeeded, nothing
    otherwise.
    """
    model, config = problem.model, problem.config
    F = model.n_free
    fp = model.free_particles

    def to_full(v):
        return jnp.zeros_like(x_init).at[fp].set(v.reshape(F, 3))

    half_skin = 0.5 * config.skin
    radius, min_gap, dhat = model.radius, config.min_gap, config.dhat
    active = active_size(capacity)
    solver = linear_solver(config)
    exact_first = config.newton_tangent == "exact_first"
    exact = EXACT_FIRST if exact_first else ()

    def query(a, b):
        return query_contacts(a, b, model, config, capacity, skin=config.skin)

    contacts_shape, stats_shape = jax.eval_shape(query, x_init, x_init)
    zeros = lambda tree: jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), tree)
    contacts_none = zeros(contacts_shape)
    # with Capacity.active below the candidate rows, an iteration looks at the few rows
    # that can matter (module docstring); otherwise at every row
    compact = active is not None and active < contacts_none.idx.shape[0]

    def problem_of(s):
        return problem._replace(context=problem.context._replace(friction=s.friction))

    def potential(pb, contacts):  # Φ for the line search: its barrier over the used rows
        return lambda z: line_search_potential(z, pb, contacts)

    def cond(s: NewtonState):
        return (s.phase != DIRECTION) | ((~s.converged) & (s.code == 0) & (s.iteration < config.max_newton))

    def rows_needed(mask, blocks):
        """The ``Capacity.active`` the loop's compacted sets need for the rows where ``mask``
        holds in a set with these ``blocks`` (the candidates', or a compacted set's slots):
        their number, or more where the sets are blocked by kind
        (:func:`~ipcjax.line_search.slots_needed`)."""
        if contacts_none.blocks is None:
            return jnp.sum(mask, dtype=jnp.int32)
        return slots_needed(block_counts(mask, blocks), contacts_none.blocks)

    def near_rows(s: NewtonState):
        """The rows that may lie inside d̂ at s.x, by the reference's lower bound."""
        return gap_lower_bound(s.x, s.ref_x, s.ref_gap, s.contacts) < dhat

    def assemble(s: NewtonState, pb):
        """∇Φ and the Hessian blocks at s.x (the membrane's exact ones with ``exact_first``),
        and the assembly's active-row count."""
        x, cs = s.x, s.contacts
        if not compact:
            g, hb = gradient_and_blocks(x, pb, cs, geometry=stencil_geometry(x, cs, radius, min_gap), exact=exact)
            return g, hb, hb.n_active
        sub, n_near = compact_contacts(cs, near_rows(s), active)
        geom = stencil_geometry(x, sub, radius, min_gap)
        g, hb = gradient_and_blocks(x, pb, sub, geometry=geom, exact=exact)
        d, _ = jax.vmap(_dist.stencil_distance)(geom.X, geom.w)
        n_in = rows_needed(sub.valid & (d - geom.off < dhat), sub.blocks)
        # n_near > active only with the reference at x (see direction_phase), where it is
        # the exact count inside d̂
        n_bar = jnp.where(n_near > active, n_near, n_in)
        return g, hb, jnp.maximum(pb.context.friction.count, n_bar)

    def finish(s: NewtonState, x2, *, cs2, st2, k, a0, code2, box2, rx2, rg2, a_taken, fact_ok, over):
        """The end of an iteration, searched or stopped at its direction (``fact_ok``,
        ``over``: the direction's solve succeeded, its assembly overflowed the slots)."""
        code2 = jnp.where(s.converged, code2 & int(StepCode.CAPACITY_OVERFLOW), code2)
        code2 = set_code(code2, StepCode.FACTORIZATION_FAILED, unless=fact_ok | over)
        code2 = set_code(code2, StepCode.CAPACITY_OVERFLOW, where=over)
        code2 = set_code(code2, StepCode.NON_FINITE, unless=jnp.all(jnp.isfinite(x2)))
        # the solve ends after this iteration (cond): one last QUERY pass rechecks the gaps
        done = s.converged | (code2 != 0) | (s.iteration + 1 >= config.max_newton)
        return s._replace(x=x2, contacts=cs2, stats=st2, iteration=s.iteration + 1, code=code2,
                          trials=s.trials + k, min_bound=jnp.minimum(s.min_bound, a0), box=box2, ref_x=rx2,
                          ref_gap=rg2, phase=jnp.where(done, QUERY, DIRECTION).astype(jnp.int32), recheck=done,
                          ref_here=jnp.bool_(False),
                          expansions=s.expansions + ((code2 == 0) & (a_taken > 1.0)).astype(jnp.int32))

    def query_phase(s: NewtonState):
        """Candidates of the swept box x → x + dx and their gaps at x (the reference); at the
        start also the friction set (from the same closest points), the step-start contacts
        and their gaps. With ``s.regap`` only the reference is retaken, on the same
        candidates, and the loop goes on to the phase it names (the direction, or the
        search of the direction it has); with ``s.recheck`` (the solve's last pass) only
        the smallest gap at x rounded to FP32 is taken, on the same candidates: the storage
        recheck of :func:`ipcjax.step.recheck_rounded`. So the gaps over every candidate row
        are compiled once."""
        first, regap, recheck = ~s.started, s.regap, s.recheck
        x = s.x
        lo, hi = jnp.minimum(x, x + s.dx), jnp.maximum(x, x + s.dx)
        keep = (regap != 0) | recheck | (first & reuse0)
        s = s._replace(queries=s.queries + (~keep).astype(jnp.int32))
        c2, s2 = lockstep.switch(keep.astype(jnp.int32),
                                 [lambda _: query(x, jnp.where(first, x, x + s.dx)), lambda kept: kept],
                                 (s.contacts, s.stats))
        at = jnp.where(recheck, x.astype(jnp.float32).astype(x.dtype), x)
        at_x = used_row_gaps(at, c2, radius, min_gap)  # one copy of the closest-point code for all
        g2 = at_x[0]
        return jax.lax.cond(recheck, lambda: s._replace(rounded_gap=jnp.min(g2, initial=jnp.inf),
                                                        recheck=jnp.bool_(False), phase=jnp.int32(DIRECTION)),
                            lambda: queried(s, c2, s2, at_x, (lo, hi)))

    def queried(s: NewtonState, c2, s2, at_x, swept):
        """The state after a query (or a reference retake) of the ``swept`` box (lo, hi) and
        the gaps ``at_x`` at s.x."""
        first, regap, x, g2 = ~s.started, s.regap, s.x, at_x[0]
        friction = jax.lax.cond(first, lambda: make_friction(c2, at_x), lambda: s.friction)
        pick = lambda a, b: jax.tree_util.tree_map(lambda u, v: jnp.where(first, u, v), a, b)
        kept = (regap != 0) | (first & reuse0)  # no query: the box stays the last query's
        return s._replace(contacts=c2, stats=pick(s2, s.stats.merge(s2)),
                          box=jax.tree_util.tree_map(lambda u, v: jnp.where(kept, u, v), s.box,
                                                     pick((x, x), swept)),
                          ref_x=x, ref_gap=g2, ref_here=jnp.bool_(True), regap=jnp.int32(0), friction=friction,
                          contacts0=pick(c2, s.contacts0), gaps0=jnp.where(first, g2, s.gaps0),
                          phase=jnp.where(first, DIRECTION, jnp.where(regap != 0, regap, SEARCH)).astype(jnp.int32),
                          started=jnp.bool_(True))

    def direction_phase(s: NewtonState):
        if not compact:
            return direction_of(s)
        # more rows near x than the slots by the reference's bound: retake the reference at x
        # first (a QUERY pass without a query), where the bound is the gap itself
        retake = (rows_needed(near_rows(s), s.contacts.blocks) > active) & ~s.ref_here
        return jax.lax.cond(retake, lambda s: s._replace(phase=jnp.int32(QUERY), regap=jnp.int32(DIRECTION)),
                            direction_of, s)

    def direction_of(s: NewtonState):
        x, ref_x, ref_gap = s.x, s.ref_x, s.ref_gap
        pb = problem_of(s)
        g, hb, n_active = assemble(s, pb)
        direction = solver.direction(g, solver.init(hb), name_failure=not exact_first)
        fell_back = jnp.bool_(False)
        if exact_first:
            # the exact membrane blocks failed to factorize (not positive
            # definite, or any other status): the projected tangent, whose status stands
            fell_back = ~direction.ok
            direction = lockstep.switch(fell_back.astype(jnp.int32), [
                lambda d: d, lambda d: solver.direction(g, solver.init(projected_blocks(x, pb, hb, EXACT_FIRST)))],
                direction)
        dxf, fact_ok = direction.value, direction.ok
        # more active contact rows than Capacity.active: the direction misses some; stop
        # with the overflow (the host grows the capacity and redoes the step)
        st = s.stats.with_active(n_active, active)
        over = st.overflow
        step_norm = jnp.max(jnp.abs(dxf), initial=0.0)
        converged = fact_ok & ~over & (step_norm < problem.controls.tolerance)
        # a direction longer than config.max_direction is cut to it (after the stopping test)
        cap = config.max_direction
        dxf = dxf * jnp.where(step_norm > cap, cap / jnp.where(step_norm > cap, step_norm, 1.0), 1.0)
        dx = to_full(dxf)
        slope = jnp.dot(g, dxf)
        lo, hi = jnp.minimum(x, x + dx), jnp.maximum(x, x + dx)
        inside = jnp.all(lo >= s.box[0] - half_skin) & jnp.all(hi <= s.box[1] + half_skin)
        s2 = s._replace(stats=st, converged=converged, step_norm=step_norm, dx=dx, slope=slope,
                        projected=s.projected + fell_back.astype(jnp.int32))

        def stay(s2):
            # a failed direction or an overflow: the iteration ends here, x where it is
            return finish(s2, x, cs2=s2.contacts, st2=st, k=jnp.int32(0), a0=jnp.asarray(1.0, x.dtype),
                          code2=jnp.int32(0), box2=s2.box, rx2=ref_x, rg2=ref_gap, a_taken=jnp.asarray(0.0, x.dtype),
                          fact_ok=fact_ok, over=over)

        # x + Δx inside the last query's box ± skin/2: search now, else query first
        return jax.lax.cond(fact_ok & ~over,
                            lambda s2: s2._replace(phase=jnp.where(inside, SEARCH, QUERY).astype(jnp.int32)),
                            stay, s2)

    def search_phase(s: NewtonState):
        if not compact:
            return search_on(s, None)
        # more rows in reach than slots by the reference's bound: retake the reference at x
        # first (a QUERY pass without a query) and search the same direction after it
        lb = gap_lower_bound(s.x, s.ref_x, s.ref_gap, s.contacts)
        need = reach_need(s.dx, s.contacts, lb, dhat)
        retake = (need > active) & ~s.ref_here
        return jax.lax.cond(retake, lambda s, lb, need: s._replace(phase=jnp.int32(QUERY), regap=jnp.int32(SEARCH)),
                            search_on, s, lb, need)

    def search_on(s: NewtonState, lb2, need=None):
        """The step bound and line search along s.dx (``lb2``: the rows' gap lower bounds at
        s.x from the reference, and ``need`` their reach set's slots, when compacting)."""
        x, dx, slope, converged = s.x, s.dx, s.slope, s.converged
        pb = problem_of(s)
        cs2, st2, box2, rx2, rg2 = s.contacts, s.stats, s.box, s.ref_x, s.ref_gap

        def over_all_rows(cs2):
            a0 = step_bound(x, dx, cs2, pb)
            phi = potential(pb, cs2)
            phi0 = phi(x)
            return (a0,) + armijo(phi, x, dx, config, phi0=phi0, slope=slope, alpha0=a0) + (phi0,)

        def expand_step(cs2, box2, lb2, *, phi0, val, a, k):
            """(α, trials) after :func:`expand` from the accepted α = 1: up to 2^E, no further than
            the candidates' box ± half the skin and the step bound along that longer segment.
            Φ(x) and Φ(x + Δx) are the line search's: the rows that the longer segment adds keep
            gaps ≥ d̂ for α ≤ 1, so their barrier is exactly 0 there."""
            reach = jnp.minimum(2.0 ** config.line_search_expansions, box_limit(x, dx, box2, half_skin))
            if compact:
                sub, n_reach = reach_contacts(reach * dx, cs2, lb2, dhat, active)
                fits = n_reach <= active
            else:
                sub, fits = cs2, True
            bound = step_bound(x, reach * dx, sub, pb)
            phi = potential(pb, sub)
            # more rows in reach than slots: no expansion (it is optional, so no overflow)
            cap = jnp.where(fits, reach * bound, 0.0)
            a2, _, k2 = jax.lax.cond(
                cap >= 2.0,
                lambda: expand(phi, x, dx, config, phi0=phi0, phi1=val, slope=slope, alpha_max=cap,
                               doublings=config.line_search_expansions),
                lambda: (a, jnp.zeros((), x.dtype), jnp.int32(0)))
            return a2, k + k2

        if compact:
            # a segment whose reach set overflows the slots is cut where it fits (reach_scale)
            cut = reach_scale(dx, cs2, lb2, dhat, active, need=need)
            sub, n_reach = reach_contacts(cut * dx, cs2, lb2, dhat, active)
            a0 = step_bound(x, cut * dx, sub, pb)
            phi = potential(pb, sub)  # Φ(x) on the same rows, so both sides of Armijo sum alike
            phi0 = phi(x)
            a, k, ok, val = armijo(phi, x, cut * dx, config, phi0=phi0, slope=cut * slope, alpha0=a0)
            a0, a = cut * a0, cut * a  # along Δx
            # more rows in reach than slots: the bound and Φ above missed some; stop with
            # the overflow (the host grows the slots and redoes the step)
            st2 = st2.with_active(jnp.where(n_reach > active, n_reach, 0), active)
            over_reach = n_reach > active
        else:
            a0, a, k, ok, val, phi0 = over_all_rows(cs2)
            over_reach = jnp.bool_(False)
        if config.line_search_expansions:
            # a full step that fell much further than the Newton model said: try longer ones
            go = (ok & (k == 1) & (a0 >= 1.0) & ~converged & ~over_reach & (slope < 0)
                  & (val - phi0 <= EXPAND_RATIO * slope))
            a, k = jax.lax.cond(go, lambda: expand_step(cs2, box2, lb2, phi0=phi0, val=val, a=a, k=k),
                                lambda: (a, k))
        bad = (~ok) | (slope >= 0)
        code2 = jnp.where(st2.overflow, int(StepCode.CAPACITY_OVERFLOW),
                          jnp.where(a0 <= 0, int(StepCode.ZERO_STEP_BOUND),
                                    jnp.where(bad, int(StepCode.LINE_SEARCH_EXHAUSTED), 0))).astype(jnp.int32)
        x2 = jnp.where(code2 == 0, x + a * dx, x)
        return finish(s, x2, cs2=cs2, st2=st2, k=k, a0=a0, code2=code2, box2=box2, rx2=rx2, rg2=rg2, a_taken=a,
                      fact_ok=jnp.bool_(True), over=jnp.bool_(False))

    def body(s: NewtonState):
        # under vmap (an ensemble) only the phases some member is in run (ipcjax.lockstep)
        return lockstep.switch(s.phase, [query_phase, direction_phase, search_phase], s)

    gaps_shape = jax.eval_shape(lambda z, c: contact_gaps(z, c, radius, min_gap), x_init, contacts_none)
    friction_none = zeros(jax.eval_shape(make_friction, contacts_none, zeros(gaps_shape)))
    if carry is None:
        reuse0, contacts_start, stats_start, box_start = jnp.bool_(False), contacts_none, zeros(stats_shape), None
    else:
        box_start = carry.box
        reuse0 = (carry.held & jnp.all(x_init >= box_start[0] - half_skin)
                  & jnp.all(x_init <= box_start[1] + half_skin))
        contacts_start, stats_start = carry.contacts, carry.stats
    init = NewtonState(x=x_init, contacts=contacts_start, stats=stats_start, iteration=jnp.int32(0),
                       converged=jnp.bool_(False), code=jnp.int32(0), trials=jnp.int32(0),
                       min_bound=jnp.asarray(1.0, x_init.dtype), step_norm=jnp.asarray(jnp.inf, x_init.dtype),
                       box=(x_init, x_init) if box_start is None else box_start, ref_x=x_init,
                       ref_gap=jnp.zeros(contacts_none.idx.shape[0], x_init.dtype), expansions=jnp.int32(0),
                       phase=jnp.int32(QUERY), dx=jnp.zeros_like(x_init), slope=jnp.zeros((), x_init.dtype),
                       friction=friction_none, contacts0=contacts_none,
                       gaps0=jnp.zeros(contacts_none.idx.shape[0], x_init.dtype),
                       started=jnp.bool_(False), ref_here=jnp.bool_(False), regap=jnp.int32(0),
                       recheck=jnp.bool_(False), rounded_gap=jnp.asarray(jnp.inf, x_init.dtype),
                       queries=jnp.int32(0), projected=jnp.int32(0))
    s = jax.lax.while_loop(cond, body, init)
    code = set_code(s.code, StepCode.ITERATION_CAP, unless=s.converged | (s.code != 0))
    carry_out = CandidateCarry(s.contacts, s.box, s.stats._replace(overflow=jnp.bool_(False), n_active=jnp.int32(0)),
                               code == 0)
    return (s.x, s.contacts, SolveInfo(code, s.iteration, s.trials, s.min_bound, s.step_norm, s.stats, s.expansions,
                                            s.rounded_gap, s.queries, s.projected),
            s.contacts0, s.gaps0, carry_out)

"""How far along a Newton direction: the conservative step bound, then Armijo backtracking.

:func:`step_bound` gives the largest first trial α ∈ [0, 1] that keeps every candidate
stencil's gap positive along x + αΔx (docs/spec.md §4); :func:`armijo` backtracks from it
until Φ decreases enough. Both take the step's :class:`~ipcjax.problem.StepProblem`.
:func:`expand` doubles an accepted full step while Φ keeps falling (``Config.line_search_expansions``),
inside a step bound and a candidate box of its own (:func:`box_limit`).
:func:`reach_contacts` picks out the few candidate rows either of them can see along
x → x + Δx, so that both can run over those rows only (:mod:`ipcjax.newton`), and
:func:`reach_scale` shortens a segment whose rows would not fit their slots.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ipcjax import ccd as _ccd
from ipcjax import lockstep
from ipcjax.capacity import KIND_FLOOR, KIND_SLACK, kind_slots
from ipcjax.model import Config
from ipcjax.problem import StepProblem
from ipcjax.stencils import (ContactSet, StencilGeometry, active_rows, fold_used_rows, gather_stencils,
                             put_rows, stencil_geometry, stencil_offsets, stencil_weights)

#: Stencils re-bounded by conservative advancement per Newton iteration (the smallest
#: single bounds); the rest keep their single bound.
ADVANCE_STENCILS = 64

#: Rows per pass of :func:`step_bound`'s single bounds over a set blocked by kind.
BOUND_CHUNK = 64

#: Relative round-off of Φ (a sum of many terms, some with cancellation): a predicted
#: decrease below this fraction of |Φ(x)| cannot be resolved by comparing values of Φ.
PHI_ROUNDOFF = 1e-9


def gap_lower_bound(x, ref_x, ref_gap, contacts: ContactSet):
    """A lower bound of every candidate row's gap at x from its gap at a reference ``ref_x``.

    g(x) ≥ g(ref) − 2·max‖xᵢ − refᵢ‖ over the row's four particles: every point of a
    segment or triangle moves by at most its corners' largest displacement, so the
    distance between two primitives (or a sphere centre and a face) changes by at most
    twice that. ``ref_gap`` (M,): the gaps at ``ref_x`` (+∞ for padding rows), m.
    """
    drift2 = jnp.sum((x - ref_x) ** 2, axis=1)
    return ref_gap - 2.0 * jnp.sqrt(jnp.max(drift2[contacts.idx], axis=1))


def slots_needed(counts, blocks):
    """The smallest ``Capacity.active`` whose compacted sets hold ``counts`` rows (jittable).

    ``counts``: (4,) rows of each kind (VT, EE, SF, SS), each at most that kind's candidate
    rows ``blocks`` (static). The sets are blocked by kind (:func:`ipcjax.capacity.kind_slots`:
    max(⌈A·b/M⌉ + slack, ⌈A/floor⌉) slots for a kind of b of the M candidate rows), so the
    answer is the largest of the total and, for every kind with c > 0 rows, the smaller of
    the smallest A whose share holds them, ⌊(c − slack − 1)·M/b⌋ + 1 (0 where c ≤ slack),
    and the smallest A whose floor does, floor·(c − 1) + 1. A compaction into ``size`` slots
    holds every row exactly when this is ≤ ``size``.
    """
    total = sum(int(b) for b in blocks)
    need = jnp.sum(counts).astype(jnp.int32)
    for k, b in enumerate(blocks):
        if b == 0:
            continue
        c = counts[k].astype(jnp.int64)
        over = c - KIND_SLACK
        share = jnp.where(over > 0, (over - 1) * total // int(b) + 1, 0)
        floor = jnp.where(c > 0, KIND_FLOOR * (c - 1) + 1, 0)
        need = jnp.maximum(need, jnp.minimum(share, floor).astype(jnp.int32))
    return need


def block_counts(mask, blocks):
    """(4,) int32: rows where ``mask`` holds in each block of a set blocked by kind (``blocks``,
    static: a query's candidate rows, or a compacted set's slots, per kind)."""
    bounds = [0]
    for b in blocks:
        bounds.append(bounds[-1] + int(b))
    return jnp.stack([jnp.sum(mask[a:b], dtype=jnp.int32) for a, b in zip(bounds[:-1], bounds[1:])])


def compact_contacts(contacts: ContactSet, mask, size: int):
    """The rows of ``contacts`` where ``mask`` holds, compacted into ``size`` slots (static).

    Returns (contacts, count). With ``contacts.blocks`` (a query's candidate set) the rows
    are compacted kind by kind into :func:`ipcjax.capacity.kind_slots` of ``size``, and the
    result has those slots as its ``blocks``, so its closest points are computed with one
    formula per row (:func:`ipcjax.stencils.contact_weights`); ``count`` is
    :func:`slots_needed` of the rows of each kind. Without blocks, the rows fill ``size``
    slots in order (``blocks`` None) and ``count`` is their number. Either way the rows
    keep their order, unused slots are invalid, and the compacted set holds every row
    where ``mask`` holds exactly when count ≤ size.
    """
    if contacts.blocks is None:
        rows, taken, count = active_rows(mask, size)
        return ContactSet(contacts.idx[rows], contacts.kind[rows], taken), count
    slots = kind_slots(size, contacts.blocks)
    parts, start = [], 0
    for b, n in zip(contacts.blocks, slots):
        rows, taken, _ = active_rows(mask[start:start + b], n)
        parts.append((rows + start, taken))
        start += b
    rows = jnp.concatenate([r for r, _ in parts])
    taken = jnp.concatenate([t for _, t in parts])
    out = ContactSet(contacts.idx[rows], contacts.kind[rows], taken, slots)
    return out, slots_needed(block_counts(mask, contacts.blocks), contacts.blocks)


def reach_contacts(dx, contacts: ContactSet, gap, dhat, size: int):
    """The candidate rows that can matter anywhere on the segment x → x + Δx, compacted.

    A stencil whose gap at x is g and whose four particles move by at most m = max‖Δxᵢ‖
    keeps a gap ≥ g − 2αm at x + αΔx (see :func:`gap_lower_bound`). So a row with
    g ≥ d̂ + 2m has

    * a barrier of exactly 0 at every trial point α ∈ [0, 1] (B = 0 for gaps ≥ d̂), and
    * a single step bound of exactly 1: its approach along the normal is at most 2m < g
      (:func:`ipcjax.ccd.stencil_max_step`), as padding rows have.

    Φ along the segment and :func:`step_bound` over the rows with g < d̂ + 2m (the
    "reach set") are therefore those over every candidate row: the same bound, and Φ up
    to the order of its sum. ``gap`` (M,) may be any lower bound of the rows' gaps at x
    (:func:`gap_lower_bound`; padding rows +∞): the set only grows. At the tie of the
    pouch bag the reach set holds 475–620 of 14,445 candidate rows by the exact gaps, 619–712
    by the reference's lower bounds (docs/benchmarks.md).

    ``size`` (static): ``Capacity.active``, the slots of the compacted set (blocked by
    kind for a query's candidate set, see :func:`compact_contacts`). Returns (contacts,
    count); the set is complete only when count ≤ size. The Newton solve keeps it so: it
    cuts a segment whose set would not fit (:func:`reach_scale`), and where none can be cut
    it stops with a capacity overflow and the host grows the slots.
    """
    return compact_contacts(contacts, contacts.valid & (gap < dhat + 2.0 * _row_motion(dx, contacts)), size)


def reach_need(dx, contacts: ContactSet, gap, dhat):
    """The ``Capacity.active`` that :func:`reach_contacts` of the same arguments needs (its count)."""
    return _slots_of(contacts.valid & (gap < dhat + 2.0 * _row_motion(dx, contacts)), contacts)


def _slots_of(mask, contacts: ContactSet):
    if contacts.blocks is None:
        return jnp.sum(mask, dtype=jnp.int32)
    return slots_needed(block_counts(mask, contacts.blocks), contacts.blocks)


def _row_motion(dx, contacts: ContactSet):
    """(M,) the largest ‖Δxᵢ‖ over each row's particles, m."""
    return jnp.sqrt(jnp.max(jnp.sum(dx * dx, axis=1)[contacts.idx], axis=1))


def reach_scale(dx, contacts: ContactSet, gap, dhat, size: int, *, need=None):
    """The largest s ∈ (0, 1] whose segment x → x + sΔx has a reach set (:func:`reach_contacts`)
    that fits ``size`` slots: 1 when the whole segment's does.

    A row of gap g (a lower bound, as :func:`reach_contacts` takes) whose particles move by
    at most m along Δx is in the reach set of x → x + sΔx when g < d̂ + 2sm, that is from
    s > (g − d̂)/2m on (from s = 0 on when g < d̂). Where the whole segment's rows overflow
    the slots, of the whole set or of a kind's block (:func:`compact_contacts`), the
    segment is cut at the first entry that no longer fits: so its rows fit, and no row it
    leaves out can come within d̂ on it. A long direction with many primitives within a few
    of its lengths (a film lifted fast past the spheres) is then searched on a shorter
    segment, and the next Newton iteration goes on from there, instead of stopping the step
    with a capacity overflow that regrows every compacted set for the rest of a run
    (docs/design.md). Returns 1 where the set fits, and where the rows inside d̂ alone
    would take more than half the slots: those slots are short for the rows at x itself,
    and a cut would leave the segment only the few left (a crawl of tiny steps), so the
    caller's overflow stands and the host grows them. ``need``: :func:`reach_need` of the
    same arguments, where the caller has it.
    """
    if need is None:
        need = reach_need(dx, contacts, gap, dhat)

    def shorter():
        # the rows inside d̂ take more than half the slots: they are short, not the segment long
        tight = 2 * _slots_of(contacts.valid & (gap < dhat), contacts) > size
        m = _row_motion(dx, contacts)
        # where each row enters the reach set (0: inside d̂ already, ∞: never on Δx)
        enter = jnp.where(gap < dhat, 0.0, jnp.where(m > 0, (gap - dhat) / jnp.where(m > 0, 2.0 * m, 1.0), jnp.inf))
        enter = jnp.where(contacts.valid, enter, jnp.inf)

        def first_left_out(values, n):  # the (n+1)-th smallest entry: the first row n slots leave out
            return -jax.lax.top_k(-values, n + 1)[0][n] if values.shape[0] > n else jnp.inf

        cut = first_left_out(enter, size)
        if contacts.blocks is not None:
            start = 0
            for b, n in zip(contacts.blocks, kind_slots(size, contacts.blocks)):
                cut = jnp.minimum(cut, first_left_out(enter[start:start + b], n))
                start += b
        # a hair short of that entry, so that the set recomputed at sΔx leaves it out too
        return jnp.where((cut > 0) & (cut < 1) & ~tight, cut * (1.0 - 1e-9), 1.0).astype(dx.dtype)

    # a branch under vmap too (ipcjax.lockstep): the ensembles' members skip it alike
    return lockstep.switch((need > size).astype(jnp.int32), [lambda one: one, lambda one: shorter()],
                           jnp.ones((), dx.dtype))


def step_bound(x, dx, contacts: ContactSet, problem: StepProblem, *, geometry: StencilGeometry | None = None):
    """Largest first trial α ∈ [0, 1] keeping every candidate's gap positive along x + αΔx.

    Every stencil's single bound (:func:`ipcjax.ccd.stencil_max_step`: 90% of g/approach
    along the current separating normal when that is ≤ 1, docs/spec.md §4); the
    ``ADVANCE_STENCILS`` smallest are then re-bounded by conservative advancement
    (:func:`ipcjax.ccd.stencil_advance`, up to ``config.ccd_passes`` passes), and the
    result is the minimum of those and the next-smallest single bound. ``geometry``: the
    stencils at x (:func:`ipcjax.stencils.stencil_geometry`) when the caller has them.
    Without it, a set blocked by kind (a query's, or the Newton loop's compacted reach
    set) takes the single bounds only up to each kind's last valid row
    (:func:`ipcjax.stencils.fold_used_rows`, in passes of :data:`BOUND_CHUNK`; a padding
    row's bound is 1), and the stencils of the rows it advances.
    """
    config, radius = problem.config, problem.model.radius
    n = contacts.idx.shape[0]
    if n == 0:
        return jnp.asarray(1.0, x.dtype)
    if geometry is None and contacts.blocks is not None and n >= BOUND_CHUNK:
        # the single bounds of each kind's rows up to its last valid one; padding bounds 1
        def row_fn(cs, X, w):
            s = jax.vmap(_ccd.stencil_max_step)(X, dx[cs.idx], w, stencil_offsets(cs, radius, config.min_gap), cs.kind)
            return jnp.where(cs.valid, s, 1.0)

        single, = fold_used_rows(x, contacts, lambda *a: (row_fn(*a),), put_rows, (jnp.ones(n, x.dtype),),
                                 chunk=BOUND_CHUNK)
        X = off = None
    else:
        if geometry is None:
            geometry = stencil_geometry(x, contacts, radius, config.min_gap)
        X, w, off = geometry
        single = jax.vmap(_ccd.stencil_max_step)(X, dx[contacts.idx], w, off, contacts.kind)
        single = jnp.where(contacts.valid, single, 1.0)
    # advance only the most limiting stencils; every other one keeps its single bound,
    # so the result is min(advanced few, next-smallest single bound) — still conservative
    k = min(ADVANCE_STENCILS, n)
    if k < n:
        sel, rest = _smallest_bounds(single, k)
    else:
        _, sel = jax.lax.top_k(-single, n)
        rest = jnp.asarray(1.0, single.dtype)
    passes = config.ccd_passes
    picked = ContactSet(contacts.idx[sel], contacts.kind[sel], contacts.valid[sel])
    X_sel = gather_stencils(x, picked) if X is None else X[sel]
    off_sel = stencil_offsets(picked, radius, config.min_gap) if off is None else off[sel]
    adv, _ = jax.vmap(lambda X, dX, o, kd: _ccd.stencil_advance(X, dX, o, kd, stencil_weights, passes))(
        X_sel, dx[picked.idx], off_sel, picked.kind)
    adv = jnp.where(picked.valid, adv, 1.0)
    return jnp.minimum(jnp.min(adv), rest)


def _smallest_bounds(single, k: int):
    """The rows of the ``k`` smallest single bounds (values in [0, 1]) and the (k+1)-th
    smallest: ``lax.top_k(-single, k + 1)``'s rows and value, ties to the lower row.

    Most rows bound nothing (a single bound of exactly 1). Where at most ``k`` rows are
    below 1, those rows and the first rows at 1 are the same set of rows as top_k's, and
    the (k+1)-th smallest is 1: two compactions, not XLA's sort-based top_k (0.04 against
    0.17 ms for 65 of 2,337 rows on this CPU, ``benchmarks/used_rows.py``). Only more rows
    below 1 than ``k`` take top_k. The order within the set differs; the step bound takes a
    minimum over it.
    """
    below = single < 1.0
    count = jnp.sum(below, dtype=jnp.int32)

    def few():
        slot = jnp.arange(k, dtype=jnp.int32)
        under = jnp.nonzero(below, size=k, fill_value=0)[0].astype(jnp.int32)
        at_one = jnp.nonzero(~below, size=k, fill_value=0)[0].astype(jnp.int32)
        sel = jnp.where(slot < count, under, at_one[jnp.clip(slot - count, 0, k - 1)])
        return sel, jnp.ones((), single.dtype)

    def many():
        neg, sel = jax.lax.top_k(-single, k + 1)
        return sel[:k].astype(jnp.int32), -neg[k]

    return jax.lax.cond(count <= k, few, many)


def armijo(phi, x, dx, config: Config, *, phi0, slope, alpha0):
    """Backtracking from alpha0: first α with Φ(x+αΔx) ≤ Φ(x) + c α ∇Φ·Δx, ≤ max halvings.

    ``phi``: z ↦ Φ(z); ``phi0`` = Φ(x) (J); ``slope`` = ∇Φ·Δx (J); c = ``config.armijo``,
    at most ``config.max_line_search`` trials. Near convergence the predicted decrease
    α|∇Φ·Δx| falls below the round-off of Φ itself and the Armijo test becomes a coin
    toss. In that regime — predicted decrease below :data:`PHI_ROUNDOFF`·|Φ(x)| — a trial
    is also accepted when the directional derivative ∇Φ(x+αΔx)·Δx is still negative: the
    energy is still decreasing along Δx at the trial point. Returns (α, trials, accepted,
    Φ(x+αΔx)) — the last is Φ at the accepted trial (at the last rejected one when none
    was accepted).
    """
    noise = PHI_ROUNDOFF * jnp.abs(phi0)

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


#: Expansion trigger: the full Newton step decreased Φ by at least this fraction of
#: |∇Φ·Δx|. A quadratic model with the true Hessian predicts ½; more means the solver's
#: Hessian is stiffer along Δx than Φ is (a projected tangent in a buckling film), and
#: Newton creeps along Δx by about one step per iteration.
EXPAND_RATIO = 0.75


def box_limit(x, dx, box, margin):
    """Largest α ≥ 0 with x + αΔx inside the box [lo − margin, hi + margin] (``box`` = (lo, hi),
    (N, 3) each); +∞ where Δx = 0. x itself must lie inside it."""
    lo, hi = box[0] - margin, box[1] + margin
    up = jnp.where(dx > 0, (hi - x) / jnp.where(dx > 0, dx, 1.0), jnp.inf)
    down = jnp.where(dx < 0, (lo - x) / jnp.where(dx < 0, dx, 1.0), jnp.inf)
    return jnp.maximum(jnp.min(jnp.minimum(up, down)), 0.0)


def expand(phi, x, dx, config: Config, *, phi0, phi1, slope, alpha_max, doublings: int):
    """From an accepted full step α = 1: double α while Φ falls and Armijo holds.

    ``phi``: z ↦ Φ(z), exact for every z = x + αΔx with α ≤ ``alpha_max`` (its rows hold
    every stencil that can matter there); ``phi0`` = Φ(x), ``phi1`` = Φ(x + Δx) (J) and
    ``slope`` = ∇Φ·Δx. A doubling to 2α is taken when 2α ≤ ``alpha_max``,
    Φ(x + 2αΔx) < Φ(x + αΔx) and Φ(x + 2αΔx) ≤ Φ(x) + c·2α·∇Φ·Δx; the first that is not
    ends it, as do ``doublings`` (static) of them. ``alpha_max`` must keep every gap
    positive (a step bound) and the points inside the candidates' box. Returns (α,
    Φ(x + αΔx), trials: the values of Φ computed).
    """
    v1 = jnp.asarray(phi1, x.dtype)

    def cond(c):
        a, _, k, go = c
        return go & (k < doublings) & (2.0 * a <= alpha_max)

    def body(c):
        a, v, k, _ = c
        a2 = 2.0 * a
        v2 = phi(x + a2 * dx)
        ok = jnp.isfinite(v2) & (v2 < v) & (v2 <= phi0 + config.armijo * a2 * slope)
        return jnp.where(ok, a2, a), jnp.where(ok, v2, v), k + 1, ok

    a, v, k, _ = jax.lax.while_loop(cond, body, (jnp.asarray(1.0, x.dtype), v1, jnp.int32(0), jnp.bool_(True)))
    return a, v, k

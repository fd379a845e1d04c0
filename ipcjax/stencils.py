"""Contact stencils and their geometry: the barrier's rows, their closest points and gaps,
and the friction set frozen at a step's start.

A :class:`ContactSet` holds the rows the candidate query (:mod:`ipcjax.candidates`) found:
four particle indices, a :class:`~ipcjax.candidates.ContactKind` and a validity mask per
row. :func:`stencil_geometry` gathers each row's positions with its closest-point weights
and gap offset, :func:`contact_gaps` its gap, :func:`friction_set` the lagged friction
data (docs/spec.md §4), :func:`friction_kinks` the friction stencils where the step is not
differentiable in x₀. The energy terms over these rows are in :mod:`ipcjax.potential`.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ipcjax import distance as _dist
from ipcjax.candidates import ContactKind
from ipcjax.energies import barrier as _bar
from ipcjax.model import Config, Params
from ipcjax.problem import FrictionSet


@jax.tree_util.register_pytree_node_class
class ContactSet:
    """Barrier stencils: four particle indices, a :class:`ContactKind`, a validity mask.

    ``blocks`` (static, part of the pytree's structure): the row counts (VT, EE, SF, SS)
    when the rows come in that block order, as :func:`ipcjax.candidates.stencils` builds
    them; the closest-point weights are then computed per block with only that kind's
    formula (:func:`contact_weights`). None: rows of any kind in any order.
    Unpacks as ``idx, kind, valid``.
    """

    __slots__ = ("idx", "kind", "valid", "blocks")

    def __init__(self, idx, kind, valid, blocks=None):
        self.idx = idx      # (M, 4) int32
        self.kind = kind    # (M,) int8
        self.valid = valid  # (M,) bool
        self.blocks = None if blocks is None else tuple(int(b) for b in blocks)

    def __iter__(self):
        return iter((self.idx, self.kind, self.valid))

    def tree_flatten(self):
        return (self.idx, self.kind, self.valid), self.blocks

    @classmethod
    def tree_unflatten(cls, blocks, children):
        obj = object.__new__(cls)
        obj.idx, obj.kind, obj.valid = children
        obj.blocks = blocks
        return obj


# --------------------------------------------------------------------------- contacts

# Padding rows of a contact set gather a harmless, well-separated stencil instead of four
# copies of particle 0, so that no weight or distance derivative sees a degenerate input.
_DUMMY_STENCIL = jnp.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])


def gather_stencils(x, contacts: "ContactSet"):
    """(M, 4, 3) stencil positions; padding rows get a separated dummy stencil (d ≥ 0.7 m)."""
    X = x[contacts.idx]
    return jnp.where(contacts.valid[:, None, None], X, _DUMMY_STENCIL.astype(x.dtype))


def stencil_weights(X, kind):
    """Closest-point weights (4,) for one stencil of the given kind (see ContactKind)."""
    w_pt, _ = _dist.point_triangle_weights(X[0], X[1], X[2], X[3])
    w_ee, _ = _dist.edge_edge_weights(X[0], X[1], X[2], X[3])
    w_ss = _dist.sphere_pair_weights().astype(X.dtype)
    return jnp.where(kind == ContactKind.EE, w_ee, jnp.where(kind == ContactKind.SS, w_ss, w_pt))


def _pt_weights(X):
    """Point–triangle closest-point weights (M, 4) of stencils X (M, 4, 3): VT and SF rows."""
    return jax.vmap(lambda Y: _dist.point_triangle_weights(Y[0], Y[1], Y[2], Y[3])[0])(X)


def _ee_weights(X):
    """Edge–edge closest-point weights (M, 4) of stencils X (M, 4, 3): EE rows."""
    return jax.vmap(lambda Y: _dist.edge_edge_weights(Y[0], Y[1], Y[2], Y[3])[0])(X)


def _ss_weights(X):
    """The constant sphere-pair weights, one row per stencil of X (M, 4, 3): SS rows."""
    return jnp.broadcast_to(_dist.sphere_pair_weights().astype(X.dtype), (X.shape[0], 4))


def contact_weights(X, contacts: ContactSet):
    """Closest-point weights (M, 4) of every stencil of a contact set at positions X (M, 4, 3).

    With ``contacts.blocks`` each block gets only its own kind's formula (point–triangle
    for VT and SF, edge–edge for EE, constant for SS) — a third of the work of
    evaluating every formula on every row and selecting by kind, which is the fallback.
    The VT and SF blocks go through one point–triangle call, so that its code is compiled
    once per call site, not twice.
    """
    if contacts.blocks is None:
        return jax.vmap(stencil_weights)(X, contacts.kind)
    if sum(contacts.blocks) != X.shape[0]:
        raise ValueError(f"ContactSet blocks {contacts.blocks} sum to {sum(contacts.blocks)} rows; "
                         f"the stencils have {X.shape[0]}")
    n_vt, n_ee, n_sf, n_ss = contacts.blocks
    a, b, c = n_vt, n_vt + n_ee, n_vt + n_ee + n_sf
    w_pt = _pt_weights(jnp.concatenate([X[:a], X[b:c]], axis=0))
    return jnp.concatenate([w_pt[:a], _ee_weights(X[a:b]), w_pt[a:], _ss_weights(X[c:])], axis=0)


def stencil_offsets(contacts: ContactSet, radius, min_gap):
    """Offset c subtracted from each stencil's distance (docs/spec.md §4), in m.

    VT and EE: min_gap; sphere centre–face: R + min_gap/2; sphere pair: Rᵢ + Rⱼ.
    """
    r0 = radius[contacts.idx[:, 0]]
    r1 = radius[contacts.idx[:, 1]]
    return jnp.where(
        contacts.kind == ContactKind.SF, r0 + 0.5 * min_gap,
        jnp.where(contacts.kind == ContactKind.SS, r0 + r1, min_gap),
    )


class StencilGeometry(NamedTuple):
    """A contact set's stencils at one configuration: what the gradient and the step bound share."""

    X: jnp.ndarray    # (M, 4, 3) stencil positions (padding rows: the dummy stencil), m
    w: jnp.ndarray    # (M, 4) closest-point weights
    off: jnp.ndarray  # (M,) offsets c of :func:`stencil_offsets`, m


def stencil_geometry(x, contacts: ContactSet, radius, min_gap) -> StencilGeometry:
    """Positions, closest-point weights and offsets of every stencil at x.

    The weights (a branch choice per stencil) are the costly part of the contact terms;
    the Newton solve computes them once per iterate and hands them to both
    :func:`gradient_and_blocks` and the step bound.
    """
    X = gather_stencils(x, contacts)
    return StencilGeometry(X, contact_weights(X, contacts), stencil_offsets(contacts, radius, min_gap))


def contact_gaps(x, contacts: ContactSet, radius, min_gap):
    """Gap g = d − c per stencil (m), with +∞ for padding rows. Also returns (w, n)."""
    X, w, off = stencil_geometry(x, contacts, radius, min_gap)
    d, n = jax.vmap(_dist.stencil_distance)(X, w)
    g = d - off
    return jnp.where(contacts.valid, g, jnp.inf), w, n


#: Rows per pass of :func:`fold_used_rows`.
GAP_CHUNK = 512


def fold_used_rows(x, contacts: ContactSet, row_fn, update, carry, *, chunk: int):
    """Fold the rows of a set blocked by kind, up to each block's last valid row, in passes
    of ``chunk`` rows, each pass with its own kind's closest-point formula.

    A query's candidate set, and the Newton loop's compacted sets, hold each kind's rows
    first and padding after them, sized for the most a run has met: at the pouch bag's tie
    6,022 of 14,358 candidate rows are valid, and the rows within d̂ + 0.2 mm of x₀ fill 834
    of a compacted set's 2,337 slots (``benchmarks/used_rows.py``).
    Rows past a block's last valid row are padding, and each caller knows what padding
    gives (a gap +∞, a barrier 0, a step bound 1), so only the rows before them are taken:
    a ``while_loop`` per closest-point formula (point–triangle for VT and SF, edge–edge for
    EE) over passes of ``chunk`` rows; the few SS rows are taken whole.

    ``row_fn(cs, X, w)`` gives per-row values of a :class:`ContactSet` ``cs`` (a pass's rows,
    as :func:`gather_stencils` gives them ``X``, and their weights ``w``); ``update(carry,
    start, mine, values)`` folds them in, ``start`` the first row of the pass in the set and
    ``mine`` (its length) the rows the pass holds (each row is in exactly one pass: the last
    pass of a set is moved back to end at the set's end, and the rows it shares with the pass
    before are not its). Each row goes through :func:`contact_gaps`'s formulas, but XLA
    compiles a pass and a whole block into different machine code, which can round a row's
    last bit otherwise (up to a few 1e-16 relative). Not reverse-differentiable (the loop).
    """
    blocks, M, C = contacts.blocks, contacts.idx.shape[0], int(chunk)
    if blocks is None or sum(blocks) != M or M < C:
        raise ValueError(f"fold_used_rows needs a set blocked by kind of at least {C} rows; "
                         f"got {M} rows with blocks {blocks}")
    first = [sum(blocks[:k]) for k in range(4)]

    def values(cs, weights):
        X = gather_stencils(x, cs)
        return row_fn(cs, X, weights(X))

    if blocks[3]:
        a = first[3]
        cs = ContactSet(contacts.idx[a:], contacts.kind[a:], contacts.valid[a:])
        carry = update(carry, jnp.int32(a), jnp.ones(blocks[3], bool), values(cs, _ss_weights))
    row = jnp.arange(C, dtype=jnp.int32)
    for family, weights in (((0, 2), _pt_weights), ((1,), _ee_weights)):
        family = tuple(k for k in family if blocks[k])
        if not family:
            continue
        used = [jnp.max(jnp.where(contacts.valid[first[k]:first[k] + blocks[k]],
                                  jnp.arange(1, blocks[k] + 1, dtype=jnp.int32), 0), initial=0) for k in family]
        passes = [(u + C - 1) // C for u in used]

        def where_is(i, family=family, passes=passes):
            """(the pass's first row, the end of its block) for pass i of this family."""
            before = jnp.int32(0)
            d, end = jnp.int32(0), jnp.int32(0)
            for k, p in zip(family, passes):
                here = (i >= before) & (i < before + p)
                d = jnp.where(here, jnp.int32(first[k]) + (i - before) * C, d)
                end = jnp.where(here, jnp.int32(first[k] + blocks[k]), end)
                before = before + p
            return d, end

        def one_pass(c, weights=weights, where_is=where_is):
            i, carry = c
            d, end = where_is(i)
            s = jnp.clip(d, 0, M - C)
            take = lambda a: jax.lax.dynamic_slice_in_dim(a, s, C)
            cs = ContactSet(take(contacts.idx), take(contacts.kind), take(contacts.valid))
            mine = (s + row >= d) & (s + row < jnp.minimum(d + C, end))
            return i + 1, update(carry, s, mine, values(cs, weights))

        total = sum(passes)
        _, carry = jax.lax.while_loop(lambda c, total=total: c[0] < total, one_pass, (jnp.int32(0), carry))
    return carry


def _padding_geometry(dtype):
    """(w, n) of a padding row per kind (VT, EE, SF, SS): the dummy stencil's weights by that
    kind's formula and its normal, as :func:`contact_gaps` gives padding rows."""
    X = _DUMMY_STENCIL.astype(dtype)
    ws = [f(X[None])[0] for f in (_pt_weights, _ee_weights, _pt_weights, _ss_weights)]
    return [(w, _dist.stencil_distance(X, w)[1]) for w in ws]


def used_row_gaps(x, contacts: ContactSet, radius, min_gap):
    """:func:`contact_gaps` of a set blocked by kind, taken only up to each block's last valid
    row (:func:`fold_used_rows`; at the pouch bag's tie 2.45 ms for every row, 1.17 ms this
    way, ``benchmarks/used_rows.py``); every row past them gets what a padding row gets,
    the gap +∞ and the dummy stencil's weights and normal. The same values as
    :func:`contact_gaps` to the last bit's round-off (tests/test_sparse.py). A set without
    ``blocks``, or of at most two passes' rows, goes through :func:`contact_gaps`.
    """
    blocks, M, C = contacts.blocks, contacts.idx.shape[0], GAP_CHUNK
    if blocks is None or M <= 2 * C:
        return contact_gaps(x, contacts, radius, min_gap)
    pad = _padding_geometry(x.dtype)
    w0 = jnp.concatenate([jnp.broadcast_to(pad[k][0], (b, 4)) for k, b in enumerate(blocks)])
    n0 = jnp.concatenate([jnp.broadcast_to(pad[k][1], (b, 3)) for k, b in enumerate(blocks)])

    def row_fn(cs, X, w):
        d, n = jax.vmap(_dist.stencil_distance)(X, w)
        return jnp.where(cs.valid, d - stencil_offsets(cs, radius, min_gap), jnp.inf), w, n

    return fold_used_rows(x, contacts, row_fn, put_rows, (jnp.full(M, jnp.inf, x.dtype), w0, n0), chunk=C)


def put_rows(carry, start, mine, new):
    """A :func:`fold_used_rows` update: each array of ``new`` written into the matching one of
    ``carry`` (a tuple) from row ``start`` on, only on the rows ``mine``."""
    def put(a, b):
        old = jax.lax.dynamic_slice_in_dim(a, start, b.shape[0])
        return jax.lax.dynamic_update_slice_in_dim(
            a, jnp.where(mine.reshape(mine.shape + (1,) * (b.ndim - 1)), b, old), start, 0)
    return tuple(put(a, b) for a, b in zip(carry, new))


def active_rows(mask, size: int):
    """Compaction of a row mask into ``size`` slots (jittable).

    Returns (rows (size,) int32: the first ``size`` rows where mask is True, in order, the
    unused slots pointing at row 0; taken (size,) bool: which slots hold a row; count: the
    number of True rows, also when it is above ``size`` — the caller must treat that as an
    overflow, since the rows past ``size`` are not in the compacted set).
    """
    count = jnp.sum(mask, dtype=jnp.int32)
    rows = jnp.nonzero(mask, size=size, fill_value=0)[0].astype(jnp.int32)
    return rows, jnp.arange(size) < count, count


def friction_set(x0, contacts: ContactSet, radius, params: Params, config: Config, *,
                 active: int | None = None, gaps=None) -> FrictionSet:
    """Freeze friction data at step start: contacts with 0 < g₀ < d̂ get load μf·(−B′(g₀)).

    ``active``: keep only the stencils with a load, in that many rows (``Capacity.active``;
    ``count`` tells whether they fitted); None keeps every candidate row. ``gaps``: the
    ``(g₀, w₀, n₀)`` of :func:`contact_gaps` at x₀ when the caller has them (the Newton
    loop's step-start query takes them anyway), else they are taken here.
    """
    g0, w0, n0 = contact_gaps(x0, contacts, radius, config.min_gap) if gaps is None else gaps
    act = contacts.valid & (g0 < config.dhat)
    b1 = _bar.barrier_first_derivative(jnp.where(act, g0, 0.5 * config.dhat), config.dhat,
                                       params.barrier_stiffness)
    load = jnp.where(act, params.friction * (-b1), 0.0)
    idx = contacts.idx
    count = jnp.sum(act, dtype=jnp.int32)
    if active is not None and active < idx.shape[0]:
        rows, taken, _ = active_rows(act, active)
        idx, w0, n0, load = idx[rows], w0[rows], n0[rows], jnp.where(taken, load[rows], 0.0)
    return FrictionSet(idx=idx, w0=w0, n0=n0, load=load, count=count)


#: Relative distance (in units of the element) within which a friction stencil counts as
#: sitting on a closest-feature boundary, or an edge pair as parallel.
KINK_MARGIN = 1e-6


def _on_feature_boundary(X, kind, margin):
    """Whether stencil X (4, 3) of ``kind`` lies within ``margin`` of a closest-feature
    boundary, where its closest points (and the friction basis) jump or kink.

    Point–triangle and sphere–face: a barycentric coordinate of the point's projection
    within ``margin`` of 0 (the projection on an edge line of the triangle: the boundary of
    the interior region). Edge–edge: the edges within ``margin`` of parallel (sin² of their
    angle below margin²), or a line parameter within ``margin`` of 0 or 1 while the other
    lies on its segment (the boundary between the interior and an end-point branch).
    """
    b, _, _, _ = _dist._triangle_barycentric(X[0], X[1], X[2], X[3])
    pt = jnp.min(jnp.abs(b)) < margin
    s, t, nn, uu, vv = _dist._line_line_parameters(X[0], X[1], X[2], X[3])
    parallel = nn <= margin**2 * uu * vv
    on = lambda a: (a > -margin) & (a < 1 + margin)
    near_end = lambda a: jnp.minimum(jnp.abs(a), jnp.abs(1 - a)) < margin
    ee = parallel | (near_end(s) & on(t)) | (near_end(t) & on(s))
    return jnp.where(kind == ContactKind.EE, ee, jnp.where(kind == ContactKind.SS, False, pt))


def friction_kinks(x0, contacts: ContactSet, radius, params: Params, config: Config, *,
                   margin: float = KINK_MARGIN, gaps0=None):
    """Number of friction-loaded stencils at x₀ on a closest-feature boundary (see
    :func:`_on_feature_boundary`): there the lagged friction, and so the step's x*, is not
    differentiable in x₀, and a gradient is one of several one-sided ones. ``gaps0``: the
    stencils' gaps at x₀ when the caller has them (the Newton solve returns them)."""
    g0 = contact_gaps(x0, contacts, radius, config.min_gap)[0] if gaps0 is None else gaps0
    loaded = contacts.valid & (g0 < config.dhat) & (params.friction > 0)
    X = gather_stencils(x0, contacts)
    kink = jax.vmap(lambda x, k: _on_feature_boundary(x, k, margin))(X, contacts.kind)
    return jnp.sum(loaded & kink, dtype=jnp.int32)

"""The incremental potential Φ of one timestep: its value, gradient and solver Hessian.

Φ(x) = Σ mᵢ‖xᵢ − yᵢ‖²/(2dt²) + E_membrane + E_bending + E_barrier + E_friction
       + E_support + E_tie                                                  (J)

Every function takes ``(x, problem, contacts)``: the positions, the step's
:class:`~ipcjax.problem.StepProblem` (model, params, controls, step context, config) and
the barrier stencils (:class:`ContactSet`). Every term is a small pure function of a few
particles' positions (``ipcjax.energies``), lifted to the mesh with ``vmap`` over static
index arrays; the membrane and bending terms come from the model objects ``config`` names
(:class:`~ipcjax.energies.membrane.MembraneModel`,
:class:`~ipcjax.energies.bending.BendingModel`). :func:`incremental_potential` is the
value (differentiable by autodiff, used by the line search and the implicit VJP);
:func:`gradient_and_blocks` computes the hand-derived element gradients and, by its
:class:`~ipcjax.energies.PSDProjection`, the exact or the positive-semidefinite element
Hessians over the free degrees of freedom (fixed particles are eliminated, which is
equivalent to the specification's zeroed row/column with a unit diagonal and zero
right-hand side, docs/spec.md §2). The Hessian stays a stack of element blocks
(:class:`HessianBlocks`): :func:`dense_hessian` scatters them into the dense matrix,
:func:`hessian_matvec` applies them matrix-free; the linear solvers
(:mod:`ipcjax.linear_solvers`) take them from there.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ipcjax import distance as _dist
from ipcjax.candidates import ContactKind
from ipcjax.energies import barrier as _bar
from ipcjax.energies import bending as _bend
from ipcjax.energies import constraints as _con
from ipcjax.energies import friction as _fric
from ipcjax.energies import inertia as _inert
from ipcjax.energies import membrane as _memb
from ipcjax.energies import PSDProjection
from ipcjax.model import Config, Params
from ipcjax.problem import FrictionSet, StepProblem


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


def contact_weights(X, contacts: ContactSet):
    """Closest-point weights (M, 4) of every stencil of a contact set at positions X (M, 4, 3).

    With ``contacts.blocks`` each block gets only its own kind's formula (point–triangle
    for VT and SF, edge–edge for EE, constant for SS) — a third of the work of
    evaluating every formula on every row and selecting by kind, which is the fallback.
    """
    if contacts.blocks is None:
        return jax.vmap(stencil_weights)(X, contacts.kind)
    if sum(contacts.blocks) != X.shape[0]:
        raise ValueError(f"ContactSet blocks {contacts.blocks} sum to {sum(contacts.blocks)} rows; "
                         f"the stencils have {X.shape[0]}")
    n_vt, n_ee, n_sf, n_ss = contacts.blocks
    pt = jax.vmap(lambda Y: _dist.point_triangle_weights(Y[0], Y[1], Y[2], Y[3])[0])
    ee = jax.vmap(lambda Y: _dist.edge_edge_weights(Y[0], Y[1], Y[2], Y[3])[0])
    a, b, c = n_vt, n_vt + n_ee, n_vt + n_ee + n_sf
    ss = jnp.broadcast_to(_dist.sphere_pair_weights().astype(X.dtype), (n_ss, 4))
    return jnp.concatenate([pt(X[:a]), ee(X[a:b]), pt(X[b:c]), ss], axis=0)


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
                 active: int | None = None) -> FrictionSet:
    """Freeze friction data at step start: contacts with 0 < g₀ < d̂ get load μf·(−B′(g₀)).

    ``active``: keep only the stencils with a load, in that many rows (``Capacity.active``;
    ``count`` tells whether they fitted); None keeps every candidate row.
    """
    g0, w0, n0 = contact_gaps(x0, contacts, radius, config.min_gap)
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
                   margin: float = KINK_MARGIN):
    """Number of friction-loaded stencils at x₀ on a closest-feature boundary (see
    :func:`_on_feature_boundary`): there the lagged friction, and so the step's x*, is not
    differentiable in x₀, and a gradient is one of several one-sided ones."""
    g0, _, _ = contact_gaps(x0, contacts, radius, config.min_gap)
    loaded = contacts.valid & (g0 < config.dhat) & (params.friction > 0)
    X = gather_stencils(x0, contacts)
    kink = jax.vmap(lambda x, k: _on_feature_boundary(x, k, margin))(X, contacts.kind)
    return jnp.sum(loaded & kink, dtype=jnp.int32)


def _barrier_terms(x, contacts, radius, params, config):
    X, w, off = stencil_geometry(x, contacts, radius, config.min_gap)
    d, _ = jax.vmap(_dist.stencil_distance)(X, w)
    e = jax.vmap(lambda g: _bar.barrier(g, config.dhat, params.barrier_stiffness))(d - off)
    return jnp.where(contacts.valid, e, 0.0)


# --------------------------------------------------------------------------- coefficients

def membrane_coefficients(params: Params):
    """Plane-stress Lamé parameters (μ, λ) in N/m from E, ν, h."""
    return _memb.lame_from_young(params.youngs_modulus, params.poisson, params.thickness)


#: vmap axes of a membrane element function (X, Dm_inv, area, μ, λ): μ and λ are shared
MEMBRANE_AXES = (0, 0, 0, None, None)


# --------------------------------------------------------------------------- value

def potential_terms(x, problem: StepProblem, contacts: ContactSet) -> dict:
    """Each term of Φ at x (J), as a dict; :func:`incremental_potential` sums them."""
    model, params, controls, ctx, config = problem
    mu, lam = membrane_coefficients(params)
    Xt = x[model.film_triangles]
    memb = _memb.membrane_model(config.membrane)
    e_memb = jnp.sum(jax.vmap(memb.energy, in_axes=MEMBRANE_AXES)(Xt, model.dm_inv, model.rest_area, mu, lam))
    bend = _bend.bending_model(config.bending)
    kb = bend.stiffness(params, model)
    Xh = x[model.hinges]
    e_bend = jnp.sum(jax.vmap(bend.energy)(Xh, model.theta0, kb))
    free = ~model.fixed
    e_inert = _inert.inertia_energy(x, ctx.y, model.mass, free, ctx.dt)
    e_bar = jnp.sum(_barrier_terms(x, contacts, model.radius, params, config))
    fs = ctx.friction
    eps = _fric.friction_eps(ctx.dt)
    e_fric = jnp.sum(jax.vmap(lambda *a: _fric.friction_energy(*a, eps=eps))(
        x[fs.idx], ctx.x0[fs.idx], fs.w0, fs.n0, fs.load))
    e_sup = jnp.sum(jax.vmap(_con.support_energy)(x[controls.support_index], controls.support_target, controls.support_k))
    ti, tj = controls.tie_pairs[:, 0], controls.tie_pairs[:, 1]
    e_tie = jnp.sum(jax.vmap(_con.tie_energy)(x[ti], x[tj], controls.tie_length, controls.tie_k))
    return dict(inertia=e_inert, membrane=e_memb, bending=e_bend, barrier=e_bar,
                friction=e_fric, support=e_sup, tie=e_tie)


def incremental_potential(x, problem: StepProblem, contacts: ContactSet) -> jnp.ndarray:
    """Φ(x) in J; +∞ where any gap is ≤ 0 (outside the feasible set)."""
    return sum(potential_terms(x, problem, contacts).values())


# --------------------------------------------------------------------------- assembly

class HessianBlocks(NamedTuple):
    """The solver Hessian over the free DOFs as stacked element blocks, never as a matrix.

    H = diag(diag) + Σ_groups Σ_e P_eᵀ B_e P_e, where P_e picks element e's 3k free DOFs
    ``rows[e]``. Groups, in assembly order: membrane (k = 3), bending (4), barrier (4),
    friction (4), supports (1), ties (2); the inertia m/dt² is the diagonal. Rows of fixed
    particles are ≥ 3F (slot F): their entries fall outside every (3F,) array and are
    dropped on scatter and read as zero on gather, which eliminates the fixed DOFs.
    """

    diag: jnp.ndarray    # (3F,) N/m
    rows: tuple          # per group (E, 3k) int32
    blocks: tuple        # per group (E, 3k, 3k) N/m
    n_active: jnp.ndarray  # contact rows the compacted groups needed (see gradient_and_blocks)


def _dof_rows(idx, free_slot):
    """(E, 3k) free-DOF rows of the elements' particles; fixed particles map to rows ≥ 3F."""
    slots = free_slot[idx]
    return (3 * slots[:, :, None] + jnp.arange(3)).reshape(idx.shape[0], 3 * idx.shape[1])


def _barrier_stencil_exact_hessian(X, kind, offset, dhat, k):
    """Exact (12, 12) Hessian of B(d(X) − c), the closest-point weights differentiated too."""
    def e(Z):
        d, _ = _dist.stencil_distance(Z, stencil_weights(Z, kind))
        return _bar.barrier(d - offset, dhat, k)
    return jax.hessian(e)(X).reshape(12, 12)


def gradient_and_blocks(x, problem: StepProblem, contacts: ContactSet, *,
                        projection: PSDProjection = PSDProjection.PER_ELEMENT,
                        geometry: StencilGeometry | None = None, active: int | None = None):
    """∇Φ (3F,) over the free DOFs and the Hessian as :class:`HessianBlocks`, FP64.

    Element gradients are the hand-derived ones. With ``projection=PER_ELEMENT`` (the
    Newton solve) element Hessians are the projected tangents: Neo-Hookean/StVK with the S₊ geometric
    part, hinge kθ∇θ∇θᵀ or the eigenvalue-clamped discrete-shell Hessian, barrier
    max(B″,0) jjᵀ, exact friction, PSD ties, supports kI, inertia m/dt² I. With
    ``projection=NONE`` (the implicit VJP) every element Hessian is the exact one — the
    barrier's includes B′∇²d from the curvature of the distance — so the blocks sum to
    ∇²Φ itself. Both linear-solve paths start here: the dense one scatters the blocks
    into a matrix (:func:`dense_hessian`), the CG one multiplies with them
    (:func:`hessian_matvec`). ``geometry``: the contact stencils at this x, when the
    caller has them already (:func:`stencil_geometry`).

    ``active`` (``Capacity.active``): assemble the barrier only over the stencils inside
    d̂, compacted into that many rows — every other candidate row adds exactly zero to
    ∇Φ and H. ``n_active`` of the result is the larger of that count and the friction
    set's; above ``active`` the blocks miss rows and the caller must not use them.
    """
    model, params, controls, ctx, config = problem
    exact = PSDProjection(projection) is PSDProjection.NONE
    F = model.n_free
    g = jnp.zeros(3 * F, x.dtype)
    slot = model.free_slot
    rows, blocks = [], []

    def add(g, idx, g_loc, H_loc):
        r = _dof_rows(idx, slot)
        rows.append(r)
        blocks.append(H_loc)
        return g.at[r.reshape(-1)].add(g_loc.reshape(-1), mode="drop")

    # inertia: diagonal
    free = ~model.fixed
    gi = _inert.inertia_gradient(x, ctx.y, model.mass, free, ctx.dt)[model.free_particles]
    g = g + gi.reshape(-1)
    diag = jnp.repeat(_inert.inertia_hessian_diagonal(model.mass, free, ctx.dt)[model.free_particles], 3)

    # membrane
    mu, lam = membrane_coefficients(params)
    Xt = x[model.film_triangles]
    memb = _memb.membrane_model(config.membrane)
    g_el = jax.vmap(memb.gradient, in_axes=MEMBRANE_AXES)(Xt, model.dm_inv, model.rest_area, mu, lam)
    H_el = jax.vmap(memb.element_hessian(projection), in_axes=MEMBRANE_AXES)(Xt, model.dm_inv, model.rest_area,
                                                                            mu, lam)
    g = add(g, model.film_triangles, g_el, H_el)

    # bending
    bend = _bend.bending_model(config.bending)
    kb = bend.stiffness(params, model)
    Xh = x[model.hinges]
    g_el = jax.vmap(bend.gradient)(Xh, model.theta0, kb)
    H_el = jax.vmap(bend.element_hessian(projection))(Xh, model.theta0, kb)
    g = add(g, model.hinges, g_el.reshape(-1, 4, 3), H_el)

    # barrier
    if geometry is None:
        geometry = stencil_geometry(x, contacts, model.radius, config.min_gap)
    X, w, off = geometry
    idx, kind, valid = contacts
    n_active = ctx.friction.count
    if active is not None and active < idx.shape[0]:
        d, _ = jax.vmap(_dist.stencil_distance)(X, w)
        rows_a, valid, n_bar = active_rows(valid & (d - off < config.dhat), active)
        X, w, off, idx, kind = X[rows_a], w[rows_a], off[rows_a], idx[rows_a], kind[rows_a]
        n_active = jnp.maximum(n_active, n_bar)
    kk = params.barrier_stiffness
    g_el = jax.vmap(_bar.stencil_barrier_gradient, in_axes=(0, 0, 0, None, None))(X, w, off, config.dhat, kk)
    if exact:
        H_el = jax.vmap(_barrier_stencil_exact_hessian, in_axes=(0, 0, 0, None, None))(
            X, kind, off, config.dhat, kk)
    else:
        H_el = jax.vmap(_bar.stencil_barrier_hessian_psd, in_axes=(0, 0, 0, None, None))(
            X, w, off, config.dhat, kk)
    g_el = jnp.where(valid[:, None, None], g_el, 0.0)
    H_el = jnp.where(valid[:, None, None], H_el, 0.0)
    g = add(g, idx, g_el, H_el)

    # friction
    fs = ctx.friction
    eps = _fric.friction_eps(ctx.dt)
    X, X0 = x[fs.idx], ctx.x0[fs.idx]
    g_el = jax.vmap(lambda *a: _fric.friction_gradient(*a, eps=eps))(X, X0, fs.w0, fs.n0, fs.load)
    H_el = jax.vmap(lambda *a: _fric.friction_hessian(*a, eps=eps))(X, X0, fs.w0, fs.n0, fs.load)
    g = add(g, fs.idx, g_el, H_el)

    # supports
    si = controls.support_index
    g_el = jax.vmap(_con.support_gradient)(x[si], controls.support_target, controls.support_k)
    H_el = jax.vmap(_con.support_hessian)(x[si], controls.support_target, controls.support_k)
    g = add(g, si[:, None], g_el[:, None, :], H_el)

    # ties
    tp = controls.tie_pairs
    g_el = jax.vmap(_con.tie_gradient)(x[tp[:, 0]], x[tp[:, 1]], controls.tie_length, controls.tie_k)
    H_el = jax.vmap(_con.tie_hessian if exact else _con.tie_hessian_psd)(
        x[tp[:, 0]], x[tp[:, 1]], controls.tie_length, controls.tie_k)
    g = add(g, tp, g_el, H_el)
    return g, HessianBlocks(diag, tuple(rows), tuple(blocks), n_active)


def dense_hessian(hb: HessianBlocks):
    """Scatter the blocks into the dense (3F, 3F) matrix (8·(3F)² bytes).

    The matrix is filled through its flat (row-major) view: one scalar index per entry,
    rows·3F + columns, with entries of fixed particles sent past the end and dropped.
    On the CPU that scatter is about twice as fast as the two-index one into (3F, 3F),
    and it adds the same numbers in the same order.
    """
    n = hb.diag.shape[0]
    Hf = jnp.zeros(n * n, hb.diag.dtype).at[jnp.arange(n) * (n + 1)].set(hb.diag)
    for r, B in zip(hb.rows, hb.blocks):
        if r.shape[0] == 0:
            continue
        if n * n >= 2**31 - 1:  # flat indices past int32 (beyond ~15k free particles)
            r = r.astype(jnp.int64)
        inside = (r[:, :, None] < n) & (r[:, None, :] < n)
        flat = jnp.where(inside, r[:, :, None] * n + r[:, None, :], n * n)
        Hf = Hf.at[flat.reshape(-1)].add(B.reshape(-1), mode="drop")
    return Hf.reshape(n, n)


def hessian_matvec(hb: HessianBlocks, v):
    """H v (3F,) by gather, per-element block product and scatter-add; never forms H."""
    vp = jnp.concatenate([v, jnp.zeros(3, v.dtype)])  # rows of fixed particles read zeros
    out = hb.diag * v
    for r, B in zip(hb.rows, hb.blocks):
        y = jnp.einsum("eij,ej->ei", B, vp[r])
        out = out.at[r.reshape(-1)].add(y.reshape(-1), mode="drop")
    return out


def hessian_block_diagonal(hb: HessianBlocks):
    """(F, 3, 3) diagonal blocks of H, one per free particle (for block-Jacobi)."""
    F = hb.diag.shape[0] // 3
    P = jnp.zeros((F, 3, 3), hb.diag.dtype)
    P = P + hb.diag.reshape(F, 3)[:, :, None] * jnp.eye(3, dtype=hb.diag.dtype)
    for r, B in zip(hb.rows, hb.blocks):
        k = r.shape[1] // 3
        Bd = jnp.stack([B[:, 3 * a:3 * a + 3, 3 * a:3 * a + 3] for a in range(k)], axis=1)  # (E, k, 3, 3)
        P = P.at[r[:, ::3] // 3].add(Bd, mode="drop")
    return P


def gradient_and_hessian(x, problem: StepProblem, contacts: ContactSet, *,
                         projection: PSDProjection = PSDProjection.PER_ELEMENT):
    """Assemble ∇Φ (3F,) and the dense Hessian (3F, 3F) over the free DOFs, FP64.

    The element blocks of :func:`gradient_and_blocks` (see there for which Hessians)
    scattered into one matrix by :func:`dense_hessian`.
    """
    g, hb = gradient_and_blocks(x, problem, contacts, projection=projection)
    return g, dense_hessian(hb)

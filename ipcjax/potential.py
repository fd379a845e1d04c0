"""The incremental potential Φ of one timestep: its value, gradient and solver Hessian.

Φ(x) = Σ mᵢ‖xᵢ − yᵢ‖²/(2dt²) + E_membrane + E_bending + E_barrier + E_friction
       + E_support + E_tie                                                  (J)

Each term is declared once, as an :class:`EnergyTerm` with its value and its elements
(hand-derived element gradients and Hessian blocks), and :data:`TERMS` lists them in the
order Φ sums them. :func:`incremental_potential` (the value: autodiff, the line search,
the implicit VJP), :func:`gradient_and_blocks` (the Newton solve's assembly) and the
rest-state derivative (:mod:`fitting.rest_derivative`) all iterate over that list, so a
new term is one new class here and one entry in it.

Every function takes ``(x, problem, contacts)``: the positions, the step's
:class:`~ipcjax.problem.StepProblem` (model, params, controls, step context, config) and
the barrier stencils (:class:`~ipcjax.stencils.ContactSet`). Every term is a small pure
function of a few particles' positions (``ipcjax.energies``), lifted to the mesh with
``vmap`` over static index arrays; the membrane and bending terms come from the model
objects ``config`` names (:class:`~ipcjax.energies.membrane.MembraneModel`,
:class:`~ipcjax.energies.bending.BendingModel`). By its
:class:`~ipcjax.energies.PSDProjection`, :func:`gradient_and_blocks` takes the exact or the
positive-semidefinite element Hessians over the free degrees of freedom (fixed particles
are eliminated, which is equivalent to the specification's zeroed row/column with a unit
diagonal and zero right-hand side, docs/spec.md §2). The Hessian stays a stack of element
blocks (:class:`HessianBlocks`): :func:`dense_hessian` scatters them into the dense
matrix, :func:`hessian_matvec` applies them matrix-free; the linear solvers
(:mod:`ipcjax.linear_solvers`) take them from there.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ipcjax import distance as _dist
from ipcjax.energies import barrier as _bar
from ipcjax.energies import bending as _bend
from ipcjax.energies import constraints as _con
from ipcjax.energies import friction as _fric
from ipcjax.energies import inertia as _inert
from ipcjax.energies import membrane as _memb
from ipcjax.energies import PSDProjection
from ipcjax.model import Params
from ipcjax.problem import StepProblem
# The contact stencils live in ipcjax.stencils; their names stay importable from here, because
# benchmarks/ runs one worker script on older commits' trees too (benchmarks/ab_step.py).
from ipcjax.stencils import (  # noqa: F401
    ContactSet, StencilGeometry, active_rows, contact_gaps, contact_weights, friction_kinks, friction_set,
    gather_stencils, stencil_geometry, stencil_offsets, stencil_weights,
)


# --------------------------------------------------------------------------- barrier

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


# --------------------------------------------------------------------------- assembly

class HessianBlocks(NamedTuple):
    """The solver Hessian over the free DOFs as stacked element blocks, never as a matrix.

    H = diag(diag) + Σ_groups Σ_e P_eᵀ B_e P_e, where P_e picks element e's 3k free DOFs
    ``rows[e]``. Groups, in assembly order (:data:`TERMS`): membrane (k = 3), bending (4), barrier (4),
    friction (4), supports (1), ties (2); the inertia m/dt² is the diagonal. Rows of fixed
    particles are ≥ 3F (slot F): their entries fall outside every (3F,) array and are
    dropped on scatter and read as zero on gather, which eliminates the fixed DOFs. A
    contact element that adds nothing (:class:`Elements`' ``used``) has rows ≥ 3F only.
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


# --------------------------------------------------------------------------- the terms

class Elements(NamedTuple):
    """One term's elements at x: each element's particles, its gradient and Hessian block.

    ``n_active`` is the number of contact rows the term needed (None: not a contact term,
    see :class:`HessianBlocks`). ``used`` (E,) bool, for the contact terms: the elements that
    can add anything; the others' gradients and blocks are exactly zero (a padded or unloaded
    row, a stencil beyond d̂), and :func:`gradient_and_blocks` gives them the rows of a fixed
    particle (≥ 3F), so that every consumer of the blocks drops them without reading them."""

    idx: jnp.ndarray        # (E, k) int32 particle indices
    grad: jnp.ndarray       # (E, k, 3) N
    hessian: jnp.ndarray    # (E, 3k, 3k) N/m
    n_active: jnp.ndarray | None = None
    used: jnp.ndarray | None = None


class Diagonal(NamedTuple):
    """A term whose Hessian is diagonal (the inertia): gradient and diagonal over the free DOFs."""

    grad: jnp.ndarray       # (3F,) N
    diag: jnp.ndarray       # (3F,) N/m


class Assembly(NamedTuple):
    """How :func:`gradient_and_blocks` asks the terms for their elements."""

    exact: bool                          # the exact element Hessians, not the PSD-projected ones
    geometry: StencilGeometry | None     # the contact stencils at x, when the caller has them
    active: int | None                   # compact the barrier into this many rows inside d̂


class EnergyTerm:
    """One term of Φ, declared once: its value and its elements (gradient, Hessian blocks).

    :data:`TERMS` lists them in the order in which Φ sums them and in which
    :func:`gradient_and_blocks` assembles them; :func:`incremental_potential`,
    :func:`gradient_and_blocks` and the rest-state derivative
    (:mod:`fitting.rest_derivative`) all iterate over that one list."""

    name: str = ""
    #: the inertia term: not part of V + D, the potential a rest state balances
    inertial: bool = False
    #: its elements are a :class:`Diagonal`, not :class:`Elements` (no group of blocks)
    diagonal: bool = False

    def value(self, x, problem: StepProblem, contacts: ContactSet):
        """The term's energy at x, J."""
        raise NotImplementedError

    def elements(self, x, problem: StepProblem, contacts: ContactSet, how: Assembly) -> Elements | Diagonal:
        """The term's hand-derived element gradients and Hessian blocks at x."""
        raise NotImplementedError

    def __repr__(self):
        return f"<energy term {self.name}>"


class Inertia(EnergyTerm):
    """Σ mᵢ‖xᵢ − yᵢ‖²/(2dt²) over the free particles; Hessian m/dt² on the diagonal."""

    name, inertial, diagonal = "inertia", True, True

    def value(self, x, problem, contacts):
        model, ctx = problem.model, problem.context
        return _inert.inertia_energy(x, ctx.y, model.mass, ~model.fixed, ctx.dt)

    def elements(self, x, problem, contacts, how):
        model, ctx = problem.model, problem.context
        free = ~model.fixed
        gi = _inert.inertia_gradient(x, ctx.y, model.mass, free, ctx.dt)[model.free_particles]
        diag = jnp.repeat(_inert.inertia_hessian_diagonal(model.mass, free, ctx.dt)[model.free_particles], 3)
        return Diagonal(gi.reshape(-1), diag)


class Membrane(EnergyTerm):
    """The film's membrane energy, by the model ``config.membrane`` names."""

    name = "membrane"

    def value(self, x, problem, contacts):
        model, params, config = problem.model, problem.params, problem.config
        mu, lam = membrane_coefficients(params)
        memb = _memb.membrane_model(config.membrane)
        return jnp.sum(jax.vmap(memb.energy, in_axes=MEMBRANE_AXES)(x[model.film_triangles], model.dm_inv,
                                                                    model.rest_area, mu, lam))

    def elements(self, x, problem, contacts, how):
        model, params, config = problem.model, problem.params, problem.config
        mu, lam = membrane_coefficients(params)
        Xt = x[model.film_triangles]
        memb = _memb.membrane_model(config.membrane)
        g_el = jax.vmap(memb.gradient, in_axes=MEMBRANE_AXES)(Xt, model.dm_inv, model.rest_area, mu, lam)
        if how.exact:
            H_el = jax.vmap(memb.hessian, in_axes=MEMBRANE_AXES)(Xt, model.dm_inv, model.rest_area, mu, lam)
        else:  # every element's PSD tangent at once (no eigendecomposition where Q is PSD)
            H_el = memb.hessians_psd(Xt, model.dm_inv, model.rest_area, mu, lam)
        return Elements(model.film_triangles, g_el, H_el)


class Bending(EnergyTerm):
    """The film's bending energy over its hinges, by the model ``config.bending`` names."""

    name = "bending"

    def value(self, x, problem, contacts):
        model, params, config = problem.model, problem.params, problem.config
        bend = _bend.bending_model(config.bending)
        kb = bend.stiffness(params, model)
        return jnp.sum(jax.vmap(bend.energy)(x[model.hinges], model.theta0, kb))

    def elements(self, x, problem, contacts, how):
        model, params, config = problem.model, problem.params, problem.config
        bend = _bend.bending_model(config.bending)
        kb = bend.stiffness(params, model)
        Xh = x[model.hinges]
        projection = PSDProjection.NONE if how.exact else PSDProjection.PER_ELEMENT
        g_el = jax.vmap(bend.gradient)(Xh, model.theta0, kb)
        H_el = jax.vmap(bend.element_hessian(projection))(Xh, model.theta0, kb)
        return Elements(model.hinges, g_el.reshape(-1, 4, 3), H_el)


class Barrier(EnergyTerm):
    """The log barrier over the contact stencils (vertex–triangle, edge–edge, sphere–face,
    sphere–sphere). Its elements: with ``how.active`` only the stencils inside d̂,
    compacted into that many rows (every other row adds exactly zero)."""

    name = "barrier"

    def value(self, x, problem, contacts):
        return jnp.sum(_barrier_terms(x, contacts, problem.model.radius, problem.params, problem.config))

    def elements(self, x, problem, contacts, how):
        model, params, config = problem.model, problem.params, problem.config
        geometry = how.geometry
        if geometry is None:
            geometry = stencil_geometry(x, contacts, model.radius, config.min_gap)
        X, w, off = geometry
        idx, kind, valid = contacts
        n_bar = None
        if how.active is not None and how.active < idx.shape[0]:
            d, _ = jax.vmap(_dist.stencil_distance)(X, w)
            rows_a, valid, n_bar = active_rows(valid & (d - off < config.dhat), how.active)
            X, w, off, idx, kind = X[rows_a], w[rows_a], off[rows_a], idx[rows_a], kind[rows_a]
        kk = params.barrier_stiffness
        g_el = jax.vmap(_bar.stencil_barrier_gradient, in_axes=(0, 0, 0, None, None))(X, w, off, config.dhat, kk)
        if how.exact:
            H_el = jax.vmap(_barrier_stencil_exact_hessian, in_axes=(0, 0, 0, None, None))(
                X, kind, off, config.dhat, kk)
        else:
            H_el = jax.vmap(_bar.stencil_barrier_hessian_psd, in_axes=(0, 0, 0, None, None))(
                X, w, off, config.dhat, kk)
        g_el = jnp.where(valid[:, None, None], g_el, 0.0)
        H_el = jnp.where(valid[:, None, None], H_el, 0.0)
        # padding and stencils beyond d̂ add exactly zero: used where anything is not zero
        used = jnp.any(g_el != 0, axis=(1, 2)) | jnp.any(H_el != 0, axis=(1, 2))
        return Elements(idx, g_el, H_el, n_bar, used)


class Friction(EnergyTerm):
    """Lagged friction over the step start's friction set (:class:`~ipcjax.problem.FrictionSet`)."""

    name = "friction"

    def value(self, x, problem, contacts):
        ctx = problem.context
        fs = ctx.friction
        eps = _fric.friction_eps(ctx.dt)
        return jnp.sum(jax.vmap(lambda *a: _fric.friction_energy(*a, eps=eps))(
            x[fs.idx], ctx.x0[fs.idx], fs.w0, fs.n0, fs.load))

    def elements(self, x, problem, contacts, how):
        ctx = problem.context
        fs = ctx.friction
        eps = _fric.friction_eps(ctx.dt)
        X, X0 = x[fs.idx], ctx.x0[fs.idx]
        g_el = jax.vmap(lambda *a: _fric.friction_gradient(*a, eps=eps))(X, X0, fs.w0, fs.n0, fs.load)
        H_el = jax.vmap(lambda *a: _fric.friction_hessian(*a, eps=eps))(X, X0, fs.w0, fs.n0, fs.load)
        # a row without a load (padding, or no friction) adds exactly zero
        return Elements(fs.idx, g_el, H_el, fs.count, fs.load != 0)


class Support(EnergyTerm):
    """Springs that hold single particles at their targets (``controls.support_*``)."""

    name = "support"

    def value(self, x, problem, contacts):
        c = problem.controls
        return jnp.sum(jax.vmap(_con.support_energy)(x[c.support_index], c.support_target, c.support_k))

    def elements(self, x, problem, contacts, how):
        c = problem.controls
        si = c.support_index
        g_el = jax.vmap(_con.support_gradient)(x[si], c.support_target, c.support_k)
        H_el = jax.vmap(_con.support_hessian)(x[si], c.support_target, c.support_k)
        return Elements(si[:, None], g_el[:, None, :], H_el)


class Tie(EnergyTerm):
    """Springs between particle pairs at a rest length (``controls.tie_*``)."""

    name = "tie"

    def value(self, x, problem, contacts):
        c = problem.controls
        ti, tj = c.tie_pairs[:, 0], c.tie_pairs[:, 1]
        return jnp.sum(jax.vmap(_con.tie_energy)(x[ti], x[tj], c.tie_length, c.tie_k))

    def elements(self, x, problem, contacts, how):
        c = problem.controls
        tp = c.tie_pairs
        g_el = jax.vmap(_con.tie_gradient)(x[tp[:, 0]], x[tp[:, 1]], c.tie_length, c.tie_k)
        H_el = jax.vmap(_con.tie_hessian if how.exact else _con.tie_hessian_psd)(
            x[tp[:, 0]], x[tp[:, 1]], c.tie_length, c.tie_k)
        return Elements(tp, g_el, H_el)


#: The terms of Φ, each declared once, in the order Φ sums them and the assembly adds them.
TERMS: tuple[EnergyTerm, ...] = (Inertia(), Membrane(), Bending(), Barrier(), Friction(), Support(), Tie())


# --------------------------------------------------------------------------- value

def potential_terms(x, problem: StepProblem, contacts: ContactSet) -> dict:
    """Each term of Φ at x (J), by name in :data:`TERMS`' order; :func:`incremental_potential` sums them."""
    return {term.name: term.value(x, problem, contacts) for term in TERMS}


def incremental_potential(x, problem: StepProblem, contacts: ContactSet) -> jnp.ndarray:
    """Φ(x) in J; +∞ where any gap is ≤ 0 (outside the feasible set)."""
    return sum(potential_terms(x, problem, contacts).values())


def gradient_and_blocks(x, problem: StepProblem, contacts: ContactSet, *,
                        projection: PSDProjection = PSDProjection.PER_ELEMENT,
                        geometry: StencilGeometry | None = None, active: int | None = None,
                        terms: tuple[EnergyTerm, ...] = TERMS, exact: tuple[str, ...] = ()):
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

    The terms' elements come from ``terms`` (default :data:`TERMS`, all of Φ), one group of
    blocks per term, in its order; a subset of them assembles that part of Φ alone (its
    ``diag`` zero without the inertia, its ``n_active`` None without a contact term).
    ``exact``: names of terms whose exact element Hessians are taken whatever ``projection``
    says (the Newton direction's ``Config.newton_tangent="exact_first"``, :data:`EXACT_FIRST`).
    """
    how = Assembly(PSDProjection(projection) is PSDProjection.NONE, geometry, active)
    F = problem.model.n_free
    g = jnp.zeros(3 * F, x.dtype)
    diag, rows, blocks, n_active = jnp.zeros(3 * F, x.dtype), [], [], None
    for term in terms:
        el = term.elements(x, problem, contacts, how._replace(exact=True) if term.name in exact else how)
        if isinstance(el, Diagonal) != term.diagonal:
            raise TypeError(f"{term!r}: its elements are {type(el).__name__}, its `diagonal` says {term.diagonal}")
        if isinstance(el, Diagonal):
            g, diag = g + el.grad, el.diag
            continue
        r = _dof_rows(el.idx, problem.model.free_slot)
        if el.used is not None:  # elements that add nothing get fixed-DOF rows (Elements)
            r = jnp.where(el.used[:, None], r, 3 * F)
        rows.append(r)
        blocks.append(el.hessian)
        g = g.at[r.reshape(-1)].add(el.grad.reshape(-1), mode="drop")
        if el.n_active is not None:
            n_active = el.n_active if n_active is None else jnp.maximum(n_active, el.n_active)
    return g, HessianBlocks(diag, tuple(rows), tuple(blocks), n_active)


#: the terms whose exact element Hessians ``Config.newton_tangent="exact_first"`` factorizes first:
#: the membrane's (the bending's too cut the bag's cinch iterations no further and cost
#: 1.0 ms an iteration against the projected hinge's 0.36, docs/benchmarks.md)
EXACT_FIRST = ("membrane",)


def projected_blocks(x, problem: StepProblem, hb: HessianBlocks, names: tuple[str, ...],
                     terms: tuple[EnergyTerm, ...] = TERMS) -> HessianBlocks:
    """``hb`` (assembled over ``terms`` by :func:`gradient_and_blocks`) with the blocks of the
    terms ``names`` replaced by their PSD-projected element Hessians at x; the other blocks,
    the rows, the diagonal and ``n_active`` stay. For terms whose elements do not depend on
    the contacts (the membrane, :data:`EXACT_FIRST`, and the bending): the contact set is
    not passed."""
    if not set(names) <= {t.name for t in terms}:
        raise ValueError(f"no terms named {sorted(set(names) - {t.name for t in terms})} in {terms}")
    how = Assembly(False, None, None)
    blocks = list(hb.blocks)
    for i, term in enumerate(t for t in terms if not t.diagonal):
        if term.name in names:
            blocks[i] = term.elements(x, problem, None, how).hessian
    return hb._replace(blocks=tuple(blocks))


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

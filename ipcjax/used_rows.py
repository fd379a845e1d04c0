"""The Newton loop's Φ and assembly over the contact rows in use, not over every slot.

The loop's compacted contact sets (:mod:`ipcjax.newton`) and its lagged friction set have
static sizes, set by the most rows a run meets (``Capacity.active``): at the pouch bag's
tie a reach set uses 687 of its 2,337 slots and the friction set 474 of 1,878, in the
lift 173 and 44. A padding slot adds exactly nothing, a barrier or a friction row past the
last used one only zeros. So here the barrier is taken up to each kind's last used slot
(:func:`ipcjax.stencils.fold_used_rows`) and friction up to its last loaded row, in passes
of a few dozen rows, while every other term is :mod:`ipcjax.potential`'s own:

* :func:`line_search_potential`, Φ for the line search;
* :func:`used_row_assembly`, ∇Φ, the projected Hessian blocks and the gaps for the
  Newton direction.

Each row goes through the same formulas as in :func:`ipcjax.potential.incremental_potential`
and :func:`ipcjax.potential.gradient_and_blocks`; sums taken pass by pass, and a pass
compiled apart from a whole block, can differ from those in their last bits, which the
loop never mixes (the line search compares values of this Φ only). Both run ``while_loop``
passes, so neither is reverse-differentiable: the implicit VJP and the gradients use
:mod:`ipcjax.potential`. docs/benchmarks.md gives the times.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ipcjax import distance as _dist
from ipcjax.energies import barrier as _bar
from ipcjax.energies import friction as _fric
from ipcjax.potential import TERMS, HessianBlocks, _dof_rows, gradient_and_blocks, incremental_potential
from ipcjax.problem import StepProblem
from ipcjax.stencils import ContactSet, fold_used_rows, put_rows, stencil_geometry, stencil_offsets

#: Rows per pass of the barrier and of friction.
CHUNK = 64


def _fold_loaded(friction, fn, update, carry):
    """Fold ``update(carry, start, mine, fn(rows))`` over the friction set's rows up to its
    last loaded one, in passes of :data:`CHUNK` (a row past it has load 0: its energy,
    gradient and Hessian are zeros). ``rows``: the pass's (idx, w0, n0, load)."""
    M, C = friction.idx.shape[0], CHUNK
    used = jnp.max(jnp.where(friction.load != 0, jnp.arange(1, M + 1, dtype=jnp.int32), 0), initial=0)
    row = jnp.arange(C, dtype=jnp.int32)

    def one_pass(c):
        i, carry = c
        d = i * C
        s = jnp.clip(d, 0, M - C)
        take = lambda a: jax.lax.dynamic_slice_in_dim(a, s, C)
        rows = (take(friction.idx), take(friction.w0), take(friction.n0), take(friction.load))
        return i + 1, update(carry, s, s + row >= d, fn(rows))  # a last pass moved back skips rows seen

    return jax.lax.while_loop(lambda c: c[0] < (used + C - 1) // C, one_pass, (jnp.int32(0), carry))[1]


def _friction_rows(problem: StepProblem, x, energy: bool):
    ctx = problem.context
    eps = _fric.friction_eps(ctx.dt)

    def fn(rows):
        idx, w0, n0, load = rows
        X, X0 = x[idx], ctx.x0[idx]
        if energy:
            return jax.vmap(lambda *a: _fric.friction_energy(*a, eps=eps))(X, X0, w0, n0, load)
        return (jax.vmap(lambda *a: _fric.friction_gradient(*a, eps=eps))(X, X0, w0, n0, load),
                jax.vmap(lambda *a: _fric.friction_hessian(*a, eps=eps))(X, X0, w0, n0, load))
    return fn


def _small(contacts: ContactSet, problem: StepProblem):
    """Sets these folds do not take: no blocks, or fewer rows than a pass."""
    return (contacts.blocks is None or contacts.idx.shape[0] < CHUNK
            or problem.context.friction.idx.shape[0] < CHUNK)


def line_search_potential(x, problem: StepProblem, contacts: ContactSet) -> jnp.ndarray:
    """Φ(x) of :func:`ipcjax.potential.incremental_potential`, its barrier summed up to each
    kind's last used slot and its friction up to the last loaded row (module docstring).
    The same terms in the same order."""
    if _small(contacts, problem):
        return incremental_potential(x, problem, contacts)
    model, params, config = problem.model, problem.params, problem.config

    def barrier_rows(cs, X, w):
        d, _ = jax.vmap(_dist.stencil_distance)(X, w)
        off = stencil_offsets(cs, model.radius, config.min_gap)
        e = jax.vmap(lambda g: _bar.barrier(g, config.dhat, params.barrier_stiffness))(d - off)
        return jnp.where(cs.valid, e, 0.0)

    add = lambda total, start, mine, e: total + jnp.sum(jnp.where(mine, e, 0.0))
    zero = jnp.zeros((), x.dtype)
    folded = dict(barrier=fold_used_rows(x, contacts, barrier_rows, add, zero, chunk=CHUNK),
                  friction=_fold_loaded(problem.context.friction, _friction_rows(problem, x, True), add, zero))
    return sum(folded[t.name] if t.name in folded else t.value(x, problem, contacts) for t in TERMS)


def used_row_assembly(x, problem: StepProblem, contacts: ContactSet):
    """:func:`ipcjax.potential.gradient_and_blocks` (projected) over a compacted set blocked
    by kind, with its barrier elements taken up to each kind's last used slot and its
    friction elements up to the last loaded row (every other block zero, as a padding row's
    is); also returns every slot's gap (+∞ for padding), m. The same groups in the same
    order, the same elements to round-off."""
    model, params, config = problem.model, problem.params, problem.config
    M, k = contacts.idx.shape[0], params.barrier_stiffness
    if _small(contacts, problem):
        geom = stencil_geometry(x, contacts, model.radius, config.min_gap)
        g, hb = gradient_and_blocks(x, problem, contacts, geometry=geom)
        d, _ = jax.vmap(_dist.stencil_distance)(geom.X, geom.w)
        return g, hb, jnp.where(contacts.valid, d - geom.off, jnp.inf)

    def barrier_rows(cs, X, w):
        off = stencil_offsets(cs, model.radius, config.min_gap)
        d, _ = jax.vmap(_dist.stencil_distance)(X, w)
        ge = jax.vmap(_bar.stencil_barrier_gradient, in_axes=(0, 0, 0, None, None))(X, w, off, config.dhat, k)
        He = jax.vmap(_bar.stencil_barrier_hessian_psd, in_axes=(0, 0, 0, None, None))(X, w, off, config.dhat, k)
        v = cs.valid[:, None, None]
        return jnp.where(cs.valid, d - off, jnp.inf), jnp.where(v, ge, 0.0), jnp.where(v, He, 0.0)

    fs = problem.context.friction
    zeros = lambda n, k: (jnp.zeros((n, k, 3), x.dtype), jnp.zeros((n, 3 * k, 3 * k), x.dtype))
    gap, *barrier = fold_used_rows(x, contacts, barrier_rows, put_rows, (jnp.full(M, jnp.inf, x.dtype),) + zeros(M, 4),
                                   chunk=CHUNK)
    friction = _fold_loaded(fs, _friction_rows(problem, x, False), put_rows, zeros(fs.idx.shape[0], 4))
    folded = dict(barrier=(contacts.idx, *barrier), friction=(fs.idx, *friction))
    g, hb = gradient_and_blocks(x, problem, contacts, terms=tuple(t for t in TERMS if t.name not in folded))
    kept, rows, blocks = iter(zip(hb.rows, hb.blocks)), [], []
    for t in TERMS:  # one group per term but the inertia (a diagonal), in TERMS' order
        if t.name in folded:
            idx, ge, He = folded[t.name]
            r = _dof_rows(idx, model.free_slot)
            g = g.at[r.reshape(-1)].add(ge.reshape(-1), mode="drop")
            rows.append(r)
            blocks.append(He)
        elif not t.inertial:
            r, B = next(kept)
            rows.append(r)
            blocks.append(B)
    return g, HessianBlocks(hb.diag, tuple(rows), tuple(blocks), fs.count), gap

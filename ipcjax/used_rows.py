"""Φ for the Newton loop's line search, over the contact slots in use, not over every slot.

The loop's compacted contact sets (:mod:`ipcjax.newton`) have static sizes, set by the
most rows a run meets (``Capacity.active``): the rows within d̂ + 0.2 mm of x₀ fill 834 of
a compacted set's 2,337 slots at the pouch bag's tie, 50 in the lift (2.5 s;
``benchmarks/used_rows.py``). A padding slot's barrier is exactly 0. So
:func:`line_search_potential` sums the barrier only up to each kind's last used slot
(:func:`ipcjax.stencils.fold_used_rows`, in passes of :data:`CHUNK` rows), and takes every
other term from :mod:`ipcjax.potential`. Each row goes through the same formulas as in
:func:`ipcjax.potential.incremental_potential`; the sum is taken pass by pass, so the two
can differ in their last bits, which the loop never mixes (the line search compares values
of this Φ only). The passes are a ``while_loop``, which JAX cannot reverse-differentiate:
the implicit VJP and the gradients use :mod:`ipcjax.potential`.

The assembly and the friction term were folded the same way too, and not kept: the
assembly's blocks keep their static size for CHOLMOD (zeros past the used rows), whose
writing cost what the skipped rows saved at the tie, and their round-off carried the whole
protocol to another of its ends, with as much stepping time (docs/benchmarks.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ipcjax import distance as _dist
from ipcjax.energies import barrier as _bar
from ipcjax.potential import TERMS, incremental_potential
from ipcjax.problem import StepProblem
from ipcjax.stencils import ContactSet, fold_used_rows, stencil_offsets

#: Rows per pass of the barrier.
CHUNK = 64


def line_search_potential(x, problem: StepProblem, contacts: ContactSet) -> jnp.ndarray:
    """Φ(x) of :func:`ipcjax.potential.incremental_potential`, its barrier summed only up to
    each kind's last used slot (module docstring): the same terms in the same order. A set
    without ``blocks``, or of fewer rows than a pass, takes
    :func:`~ipcjax.potential.incremental_potential`."""
    if contacts.blocks is None or contacts.idx.shape[0] < CHUNK:
        return incremental_potential(x, problem, contacts)
    model, params, config = problem.model, problem.params, problem.config

    def barrier_rows(cs, X, w):
        d, _ = jax.vmap(_dist.stencil_distance)(X, w)
        off = stencil_offsets(cs, model.radius, config.min_gap)
        e = jax.vmap(lambda g: _bar.barrier(g, config.dhat, params.barrier_stiffness))(d - off)
        return jnp.where(cs.valid, e, 0.0)

    def add(total, start, mine, e):
        return total + jnp.sum(jnp.where(mine, e, 0.0))

    barrier = fold_used_rows(x, contacts, barrier_rows, add, jnp.zeros((), x.dtype), chunk=CHUNK)
    return sum(barrier if term.name == "barrier" else term.value(x, problem, contacts) for term in TERMS)

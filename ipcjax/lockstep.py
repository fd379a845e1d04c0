"""Branches that stay branches under ``vmap``: :func:`switch` for loops whose members run in
lockstep (issue #35).

``jax.lax.switch`` (and ``lax.cond``) with a batched index becomes a ``select`` under
``jax.vmap``: every branch runs for every member on every call. The Newton loop
(:mod:`ipcjax.newton`) is a machine of three phases, one ``switch`` per pass, and its query
branch is the most expensive of the three; vmapped for an ensemble
(:mod:`ipcjax.ensemble`), each pass ran all three, and a coarse-bag step took 5 times as
long for one member as unbatched (docs/benchmarks.md, "Ensembles in lockstep").

:func:`switch` is ``lax.switch`` for one member. Under ``vmap`` (its
``jax.custom_batching.custom_vmap`` rule) it runs branch b, for all members at once, only
when at least one member's index is b (a ``lax.cond`` on ``any``), and keeps its result for
those members. When the members are in the same phase, one branch runs per pass, as for a
single member; when they differ, the branches they are in run, not all of them. Each
member's result is its own branch's, computed under ``vmap``.

Limits: every branch must return a value of the operand's structure (a loop's state), and
``custom_vmap`` has no reverse-mode rule, so :func:`switch` belongs in loops that are not
reverse-differentiated (a ``while_loop`` is not anyway; the implicit VJP differentiates the
optimality condition, not the loop).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core


def switch(index, branches, operand):
    """``jax.lax.switch(index, branches, operand)``, whose ``vmap`` runs only the branches
    some member's ``index`` selects (module doc). Each branch maps the operand to a value of
    the same structure.

    Args:
        index: int32 scalar in [0, len(branches)).
        branches: functions of the operand.
        operand: a pytree.
    """
    flat, tree = jax.tree_util.tree_flatten(operand)

    def leaves_of(branch):
        return lambda *leaves: jax.tree_util.tree_leaves(branch(jax.tree_util.tree_unflatten(tree, leaves)))

    # each branch as a jaxpr whose closed-over values (batched ones among them, under vmap)
    # become explicit arguments: a custom_vmap function may not close over batched values
    jaxprs = [jax.make_jaxpr(leaves_of(b))(*flat) for b in branches]
    consts = [j.consts for j in jaxprs]

    def call(k, leaves, const):
        return jex_core.jaxpr_as_fun(jex_core.ClosedJaxpr(jaxprs[k].jaxpr, const))(*leaves)

    @jax.custom_batching.custom_vmap
    def run(index, leaves, consts):
        return jax.lax.switch(index, [lambda lv, cs, k=k: call(k, lv, cs[k]) for k in range(len(jaxprs))],
                              leaves, consts)

    @run.def_vmap
    def rule(axis_size, in_batched, index, leaves, consts):
        index_batched, leaves_batched, consts_batched = in_batched

        def batched(a, is_batched):
            return a if is_batched else jnp.broadcast_to(a, (axis_size,) + jnp.shape(a))

        leaves = [batched(a, b) for a, b in zip(leaves, leaves_batched)]
        index = batched(index, index_batched)
        out = leaves
        for k in range(len(jaxprs)):
            hit = index == k
            axes = [0 if b else None for b in consts_batched[k]]

            def take(out, k=k, hit=hit, axes=axes):
                new = jax.vmap(lambda lv, cs: call(k, lv, cs), in_axes=(0, axes))(leaves, consts[k])
                return [jnp.where(hit.reshape((axis_size,) + (1,) * (jnp.ndim(n) - 1)), n, o) for n, o in zip(new, out)]

            out = jax.lax.cond(jnp.any(hit), take, lambda out: out, out)
        return out, [True] * len(out)

    return jax.tree_util.tree_unflatten(tree, run(index, flat, consts))

"""Gradients through the step solve: implicit-function VJP and differentiable rollouts.

At the converged x* of one step, the free-DOF gradient of the incremental potential
vanishes: G(x*; θ) = ∇ₓΦ(x*; θ) = 0, with θ = (params, x₀, v₀, controls, dt). The
implicit-function theorem gives dx*/dθ = −H⁻¹ ∂G/∂θ with H = ∂G/∂x, so for a cotangent x̄

    u = −H⁻¹ x̄          (one linear solve with the Hessian at x*)
    θ̄ = uᵀ ∂G/∂θ        (one VJP of θ ↦ ∇ₓΦ(x*; θ))

Approximations, each documented in docs/differentiation.md:

* the candidate stencils, the active set and the lagged friction stencils of the step are
  held fixed in the backward pass (the friction loads λ = μf(−B′(g₀)), weights and normals
  are still differentiated through their dependence on x₀, μf and k);
* ``hessian="exact"`` (default) uses ∇²Φ assembled from exact element Hessians (the
  barrier's includes B′∇²d); ``hessian="projected"`` reuses the PSD Hessian of the
  forward Newton solve — cheaper and always factorizable, but only approximate;
* FP32 rounding of the stored positions passes the cotangent through unchanged;
* fixed particles satisfy x*ᵢ = x₀ᵢ, so their cotangent flows straight to x₀.

The linear solve follows ``config.linear_solver``: the dense path factorizes H (LU for
the exact Hessian, Cholesky for the projected one); the CG path solves with block-Jacobi
PCG on the element blocks, never forming H (at a minimiser the exact ∇²Φ is positive
semidefinite, and the inertia makes it definite); the sparse path factorizes the sparse
H by LDLᵀ on the host (:mod:`ipcjax.ldl`). A CG solve that misses its tolerance, or a
sparse factorization with a zero pivot (a non-positive one for the projected Hessian),
returns a NaN cotangent rather than a silently wrong one.

Nothing of the forward factorization is kept: the backward pass recomputes the Hessian
at the saved x*, so a rollout stores per step only x*, the step's inputs and its contact
stencils. Like the forward, it assembles the barrier only over the stencils inside d̂
(``Capacity.active`` rows); if x* has more of them than that — possible, since the
forward's last assembly was one small step before x* — it solves with every candidate
row instead (both paths are compiled; only one runs), so no contact is ever left out.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from ipcjax.ldl import sparse_solve
from ipcjax.model import Config, Controls, Model
from ipcjax.newton import active_size, block_jacobi, pcg
from ipcjax.potential import HessianBlocks, dense_hessian, gradient_and_blocks, hessian_matvec, incremental_potential
from ipcjax.result import StepCode
from ipcjax.step import recheck_rounded, result_code, solve_positions, step_context


def _free_gradient(x_star, model: Model, params, x0, v0, controls, dt, contacts, contacts0, config, active=None):
    """G(θ) = ∇ₓΦ(x*; θ) over the free DOFs, with x*'s fixed entries tied to x₀."""
    x = jnp.where(model.fixed[:, None], x0, x_star)
    ctx = step_context(model, params, x0, v0, controls, dt, contacts0, config, active)
    g = jax.grad(incremental_potential)(x, model, params, controls, ctx, contacts, config)
    return g[model.free_particles].reshape(-1)


def hessian_solve(hb: HessianBlocks, rhs, config: Config, hessian: str = "exact"):
    """u = H⁻¹ rhs over the free DOFs by the path ``config.linear_solver`` selects.

    Dense: LU (``hessian="exact"``, possibly indefinite away from a minimiser) or
    Cholesky (``"projected"``) of the scattered matrix. CG: block-Jacobi PCG on the
    blocks to ``config.cg_tolerance``; NaN where it does not converge. Sparse: host LDLᵀ
    of the blocks; NaN on a zero pivot (on a non-positive one for ``"projected"``).
    """
    if config.linear_solver == "cg":
        u, conv, _ = pcg(lambda v: hessian_matvec(hb, v), rhs, block_jacobi(hb),
                         config.cg_tolerance, config.cg_max_iterations)
        return jnp.where(conv, u, jnp.nan)
    if config.linear_solver == "sparse":
        return sparse_solve(hb, rhs, require_pd=(hessian == "projected"))[0]
    H = dense_hessian(hb)
    if hessian == "exact":
        return jnp.linalg.solve(H, rhs)
    return jsl.cho_solve(jsl.cho_factor(H, lower=True), rhs)


def solve_at(x, model: Model, params, controls, ctx, contacts, config: Config, rhs, hessian: str = "exact",
             active: int | None = None):
    """u = H⁻¹ rhs with H the Hessian (``hessian``: exact or projected) of Φ at x.

    H is assembled over the barrier stencils inside d̂ compacted into ``active`` rows
    (None: every candidate row); when x has more of them, the solve is redone with every
    row (``lax.cond``: both are compiled, one runs), so the result never misses a contact.
    """
    def solve_with(rows):
        _, hb = gradient_and_blocks(x, model, params, controls, ctx, contacts, config,
                                    exact=(hessian == "exact"), active=rows)
        return hessian_solve(hb, rhs, config, hessian), hb.n_active

    u, n_active = solve_with(active)
    if active is None:
        return u
    return jax.lax.cond(n_active <= active, lambda: u, lambda: solve_with(None)[0])


def make_solve(model: Model, config: Config, capacity, *, hessian: str = "exact"):
    """A differentiable ``solve(params, x0, v0, controls, dt) -> (x*, code)`` for one step.

    x* is the unrounded FP64 minimiser; ``code`` is the solve's StepCode (int32). The
    VJP is the implicit one described in the module docstring.
    """
    if hessian not in ("exact", "projected"):
        raise ValueError(f"hessian must be 'exact' or 'projected'; got {hessian!r}")
    active = active_size(capacity)

    def forward(params, x0, v0, controls, dt):
        x, cs, cs0, sinfo, overlap = solve_positions(model, params, x0, v0, controls, dt, config, capacity)
        code = result_code(sinfo, overlap, jnp.inf, sinfo.stats)
        return (x, code), (cs, cs0)

    @jax.custom_vjp
    def solve(params, x0, v0, controls, dt):
        return forward(params, x0, v0, controls, dt)[0]

    def fwd(params, x0, v0, controls, dt):
        (x, code), (cs, cs0) = forward(params, x0, v0, controls, dt)
        return (x, code), (x, cs, cs0, params, x0, v0, controls, dt)

    def bwd(res, cot):
        x, cs, cs0, params, x0, v0, controls, dt = res
        xbar = cot[0]
        fp = model.free_particles
        ctx = step_context(model, params, x0, v0, controls, dt, cs0, config, active)
        u = solve_at(x, model, params, controls, ctx, cs, config, -xbar[fp].reshape(-1), hessian, active)
        G = lambda p, a, b, c, d: _free_gradient(x, model, p, a, b, c, d, cs, cs0, config, active)
        _, vjp = jax.vjp(G, params, x0, v0, controls, dt)
        gp, gx0, gv0, gc, gdt = vjp(u)
        gx0 = gx0 + jnp.where(model.fixed[:, None], xbar, 0.0)
        return gp, gx0, gv0, gc, gdt

    solve.defvjp(fwd, bwd)
    return solve


def make_rollout(model: Model, config: Config, capacity, *, hessian: str = "exact", round_fp32: bool = True):
    """A differentiable rollout ``(params, x0, v0, controls_seq, dt) -> (frames, velocities, codes)``.

    ``controls_seq`` is a :class:`Controls` whose leaves carry a leading time axis (T, …),
    so supports, ties and forces can be time-indexed. The loop is a ``lax.scan`` over the
    implicit-VJP step; a failed step (non-zero code) keeps its input state and the code
    is returned per step, so the host can stop with the step index and reason.
    Returns frames (T, N, 3), velocities (T, N, 3) (FP64; FP32-rounded values when
    ``round_fp32``) and codes (T,) int32.
    """
    solve = make_solve(model, config, capacity, hessian=hessian)

    def rollout(params, x0, v0, controls_seq, dt):
        dt = jnp.asarray(dt, jnp.float64)

        def body(carry, ctl):
            x, v = carry
            x_new, code = solve(params, x, v, ctl, dt)
            if round_fp32:
                x32 = x_new.astype(jnp.float32)
                gap, st = recheck_rounded(model, jax.lax.stop_gradient(x32), config, capacity)
                code = code | jnp.where(gap <= 0, int(StepCode.GAP_LOST_IN_ROUNDING), 0).astype(jnp.int32)
                code = code | jnp.where(st.overflow, int(StepCode.CAPACITY_OVERFLOW), 0).astype(jnp.int32)
                x_new = x32.astype(jnp.float64)
            v_new = (x_new - x) / dt
            ok = code == 0
            x_out = jnp.where(ok, x_new, x)
            v_out = jnp.where(ok, v_new, v)
            return (x_out, v_out), (x_out, v_out, code)

        _, (frames, vels, codes) = jax.lax.scan(body, (jnp.asarray(x0, jnp.float64), jnp.asarray(v0, jnp.float64)),
                                                controls_seq)
        return frames, vels, codes

    return rollout


def stack_controls(controls_list) -> Controls:
    """Stack a list of per-step :class:`Controls` (same shapes) into a time-indexed one."""
    return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *controls_list)

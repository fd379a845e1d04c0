"""Gradients through the step solve: implicit-function VJP and differentiable rollouts.

At the converged x* of one step, the free-DOF gradient of the incremental potential
vanishes: G(x*; θ) = ∇ₓΦ(x*; problem(θ)) = 0, with θ the step's inputs
(:class:`~ipcjax.problem.StepInputs`: params, x₀, v₀, controls, dt) and problem(θ) its
:class:`~ipcjax.problem.StepProblem` (:func:`ipcjax.step.step_problem`). The
implicit-function theorem gives dx*/dθ = −H⁻¹ ∂G/∂θ with H = ∂G/∂x, so for a cotangent x̄

    u = −H⁻¹ x̄          (one linear solve with the Hessian at x*: :func:`solve_at`)
    θ̄ = uᵀ ∂G/∂θ        (one VJP of θ ↦ ∇ₓΦ(x*; problem(θ)), as jaxopt's ``root_vjp``)

Approximations, each documented in docs/differentiation.md:

* the candidate stencils, the active set and the lagged friction stencils of the step are
  held fixed in the backward pass (the friction loads λ = μf(−B′(g₀)), weights and normals
  are still differentiated through their dependence on x₀, μf and k);
* ``hessian="exact"`` (default, :attr:`PSDProjection.NONE <ipcjax.energies.PSDProjection>`)
  uses ∇²Φ assembled from exact element Hessians (the barrier's includes B′∇²d);
  ``hessian="projected"`` (``PSDProjection.PER_ELEMENT``) reuses the PSD Hessian of the
  forward Newton solve — cheaper and always factorizable, but only approximate;
* FP32 rounding of the stored positions passes the cotangent through unchanged;
* fixed particles satisfy x*ᵢ = x₀ᵢ, so their cotangent flows straight to x₀.

The linear solve is the ``solve`` of the same solver object the Newton direction uses
(:func:`ipcjax.linear_solvers.linear_solver` of ``config``): the dense one factorizes H
(LU for the exact Hessian, Cholesky for the projected one); CG solves with block-Jacobi
PCG on the element blocks, never forming H (at a minimiser the exact ∇²Φ is positive
semidefinite, and the inertia makes it definite); the sparse one factorizes the sparse
H on the host (:mod:`ipcjax.ldl`: CHOLMOD's Cholesky for the projected
Hessian, QDLDL's LDLᵀ for the exact one). A solve that fails (a singular LU, a zero
pivot, a non-positive one for the projected Hessian, CG short of its tolerance) gives a
NaN solution and its :class:`~ipcjax.result.LinearStatus`, and a host check then raises
:class:`BackwardFailed` naming that status rather than hand back a NaN (or silently
wrong) gradient.

A rollout (:class:`Rollout`) never returns a failed step either: a non-zero step code
raises :class:`RolloutFailed` naming the step and the reason, and a capacity overflow
outside ``jit`` grows the candidate capacity and runs again.

Nothing of the forward factorization is kept: the backward pass recomputes the Hessian
at the saved x*, so a rollout stores per step only x*, the step's inputs and its contact
stencils. Like the forward, it assembles the barrier only over the stencils inside d̂
(``Capacity.active`` rows). x* never has more of them than that: it lies on the segment
of the solve's last line search, which ran over every row within reach of that segment,
and more of those than the rows is a capacity overflow of the forward. Should x* have
more all the same, the backward raises :class:`BackwardFailed`
(``LinearStatus.TOO_FEW_ROWS``) rather than leave a contact out. The rollout's FP32 gap
recheck is taken inside the forward, on the solve's last candidate set, as the jitted
step takes it; so a differentiated step queries candidates once.
"""
from __future__ import annotations

import dataclasses
import logging
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from ipcjax import candidates as _cand
from ipcjax.energies import PSDProjection
from ipcjax.linear_solvers import LinearSolution, linear_solver
from ipcjax.model import Config, Controls, Model, check_controls, check_dt, check_params
from ipcjax.newton import CandidateStats, active_size
from ipcjax.potential import gradient_and_blocks, incremental_potential
from ipcjax.problem import StepInputs, StepProblem
from ipcjax.result import LinearStatus, StepCode, set_code
from ipcjax.stencils import ContactSet, friction_kinks
from ipcjax.step import StepFailed, result_code, solve_positions, step_problem


def free_gradient(x, problem: StepProblem, contacts: ContactSet):
    """∇ₓΦ(x; problem) over the free DOFs, (3F,) N."""
    g = jax.grad(incremental_potential)(x, problem, contacts)
    return g[problem.model.free_particles].reshape(-1)


def solve_at(x, problem: StepProblem, contacts: ContactSet, rhs, *, projection: PSDProjection = PSDProjection.NONE,
             active: int | None = None) -> LinearSolution:
    """u = H⁻¹ rhs with H the Hessian of Φ at x (``projection``: exact or per-element PSD).

    The linear solver is the one ``config.linear_solver`` names (:mod:`ipcjax.linear_solvers`);
    its :class:`~ipcjax.linear_solvers.LinearSolution` comes back whole (``value`` is NaN
    unless ``status`` is SUCCESSFUL). H is assembled over the barrier stencils inside d̂
    compacted into ``active`` rows (None: every candidate row). When x has more of them
    than ``active``, the solution is NaN with the status ``TOO_FEW_ROWS``: the result never
    misses a contact silently. A rollout's x* always fits (:func:`make_solve`).
    """
    solver = linear_solver(problem.config)
    with jax.named_scope("solve_at_active_rows"):
        _, hb = gradient_and_blocks(x, problem, contacts, projection=projection, active=active)
        sol = solver.solve(solver.init(hb), rhs, projection)
    if active is None or hb.n_active is None:  # no compaction, or no contact term
        return sol
    status = jnp.where(hb.n_active > active, jnp.int32(LinearStatus.TOO_FEW_ROWS), sol.status)
    return LinearSolution.masked(sol.value, status, sol.stats, jnp.nan)


def make_solve(model: Model, config: Config, capacity, *, hessian: str | PSDProjection = "exact",
               with_stats: bool = False):
    """A differentiable ``solve(params, x0, v0, controls, dt) -> (x*, code)`` for one step.

    x* is the unrounded FP64 minimiser; ``code`` is the solve's StepCode (int32). The
    VJP is the implicit one described in the module docstring; ``hessian`` is its
    :class:`~ipcjax.energies.PSDProjection` ("exact" or "projected"). With ``with_stats`` it
    returns ``(x*, code, stats, kinks, rounded_gap)``: the solve's
    :class:`~ipcjax.newton.CandidateStats` (what a capacity overflow needed), the number
    of friction stencils at x₀ on a closest-feature boundary
    (:func:`ipcjax.stencils.friction_kinks`), and the smallest gap at x* rounded to FP32,
    taken on the solve's last candidate set (``SolveInfo.rounded_gap``, as the jitted step
    takes it; no second query). A backward solve that fails (a singular
    Hessian, CG short of its tolerance) raises :class:`BackwardFailed` instead of a NaN
    gradient.

    The backward assembles over ``Capacity.active`` rows, and a solved step's x* never has
    more stencils inside d̂ than that: x* lies on the segment of the solve's last line search,
    which ran over every row within reach of that segment, and more of those than the rows
    is a ``CAPACITY_OVERFLOW`` of the forward (:mod:`ipcjax.newton`). Should it happen all
    the same, the backward raises (``LinearStatus.TOO_FEW_ROWS``) rather than leave a
    contact out.

    Raises:
        ValueError: an unknown ``hessian``.
    """
    projection = PSDProjection(hessian)
    active = active_size(capacity)

    def forward(inputs: StepInputs):
        x, cs, cs0, sinfo, gaps0 = solve_positions(model, inputs, config, capacity)
        code = result_code(sinfo, gaps0, jnp.inf, sinfo.stats)
        if not with_stats:
            return (x, code), (cs, cs0, code)
        kinks = friction_kinks(inputs.x0, cs0, model.radius, inputs.params, config, gaps0=gaps0)
        return (x, code, sinfo.stats, kinks, sinfo.rounded_gap), (cs, cs0, code)

    @jax.custom_vjp
    def solve(inputs: StepInputs):
        return forward(inputs)[0]

    def fwd(inputs: StepInputs):
        with jax.named_scope("implicit_forward"):
            out, (cs, cs0, code) = forward(inputs)
        return out, (out[0], cs, cs0, code, inputs)

    @jax.named_scope("implicit_backward")
    def bwd(res, cot):
        # one VJP over the step's inputs θ: θ̄ = uᵀ ∂G/∂θ with H u = −x̄ (module docstring)
        x, cs, cs0, code, inputs = res
        xbar = cot[0]
        problem = step_problem(model, config, inputs, cs0, active=active)
        sol = solve_at(x, problem, cs, -xbar[model.free_particles].reshape(-1), projection=projection, active=active)
        # a failed step raises in the forward's check; its backward has nothing to report
        jax.debug.callback(_check_backward, jnp.where(code == 0, sol.status, jnp.int32(LinearStatus.SUCCESSFUL)))
        u = sol.value  # NaN unless the solve succeeded
        def G(theta):  # x*'s fixed entries are x₀'s
            x_tied = jnp.where(model.fixed[:, None], theta.x0, x)
            return free_gradient(x_tied, step_problem(model, config, theta, cs0, active=active), cs)

        with jax.named_scope("implicit_vjp"):
            _, vjp = jax.vjp(G, inputs)
            (theta_bar,) = vjp(u)
        # fixed particles: x*ᵢ = x₀ᵢ, their cotangent flows straight to x₀
        return (theta_bar._replace(x0=theta_bar.x0 + jnp.where(model.fixed[:, None], xbar, 0.0)),)

    solve.defvjp(fwd, bwd)
    if with_stats:
        return lambda params, x0, v0, controls, dt: solve(StepInputs(params, x0, v0, controls, dt))
    return lambda params, x0, v0, controls, dt: solve(StepInputs(params, x0, v0, controls, dt))[:2]


class RolloutFailed(StepFailed):
    """A rollout step failed: ``step`` (index in the rollout), ``code`` and ``reason``.

    ``needs`` holds what the failing step's candidate queries needed (n_vt, n_ee, n_sf,
    work, n_active), from which :class:`Rollout` grows its capacity on an overflow.
    """

    def __init__(self, step: int, code: int, needs=None):
        self.step = int(step)
        self.needs = needs
        reason = StepCode.describe(code)
        msg = f"rollout step {self.step} failed: {reason}"
        if code & StepCode.CAPACITY_OVERFLOW and needs is not None:
            msg += (f" (candidate rows needed: vt {needs[0]}, ee {needs[1]}, sf {needs[2]}, active {needs[4]}; "
                    "called outside jit, a Rollout grows its capacity and runs again; under jit, call it "
                    "once outside jit first, or build it with a larger capacity)")
        super().__init__(msg, code)
        self.reason = reason


class BackwardFailed(RuntimeError):
    """The implicit backward solve of a step failed: its gradient would be NaN.

    ``status`` is the solve's :class:`~ipcjax.result.LinearStatus` (singular, not positive
    definite, non-finite input, CG's iteration cap or breakdown).
    """

    def __init__(self, message, *, status: int):
        super().__init__(message)
        self.status = int(status)


_LAST_FAILURE: list = [None]  # the exception a check raised last (see rollout_failure)


def rollout_failure(exc: BaseException):
    """The :class:`RolloutFailed` or :class:`BackwardFailed` behind ``exc``, or None.

    Outside jit a rollout raises its failure directly; inside a jitted function JAX
    reports it as a ``JaxRuntimeError`` whose text carries the message. This maps either
    back to the original exception (with ``step``, ``code``, ``needs``).
    """
    if isinstance(exc, (RolloutFailed, BackwardFailed)):
        return exc
    last = _LAST_FAILURE[0]
    if last is not None and str(last) in str(exc):
        return last
    return None


def _raise(err):
    _LAST_FAILURE[0] = err
    raise err


def _check_backward(status):
    """Host check after a backward solve: raise :class:`BackwardFailed` naming its status."""
    status = int(np.asarray(status))
    if status == LinearStatus.SUCCESSFUL:
        return
    what = ("more stencils inside d̂ at x* than the capacity's active rows, which the forward's reach check "
            "rules out: please report the scene; a larger Capacity.active avoids it"
            if status == LinearStatus.TOO_FEW_ROWS else "the Hessian at x*, or CG on it")
    _raise(BackwardFailed(f"the implicit backward solve of a rollout step failed: {LinearStatus.describe(status)} "
                          f"({what}); the gradient would be NaN", status=status))


def _check_codes(codes, stats: CandidateStats):
    """Host check after a rollout: raise :class:`RolloutFailed` at the first failed step."""
    codes = np.asarray(codes)
    T = codes.shape[-1]
    flat = codes.reshape(-1, T)
    bad = np.argwhere(flat != 0)
    if not bad.size:
        return
    b, i = (int(v) for v in bad[0])
    pick = lambda a: np.asarray(a).reshape((-1, T) + np.shape(a)[codes.ndim:])[b, i]
    needs = (int(pick(stats.n_vt)), int(pick(stats.n_ee)), int(pick(stats.n_sf)), pick(stats.work),
             int(pick(stats.n_active)))
    _raise(RolloutFailed(i, int(flat[b, i]), needs))


class NonDifferentiableWarning(UserWarning):
    """A rollout started steps with friction stencils on a closest-feature boundary."""


def _warn_kinks(kinks):
    """Host warning: steps whose start has friction stencils on a closest-feature boundary."""
    kinks = np.asarray(kinks)
    T = kinks.shape[-1]
    per_step = kinks.reshape(-1, T).max(axis=0)
    steps = np.flatnonzero(per_step)
    if steps.size:
        listed = ", ".join(f"step {i}: {per_step[i]}" for i in steps[:8]) + (" …" if steps.size > 8 else "")
        warnings.warn(f"{int(per_step.sum())} friction stencil(s) start on a closest-feature boundary ({listed}); "
                      "the trajectory is not differentiable there in x0 and the gradient is one of its one-sided "
                      "values (perturb or rotate the start; docs/differentiation.md)", NonDifferentiableWarning,
                      stacklevel=2)


class _QuietChecks(logging.Filter):
    """JAX logs every exception a debug callback raises; ours reach the caller anyway."""

    def filter(self, record):
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, (RolloutFailed, BackwardFailed))


logging.getLogger("jax._src.debugging").addFilter(_QuietChecks())


#: Newton tolerance (m) of a differentiated step by default (see :class:`Rollout`).
DIFF_TOLERANCE = 1e-9
#: Iteration cap of a differentiated step, at least: a 1e-9 m tolerance needs about a
#: hundred iterations on frictional sliding (``benchmarks/gradient_tolerance.py``).
DIFF_MAX_NEWTON = 300


class Rollout:
    """A differentiable rollout ``(params, x0, v0, controls_seq, dt) -> (frames, velocities, codes)``.

    ``controls_seq`` is a :class:`Controls` whose leaves carry a leading time axis (T, …),
    so supports, ties and forces can be time-indexed. The loop is a ``lax.scan`` over the
    implicit-VJP step. Returns frames (T, N, 3), velocities (T, N, 3) (FP64; FP32-rounded
    values when ``round_fp32``) and codes (T,) int32, all zero: a rollout never returns a
    failed step. With ``report=True`` a fourth output, kinks (T,) int32, counts per step the
    friction-loaded stencils whose start sits on a closest-feature boundary or whose edges
    are parallel (:func:`ipcjax.stencils.friction_kinks`); where it is non-zero the
    trajectory is not differentiable in x₀, and a :class:`NonDifferentiableWarning` says so
    whether or not the counts are returned.

    * **Failures raise.** After the scan a host check (``jax.debug.callback``) raises
      :class:`RolloutFailed` naming the first failed step and its reason. This holds under
      ``jax.grad``, ``vmap`` and ``jit`` alike; inside a jitted function JAX reports it as
      a ``JaxRuntimeError`` carrying the same message (:func:`rollout_failure` maps it
      back). A failed backward solve raises :class:`BackwardFailed`.
    * **Capacity follows the trajectory.** ``capacity=None`` starts from
      :func:`~ipcjax.capacity.initial_capacity`. Called outside ``jit`` (plain calls and
      ``jax.grad`` of them), a capacity overflow grows the capacity above what the
      failing step needed and runs again, up to ``max_regrow`` times; ``self.capacity``
      keeps the grown value. Under ``jit`` the overflow raises; call the rollout once
      outside jit first (at the start parameters) to size it.
    * **Converged enough to differentiate.** The implicit VJP assumes ∇ₓΦ(x*) = 0, so the
      gradient is only as good as the solve: each step's Newton tolerance is
      min(controls.tolerance, ``tolerance``), by default :data:`DIFF_TOLERANCE` (1e-9 m),
      and the iteration cap at least :data:`DIFF_MAX_NEWTON`. On two film layers sliding
      with friction that keeps the gradient within 1.7e-4 relative of the converged one for
      E, μf, kθ, x₀ and v₀, where the 1.2e-5 m step default is off by up to 92 %
      (``python3 -m benchmarks.gradient_tolerance``, docs/differentiation.md).
      ``tolerance=None`` uses the controls' tolerance as given.
    * **Inputs are checked** on the host when concrete: parameters are canonicalised to
      float64 (:func:`~ipcjax.model.check_params`, so a weak-typed or float32 leaf never
      recompiles) and checked against their ranges, dt > 0, the controls' shapes and
      indices, x₀ and v₀ shapes and finiteness.
    """

    def __init__(self, model: Model, config: Config, capacity=None, *, hessian: str | PSDProjection = "exact",
                 round_fp32: bool = True, max_regrow: int = 6, tolerance: float | None = DIFF_TOLERANCE,
                 report: bool = False):
        projection = PSDProjection(hessian)
        if tolerance is not None:
            if not (np.isfinite(tolerance) and tolerance > 0):
                raise ValueError(f"tolerance must be a finite number > 0 m, or None; got {tolerance!r}")
            config = dataclasses.replace(config, max_newton=max(config.max_newton, DIFF_MAX_NEWTON))
        self.model, self.config, self.projection, self.round_fp32 = model, config, projection, round_fp32
        self.tolerance, self.report = tolerance, bool(report)
        self.capacity = _cand.initial_capacity(model.topology) if capacity is None else _cand.check_capacity(capacity)
        self.max_regrow = int(max_regrow)
        self._compiled = {}

    def _scan(self, capacity):
        """The jitted rollout at ``capacity`` (jitted here, so repeated plain and ``jax.grad``
        calls reuse one compilation instead of retracing the scan each time)."""
        if capacity not in self._compiled:
            self._compiled[capacity] = jax.jit(self._rollout(capacity))
        return self._compiled[capacity]

    def _rollout(self, capacity):
        """The scanned rollout at one static capacity, with the host check of its codes."""
        model, config, tolerance, round_fp32 = self.model, self.config, self.tolerance, self.round_fp32
        solve = make_solve(model, config, capacity, hessian=self.projection, with_stats=True)

        def rollout(params, x0, v0, controls_seq, dt):
            dt = jnp.asarray(dt, jnp.float64)
            if tolerance is not None:
                controls_seq = controls_seq._replace(tolerance=jnp.minimum(controls_seq.tolerance, tolerance))

            def body(carry, ctl):
                x, v = carry
                x_new, code, stats, kinks, rounded_gap = solve(params, x, v, ctl, dt)
                if round_fp32:
                    code = set_code(code, StepCode.GAP_LOST_IN_ROUNDING, where=rounded_gap <= 0)
                    x_new = x_new.astype(jnp.float32).astype(jnp.float64)
                v_new = (x_new - x) / dt
                ok = code == 0
                x_out = jnp.where(ok, x_new, x)
                v_out = jnp.where(ok, v_new, v)
                return (x_out, v_out), (x_out, v_out, code, stats, kinks)

            x0 = jnp.asarray(x0, jnp.float64)
            _, (frames, vels, codes, stats, kinks) = jax.lax.scan(body, (x0, jnp.asarray(v0, jnp.float64)),
                                                                  controls_seq)
            jax.debug.callback(_check_codes, codes, stats)
            jax.debug.callback(_warn_kinks, kinks)
            return (frames, vels, codes, kinks) if self.report else (frames, vels, codes)

        return rollout

    def _check_inputs(self, params, x0, v0, controls_seq, dt):
        params = check_params(params)
        check_dt(dt)
        check_controls(self.model, controls_seq, time_axis=True)
        n = self.model.n_particles
        for name, a in (("x0", x0), ("v0", v0)):
            if np.shape(a) != (n, 3):
                raise ValueError(f"{name} must have shape ({n}, 3); got {np.shape(a)}")
            if not isinstance(a, jax.core.Tracer) and not np.all(np.isfinite(np.asarray(a))):
                raise ValueError(f"{name} must be finite")
        return params

    def __call__(self, params, x0, v0, controls_seq, dt):
        params = self._check_inputs(params, x0, v0, controls_seq, dt)
        x0, v0 = jnp.asarray(x0, jnp.float64), jnp.asarray(v0, jnp.float64)
        for attempt in range(self.max_regrow + 1):
            try:
                return self._scan(self.capacity)(params, x0, v0, controls_seq, dt)
            except Exception as exc:  # raised here only outside jit; under jit it surfaces at run time
                failure = rollout_failure(exc)
                if failure is None:
                    raise
                if (not isinstance(failure, RolloutFailed) or not failure.code & StepCode.CAPACITY_OVERFLOW
                        or attempt == self.max_regrow):
                    raise failure from None
                n_vt, n_ee, n_sf, work, n_active = failure.needs
                self.capacity = _cand.grow_capacity(self.capacity, n_vt, n_ee, n_sf, work, n_active=n_active)
        raise AssertionError("unreachable")  # pragma: no cover


def make_rollout(model: Model, config: Config, capacity=None, *, hessian: str | PSDProjection = "exact",
                 round_fp32: bool = True, max_regrow: int = 6, tolerance: float | None = DIFF_TOLERANCE,
                 report: bool = False) -> Rollout:
    """A differentiable :class:`Rollout` (see there: failures raise, capacity grows, and each
    step converges to ``tolerance``, 1e-9 m by default, so that its gradient is accurate)."""
    return Rollout(model, config, capacity, hessian=hessian, round_fp32=round_fp32, max_regrow=max_regrow,
                   tolerance=tolerance, report=report)


def stack_controls(controls_list) -> Controls:
    """Stack a list of per-step :class:`Controls` (same shapes) into a time-indexed one."""
    return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *controls_list)

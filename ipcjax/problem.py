"""One timestep's problem as one value, beside the positions x and the contact set.

The incremental potential Φ(x) of a step depends, besides x and the barrier stencils, on
the model, the material parameters, the controls, what the step start fixes (inertial
target, lagged friction) and the solver settings. :class:`StepProblem` carries them
together, as optimistix's ``fn(y, args)`` carries ``args``: the potential
(:mod:`ipcjax.potential`), the Newton solve and the step bound (:mod:`ipcjax.newton`,
:mod:`ipcjax.line_search`) and the implicit VJP (:mod:`ipcjax.implicit`) all take
``(x, problem, contacts)``. A new energy term reads what it needs from this one type and
is one class in :data:`ipcjax.potential.TERMS`.

:class:`StepInputs` is what a step is differentiated in, θ = (params, x₀, v₀, controls, dt);
:func:`ipcjax.step.step_problem` builds the problem from it, and the implicit VJP is one
``jax.vjp`` of θ ↦ ∇ₓΦ(x*; problem(θ)).
"""
from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from ipcjax.model import Config, Controls, Model, Params


class FrictionSet(NamedTuple):
    """Frozen (lagged) friction data of the contacts active at step start."""

    idx: jnp.ndarray    # (M, 4) int32
    w0: jnp.ndarray     # (M, 4) closest-point weights at step start
    n0: jnp.ndarray     # (M, 3) unit normals at step start
    load: jnp.ndarray   # (M,) μf·(−B′(g₀)) in N; 0 for inactive rows
    count: jnp.ndarray  # stencils with a load (also when more than M rows were kept)


class StepContext(NamedTuple):
    """What the step start fixes for the whole Newton solve."""

    x0: jnp.ndarray        # (N, 3) step-start positions, m (FP64)
    y: jnp.ndarray         # (N, 3) inertial target, m
    dt: jnp.ndarray        # () s
    friction: FrictionSet


class StepInputs(NamedTuple):
    """The differentiable inputs θ of one step."""

    params: Params
    x0: jnp.ndarray        # (N, 3) m, FP64
    v0: jnp.ndarray        # (N, 3) m/s, FP64
    controls: Controls
    dt: jnp.ndarray        # () s


class StepProblem(NamedTuple):
    """Everything Φ depends on besides x and the contact set (a pytree; ``config``'s model
    names are static, its numbers traced; ``model``'s shapes are static)."""

    model: Model
    params: Params
    controls: Controls
    context: StepContext
    config: Config

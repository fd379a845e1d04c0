"""ipcjax: differentiable Incremental Potential Contact for thin film and spheres, in JAX.

One timestep, in the order its data flows (docs/spec.md §2):

    model.py          Model (static topology, rest data), Params, Controls, State, Config
    problem.py        StepInputs θ and StepProblem: the one value the solver passes around
    energies/         element energies beside their derivatives; MembraneModel, BendingModel,
                      PSDProjection (which element Hessians)
    potential.py      Φ(x; problem, contacts), ∇Φ and the Hessian as element blocks
    candidates.py     broad phase with static capacity and an overflow flag
    capacity.py       the broad phase's capacities: first guess, check, growth
    linear_solvers.py LinearSolver: DenseCholesky, SparseLDL (ldl.py), BlockJacobiCG; direction
                      and solve, each a LinearSolution with a LinearStatus
    line_search.py    conservative step bound (ccd.py, distance.py) and Armijo backtracking
    newton.py         the bounded Newton loop over a NewtonState
    step.py           one step: solve, FP32 rounding, gap recheck, velocities; host retries
    implicit.py       the implicit VJP of a step and differentiable rollouts
    result.py         StepCode bits and the one helper that sets them; LinearStatus
    compile_guard.py  frees compiled programs before XLA's CPU compiler meets the kernel's
                      cap on memory mappings (installed on import; changes no JAX setting)

Importing ipcjax enables JAX's float64 mode: distances, derivatives and the global
linear system are FP64 by design (positions are stored rounded to FP32).
"""
import jax as _jax

_jax.config.update("jax_enable_x64", True)

from ipcjax import compile_guard as _compile_guard  # noqa: E402

_compile_guard.install()

__version__ = "0.1.0"

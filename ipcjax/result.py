"""Step result codes: failures are data inside jit and exceptions (or retries) at the edge."""
from __future__ import annotations

import enum

import jax.numpy as jnp


class StepCode(enum.IntFlag):
    """Bit flags describing why a step's output was discarded (0 = success)."""

    OK = 0
    LINE_SEARCH_EXHAUSTED = 1
    ITERATION_CAP = 2
    GAP_LOST_IN_ROUNDING = 4
    NON_FINITE = 8
    FACTORIZATION_FAILED = 16
    CAPACITY_OVERFLOW = 32
    INITIAL_OVERLAP = 64
    ZERO_STEP_BOUND = 128

    @classmethod
    def describe(cls, code: int) -> str:
        code = int(code)
        if code == 0:
            return "ok"
        return " | ".join(f.name.lower().replace("_", " ") for f in cls if f and code & f)


#: Failures that a smaller timestep can cure: the host driver retries with two half-steps.
RETRYABLE = (StepCode.LINE_SEARCH_EXHAUSTED | StepCode.ITERATION_CAP
             | StepCode.GAP_LOST_IN_ROUNDING | StepCode.ZERO_STEP_BOUND)


def set_code(code, flag: StepCode, *, where=None, unless=None):
    """``code`` (int32) with the bit ``flag`` set where ``where`` holds, or where ``unless``
    does not (give one of the two; traceable)."""
    bit = jnp.where(where, int(flag), 0) if unless is None else jnp.where(unless, 0, int(flag))
    return code | bit.astype(jnp.int32)


class LinearStatus(enum.IntEnum):
    """Why a linear solve (:mod:`ipcjax.linear_solvers`) gave no answer (0 = success), in
    the manner of lineax's ``RESULTS``. Inside jit it is an int32; :meth:`describe` names it."""

    SUCCESSFUL = 0
    NON_FINITE_INPUT = 1        # a NaN or an infinity in the matrix or the right-hand side
    NOT_POSITIVE_DEFINITE = 2   # Cholesky failed, or an LDLᵀ pivot ≤ 0 where the solve needs H > 0
    SINGULAR = 3                # a zero pivot, or a non-finite solution of a finite system
    MAX_ITERATIONS = 4          # CG stopped at its iteration cap short of its tolerance
    BREAKDOWN = 5               # CG met a non-positive curvature pᵀHp: H is not positive definite
    TOO_FEW_ROWS = 6            # more stencils inside d̂ than the assembly's rows (Capacity.active): no solve

    @classmethod
    def describe(cls, status: int) -> str:
        status = int(status)
        try:
            return cls(status).name.lower().replace("_", " ")
        except ValueError:
            return f"unknown linear-solve status {status}"

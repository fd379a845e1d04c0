"""K members of one model stepped in lockstep: one jitted, ``vmap``ped program with no host
round trip (issue #35, item 2, its first part).

:func:`ensemble_step` advances K states of the same model by one step, each with its own
parameters and controls (stacked along a leading member axis, :func:`stack`), through
:func:`ipcjax.step.step` under ``jax.vmap``. The linear solve must run inside XLA
(``Config.linear_solver`` ``"dense"`` or ``"cg"``): the host LDLᵀ (``"sparse"``) is a
``jax.pure_callback`` per Newton iteration, and is refused. :func:`host_callbacks` lists the
host callbacks a traced function contains, so a test can check that the program has none.

What this does not do yet, and the host driver (:func:`ipcjax.step.advance`) does for one
member: grow the capacity on overflow and subdivide a failed step. Here the capacity is
fixed for the ensemble, and a member whose step fails keeps its input state and reports its
code (:class:`ipcjax.result.StepCode`), exactly as ``step`` does; :func:`check_members`
turns any failure into an error naming the member, so nothing fails silently. The bag's
controls are still built on the host, once a step per member (docs/usage.md).
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from ipcjax.model import Config, Model
from ipcjax.result import StepCode
from ipcjax.step import step

#: The names of JAX's host-callback primitives.
HOST_CALLBACKS = ("pure_callback", "debug_callback", "io_callback", "callback")


def stack(trees):
    """Stack a list of pytrees of the same structure (params, states, controls) along a new
    leading member axis."""
    return jax.tree_util.tree_map(lambda *a: jnp.stack([jnp.asarray(x) for x in a]), *trees)


def host_callbacks(fn, *args, **kwargs) -> list[str]:
    """The host-callback primitives in the jaxpr of ``fn(*args, **kwargs)``, sub-jaxprs
    (loops, conditionals, nested jits) included; empty when the program never calls the host."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in HOST_CALLBACKS:
                found.append(eqn.primitive.name)
            for sub in jex_core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args, **kwargs).jaxpr)
    return found


@partial(jax.jit, static_argnames=("capacity",))
def _ensemble_step(model, params, states, controls, dt, *, config, capacity):
    return jax.vmap(lambda p, s, c: step(model, p, s, c, dt, config=config, capacity=capacity))(
        params, states, controls)


def ensemble_step(model: Model, params, states, controls, dt, *, config: Config, capacity):
    """One step of K members in lockstep, as one program.

    Args:
        model: the members' common model.
        params, states, controls: :class:`~ipcjax.model.Params`, :class:`~ipcjax.step.State`
            and :class:`~ipcjax.model.Controls`, each stacked over the K members
            (:func:`stack`).
        dt: the step, s.
        config: solver settings; the linear solver must run in XLA (``"dense"``, ``"cg"``).
        capacity: the candidate and active-row capacity of every member (static; one that
            a single member's :func:`ipcjax.step.advance` has grown to is a good start).

    Returns:
        (states, infos) stacked over the members, as :func:`ipcjax.step.step` returns them
        for one: a failed member keeps its input state.

    Raises:
        ValueError: the host linear solver, no capacity, an unstacked leaf, or member axes
            of different sizes.
    """
    if config.linear_solver == "sparse":
        raise ValueError("ensemble_step needs a linear solve inside XLA (Config.linear_solver 'dense' or 'cg'); "
                         "'sparse' calls the host LDLᵀ in every Newton iteration")
    if capacity is None:
        raise ValueError("ensemble_step needs a fixed capacity for the ensemble (ipcjax.capacity.Capacity); "
                         "a single member's advance() reports one it has grown to")
    leaves = jax.tree_util.tree_leaves((params, states, controls))
    if any(np.ndim(a) == 0 for a in leaves):
        raise ValueError("params, states and controls must be stacked over the members (ipcjax.ensemble.stack); "
                         "a leaf has no member axis")
    sizes = {int(np.shape(a)[0]) for a in leaves}
    if len(sizes) != 1:
        raise ValueError(f"params, states and controls need the same number of members; got sizes {sorted(sizes)}")
    return _ensemble_step(model, params, states, controls, jnp.asarray(dt), config=config, capacity=capacity)


class MemberFailed(RuntimeError):
    """A member's step of an ensemble failed: its index, code and reason."""

    def __init__(self, index: int, code: int):
        self.index, self.code = index, code
        self.reason = StepCode.describe(code)
        super().__init__(f"ensemble member {index} failed its step: {self.reason} (code {code})")


def check_members(infos) -> None:
    """Raise :class:`MemberFailed` for the first member whose step did not succeed.

    Raises:
        MemberFailed: a member's code is not 0 (capacity overflow, iteration cap, …).
    """
    codes = np.asarray(infos.code)
    bad = np.flatnonzero(codes != 0)
    if bad.size:
        raise MemberFailed(int(bad[0]), int(codes[bad[0]]))

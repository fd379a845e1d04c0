"""K members of one model stepped in lockstep: one jitted, ``vmap``ped program with no host
round trip inside it (issue #35, item 2).

:func:`ensemble_step` advances K states of the same model by one step, each with its own
parameters and controls (stacked along a leading member axis, :func:`stack`), through
:func:`ipcjax.step.step` under ``jax.vmap``. :func:`ensemble_rollout` runs many steps in
one program and does what the host driver :func:`ipcjax.step.advance` does for one member,
for K at once (:func:`ensemble_advance` is its one-step form):

* **Subdivision in the program.** :func:`subdivided_step` runs ``advance``'s recursion of
  half steps as one bounded ``while_loop`` over the nodes of the binary tree of substeps
  (at most 2^(D+1) − 1 tries, D = ``Config.max_subdivisions``): a retryable failure
  halves the substep, a success moves to the next node, a non-retryable failure or one at
  depth D fails the whole step, which then keeps its input state. Each member subdivides
  on its own; the vmapped loop runs until the last member is done.
* **Controls in the program.** A schedule (:class:`Constant`, or the bag's choreography)
  computes each step's controls from the step's start time and each member's own record
  (``aux``: the captures a choreography takes when a track starts).
* **Capacity overflow on the host, never silent.** The capacity is fixed for the
  ensemble. A member whose query overflows stops with ``StepCode.CAPACITY_OVERFLOW``;
  the host grows the capacity above the largest counts any member reported
  (:func:`ipcjax.capacity.grow_capacity`) and reruns the whole rollout from its inputs, so
  every member's step ran at one capacity. That is one transfer of the codes per program
  call, not one per Newton iteration.
* **Devices and processes.** The members are split over the devices along their axis
  (:func:`member_sharding`, :func:`place`), those of processes joined by
  ``jax.distributed`` included, and every process gets every member's results
  (:func:`gather`).

The linear solve must run inside XLA batched over the members (``Config.linear_solver``
``"dense"`` or ``"cg"``): ``"sparse"`` factorizes one member's matrix at a time on the CPU
(a custom call, :mod:`ipcjax.cholmod_ffi`, or the host LDLᵀ where that cannot be built),
and is refused. :func:`host_callbacks` lists the host callbacks a traced function
contains, so a test can check that the program has none. A member that fails keeps its input state and
reports its code (:class:`ipcjax.result.StepCode`); :func:`check_members` turns any failure
into an error naming the member, so nothing fails silently.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from ipcjax.capacity import Capacity, check_capacity, grow_capacity
from ipcjax.model import Config, Model, State
from ipcjax.result import RETRYABLE, StepCode
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


def _check_ensemble(config: Config, capacity, trees) -> None:
    """Refuse what an ensemble program cannot run: the host solver, no fixed capacity,
    unstacked leaves, member axes of different sizes."""
    if config.linear_solver == "sparse":
        raise ValueError("an ensemble step needs a linear solve inside XLA batched over the members "
                         "(Config.linear_solver 'dense' or 'cg'); 'sparse' factorizes one member at a time on the CPU")
    if capacity is None:
        raise ValueError("an ensemble step needs a fixed capacity for the ensemble (ipcjax.capacity.Capacity); "
                         "a single member's advance() reports one it has grown to")
    check_capacity(capacity)
    leaves = jax.tree_util.tree_leaves(trees)
    if any(np.ndim(a) == 0 for a in leaves):
        raise ValueError("params, states and controls must be stacked over the members (ipcjax.ensemble.stack); "
                         "a leaf has no member axis")
    sizes = {int(np.shape(a)[0]) for a in leaves}
    if len(sizes) != 1:
        raise ValueError(f"params, states and controls need the same number of members; got sizes {sorted(sizes)}")


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
    _check_ensemble(config, capacity, (params, states, controls))
    return _ensemble_step(model, params, states, controls, jnp.asarray(dt), config=config, capacity=capacity)


class MemberReport(NamedTuple):
    """What :func:`subdivided_step` did for one member (arrays; stacked over the members by
    :func:`ensemble_advance`, and over the steps too in a :class:`Rollout`), the in-program
    twin of :class:`ipcjax.step.StepReport`."""

    code: jnp.ndarray                # int32 StepCode of the step; 0 = every substep succeeded
    substeps: jnp.ndarray            # int32 substeps that succeeded
    max_depth: jnp.ndarray           # int32 deepest subdivision among them (0 = the whole step)
    tries: jnp.ndarray               # int32 calls of ipcjax.step.step, failed ones included
    iterations: jnp.ndarray          # int32 Newton iterations over every try
    line_search_trials: jnp.ndarray  # int32
    expansions: jnp.ndarray          # int32 iterations that stepped beyond α = 1
    projected: jnp.ndarray           # int32 directions that fell back to the projected tangent
                                     # (Config.newton_tangent="exact_first"; StepReport.projected)
    min_step_bound: jnp.ndarray      # float64 smallest step bound over the tries
    min_gap: jnp.ndarray             # float64 smallest rounded gap over the successful substeps, m
    n_vt: jnp.ndarray                # int32 largest candidate counts any try reported (for growth)
    n_ee: jnp.ndarray
    n_sf: jnp.ndarray
    n_active: jnp.ndarray
    work: jnp.ndarray                # (2, 3) int32 largest grid work


class _Subdivision(NamedTuple):
    """The carry of :func:`subdivided_step`'s loop."""

    state: State          # the state at the start of the next substep
    done: jnp.ndarray     # int32 progress through the step, in units of dt / 2^D
    level: jnp.ndarray    # int32 depth of the next substep: its length is dt / 2^level
    report: MemberReport  # code ≠ 0 ends the loop


_COUNTS = ("iterations", "line_search_trials", "expansions", "projected", "n_vt", "n_ee", "n_sf", "n_active", "work")


def _first_report(dt) -> MemberReport:
    i0 = jnp.zeros((), jnp.int32)
    return MemberReport(i0, i0, i0, i0, i0, i0, i0, i0, jnp.ones((), dt.dtype), jnp.full((), jnp.inf, dt.dtype),
                        i0, i0, i0, i0, jnp.zeros((2, 3), jnp.int32))


#: The deepest subdivision :func:`subdivided_step` can count (its progress is an int32).
MAX_DEPTH = 30


def _check_depth(depth) -> None:
    """Refuse a concrete ``Config.max_subdivisions`` beyond :data:`MAX_DEPTH` (a traced one
    is checked where the ensemble's program is called, :func:`ensemble_rollout`)."""
    if not isinstance(depth, jax.core.Tracer) and not 0 <= int(depth) <= MAX_DEPTH:
        raise ValueError(f"an in-program subdivision counts substeps in int32: Config.max_subdivisions must be "
                         f"in [0, {MAX_DEPTH}]; got {depth}")


def _trailing_zeros(q):
    """The number of trailing zero bits of the int32 q > 0."""
    return jax.lax.population_count((q & -q) - 1)


def subdivided_step(model: Model, params, state: State, controls, dt, *, config: Config, capacity, active=True):
    """One member's step with :func:`ipcjax.step.advance`'s subdivision, inside the program.

    The step of length dt is the root of a binary tree of substeps, D = ``config.max_subdivisions``
    levels deep. The loop tries the next node, of length dt / 2^level: a success moves on
    to the node that starts where it ended, at the level of the deepest left child among
    its ancestors (:data:`MAX_DEPTH` minus the trailing zero bits of the progress, counted
    in dt / 2^MAX_DEPTH); a
    retryable failure (:data:`ipcjax.result.RETRYABLE`) above depth D tries the node's
    first half; any other failure ends the step. So the substeps, their lengths (exact
    powers of two of dt) and their order are ``advance``'s, and each node is tried at most
    once: the loop is bounded by 2^(D+1) − 1 tries. D is traced, and D ≤ :data:`MAX_DEPTH`
    = 30. A capacity overflow ends the step like any non-retryable failure;
    :func:`ensemble_rollout` grows the capacity and reruns it.

    ``active`` (a traced bool): False skips the step, returning the input state and an
    empty report with code 0; a vmapped loop then runs only as long as the active members.

    Returns:
        (state, :class:`MemberReport`): the state at dt when every substep succeeded,
        else the input state and the failing substep's code.
    """
    depth = config.max_subdivisions  # traced inside jit: only the retry test reads it
    _check_depth(depth)
    units = 1 << MAX_DEPTH  # progress is counted in dt / 2^MAX_DEPTH, whatever depth is
    dt = jnp.asarray(dt, jnp.float64)

    def body(c: _Subdivision) -> _Subdivision:
        h = jnp.ldexp(dt, -c.level)  # exact: the host's repeated 0.5 * h
        new, info = step(model, params, c.state, controls, h, config=config, capacity=capacity)
        info = info._replace(**{k: getattr(info, k).astype(jnp.int32) for k in _COUNTS})
        ok = info.code == 0
        retry = ~ok & ((info.code & ~int(RETRYABLE)) == 0) & (c.level < depth)
        r = c.report
        done = jnp.where(ok, c.done + jnp.left_shift(1, MAX_DEPTH - c.level), c.done)
        level = jnp.where(ok, MAX_DEPTH - _trailing_zeros(jnp.maximum(done, 1)), c.level + retry.astype(jnp.int32))
        report = MemberReport(
            code=jnp.where(ok | retry, 0, info.code).astype(jnp.int32),
            substeps=r.substeps + ok, max_depth=jnp.where(ok, jnp.maximum(r.max_depth, c.level), r.max_depth),
            tries=r.tries + 1, iterations=r.iterations + info.iterations,
            line_search_trials=r.line_search_trials + info.line_search_trials,
            expansions=r.expansions + info.expansions, projected=r.projected + info.projected,
            min_step_bound=jnp.minimum(r.min_step_bound, info.min_step_bound),
            min_gap=jnp.where(ok, jnp.minimum(r.min_gap, info.min_gap), r.min_gap),
            n_vt=jnp.maximum(r.n_vt, info.n_vt), n_ee=jnp.maximum(r.n_ee, info.n_ee),
            n_sf=jnp.maximum(r.n_sf, info.n_sf), n_active=jnp.maximum(r.n_active, info.n_active),
            work=jnp.maximum(r.work, info.work))
        return _Subdivision(jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, c.state),
                            done, level, report)

    def cond(c: _Subdivision):
        return (c.done < units) & (c.report.code == 0)

    zero = jnp.zeros((), jnp.int32)
    done = jnp.where(active, zero, units).astype(jnp.int32)
    end = jax.lax.while_loop(cond, body, _Subdivision(state, done, zero, _first_report(dt)))
    failed = end.report.code != 0
    return jax.tree_util.tree_map(lambda a, b: jnp.where(failed, a, b), state, end.state), end.report


class Constant(NamedTuple):
    """The schedule of controls that do not change: each member's own controls ride in its
    ``aux`` (what :func:`ensemble_advance` steps with)."""

    def observe(self, aux, t, x):
        """Nothing to record: returns ``aux``."""
        return aux

    def controls(self, aux, t):
        """The member's controls, ``aux``."""
        return aux


class Rollout(NamedTuple):
    """What :func:`ensemble_rollout` did, stacked over the K members."""

    state: State           # at the end, or at the start of a failed member's failing step
    aux: object            # the schedule's per-member record (captures) at the same instant
    frames: jnp.ndarray    # (K, steps / keep_every, N, 3) float32 positions after every keep_every-th step
    times: jnp.ndarray     # (K, steps / keep_every) float64 their times, s
    reports: MemberReport  # each field (K, steps, …): every step's report (after a failure: empty, code 0)
    failed_at: jnp.ndarray  # (K,) int32 the step that failed, −1 where none did
    code: jnp.ndarray      # (K,) int32 its StepCode, 0 where none failed


class _Member(NamedTuple):
    """One member's carry through :func:`_rollout`'s steps."""

    state: State            # at the next step's start (a failed member's: its failing step's)
    aux: object             # the schedule's record (captures) at the same instant
    failed_at: jnp.ndarray  # () int32 the step that failed, −1 while none has
    code: jnp.ndarray       # () int32 its StepCode; ≠ 0 stops the member


@partial(jax.jit, static_argnames=("capacity", "steps", "keep_every"))
def _rollout(model, params, states, aux, schedule, *, dt, config, capacity, steps, keep_every):
    def member(p, s, a):
        def one(c: _Member, i):
            a = schedule.observe(c.aux, c.state.t, c.state.x)
            alive = c.code == 0
            new, rep = subdivided_step(model, p, c.state, schedule.controls(a, c.state.t), dt,
                                       config=config, capacity=capacity, active=alive)
            keep = lambda n, o: jax.tree_util.tree_map(lambda u, v: jnp.where(alive, u, v), n, o)  # noqa: E731
            failed = alive & (rep.code != 0)
            return _Member(keep(new, c.state), keep(a, c.aux), jnp.where(failed, i, c.failed_at),
                           jnp.where(alive, rep.code, c.code)), rep

        def kept(c, k):
            c, reps = jax.lax.scan(one, c, k * keep_every + jnp.arange(keep_every, dtype=jnp.int32))
            return c, (c.state.x, c.state.t, reps)

        first = _Member(s, a, jnp.asarray(-1, jnp.int32), jnp.asarray(0, jnp.int32))
        end, (xs, ts, reps) = jax.lax.scan(kept, first, jnp.arange(steps // keep_every, dtype=jnp.int32))
        reps = jax.tree_util.tree_map(lambda r: r.reshape((steps,) + r.shape[2:]), reps)
        return Rollout(end.state, end.aux, xs, ts, reps, end.failed_at, end.code)

    return jax.vmap(member)(params, states, aux)


def member_sharding(k: int, devices=None):
    """The sharding that splits K members along their leading axis over ``devices``
    (default: every device, those of other processes joined by ``jax.distributed``
    included); None on one device.

    Raises:
        ValueError: K not a multiple of the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) < 2:
        return None
    if k % len(devices):
        raise ValueError(f"{k} ensemble members do not split over {len(devices)} devices; give a multiple of "
                         f"{len(devices)} members, or devices=[one device]")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    return NamedSharding(Mesh(np.asarray(devices), ("members",)), PartitionSpec("members"))


def place(tree, sharding, *, what: str = "members"):
    """``tree`` on ``sharding`` (None: unchanged). Across processes each process places the
    rows of its own devices from its copy of ``tree``, which must equal every other
    process's (checked: a mismatch would mix two ensembles).

    Raises:
        ValueError: across processes, trees that differ between the processes.
    """
    if sharding is None:
        return tree
    if sharding.is_fully_addressable:
        return jax.device_put(tree, sharding)
    from jax.experimental import multihost_utils

    host = jax.tree_util.tree_map(np.asarray, tree)
    try:
        multihost_utils.assert_equal(host)
    except AssertionError as e:
        raise ValueError(f"{what} over several processes must be the same in every process; they differ ({e})") from None
    return jax.tree_util.tree_map(lambda a: jax.make_array_from_callback(a.shape, sharding, lambda i: a[i]), host)


def gather(tree):
    """Every member's values in every process: ``tree`` unchanged when this process holds
    all of it, else gathered from every process as NumPy arrays."""
    leaves = jax.tree_util.tree_leaves(tree)
    if all(getattr(a, "is_fully_addressable", True) for a in leaves):
        return tree
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def _replicated(sharding):
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(sharding.mesh, PartitionSpec())


def ensemble_rollout(model: Model, params, states, aux, schedule, *, dt, steps: int, config: Config,
                     capacity: Capacity, keep_every: int = 1, devices=None):
    """``steps`` steps of K members in lockstep as one program, each with
    :func:`subdivided_step`, their controls computed in the program by ``schedule``.

    Before every step each member's record is updated, ``aux = schedule.observe(aux, t, x)``
    (the captures a choreography takes when a track starts), and the step's controls are
    ``schedule.controls(aux, t)``, t being the step's start time. ``schedule`` is a pytree
    shared by the members (:class:`Constant`; ``scenes.choreography_jax`` for the bag);
    ``aux`` is stacked over them. A member whose step fails stops there, keeping the state
    and record it had at that step's start, while the others go on.

    A capacity overflow anywhere (any member, any step) grows the capacity above the
    largest counts reported and reruns the whole rollout from its start, so every step of
    every member ran at the capacity returned.

    Args:
        model, params, states: as :func:`ensemble_step`. aux: the schedule's per-member
            record, stacked. schedule: see above. dt: the step, s. steps: how many
            (static). config: solver settings (an XLA linear solver). capacity: where the
            ensemble starts. keep_every: keep the positions after every n-th step (static;
            must divide ``steps``). devices: the members are split over these along their
            axis (``jax.sharding``; default: every device, other processes' included
            after ``jax.distributed.initialize``; one device: no split). Across
            processes every process calls this with the same inputs and gets every
            member's results, as NumPy arrays.

    Returns:
        (:class:`Rollout`, capacity).

    Raises:
        ValueError: as :func:`ensemble_step`; ``steps`` < 1 or not a multiple of
            ``keep_every``; members that do not split over the devices, or inputs that
            differ between the processes; a subdivision
            depth beyond :data:`MAX_DEPTH`; a capacity
            beyond 2^28 entries (from :func:`ipcjax.capacity.grow_capacity`: positions
            have probably exploded).
    """
    _check_ensemble(config, capacity, (params, states, aux))
    _check_depth(config.max_subdivisions)
    for name, n in (("steps", steps), ("keep_every", keep_every)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{name} must be an integer ≥ 1; got {n!r}")
    if steps % keep_every:
        raise ValueError(f"keep_every ({keep_every}) must divide steps ({steps})")
    dt = jnp.asarray(dt, jnp.float64)
    k = int(np.shape(jax.tree_util.tree_leaves(states)[0])[0])
    split = member_sharding(k, devices)
    params, states, aux = place((params, states, aux), split)
    if split is not None and not split.is_fully_addressable:  # the shared inputs, on every device
        model, schedule, dt = place((model, schedule, dt), _replicated(split), what="the model and schedule")
    while True:
        run = gather(_rollout(model, params, states, aux, schedule, dt=dt, config=config, capacity=capacity,
                              steps=int(steps), keep_every=int(keep_every)))
        if not (np.asarray(run.code) & int(StepCode.CAPACITY_OVERFLOW)).any():
            return run, capacity
        rep = run.reports
        most = lambda a: int(np.max(np.asarray(a)))  # noqa: E731
        capacity = grow_capacity(capacity, most(rep.n_vt), most(rep.n_ee), most(rep.n_sf),
                                 np.asarray(rep.work).reshape(-1, 2, 3).max(axis=0), n_active=most(rep.n_active))


def ensemble_advance(model: Model, params, states, controls, dt, *, config: Config, capacity: Capacity):
    """One step of K members in lockstep with subdivision in the program and the capacity
    grown on the host: :func:`ensemble_rollout` over one step with each member's own
    controls (:class:`Constant`).

    Returns:
        (states, reports, capacity): the members' states and their :class:`MemberReport`,
        stacked over the members, and the capacity every member's step ran at (keep it for
        the next step). A failed member keeps its input state (:func:`check_members`).

    Raises:
        ValueError: as :func:`ensemble_rollout`.
    """
    run, capacity = ensemble_rollout(model, params, states, controls, Constant(), dt=dt, steps=1, config=config,
                                     capacity=capacity)
    return run.state, jax.tree_util.tree_map(lambda r: r[:, 0], run.reports), capacity


class MemberFailed(RuntimeError):
    """A member's step of an ensemble failed: its index, code and reason."""

    def __init__(self, index: int, code: int):
        self.index, self.code = index, code
        self.reason = StepCode.describe(code)
        super().__init__(f"ensemble member {index} failed its step: {self.reason} (code {code})")


def check_members(infos) -> None:
    """Raise :class:`MemberFailed` for the first member whose step did not succeed.

    ``infos``: anything with a per-member ``code``: :func:`ensemble_step`'s StepInfo,
    :func:`ensemble_advance`'s :class:`MemberReport`, a :class:`Rollout`.

    Raises:
        MemberFailed: a member's code is not 0 (capacity overflow, iteration cap, …).
    """
    codes = np.asarray(infos.code)
    bad = np.flatnonzero(codes != 0)
    if bad.size:
        raise MemberFailed(int(bad[0]), int(codes[bad[0]]))

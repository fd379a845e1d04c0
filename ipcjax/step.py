"""One timestep: validate, solve, round to FP32, recheck gaps, velocities; host retries.

:func:`step` is the jittable core: ``step(model, params, state, controls, dt, config=…,
capacity=…) -> (state, StepInfo)``. It never raises; a failed step returns the input
state and a non-zero ``info.code`` (:class:`~ipcjax.result.StepCode`). Inside it,
:func:`solve_positions` builds the step's :class:`~ipcjax.problem.StepProblem` from its
inputs (:func:`step_problem`: inertial target) and runs the Newton solve
(:mod:`ipcjax.newton`), whose first pass queries the step-start contacts and freezes the
lagged friction set over them.

:func:`carried_step` is the same step started from the previous step's candidate set (a
:class:`~ipcjax.newton.CandidateCarry`) where the positions still lie inside the box it was
queried for ± skin/2, which saves the step-start query (:func:`ipcjax.newton.carried_solve`);
it returns the carry for the next step.

:func:`advance` is the host-level driver: it validates the input, reallocates candidate
buffers above the real counts on overflow and redoes the step, and on a retryable failure
(line search exhausted, iteration cap, gap lost in rounding) retries from the same input
with two half-steps, recursively up to ``config.max_subdivisions`` levels. It steps with
:func:`carried_step` and keeps the carry in a :class:`CandidateCache` the caller passes to
every call.
"""
from __future__ import annotations

import time
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ipcjax import candidates as _cand
from ipcjax import compile_guard
from ipcjax.energies.inertia import inertial_target
from ipcjax.model import Config, Controls, Model, Params, State, check_controls, check_dt, check_params
from ipcjax.newton import CandidateCarry, active_size, carried_solve, empty_carry, query_contacts
from ipcjax.problem import StepContext, StepInputs, StepProblem
from ipcjax.result import RETRYABLE, StepCode, set_code
from ipcjax.stencils import contact_gaps, friction_set


class StepInfo(NamedTuple):
    """Per-step figures (arrays inside jit; plain numbers after :func:`advance`)."""

    code: jnp.ndarray
    iterations: jnp.ndarray
    line_search_trials: jnp.ndarray
    min_step_bound: jnp.ndarray
    min_gap: jnp.ndarray          # smallest gap after FP32 rounding, m
    n_vt: jnp.ndarray
    n_ee: jnp.ndarray
    n_sf: jnp.ndarray
    overflow: jnp.ndarray
    work: jnp.ndarray
    n_active: jnp.ndarray         # the Capacity.active the step's contact rows needed (line_search.slots_needed)
    expansions: jnp.ndarray       # Newton iterations whose step went beyond α = 1 (Config.line_search_expansions)
    queries: jnp.ndarray          # candidate queries: the step start's (none on a carried set, see carried_step) and requeries
    projected: jnp.ndarray        # directions that fell back to the projected tangent (Config.newton_tangent="exact_first")


def step_problem(model: Model, config: Config, inputs: StepInputs, contacts0, *,
                 active: int | None = None) -> StepProblem:
    """The :class:`~ipcjax.problem.StepProblem` of a step from its inputs θ.

    Its context holds the inertial target (with the film drag −drag·m·v₀ as an external
    force) and the lagged friction set frozen at x₀ over the step-start contacts
    ``contacts0`` (compacted into ``active`` rows when that is given, see
    :func:`ipcjax.stencils.friction_set`); with ``contacts0`` None, no friction set
    (:func:`ipcjax.newton.newton_solve` freezes it from its own step-start query).
    """
    params, x0, v0, controls, dt = inputs
    free = ~model.fixed
    force = controls.force - (params.drag * model.mass)[:, None] * v0 * model.film[:, None]
    y = inertial_target(x0, v0, dt, mass=model.mass, free=free, gravity=params.gravity, force=force)
    ctx = StepContext(x0=x0, y=y, dt=dt,
                      friction=None if contacts0 is None else
                      friction_set(x0, contacts0, model.radius, params, config, active=active))
    return StepProblem(model=model, params=params, controls=controls, context=ctx, config=config)


def solve_positions(model: Model, inputs: StepInputs, config: Config, capacity, *, carry=None):
    """The unrounded minimiser x* (FP64) of one step's Φ from x₀ = ``inputs.x0``.

    Returns (x*, contacts at x*, step-start contacts, SolveInfo, the step-start contacts'
    gaps at x₀; a gap ≤ 0 is an initial overlap). Used by :func:`step` and by the implicit
    VJP (:mod:`ipcjax.implicit`). With ``carry`` (a :class:`~ipcjax.newton.CandidateCarry`)
    the solve starts from the last step's candidates where they hold
    (:func:`ipcjax.newton.carried_solve`), and the carry for the next step comes sixth.
    """
    active = active_size(capacity)
    problem = step_problem(model, config, inputs, None)
    make_friction = lambda contacts0, gaps0: friction_set(inputs.x0, contacts0, model.radius, inputs.params, config,
                                                          active=active, gaps=gaps0)
    x, cs, sinfo, contacts0, gaps0, carry_out = carried_solve(inputs.x0, problem, make_friction, capacity=capacity,
                                                              carry=carry)
    if carry is None:
        return x, cs, contacts0, sinfo, gaps0
    return x, cs, contacts0, sinfo, gaps0, carry_out


def recheck_rounded(model: Model, x32, config: Config, capacity, *, contacts=None):
    """Smallest gap (m) on exactly the stored FP32 positions, and the query's stats.

    ``contacts``: the Newton solve's last candidate set (queried with ``config.skin``).
    It already holds every stencil within d̂ of the rounded positions: the solution lies
    in the boxes that set was queried for, widened by skin/2 (the Newton loop's reuse
    test), and rounding to FP32 moves a particle by ~1e-8 m. So the gaps are taken on it
    and no second query is made; the stats returned are then None. Without it, the
    candidates are queried afresh at the rounded positions. Either way every stencil with
    a gap ≤ d̂ is seen, so the smallest gap is the same whenever it is ≤ d̂ (above d̂ it is
    the smallest among the stencils the set holds). The Newton solve's last pass takes the
    same gaps over its last candidate set (``SolveInfo.rounded_gap``, which :func:`step` and
    the rollouts use); this function is that check on its own.
    """
    xr = x32.astype(jnp.float64)
    st_r = None
    if contacts is None:
        contacts, st_r = query_contacts(xr, xr, model, config, capacity)
    g_r, _, _ = contact_gaps(xr, contacts, model.radius, config.min_gap)
    return jnp.min(g_r, initial=jnp.inf), st_r


def result_code(sinfo, gaps0, min_gap, stats):
    """Combine the solve's code with the overlap (a step-start gap ``gaps0`` ≤ 0), rounding
    and overflow checks."""
    code = set_code(sinfo.code, StepCode.INITIAL_OVERLAP, where=jnp.min(gaps0, initial=jnp.inf) <= 0)
    code = set_code(code, StepCode.GAP_LOST_IN_ROUNDING, where=min_gap <= 0)
    return set_code(code, StepCode.CAPACITY_OVERFLOW, where=stats.overflow)


def step(model: Model, params: Params, state: State, controls: Controls, dt, *, config: Config, capacity):
    """Advance one timestep of length dt (s). Returns (new state, StepInfo); see module doc.

    Jitted: it is :func:`carried_step` with a carry that holds nothing (so the step queries
    its candidates at x₀), so that it and :func:`advance` share one compiled program."""
    new, info, _ = carried_step(model, params, state, controls, dt, carry=_empty_carry(model, config, capacity),
                                config=config, capacity=capacity)
    return new, info


@partial(jax.jit, static_argnames=("capacity",))
def carried_step(model: Model, params: Params, state: State, controls: Controls, dt, *, carry: CandidateCarry,
                 config: Config, capacity):
    """:func:`step` that starts from the last step's candidate set ``carry`` where it holds
    (:func:`ipcjax.newton.carried_solve`). Returns (new state, StepInfo, the carry for the
    next step: empty when this step failed)."""
    return _step(model, params, state, controls, dt, carry=carry, config=config, capacity=capacity)


def _lower_step(model, params, state, controls, dt, *, config, capacity):
    return carried_step.lower(model, params, state, controls, dt, carry=_empty_carry(model, config, capacity),
                              config=config, capacity=capacity)


# ``step``'s compiled program is ``carried_step``'s: its cache and its lowering (as a jitted
# function's, for the benchmarks that count or compile the step program)
step._cache_size = carried_step._cache_size
step.lower = _lower_step


def _step(model: Model, params: Params, state: State, controls: Controls, dt, *, carry: CandidateCarry, config: Config,
          capacity):
    x0 = state.x.astype(jnp.float64)
    v0 = state.v.astype(jnp.float64)
    dt = jnp.asarray(dt, jnp.float64)
    solved = solve_positions(model, StepInputs(params, x0, v0, controls, dt), config, capacity, carry=carry)
    x, _, _, sinfo, gaps0, carry_out = solved
    # storage precision; the solve's last pass took the gaps on exactly what will be stored
    # (recheck_rounded over its last candidate set)
    x32 = x.astype(jnp.float32)
    min_gap, stats = sinfo.rounded_gap, sinfo.stats
    code = result_code(sinfo, gaps0, min_gap, stats)
    ok = code == 0
    v_new = ((x32.astype(jnp.float64) - x0) / dt).astype(jnp.float32)
    new_state = State(
        x=jnp.where(ok, x32, state.x),
        v=jnp.where(ok, v_new, state.v),
        t=jnp.where(ok, state.t + dt, state.t),
    )
    info = StepInfo(code, sinfo.iterations, sinfo.line_search_trials, sinfo.min_step_bound, min_gap,
                    stats.n_vt, stats.n_ee, stats.n_sf, stats.overflow, stats.work, stats.n_active,
                    sinfo.expansions, sinfo.queries, sinfo.projected)
    return new_state, info, carry_out._replace(held=carry_out.held & ok)


# --------------------------------------------------------------------------- host side

class StepFailed(RuntimeError):
    """A step that could not be completed; carries the StepCode and the report."""

    def __init__(self, message, code=0, report=None):
        super().__init__(message)
        self.code = StepCode(int(code))
        self.report = report


class StepReport(NamedTuple):
    """What :func:`advance` did: success, reason, per-substep figures and wall time."""

    ok: bool
    code: int
    reason: str
    substeps: int
    max_depth: int
    iterations: int
    line_search_trials: int
    min_step_bound: float
    min_gap: float
    reallocations: int
    wall_s: float
    capacity: object
    expansions: int               # Newton iterations that took an expanded step, summed over substeps
    queries: int = 0              # candidate queries, summed as iterations is
    projected: int = 0            # Newton directions whose exact tangent failed to factorize, summed as iterations is
                                  # (Config.newton_tangent="exact_first": each cost a second factorization)

    def raise_if_failed(self):
        if not self.ok:
            raise StepFailed(f"step failed: {self.reason}", self.code, self)
        return self


class CandidateCache:
    """The last step's candidate set, kept between :func:`advance` calls (its ``candidates``).

    Create one per run and pass the same object to every call: ``advance`` reads the set
    from it and puts the new one in its place, with the model object, config and capacity
    it was made for, and uses a set only for the same three (:func:`carried_step` then checks
    that x₀ lies inside its box ± skin/2). It holds one set at a time, and reports do not
    hold it: a run that keeps its reports keeps no candidate sets.
    """

    def __init__(self):
        self._made_for, self._carry = None, None

    def for_step(self, model, config, capacity) -> CandidateCarry | None:
        """The set when it was made for this model (the same object), config and capacity."""
        if self._made_for is None:
            return None
        m, c, cap = self._made_for
        return self._carry if (m is model and c == config and cap == capacity) else None

    def keep(self, model, config, capacity, carry: CandidateCarry):
        """Hold ``carry``, made for this model, config and capacity, in place of the last."""
        self._made_for, self._carry = (model, config, capacity), carry


def _empty_carry(model: Model, config: Config, capacity) -> CandidateCarry:
    """:func:`ipcjax.newton.empty_carry` for this capacity and these topology sizes, made once
    (its arrays are immutable, so every step can share them)."""
    key = (capacity, model.n_particles, len(model.topology.points), len(model.topology.triangles),
           len(model.topology.edges), len(model.topology.spheres))
    if key not in _EMPTY_CARRIES:
        x = jax.ShapeDtypeStruct((model.n_particles, 3), jnp.float64)
        shapes = jax.eval_shape(lambda z: empty_carry(z, model, config, capacity), x)
        # numpy zeros put on the device (held False): jnp.zeros would compile a program per shape.
        # Made eagerly even when the first call comes inside a trace (an ensemble's step under
        # jit): a tracer kept here would leak into every later step
        with jax.ensure_compile_time_eval():
            _EMPTY_CARRIES[key] = jax.tree_util.tree_map(lambda a: jnp.asarray(np.zeros(a.shape, a.dtype)), shapes)
    return _EMPTY_CARRIES[key]


_EMPTY_CARRIES: dict = {}


def validate_state(model: Model, state: State):
    """Reject a wrong type, shapes or dtypes and non-finite positions, velocities or time.

    Raises:
        TypeError: not a :class:`State`, or a non-real dtype. ValueError: a wrong shape
            or a non-finite entry, naming the first one.
    """
    if not isinstance(state, State):
        raise TypeError(f"state must be an ipcjax.model.State (see make_state); got {type(state).__name__}")
    n = model.n_particles
    for name, a in (("x", state.x), ("v", state.v)):
        a = np.asarray(a)
        if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)) or a.dtype == bool:
            raise TypeError(f"state.{name} must be a real float array; got dtype {a.dtype}")
        if a.shape != (n, 3):
            raise ValueError(f"state.{name} must have shape ({n}, 3); got {a.shape}")
        bad = ~np.isfinite(a).all(axis=1)
        if bad.any():
            i = int(np.argwhere(bad)[0, 0])
            raise ValueError(f"state.{name}[{i}] is not finite: {a[i]}")
    if np.shape(state.t) != () or not np.isfinite(np.asarray(state.t, np.float64)):
        raise ValueError(f"state.t must be a finite scalar time in s; got {state.t!r}")


@partial(jax.jit, static_argnames=("capacity",))
def _gaps_at(model: Model, x, *, config: Config, capacity):
    cs, st = query_contacts(x, x, model, config, capacity)
    g, _, _ = contact_gaps(x, cs, model.radius, config.min_gap)
    return g, cs.idx, cs.kind, st


def check_geometry(model: Model, x, config: Config = Config(), capacity=None):
    """Reject positions that overlap or interpenetrate, naming the primitives (host-side).

    Raises:
        ValueError: a stencil with gap g ≤ 0 (closer than its offset: min_gap for film,
            R + min_gap/2 for sphere–face, Rᵢ + Rⱼ for sphere pairs), or an edge passing
            through a triangle it shares no vertex with (checked independently by
            :func:`ipcjax.audit.edge_face_intersections`).
    Returns the capacity used (grown if needed).
    """
    from ipcjax.audit import edge_face_intersections
    from ipcjax.candidates import ContactKind

    x = jnp.asarray(np.asarray(x, dtype=np.float64))
    cap = _cand.initial_capacity(model.topology, x) if capacity is None else capacity
    while True:
        g, idx, kind, st = _gaps_at(model, x, config=config, capacity=cap)
        if not bool(st.overflow):
            break
        cap = _cand.grow_capacity(cap, int(st.n_vt), int(st.n_ee), int(st.n_sf), np.asarray(st.work))
    g = np.asarray(g)
    if g.size and g.min() <= 0:
        i = int(np.argmin(g))
        k = ContactKind(int(kind[i]))
        names = {ContactKind.VT: "vertex {0} – triangle ({1}, {2}, {3})",
                 ContactKind.EE: "edge ({0}, {1}) – edge ({2}, {3})",
                 ContactKind.SF: "sphere {0} – triangle ({1}, {2}, {3})",
                 ContactKind.SS: "sphere {0} – sphere {1}"}
        what = names[k].format(*np.asarray(idx[i]).tolist())
        raise ValueError(f"initial overlap: {what} has gap {g[i]:.3e} m ≤ 0 "
                         f"({int((g <= 0).sum())} overlapping pair(s) in all)")
    topo = model.topology
    hits = edge_face_intersections(np.asarray(x), topo.triangles, topo.edges)
    if len(hits):
        fixed = np.asarray(topo.fixed)
        e, t = topo.edges[hits[:, 0]], topo.triangles[hits[:, 1]]
        moving = ~(fixed[e].all(axis=1) & fixed[t].all(axis=1))
        hits = hits[moving]
        if len(hits):
            e, t = topo.edges[hits[0, 0]], topo.triangles[hits[0, 1]]
            raise ValueError(f"edge-through-face penetration: edge {tuple(e.tolist())} passes through "
                             f"triangle {tuple(t.tolist())} ({len(hits)} intersecting pair(s) in all)")
    return cap


def make_state(x, v=None, t=0.0) -> State:
    """A :class:`State` in storage precision from array-likes (copies; never aliases input)."""
    x = np.array(x, dtype=np.float32, copy=True)
    v = np.zeros_like(x) if v is None else np.array(v, dtype=np.float32, copy=True)
    return State(jnp.asarray(x), jnp.asarray(v), jnp.asarray(t, jnp.float64))


def advance(model: Model, params: Params, state: State, controls: Controls, dt: float, *,
            config: Config = Config(), capacity=None, validate: bool = True, candidates=None):
    """Host driver: one timestep with capacity reallocation and step subdivision.

    Returns (state, report). On failure after all subdivisions, or on a non-retryable
    failure (initial overlap, factorization failure, non-finite values), the returned
    state is the input state and ``report.ok`` is False with the reason.

    ``candidates``: a :class:`CandidateCache` that a loop passes to every call (:func:`simulate`
    does). Each (sub)step then starts from the last step's candidate set where the positions
    still lie inside the box it was queried for ± skin/2, instead of a fresh query
    (:func:`carried_step`), and the cache gets the step's last set; a set made for another
    model object, config or capacity is not used. None: every step queries at x₀.

    The parameters are canonicalised (:func:`ipcjax.model.check_params`) and dt checked on
    every call; with ``validate`` (the default) the controls, the state and its geometry are
    checked too (:func:`check_controls`, :func:`validate_state`, :func:`check_geometry`).

    Raises:
        TypeError, ValueError: bad input (out-of-range parameters, dt ≤ 0, wrong shapes,
            non-finite values, indices out of range, initial overlap, ``candidates`` not a
            :class:`CandidateCache`), before any solve.
    """
    t_start = time.perf_counter()
    params = check_params(params)
    dt = float(check_dt(dt))
    if capacity is not None:
        _cand.check_capacity(capacity)
    if candidates is not None and not isinstance(candidates, CandidateCache):
        raise TypeError("candidates must be an ipcjax.step.CandidateCache (one per run); "
                        f"got {type(candidates).__name__}")
    if validate:
        check_controls(model, controls)
        validate_state(model, state)
        capacity = check_geometry(model, state.x, config, capacity)
    if capacity is None:
        capacity = _cand.initial_capacity(model.topology, state.x)
    acc = dict(substeps=0, max_depth=0, iterations=0, trials=0, amin=1.0, gmin=np.inf, realloc=0, expansions=0,
               queries=0, projected=0)
    carry = None if candidates is None else candidates.for_step(model, config, capacity)
    if carry is None:
        carry = _empty_carry(model, config, capacity)

    def run(st, h, depth):
        nonlocal capacity, carry
        while True:
            new, info, carry_new = carried_step(model, params, st, controls, h, carry=carry, config=config,
                                                capacity=capacity)
            code = int(info.code)
            if code & StepCode.CAPACITY_OVERFLOW:
                capacity = _cand.grow_capacity(capacity, int(info.n_vt), int(info.n_ee), int(info.n_sf),
                                               np.asarray(info.work), n_active=int(info.n_active))
                carry = _empty_carry(model, config, capacity)  # the set's shapes follow the capacity
                acc["realloc"] += 1
                continue
            break
        if code == 0:
            carry = carry_new
        acc["iterations"] += int(info.iterations)
        acc["trials"] += int(info.line_search_trials)
        acc["expansions"] += int(info.expansions)
        acc["queries"] += int(info.queries)
        acc["projected"] += int(info.projected)
        acc["amin"] = min(acc["amin"], float(info.min_step_bound))
        if code == 0:
            acc["substeps"] += 1
            acc["max_depth"] = max(acc["max_depth"], depth)
            acc["gmin"] = min(acc["gmin"], float(info.min_gap))
            return new, 0
        if (code & ~int(RETRYABLE)) or depth >= config.max_subdivisions:
            return st, code
        mid, c1 = run(st, 0.5 * h, depth + 1)
        if c1:
            return st, c1
        end, c2 = run(mid, 0.5 * h, depth + 1)
        return (end, 0) if c2 == 0 else (st, c2)

    out, code = run(state, float(dt), 0)
    report = StepReport(
        ok=code == 0, code=code, reason=StepCode.describe(code), substeps=acc["substeps"],
        max_depth=acc["max_depth"], iterations=acc["iterations"], line_search_trials=acc["trials"],
        min_step_bound=acc["amin"], min_gap=acc["gmin"], reallocations=acc["realloc"],
        wall_s=time.perf_counter() - t_start, capacity=capacity, expansions=acc["expansions"],
        queries=acc["queries"], projected=acc["projected"])
    if candidates is not None:
        candidates.keep(model, config, capacity, carry)
    return (out if code == 0 else state), report


def simulate(model: Model, params: Params, state: State, controls, steps: int, *, dt: float,
             config: Config = Config(), callback=None):
    """Host loop of :func:`advance` over ``steps`` timesteps.

    Args:
        controls: a :class:`Controls`, or a function ``(step_index, t) -> Controls``
            for time-indexed supports and ties.
        callback: optional ``(step_index, state, report) -> None`` after each step.
    Returns:
        (frames (steps+1, N, 3) float32, times (steps+1,), reports list).
    Raises:
        ValueError, TypeError: bad input (``steps`` < 1, and see :func:`advance`).
        StepFailed: naming the step index, the time and the reason; the frames written so
            far are attached as ``.frames``.
    """
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be an integer ≥ 1; got {steps!r}")
    check_dt(dt)
    compile_guard.release_if_crowded()
    get = controls if callable(controls) else (lambda i, t: controls)
    frames, times, reports = [np.asarray(state.x)], [float(state.t)], []
    capacity, candidates = None, CandidateCache()
    for i in range(steps):
        state, rep = advance(model, params, state, get(i, float(state.t)), dt, config=config, capacity=capacity,
                             validate=(i == 0), candidates=candidates)
        capacity = rep.capacity
        if not rep.ok:
            err = StepFailed(f"step {i} at t = {float(state.t):.5f} s failed: {rep.reason}", rep.code, rep)
            err.frames = np.stack(frames)
            raise err
        frames.append(np.asarray(state.x))
        times.append(float(state.t))
        reports.append(rep)
        if callback is not None:
            callback(i, state, rep)
    return np.stack(frames), np.asarray(times), reports

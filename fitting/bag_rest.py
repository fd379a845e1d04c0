"""The bag fit (docs/spec.md §5): film parameters from the rest shape after release.

A user measures the bag after it has been tied and released: neck width x × y and flap
height. :class:`BagRestProblem` gives the fit loop (:func:`fitting.fit.fit_measured`)
those three measurements of the simulated bag, smoothed, and their Jacobian in the log
of the fitted parameters (E, μf, kθ):

1. **Forward**: every node runs the bag from a committed checkpoint
   (``tests/data/bag_full_tie.npz`` by default: 8.40 s, the start of the tie) to the end of
   the protocol (10.50 s, the measured instant) with the host driver of ``ipcjax bag``
   (:func:`scenes.bag_run.run_bag`: capacity growth, subdivision, the self-intersection
   audit of every ``audit_every``-th frame). By then the bag has settled (the fastest
   particle at 0.5–12 mm/s over the E sweep of docs/differentiation.md).
2. **Smoothing**: one trajectory's measurements are piecewise in the parameters (pleats
   snap shut or not; docs/differentiation.md: runs scatter by 1.7–3.3 mm about the trend
   in E). The
   fitted quantity is their Gaussian smoothing in log-parameter space,
   ȳ(z) = E[y(z + σε)], ε ~ N(0, I), on the 2d sigma points z ± σ√d·eᵢ of the d fitted
   parameters (weights 1/(2d); exact for the Gaussian's first three moments, the two-point
   Gauss–Hermite rule for d = 1). Its gradient is Stein's identity on the same nodes,
   ∂ȳ/∂zⱼ ≈ E[y ε]/σ = (y(z + σ√d eⱼ) − y(z − σ√d eⱼ))/(2σ√d): the zero-order estimator of
   randomized smoothing (Duchi, Bartlett & Wainwright 2012; Nesterov & Spokoiny 2017;
   Berthet et al. 2020, "Learning with differentiable perturbed optimizers"), which sees
   the path, where the pathwise (first-order) estimator is biased by the jumps (Suh et al.
   2022, "Do differentiable simulators give better policy gradients?").
3. **Rest-state derivative** (reported beside it; ``estimator="rest"`` fits with it): at
   the final positions x the step's optimality less its inertia is the static balance
   G(x; θ) = ∇(V + D)(x; θ) − M g − f = 0, V the membrane, bending, barrier, support and
   tie energies and D the friction lagged at the previous step's positions x − dt·v. The
   implicit function theorem (Blondel et al. 2022, "Efficient and modular implicit
   differentiation"; :mod:`ipcjax.implicit` without the step's inertia) gives

       dy/dz = −(∂y/∂x) H⁻¹ ∂G/∂z,     H = ∂G/∂x = ∇²(V + D)(x),

   one dense Cholesky factorisation and one VJP of G per measurement. It holds the
   friction anchors, so it is the response of a bag whose loaded contacts stick; on the
   bag it has the sign of the values' trend in E but a third of its size, and it is
   nearly blind to μf and kθ (docs/differentiation.md): that is why the fit uses Stein's
   estimate. In the
   "rest" mode μf (PATH_ONLY) still takes Stein's. The derivative is only used where H is
   positive definite and ‖G‖∞ is below REST_RESIDUAL_TOL (:func:`check_rest`).

Every node runs in a worker process (``workers``, default all cores), and a node met again
reuses its finished run (:func:`node_folder`). A failed node (a failed step, a
self-intersecting frame) raises :class:`NodeFailed` naming the node's parameters and the
reason; an iterate outside the parameter range is evaluated at the range's end.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import math
import multiprocessing as mp
import os
import time

import numpy as np

from fitting.fit import Evaluation, from_z

#: The parameters the bag fit can fit (log-parameters z).
BAG_NAMES = ("youngs_modulus", "friction", "bending_scale")
#: Parameters the rest-state derivative cannot see (it holds the friction anchors: 0.003 mm
#: per unit log μf at the film defaults); estimator "rest" takes Stein's estimate for them.
PATH_ONLY = ("friction",)
#: Default start of every forward run: the full-resolution tie checkpoint (8.40 s).
DEFAULT_START = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "tests", "data", "bag_full_tie.npz")
#: The smoothed gradient's estimators (BagRestProblem, smooth).
ESTIMATORS = ("stein", "rest")
#: Default smoothing width in log-parameter space: 2 ln 2 / 7 ≈ 0.198 (nodes at × 0.82 and
#: × 1.22), two steps of the sweep 2^(k/7) in benchmarks/bag_sweep.py, whose points are
#: then nodes. At one step (× 0.91, × 1.10) the smoothed loss against the specification's
#: bag still rises from E × 0.91 to × 1.0 and Stein's gradient at the film default points
#: away from the minimum (docs/differentiation.md).
DEFAULT_SIGMA = 2 * math.log(2.0) / 7
#: Default range of each fitted parameter, × its film default.
DEFAULT_RANGE = (0.25, 4.0)
#: The final state must have ‖G(x)‖∞ below this × the largest force of one energy term on
#: one particle for its rest-state derivative to be used (the unbalanced force of a bag
#: that still moves; at the bag's end it is the FP32 rounding of the stored positions,
#: 8e-4: docs/differentiation.md).
REST_RESIDUAL_TOL = 0.01


class NodeFailed(RuntimeError):
    """A smoothing node's forward run or rest-state derivative failed (``params``,
    ``reason``)."""

    def __init__(self, params: dict, reason: str):
        what = ", ".join(f"{k} = {v:.6g}" for k, v in params.items())
        super().__init__(f"bag node at {what}: {reason}")
        self.params, self.reason = params, reason


# --------------------------------------------------------------------------- rest-state derivative


def rest_problem(model, config, params, anchor, controls, *, dt, contacts, active=None):
    """The :class:`~ipcjax.problem.StepProblem` of a step that starts at rest at ``anchor``
    (friction lagged there; its rows compacted into ``active``, as in the step)."""
    import jax.numpy as jnp

    from ipcjax.problem import StepInputs
    from ipcjax.step import step_problem

    return step_problem(model, config, StepInputs(params, anchor, jnp.zeros_like(anchor), controls, dt), contacts,
                        active=active)


def rest_residual(x, problem, contacts):
    """G(x; θ) over the free DOFs (3F,), N: the step's ∇ₓΦ (``problem`` from
    :func:`rest_problem`) less its mass term M(x − anchor)/dt², i.e. ∇(V + D)(x) − M g − f
    with the friction D lagged at the anchor (the previous step's positions)."""
    from ipcjax.implicit import free_gradient

    model, ctx = problem.model, problem.context
    g = free_gradient(x, problem, contacts)
    m = model.mass[model.free_particles]
    dx = (x - ctx.x0)[model.free_particles]
    return g - (m[:, None] * dx).reshape(-1) / ctx.dt**2


def _largest_term_force(x, problem, contacts):
    """The largest force one energy term of V + D puts on one particle, N (the scale of the
    rest check: a balance of large opposing forces is judged against them, not the weight)."""
    import jax
    import jax.numpy as jnp

    from ipcjax.potential import potential_terms

    free = problem.model.free_particles
    out = 0.0
    for name in ("membrane", "bending", "barrier", "friction", "support", "tie"):
        g = jax.grad(lambda x: potential_terms(x, problem, contacts)[name])(x)[free]
        out = jnp.maximum(out, jnp.max(jnp.linalg.norm(g, axis=1)))
    return out


def make_rest_jacobian(model, config, capacity, measure, names=BAG_NAMES):
    """A jitted ``(x, v, params, controls, dt) -> (y, J, H_chol, residual, force, overflow)``
    at the final state (x, v) of a run.

    The anchor of the lagged friction is the previous step's positions x − dt·v. y =
    measure(x) (m,); J = dy/dz (m, len(names)) by the implicit function theorem on G = 0
    (module docstring), z the log of ``names``; H_chol the Cholesky factor of H (NaN where
    H is not positive definite); residual = G(x) (3F,); force = the largest force one energy
    term puts on one particle (the scale the residual is compared with); overflow: the contact query or
    the active rows overflowed ``capacity``.
    """
    import jax
    import jax.numpy as jnp

    from ipcjax.energies import PSDProjection
    from ipcjax.newton import active_size, query_contacts
    from ipcjax.potential import dense_hessian, gradient_and_blocks

    free = model.free_particles
    active = active_size(capacity)  # only stencils inside d̂, as the step's implicit VJP assembles them

    def jac(x, v, params, controls, dt):
        anchor = x - dt * v
        contacts, stats = query_contacts(x, x, model, config, capacity)
        problem = rest_problem(model, config, params, anchor, controls, dt=dt, contacts=contacts, active=active)
        _, hb = gradient_and_blocks(x, problem, contacts, projection=PSDProjection.NONE, active=active)
        H = dense_hessian(hb._replace(diag=jnp.zeros_like(hb.diag)))  # the inertia diagonal out
        L = jnp.linalg.cholesky(H)
        y = measure(x)
        A = jax.jacrev(measure)(x)[:, free, :].reshape(y.shape[0], -1)  # (m, 3F)
        U = jax.scipy.linalg.cho_solve((L, True), A.T)                   # H⁻¹ Aᵀ (3F, m)
        z0 = jnp.log(jnp.stack([getattr(params, n) for n in names]))

        def G(z):
            p = rest_problem(model, config, from_z(names, z, params), anchor, controls, dt=dt, contacts=contacts,
                             active=active)
            return rest_residual(x, p, contacts)

        residual, vjp = jax.vjp(G, z0)
        J = -jax.vmap(lambda u: vjp(u)[0])(U.T)                            # (m, k)
        force = _largest_term_force(x, problem, contacts)
        overflow = stats.overflow | (active is not None and hb.n_active > active)
        return y, J, L, residual, force, overflow

    return jax.jit(jac)


# --------------------------------------------------------------------------- one node


@dataclasses.dataclass(frozen=True)
class NodeResult:
    """One smoothing node: its measurements, their rest-state Jacobian and diagnostics."""

    z: np.ndarray          # (3,) log of BAG_NAMES at this node
    y: np.ndarray          # (3,) neck x, neck y, flap (m) at the end of the run
    J: np.ndarray          # (3, 3) dy/dz over BAG_NAMES, the rest-state derivative
    residual_ratio: float  # ‖G(x)‖∞ / the largest force of one energy term on one particle
    stable: bool           # H positive definite
    max_speed: float       # m/s, the fastest particle at the end
    wall_s: float
    run_dir: str


_WORKER: dict = {}  # per worker process: the scene and jitted rest Jacobian, built once


def _rest_jacobian_for(sc, capacity):
    key = (sc.resolution, capacity)
    if key not in _WORKER:
        import jax.numpy as jnp

        from scenes.measure import shape

        neck, rim = jnp.asarray(sc.neck), jnp.asarray(sc.rim)
        _WORKER[key] = make_rest_jacobian(sc.model, sc.config, capacity, lambda x: shape(x, neck, rim))
    return _WORKER[key]


def run_node(start: str, z: np.ndarray, out: str, *, until: float | None = None, audit_every: int = 6,
             reuse: bool = False) -> NodeResult:
    """Run the bag from the state ``start`` with the log-parameters z (over BAG_NAMES) to
    ``until`` (default: the protocol's end) and take the rest-state derivative there.

    ``reuse``: take the run in ``out`` if it finished with these parameters (a sweep or
    fit that continues). Whether the rest-state derivative may be used (``stable``,
    ``residual_ratio``) is the caller's check (:func:`check_rest`).

    Raises:
        NodeFailed: a failed step, a self-intersecting audited frame, a contact query that
            overflowed at the final state.
    """
    import jax.numpy as jnp

    from ipcjax import runfolder
    from ipcjax.model import Params
    from ipcjax.step import check_geometry
    from scenes.bag import PROTOCOLS, bag_scene
    from scenes.bag_run import BagRunOptions, read_bag_state, run_bag

    t0 = time.perf_counter()
    known = dict(zip(BAG_NAMES, np.exp(np.asarray(z, np.float64)).tolist()))
    params = Params.film_defaults(**known)
    rs = runfolder.read_npz(start, "--start")
    resolution, protocol = str(rs["resolution"]), str(rs["protocol"]) if "protocol" in rs.files else "full"
    t_end = PROTOCOLS[protocol].t_end if until is None else float(until)
    s = _finished(out, params, t_end) if reuse else None
    if s is None:
        s = run_bag(BagRunOptions(out=out, resume=start, params=params, resolution=resolution, protocol=protocol,
                                  until=until, save_every=audit_every, mesh_every=0, pictures=False,
                                  progress=False)).summary
    if s["failure"]:
        raise NodeFailed(known, f"the forward run stopped: {s['failure']['reason']} at t = "
                                f"{s['failure']['time_s']:.4f} s")
    bad = s["audit"]["frames_with_self_intersection"]
    if bad:
        raise NodeFailed(known, f"{bad} audited frames self-intersect")
    sc = bag_scene(resolution, protocol=protocol, params=params)
    final = read_bag_state(os.path.join(out, "state.npz"), sc, resolution)
    x, v = np.asarray(final["x"], np.float64), np.asarray(final["v"], np.float64)
    t, k = float(final["t"]), int(final["step"])
    sc.choreography.observe(t, x)
    controls = sc.choreography.controls_at(k, t)
    capacity = check_geometry(sc.model, x, sc.config)
    jac = _rest_jacobian_for(sc, capacity)
    y, J, L, residual, force, overflow = jac(jnp.asarray(x), jnp.asarray(v), params, controls, jnp.asarray(sc.dt))
    if bool(overflow):
        raise NodeFailed(known, "the rest state's contact query overflowed its capacity")
    stable = bool(np.all(np.isfinite(np.asarray(L))))
    ratio = float(np.max(np.abs(np.asarray(residual))) / float(force))
    J = np.asarray(J)
    return NodeResult(z=np.asarray(z, np.float64), y=np.asarray(y), J=J, residual_ratio=ratio, stable=stable,
                      max_speed=float(np.max(np.linalg.norm(v, axis=1))), wall_s=time.perf_counter() - t0,
                      run_dir=out)


def _finished(out, params, t_end):
    """The summary of a run in ``out`` that reached ``t_end`` with ``params``, or None."""
    import json

    try:
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
    except (OSError, ValueError):
        return None
    same = all(math.isclose(s.get("params", {}).get(n, math.nan), float(getattr(params, n)), rel_tol=1e-12)
               for n in BAG_NAMES)
    reached = abs(float(s.get("simulated_s", -1.0)) - t_end) < 1e-6
    return s if same and reached and not s.get("failure") else None


def check_rest(node: NodeResult) -> None:
    """NodeFailed unless the node's final state is a stable rest state (H positive
    definite, ‖G‖∞ below REST_RESIDUAL_TOL of the largest term force)."""
    known = dict(zip(BAG_NAMES, np.exp(node.z).tolist()))
    if not node.stable:
        raise NodeFailed(known, "the final state is not a stable equilibrium: the Hessian ∇²(V + D) is not "
                                "positive definite")
    if not node.residual_ratio < REST_RESIDUAL_TOL:
        raise NodeFailed(known, f"the bag is not at rest: unbalanced force {node.residual_ratio:.3g} × the largest "
                                f"force of one energy term (limit {REST_RESIDUAL_TOL})")
    if not np.all(np.isfinite(node.J)):
        raise NodeFailed(known, "the rest-state derivative is not finite")


def node_folder(z, start: str) -> str:
    """The run folder name of the node at log-parameters z (over BAG_NAMES) from the state
    file ``start``: a digest of the file and the values, so that evaluations, sweeps and
    tests that meet the same node from the same start share one run."""
    import hashlib

    with open(start, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:10]
    return f"node_{digest}_" + "_".join(f"{n}={v:.9g}" for n, v in zip(BAG_NAMES, np.exp(np.asarray(z, np.float64))))


def _node_task(args):
    start, z, out, until, audit_every = args
    return run_node(start, z, out, until=until, audit_every=audit_every, reuse=True)


# --------------------------------------------------------------------------- the smoothed problem


def sigma_points(d: int, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """The 2d offsets ±σ√d·eᵢ (2d, d) and their weights (2d,) = 1/(2d)."""
    E = np.eye(d) * sigma * math.sqrt(d)
    return np.concatenate([E, -E]), np.full(2 * d, 1.0 / (2 * d))


class BagRestProblem:
    """Smoothed rest-shape measurements of the bag and their Jacobian (module docstring).

    Duck-types :class:`fitting.fit.MeasuredRollout` for :func:`fitting.fit.fit_measured`:
    ``names``, and ``problem(z, params) -> Evaluation(y, J, wall_s)`` over ``names``.

    Args:
        names: the fitted parameters (a subset of BAG_NAMES; the smoothing spreads along
            these only).
        start: the state file every forward run starts from.
        out: folder for the nodes' run folders (:func:`node_folder`; a node met again, in
            this fit or an earlier one with the same ``out``, reuses its finished run).
        sigma: smoothing width in log-parameter space.
        bounds: {name: (lo, hi)} in the parameters' units (default DEFAULT_RANGE × film
            default); an iterate outside is evaluated at the range's end (its record says
            ``clipped``), and :func:`reach_message` reads the records.
        workers: worker processes (default: the machine's cores, at most the node count).
        until: end time of the forward runs (default: the protocol's end).
        audit_every: audit every n-th step's frame for self-intersection.
        estimator: "stein" (every column by Stein's identity on the nodes) or "rest" (the
            nodes' rest-state derivatives; Stein's for PATH_ONLY parameters).
    """

    def __init__(self, names, start: str = DEFAULT_START, out: str = "runs/fit_bag", *, sigma: float = DEFAULT_SIGMA,
                 bounds: dict | None = None, workers: int | None = None, until: float | None = None,
                 audit_every: int = 6, estimator: str = "stein"):
        from ipcjax.model import Params

        names = tuple(names)
        bad = [n for n in names if n not in BAG_NAMES]
        if not names or bad or len(set(names)) != len(names):
            raise ValueError(f"the bag fit fits one or more of {', '.join(BAG_NAMES)}, each once; got {names}")
        if not (np.isfinite(sigma) and sigma > 0):
            raise ValueError(f"sigma must be > 0 (a width in log-parameter space); got {sigma}")
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}; got {estimator!r}")
        if not os.path.exists(start):
            raise FileNotFoundError(f"bag fit start state {start}: no such file")
        self.names, self.start, self.out, self.sigma = names, start, out, float(sigma)
        self.until, self.audit_every, self.estimator = until, int(audit_every), estimator
        d0 = Params.film_defaults()
        self.bounds = {n: tuple(float(getattr(d0, n)) * f for f in DEFAULT_RANGE) for n in names}
        self.bounds.update(bounds or {})
        self.offsets, self.weights = sigma_points(len(names), self.sigma)
        self.workers = min(workers or os.cpu_count() or 1, len(self.weights))
        self._pool = None
        self.records: list = []   # one dict per evaluation: z, y, J, nodes
        self.compiles, self.compile_s, self.evaluations, self.run_s = 0, 0.0, 0, 0.0

    # the pool lives as long as the problem: each worker compiles the step once
    def _map(self, tasks):
        if self.workers == 1:
            return [_node_task(t) for t in tasks]
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
        return list(self._pool.map(_node_task, tasks))

    def close(self):
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __call__(self, z, params) -> Evaluation:
        """(ȳ, J̄) at the log-parameters z (over ``names``); the parameters not fitted are
        the film defaults' (``params``, which :func:`fit_measured` passes, is not read)."""
        t0 = time.perf_counter()
        z_asked = np.asarray(z, np.float64).reshape(len(self.names))
        lo, hi = (np.log([self.bounds[n][i] for n in self.names]) for i in (0, 1))
        z = np.clip(z_asked, lo, hi)   # an iterate past the range is evaluated at its end
        base = _full_z(self.names, z)
        tasks = []
        for j, off in enumerate(self.offsets):
            zn = base.copy()
            for i, n in enumerate(self.names):
                zn[BAG_NAMES.index(n)] += off[i]
            tasks.append((self.start, zn, os.path.join(self.out, node_folder(zn, self.start)), self.until,
                          self.audit_every))
        try:
            nodes = self._map(tasks)
        finally:
            self.evaluations += 1
            self.run_s += time.perf_counter() - t0
        if self.estimator == "rest":
            for nd in nodes:
                check_rest(nd)
        y, J = smooth(nodes, self.offsets, self.weights, self.names, self.sigma, self.estimator)
        self.records.append(dict(z=z.tolist(), params={n: math.exp(v) for n, v in zip(self.names, z)},
                                 clipped=bool(np.any(z != z_asked)),
                                 y=y.tolist(), J=J.tolist(), wall_s=time.perf_counter() - t0,
                                 nodes=[dict(params=dict(zip(BAG_NAMES, np.exp(nd.z).tolist())), y=nd.y.tolist(),
                                             J_rest=nd.J.tolist(), residual_ratio=nd.residual_ratio,
                                             max_speed_m_s=nd.max_speed, wall_s=nd.wall_s, run_dir=nd.run_dir)
                                        for nd in nodes]))
        return Evaluation(y, J, time.perf_counter() - t0)


def _full_z(names, z) -> np.ndarray:
    """z over BAG_NAMES: the film defaults' logs with ``names`` set from z."""
    from ipcjax.model import Params

    d0 = Params.film_defaults()
    full = np.log([float(getattr(d0, n)) for n in BAG_NAMES])
    for n, v in zip(names, z):
        full[BAG_NAMES.index(n)] = v
    return full


def smooth(nodes, offsets, weights, names, sigma, estimator="stein"):
    """ȳ (m,) and J̄ (m, len(names)) from the nodes: the weighted mean of y; per column
    Stein's estimate Σ wᵢ yᵢ offsetᵢ/σ², or (``estimator="rest"``) the mean of the nodes'
    rest-state derivatives except for PATH_ONLY parameters."""
    Y = np.stack([nd.y for nd in nodes])                        # (2d, m)
    y = weights @ Y
    J = np.zeros((Y.shape[1], len(names)))
    for i, n in enumerate(names):
        if estimator == "stein" or n in PATH_ONLY:
            J[:, i] = (weights * offsets[:, i]) @ Y / sigma**2
        else:
            J[:, i] = weights @ np.stack([nd.J[:, BAG_NAMES.index(n)] for nd in nodes])
    return y, J


# --------------------------------------------------------------------------- what a fit says


#: The specification's measured bag after release (docs/spec.md §5): neck x, neck y, flap, m.
SPEC_TARGETS = (38.83e-3, 37.20e-3, 18.43e-3)
#: Measurement noise of the error bar, m (one standard deviation of each measurement).
DEFAULT_NOISE = 0.5e-3


def interval(J_mm, names, values, noise_mm) -> dict:
    """1σ intervals of the fitted parameters for independent measurement noise ``noise_mm``
    (one value for every measurement, or one per measurement row of J).

    With J (m × k) in mm per unit log-parameter and W = diag(noise⁻²), the Gauss–Newton
    covariance of z is (JᵀWJ)⁻¹; each parameter's interval is value · exp(±σ_z). A
    rank-deficient J gives infinite intervals for the parameters it cannot see, never a
    finite guess.
    """
    J = np.asarray(J_mm, np.float64)
    noise = np.broadcast_to(np.asarray(noise_mm, np.float64), (J.shape[0],))
    if not np.all(np.isfinite(noise) & (noise > 0)):
        raise ValueError(f"noise must be > 0 mm for every measurement; got {noise.tolist()}")
    Jw = J / noise[:, None]
    A = Jw.T @ Jw
    out = {}
    try:
        if np.linalg.cond(A) > 1e12:
            raise np.linalg.LinAlgError
        C = np.linalg.inv(A)
    except np.linalg.LinAlgError:
        C = np.full((len(names), len(names)), np.inf)
    for i, n in enumerate(names):
        sz = float(np.sqrt(C[i, i])) if np.isfinite(C[i, i]) and C[i, i] >= 0 else math.inf
        v = float(values[n])
        out[n] = dict(value=v, sigma_log=sz, low=v * math.exp(-sz) if math.isfinite(sz) else 0.0,
                      high=v * math.exp(sz) if math.isfinite(sz) else math.inf,
                      relative=math.expm1(sz) if math.isfinite(sz) else math.inf)
    return out


#: One forward run's scatter about the trend of the rest shape in E (neck x, neck y, flap;
#: mm, one standard deviation): the 17-run E sweep, docs/figures/bag_sweep_E/sweep_w2.json
#: ("trend"), reprinted by ``python3 benchmarks/bag_sweep.py --report --out
#: docs/figures/bag_sweep_E``. The model's own noise: pleats snap shut or not.
MODEL_SCATTER_MM = (1.71, 3.29, 1.06)
#: Relative 1σ accuracies for which :func:`scatter_budget` says how many runs each node needs.
ACCURACY_GOALS = (0.02, 0.05)


def scatter_budget(J_mm, names, values, scatter_mm, *, runs_per_evaluation: int, goals=ACCURACY_GOALS) -> dict:
    """What the model's own scatter allows: the 1σ interval when each smoothed measurement
    averages ``runs_per_evaluation`` single runs whose scatter is ``scatter_mm`` (so its
    noise is scatter/√runs), and, per parameter and goal g, the runs each node would need
    for a relative 1σ of g (the noise falls as 1/√K, so K = ⌈(σ_z / log(1 + g))²⌉ runs per
    node, 1 where one run already reaches g)."""
    s = np.broadcast_to(np.asarray(scatter_mm, np.float64), (np.asarray(J_mm).shape[0],))
    iv = interval(J_mm, names, values, s / math.sqrt(runs_per_evaluation))
    need = {n: {f"{g:.0%}": (max(1, math.ceil((iv[n]["sigma_log"] / math.log1p(g)) ** 2))
                             if math.isfinite(iv[n]["sigma_log"]) else None) for g in goals} for n in names}
    return dict(scatter_mm=s.tolist(), runs_per_evaluation=int(runs_per_evaluation), interval_1sigma=iv,
                runs_per_node_for=need)


def identifiability(J_mm, names, noise_mm: float) -> dict:
    """Singular values of J (mm per unit log-parameter), the weakest direction, and which
    parameters move the measurements by less than the noise over a factor e."""
    J = np.asarray(J_mm, np.float64)
    _, sv, Vt = np.linalg.svd(J, full_matrices=False)
    col = np.linalg.norm(J, axis=0)
    return dict(columns=list(names), singular_values_mm=sv.tolist(),
                condition_number=float(sv[0] / sv[-1]) if sv[-1] > 0 else math.inf,
                weakest_direction=dict(zip(names, Vt[-1].tolist())),
                sensitivity_mm_per_log=dict(zip(names, col.tolist())),
                below_noise=[n for n, c in zip(names, col) if c < noise_mm])


def reach_message(names, bounds, records, target) -> str | None:
    """The sentence an answer outside the model's reach needs, or None.

    Said when the best evaluation lies on a range end and the smoothed gradient there still
    points outward (the loss would fall beyond the range): "no E in [a, b] brings the neck
    and flap to the targets: the closest, at E = b, is …".
    """
    if not records:
        return None
    t = np.asarray(target) * 1e3
    best = min(records, key=lambda r: float(np.sum((np.asarray(r["y"]) * 1e3 - t) ** 2)))
    y = np.asarray(best["y"]) * 1e3
    g = 2.0 * (np.asarray(best["J"]) * 1e3).T @ (y - t)      # ∇ of Σ (y − t)² in log-parameters
    outward = []
    for i, n in enumerate(names):
        lo, hi = bounds[n]
        v = best["params"][n]
        near_lo, near_hi = v <= lo * 1.25, v >= hi / 1.25   # within one smoothing width (×1.25) of an end
        if (near_lo and g[i] > 0) or (near_hi and g[i] < 0):
            outward.append((n, lo, hi, v))
    if not outward:
        return None
    what = "; ".join(f"no {n} in [{lo:.4g}, {hi:.4g}]" for n, lo, hi, _ in outward)
    at = ", ".join(f"{n} = {v:.4g}" for n, _, _, v in outward)
    return (f"{what} brings the neck and flap to the targets ({t[0]:.2f} × {t[1]:.2f} mm, flap {t[2]:.2f} mm): "
            f"the closest, at {at}, is neck {y[0]:.2f} × {y[1]:.2f} mm, flap {y[2]:.2f} mm, and the loss "
            f"still falls toward the end of the range")

"""The bag fit (docs/spec.md §5): film parameters from the rest shape after release.

A user measures the bag after it has been tied and released: neck width x × y and flap
height. :class:`BagRestProblem` gives the fit loop (:func:`fitting.fit.fit_measured`)
those three measurements of the simulated bag, smoothed, and their Jacobian in the log
of the fitted parameters (E, μf, kθ):

1. **Forward**: every node runs the bag from a committed checkpoint
   (``scenes/data/bag_full_tie.npz`` by default: 8.40 s, the start of the tie) to the end of
   the protocol (10.50 s, the measured instant) with the host driver of ``ipcjax bag``
   (:func:`scenes.bag_run.run_bag`: capacity growth, subdivision, the self-intersection
   audit of every ``audit_every``-th frame). By then the bag has settled (the fastest
   particle at 0.5–12 mm/s over the E sweep of docs/differentiation.md).
2. **Smoothing**: one trajectory's measurements are piecewise in the parameters (pleats
   snap shut or not; docs/differentiation.md: on the E sweep the neck jumps by up to 7 mm
   between neighbouring runs 10 % apart). The runs repeat (the same parameters give the
   same measurements, mostly to under a micrometre: docs/differentiation.md), so every
   run is made at a point of a fixed lattice z₀ + j h in log-parameter space (z₀ the film defaults' logs, h =
   ``step``), once, and the fitted quantity is their cubic B-spline smoothing

       ȳ(z) = Σ_j w_j(z) y(z₀ + j h),   w_j(z) = Πᵢ N((zᵢ − z₀ᵢ)/h − jᵢ),

   N the cubic B-spline (:func:`bspline3`): Schoenberg's variation-diminishing spline
   approximation (M. Marsden and I. J. Schoenberg 1966, "On variation diminishing spline
   approximation methods"; C. de Boor, "A Practical Guide to Splines", 2001, ch. XI). It is C² in z, reproduces straight lines, and has no more wiggles than the runs'
   own sequence: a jump between two nodes becomes a smooth ramp over four. Its Jacobian is
   its exact derivative Σ_j y_j ∂w_j/∂z, so the fit's gradient is the gradient of the
   loss it minimises and points the way its values go. An evaluation needs the 4^d lattice
   points around z (3^d on the lattice); a fit that moves by less than a lattice step
   reuses them, so the last iterations of a fit cost no run. The lattice, not a random
   draw, fixes which runs are averaged (common random numbers). The kernel N, the
   four-fold convolution of the unit box, is close to a Gaussian of standard deviation
   h/√3; the runs' scatter remains in ȳ as in the mean of 2.0 to 2.2 independent runs
   (:func:`effective_runs`).
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
   nearly blind to μf and kθ (docs/differentiation.md): that is why the fit uses the
   spline's derivative. In the "rest" mode μf (PATH_ONLY) still takes the spline's. The derivative is only used where H is
   positive definite and ‖G‖∞ is below REST_RESIDUAL_TOL (:func:`check_rest`).

Every run is made in a worker process (``workers``, default all cores), and a node met
again, in this fit or in a sweep or fit that wrote to the same folder, reuses its finished
run (:func:`node_folder`). A failed node (a failed step, a
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
#: per unit log μf at the film defaults); estimator "rest" takes the spline's derivative for them.
PATH_ONLY = ("friction",)
#: Default start of every forward run: the full-resolution tie checkpoint (8.40 s), package
#: data of scenes/ (the bag's state.npz; pyproject.toml ships it with the package).
DEFAULT_START = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "scenes", "data", "bag_full_tie.npz")
#: The smoothed Jacobian's estimators (BagRestProblem, lattice_smooth).
ESTIMATORS = ("spline", "rest")
#: Default lattice step h in log-parameter space: 2 ln 2 / 7 ≈ 0.198 (neighbouring nodes a
#: factor 2^(2/7) ≈ 1.22 apart), every second point of benchmarks/bag_sweep.py's grid
#: 2^(k/7), whose runs are then nodes. At one grid step the smoothed loss against synthetic
#: targets has a second minimum near E × 0.74 (docs/differentiation.md).
DEFAULT_STEP = 2 * math.log(2.0) / 7
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


def bspline3(u):
    """The cubic B-spline N(u) of unit knot spacing, centred at 0 (u in lattice steps):

        N(u) = 2/3 − u² + |u|³/2      for |u| < 1,
               (2 − |u|)³/6           for 1 ≤ |u| < 2,
               0                      beyond.

    Non-negative, C² in u, and on the integer lattice a partition of unity that reproduces
    straight lines: Σⱼ N(u − j) = 1 and Σⱼ j N(u − j) = u for every u (de Boor, "A
    Practical Guide to Splines", 2001, ch. IX and XI).
    """
    a = np.abs(np.asarray(u, np.float64))
    return np.where(a < 1, 2.0 / 3.0 - a**2 + 0.5 * a**3, np.where(a < 2, (2.0 - a) ** 3 / 6.0, 0.0))


def bspline3_derivative(u):
    """dN/du of :func:`bspline3`: −2u + 3u|u|/2 for |u| < 1, −sign(u)(2 − |u|)²/2 for
    1 ≤ |u| < 2, 0 beyond (continuous, as N is C²)."""
    u = np.asarray(u, np.float64)
    a = np.abs(u)
    return np.where(a < 1, -2.0 * u + 1.5 * u * a, np.where(a < 2, -np.sign(u) * 0.5 * (2.0 - a) ** 2, 0.0))


def lattice_support(u) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lattice points of non-zero weight at the point u (d,) in lattice steps.

    Returns (index (n, d) int, w (n,), dw (n, d)): the tensor-product weights
    w_j = Πᵢ N(uᵢ − jᵢ) (:func:`bspline3`; at most 4^d points, 3^d where u lies on the
    lattice) and their gradients ∂w_j/∂u. Σ w = 1.
    """
    import itertools

    u = np.asarray(u, np.float64).reshape(-1)
    axes = []
    for ui in u:
        base = math.floor(ui)
        js = [j for j in range(base - 1, base + 3) if bspline3(ui - j) > 0]
        axes.append([(j, float(bspline3(ui - j)), float(bspline3_derivative(ui - j))) for j in js])
    index, w, dw = [], [], []
    for combo in itertools.product(*axes):
        index.append([c[0] for c in combo])
        vals = [c[1] for c in combo]
        w.append(math.prod(vals))
        dw.append([c[2] * math.prod(vals[:i] + vals[i + 1:]) for i, c in enumerate(combo)])
    return np.asarray(index, np.int64), np.asarray(w), np.asarray(dw)


def lattice_smooth(nodes, w, dw, names, step, estimator="spline"):
    """ȳ (m,) = Σ_j w_j y_j and J̄ (m, len(names)): per column the derivative of ȳ,
    Σ_j y_j ∂w_j/∂zᵢ = Σ_j y_j (∂w_j/∂uᵢ)/h, or (``estimator="rest"``) the weighted mean
    Σ_j w_j ∂y_j/∂zᵢ of the nodes' rest-state derivatives, except for PATH_ONLY parameters.

    ``nodes`` are the :class:`NodeResult` at the lattice points of ``w`` (weights) and
    ``dw`` (their gradients in lattice steps; :func:`lattice_support`); ``step`` = h.
    """
    Y = np.stack([nd.y for nd in nodes])                        # (n, m)
    w, dw = np.asarray(w), np.asarray(dw).reshape(len(nodes), len(names))
    y = w @ Y
    J = np.zeros((Y.shape[1], len(names)))
    for i, n in enumerate(names):
        if estimator == "spline" or n in PATH_ONLY:
            J[:, i] = dw[:, i] @ Y / step
        else:
            J[:, i] = w @ np.stack([nd.J[:, BAG_NAMES.index(n)] for nd in nodes])
    return y, J


class BagRestProblem:
    """Smoothed rest-shape measurements of the bag and their Jacobian (module docstring).

    A :class:`fitting.fit.MeasuredProblem` for :func:`fitting.fit.fit_measured`: ``names``,
    and ``problem(z, params) -> Evaluation(y, J, wall_s)`` over ``names``. Its runs hold
    every parameter it does not fit at the film defaults, so ``params`` must too (None
    stands for them); a ``params`` that differs there is refused, not ignored.

    Args:
        names: the fitted parameters (a subset of BAG_NAMES; the lattice spans these only,
            the others stay at their film defaults).
        start: the state file every forward run starts from.
        out: folder for the nodes' run folders (:func:`node_folder`; a node met again, in
            this fit or an earlier one with the same ``out``, reuses its finished run).
        step: the lattice step h in log-parameter space; the lattice is z₀ + j h, z₀ the
            film defaults' logs.
        bounds: {name: (lo, hi)} in the parameters' units (default DEFAULT_RANGE × film
            default); an iterate outside is evaluated at the range's end (its record says
            ``clipped``), and :func:`reach_message` reads the records.
        workers: worker processes for the runs (default: the machine's cores).
        until: end time of the forward runs (default: the protocol's end).
        audit_every: audit every n-th step's frame for self-intersection.
        estimator: "spline" (every column the derivative of the smoothed measurements) or
            "rest" (the weighted mean of the nodes' rest-state derivatives; the spline's for
            PATH_ONLY parameters).
    """

    def __init__(self, names, start: str = DEFAULT_START, out: str = "runs/fit_bag", *, step: float = DEFAULT_STEP,
                 bounds: dict | None = None, workers: int | None = None, until: float | None = None,
                 audit_every: int = 6, estimator: str = "spline"):
        from ipcjax.model import Params

        names = tuple(names)
        bad = [n for n in names if n not in BAG_NAMES]
        if not names or bad or len(set(names)) != len(names):
            raise ValueError(f"the bag fit fits one or more of {', '.join(BAG_NAMES)}, each once; got {names}")
        if not (np.isfinite(step) and step > 0):
            raise ValueError(f"step must be > 0 (the lattice step in log-parameter space); got {step}")
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}; got {estimator!r}")
        if not os.path.exists(start):
            raise FileNotFoundError(f"bag fit start state {start}: no such file")
        self.names, self.start, self.out, self.step = names, start, out, float(step)
        self.until, self.audit_every, self.estimator = until, int(audit_every), estimator
        d0 = Params.film_defaults()
        self.bounds = {n: tuple(float(getattr(d0, n)) * f for f in DEFAULT_RANGE) for n in names}
        self.bounds.update(bounds or {})
        self.cols = [BAG_NAMES.index(n) for n in names]
        self.origin = _full_z((), [])     # z₀ over BAG_NAMES: the lattice's point j = 0
        self.workers = max(1, int(workers or os.cpu_count() or 1))
        self._pool = None
        self.nodes: dict = {}             # lattice index (tuple over names) -> NodeResult
        self.records: list = []           # one dict per evaluation: z, y, J, nodes
        self.evaluations, self.runs, self.run_s = 0, 0, 0.0

    # the pool lives as long as the problem: each worker compiles the step once
    def _map(self, tasks):
        if self.workers == 1 or len(tasks) == 1 and self._pool is None:
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

    def _task(self, zfull):
        return (self.start, zfull, os.path.join(self.out, node_folder(zfull, self.start)), self.until,
                self.audit_every)

    def lattice_z(self, index) -> np.ndarray:
        """z over BAG_NAMES of the lattice point ``index`` (over ``names``)."""
        z = self.origin.copy()
        z[self.cols] += np.asarray(index, np.float64) * self.step
        return z

    def run(self, z) -> NodeResult:
        """One forward run at the log-parameters z (over ``names``), off the lattice too (the
        fitted value's own run); counted in ``runs``."""
        zfull = self.origin.copy()
        zfull[self.cols] = np.asarray(z, np.float64)
        self.runs += 1
        return self._map([self._task(zfull)])[0]

    def _check_unfitted(self, params) -> None:
        if params is None:
            return
        from ipcjax.model import Params

        d0 = Params.film_defaults()
        off = [f"{n}={np.asarray(getattr(params, n)).tolist()} (film default {np.asarray(getattr(d0, n)).tolist()})"
               for n in Params._fields if n not in self.names
               and not np.array_equal(np.asarray(getattr(params, n), np.float64), np.asarray(getattr(d0, n), np.float64))]
        if off:
            raise ValueError("the bag fit runs every parameter it does not fit at the film default; params has "
                             + ", ".join(off))

    def __call__(self, z, params) -> Evaluation:
        """(ȳ, J̄) at the log-parameters z (over ``names``), running the lattice points it
        needs that have not run yet; the parameters not fitted are the film defaults'.

        Raises:
            ValueError: ``params`` (None, or what :func:`fit_measured` passes) differs from
                the film defaults in a parameter not in ``names``: the runs could not honour it.
        """
        self._check_unfitted(params)
        t0 = time.perf_counter()
        z_asked = np.asarray(z, np.float64).reshape(len(self.names))
        lo, hi = (np.log([self.bounds[n][i] for n in self.names]) for i in (0, 1))
        z = np.clip(z_asked, lo, hi)   # an iterate past the range is evaluated at its end
        index, w, dw = lattice_support((z - self.origin[self.cols]) / self.step)
        keys = [tuple(int(v) for v in j) for j in index]
        missing = [k for k in keys if k not in self.nodes]
        try:
            for k, nd in zip(missing, self._map([self._task(self.lattice_z(k)) for k in missing])):
                self.nodes[k] = nd
        finally:
            self.evaluations += 1
            self.runs += len(missing)
            self.run_s += time.perf_counter() - t0
        nodes = [self.nodes[k] for k in keys]
        if self.estimator == "rest":
            for nd in nodes:
                check_rest(nd)
        y, J = lattice_smooth(nodes, w, dw, self.names, self.step, self.estimator)
        self.records.append(dict(z=z.tolist(), params={n: math.exp(v) for n, v in zip(self.names, z)},
                                 clipped=bool(np.any(z != z_asked)), y=y.tolist(), J=J.tolist(),
                                 new_runs=len(missing), effective_runs=effective_runs(w),
                                 wall_s=time.perf_counter() - t0,
                                 nodes=[dict(index=list(k), weight=float(wk),
                                             params=dict(zip(BAG_NAMES, np.exp(nd.z).tolist())), y=nd.y.tolist(),
                                             J_rest=nd.J.tolist(), residual_ratio=nd.residual_ratio,
                                             max_speed_m_s=nd.max_speed, wall_s=nd.wall_s, run_dir=nd.run_dir)
                                        for k, wk, nd in zip(keys, w, nodes)]))
        return Evaluation(y, J, time.perf_counter() - t0)


def effective_runs(w) -> float:
    """1/Σ w²: the number of equally weighted independent runs whose mean has the variance
    of Σ w_j y_j (in 1-D 2.0 on a lattice point, 2.17 half-way between two)."""
    w = np.asarray(w, np.float64)
    return float(1.0 / np.sum(w**2))


def _full_z(names, z) -> np.ndarray:
    """z over BAG_NAMES: the film defaults' logs with ``names`` set from z."""
    from ipcjax.model import Params

    d0 = Params.film_defaults()
    full = np.log([float(getattr(d0, n)) for n in BAG_NAMES])
    for n, v in zip(names, z):
        full[BAG_NAMES.index(n)] = v
    return full


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
#: mm, one standard deviation): the 19-run E sweep, docs/figures/bag_sweep_E/sweep_w2.json
#: ("trend"), reprinted by ``python3 benchmarks/bag_sweep.py --report --out
#: docs/figures/bag_sweep_E``. The model's own noise: pleats snap shut or not.
MODEL_SCATTER_MM = (1.62, 3.56, 1.10)
#: Relative 1σ accuracies for which :func:`scatter_budget` says how many runs each node needs.
ACCURACY_GOALS = (0.02, 0.05)


def scatter_budget(J_mm, names, values, scatter_mm, *, effective_runs: float, goals=ACCURACY_GOALS) -> dict:
    """What the model's own scatter allows: the 1σ interval when each smoothed measurement
    has the variance of a mean of ``effective_runs`` independent single runs whose scatter is
    ``scatter_mm`` (so its noise is scatter/√effective_runs; :func:`effective_runs`), and,
    per parameter and goal g, the runs each lattice node would need (a mean of K runs from
    perturbed starts in place of one) for a relative 1σ of g: the noise falls as 1/√K, so
    K = ⌈(σ_z / log(1 + g))²⌉, 1 where one run per node already reaches g. It treats the
    runs' scatter as independent noise; neighbouring runs that share a pleat pattern are
    not, so it is an estimate of the order, not a bound."""
    s = np.broadcast_to(np.asarray(scatter_mm, np.float64), (np.asarray(J_mm).shape[0],))
    if not (np.isfinite(effective_runs) and effective_runs > 0):
        raise ValueError(f"effective_runs must be > 0; got {effective_runs}")
    iv = interval(J_mm, names, values, s / math.sqrt(effective_runs))
    need = {n: {f"{g:.0%}": (max(1, math.ceil((iv[n]["sigma_log"] / math.log1p(g)) ** 2))
                             if math.isfinite(iv[n]["sigma_log"]) else None) for g in goals} for n in names}
    return dict(scatter_mm=s.tolist(), effective_runs=float(effective_runs), interval_1sigma=iv,
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

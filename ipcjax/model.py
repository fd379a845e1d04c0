"""Model inputs (docs/spec.md): static topology and rest data, differentiable parameters, controls, state.

The split follows the static/dynamic rule of the library:

* :class:`Model` — topology (int32 index arrays) and rest data computed once on the
  host (reference triangle inverses, rest areas, hinges and rest angles, masses). Its
  shapes are static: changing them recompiles, by design.
* :class:`Params` — the differentiable material parameters (E, ν, thickness, bending
  scale, friction μf, barrier stiffness, gravity, film drag). Fit these.
* :class:`Controls` — per-step inputs: supports, ties, external forces, tolerance.
* :class:`State` — positions and velocities in storage precision (FP32) and time.

Particles are of three sorts, all in one array: film vertices (in ``film_triangles``),
fixed obstacle vertices (in ``obstacle_triangles``; zero mass, fixed) and independent
sphere centres (radius > 0, referenced by no triangle).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ipcjax import candidates as _cand
from ipcjax.energies import bending as _bend
from ipcjax.energies import membrane as _memb
from ipcjax.energies import PSDProjection  # noqa: F401  (re-exported: the Hessian projection's one name)
from ipcjax.topology import as_triangles, hinge_topology


class Model(NamedTuple):
    """Static topology and rest data (a pytree of arrays; shapes are static)."""

    x_ref: jnp.ndarray          # (N, 3) reference positions, m
    mass: jnp.ndarray           # (N,) kg
    fixed: jnp.ndarray          # (N,) bool
    radius: jnp.ndarray         # (N,) m; > 0 only for sphere centres
    film: jnp.ndarray           # (N,) bool: particle belongs to the film (drag applies)
    film_triangles: jnp.ndarray  # (Tf, 3) int32: membrane elements
    dm_inv: jnp.ndarray         # (Tf, 2, 2) reference-triangle inverse (Newton's tri_poses)
    rest_area: jnp.ndarray      # (Tf,) m²
    hinges: jnp.ndarray         # (H, 4) int32 (a, b, c, d)
    theta0: jnp.ndarray         # (H,) rest dihedral angle, rad
    hinge_length: jnp.ndarray   # (H,) rest shared-edge length ℓ, m
    hinge_area: jnp.ndarray     # (H,) combined rest area of the two faces A, m²
    free_slot: jnp.ndarray      # (N,) int32: index among free particles, F for fixed ones
    free_particles: jnp.ndarray  # (F,) int32
    topology: _cand.ContactTopology  # contact triangles, edges, points, spheres (host arrays)

    @property
    def n_particles(self) -> int:
        return int(self.x_ref.shape[0])

    @property
    def n_free(self) -> int:
        return int(self.free_particles.shape[0])


class Params(NamedTuple):
    """Differentiable material and contact parameters (SI units)."""

    youngs_modulus: jnp.ndarray      # E, Pa
    poisson: jnp.ndarray             # ν
    thickness: jnp.ndarray           # h, m
    bending_scale: jnp.ndarray       # multiplies the physical kθ (1 = physical)
    friction: jnp.ndarray            # μf
    barrier_stiffness: jnp.ndarray   # k, N/m
    gravity: jnp.ndarray             # (3,) m/s²
    drag: jnp.ndarray                # film drag coefficient, 1/s (force −drag·m·v)

    @staticmethod
    def film_defaults(**overrides) -> "Params":
        """The bag film (docs/spec.md): 30 µm, E = 315 MPa, ν = 0.45, μf = 0.35, k = 1000 N/m.

        Raises:
            ValueError: an override outside its physical range (see :func:`check_params`).
        """
        base = dict(
            youngs_modulus=315e6, poisson=0.45, thickness=30e-6, bending_scale=1.0,
            friction=0.35, barrier_stiffness=1000.0, gravity=(0.0, 0.0, -9.81), drag=12.0,
        )
        unknown = sorted(set(overrides) - set(base))
        if unknown:
            raise TypeError(f"unknown parameter(s) {', '.join(unknown)}; Params has {', '.join(base)}")
        base.update(overrides)
        return check_params(Params(**base))


#: Each parameter's physical range, as (test, description) on its value.
PARAM_RANGES = {
    "youngs_modulus": (lambda v: v > 0, "> 0 Pa"),
    "poisson": (lambda v: -1.0 < v < 0.5, "in (−1, 0.5)"),
    "thickness": (lambda v: v > 0, "> 0 m"),
    "bending_scale": (lambda v: v >= 0, "≥ 0"),
    "friction": (lambda v: v >= 0, "≥ 0"),
    "barrier_stiffness": (lambda v: v > 0, "> 0 N/m"),
    "gravity": (lambda v: True, "finite, m/s²"),
    "drag": (lambda v: v >= 0, "≥ 0 1/s"),
}


def _is_traced(a) -> bool:
    return isinstance(a, jax.core.Tracer)


def check_params(params: Params) -> Params:
    """Canonicalise ``params`` to strongly typed float64 leaves and check their ranges.

    Every leaf becomes a float64 array of its field's shape (``gravity`` (3,), the rest
    scalars), so a Python float, a weak-typed or a float32 leaf never retraces a jitted
    rollout. Concrete values must be finite and inside :data:`PARAM_RANGES`; traced values
    (inside ``jit``/``grad``) are only cast, since their values are not known.

    Raises:
        TypeError: ``params`` is not a :class:`Params`, or a leaf is not a real number.
        ValueError: a wrong shape, a non-finite value or a value out of range, naming
            the parameter.
    """
    if not isinstance(params, Params):
        raise TypeError(f"params must be an ipcjax.model.Params; got {type(params).__name__}")
    out = {}
    for name, v in params._asdict().items():
        shape = (3,) if name == "gravity" else ()
        if not _is_traced(v):
            a = np.asarray(v)
            if a.dtype == object or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
                raise TypeError(f"parameter {name} must be a real number; got {a!r} of dtype {a.dtype}")
        if np.shape(v) != shape:
            raise ValueError(f"parameter {name} must have shape {shape}; got {np.shape(v)}")
        if not _is_traced(v):
            a = np.asarray(v, np.float64)
            ok, rule = PARAM_RANGES[name]
            if not np.all(np.isfinite(a)):
                raise ValueError(f"parameter {name} must be finite; got {a.tolist()}")
            if not ok(a if shape else float(a)):
                raise ValueError(f"parameter {name} must be {rule}; got {a.tolist()}")
        out[name] = jnp.asarray(v, dtype=jnp.float64)
    return Params(**out)


def check_dt(dt) -> float | jnp.ndarray:
    """A timestep that is finite and > 0 (s); traced values pass through unchanged.

    Raises:
        ValueError: dt ≤ 0, non-finite, or not a scalar.
    """
    if _is_traced(dt):
        return dt
    a = np.asarray(dt)
    if a.shape != () or a.dtype == object or not np.isfinite(a) or not float(a) > 0:
        raise ValueError(f"dt must be a finite scalar > 0 s; got {dt!r}")
    return dt


class Controls(NamedTuple):
    """Per-step inputs. Slots with zero stiffness are inactive (a released support)."""

    support_index: jnp.ndarray   # (K,) int32 particle indices
    support_k: jnp.ndarray       # (K,) N/m
    support_target: jnp.ndarray  # (K, 3) m
    tie_pairs: jnp.ndarray       # (Q, 2) int32
    tie_k: jnp.ndarray           # (Q,) N/m
    tie_length: jnp.ndarray      # (Q,) m
    force: jnp.ndarray           # (N, 3) external force, N
    tolerance: jnp.ndarray       # Newton convergence on max|Δx|, m

    @staticmethod
    def empty(n_particles: int, tolerance: float = 1.2e-5, n_supports: int = 0, n_ties: int = 0) -> "Controls":
        """Controls with no supports or ties (or with inactive slots of the given counts)."""
        return Controls(
            support_index=jnp.zeros((n_supports,), jnp.int32),
            support_k=jnp.zeros((n_supports,)),
            support_target=jnp.zeros((n_supports, 3)),
            tie_pairs=jnp.zeros((n_ties, 2), jnp.int32),
            tie_k=jnp.zeros((n_ties,)),
            tie_length=jnp.zeros((n_ties,)),
            force=jnp.zeros((n_particles, 3)),
            tolerance=jnp.asarray(tolerance, jnp.float64),
        )


def check_controls(model: "Model", controls: Controls, *, time_axis: bool = False) -> Controls:
    """Check a :class:`Controls` (or a time-indexed one, ``time_axis=True``) on the host.

    Support and tie indices must name particles of ``model``; stiffnesses, rest lengths
    and the tolerance must be finite with k ≥ 0, lengths ≥ 0 and tolerance > 0 m;
    targets and forces finite, forces of shape (N, 3). Traced controls pass unchecked.

    Raises:
        TypeError: not a Controls. ValueError: naming the field and the first bad entry.
    """
    if not isinstance(controls, Controls):
        raise TypeError(f"controls must be an ipcjax.model.Controls; got {type(controls).__name__}")
    if any(_is_traced(a) for a in controls):
        return controls
    n = model.n_particles
    lead = 1 if time_axis else 0
    c = {k: np.asarray(v) for k, v in controls._asdict().items()}
    if time_axis:
        steps = {v.shape[0] if v.ndim else None for v in c.values()}
        if len(steps) != 1 or None in steps:
            raise ValueError(f"time-indexed controls need one leading time axis on every field; got shapes "
                             f"{ {k: v.shape for k, v in c.items()} }")
    expect = dict(support_index=("K",), support_k=("K",), support_target=("K", 3), tie_pairs=("Q", 2),
                  tie_k=("Q",), tie_length=("Q",), force=(n, 3), tolerance=())
    sizes = {}
    for k, want in expect.items():
        shape = c[k].shape[lead:]
        ok = len(shape) == len(want)
        for got, w in zip(shape, want):
            if isinstance(w, str):
                ok = ok and sizes.setdefault(w, got) == got
            else:
                ok = ok and got == w
        if not ok:
            raise ValueError(f"controls.{k} must have shape {('T',) * lead + want}; got {c[k].shape}")
        if not np.all(np.isfinite(c[k])):
            raise ValueError(f"controls.{k} must be finite")
    for k in ("support_index", "tie_pairs"):
        if c[k].size and (not np.issubdtype(c[k].dtype, np.integer) or c[k].min() < 0 or c[k].max() >= n):
            raise ValueError(f"controls.{k} must hold particle indices in [0, {n}); got values in "
                             f"[{c[k].min()}, {c[k].max()}] of dtype {c[k].dtype}")
    for k in ("support_k", "tie_k", "tie_length"):
        if (c[k] < 0).any():
            raise ValueError(f"controls.{k} must be ≥ 0; got {c[k].min()}")
    if not (c["tolerance"] > 0).all():
        raise ValueError(f"controls.tolerance must be > 0 m; got {c['tolerance'].min()}")
    return controls


class State(NamedTuple):
    """Positions and velocities in storage precision (FP32), and time in s."""

    x: jnp.ndarray  # (N, 3) float32, m
    v: jnp.ndarray  # (N, 3) float32, m/s
    t: jnp.ndarray  # () float64, s


LINEAR_SOLVERS = ("dense", "cg", "sparse")
NEWTON_TANGENTS = ("projected", "exact_first")


@dataclass(frozen=True)
class Config:
    """Solver settings.

    ``membrane``, ``bending`` and ``linear_solver`` name the energy models
    (:class:`~ipcjax.energies.membrane.MembraneModel`,
    :class:`~ipcjax.energies.bending.BendingModel`) and the linear solver object
    (:func:`ipcjax.linear_solvers.linear_solver`) and are static (changing them
    recompiles); an unknown name raises ValueError listing the known ones. The numbers are
    traced leaves of the pytree, so tolerances, caps and distances can change without
    recompiling. ``linear_solver="dense"`` factorizes the equilibrated (3F, 3F) Hessian by
    Cholesky; ``"cg"`` never forms it and solves with block-Jacobi preconditioned
    conjugate gradients on the element blocks, to a relative residual ``cg_tolerance``
    within ``cg_max_iterations`` (not reaching it is a failed factorization);
    ``"sparse"`` factorizes the sparse Hessian by CHOLMOD inside XLA
    (:mod:`ipcjax.cholmod_ffi`; the exact implicit Hessian on the host, :mod:`ipcjax.ldl`),
    exact like ``"dense"``, without the (3F)² matrix. ``line_search_expansions`` (static,
    0–16; 0 is the specification's line search): after a full Newton step that lowered Φ
    by at least :data:`ipcjax.line_search.EXPAND_RATIO` of |∇Φ·Δx|, up to that many
    doublings of α while Φ keeps falling (:func:`ipcjax.line_search.expand`, docs/design.md).
    ``newton_tangent`` (static) names the Hessian of the Newton direction: ``"projected"``
    (the specification's: every element's PSD tangent) or ``"exact_first"`` (the membrane's
    exact element Hessians, the rest projected, factorized first; where that
    factorization fails, the projected tangent: :mod:`ipcjax.newton`, docs/design.md).
    ``max_direction`` (m, traced; ∞: none) caps the Newton direction: one whose largest
    coordinate change max|Δx| is longer is scaled down to that length before the
    candidates, the step bound and the line search see it (the stopping rule reads the
    whole direction). The bag uses neither: with them its whole runs ended elsewhere
    (docs/design.md, "The exact tangent first").
    """

    membrane: str = "neo_hookean"       # or "stvk": energies.membrane.MEMBRANE_MODELS
    bending: str = "hinge"              # or "discrete_shell": energies.bending.BENDING_MODELS
    linear_solver: str = "dense"        # or "cg", "sparse": linear_solvers.linear_solver
    dhat: float = 1.0e-3                # barrier activation distance, m
    min_gap: float = 0.030e-3           # film mid-surface gap, m
    skin: float = 1.5e-3                # candidate-reuse skin between Newton iterations, m
    max_newton: int = 150
    max_line_search: int = 48
    armijo: float = 1e-4
    max_subdivisions: int = 7
    cg_tolerance: float = 1e-8          # relative residual ‖Hz + g‖/‖g‖ of the CG direction
    cg_max_iterations: int = 5000
    ccd_passes: int = 256               # conservative-advancement passes of the step bound (1: single bound)
    line_search_expansions: int = 0     # doublings of an accepted full step while Φ falls (0: none)
    newton_tangent: str = "projected"   # or "exact_first": the Newton direction's Hessian (NEWTON_TANGENTS)
    max_direction: float = float("inf")  # m: a Newton direction with a larger max|Δx| is scaled down to it

    def __post_init__(self):
        _memb.membrane_model(self.membrane)  # unknown names raise, listing the known ones
        _bend.bending_model(self.bending)
        if self.linear_solver not in LINEAR_SOLVERS:
            raise ValueError(f"linear_solver must be one of {LINEAR_SOLVERS}; got {self.linear_solver!r}")
        if self.newton_tangent not in NEWTON_TANGENTS:
            raise ValueError(f"newton_tangent must be one of {NEWTON_TANGENTS}; got {self.newton_tangent!r}")
        if not (0 < self.cg_tolerance < 1 and self.cg_max_iterations >= 1):
            raise ValueError(f"need 0 < cg_tolerance < 1 and cg_max_iterations ≥ 1; got "
                             f"{self.cg_tolerance}, {self.cg_max_iterations}")
        if not (self.dhat > 0 and self.min_gap >= 0 and self.skin >= 0):
            raise ValueError(f"need dhat > 0, min_gap ≥ 0 and skin ≥ 0; got dhat={self.dhat}, "
                             f"min_gap={self.min_gap}, skin={self.skin}")
        if not (self.max_newton >= 1 and self.max_line_search >= 1 and self.max_subdivisions >= 0):
            raise ValueError("max_newton and max_line_search must be ≥ 1 and max_subdivisions ≥ 0")
        if not self.max_direction > 0:  # NaN fails too
            raise ValueError(f"max_direction must be > 0 (m; inf: no limit); got {self.max_direction}")
        if not self.ccd_passes >= 1:
            raise ValueError(f"ccd_passes must be ≥ 1; got {self.ccd_passes}")
        e = self.line_search_expansions
        if isinstance(e, bool) or not (isinstance(e, (int, np.integer)) and 0 <= e <= 16):
            raise ValueError(f"line_search_expansions must be an integer in [0, 16]; got {self.line_search_expansions!r}")


_CONFIG_NUMBERS = ("dhat", "min_gap", "skin", "max_newton", "max_line_search", "armijo",
                   "max_subdivisions", "cg_tolerance", "cg_max_iterations", "ccd_passes", "max_direction")
_CONFIG_STATIC = ("membrane", "bending", "linear_solver", "line_search_expansions", "newton_tangent")


def _config_flatten(c: Config):
    return tuple(getattr(c, k) for k in _CONFIG_NUMBERS), tuple(getattr(c, k) for k in _CONFIG_STATIC)


def _config_unflatten(aux, leaves):
    c = object.__new__(Config)  # no validation: leaves may be tracers
    for k, v in zip(_CONFIG_STATIC, aux):
        object.__setattr__(c, k, v)
    for k, v in zip(_CONFIG_NUMBERS, leaves):
        object.__setattr__(c, k, v)
    return c


jax.tree_util.register_pytree_node(Config, _config_flatten, _config_unflatten)


def _check_array(name, a, shape_tail, kind="f"):
    a = np.asarray(a)
    if a.ndim != len(shape_tail) + 1 or tuple(a.shape[1:]) != tuple(shape_tail):
        want = "(N" + "".join(f", {s}" for s in shape_tail) + ")"
        raise ValueError(f"{name} must have shape {want}; got {a.shape}")
    if kind == "f":
        if not np.issubdtype(a.dtype, np.floating) and not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{name} must be a real array; got dtype {a.dtype}")
        bad = ~np.isfinite(a)
        if bad.any():
            i = int(np.argwhere(bad.reshape(a.shape[0], -1).any(axis=1))[0, 0])
            raise ValueError(f"{name}[{i}] is not finite: {a[i]}")
    return a


def build_model(
    x_ref,
    film_triangles,
    mass,
    *,
    obstacle_triangles=None,
    fixed=None,
    radius=None,
    allow_nonmanifold: bool = False,
) -> Model:
    """Build a :class:`Model`, computing rest data once and validating the input.

    Args:
        x_ref: (N, 3) reference positions, m. The film's rest shape is taken from here.
        film_triangles: (Tf, 3) film triangles (membrane, bending, contact).
        mass: (N,) particle masses, kg (zero for obstacle vertices).
        obstacle_triangles: (To, 3) fixed obstacle triangles (contact only).
        fixed: (N,) bool; obstacle vertices are always fixed.
        radius: (N,) sphere radii, m; > 0 marks an independent sphere centre.
        allow_nonmanifold: bend only manifold interior edges and leave edges shared by
            three or more film triangles out (they are listed in a warning). By default
            such edges are an error, since the bending models need manifold hinges.

    Raises:
        ValueError: wrong shapes/dtypes, non-finite values, indices out of range,
            degenerate rest triangles, negative masses or radii, a sphere centre that is
            also a triangle vertex, or a free particle without mass.
    """
    x_ref = _check_array("x_ref", x_ref, (3,)).astype(np.float64)
    n = x_ref.shape[0]
    ft = as_triangles(film_triangles, n)
    ot = as_triangles(np.zeros((0, 3), np.int32) if obstacle_triangles is None else obstacle_triangles, n)
    mass = np.asarray(mass, dtype=np.float64)
    if mass.shape != (n,):
        raise ValueError(f"mass must have shape ({n},); got {mass.shape}")
    if not np.all(np.isfinite(mass)) or (mass < 0).any():
        raise ValueError(f"mass must be finite and ≥ 0; particle {int(np.argmax(~np.isfinite(mass) | (mass < 0)))} is {mass[np.argmax(~np.isfinite(mass) | (mass < 0))]}")
    fixed = np.zeros(n, bool) if fixed is None else np.asarray(fixed, dtype=bool).copy()
    if fixed.shape != (n,):
        raise ValueError(f"fixed must have shape ({n},); got {fixed.shape}")
    radius = np.zeros(n) if radius is None else np.asarray(radius, dtype=np.float64)
    if radius.shape != (n,) or not np.all(np.isfinite(radius)) or (radius < 0).any():
        raise ValueError(f"radius must be a finite (N,) array ≥ 0; got shape {radius.shape}")
    if ot.size:
        fixed[np.unique(ot)] = True
    in_tri = np.zeros(n, bool)
    in_tri[np.unique(np.concatenate([ft.reshape(-1), ot.reshape(-1)]))] = True
    both = np.argwhere(in_tri & (radius > 0)).reshape(-1)
    if both.size:
        raise ValueError(f"particle {int(both[0])} has radius > 0 but is a triangle vertex; sphere centres must be independent")
    massless = np.argwhere(~fixed & (mass <= 0)).reshape(-1)
    if massless.size:
        raise ValueError(f"free particle {int(massless[0])} has zero mass; fix it or give it mass")

    dm_inv, area = _memb.triangles_rest(x_ref, ft)
    hinge_top = hinge_topology(ft)
    if len(hinge_top.nonmanifold):
        listed = ", ".join(str(tuple(e)) for e in hinge_top.nonmanifold[:8].tolist())
        more = "" if len(hinge_top.nonmanifold) <= 8 else f" and {len(hinge_top.nonmanifold) - 8} more"
        msg = (f"{len(hinge_top.nonmanifold)} non-manifold film edge(s) shared by three or more "
               f"triangles: {listed}{more}; the bending models need manifold hinges")
        if not allow_nonmanifold:
            raise ValueError(msg + " (pass allow_nonmanifold=True to leave them out of bending)")
        warnings.warn(msg + "; these edges are left out of bending", stacklevel=2)
    theta0, hlen, harea = _bend.hinges_rest(x_ref, hinge_top.hinges)
    free_particles = np.argwhere(~fixed).reshape(-1).astype(np.int32)
    free_slot = np.full(n, free_particles.size, np.int32)
    free_slot[free_particles] = np.arange(free_particles.size, dtype=np.int32)
    film = np.zeros(n, bool)
    film[np.unique(ft)] = True
    contact_tris = np.concatenate([ft, ot], axis=0)
    topo = _cand.contact_topology(contact_tris, n, radius, fixed)
    return Model(
        x_ref=jnp.asarray(x_ref), mass=jnp.asarray(mass), fixed=jnp.asarray(fixed),
        radius=jnp.asarray(radius), film=jnp.asarray(film), film_triangles=jnp.asarray(ft),
        dm_inv=jnp.asarray(dm_inv), rest_area=jnp.asarray(area),
        hinges=jnp.asarray(hinge_top.hinges), theta0=jnp.asarray(theta0),
        hinge_length=jnp.asarray(hlen), hinge_area=jnp.asarray(harea),
        free_slot=jnp.asarray(free_slot), free_particles=jnp.asarray(free_particles),
        topology=topo,
    )

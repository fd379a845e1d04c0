"""Verlet mass-spring cloth (Jakobsen 2001; toxiclibs VerletPhysics3D) as a differentiable JAX model.

The fast, position-based baseline beside IPC. One timestep, in the order data flows:

    damped Verlet prediction  x̃ = x + (1 − d)(x − x_prev) + a·dt²,   a = (w, −g, 0)
    -> `iterations` Gauss–Seidel sweeps (graph-coloured, so each colour is one vector op):
       springs ±(k/2)(|Δ| − L)Δ̂, then 3-particle bending chains (perpendicular-offset projection)
    -> floor y ≥ 0 with restitution
    -> NaN/Inf guard (a non-finite step keeps the last finite state and reports it)

Data is split the MJX way: `VerletCloth` holds topology and rest data (index arrays,
rest lengths, rest chain shapes, locked mask; `n_grid` and `iterations` are static and
recompile when changed); `VerletParams` holds the differentiable scalars; `VerletState`
holds (x, x_prev). Units are the reference's scene units (length) and steps; ``dt`` is
the step length in the same time unit as ``gravity`` (length/time²).

Parameter convention. ``damping`` is the fraction of velocity *kept* per step, as in the
specification's cloth (docs/spec.md §8: ``damping = 0.98``); its damping loss is
d = 1 − damping = 0.02, and the undamped form 2x − x_prev + a·dt² is ``damping = 1`` (d = 0).

Reference: T. Jakobsen, "Advanced Character Physics", GDC 2001; K. Schmidt,
toxiclibs.physics VerletPhysics3D (2008); docs/spec.md §8 (the Verlet cloth baseline).
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import ipcjax  # noqa: F401  (enables float64, as when this module lived in ipcjax/)
from scenes.mesh import quad_grid_triangles

SPRING_STRUCTURAL, SPRING_SHEAR, SPRING_BEND = 0, 1, 2
SPRING_KIND_NAMES = ("structural", "shear", "bend")

#: dt whose a·dt² equals the specification's per-step increment a·0.016 (docs/spec.md §8: it
#: scales a by 0.016 once).
DEFAULT_DT = math.sqrt(0.016)


# --------------------------------------------------------------------------- data


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class VerletCloth:
    """Topology and rest data of a Verlet cloth (not differentiated; shapes and statics fix the compile).

    Fields:
        springs:      (S, 2) int32 particle pairs.
        spring_kind:  (S,) int32, SPRING_STRUCTURAL / SPRING_SHEAR / SPRING_BEND.
        rest_length:  (S,) rest lengths |x_a − x_b| at construction (length).
        chains:       (C, 3) int32 bending chains (a, b, c) with b the middle particle.
        chain_rest_ratio: (C,) h₀/|c − a|₀: perpendicular offset of b from line ac over the
                      base length at rest (0 for a straight chain, rest angle π).
        chain_rest_angle: (C,) rest angle at b, radians (reported; the projection uses the ratio).
        locked:       (N,) bool, particles that never move.
        n_grid:       static grid side (0 for a non-grid cloth); sets the sag probe.
        iterations:   static number of relaxation sweeps per step.
        spring_groups, chain_groups: static offsets (0, …, S) and (0, …, C) of the
                      relaxation groups: constraints are stored group by group, a sweep
                      visits the groups in order and the constraints inside a group at once.
                      Gauss–Seidel builds groups of particle-disjoint constraints (a graph
                      colouring), so the sweep equals a sequential sweep in storage order;
                      Jacobi is a single group.
    """

    springs: jax.Array
    spring_kind: jax.Array
    rest_length: jax.Array
    chains: jax.Array
    chain_rest_ratio: jax.Array
    chain_rest_angle: jax.Array
    locked: jax.Array
    n_grid: int = dataclasses.field(default=0, metadata=dict(static=True))
    iterations: int = dataclasses.field(default=12, metadata=dict(static=True))
    spring_groups: tuple = dataclasses.field(default=(0,), metadata=dict(static=True))
    chain_groups: tuple = dataclasses.field(default=(0,), metadata=dict(static=True))

    @property
    def n_particles(self) -> int:
        return int(self.locked.shape[0])


class VerletParams(NamedTuple):
    """Differentiable model parameters (a pytree); defaults are the specification's (docs/spec.md §8).

    stiffness:      spring relaxation factor k (dimensionless, stable for 0 < k ≤ 1):
                    each end moves by (k/2)(|Δ| − L) per sweep.
    bend_stiffness: chain projection factor k_b (dimensionless, 0 switches chains off).
    damping:        velocity fraction kept per step (0.98 ⇔ d = 0.02, docs/spec.md §8).
    gravity:        g, acceleration along −y (length/time²).
    wind:           acceleration along +x (scalar) or a (3,) acceleration vector.
    restitution:    e, floor bounce v_y ← −e·v_y.
    dt:             step length (time); a enters as a·dt².
    """

    stiffness: float | jax.Array = 1.0
    bend_stiffness: float | jax.Array = 1.0
    damping: float | jax.Array = 0.98
    gravity: float | jax.Array = 0.3
    wind: float | jax.Array = 0.0
    restitution: float | jax.Array = 0.3
    dt: float | jax.Array = DEFAULT_DT


#: What each parameter is, for the ``ipcjax verlet`` flags (defaults: ``VerletParams()``).
PARAM_HELP = dict(stiffness="spring factor k", bend_stiffness="chain factor k_b",
                  damping="velocity kept per step (1 − d)", gravity="g along −y", wind="acceleration along +x",
                  restitution="floor restitution e", dt="step length; a enters as a·dt²")


class VerletState(NamedTuple):
    """x: (N, 3) positions now; x_prev: (N, 3) positions one step earlier (velocity·dt = x − x_prev)."""

    x: jax.Array
    x_prev: jax.Array


class Rollout(NamedTuple):
    """Result of `rollout`: final state, saved frames (F, N, 3) and a per-step non-finite flag (steps,)."""

    state: VerletState
    frames: jax.Array
    nonfinite: jax.Array


# --------------------------------------------------------------------------- construction


def build_cloth(x_rest, springs, chains=None, locked=None, *, spring_kind=None,
                iterations: int = 12, n_grid: int = 0, solver: str = "gauss_seidel") -> VerletCloth:
    """Topology with rest data measured on ``x_rest`` (host-side, NumPy).

    Args:
        x_rest: (N, 3) rest positions. springs: (S, 2) int pairs. chains: (C, 3) int
        triples (a, b, c), or None. locked: (N,) bool or None (nothing locked).
        spring_kind: (S,) kinds or None (all structural). iterations, n_grid: statics.
        solver: "gauss_seidel" (default; constraints reordered into particle-disjoint
        groups, stable for k ≤ 1) or "jacobi" (all constraints of a kind at once, in the
        given order, as the specification's cloth does; diverges at its k = 1, see docs/verlet.md).
    Raises:
        ValueError: bad shapes, out-of-range indices, unknown solver, or a zero-length
            rest spring/chain base.
    """
    x_rest = np.asarray(x_rest, dtype=np.float64)
    if x_rest.ndim != 2 or x_rest.shape[1] != 3:
        raise ValueError(f"x_rest must have shape (N, 3); got {x_rest.shape}")
    n = x_rest.shape[0]
    springs = np.asarray(springs, dtype=np.int32).reshape(-1, 2)
    chains = np.zeros((0, 3), np.int32) if chains is None else np.asarray(chains, np.int32).reshape(-1, 3)
    for name, idx in (("springs", springs), ("chains", chains)):
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"{name} index particles outside [0, {n})")
    locked = np.zeros(n, bool) if locked is None else np.asarray(locked, bool)
    if locked.shape != (n,):
        raise ValueError(f"locked must have shape ({n},); got {locked.shape}")
    kind = (np.full(len(springs), SPRING_STRUCTURAL, np.int32) if spring_kind is None
            else np.asarray(spring_kind, np.int32))
    if kind.shape != (len(springs),):
        raise ValueError("spring_kind must have one entry per spring")
    if iterations < 0:
        raise ValueError("iterations must be >= 0")

    if solver == "gauss_seidel":
        s_order, spring_groups = colour_groups(springs)
        c_order, chain_groups = colour_groups(chains)
    elif solver == "jacobi":
        s_order, spring_groups = np.arange(len(springs)), (0, len(springs))
        c_order, chain_groups = np.arange(len(chains)), (0, len(chains))
    else:
        raise ValueError(f"solver must be 'gauss_seidel' or 'jacobi'; got {solver!r}")
    springs, kind, chains = springs[s_order], kind[s_order], chains[c_order]

    rest = np.linalg.norm(x_rest[springs[:, 0]] - x_rest[springs[:, 1]], axis=1)
    if np.any(rest <= 0):
        raise ValueError(f"spring {int(np.argmin(rest))} has zero rest length")

    xa, xb, xc = (x_rest[chains[:, i]] for i in range(3))
    base = np.linalg.norm(xc - xa, axis=1)
    if np.any(base <= 0):
        raise ValueError(f"chain {int(np.argmin(base))} has coincident end particles")
    offset = _chain_offset_np(xa, xb, xc)
    ratio = np.linalg.norm(offset, axis=1) / base if len(chains) else np.zeros(0)
    u, v = xa - xb, xc - xb
    arms = np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1)
    if np.any(arms <= 0):
        raise ValueError(f"chain {int(np.argmin(arms))} has its middle particle on an end particle")
    angle = np.arccos(np.clip(np.sum(u * v, axis=1) / arms, -1.0, 1.0))  # clip: round-off only

    return VerletCloth(
        springs=jnp.asarray(springs), spring_kind=jnp.asarray(kind), rest_length=jnp.asarray(rest),
        chains=jnp.asarray(chains), chain_rest_ratio=jnp.asarray(ratio),
        chain_rest_angle=jnp.asarray(angle), locked=jnp.asarray(locked),
        n_grid=int(n_grid), iterations=int(iterations),
        spring_groups=tuple(int(g) for g in spring_groups), chain_groups=tuple(int(g) for g in chain_groups))


def colour_groups(constraints: np.ndarray):
    """Greedy colouring of constraints (rows of particle indices) so no two in a colour share a particle.

    Constraint r gets the smallest colour not yet used at any of its particles.
    Returns (order, offsets): the permutation that sorts constraints by colour (stable,
    so storage order within a colour is the input order) and the static group offsets.
    """
    constraints = np.asarray(constraints)
    colours = np.zeros(len(constraints), np.int64)
    used: dict[int, set] = {}
    for r, row in enumerate(constraints):
        taken = set().union(*(used.get(int(p), set()) for p in row))
        c = 0
        while c in taken:
            c += 1
        colours[r] = c
        for p in row:
            used.setdefault(int(p), set()).add(c)
    order = np.argsort(colours, kind="stable")
    counts = np.bincount(colours, minlength=1) if len(constraints) else np.zeros(0, np.int64)
    return order, (0,) + tuple(int(v) for v in np.cumsum(counts))


def _chain_offset_np(xa, xb, xc):
    """Perpendicular offset of b from the line through a and c (NumPy, host-side rest data)."""
    ac = xc - xa
    t = np.sum((xb - xa) * ac, axis=1) / np.sum(ac * ac, axis=1)
    return xb - xa - t[:, None] * ac


def grid_index(i: int, j: int, n_grid: int) -> int:
    """Particle index of grid node (i along x, j along z): j·n + i (the ordering of docs/spec.md §8)."""
    return j * n_grid + i


def grid_topology(n_grid: int):
    """Springs, kinds and bending chains of an n×n cloth grid (the ordering of docs/spec.md §8, host-side).

    Springs per node (i, j): structural (i+1, j), (i, j+1); shear (i+1, j+1) (one
    diagonal, as docs/spec.md §8 has it); bend (i+2, j), (i, j+2). Chains: (i−1, i, i+1) along rows
    and columns.
    Returns: springs (S, 2), kinds (S,), chains (C, 3), all int32.
    """
    springs, kinds, chains = [], [], []
    for j in range(n_grid):
        for i in range(n_grid):
            idx = grid_index(i, j, n_grid)
            for di, dj, kind in ((1, 0, SPRING_STRUCTURAL), (0, 1, SPRING_STRUCTURAL),
                                 (1, 1, SPRING_SHEAR), (2, 0, SPRING_BEND), (0, 2, SPRING_BEND)):
                if i + di < n_grid and j + dj < n_grid:
                    springs.append((idx, grid_index(i + di, j + dj, n_grid)))
                    kinds.append(kind)
    for j in range(n_grid):
        for i in range(1, n_grid - 1):
            chains.append((grid_index(i - 1, j, n_grid), grid_index(i, j, n_grid), grid_index(i + 1, j, n_grid)))
    for i in range(n_grid):
        for j in range(1, n_grid - 1):
            chains.append((grid_index(i, j - 1, n_grid), grid_index(i, j, n_grid), grid_index(i, j + 1, n_grid)))
    return (np.asarray(springs, np.int32).reshape(-1, 2), np.asarray(kinds, np.int32),
            np.asarray(chains, np.int32).reshape(-1, 3))


def grid_corners(n_grid: int) -> np.ndarray:
    """Indices of the four corner particles (the default locked set)."""
    m = n_grid - 1
    return np.array([grid_index(0, 0, n_grid), grid_index(m, 0, n_grid),
                     grid_index(0, m, n_grid), grid_index(m, m, n_grid)], np.int32)


def grid_triangles(n_grid: int) -> np.ndarray:
    """(2(n−1)², 3) int32 triangles of the grid, split along the shear diagonal."""
    return quad_grid_triangles(n_grid - 1, n_grid - 1, lambda i, j: grid_index(i, j, n_grid))


def cloth_grid(n_grid: int = 14, size: float = 4.0, *, iterations: int = 12, seed: int = 0,
               noise: float = 0.01, locked_corners: bool = True,
               solver: str = "gauss_seidel") -> tuple[VerletCloth, VerletState]:
    """The specification's cloth (docs/spec.md §8): an n×n grid in the XZ plane at y = size/2, corners locked.

    Node (i, j) starts at ((i − n/2)·s, size/2, (j − n/2)·s) with s = size/n, then every
    coordinate gets N(0, noise²) from ``numpy.random.default_rng(seed)``. As in the specification,
    the rest data (lengths, chain shapes) is measured on the perturbed positions while
    x_prev is the unperturbed grid, so the perturbation is also the initial velocity·dt.

    Returns: (cloth, state). Parameters come from ``VerletParams()`` (the specification's defaults).
    """
    if n_grid < 2:
        raise ValueError("n_grid must be >= 2")
    spacing = size / n_grid
    ii, jj = np.meshgrid(np.arange(n_grid), np.arange(n_grid), indexing="xy")  # row j, column i
    grid = np.stack([(ii.ravel() - n_grid / 2) * spacing,
                     np.full(n_grid * n_grid, size / 2),
                     (jj.ravel() - n_grid / 2) * spacing], axis=1)
    rng = np.random.default_rng(seed)
    x0 = grid + rng.normal(0.0, noise, size=grid.shape)
    locked = np.zeros(n_grid * n_grid, bool)
    if locked_corners:
        locked[grid_corners(n_grid)] = True
    springs, kinds, chains = grid_topology(n_grid)
    cloth = build_cloth(x0, springs, chains, locked, spring_kind=kinds,
                        iterations=iterations, n_grid=n_grid, solver=solver)
    return cloth, VerletState(jnp.asarray(x0), jnp.asarray(grid))


# --------------------------------------------------------------------------- one step


def acceleration(params: VerletParams) -> jax.Array:
    """(3,) a = wind + (0, −g, 0); a scalar wind acts along +x."""
    wind = jnp.asarray(params.wind, dtype=float)
    wind = wind * jnp.array([1.0, 0.0, 0.0]) if wind.ndim == 0 else wind
    return wind + jnp.array([0.0, -1.0, 0.0]) * params.gravity


def predict(cloth: VerletCloth, params: VerletParams, state: VerletState) -> jax.Array:
    """Damped Verlet prediction x̃ = x + damping·(x − x_prev) + a·dt²; locked particles stay at x."""
    x, x_prev = state
    x_new = x + params.damping * (x - x_prev) + acceleration(params) * params.dt ** 2
    return jnp.where(cloth.locked[:, None], x, x_new)


def _safe_norm(v):
    """(|v|, |v| > 0) row-wise, with a NaN-free gradient at v = 0 (double-where)."""
    sq = jnp.sum(v * v, axis=-1)
    nz = sq > 0
    return jnp.where(nz, jnp.sqrt(jnp.where(nz, sq, 1.0)), 0.0), nz


def spring_correction(x, springs, rest_length, stiffness, valid=None):
    """(N, 3) displacement of one group of springs, all evaluated at the same x.

    For spring (a, b) with Δ = x_a − x_b: x_a −= (k/2)(|Δ| − L) Δ̂ and x_b += the same,
    summed per particle (a single term per particle in a Gauss–Seidel colour). A zero-length spring
    (direction undefined) and rows with ``valid`` False contribute nothing.
    """
    delta = x[springs[:, 0]] - x[springs[:, 1]]
    length, nz = _safe_norm(delta)
    scale = jnp.where(nz, (length - rest_length) / jnp.where(nz, length, 1.0), 0.0)
    if valid is not None:
        scale = jnp.where(valid, scale, 0.0)
    move = 0.5 * stiffness * scale[:, None] * delta
    return jnp.zeros_like(x).at[springs[:, 0]].add(-move).at[springs[:, 1]].add(move)


def chain_correction(x, chains, rest_ratio, bend_stiffness, valid=None):
    """(N, 3) displacement of one group of bending chains (perpendicular-offset projection).

    For chain (a, b, c): e = b − a − t(c − a), t = (b − a)·(c − a)/|c − a|², is b's offset
    from the line ac; its target length is h* = ρ₀|c − a| (ρ₀ = rest offset/base, 0 for a
    straight chain), which restores the rest angle at b when b's foot keeps its rest t.
    With δ = (1 − h*/|e|) e: b −= (2/3)k_b δ, a and c += (1/3)k_b δ each, which keeps the
    centroid and, for k_b = 1, sets |e| = h* exactly. |e| = 0, a = c and rows with ``valid``
    False contribute nothing.
    """
    xa, xb, xc = x[chains[:, 0]], x[chains[:, 1]], x[chains[:, 2]]
    ac = xc - xa
    base, has_base = _safe_norm(ac)
    t = jnp.sum((xb - xa) * ac, axis=1) / jnp.where(has_base, base * base, 1.0)
    e = xb - xa - t[:, None] * ac
    h, nz = _safe_norm(e)
    nz = nz & has_base
    scale = jnp.where(nz, 1.0 - rest_ratio * base / jnp.where(nz, h, 1.0), 0.0)
    if valid is not None:
        scale = jnp.where(valid, scale, 0.0)
    delta = bend_stiffness * scale[:, None] * e
    corr = jnp.zeros_like(x).at[chains[:, 1]].add(-(2.0 / 3.0) * delta)
    return corr.at[chains[:, 0]].add(delta / 3.0).at[chains[:, 2]].add(delta / 3.0)


def _padded_groups(offsets: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Static (G, M) gather index into group-sorted constraints and its validity mask.

    Group g holds rows offsets[g]:offsets[g+1]; short groups are padded with row 0 and
    masked, so a sweep is one lax.scan over groups (compile time independent of G).
    """
    sizes = np.diff(np.asarray(offsets, dtype=np.int64))
    width = int(sizes.max()) if sizes.size else 0
    index = np.zeros((sizes.size, width), np.int32)
    valid = np.zeros((sizes.size, width), bool)
    for g, (lo, n) in enumerate(zip(offsets[:-1], sizes)):
        index[g, :n] = np.arange(lo, lo + n)
        valid[g, :n] = True
    return index, valid


def relax(cloth: VerletCloth, params: VerletParams, x: jax.Array) -> jax.Array:
    """``cloth.iterations`` sweeps; a sweep visits the spring groups, then the chain groups, in order.

    Inside a group every constraint sees the same x (particle-disjoint under Gauss–Seidel,
    so this is exactly the sequential sweep). Locked particles drop their share of every
    correction (the specification's cloth re-pins them).
    """
    free = (~cloth.locked)[:, None]
    s_index, s_valid = _padded_groups(cloth.spring_groups)
    c_index, c_valid = _padded_groups(cloth.chain_groups)
    springs, rest = cloth.springs[s_index], cloth.rest_length[s_index]
    chains, ratio = cloth.chains[c_index], cloth.chain_rest_ratio[c_index]

    def spring_group(x, group):
        pairs, length, valid = group
        dx = spring_correction(x, pairs, length, params.stiffness, valid)
        return x + jnp.where(free, dx, 0.0), None

    def chain_group(x, group):
        triples, rho, valid = group
        dx = chain_correction(x, triples, rho, params.bend_stiffness, valid)
        return x + jnp.where(free, dx, 0.0), None

    def sweep(x, _):
        if s_index.size:
            x, _ = jax.lax.scan(spring_group, x, (springs, rest, jnp.asarray(s_valid)))
        if c_index.size:
            x, _ = jax.lax.scan(chain_group, x, (chains, ratio, jnp.asarray(c_valid)))
        return x, None

    x, _ = jax.lax.scan(sweep, x, None, length=cloth.iterations)
    return x


def collide_floor(cloth: VerletCloth, params: VerletParams, x: jax.Array, x_old: jax.Array):
    """Floor y ≥ 0 for free particles: y ← −e·y and v_y ← −e·v_y with v = x − x_old.

    Returns (x, x_prev) where x_prev = x_old except below the floor, where its y is set so
    the implied next velocity is the reflected one: x_prev_y = −e·y − (−e·v_y). For e = 0
    this is the specification's clamp to y = 0 with zero normal velocity.
    """
    e = params.restitution
    y, vy = x[:, 1], x[:, 1] - x_old[:, 1]
    hit = (y < 0) & ~cloth.locked
    y_new = jnp.where(hit, -e * y, y)
    yprev_new = jnp.where(hit, y_new + e * vy, x_old[:, 1])
    return x.at[:, 1].set(y_new), x_old.at[:, 1].set(yprev_new)


def step(cloth: VerletCloth, params: VerletParams, state: VerletState):
    """One timestep: predict, relax, floor, NaN/Inf guard.

    Returns (state, nonfinite): if any coordinate of the new (x, x_prev) is not finite, the
    input state is returned unchanged and ``nonfinite`` (bool scalar) is True.
    """
    x_new = relax(cloth, params, predict(cloth, params, state))
    x_new, x_prev_new = collide_floor(cloth, params, x_new, state.x)
    ok = jnp.all(jnp.isfinite(x_new)) & jnp.all(jnp.isfinite(x_prev_new))
    return VerletState(jnp.where(ok, x_new, state.x), jnp.where(ok, x_prev_new, state.x_prev)), ~ok


def _rollout(cloth: VerletCloth, params: VerletParams, state: VerletState, steps: int,
             save_every: int = 1) -> Rollout:
    """Run ``steps`` steps with lax.scan (jitted as `rollout`; ``steps``/``save_every`` are static).

    Returns Rollout(state, frames, nonfinite): frames (steps // save_every, N, 3) are x after
    steps save_every, 2·save_every, …; nonfinite (steps,) flags the guard per step.
    Differentiable with respect to ``params`` and ``state`` (reverse mode through the scans).
    """
    n_frames, remainder = divmod(steps, save_every)

    def one(s, _):
        return step(cloth, params, s)

    def block(s, _):
        s, bad = jax.lax.scan(one, s, None, length=save_every)
        return s, (s.x, bad)

    state, (frames, bad) = jax.lax.scan(block, state, None, length=n_frames)
    bad = bad.reshape(-1)
    if remainder:
        state, bad_tail = jax.lax.scan(one, state, None, length=remainder)
        bad = jnp.concatenate([bad, bad_tail])
    return Rollout(state, frames, bad)


rollout = jax.jit(_rollout, static_argnames=("steps", "save_every"))


# --------------------------------------------------------------------------- measurements and fitting


def sag(x: jax.Array, n_grid: int) -> jax.Array:
    """Drop of the centre node (n/2, n/2) below the mean height of the four corners (length)."""
    corners = grid_corners(n_grid)
    centre = grid_index(n_grid // 2, n_grid // 2, n_grid)
    return jnp.mean(x[corners, 1]) - x[centre, 1]


def fit_stiffness(target_sag: float, cloth: VerletCloth | None = None, state: VerletState | None = None,
                  params: VerletParams | None = None, *, steps: int = 150, n_iter: int = 30,
                  learning_rate: float = 0.1, init_stiffness: float | None = None,
                  optimizer=None, progress: bool = False):
    """Fit the spring stiffness so the cloth's sag after ``steps`` steps matches ``target_sag``.

    The loss L(k) = ((sag(x_steps; k) − target)/target)² is minimised over log k (k stays
    positive) by :func:`fitting.fit.fit` with ``optimizer`` (default
    ``optax.adam(learning_rate, b1=0.5)``: the lower momentum stops the 1-D fit from
    overshooting): ``n_iter`` updates, ``n_iter + 1`` evaluations. Other parameters are
    held at ``params``; a step that the NaN/Inf guard catches stops the fit
    (:class:`fitting.fit.FitFailed`).

    Args:
        target_sag: length. cloth/state: default ``cloth_grid()``. params: default
        ``VerletParams()``. steps: rollout length (use enough to settle, see docs).
        init_stiffness: starting k (default params.stiffness). optimizer: any optax
        GradientTransformation. progress: a progress bar.
    Returns:
        :class:`fitting.fit.FitResult`: ``params`` (the evaluated iterate with the lowest
        loss), ``history`` (per evaluation: loss, params {"stiffness": k}, grad_norm, wall_s).
    """
    import optax

    from fitting.fit import fit
    from ipcjax.result import StepCode

    if (cloth is None) != (state is None):
        raise ValueError("pass both cloth and state, or neither (the default cloth_grid())")
    if cloth is None:
        cloth, state = cloth_grid()
    if not target_sag:
        raise ValueError("target_sag must be non-zero (the loss is relative to it)")
    if cloth.n_grid < 2:
        raise ValueError("fit_stiffness needs a grid cloth (n_grid >= 2) for the sag probe")
    params = VerletParams() if params is None else params
    k0 = params.stiffness if init_stiffness is None else init_stiffness
    params = params._replace(stiffness=float(k0))

    def simulate(p):
        out = rollout(cloth, p, state, steps)
        return out.state.x[None], out.nonfinite.astype(jnp.int32) * int(StepCode.NON_FINITE)

    measure = lambda frames: sag(frames[-1], cloth.n_grid)
    opt = optax.adam(learning_rate, b1=0.5) if optimizer is None else optimizer
    return fit(simulate, measure, float(target_sag), params, ["stiffness"], optimizer=opt,
               iterations=n_iter + 1, loss_tol=0.0, progress=progress)


# --------------------------------------------------------------------------- run (``ipcjax verlet``)


def write_frames(out: str, frames, triangles, steps, *, fmt: str = "vtu") -> list[str]:
    """Write one meshio triangle mesh per frame, ``verlet_{step:06d}.{fmt}``, into ``out``; returns the paths."""
    import meshio

    os.makedirs(out, exist_ok=True)
    paths = []
    for x, n in zip(np.asarray(frames, dtype=np.float64), steps):
        path = os.path.join(out, f"verlet_{int(n):06d}.{fmt}")
        meshio.write(path, meshio.Mesh(points=x, cells=[("triangle", triangles)]))
        paths.append(path)
    return paths


def run_cloth(out: str, cloth: VerletCloth, state: VerletState, params: VerletParams, *, steps: int,
              save_every: int, fmt: str = "vtu") -> int:
    """What ``ipcjax verlet`` does: simulate ``steps`` steps, write every ``save_every``-th
    frame (and the last) as ``verlet_{step:06d}.{fmt}`` into ``out``, print a summary.

    Returns 0, or 1 if the NaN/Inf guard fired (the frames are still written).
    """
    t0 = time.perf_counter()
    result = rollout(cloth, params, state, steps, save_every)
    jax.block_until_ready(result)
    elapsed = time.perf_counter() - t0
    frames = np.concatenate([np.asarray(state.x)[None], np.asarray(result.frames)])
    saved_steps = [0] + [save_every * (f + 1) for f in range(len(result.frames))]
    if steps % save_every:
        frames = np.concatenate([frames, np.asarray(result.state.x)[None]])
        saved_steps.append(steps)
    paths = write_frames(out, frames, grid_triangles(cloth.n_grid), saved_steps, fmt=fmt)

    bad = np.flatnonzero(np.asarray(result.nonfinite))
    x_final = np.asarray(result.state.x)
    print(f"verlet: {cloth.n_particles} particles, {len(cloth.springs)} springs, {len(cloth.chains)} chains, "
          f"{steps} steps in {elapsed:.2f} s (incl. compile)")
    print(f"wrote {len(paths)} frames to {out}/ ({os.path.basename(paths[0])} .. {os.path.basename(paths[-1])})")
    print(f"final sag {float(sag(x_final, cloth.n_grid)):.6f}, lowest y {x_final[:, 1].min():.6f}")
    if bad.size:
        print(f"NaN/Inf guard: {bad.size} step(s) kept the last finite state (first at step {bad[0] + 1})",
              file=sys.stderr)
        return 1
    print("NaN/Inf guard: no events")
    return 0

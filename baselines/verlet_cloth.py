"""The Verlet cloth's data and its construction (host-side, NumPy): `VerletCloth` (topology
and rest data), `VerletParams`, `VerletState`, and the specification's n×n grid cloth
(docs/spec.md §8). The model's step, rollout and fit: :mod:`baselines.verlet`."""
from __future__ import annotations

import dataclasses
import math
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

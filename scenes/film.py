"""Small reference scenes built from the public API: film grids, drapes, VT/EE/hinge solves."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

import ipcjax  # noqa: F401  (enables float64)
from ipcjax.model import build_model
from scenes.mesh import quad_grid_triangles
from scenes.scene import ByName

FILM_THICKNESS = 30e-6   # m
FILM_DENSITY = 925.0     # kg/m³ → areal density 0.02775 kg/m²


def film_grid(n: int, size: float, z: float = 0.0, center=(0.0, 0.0)):
    """A square n×n-vertex grid of side ``size`` (m) at height z, alternating diagonals.

    Returns (positions (n², 3), triangles (2(n−1)², 3) int32).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"a film grid needs an integer n ≥ 2 vertices per side; got {n!r}")
    require_positive(size=size)
    if not np.isfinite(z):
        raise ValueError(f"z must be finite; got {z}")
    s = np.linspace(-size / 2, size / 2, n)
    X, Y = np.meshgrid(s + center[0], s + center[1], indexing="xy")
    pos = np.stack([X.ravel(), Y.ravel(), np.full(n * n, z)], axis=1)
    return pos, quad_grid_triangles(n - 1, n - 1, lambda i, j: j * n + i, alternate=True)


def require_positive(**values):
    """Raise ValueError naming the first of ``values`` that is not a finite number > 0."""
    for name, v in values.items():
        try:
            ok = bool(np.isfinite(v) and v > 0)
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(f"{name} must be a finite number > 0; got {v!r}")


def lumped_mass(pos, tris, areal_density=FILM_THICKNESS * FILM_DENSITY):
    """Per-vertex mass (kg): one third of each adjacent triangle's area times areal density (kg/m²)."""
    require_positive(areal_density=areal_density)
    a = 0.5 * np.linalg.norm(np.cross(pos[tris[:, 1]] - pos[tris[:, 0]], pos[tris[:, 2]] - pos[tris[:, 0]]), axis=1)
    m = np.zeros(len(pos))
    np.add.at(m, tris.reshape(-1), np.repeat(a / 3.0, 3) * areal_density)
    return m


@dataclass(frozen=True)
class DrapeScene(ByName):
    """A film held over a fixed sphere (:func:`drape_scene`); ``scene["x"]`` also reads
    a field (compatibility accessor, :class:`scenes.scene.ByName`)."""

    model: object                # ipcjax.model.Model
    x: np.ndarray                # (N, 3) initial positions, m: film grid, sphere centre, floor
    sphere: int                  # particle index of the fixed sphere's centre
    sphere_radius: float         # m
    film_triangles: np.ndarray   # (F, 3) int32

    @property
    def n_film(self) -> int:
        """Film particles: they come first, before the sphere."""
        return self.sphere


def drape_scene(n: int = 10, size: float = 0.08, sphere_radius: float = 0.02, gap: float = 2e-3,
                floor: bool = False) -> DrapeScene:
    """A film grid held flat just above a fixed sphere (and optionally a floor).

    Returns a :class:`DrapeScene`.

    Raises:
        ValueError: n < 2, or a size, radius or gap that is not a finite number > 0.
    """
    require_positive(size=size, sphere_radius=sphere_radius, gap=gap)
    pos, tris = film_grid(n, size, z=sphere_radius + gap)
    mass = list(lumped_mass(pos, tris))
    x = [*pos]
    radius = [0.0] * len(pos)
    fixed = [False] * len(pos)
    sphere = len(x)
    x.append(np.zeros(3)); mass.append(0.0); radius.append(sphere_radius); fixed.append(True)
    obstacle = None
    if floor:
        h = size
        base = len(x)
        zf = -sphere_radius - 1e-3
        x += [np.array([-h, -h, zf]), np.array([h, -h, zf]), np.array([h, h, zf]), np.array([-h, h, zf])]
        mass += [0.0] * 4; radius += [0.0] * 4; fixed += [True] * 4
        obstacle = np.array([[base, base + 1, base + 2], [base, base + 2, base + 3]], np.int32)
    x = np.asarray(x)
    model = build_model(x, tris, np.asarray(mass), obstacle_triangles=obstacle,
                        fixed=np.asarray(fixed), radius=np.asarray(radius))
    return DrapeScene(model=model, x=x, sphere=sphere, sphere_radius=float(sphere_radius), film_triangles=tris)


@dataclass(frozen=True)
class FilmScene(ByName):
    """A small film scene: a model and its start (``scene["x"]`` also reads a field:
    compatibility accessor, :class:`scenes.scene.ByName`)."""

    model: object                  # ipcjax.model.Model
    x: np.ndarray                  # (N, 3) start positions, m
    v: np.ndarray | None = None    # (N, 3) start velocities, m/s (None: at rest)
    x_ref: np.ndarray | None = None  # (N, 3) rest positions, m, where they differ from x


@dataclass(frozen=True)
class CantileverScene(FilmScene):
    """:func:`cantilever_scene`: a clamped film; ``tip`` indexes its free edge's vertices."""

    tip: np.ndarray | None = None


@dataclass(frozen=True)
class FoldScene(FilmScene):
    """:func:`fold_scene`: ``controls(i, t)`` gives step i's Controls over ``duration`` s."""

    controls: Callable | None = None
    duration: float = 0.0
    film_triangles: np.ndarray | None = None


def _scene(x, film_tris, obstacle_tris, mass_film, n_film):
    x = np.asarray(x, dtype=np.float64)
    mass = np.zeros(len(x))
    mass[:n_film] = mass_film
    fixed = np.zeros(len(x), bool)
    fixed[n_film:] = True
    model = build_model(x, np.asarray(film_tris, np.int32), mass,
                        obstacle_triangles=np.asarray(obstacle_tris, np.int32), fixed=fixed)
    return FilmScene(model=model, x=x)


def vertex_triangle_scene(speed: float = 0.5):
    """§6 reference: a small film triangle falls vertex-first onto a large fixed triangle.

    The lowest film vertex (index 0) starts 2 mm above the obstacle's interior and moves
    down at ``speed`` m/s. Returns a :class:`FilmScene` (model, x, v).
    """
    film = [[0.0, 0.0, 0.002], [0.01, 0.0, 0.008], [-0.005, 0.0087, 0.008]]
    obst = [[-0.05, -0.05, 0.0], [0.05, -0.05, 0.0], [0.0, 0.06, 0.0]]
    sc = _scene(film + obst, [[0, 1, 2]], [[3, 4, 5]], 1e-5, 3)
    v = np.zeros((6, 3)); v[:3, 2] = -speed
    return replace(sc, v=v)


def edge_edge_scene(speed: float = 0.5):
    """§6 reference: a vertical film triangle falls with its bottom edge across a fixed ridge.

    The film's bottom edge (0, 1) runs along y 2 mm above the ridge edge, which runs along
    x; the ridge faces slope away so the closest pair is edge–edge. Returns a
    :class:`FilmScene` (model, x, v).
    """
    film = [[0.0, -0.01, 0.002], [0.0, 0.01, 0.002], [0.0, 0.0, 0.015]]
    ridge = [[-0.05, 0.0, 0.0], [0.05, 0.0, 0.0], [0.0, -0.03, -0.02], [0.0, 0.03, -0.02]]
    sc = _scene(film + ridge, [[0, 1, 2]], [[3, 4, 5], [3, 6, 4]], 1e-5, 3)
    v = np.zeros((7, 3)); v[:3, 2] = -speed
    return replace(sc, v=v)


def hinge_scene(fold: float = 0.25):
    """§6 reference: two film triangles, flat at rest, start folded with tan(θ) = fold.

    Vertices 0, 1 form the shared edge along x; 2 and 3 are the opposite vertices. The
    initial fold lifts vertex 3 by fold × its distance from the edge (θ = −14.036° for
    0.25 in the hinge sign convention). Returns a :class:`FilmScene` (model, x, x_ref).
    """
    x_ref = np.array([[0.0, 0.0, 0.0], [0.01, 0.0, 0.0], [0.005, -0.008, 0.0], [0.005, 0.008, 0.0]])
    tris = np.array([[0, 1, 3], [1, 0, 2]], np.int32)
    m = lumped_mass(x_ref, tris)
    model = build_model(x_ref, tris, m)
    x = x_ref.copy()
    x[3, 2] = fold * 0.008
    return FilmScene(model=model, x=x, x_ref=x_ref)


def fold_scene(n: int = 8, size: float = 0.06, lift: float = 0.004):
    """Film-on-film fold: a film grid lying 1 mm above a fixed floor; its last row is carried
    by supports on a half-circle over the first half, folding the film onto itself.

    Returns a :class:`FoldScene`.
    """
    from ipcjax.model import Controls
    import jax.numpy as jnp

    pos, tris = film_grid(n, size, z=0.001)
    nf = len(pos)
    h = size
    floor = np.array([[-h, -h, 0.0], [h, -h, 0.0], [h, h, 0.0], [-h, h, 0.0]])
    x = np.concatenate([pos, floor])
    mass = np.concatenate([lumped_mass(pos, tris), np.zeros(4)])
    fixed = np.concatenate([np.zeros(nf, bool), np.ones(4, bool)])
    model = build_model(x, tris, mass, obstacle_triangles=np.array([[nf, nf + 1, nf + 2], [nf, nf + 2, nf + 3]]),
                        fixed=fixed)
    top = np.arange(n * (n - 1), n * n)            # the row at y = +size/2, carried over
    bottom = np.arange(n)                          # the row at y = −size/2, held in place
    start = pos[top].copy()
    held = pos[bottom].copy()
    duration = 0.8

    def controls(i, t):
        s = min(t / duration, 1.0)
        phi = np.pi * (0.5 - 0.5 * np.cos(np.pi * s))  # smooth 0 → π
        y = start[:, 1] * np.cos(phi)
        z = 0.001 + start[:, 1] * np.sin(phi) + lift * np.sin(phi) ** 2 + 0.0002 * s
        target = np.concatenate([np.stack([start[:, 0], y, z], axis=1), held], axis=0)
        ctl = Controls.empty(len(x), tolerance=5e-6, n_supports=2 * n)
        return ctl._replace(support_index=jnp.asarray(np.concatenate([top, bottom]), jnp.int32),
                            support_k=jnp.full(2 * n, 20.0), support_target=jnp.asarray(target))

    return FoldScene(model=model, x=x, controls=controls, duration=duration, film_triangles=tris)


def hanging_scene(n: int = 5, size: float = 0.03):
    """A film grid hanging from its fixed top row (no contact): for smooth-gradient checks.

    The grid lies in the xz-plane; row y = +size/2 → top row at z = 0 is fixed.
    Returns a :class:`FilmScene` (model, x).
    """
    pos, tris = film_grid(n, size)
    x = np.stack([pos[:, 0], np.zeros(len(pos)), pos[:, 1]], axis=1)  # vertical sheet
    fixed = np.zeros(len(pos), bool)
    fixed[n * (n - 1):] = True
    m = lumped_mass(pos, tris)
    m[fixed] = 0.0
    model = build_model(x, tris, m, fixed=fixed)
    return FilmScene(model=model, x=x)


def cantilever_scene(n: int = 5, size: float = 0.02, clamp_columns: int = 2):
    """A horizontal film clamped along one side, drooping under gravity: bending-dominated.

    Returns a :class:`CantileverScene` (``tip``: the indices of the free edge's vertices).
    """
    pos, tris = film_grid(n, size, z=0.05)
    fixed = np.zeros(len(pos), bool)
    cols = np.arange(len(pos)) % n
    fixed[cols < clamp_columns] = True
    m = lumped_mass(pos, tris)
    m[fixed] = 0.0
    model = build_model(pos, tris, m, fixed=fixed)
    return CantileverScene(model=model, x=pos, tip=np.flatnonzero(cols == n - 1))

"""Two film layers sliding on a floor: film-on-film and film-on-floor friction, generic start.

A small scene for checking gradients through frictional contact. Each layer is a square
film grid, rotated about z by its own angle and offset in x and y, so that no film edge is
parallel to another layer's edge or to the floor's diagonal and no vertex sits over a
floor edge (such starts are closest-feature boundaries, where the lagged friction is not
differentiable). The lower layer rests 0.6 mm above the floor, the upper 0.6 mm above it,
both inside the barrier's 1 mm reach, and the upper layer slides sideways at the start, so
friction acts between the layers and between the lower layer and the floor.

``degenerate=True`` builds the non-generic start instead: no rotation or offset, so the
floor's diagonal runs under film vertices and the two layers' edges are parallel.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ipcjax.model import build_model
from scenes.film import FILM_DENSITY, FILM_THICKNESS, FilmScene, film_grid, lumped_mass

GAP = 0.6e-3  # m between floor, lower layer and upper layer


def _rotate(p, angle, offset):
    c, s = np.cos(angle), np.sin(angle)
    out = p.copy()
    out[:, 0] = c * p[:, 0] - s * p[:, 1] + offset[0]
    out[:, 1] = s * p[:, 0] + c * p[:, 1] + offset[1]
    return out


@dataclass(frozen=True)
class LayersScene(FilmScene):
    """:func:`layers_scene`: film particles [0, n_film), ``upper`` the upper layer's."""

    n_film: int = 0
    upper: np.ndarray | None = None


def layers_scene(n: int = 4, size: float = 0.02, slide: float = 0.05, degenerate: bool = False,
                 areal_density: float = FILM_THICKNESS * FILM_DENSITY):
    """Two n × n film layers of side ``size`` (m) on a fixed floor; the upper one slides
    along x at ``slide`` m/s. ``areal_density`` (kg/m²) sets the layers' lumped masses (by
    default the 30 µm film's); a heavier sheet makes the step's inertia count against the
    barrier and the membrane, so that v₀ moves the trajectory measurably.

    Returns a :class:`LayersScene`.
    """
    lower, tris = film_grid(n, size, z=GAP)
    upper, _ = film_grid(n, size, z=2 * GAP)
    if not degenerate:
        lower = _rotate(lower, 0.31, (0.0007, -0.0011))
        upper = _rotate(upper, -0.47, (0.0023, 0.0013))
    nl = len(lower)
    h = size
    floor = np.array([[-h, -h, 0.0], [h, -h, 0.0], [h, h, 0.0], [-h, h, 0.0]])
    x = np.concatenate([lower, upper, floor])
    film_tris = np.concatenate([tris, tris + nl]).astype(np.int32)
    mass = np.concatenate([lumped_mass(lower, tris, areal_density), lumped_mass(upper, tris, areal_density),
                           np.zeros(4)])
    nf = 2 * nl
    fixed = np.concatenate([np.zeros(nf, bool), np.ones(4, bool)])
    model = build_model(x, film_tris, mass, obstacle_triangles=np.array([[nf, nf + 1, nf + 2], [nf, nf + 2, nf + 3]]),
                        fixed=fixed)
    v = np.zeros_like(x)
    v[nl:nf, 0] = slide
    return LayersScene(model=model, x=x, v=v, n_film=nf, upper=np.arange(nl, nf))

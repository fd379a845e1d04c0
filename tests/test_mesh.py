"""scenes.mesh.quad_grid_triangles: the one triangulation of the square films, the bin and
floor, and the Verlet cloth."""
import numpy as np
import pytest

from baselines.verlet_cloth import grid_triangles
from scenes.film import film_grid
from scenes.mesh import quad_grid_triangles


def _normals(x, tris):
    return np.cross(x[tris[:, 1]] - x[tris[:, 0]], x[tris[:, 2]] - x[tris[:, 0]])


@pytest.mark.parametrize("alternate", [False, True])
@pytest.mark.parametrize("u_outer", [False, True])
def test_each_cell_is_two_triangles_covering_it_with_one_orientation(alternate, u_outer):
    nu, nv = 4, 3
    vertex = lambda i, j: j * (nu + 1) + i
    i, j = np.meshgrid(np.arange(nu + 1), np.arange(nv + 1), indexing="xy")
    x = np.stack([i.ravel() * 1.0, j.ravel() * 2.0, np.zeros(i.size)], axis=1)  # node (i, j) at vertex(i, j)
    tris = quad_grid_triangles(nu, nv, vertex, u_outer=u_outer, alternate=alternate)
    assert tris.shape == (2 * nu * nv, 3) and tris.dtype == np.int32
    n = _normals(x, tris)
    np.testing.assert_allclose(n[:, 2], 2.0)            # every triangle half a 1 × 2 cell, facing +z
    assert len({tuple(sorted(t)) for t in tris.tolist()}) == len(tris)
    # the cells in order: cell k's two triangles use exactly its four corners
    order = [(a, b) for a in range(nu) for b in range(nv)] if u_outer else [(a, b) for b in range(nv) for a in range(nu)]
    for k, (a, b) in enumerate(order):
        corners = {vertex(a, b), vertex(a + 1, b), vertex(a, b + 1), vertex(a + 1, b + 1)}
        assert set(tris[2 * k].tolist()) | set(tris[2 * k + 1].tolist()) == corners
        shared = set(tris[2 * k].tolist()) & set(tris[2 * k + 1].tolist())
        odd = alternate and (a + b) % 2 == 1
        assert shared == ({vertex(a + 1, b), vertex(a, b + 1)} if odd else {vertex(a, b), vertex(a + 1, b + 1)})


def test_the_films_alternate_their_diagonals_and_the_cloth_does_not():
    x, tris = film_grid(3, 0.1)
    assert tris.tolist() == [[0, 1, 4], [0, 4, 3], [1, 2, 4], [2, 5, 4],
                             [3, 4, 6], [4, 7, 6], [4, 5, 8], [4, 8, 7]]
    assert np.all(_normals(x, tris)[:, 2] > 0)
    assert grid_triangles(3).tolist() == [[0, 1, 4], [0, 4, 3], [1, 2, 5], [1, 5, 4],
                                          [3, 4, 7], [3, 7, 6], [4, 5, 8], [4, 8, 7]]

"""Model interop with Newton cloth (ipcjax/interop.py).

The default tests use plain arrays in Newton's layout (no ``newton`` import). The slow ones
build cloths with ``newton.ModelBuilder`` and check that membrane and bending energies agree
with Newton's formulations where they coincide (``pytest -m slow``, needs the newton extra).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax.energies.bending import dihedral_angle, flexural_rigidity, hinge_energy, hinge_stiffness
from ipcjax.energies.membrane import lame_from_young, neo_hookean_energy
from ipcjax.interop import match_hinges, model_from_arrays, newton_fixed, params_from_newton
from ipcjax.topology import hinge_topology

E, NU, H = 315e6, 0.45, 30e-6


def grid(nx=4, ny=3, dx=0.1, dy=0.07):
    """A flat (nx+1)×(ny+1) grid in the z = 0.2 plane, two triangles per cell."""
    xs, ys = np.meshgrid(np.arange(nx + 1) * dx, np.arange(ny + 1) * dy, indexing="xy")
    x = np.stack([xs.ravel(), ys.ravel(), np.full(xs.size, 0.2)], axis=1)
    v = lambda i, j: j * (nx + 1) + i
    tris = []
    for j in range(ny):
        for i in range(nx):
            tris += [(v(i, j), v(i + 1, j), v(i + 1, j + 1)), (v(i, j), v(i + 1, j + 1), v(i, j + 1))]
    return x, np.asarray(tris, np.int64)


def newton_tri_poses(x, tris):
    """Newton's ``add_triangle`` rest inverse, written from its definition in NumPy."""
    out = []
    for t in tris:
        p, q, r = x[t[0]], x[t[1]], x[t[2]]
        qp, rp = q - p, r - p
        n = np.cross(qp, rp)
        n /= np.linalg.norm(n)
        e1 = qp / np.linalg.norm(qp)
        e2 = np.cross(n, e1)
        e2 /= np.linalg.norm(e2)
        R = np.stack([e1, e2])
        out.append(np.linalg.inv(np.stack([R @ qp, R @ rp], axis=1)))
    return np.asarray(out)


def newton_edges(tris):
    """Newton-layout edge rows (o0, o1, v0, v1) from ipcjax hinges plus −1 boundary rows."""
    top = hinge_topology(tris)
    b = top.boundary
    bnd = np.stack([np.full(len(b), -1), np.full(len(b), -1), b[:, 0], b[:, 1]], axis=1)
    return np.concatenate([top.hinges, bnd]).astype(np.int64), top


def rotation(a, b, c):
    ca, sa, cb, sb, cc, sc = np.cos(a), np.sin(a), np.cos(b), np.sin(b), np.cos(c), np.sin(c)
    Rx = np.array([[1, 0, 0], [0, ca, -sa], [0, sa, ca]])
    Ry = np.array([[cb, 0, sb], [0, 1, 0], [-sb, 0, cb]])
    Rz = np.array([[cc, -sc, 0], [sc, cc, 0], [0, 0, 1]])
    return Rz @ Ry @ Rx


# --------------------------------------------------------------------------- plain arrays

def test_rest_shape_from_tri_poses_checked_and_mismatch_named():
    x, tris = grid()
    x = x @ rotation(0.3, -0.2, 0.7).T
    tp = newton_tri_poses(x, tris)
    r = model_from_arrays(x, tris, np.full(len(x), 1e-3), tri_poses=tp)
    np.testing.assert_allclose(np.asarray(r.model.dm_inv), tp, rtol=1e-12, atol=1e-12)
    assert r.rest_mismatch < 1e-12
    moved = x.copy()
    moved[7] += [0.0, 0.0, 0.03]   # positions off the rest shape Newton was built from
    with pytest.raises(ValueError, match=r"triangle \d+ .*tri_poses"):
        model_from_arrays(moved, tris, np.full(len(x), 1e-3), tri_poses=tp)
    r2 = model_from_arrays(moved, tris, np.full(len(x), 1e-3), tri_poses=tp, rest_positions=x)
    assert r2.rest_mismatch < 1e-12


def test_fixed_from_flags_and_zero_mass():
    m = np.array([1.0, 0.0, 1.0, 1.0])
    flags = np.array([1, 1, 0, 3])
    np.testing.assert_array_equal(newton_fixed(m, flags), [False, True, True, False])
    np.testing.assert_array_equal(newton_fixed(m), [False, True, False, False])
    x, tris = grid(2, 1)
    mass = np.full(len(x), 1e-3)
    mass[0] = 0.0
    flags = np.ones(len(x), np.int64)
    flags[3] = 0
    r = model_from_arrays(x, tris, mass, flags)
    assert np.flatnonzero(np.asarray(r.model.fixed)).tolist() == [0, 3]


def test_hinge_matching_handles_order_flips_and_boundary():
    x, tris = grid()
    edges, top = newton_edges(tris)
    rng = np.random.default_rng(0)
    flip = rng.random(len(edges)) < 0.5
    interior = edges[:, 0] >= 0
    edges[flip & interior] = edges[flip & interior][:, [1, 0, 3, 2]]   # the other face's view
    perm = rng.permutation(len(edges))
    edges = edges[perm]
    he, flipped, boundary = match_hinges(tris, top.hinges, edges)
    np.testing.assert_array_equal(edges[he][~flipped], top.hinges[~flipped])
    np.testing.assert_array_equal(edges[he][flipped][:, [1, 0, 3, 2]], top.hinges[flipped])
    assert flipped.sum() == (flip & interior).sum() > 0
    assert len(boundary) == len(top.boundary)
    # the flipped view has the same signed angle (so the same bending energy)
    X = x.copy()
    X[:, 2] += 0.05 * np.sin(7 * X[:, 0]) * np.cos(5 * X[:, 1])
    for row, h in zip(edges[he], top.hinges):
        a = dihedral_angle(*X[row])
        assert float(a) == pytest.approx(float(dihedral_angle(*X[h])), abs=1e-13)
    bad = edges.copy()
    k = int(np.flatnonzero(bad[:, 0] >= 0)[0])
    bad[k] = bad[k][[0, 1, 3, 2]]   # edge reversed without swapping the faces: wrong winding
    with pytest.raises(ValueError, match="does not order hinge"):
        match_hinges(tris, top.hinges, bad)
    with pytest.raises(ValueError, match="has no interior Newton edge"):
        match_hinges(tris, top.hinges, edges[edges[:, 0] < 0])


def test_rest_angle_checked():
    x, tris = grid()
    x[:, 2] += 0.3 * x[:, 0] ** 2   # curved rest shape: non-zero rest angles
    edges, top = newton_edges(tris)
    theta = np.array([float(dihedral_angle(*x[r])) if r[0] >= 0 else 0.0 for r in edges])
    assert np.abs(theta).max() > 1e-3
    r = model_from_arrays(x, tris, np.full(len(x), 1e-3), edge_indices=edges, edge_rest_angle=theta)
    np.testing.assert_allclose(np.asarray(r.model.theta0), theta[r.hinge_edge], atol=1e-14)
    with pytest.raises(ValueError, match="rest angle"):
        model_from_arrays(x, tris, np.full(len(x), 1e-3), edge_indices=edges, edge_rest_angle=0 * theta)


def test_params_from_newton_inverts_the_material_mapping():
    x, tris = grid()
    edges, top = newton_edges(tris)
    mu, lam = (float(v) for v in lame_from_young(E, NU, H))
    mats = np.tile([mu, lam, 0.0, 0.0, 0.0], (len(tris), 1))
    r0 = model_from_arrays(x, tris, np.full(len(x), 1e-3), edge_indices=edges)
    m = r0.model
    ke_h = 0.5 * np.asarray(hinge_stiffness(E, NU, H, np.asarray(m.hinge_length), np.asarray(m.hinge_area))) \
        / np.asarray(m.hinge_length)                       # edge_ke = scale · 6Dℓ/A, scale 0.5
    edge_ke = np.zeros(len(edges))
    edge_ke[r0.hinge_edge] = ke_h
    r = model_from_arrays(x, tris, np.full(len(x), 1e-3), edge_indices=edges, tri_materials=mats, edge_ke=edge_ke)
    p = params_from_newton(r, H)
    assert float(p.youngs_modulus) == pytest.approx(E, rel=1e-12)
    assert float(p.poisson) == pytest.approx(NU, rel=1e-12)
    assert float(p.bending_scale) == pytest.approx(0.5, rel=1e-12)
    edge_ke[r0.hinge_edge[0]] *= 2
    r = model_from_arrays(x, tris, np.full(len(x), 1e-3), edge_indices=edges, tri_materials=mats, edge_ke=edge_ke)
    with pytest.raises(ValueError, match="bending_scale"):
        params_from_newton(r, H)


# --------------------------------------------------------------------------- with newton

def _newton():
    import newton  # the test extra installs it (pyproject.toml)
    import warp as wp

    wp.config.quiet = True
    return newton, wp


def newton_stable_nh(X, tri_pose, area, mu, lam):
    """Newton 1.8 VBD membrane energy of one triangle, from its documented formula:
    A₀ [μ/2 (I_C − 2) + λ'/2 (J − α)²], λ' = λ + μ, α = 1 + μ/λ', F = [x01 x02] tri_pose,
    J = |f0 × f1| (tri_ke = μ, tri_ka = λ)."""
    F = jnp.stack([X[1] - X[0], X[2] - X[0]], axis=1) @ tri_pose
    Ic = jnp.sum(F * F)
    J = jnp.linalg.norm(jnp.cross(F[:, 0], F[:, 1]))
    lp = lam + mu
    alpha = 1.0 + mu / lp
    return area * (0.5 * mu * (Ic - 2.0) + 0.5 * lp * (J - alpha) ** 2)


def newton_bending(X, edges, rest, ke, ell):
    """Newton's dihedral bending energy Σ ½ (edge_ke ℓ)(θ − θ₀)², θ from its VBD kernel in NumPy."""
    total = 0.0
    for (i, j, k, l), t0, e_ke, L in zip(edges, rest, ke, ell):
        if i < 0 or j < 0:
            continue
        x0, x1, x2, x3 = X[i], X[j], X[k], X[l]
        n1, n2, e = np.cross(x2 - x0, x3 - x0), np.cross(x3 - x1, x2 - x1), x3 - x2
        n1, n2, e = n1 / np.linalg.norm(n1), n2 / np.linalg.norm(n2), e / np.linalg.norm(e)
        theta = np.arctan2(np.dot(np.cross(n1, n2), e), np.dot(n1, n2))
        total += 0.5 * e_ke * L * (theta - t0) ** 2
    return total


@pytest.mark.slow
def test_newton_cloth_grid_membrane_matches_stable_neo_hookean_to_second_order():
    newton, wp = _newton()
    mu, lam = (float(v) for v in lame_from_young(E, NU, H))
    b = newton.ModelBuilder(up_axis=newton.Axis.Z)
    b.add_cloth_grid(pos=wp.vec3(0.1, -0.2, 0.3), rot=wp.quat_rpy(0.4, -0.3, 0.2), vel=wp.vec3(0.0, 0.0, 0.0),
                     dim_x=4, dim_y=3, cell_x=0.05, cell_y=0.04, mass=2e-4, tri_ke=mu, tri_ka=lam, tri_kd=0.0,
                     edge_ke=0.0, fix_left=True)
    from ipcjax.interop import model_from_newton, newton_arrays

    arr = newton_arrays(b)
    r = model_from_newton(b)
    m = r.model
    assert r.rest_mismatch < 1e-6
    np.testing.assert_allclose(np.asarray(m.mass), arr["masses"], rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(m.fixed), (arr["masses"] == 0) | (arr["flags"] & 1 == 0))
    assert np.asarray(m.fixed).sum() == 4        # fix_left: one column of 4 particles
    # the finalized model (float32 storage) gives the same model
    rf = model_from_newton(b.finalize(device="cpu"))
    np.testing.assert_allclose(np.asarray(rf.model.dm_inv), np.asarray(m.dm_inv), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(rf.hinge_edge, r.hinge_edge)

    tris = np.asarray(m.film_triangles)
    tp, area = arr["tri_poses"], np.asarray(m.rest_area)
    assert np.allclose(area, 1.0 / (2.0 * np.linalg.det(tp)), rtol=1e-6)
    x0 = arr["positions"]
    ipc = jax.vmap(neo_hookean_energy, (0, 0, 0, None, None))
    nwt = jax.vmap(newton_stable_nh, (0, 0, 0, None, None))
    e_ipc = lambda x: jnp.sum(ipc(x[tris], m.dm_inv, area, mu, lam))
    e_nwt = lambda x: jnp.sum(nwt(x[tris], jnp.asarray(tp), area, mu, lam))
    X0 = jnp.asarray(x0)
    # rest: both gradients vanish and the Hessians (the small-strain elasticity) are equal
    g_i, g_n = jax.grad(e_ipc)(X0), jax.grad(e_nwt)(X0)
    scale = mu * float(np.sqrt(area.max()))
    assert float(jnp.abs(g_i).max()) < 1e-9 * scale and float(jnp.abs(g_n).max()) < 1e-9 * scale
    H_i = jax.hessian(e_ipc)(X0).reshape(x0.size, x0.size)
    H_n = jax.hessian(e_nwt)(X0).reshape(x0.size, x0.size)
    np.testing.assert_allclose(H_n, H_i, rtol=0, atol=1e-9 * float(jnp.abs(H_i).max()))
    # deformed: the energies (Newton's minus its rest value) differ only at third order in strain
    rng = np.random.default_rng(3)
    direction = rng.standard_normal(x0.shape) * 0.04
    rel = []
    for s in (1e-2, 1e-3, 1e-4):
        X = X0 + s * direction
        ei, en = float(e_ipc(X)), float(e_nwt(X) - e_nwt(X0))
        assert ei > 0
        rel.append(abs(en - ei) / ei)
    assert rel[1] < 2e-2
    assert 0.03 < rel[2] / rel[1] < 0.3 and 0.03 < rel[1] / rel[0] < 0.3   # O(s): third-order difference


@pytest.mark.slow
def test_newton_cloth_mesh_bending_matches_hinge_energy_on_a_fold():
    newton, wp = _newton()
    from ipcjax.interop import model_from_newton
    from baselines.vbd_bag import edge_bending_stiffness

    x, tris = grid(6, 4, 0.03, 0.03)
    x[:, 2] += 2.0 * (x[:, 0] - 0.09) ** 2           # curved rest shape: θ₀ ≠ 0
    mu, lam = (float(v) for v in lame_from_young(E, NU, H))
    b = newton.ModelBuilder(up_axis=newton.Axis.Z)
    b.add_cloth_mesh(pos=wp.vec3(0.0, 0.0, 0.0), rot=wp.quat_identity(), scale=1.0, vel=wp.vec3(0.0, 0.0, 0.0),
                     vertices=[wp.vec3(*p) for p in x], indices=tris.reshape(-1).tolist(), density=0.02775,
                     tri_ke=mu, tri_ka=lam, tri_kd=0.0, edge_ke=0.0, edge_kd=0.0)
    xq = np.asarray(b.particle_q, np.float64)
    edges = np.asarray(b.edge_indices, np.int64)
    ke = edge_bending_stiffness(xq, edges, E, NU, H)     # the VBD driver's mapping edge_ke = 6Dℓ/A
    b.edge_bending_properties = [(float(k), 0.0) for k in ke]
    r = model_from_newton(b)                              # checks rest angles against θ₀ (1e-4 rad)
    m = r.model
    assert np.abs(np.asarray(m.theta0)).max() > 0.02
    p = params_from_newton(r, H)
    assert float(p.bending_scale) == pytest.approx(1.0, rel=1e-6)
    assert float(p.youngs_modulus) == pytest.approx(E, rel=1e-6)
    k_theta = np.asarray(hinge_stiffness(E, NU, H, np.asarray(m.hinge_length), np.asarray(m.hinge_area)))
    np.testing.assert_allclose(r.k_theta, k_theta, rtol=1e-6)
    assert flexural_rigidity(E, NU, H) == pytest.approx(8.8871e-7, rel=1e-4)

    # fold: rotate the part x > 0.1 m by 1.2 rad about the line x = 0.1 m, z = its height
    X = xq.copy()
    c = np.array([0.1, 0.0, 2.0 * 0.01 ** 2])
    far = X[:, 0] > 0.1 + 1e-9
    R = rotation(0.0, -1.2, 0.0)
    X[far] = (X[far] - c) @ R.T + c
    hinges = np.asarray(m.hinges)
    e_ipc = float(jnp.sum(jax.vmap(hinge_energy)(jnp.asarray(X[hinges]), m.theta0, jnp.asarray(k_theta))))
    rest = np.asarray(b.edge_rest_angle)
    ell = np.asarray(b.edge_rest_length)
    e_nwt = newton_bending(X, edges, rest, ke, ell)
    assert e_ipc > 1e-9
    assert e_nwt == pytest.approx(e_ipc, rel=1e-5)   # Newton's rest data are float32

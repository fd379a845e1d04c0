"""Inertia, supports and ties: hand-derived derivatives against autodiff and central differences."""
import jax
import jax.numpy as jnp
import numpy as np

from ipcjax.energies.constraints import (
    support_energy, support_gradient, support_hessian,
    tie_energy, tie_gradient, tie_hessian, tie_hessian_psd,
)
from ipcjax.energies.inertia import inertia_energy, inertia_gradient, inertia_hessian_diagonal, inertial_target
from tests.helpers import assert_nonzero, central_gradient, rel_err


def test_inertial_target_and_energy():
    rng = np.random.default_rng(0)
    n = 5
    x0, v0 = rng.normal(size=(n, 3)), rng.normal(size=(n, 3))
    mass = np.array([1.0, 2.0, 0.0, 0.5, 3.0])
    free = np.array([True, True, True, False, True])
    grav, force, dt = np.array([0, 0, -9.81]), rng.normal(size=(n, 3)), 1 / 240
    y = np.asarray(inertial_target(x0, v0, dt, mass=mass, free=free, gravity=grav, force=force))
    expect = x0 + dt * v0 + dt**2 * (grav + force / np.where(mass > 0, mass, 1)[:, None])
    assert np.allclose(y[[0, 1, 4]], expect[[0, 1, 4]], rtol=1e-14)
    assert np.array_equal(y[[2, 3]], x0[[2, 3]])  # massless and fixed stay put
    x = rng.normal(size=(n, 3))
    f = lambda z: inertia_energy(z, y, mass, free, dt)
    g = inertia_gradient(x, y, mass, free, dt)
    assert_nonzero(g)
    assert rel_err(g, jax.grad(f)(x)) < 1e-12
    assert rel_err(g, central_gradient(f, x, h=1e-6)) < 1e-6
    H = np.asarray(jax.hessian(f)(jnp.asarray(x))).reshape(3 * n, 3 * n)
    assert rel_err(np.repeat(np.asarray(inertia_hessian_diagonal(mass, free, dt)), 3), np.diag(H)) < 1e-12
    assert np.allclose(H - np.diag(np.diag(H)), 0.0)


def test_support_derivatives():
    x, t, k = np.array([0.1, 0.2, 0.3]), np.array([0.0, 0.25, 0.1]), 40.0
    f = lambda z: support_energy(z, t, k)
    assert_nonzero(support_gradient(x, t, k))
    assert rel_err(support_gradient(x, t, k), central_gradient(f, x)) < 1e-8
    assert rel_err(support_hessian(x, t, k), jax.hessian(f)(x)) < 1e-12


def test_tie_derivatives_stretched_and_compressed():
    rng = np.random.default_rng(3)
    k = 250.0
    for rest_scale in [0.5, 1.5]:  # stretched (PSD) and compressed (indefinite) springs
        xi, xj = rng.normal(size=3) * 0.01, rng.normal(size=3) * 0.01
        rest = rest_scale * np.linalg.norm(xi - xj)
        f = lambda z: tie_energy(z[:3], z[3:], rest, k)
        z = np.concatenate([xi, xj])
        g = np.asarray(tie_gradient(xi, xj, rest, k)).reshape(6)
        assert_nonzero(g)
        assert rel_err(g, jax.grad(f)(z)) < 1e-12
        assert rel_err(g, central_gradient(f, z, h=1e-7)) < 1e-6
        H = np.asarray(tie_hessian(xi, xj, rest, k))
        assert rel_err(H, jax.hessian(f)(jnp.asarray(z))) < 1e-10
        Hp = np.asarray(tie_hessian_psd(xi, xj, rest, k))
        assert np.linalg.eigvalsh(Hp).min() >= -1e-9 * np.abs(Hp).max()
        if rest_scale < 1:
            assert rel_err(Hp, H) < 1e-14  # already PSD: no change

"""Lagged friction: hand-derived gradient and Hessian against autodiff and central differences."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax.energies.friction import friction_energy, friction_eps, friction_gradient, friction_hessian
from tests.helpers import assert_nonzero, central_gradient, rel_err


def _case(rng, slide):
    X0 = rng.normal(size=(4, 3)) * 1e-2
    w0 = np.array([1.0, -0.3, -0.3, -0.4])
    n0 = rng.normal(size=3); n0 /= np.linalg.norm(n0)
    X = X0 + rng.normal(size=(4, 3)) * slide
    return X, X0, w0, n0


@pytest.mark.parametrize("slide", [1e-7, 1e-5, 1e-3])  # static (t ≲ ε), transitional, sliding
def test_friction_derivatives(slide):
    rng = np.random.default_rng(1)
    X, X0, w0, n0 = _case(rng, slide)
    load, eps = 0.35 * 2.0, friction_eps(1 / 240)
    f = lambda Z: friction_energy(jnp.asarray(Z), X0, w0, n0, load, eps=eps)
    g = friction_gradient(X, X0, w0, n0, load, eps=eps)
    assert_nonzero(g)
    assert rel_err(g, jax.grad(f)(X)) < 1e-10
    assert rel_err(g, central_gradient(f, X, h=slide * 1e-4)) < 1e-6
    H = np.asarray(friction_hessian(X, X0, w0, n0, load, eps=eps))
    assert rel_err(H, np.asarray(jax.hessian(f)(X)).reshape(12, 12)) < 1e-9
    assert np.linalg.eigvalsh(H).min() >= -1e-9 * np.abs(H).max()


def test_friction_ignores_normal_motion():
    rng = np.random.default_rng(2)
    X, X0, w0, n0 = _case(rng, 0.0)
    Xn = X0 + 1e-3 * n0[None, :]  # every vertex moves along n0: tangential slip is zero
    assert float(friction_energy(Xn, X0, w0, n0, 1.0, eps=1e-6)) == pytest.approx(0.0, abs=1e-18)

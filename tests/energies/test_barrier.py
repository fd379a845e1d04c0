"""Barrier: hand-derived B′, B″ against autodiff and central differences; stencil terms."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax.energies.barrier import (
    barrier,
    barrier_first_derivative,
    barrier_second_derivative,
    stencil_barrier_gradient,
    stencil_barrier_hessian_psd,
)
from tests.helpers import assert_nonzero, central_gradient, rel_err

DHAT, K = 1e-3, 1000.0
GAPS = [1e-9, 1e-7, 1e-5, 3e-4, 7e-4, 0.999e-3]


@pytest.mark.parametrize("g", GAPS)
def test_barrier_derivatives_match_autodiff(g):
    d1 = jax.grad(barrier)(g, DHAT, K)
    d2 = jax.grad(jax.grad(barrier))(g, DHAT, K)
    assert rel_err(barrier_first_derivative(g, DHAT, K), d1) < 1e-12
    assert rel_err(barrier_second_derivative(g, DHAT, K), d2) < 1e-12
    assert d1 < 0.0  # repulsive
    assert_nonzero(d1)


@pytest.mark.parametrize("g", GAPS[2:])
def test_barrier_derivatives_match_central_differences(g):
    h = min(g, DHAT - g) * 1e-3  # stay inside (0, d̂): one branch
    fd1 = (barrier(g + h, DHAT, K) - barrier(g - h, DHAT, K)) / (2 * h)
    fd2 = (barrier_first_derivative(g + h, DHAT, K) - barrier_first_derivative(g - h, DHAT, K)) / (2 * h)
    assert rel_err(barrier_first_derivative(g, DHAT, K), fd1) < 1e-6
    assert rel_err(barrier_second_derivative(g, DHAT, K), fd2) < 1e-6


def test_barrier_values_outside_domain():
    assert float(barrier(DHAT, DHAT, K)) == 0.0
    assert float(barrier(2 * DHAT, DHAT, K)) == 0.0
    assert float(barrier(0.0, DHAT, K)) == np.inf
    assert float(barrier(-1e-6, DHAT, K)) == np.inf
    # gradients of inactive / infeasible terms are exactly zero, never NaN
    for g in [DHAT, 2 * DHAT, 0.0, -1e-6]:
        assert float(jax.grad(barrier)(g, DHAT, K)) == 0.0
    # a known value: g = d̂/2 → −k (d̂/2)² log(1/2)
    assert float(barrier(DHAT / 2, DHAT, K)) == pytest.approx(K * (DHAT / 2) ** 2 * np.log(2.0), rel=1e-14)


def _random_stencil(rng, gap):
    """Four points where r = w·X has length offset + gap along a random direction."""
    X = rng.normal(size=(4, 3)) * 1e-2
    w = np.array([1.0, -0.2, -0.5, -0.3])
    n = rng.normal(size=3); n /= np.linalg.norm(n)
    r = w @ X
    X[0] += (0.03e-3 + gap) * n - r  # now w·X = (c + gap) n
    return X, w


def test_stencil_gradient_and_hessian():
    rng = np.random.default_rng(0)
    c = 0.03e-3
    for gap in [1e-6, 2e-4, 8e-4]:
        X, w = _random_stencil(rng, gap)
        e = lambda Z: barrier(jnp.linalg.norm(jnp.asarray(w) @ Z) - c, DHAT, K)
        g_hand = stencil_barrier_gradient(jnp.asarray(X), jnp.asarray(w), c, DHAT, K)
        g_ad = jax.grad(e)(jnp.asarray(X))
        assert_nonzero(g_hand)
        assert rel_err(g_hand, g_ad) < 1e-10
        assert rel_err(g_hand, central_gradient(e, X, h=gap * 1e-4)) < 1e-6
        H = np.asarray(stencil_barrier_hessian_psd(jnp.asarray(X), jnp.asarray(w), c, DHAT, K))
        assert np.allclose(H, H.T)
        assert np.linalg.eigvalsh(H).min() >= -1e-9 * np.abs(H).max()
        # the normal-direction curvature equals B″ along j = w ⊗ n
        n = (w @ X) / np.linalg.norm(w @ X)
        j = np.kron(w, n)
        H_ad = np.asarray(jax.hessian(e)(jnp.asarray(X))).reshape(12, 12)
        assert rel_err(j @ H @ j, j @ H_ad @ j) < 1e-9

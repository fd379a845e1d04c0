"""The Taylor-remainder test's verdict: right derivatives pass with or without a noise
floor, wrong ones fail, whatever the starting step."""
import numpy as np
import pytest

from tests.helpers import taylor_test

X0 = 0.3


def f(s):
    return np.sin(X0 + s) * np.exp(0.5 * (X0 + s))


DFD = np.exp(0.5 * X0) * (np.cos(X0) + 0.5 * np.sin(X0))


def noisy(scale, seed=0):
    """f plus a deterministic pseudo-random noise of size ``scale`` (as a solver's tolerance leaves)."""
    rng = np.random.default_rng(seed)
    table = {}
    return lambda s: f(s) + table.setdefault(s, scale * rng.uniform(-1, 1))


@pytest.mark.parametrize("h0", [1e-1, 3e-2, 1e-3])
def test_right_derivative_converges_at_order_two(h0):
    res = taylor_test(f, DFD, h0, n=14)
    assert abs(res.slope - 2.0) < 0.05 and res.error_bound < 1e-2
    assert np.log10(res.h[res.window[0]] / res.h[res.window[1]]) >= 1.0


@pytest.mark.parametrize("noise", [1e-9, 1e-7])
def test_noise_floor_ends_the_window_without_deciding_it(noise):
    res = taylor_test(noisy(noise), DFD, 0.1, n=20, f0=f(0.0))
    i, j = res.window
    assert j < 19, "the window should stop at the noise floor"
    assert res.r[j] > 0.1 * noise  # the window ends at the noise floor, not deep below it


@pytest.mark.parametrize("error", [1e-2, -3e-3, 1.0, -2.0])
def test_wrong_derivative_fails(error):
    with pytest.raises(AssertionError, match="Taylor test"):
        taylor_test(f, DFD * (1 + error), 0.1, n=20)


def test_wrong_derivative_hidden_by_noise_fails_rather_than_passes():
    # an error of 1e-3 with noise that hides its slope-1 range: no window reaches low enough
    with pytest.raises(AssertionError):
        taylor_test(noisy(1e-4), DFD * (1 + 1e-3), 0.1, n=20, f0=f(0.0), rtol=1e-4)


def test_zero_derivative_is_refused():
    with pytest.raises(AssertionError, match="nothing to check"):
        taylor_test(f, 0.0, 0.1)

"""Gradients through film-on-film friction from a generic start pass the Taylor test
(convergence at order 2), and a degenerate start (edges parallel, a vertex over a floor edge) is flagged."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax import capacity as C
from ipcjax.implicit import NonDifferentiableWarning, make_rollout, stack_controls
from ipcjax.model import Config, Controls, Params
from scenes.film import FILM_DENSITY, FILM_THICKNESS
from scenes.layers import layers_scene
from tests.helpers import taylor_test

_AREAL = FILM_THICKNESS * FILM_DENSITY  # kg/m², the 30 µm film

STEPS = 4
DT = 1 / 240
TOL = 1e-11  # m: the Newton tolerance of the differenced rollouts (their noise floor)
CFG = Config(max_newton=600)  # 1e-11 m takes up to ~135 iterations a step here
HEAVY = 1000.0  # v₀'s scene: the layers' areal density × this (see below)


def _setup(degenerate, slots=None, **scene):
    """The scene and one rollout whose tolerance is the controls' (``tolerance=None``),
    its capacity the initial one with ``slots`` (below) in place of its guesses."""
    sc = layers_scene(degenerate=degenerate, **scene)
    m = sc.model
    capacity = None if slots is None else C.initial_capacity(m.topology)._replace(**slots)
    roll = make_rollout(m, CFG, capacity, round_fp32=False, tolerance=None, report=True)
    return sc, m, roll


#: Capacities above what the four steps of each start need, so that no regrowth compiles
#: another program (from the initial capacity the rollout grew twice on each start,
#: compiling a program each time). Measured needs: the generic start 197 vertex–triangle
#: and 425 edge–edge candidates and 273 active rows; the aligned start 244, 467 and about
#: 475. Slots beyond the need cost time in every rollout of the Taylor tests, so each start
#: has its own. A capacity too small on another machine only costs a regrowth: the
#: rollout grows it and runs again.
GENERIC_SLOTS = dict(vt=256, ee=512, active=352)
ALIGNED_SLOTS = dict(vt=320, ee=576, active=576)


def _controls(m, tol):
    return stack_controls([Controls.empty(m.n_particles, tolerance=tol)] * STEPS)


def _two_layer_taylor(names, with_x0):
    """Gradients in ``names`` (and x₀ if ``with_x0``) through film-on-film and film-on-floor
    friction converge at order 2 in the Taylor test (tests/helpers.py,
    docs/differentiation.md); every parameter's gradient and v₀'s is non-zero.

    A central difference at one step is not a verdict here: each solve stops at
    max|Δx| < TOL, which leaves noise of ~1e-10 in the loss, and on different machines and
    steps the same check came out 0.2 % to 16 % off. The Taylor remainder must instead fall
    as h² over at least a decade of steps above that noise floor, wherever the floor lies.
    """
    sc, m, roll = _setup(degenerate=False, slots=GENERIC_SLOTS)
    x0, v0 = jnp.asarray(sc.x), jnp.asarray(sc.v)
    upper = jnp.asarray(sc.upper)
    # the upper layer's slide (x) and both layers' heights: friction, stiffness and bending act
    W = jnp.zeros_like(x0).at[upper, 0].set(1.0).at[: sc.n_film, 2].set(1.0)
    ctl = _controls(m, TOL)

    def loss(p, x0, v0):
        frames, _, codes, kinks = roll(p, x0, v0, ctl, DT)
        return jnp.sum(W * frames[-1]), kinks

    p0 = Params.film_defaults()
    roll(p0, x0, v0, ctl, DT)  # compiles the forward program (and grows the capacity if it must)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonDifferentiableWarning)  # the generic start is not flagged
        (val, kinks), g = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(p0, x0, v0)
    assert int(np.sum(kinks)) == 0
    for name in ("youngs_modulus", "friction", "bending_scale"):
        assert float(getattr(g[0], name)) != 0.0, name
    assert float(jnp.abs(g[2]).max()) > 0  # v₀'s Taylor test is the slow one below
    f0 = float(val)
    # Parameters in relative steps from 30 %: the expansion holds below ~10 % and the solve
    # noise floor lies near 1e-3 relative (measured: windows of 1.5–2.7 decades, default, one
    # thread and AVX code paths; docs/differentiation.md).
    for name in names:
        base = float(getattr(p0, name))
        dfd = float(getattr(g[0], name)) * base
        res = taylor_test(lambda s: loss(p0._replace(**{name: jnp.asarray(base * (1 + s))}), x0, v0)[0],
                          dfd, 0.3, n=14, f0=f0)
        print(name, res)
    if with_x0:  # x₀ along a random direction of the free particles, from 10 µm a particle
        free = np.asarray(~m.fixed)[:, None]
        d_x = jnp.asarray(np.random.default_rng(3).normal(size=x0.shape) * free)
        res = taylor_test(lambda s: loss(p0, x0 + s * d_x, v0)[0], float(jnp.sum(g[1] * d_x)), 1e-5, n=14,
                          f0=f0)
        print("x0", res)


def test_two_layer_friction_gradients_pass_the_taylor_test():
    """μf, the friction between the layers and on the floor, and x₀, the contacts' geometry
    (_two_layer_taylor)."""
    _two_layer_taylor(("friction",), with_x0=True)


@pytest.mark.slow  # the same rollout programs compiled again and 28 more rollouts (≈ 2 min); E's Taylor test
# through frictional contact is in the default suite (test_implicit.py's frictional slide)
def test_two_layer_friction_gradients_in_e_and_bending_pass_the_taylor_test():
    """E and kθ through the same film-on-film friction (_two_layer_taylor)."""
    _two_layer_taylor(("youngs_modulus", "bending_scale"), with_x0=False)


@pytest.mark.slow  # two more rollout programs (≈ 2 min); v₀'s gradient path is checked in the default suite by
# tests/test_implicit.py::test_implicit_gradient_equals_unrolled_newton_without_contact
def test_two_layer_friction_gradient_in_v0_passes_the_taylor_test():
    """The gradient in v₀ through the same film-on-film friction converges at order 2.

    On the 30 µm film the step's inertia is tiny against the barrier and the membrane
    (m/dt² ≈ 0.04 N/m a particle), so v₀ moves the loss by only ~5e-5 per m/s in any
    direction (random: 4e-5; the slide: 5e-8, friction holds it): its differences sat on the
    solve's noise (0.2–16 % off at one h), and a tighter 1e-12 m solve ran into the
    iteration cap under other round-off (XLA_FLAGS=--xla_cpu_max_isa=AVX). So the sheet here
    is heavier (areal density × HEAVY): the same friction and contacts act and v₀ counts.
    Direction: the upper layer pressing down plus a random part.
    """
    sh, m, roll_h = _setup(degenerate=False, areal_density=HEAVY * _AREAL)
    xh, vh = jnp.asarray(sh.x), jnp.asarray(sh.v)
    upper = jnp.asarray(sh.upper)
    W = jnp.zeros_like(xh).at[upper, 0].set(1.0).at[: sh.n_film, 2].set(1.0)
    ctl = _controls(m, TOL)
    p0 = Params.film_defaults()
    free = np.asarray(~m.fixed)[:, None]

    def loss_h(v):
        frames, _, codes, kinks = roll_h(p0, xh, v, ctl, DT)
        return jnp.sum(W * frames[-1]), kinks

    roll_h(p0, xh, vh, ctl, DT)  # sizes the candidate capacity (and compiles)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonDifferentiableWarning)
        (vh_val, kinks_h), gv = jax.value_and_grad(loss_h, has_aux=True)(vh)
    assert int(np.sum(kinks_h)) == 0
    d_v = jnp.zeros_like(vh).at[upper, 2].set(-1.0) + 0.3 * jnp.asarray(
        np.random.default_rng(4).normal(size=vh.shape) * free)
    res = taylor_test(lambda s: loss_h(vh + s * d_v)[0], float(jnp.sum(gv * d_v)), 0.3, n=14, f0=float(vh_val))
    print("v0", res)


def test_degenerate_start_is_flagged():
    # the flag is computed at each step's start; a loose tolerance keeps the solve short
    # (on the aligned start, 1e-10 m runs into the iteration cap)
    sc, m, roll = _setup(degenerate=True, slots=ALIGNED_SLOTS)
    x0, v0 = jnp.asarray(sc.x), jnp.asarray(sc.v)
    with pytest.warns(NonDifferentiableWarning, match="closest-feature boundary"):
        _, _, codes, kinks = roll(Params.film_defaults(), x0, v0, _controls(m, 1e-6), DT)
    assert int(kinks[0]) > 0

"""The default fit scene: a film pouch around a sphere, pinched, tied and released."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax.implicit import make_rollout
from ipcjax.step import check_geometry
from scenes.pouch import RINGS, flap_height, measure, neck_width, pouch_profile, pouch_scene
from tests.helpers import taylor_test

NAMES = ("youngs_modulus", "friction", "bending_scale")


@pytest.fixture(scope="module")
def pouch():
    return pouch_scene()


def test_pouch_builds_without_overlap(pouch):
    m = pouch.model
    check_geometry(m, pouch.x, pouch.config)  # raises on any gap ≤ 0 or edge through face
    assert pouch.n_film == 1 + RINGS * 8 and m.n_particles == pouch.n_film + 1 + 4
    steps = pouch.controls.support_k.shape[0]
    assert steps == len(pouch.controls_list) == 15
    k = np.asarray(pouch.controls.support_k)
    assert k[0].min() > 0 and np.all(k[-1] == 0)         # hands hold, then let go
    tk = np.asarray(pouch.controls.tie_k)
    assert np.all(tk[:5] == 0) and np.all(tk[5:] > 0)    # tied from the tie phase on


def test_measurements_on_built_positions(pouch):
    x = jnp.asarray(pouch.x)
    prof, _ = pouch_profile()
    r_neck = prof[RINGS - 1, 0]
    wx, wy = np.asarray(neck_width(x, pouch.neck))
    assert wx == pytest.approx(2 * r_neck, rel=1e-12) and wy == pytest.approx(2 * r_neck, rel=1e-12)
    assert float(flap_height(x, pouch.rim, pouch.neck)) == pytest.approx(prof[RINGS, 1] - prof[RINGS - 1, 1],
                                                                                rel=1e-12)
    g = jax.grad(lambda x: jnp.sum(measure(x, pouch.neck, pouch.rim)))(x)
    assert np.all(np.isfinite(np.asarray(g))) and np.abs(np.asarray(g)).max() > 0


@pytest.mark.slow
def test_pouch_gradients_nonzero_and_pass_the_taylor_test(pouch):
    m, p0 = pouch.model, pouch.params
    roll = make_rollout(m, pouch.config, pouch.capacity, round_fp32=False)
    x0 = jnp.asarray(pouch.x)

    def meas(z):
        p = p0._replace(**{n: jnp.exp(z[i]) for i, n in enumerate(NAMES)})
        frames, _, codes = roll(p, x0, jnp.zeros_like(x0), pouch.controls, pouch.dt)
        return measure(frames[-1], pouch.neck, pouch.rim), codes

    z0 = jnp.log(jnp.asarray([float(getattr(p0, n)) for n in NAMES]))
    J, codes = jax.jit(jax.jacrev(meas, has_aux=True))(z0)
    assert np.all(np.asarray(codes) == 0)
    J = np.asarray(J)
    f = jax.jit(meas)
    for j, name in enumerate(NAMES):
        assert np.abs(J[:, j]).max() > 1e-7, name       # > 0.1 µm per unit log-parameter
    # The Taylor test (tests/helpers.py) on a fixed random combination of the three
    # measurements, per log-parameter. One central difference per parameter was noise-bound
    # for kθ: it moves the measurements ~20× less than E, and at h = 1e-3 its difference
    # came out 2.9e-3 off, on the solve's ~1e-10 m noise. Measured: windows of 2.7 (E), 2.4 (μf)
    # and 1.8 (kθ) decades, r/|h·dfd| at their bottom 2.4e-4, 2.9e-4 and 5.2e-4.
    w = np.random.default_rng(2).normal(size=3)
    y0 = float(w @ np.asarray(f(z0)[0]))
    for j, name in enumerate(NAMES):
        e = np.zeros(3); e[j] = 1.0
        res = taylor_test(lambda s: float(w @ np.asarray(f(z0 + s * jnp.asarray(e))[0])), float(w @ J[:, j]), 0.3,
                          n=14, f0=y0)
        print(name, res)


def test_measurements_are_one_code_for_numpy_and_jax():
    """scenes.measure serves the bag's NumPy summaries and the pouch's differentiable fit.
    Each array module gives exactly what its own formula gave before (the NumPy one in
    scenes/bag.py, the jnp one in scenes/pouch.py); across modules they agree to an ulp
    (NumPy and XLA sum the mean in different orders)."""
    from scenes import bag
    from scenes import measure as M

    rng = np.random.default_rng(3)
    frames = rng.normal(size=(4, 30, 3))
    neck, rim = np.arange(5, 13), np.arange(20, 28)
    for x in frames:
        p = x[neck]
        w = p.max(axis=0) - p.min(axis=0)
        assert bag.neck_width(x, neck) == (float(w[0]), float(w[1]))
        assert bag.flap_height(x, rim, neck) == float(np.median(x[rim, 2]) - np.mean(x[neck, 2]))
        xj, pj = jnp.asarray(x), jnp.asarray(x)[jnp.asarray(neck)]
        before = jnp.concatenate([jnp.max(pj[:, :2], axis=0) - jnp.min(pj[:, :2], axis=0),
                                  (jnp.median(xj[rim, 2]) - jnp.mean(xj[neck, 2]))[None]])
        np.testing.assert_array_equal(np.asarray(measure(xj, neck, rim)), np.asarray(before))
        np.testing.assert_allclose(np.asarray(measure(xj, neck, rim)), M.shape(x, neck, rim), rtol=1e-14, atol=0)
    assert isinstance(M.shape(frames, neck, rim), np.ndarray) and M.shape(frames, neck, rim).shape == (4, 3)
    np.testing.assert_array_equal(M.shape(frames, neck, rim)[2], M.shape(frames[2], neck, rim))


def test_scene_fields_read_by_attribute_and_by_name(pouch):
    assert pouch["x"] is pouch.x and pouch.get("nothing") is None
    with pytest.raises(KeyError):
        pouch["nothing"]

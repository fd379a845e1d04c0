"""Tests of the Verlet mass-spring cloth (baselines/verlet.py, baselines/verlet_cloth.py) against a
plain-loop NumPy reference."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import meshio
import numpy as np
import pytest

from baselines import verlet as V
from tests.helpers import assert_nonzero, rel_err


# --------------------------------------------------------------------------- NumPy reference


def _offset(a, b, c):
    """Perpendicular offset of b from the line through a and c."""
    ac = c - a
    t = np.dot(b - a, ac) / np.dot(ac, ac)
    return b - a - t * ac


class NumpyCloth:
    """The specification's model (docs/spec.md §8) in plain loops, one constraint at a time.

    Gauss–Seidel: constraints are projected one after the other in the given order, each
    seeing the positions its predecessors left. ``jacobi=True`` instead lets every spring
    (then every chain) of a sweep read the positions from the start of that pass.
    """

    def __init__(self, x0, x_prev0, springs, chains, locked, iterations, jacobi=False):
        self.x = np.array(x0, dtype=np.float64)
        self.x_prev = np.array(x_prev0, dtype=np.float64)
        self.springs = [(int(a), int(b)) for a, b in springs]
        self.chains = [(int(a), int(b), int(c)) for a, b, c in chains]
        self.locked = [bool(v) for v in locked]
        self.iterations = iterations
        self.jacobi = jacobi
        self.rest = [np.linalg.norm(self.x[a] - self.x[b]) for a, b in self.springs]
        self.ratio = [np.linalg.norm(_offset(self.x[a], self.x[b], self.x[c])) / np.linalg.norm(self.x[c] - self.x[a])
                      for a, b, c in self.chains]

    def step(self, p: V.VerletParams) -> bool:
        """Advance one step; returns True (and keeps the state) if the step was not finite."""
        wind = np.asarray(p.wind, dtype=np.float64)
        acc = (wind if wind.ndim else np.array([float(wind), 0.0, 0.0])) + np.array([0.0, -p.gravity, 0.0])
        x, x_prev, n = self.x, self.x_prev, len(self.x)

        new = x.copy()
        for i in range(n):
            if not self.locked[i]:
                new[i] = x[i] + p.damping * (x[i] - x_prev[i]) + acc * p.dt * p.dt

        for _ in range(self.iterations):
            src = new.copy() if self.jacobi else new
            for (a, b), rest in zip(self.springs, self.rest):
                d = src[a] - src[b]
                length = np.linalg.norm(d)
                if length == 0.0:
                    continue
                move = 0.5 * p.stiffness * (length - rest) * d / length
                if not self.locked[a]:
                    new[a] -= move
                if not self.locked[b]:
                    new[b] += move
            src = new.copy() if self.jacobi else new
            for (a, b, c), rho in zip(self.chains, self.ratio):
                e = _offset(src[a], src[b], src[c])
                h = np.linalg.norm(e)
                if h == 0.0:
                    continue
                delta = p.bend_stiffness * (1.0 - rho * np.linalg.norm(src[c] - src[a]) / h) * e
                if not self.locked[b]:
                    new[b] -= 2.0 / 3.0 * delta
                if not self.locked[a]:
                    new[a] += delta / 3.0
                if not self.locked[c]:
                    new[c] += delta / 3.0

        prev = x.copy()
        self.bounces = 0
        for i in range(n):
            if not self.locked[i] and new[i, 1] < 0:
                vy = new[i, 1] - x[i, 1]
                new[i, 1] = -p.restitution * new[i, 1]
                prev[i, 1] = new[i, 1] - (-p.restitution * vy)
                self.bounces += 1

        if not (np.all(np.isfinite(new)) and np.all(np.isfinite(prev))):
            return True
        self.x, self.x_prev = new, prev
        return False


def _reference(cloth, state, jacobi=False):
    return NumpyCloth(state.x, state.x_prev, np.asarray(cloth.springs), np.asarray(cloth.chains),
                      np.asarray(cloth.locked), cloth.iterations, jacobi=jacobi)


def _lowered(state, dy):
    """The same state moved down by dy (to reach the floor)."""
    shift = jnp.array([0.0, dy, 0.0])
    return V.VerletState(state.x - shift, state.x_prev - shift)


# --------------------------------------------------------------------------- construction


def test_grid_matches_spec_initializer_and_topology():
    n, size = 14, 4.0
    cloth, state = V.cloth_grid()
    s = size / n
    grid = np.array([[(i - n / 2) * s, size / 2, (j - n / 2) * s] for j in range(n) for i in range(n)])
    x0 = grid + np.random.default_rng(0).normal(0, 0.01, size=grid.shape)
    np.testing.assert_array_equal(np.asarray(state.x_prev), grid)
    np.testing.assert_allclose(np.asarray(state.x), x0, rtol=0, atol=1e-15)
    assert np.flatnonzero(np.asarray(cloth.locked)).tolist() == [0, n - 1, n * (n - 1), n * n - 1]

    spec_pairs = {}
    for j in range(n):
        for i in range(n):
            idx = j * n + i
            for di, dj, kind in ((1, 0, "structural"), (0, 1, "structural"), (1, 1, "shear"),
                                 (2, 0, "bend"), (0, 2, "bend")):
                if i + di < n and j + dj < n:
                    spec_pairs[(idx, (j + dj) * n + i + di)] = kind
    springs = [tuple(r) for r in np.asarray(cloth.springs).tolist()]
    assert len(springs) == len(spec_pairs) == 869
    assert {sp: V.SPRING_KIND_NAMES[k] for sp, k in zip(springs, np.asarray(cloth.spring_kind))} == spec_pairs
    np.testing.assert_allclose(np.asarray(cloth.rest_length),
                               [np.linalg.norm(x0[a] - x0[b]) for a, b in springs], rtol=1e-14)
    assert len(cloth.chains) == 2 * n * (n - 2) == 336
    assert float(np.max(np.abs(np.asarray(cloth.chain_rest_angle) - np.pi))) < 0.5  # near-straight chains (noise bends them a little)

    # Gauss–Seidel groups are particle-disjoint, so a group's parallel update is the sequential one.
    for table, offsets in ((cloth.springs, cloth.spring_groups), (cloth.chains, cloth.chain_groups)):
        table = np.asarray(table)
        assert offsets[0] == 0 and offsets[-1] == len(table)
        for lo, hi in zip(offsets[:-1], offsets[1:]):
            members = table[lo:hi].ravel()
            assert len(set(members.tolist())) == members.size


def test_chain_projection_restores_rest_shape_and_keeps_centroid():
    rest = np.array([[0.0, 0.0, 0.0], [1.0, 0.3, 0.1], [2.1, 0.0, 0.0]])
    cloth = V.build_cloth(rest, np.zeros((0, 2)), chains=[[0, 1, 2]])
    bent = jnp.asarray(rest + np.array([[0.0, 0.1, -0.2], [0.2, -0.5, 0.4], [0.1, 0.2, 0.0]]))
    x = bent + V.chain_correction(bent, cloth.chains, cloth.chain_rest_ratio, 1.0)
    e = _offset(*np.asarray(x))
    np.testing.assert_allclose(np.linalg.norm(e) / np.linalg.norm(x[2] - x[0]),
                               float(cloth.chain_rest_ratio[0]), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(x).mean(0), np.asarray(bent).mean(0), atol=1e-15)
    # A straight rest chain is straightened.
    straight = V.build_cloth(np.array([[0.0, 0, 0], [1, 0, 0], [2, 0, 0]]), np.zeros((0, 2)), chains=[[0, 1, 2]])
    x = bent + V.chain_correction(bent, straight.chains, straight.chain_rest_ratio, 1.0)
    assert np.linalg.norm(_offset(*np.asarray(x))) < 1e-14


# --------------------------------------------------------------------------- agreement with the reference


def _floor_scene(wind):
    cloth, state = V.cloth_grid(6, iterations=6)
    state = _lowered(state, 1.9)  # cloth at y ≈ 0.1: its middle sags onto the floor
    params = V.VerletParams(stiffness=0.9, bend_stiffness=0.7, damping=0.97, gravity=0.5,
                            wind=jnp.array(wind), restitution=0.4)
    return cloth, state, params


def test_matches_numpy_reference_over_200_steps_with_floor_contact():
    cloth, state, params = _floor_scene([0.05, 0.0, 0.03])
    steps = 200
    out = V.rollout(cloth, params, state, steps)
    assert not bool(np.any(np.asarray(out.nonfinite)))
    frames = np.asarray(out.frames)

    ref = _reference(cloth, state)
    ref_params = params._replace(wind=np.asarray(params.wind))
    worst, bounces = 0.0, 0
    for t in range(steps):
        assert not ref.step(ref_params)
        bounces += ref.bounces
        worst = max(worst, float(np.max(np.abs(frames[t] - ref.x))))
    assert worst < 1e-6, worst
    assert bounces > 0, "the comparison should exercise the floor"
    np.testing.assert_allclose(np.asarray(out.state.x_prev), ref.x_prev, rtol=0, atol=1e-6)


def test_step_map_matches_numpy_reference_in_a_chaotic_regime():
    """With the wind along −z the resting contact amplifies 1e-12 differences to ~1e-3 within
    200 steps (in either implementation alone), so here each JAX step starts from the
    reference's state and the single-step maps are compared."""
    cloth, state, params = _floor_scene([0.05, 0.0, -0.03])
    ref = _reference(cloth, state)
    ref_params = params._replace(wind=np.asarray(params.wind))
    step = jax.jit(V.step)
    worst, bounces = 0.0, 0
    for _ in range(200):
        new, flag = step(cloth, params, V.VerletState(jnp.asarray(ref.x), jnp.asarray(ref.x_prev)))
        assert not ref.step(ref_params) and not bool(flag)
        bounces += ref.bounces
        worst = max(worst, float(np.max(np.abs(np.asarray(new.x) - ref.x))),
                    float(np.max(np.abs(np.asarray(new.x_prev) - ref.x_prev))))
    assert worst < 1e-12, worst
    assert bounces > 0


def test_jacobi_mode_matches_numpy_reference():
    cloth, state = V.cloth_grid(5, iterations=4, solver="jacobi")
    assert cloth.spring_groups == (0, len(cloth.springs))
    params = V.VerletParams(stiffness=0.3, bend_stiffness=0.2, wind=0.1)
    out = V.rollout(cloth, params, state, 40)
    ref = _reference(cloth, state, jacobi=True)
    for t in range(40):
        ref.step(params)
        np.testing.assert_allclose(np.asarray(out.frames[t]), ref.x, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------- gradients


def test_rollout_gradients_match_central_differences():
    cloth, state = V.cloth_grid(6, iterations=6)
    params = V.VerletParams(stiffness=0.8, bend_stiffness=0.5, damping=0.97, gravity=0.3, wind=0.05)
    weights = jnp.asarray(np.random.default_rng(1).normal(size=(36, 3)))
    steps = 30

    def loss(p):
        x = V.rollout(cloth, p, state, steps).state.x
        return jnp.sum(weights * x) + 10.0 * V.sag(x, 6)

    assert float(jnp.min(V.rollout(cloth, params, state, steps).frames[..., 1])) > 1.0  # no floor contact
    grads = jax.jit(jax.grad(loss))(params)
    loss_jit = jax.jit(loss)
    h = 1e-5  # FD error is round-off dominated below this (2e-7 relative at h = 1e-6)
    for name in ("stiffness", "damping", "gravity", "bend_stiffness", "wind", "dt"):
        v = getattr(params, name)
        fd = (float(loss_jit(params._replace(**{name: v + h}))) -
              float(loss_jit(params._replace(**{name: v - h})))) / (2 * h)
        g = float(getattr(grads, name))
        assert_nonzero(g, f"d loss / d {name}")
        assert rel_err(g, fd) < 1e-6, (name, g, fd)


# --------------------------------------------------------------------------- guard, floor, locks


def test_nan_guard_keeps_last_finite_state_and_flags():
    cloth, state = V.cloth_grid(5, iterations=3)
    params = V.VerletParams()
    good = V.rollout(cloth, params, state, 10)
    assert not bool(np.any(np.asarray(good.nonfinite)))
    step = jax.jit(V.step)
    for bad in (params._replace(gravity=jnp.inf), params._replace(wind=jnp.nan)):
        new, flag = step(cloth, bad, good.state)
        assert bool(flag)
        np.testing.assert_array_equal(np.asarray(new.x), np.asarray(good.state.x))
        np.testing.assert_array_equal(np.asarray(new.x_prev), np.asarray(good.state.x_prev))
    out = V.rollout(cloth, params._replace(wind=jnp.nan), good.state, 10)
    assert np.all(np.asarray(out.nonfinite))
    np.testing.assert_array_equal(np.asarray(out.state.x), np.asarray(good.state.x))


@pytest.mark.parametrize("restitution", [0.5, 0.0])
def test_free_particle_reflects_off_floor(restitution):
    cloth = V.build_cloth(np.array([[0.3, 1.0, -0.2]]), np.zeros((0, 2)))
    params = V.VerletParams(damping=1.0, gravity=9.81, dt=0.05, restitution=restitution)
    state = V.VerletState(jnp.array([[0.3, 1.0, -0.2]]), jnp.array([[0.29, 1.0, -0.19]]))
    step = jax.jit(V.step)
    bounces = 0
    for _ in range(60):
        x, xp = np.asarray(state.x)[0], np.asarray(state.x_prev)[0]
        pred = x + (x - xp) + np.array([0.0, -9.81, 0.0]) * 0.05 ** 2  # free flight, undamped
        state, flag = step(cloth, params, state)
        assert not bool(flag)
        xn, xpn = np.asarray(state.x)[0], np.asarray(state.x_prev)[0]
        assert xn[1] >= 0.0
        np.testing.assert_allclose(xn[[0, 2]], pred[[0, 2]], atol=1e-14)  # tangential motion untouched
        if pred[1] < 0:
            bounces += 1
            v_old = pred[1] - x[1]
            np.testing.assert_allclose(xn[1], -restitution * pred[1], atol=1e-14)
            np.testing.assert_allclose(xn[1] - xpn[1], -restitution * v_old, atol=1e-14)
        else:
            np.testing.assert_allclose(xn[1], pred[1], atol=1e-14)
    assert bounces >= 1


def test_locked_corners_never_move():
    cloth, state = V.cloth_grid(8, iterations=6)
    state = _lowered(state, 1.7)
    params = V.VerletParams(gravity=2.0, wind=jnp.array([0.4, 0.0, 0.2]), restitution=0.6)
    out = V.rollout(cloth, params, state, 1000, 100)
    corners = V.grid_corners(8)
    x0 = np.asarray(state.x)[corners]
    for frame in np.asarray(out.frames):
        np.testing.assert_array_equal(frame[corners], x0)
    np.testing.assert_array_equal(np.asarray(out.state.x_prev)[corners], x0)
    assert float(np.min(np.asarray(out.frames)[..., 1])) >= 0.0
    assert not bool(np.any(np.asarray(out.nonfinite)))


def test_rollout_does_not_recompile_for_new_parameter_values():
    cloth, state = V.cloth_grid(4, iterations=2)
    V.rollout(cloth, V.VerletParams(), state, 5)
    before = V.rollout._cache_size()
    V.rollout(cloth, V.VerletParams(stiffness=0.7, gravity=0.2, damping=0.9), state, 5)
    assert V.rollout._cache_size() == before


# --------------------------------------------------------------------------- fitting and CLI


def test_fit_stiffness_recovers_known_stiffness():
    from fitting.fit import FitResult

    cloth, state = V.cloth_grid(8, iterations=8)
    params = V.VerletParams(damping=0.8)  # settles within the 60-step rollout
    target = float(V.sag(V.rollout(cloth, params._replace(stiffness=0.5), state, 60).state.x, 8))
    fit = V.fit_stiffness(target, cloth, state, params, steps=60, n_iter=20, init_stiffness=1.0)
    assert isinstance(fit, FitResult)  # fitting's loop and result type
    loss = [h.loss for h in fit.history]
    assert len(loss) == 21 and fit.history[0].params["stiffness"] == pytest.approx(1.0)
    assert min(loss) < 1e-3 * loss[0], loss
    assert abs(float(fit.params.stiffness) - 0.5) < 0.05, fit.params.stiffness
    assert fit.params.damping == 0.8


def test_main_writes_readable_mesh_sequence(tmp_path, capsys):
    from jobs.cli import main

    out = tmp_path / "run"
    argv = ["verlet", "--n-grid", "5", "--steps", "12", "--save-every", "5", "--iterations", "4"]
    assert main(argv + ["--out", str(out)]) == 0
    files = sorted(os.listdir(out))
    assert files == [f"verlet_{n:06d}.vtu" for n in (0, 5, 10, 12)]
    _, state = V.cloth_grid(5)
    meshes = [meshio.read(out / f) for f in files]
    np.testing.assert_allclose(meshes[0].points, np.asarray(state.x))
    for m in meshes:
        assert m.points.shape == (25, 3) and np.all(np.isfinite(m.points))
        np.testing.assert_array_equal(m.cells_dict["triangle"], V.grid_triangles(5))
    assert not np.allclose(meshes[-1].points, meshes[0].points)
    text = capsys.readouterr().out
    assert "final sag" in text and "no events" in text

    assert main(argv + ["--out", str(tmp_path / "obj"), "--format", "obj"]) == 0
    assert meshio.read(tmp_path / "obj" / "verlet_000012.obj").points.shape == (25, 3)

    assert main(argv + ["--out", str(tmp_path / "bad"), "--gravity", "inf"]) == 1
    assert "NaN/Inf guard: 12 step(s)" in capsys.readouterr().err

"""Verlet mass-spring cloth (Jakobsen 2001; toxiclibs VerletPhysics3D) as a differentiable JAX model.

The fast, position-based baseline beside IPC. One timestep, in the order data flows:

    damped Verlet prediction  x̃ = x + (1 − d)(x − x_prev) + a·dt²,   a = (w, −g, 0)
    -> `iterations` Gauss–Seidel sweeps (graph-coloured, so each colour is one vector op):
       springs ±(k/2)(|Δ| − L)Δ̂, then 3-particle bending chains (perpendicular-offset projection)
    -> floor y ≥ 0 with restitution
    -> NaN/Inf guard (a non-finite step keeps the last finite state and reports it)

Data is split the MJX way: `VerletCloth` holds topology and rest data (index arrays,
rest lengths, rest chain shapes, locked mask; `n_grid` and `iterations` are static and
recompile when changed); `VerletParams` holds the differentiable scalars; `VerletState`
holds (x, x_prev) (these types and the cloth's construction: baselines/verlet_cloth.py).
Units are the reference's scene units (length) and steps; ``dt`` is the step length in the
same time unit as ``gravity`` (length/time²).

Parameter convention. ``damping`` is the fraction of velocity *kept* per step, as in the
specification's cloth (docs/spec.md §8: ``damping = 0.98``); its damping loss is
d = 1 − damping = 0.02, and the undamped form 2x − x_prev + a·dt² is ``damping = 1`` (d = 0).

Reference: T. Jakobsen, "Advanced Character Physics", GDC 2001; K. Schmidt,
toxiclibs.physics VerletPhysics3D (2008); docs/spec.md §8 (the Verlet cloth baseline).
"""
from __future__ import annotations

import os
import sys
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import ipcjax  # noqa: F401  (enables float64, as when this module lived in ipcjax/)
from baselines.verlet_cloth import (  # the cloth's data and construction, also imported from here
    DEFAULT_DT, PARAM_HELP, SPRING_BEND, SPRING_KIND_NAMES, SPRING_SHEAR, SPRING_STRUCTURAL, VerletCloth,
    VerletParams, VerletState, build_cloth, cloth_grid, colour_groups, grid_corners, grid_index,
    grid_topology, grid_triangles)


class Rollout(NamedTuple):
    """Result of `rollout`: final state, saved frames (F, N, 3) and a per-step non-finite flag (steps,)."""

    state: VerletState
    frames: jax.Array
    nonfinite: jax.Array


# --------------------------------------------------------------------------- one step


def acceleration(params: VerletParams) -> jax.Array:
    """(3,) a = wind + (0, −g, 0); a scalar wind acts along +x."""
    wind = jnp.asarray(params.wind, dtype=float)
    wind = wind * jnp.array([1.0, 0.0, 0.0]) if wind.ndim == 0 else wind
    return wind + jnp.array([0.0, -1.0, 0.0]) * params.gravity


def predict(cloth: VerletCloth, params: VerletParams, state: VerletState) -> jax.Array:
    """Damped Verlet prediction x̃ = x + damping·(x − x_prev) + a·dt²; locked particles stay at x."""
    x, x_prev = state
    x_new = x + params.damping * (x - x_prev) + acceleration(params) * params.dt ** 2
    return jnp.where(cloth.locked[:, None], x, x_new)


def _safe_norm(v):
    """(|v|, |v| > 0) row-wise, with a NaN-free gradient at v = 0 (double-where)."""
    sq = jnp.sum(v * v, axis=-1)
    nz = sq > 0
    return jnp.where(nz, jnp.sqrt(jnp.where(nz, sq, 1.0)), 0.0), nz


def spring_correction(x, springs, rest_length, stiffness, valid=None):
    """(N, 3) displacement of one group of springs, all evaluated at the same x.

    For spring (a, b) with Δ = x_a − x_b: x_a −= (k/2)(|Δ| − L) Δ̂ and x_b += the same,
    summed per particle (a single term per particle in a Gauss–Seidel colour). A zero-length spring
    (direction undefined) and rows with ``valid`` False contribute nothing.
    """
    delta = x[springs[:, 0]] - x[springs[:, 1]]
    length, nz = _safe_norm(delta)
    scale = jnp.where(nz, (length - rest_length) / jnp.where(nz, length, 1.0), 0.0)
    if valid is not None:
        scale = jnp.where(valid, scale, 0.0)
    move = 0.5 * stiffness * scale[:, None] * delta
    return jnp.zeros_like(x).at[springs[:, 0]].add(-move).at[springs[:, 1]].add(move)


def chain_correction(x, chains, rest_ratio, bend_stiffness, valid=None):
    """(N, 3) displacement of one group of bending chains (perpendicular-offset projection).

    For chain (a, b, c): e = b − a − t(c − a), t = (b − a)·(c − a)/|c − a|², is b's offset
    from the line ac; its target length is h* = ρ₀|c − a| (ρ₀ = rest offset/base, 0 for a
    straight chain), which restores the rest angle at b when b's foot keeps its rest t.
    With δ = (1 − h*/|e|) e: b −= (2/3)k_b δ, a and c += (1/3)k_b δ each, which keeps the
    centroid and, for k_b = 1, sets |e| = h* exactly. |e| = 0, a = c and rows with ``valid``
    False contribute nothing.
    """
    xa, xb, xc = x[chains[:, 0]], x[chains[:, 1]], x[chains[:, 2]]
    ac = xc - xa
    base, has_base = _safe_norm(ac)
    t = jnp.sum((xb - xa) * ac, axis=1) / jnp.where(has_base, base * base, 1.0)
    e = xb - xa - t[:, None] * ac
    h, nz = _safe_norm(e)
    nz = nz & has_base
    scale = jnp.where(nz, 1.0 - rest_ratio * base / jnp.where(nz, h, 1.0), 0.0)
    if valid is not None:
        scale = jnp.where(valid, scale, 0.0)
    delta = bend_stiffness * scale[:, None] * e
    corr = jnp.zeros_like(x).at[chains[:, 1]].add(-(2.0 / 3.0) * delta)
    return corr.at[chains[:, 0]].add(delta / 3.0).at[chains[:, 2]].add(delta / 3.0)


def _padded_groups(offsets: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Static (G, M) gather index into group-sorted constraints and its validity mask.

    Group g holds rows offsets[g]:offsets[g+1]; short groups are padded with row 0 and
    masked, so a sweep is one lax.scan over groups (compile time independent of G).
    """
    sizes = np.diff(np.asarray(offsets, dtype=np.int64))
    width = int(sizes.max()) if sizes.size else 0
    index = np.zeros((sizes.size, width), np.int32)
    valid = np.zeros((sizes.size, width), bool)
    for g, (lo, n) in enumerate(zip(offsets[:-1], sizes)):
        index[g, :n] = np.arange(lo, lo + n)
        valid[g, :n] = True
    return index, valid


def relax(cloth: VerletCloth, params: VerletParams, x: jax.Array) -> jax.Array:
    """``cloth.iterations`` sweeps; a sweep visits the spring groups, then the chain groups, in order.

    Inside a group every constraint sees the same x (particle-disjoint under Gauss–Seidel,
    so this is exactly the sequential sweep). Locked particles drop their share of every
    correction (the specification's cloth re-pins them).
    """
    free = (~cloth.locked)[:, None]
    s_index, s_valid = _padded_groups(cloth.spring_groups)
    c_index, c_valid = _padded_groups(cloth.chain_groups)
    springs, rest = cloth.springs[s_index], cloth.rest_length[s_index]
    chains, ratio = cloth.chains[c_index], cloth.chain_rest_ratio[c_index]

    def spring_group(x, group):
        pairs, length, valid = group
        dx = spring_correction(x, pairs, length, params.stiffness, valid)
        return x + jnp.where(free, dx, 0.0), None

    def chain_group(x, group):
        triples, rho, valid = group
        dx = chain_correction(x, triples, rho, params.bend_stiffness, valid)
        return x + jnp.where(free, dx, 0.0), None

    def sweep(x, _):
        if s_index.size:
            x, _ = jax.lax.scan(spring_group, x, (springs, rest, jnp.asarray(s_valid)))
        if c_index.size:
            x, _ = jax.lax.scan(chain_group, x, (chains, ratio, jnp.asarray(c_valid)))
        return x, None

    x, _ = jax.lax.scan(sweep, x, None, length=cloth.iterations)
    return x


def collide_floor(cloth: VerletCloth, params: VerletParams, x: jax.Array, x_old: jax.Array):
    """Floor y ≥ 0 for free particles: y ← −e·y and v_y ← −e·v_y with v = x − x_old.

    Returns (x, x_prev) where x_prev = x_old except below the floor, where its y is set so
    the implied next velocity is the reflected one: x_prev_y = −e·y − (−e·v_y). For e = 0
    this is the specification's clamp to y = 0 with zero normal velocity.
    """
    e = params.restitution
    y, vy = x[:, 1], x[:, 1] - x_old[:, 1]
    hit = (y < 0) & ~cloth.locked
    y_new = jnp.where(hit, -e * y, y)
    yprev_new = jnp.where(hit, y_new + e * vy, x_old[:, 1])
    return x.at[:, 1].set(y_new), x_old.at[:, 1].set(yprev_new)


def step(cloth: VerletCloth, params: VerletParams, state: VerletState):
    """One timestep: predict, relax, floor, NaN/Inf guard.

    Returns (state, nonfinite): if any coordinate of the new (x, x_prev) is not finite, the
    input state is returned unchanged and ``nonfinite`` (bool scalar) is True.
    """
    x_new = relax(cloth, params, predict(cloth, params, state))
    x_new, x_prev_new = collide_floor(cloth, params, x_new, state.x)
    ok = jnp.all(jnp.isfinite(x_new)) & jnp.all(jnp.isfinite(x_prev_new))
    return VerletState(jnp.where(ok, x_new, state.x), jnp.where(ok, x_prev_new, state.x_prev)), ~ok


def _rollout(cloth: VerletCloth, params: VerletParams, state: VerletState, steps: int,
             save_every: int = 1) -> Rollout:
    """Run ``steps`` steps with lax.scan (jitted as `rollout`; ``steps``/``save_every`` are static).

    Returns Rollout(state, frames, nonfinite): frames (steps // save_every, N, 3) are x after
    steps save_every, 2·save_every, …; nonfinite (steps,) flags the guard per step.
    Differentiable with respect to ``params`` and ``state`` (reverse mode through the scans).
    """
    n_frames, remainder = divmod(steps, save_every)

    def one(s, _):
        return step(cloth, params, s)

    def block(s, _):
        s, bad = jax.lax.scan(one, s, None, length=save_every)
        return s, (s.x, bad)

    state, (frames, bad) = jax.lax.scan(block, state, None, length=n_frames)
    bad = bad.reshape(-1)
    if remainder:
        state, bad_tail = jax.lax.scan(one, state, None, length=remainder)
        bad = jnp.concatenate([bad, bad_tail])
    return Rollout(state, frames, bad)


rollout = jax.jit(_rollout, static_argnames=("steps", "save_every"))


# --------------------------------------------------------------------------- measurements and fitting


def sag(x: jax.Array, n_grid: int) -> jax.Array:
    """Drop of the centre node (n/2, n/2) below the mean height of the four corners (length)."""
    corners = grid_corners(n_grid)
    centre = grid_index(n_grid // 2, n_grid // 2, n_grid)
    return jnp.mean(x[corners, 1]) - x[centre, 1]


def fit_stiffness(target_sag: float, cloth: VerletCloth | None = None, state: VerletState | None = None,
                  params: VerletParams | None = None, *, steps: int = 150, n_iter: int = 30,
                  learning_rate: float = 0.1, init_stiffness: float | None = None,
                  optimizer=None, progress: bool = False):
    """Fit the spring stiffness so the cloth's sag after ``steps`` steps matches ``target_sag``.

    The loss L(k) = ((sag(x_steps; k) − target)/target)² is minimised over log k (k stays
    positive) by :func:`fitting.fit.fit` with ``optimizer`` (default
    ``optax.adam(learning_rate, b1=0.5)``: the lower momentum stops the 1-D fit from
    overshooting): ``n_iter`` updates, ``n_iter + 1`` evaluations. Other parameters are
    held at ``params``; a step that the NaN/Inf guard catches stops the fit
    (:class:`fitting.fit.FitFailed`).

    Args:
        target_sag: length. cloth/state: default ``cloth_grid()``. params: default
        ``VerletParams()``. steps: rollout length (use enough to settle, see docs).
        init_stiffness: starting k (default params.stiffness). optimizer: any optax
        GradientTransformation. progress: a progress bar.
    Returns:
        :class:`fitting.fit.FitResult`: ``params`` (the evaluated iterate with the lowest
        loss), ``history`` (one :class:`fitting.fit.FitIterate` per evaluation: loss,
        grad_norm, wall_s, params {"stiffness": k}).
    """
    import optax

    from fitting.fit import fit
    from ipcjax.result import StepCode

    if (cloth is None) != (state is None):
        raise ValueError("pass both cloth and state, or neither (the default cloth_grid())")
    if cloth is None:
        cloth, state = cloth_grid()
    if not target_sag:
        raise ValueError("target_sag must be non-zero (the loss is relative to it)")
    if cloth.n_grid < 2:
        raise ValueError("fit_stiffness needs a grid cloth (n_grid >= 2) for the sag probe")
    params = VerletParams() if params is None else params
    k0 = params.stiffness if init_stiffness is None else init_stiffness
    params = params._replace(stiffness=float(k0))

    def simulate(p):
        out = rollout(cloth, p, state, steps)
        return out.state.x[None], out.nonfinite.astype(jnp.int32) * int(StepCode.NON_FINITE)

    measure = lambda frames: sag(frames[-1], cloth.n_grid)
    opt = optax.adam(learning_rate, b1=0.5) if optimizer is None else optimizer
    return fit(simulate, measure, float(target_sag), params, ["stiffness"], optimizer=opt,
               iterations=n_iter + 1, loss_tol=0.0, progress=progress)


# --------------------------------------------------------------------------- run (``ipcjax verlet``)


def write_frames(out: str, frames, triangles, steps, *, fmt: str = "vtu") -> list[str]:
    """Write one meshio triangle mesh per frame, ``verlet_{step:06d}.{fmt}``, into ``out``; returns the paths."""
    import meshio

    os.makedirs(out, exist_ok=True)
    paths = []
    for x, n in zip(np.asarray(frames, dtype=np.float64), steps):
        path = os.path.join(out, f"verlet_{int(n):06d}.{fmt}")
        meshio.write(path, meshio.Mesh(points=x, cells=[("triangle", triangles)]))
        paths.append(path)
    return paths


def run_cloth(out: str, cloth: VerletCloth, state: VerletState, params: VerletParams, *, steps: int,
              save_every: int, fmt: str = "vtu") -> int:
    """What ``ipcjax verlet`` does: simulate ``steps`` steps, write every ``save_every``-th
    frame (and the last) as ``verlet_{step:06d}.{fmt}`` into ``out``, print a summary.

    Returns 0, or 1 if the NaN/Inf guard fired (the frames are still written).
    """
    t0 = time.perf_counter()
    result = rollout(cloth, params, state, steps, save_every)
    jax.block_until_ready(result)
    elapsed = time.perf_counter() - t0
    frames = np.concatenate([np.asarray(state.x)[None], np.asarray(result.frames)])
    saved_steps = [0] + [save_every * (f + 1) for f in range(len(result.frames))]
    if steps % save_every:
        frames = np.concatenate([frames, np.asarray(result.state.x)[None]])
        saved_steps.append(steps)
    paths = write_frames(out, frames, grid_triangles(cloth.n_grid), saved_steps, fmt=fmt)

    bad = np.flatnonzero(np.asarray(result.nonfinite))
    x_final = np.asarray(result.state.x)
    print(f"verlet: {cloth.n_particles} particles, {len(cloth.springs)} springs, {len(cloth.chains)} chains, "
          f"{steps} steps in {elapsed:.2f} s (incl. compile)")
    print(f"wrote {len(paths)} frames to {out}/ ({os.path.basename(paths[0])} .. {os.path.basename(paths[-1])})")
    print(f"final sag {float(sag(x_final, cloth.n_grid)):.6f}, lowest y {x_final[:, 1].min():.6f}")
    if bad.size:
        print(f"NaN/Inf guard: {bad.size} step(s) kept the last finite state (first at step {bad[0] + 1})",
              file=sys.stderr)
        return 1
    print("NaN/Inf guard: no events")
    return 0

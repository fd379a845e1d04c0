"""Rollout gradient error against the Newton tolerance, on two film layers sliding with friction.

    python3 -m benchmarks.gradient_tolerance [--steps 6] [--tolerances 1.2e-5 1e-6 ... 1e-11]

The scene is `scenes/layers.py` (film-on-film and film-on-floor friction, a generic start).
For each tolerance the gradient of a random linear loss Σ W·x_T over the last frame is
taken with respect to E, μf, kθ (bending_scale), x₀ and v₀. Every row is solved at its
stated tolerance: the rollout is built with ``tolerance=None``, so no row is clamped to
the library's 1e-9 m differentiation default, and the tolerance is a traced leaf of the
controls (one compilation serves every row).

No row is taken as the truth. The reference is the gradients' own convergence sequence:
each row's error is its relative difference from the next tighter row, |g_k − g_{k+1}| /
|g_{k+1}| per parameter (for x₀ and v₀ the relative norm of the difference). Where the
differences fall with the tolerance the sequence converges, and the last difference
bounds the error of the rows below it. A row whose solve fails (the iteration cap, say)
is printed as failed and left out of the sequence, instead of ending the run.

The iteration column is the largest Newton iteration count of a step of that row's own
forward rollout: each step's solve is replayed from the rollout's own (unrounded) frames
with :func:`ipcjax.step.solve_positions`, so it is the same solve, not a host run with
other settings. Prints a Markdown table, the forward and gradient wall time per row, and
the machine it ran on.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

import ipcjax  # noqa: F401
from ipcjax.implicit import RolloutFailed, make_rollout, rollout_failure, stack_controls
from ipcjax.model import Config, Controls, Params
from ipcjax.problem import StepInputs
from ipcjax.step import solve_positions
from scenes.layers import layers_scene

NAMES = ("youngs_modulus", "friction", "bending_scale")
DT = 1 / 240


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, jax {jax.__version__}, numpy {np.__version__}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tolerances", type=float, nargs="+", default=[1.2e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-11],
                    help="Newton tolerances in m, loosest first (each row is compared with the next)")
    ap.add_argument("--max-newton", type=int, default=600)
    args = ap.parse_args(argv)
    tols = sorted(args.tolerances, reverse=True)

    sc = layers_scene()
    m = sc["model"]
    config = Config(max_newton=args.max_newton)
    x0, v0 = jnp.asarray(sc["x"]), jnp.asarray(sc["v"])
    W = jnp.asarray(np.random.default_rng(0).normal(size=x0.shape))
    p0 = Params.film_defaults()
    roll = make_rollout(m, config, round_fp32=False, tolerance=None)   # every row at its own tolerance

    def controls(tol):
        ctl = stack_controls([Controls.empty(m.n_particles, tolerance=1.0)] * args.steps)
        return ctl._replace(tolerance=jnp.full((args.steps,), tol))

    def loss(p, x0, v0, tol):
        return jnp.sum(W * roll(p, x0, v0, controls(tol), DT)[0][-1])

    roll(p0, x0, v0, controls(tols[0]), DT)  # size the capacity outside jit
    fwd = jax.jit(loss)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    frames_of = jax.jit(lambda tol: roll(p0, x0, v0, controls(tol), DT)[:2])
    solve = jax.jit(lambda x, v, tol: solve_positions(m, StepInputs(p0, x, v, Controls.empty(m.n_particles)._replace(
        tolerance=tol), jnp.asarray(DT)), config, roll.capacity)[3].iterations)
    t0 = time.perf_counter()
    grad(p0, x0, v0, tols[0]).__repr__()
    compile_s = time.perf_counter() - t0

    rows = []
    for tol in tols:
        try:
            t0 = time.perf_counter(); jax.block_until_ready(fwd(p0, x0, v0, tol)); tf = time.perf_counter() - t0
            t0 = time.perf_counter(); g = jax.block_until_ready(grad(p0, x0, v0, tol)); tg = time.perf_counter() - t0
        except Exception as exc:  # a failed row is reported, not fatal
            failure = rollout_failure(exc)
            if not isinstance(failure, RolloutFailed):
                raise
            rows.append((tol, None, str(failure), None, None))
            continue
        frames, vels = frames_of(tol)
        xs = [x0] + list(frames[:-1]); vs = [v0] + list(vels[:-1])
        iters = max(int(solve(x, v, tol)) for x, v in zip(xs, vs))
        rows.append((tol, g, iters, tf, tg))

    rel = lambda a, b: float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))
    print(f"two film layers, {m.n_particles} particles, {args.steps} steps of 1/240 s, max_newton "
          f"{args.max_newton}, each row solved at its own tolerance; first call (compile) {compile_s:.0f} s")
    print(f"machine: {_machine()}\n")
    print("| tolerance, m | E | μf | kθ | x₀ | v₀ | most Newton iterations in a step | forward s | gradient s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ok = [r for r in rows if r[1] is not None]
    for tol, g, iters, tf, tg in rows:
        if g is None:
            print(f"| {tol:g} | failed: {iters} | | | | | | | |")
            continue
        nxt = next((r for r in ok if r[0] < tol), None)
        if nxt is None:
            errs = "| — " * 5
        else:
            gn = nxt[1]
            e = [rel(getattr(g[0], n), getattr(gn[0], n)) for n in NAMES] + [rel(g[1], gn[1]), rel(g[2], gn[2])]
            errs = "".join(f"| {x:.1e} " for x in e)
        print(f"| {tol:g} {errs}| {iters} | {tf:.2f} | {tg:.2f} |")
    print("\nerror: relative difference from the next tighter row (the last row has none)")
    if ok:
        ref = ok[-1][1]
        print(f"tightest row ({ok[-1][0]:g} m): " + ", ".join(f"{n} {float(getattr(ref[0], n)):.6e}" for n in NAMES))


if __name__ == "__main__":
    main()

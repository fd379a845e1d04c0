"""Rollout gradient error against the Newton tolerance, on two film layers sliding with friction.

    python3 -m benchmarks.gradient_tolerance [--steps 6] [--tolerances 1.2e-5 1e-6 ...]

The scene is `scenes/layers.py` (film-on-film and film-on-floor friction, a generic start).
For each tolerance the gradient of a random linear loss Σ W·x_T over the last frame is
taken with respect to E, μf, kθ (bending_scale), x₀ and v₀, and compared with the gradient
at the reference tolerance (1e-12 m, the last one): relative error |g − g_ref| / |g_ref|
per parameter, and ‖g − g_ref‖ / ‖g_ref‖ for x₀ and v₀. The tolerance is a traced leaf of
the controls, so one compilation serves every row. Prints a Markdown table, the forward
and gradient wall time per row, and the largest Newton iteration count a step needed.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import ipcjax  # noqa: F401
from ipcjax.implicit import make_rollout, stack_controls
from ipcjax.model import Config, Controls, Params
from ipcjax.step import make_state, simulate
from scenes.layers import layers_scene

NAMES = ("youngs_modulus", "friction", "bending_scale")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tolerances", type=float, nargs="+", default=[1.2e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-12])
    ap.add_argument("--max-newton", type=int, default=600)
    args = ap.parse_args(argv)

    sc = layers_scene()
    m = sc["model"]
    config = Config(max_newton=args.max_newton)
    x0, v0 = jnp.asarray(sc["x"]), jnp.asarray(sc["v"])
    W = jnp.asarray(np.random.default_rng(0).normal(size=x0.shape))
    p0 = Params.film_defaults()
    # iterations per step at each tolerance, from the host driver
    iters = {}
    for tol in args.tolerances:
        ctl = Controls.empty(m.n_particles, tolerance=tol)
        _, _, reps = simulate(m, p0, make_state(sc["x"], sc["v"]), ctl, args.steps, dt=1 / 240, config=config)
        iters[tol] = max(r.iterations for r in reps)
    roll = make_rollout(m, config, round_fp32=False)

    def loss(p, x0, v0, tol):
        ctl = stack_controls([Controls.empty(m.n_particles, tolerance=1.0)] * args.steps)
        ctl = ctl._replace(tolerance=jnp.full((args.steps,), tol))
        return jnp.sum(W * roll(p, x0, v0, ctl, 1 / 240)[0][-1])

    roll(p0, x0, v0, stack_controls([Controls.empty(m.n_particles, tolerance=args.tolerances[0])] * args.steps),
         1 / 240)  # size the capacity outside jit
    fwd = jax.jit(loss)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    t0 = time.perf_counter()
    grad(p0, x0, v0, 1.0e-3).__repr__()
    compile_s = time.perf_counter() - t0
    rows = []
    for tol in args.tolerances:
        t0 = time.perf_counter(); jax.block_until_ready(fwd(p0, x0, v0, tol)); tf = time.perf_counter() - t0
        t0 = time.perf_counter(); g = jax.block_until_ready(grad(p0, x0, v0, tol)); tg = time.perf_counter() - t0
        rows.append((tol, g, tf, tg))
    ref = rows[-1][1]
    rel = lambda a, b: float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))
    print(f"two film layers, {m.n_particles} particles, {args.steps} steps of 1/240 s, max_newton "
          f"{args.max_newton}; reference tolerance {args.tolerances[-1]:g} m; first call (compile) {compile_s:.0f} s\n")
    print("| tolerance, m | E | μf | kθ | x₀ | v₀ | most Newton iterations in a step | forward s | gradient s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for tol, g, tf, tg in rows:
        errs = [rel(getattr(g[0], n), getattr(ref[0], n)) for n in NAMES] + [rel(g[1], ref[1]), rel(g[2], ref[2])]
        print(f"| {tol:g} | " + " | ".join(f"{e:.1e}" for e in errs) + f" | {iters[tol]} | {tf:.2f} | {tg:.2f} |")
    print("\nreference gradient: " + ", ".join(f"{n} {float(getattr(ref[0], n)):.4e}" for n in NAMES))


if __name__ == "__main__":
    main()

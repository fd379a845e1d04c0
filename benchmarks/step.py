"""Per-step and per-Newton-iteration time by phase, beside the bare dense Cholesky of the same size.

    python3 benchmarks/step.py [--n 22] [--steps 30] [--repeat 7]

Scene: an n×n film (22×22 = 484 vertices, the bag's size) draped with friction over a
fixed sphere and a floor, run until contacts are established; then each phase of one
Newton iteration is timed separately on that state (jitted, median of --repeat runs):
candidates (swept query + stencils), assembly (∇Φ and the PSD Hessian), factorization
(equilibrated Cholesky solve), line search (Φ evaluations of one Armijo loop). The bare
dense Cholesky (jax.scipy.linalg.cho_factor of an SPD matrix of the same size) is timed
in the same run, and every figure is printed as a ratio to it. Prints JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

import ipcjax  # noqa: F401
from benchmarks.timing import median_time
from ipcjax.model import Config, Controls, Params
from ipcjax.newton import armijo, newton_direction, query_contacts, step_bound
from ipcjax.potential import StepContext, friction_set, gradient_and_hessian, incremental_potential
from ipcjax.step import simulate, make_state, step
from scenes.film import drape_scene



def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=22)
    ap.add_argument("--steps", type=int, default=30, help="settling steps before timing")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)

    sc = drape_scene(n=args.n, size=0.1, sphere_radius=0.025, gap=1.5e-3, floor=True)
    model, cfg, params = sc["model"], Config(), Params.film_defaults()
    ctl = Controls.empty(model.n_particles, tolerance=1.2e-5)
    dt = 1.0 / 240.0
    t0 = time.perf_counter()
    frames, _, reps = simulate(model, params, make_state(sc["x"]), ctl, args.steps, dt, cfg)
    settle_wall = time.perf_counter() - t0
    cap = reps[-1].capacity
    st = make_state(frames[-1])

    # whole step (median over repeats of the same step)
    t_step = median_time(lambda: step(model, params, st, ctl, dt, config=cfg, capacity=cap), args.repeat)
    _, info = step(model, params, st, ctl, dt, config=cfg, capacity=cap)
    n_iter = int(info.iterations)

    x = jnp.asarray(frames[-1], jnp.float64)
    cs, _ = query_contacts(x, x, model, cfg, cap)
    y = x + dt * dt * params.gravity
    ctx = StepContext(x0=x, y=y, dt=jnp.asarray(dt), friction=friction_set(x, cs, model.radius, params, cfg))
    gh = jax.jit(lambda x: gradient_and_hessian(x, model, params, ctl, ctx, cs, cfg))
    g, H = gh(x)
    nd = jax.jit(newton_direction)
    dxf, _ = nd(g, H)
    dx = jnp.zeros_like(x).at[model.free_particles].set(dxf.reshape(-1, 3))
    cand = jax.jit(lambda x, dx: query_contacts(x, x + dx, model, cfg, cap))

    @jax.jit
    def line_search(x, dx):
        a0 = step_bound(x, dx, cs, model.radius, cfg)
        phi = lambda z: incremental_potential(z, model, params, ctl, ctx, cs, cfg)
        return armijo(phi, x, dx, phi(x), jnp.dot(g, dxf), a0, cfg)

    t_cand = median_time(lambda: cand(x, dx), args.repeat)
    t_asm = median_time(lambda: gh(x), args.repeat)
    t_fact = median_time(lambda: nd(g, H), args.repeat)
    t_ls = median_time(lambda: line_search(x, dx), args.repeat)

    n3 = H.shape[0]
    rng = np.random.default_rng(0)
    A = rng.normal(size=(n3, n3))
    spd = jnp.asarray(A @ A.T / n3 + np.eye(n3))
    chol = jax.jit(lambda M: jsl.cho_factor(M, lower=True)[0])
    t_chol = median_time(lambda: chol(spd), args.repeat)
    t_iter = t_cand + t_asm + t_fact + t_ls
    out = dict(
        machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {jax.devices()[0].platform}",
        particles=model.n_particles, free_dofs=n3, candidates=dict(vt=int(info.n_vt), ee=int(info.n_ee), sf=int(info.n_sf)),
        settle_steps=args.steps, settle_wall_s=settle_wall, newton_iterations_last_step=n_iter,
        seconds=dict(bare_cholesky=t_chol, candidates=t_cand, assembly=t_asm, factorization=t_fact,
                     line_search=t_ls, iteration=t_iter, step=t_step),
        ratio_to_bare_cholesky=dict(candidates=t_cand / t_chol, assembly=t_asm / t_chol,
                                    factorization=t_fact / t_chol, line_search=t_ls / t_chol,
                                    iteration=t_iter / t_chol, step=t_step / t_chol),
    )
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

"""Per-step and per-Newton-iteration time by phase, beside the bare dense Cholesky of the same size.

    python3 benchmarks/step.py [--n 22] [--steps 30] [--repeat 7]
    python3 benchmarks/step.py --bag-state tests/data/bag_full_8p50.npz [--repeat 7]

Scene: an n×n film (22×22 = 484 vertices, the bag's size) dropped with friction onto a
fixed sphere and a floor and run --steps steps (it then rests on the sphere's top, with
few stencils inside d̂); or, with --bag-state, the step from a saved ``ipcjax bag`` state
(the 481-vertex bag at 8.50 s, tying: 898 particles, about 700 stencils inside d̂ among
~15k candidate rows), its controls and capacity from one reference step. On that state, each
phase of one Newton iteration is timed separately as the Newton loop runs it (jitted,
median of --repeat runs): assembly (the stencils' closest-point weights, ∇Φ, the PSD
element Hessians and their scatter into the dense matrix), factorization (equilibrated
Cholesky solve), line search (the step bound on the shared weights and one Armijo loop,
Φ at x carried from the previous iteration) and candidates (the swept query, run only in
iterations that leave the 1.5 mm skin). Beside the phases, the whole jitted Newton solve
of the step's problem is timed and divided by its iteration count: the iteration as it
runs in context. The bare dense Cholesky (jax.scipy.linalg.cho_factor of an SPD matrix
of the same size) is timed in the same run, and every figure is printed as a ratio to it.
The sparse path (``linear_solver="sparse"``: host LDLᵀ of the element blocks,
ipcjax.ldl) is timed in the same run on the same problem: its assembly (blocks, no dense
scatter), its direction, the iteration and the whole solve and step, under ``sparse``.
Prints JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
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
from ipcjax.line_search import armijo, step_bound
from ipcjax.linear_solvers import DenseCholesky, SparseLDL
from ipcjax.newton import newton_solve, query_contacts
from ipcjax.potential import gradient_and_blocks, incremental_potential, stencil_geometry
from ipcjax.problem import StepInputs
from ipcjax.step import make_state, simulate, step, step_problem
from scenes.film import drape_scene



def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=22)
    ap.add_argument("--steps", type=int, default=30, help="settling steps before timing")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--bag-state", default=None, help="time the bag's step from this `ipcjax bag` state")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    if args.bag_state:
        from fitting.bag import bag_window
        w = bag_window(args.bag_state, 1)
        model, cfg, params, dt = w["scene"]["model"], w["scene"]["config"], w["params"], w["dt"]
        ctl = jax.tree_util.tree_map(lambda a: a[0], w["controls"])
        cap = w["capacity"]
        st = make_state(w["x0"], w["v0"], w["t0"])
        scene = f"bag ({w['scene']['resolution']}) at t = {w['t0']:.3f} s"
    else:
        sc = drape_scene(n=args.n, size=0.1, sphere_radius=0.025, gap=1.5e-3, floor=True)
        model, cfg, params = sc["model"], Config(), Params.film_defaults()
        ctl = Controls.empty(model.n_particles, tolerance=1.2e-5)
        dt = 1.0 / 240.0
        frames, _, reps = simulate(model, params, make_state(sc["x"]), ctl, args.steps, dt=dt, config=cfg)
        cap = reps[-1].capacity
        st = make_state(frames[-1])
        scene = f"{args.n}x{args.n} film on a sphere after {args.steps} steps"
    settle_wall = time.perf_counter() - t0

    cfg = dataclasses.replace(cfg, linear_solver="dense")
    cfg_sp = dataclasses.replace(cfg, linear_solver="sparse")
    # whole step (median over repeats of the same step)
    t_step = median_time(lambda: step(model, params, st, ctl, dt, config=cfg, capacity=cap), args.repeat)
    _, info = step(model, params, st, ctl, dt, config=cfg, capacity=cap)
    n_iter = int(info.iterations)
    t_step_sp = median_time(lambda: step(model, params, st, ctl, dt, config=cfg_sp, capacity=cap), args.repeat)
    _, info_sp = step(model, params, st, ctl, dt, config=cfg_sp, capacity=cap)

    x = jnp.asarray(st.x, jnp.float64)
    v = jnp.asarray(st.v, jnp.float64)
    cs, stats = query_contacts(x, x, model, cfg, cap, skin=cfg.skin)
    problem = step_problem(model, cfg, StepInputs(params, x, v, ctl, jnp.asarray(dt)), cs, active=cap.active)
    dense, sparse_ldl = DenseCholesky(), SparseLDL()  # the Newton loop's own solver objects

    @jax.jit
    def assemble_blocks(x):  # the sparse (and CG) path's assembly: the element blocks
        geom = stencil_geometry(x, cs, model.radius, cfg.min_gap)
        g, hb = gradient_and_blocks(x, problem, cs, geometry=geom, active=cap.active)
        return g, hb, geom

    # the dense path's: the same blocks scattered into the (3F, 3F) matrix
    assemble = jax.jit(lambda x: (lambda g, hb, geom: (g, dense.init(hb), geom))(*assemble_blocks(x)))

    g, H, geom = assemble(x)
    _, hb, _ = assemble_blocks(x)
    sd = jax.jit(sparse_ldl.direction)
    dx_sp, ok_sp, _ = sd(g, hb)
    nd = jax.jit(dense.direction)
    dxf, _, _ = nd(g, H)
    dx = jnp.zeros_like(x).at[model.free_particles].set(dxf.reshape(-1, 3))
    cand = jax.jit(lambda x, dx: query_contacts(x, x + dx, model, cfg, cap, skin=cfg.skin))
    phi = lambda z: incremental_potential(z, problem, cs)
    phi_x = jax.jit(phi)(x)

    @jax.jit
    def line_search(x, dx, geom, phi_x):
        a0 = step_bound(x, dx, cs, problem, geometry=geom)
        return armijo(phi, x, dx, cfg, phi0=phi_x, slope=jnp.dot(g, dxf), alpha0=a0)

    # the solve queries at x itself; the friction set stays the one frozen above
    frozen = lambda contacts0, gaps0: problem.context.friction
    solve = jax.jit(lambda x: newton_solve(x, problem, frozen, capacity=cap))
    _, _, sinfo, _, _ = solve(x)
    solve_iterations = int(sinfo.iterations)
    problem_sp = problem._replace(config=cfg_sp)
    solve_sp = jax.jit(lambda x: newton_solve(x, problem_sp, frozen, capacity=cap))
    _, _, sinfo_sp, _, _ = solve_sp(x)

    t_cand = median_time(lambda: cand(x, dx), args.repeat)
    t_asm = median_time(lambda: assemble(x), args.repeat)
    t_fact = median_time(lambda: nd(g, H), args.repeat)
    t_ls = median_time(lambda: line_search(x, dx, geom, phi_x), args.repeat)
    t_solve = median_time(lambda: solve(x), args.repeat)
    t_asm_sp = median_time(lambda: assemble_blocks(x), args.repeat)
    t_fact_sp = median_time(lambda: sd(g, hb), args.repeat)
    t_solve_sp = median_time(lambda: solve_sp(x), args.repeat)

    n3 = H.shape[0]
    rng = np.random.default_rng(0)
    A = rng.normal(size=(n3, n3))
    spd = jnp.asarray(A @ A.T / n3 + np.eye(n3))
    chol = jax.jit(lambda M: jsl.cho_factor(M, lower=True)[0])
    t_chol = median_time(lambda: chol(spd), args.repeat)
    t_iter = t_asm + t_fact + t_ls
    t_in_solve = t_solve / max(solve_iterations, 1)
    t_iter_sp = t_asm_sp + t_fact_sp + t_ls
    it_sp = int(sinfo_sp.iterations)
    sparse = dict(
        newton_iterations_last_step=int(info_sp.iterations), newton_iterations_solve=it_sp,
        direction_ok=bool(ok_sp), direction_rel_diff_to_dense=float(jnp.max(jnp.abs(dx_sp - dxf)) / jnp.max(jnp.abs(dxf))),
        seconds=dict(assembly=t_asm_sp, factorization=t_fact_sp, line_search=t_ls, iteration=t_iter_sp,
                     iteration_in_solve=t_solve_sp / max(it_sp, 1), solve=t_solve_sp, step=t_step_sp),
        ratio_to_bare_cholesky=dict(assembly=t_asm_sp / t_chol, factorization=t_fact_sp / t_chol,
                                    iteration=t_iter_sp / t_chol,
                                    iteration_in_solve=t_solve_sp / max(it_sp, 1) / t_chol, step=t_step_sp / t_chol),
        ratio_to_dense=dict(factorization=t_fact_sp / t_fact, iteration=t_iter_sp / t_iter,
                            iteration_in_solve=(t_solve_sp / max(it_sp, 1)) / t_in_solve, step=t_step_sp / t_step),
    )
    out = dict(
        machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {jax.devices()[0].platform}",
        scene=scene, particles=model.n_particles, free_dofs=n3, candidates=dict(vt=int(info.n_vt), ee=int(info.n_ee), sf=int(info.n_sf)),
        candidate_capacity=int(cs.idx.shape[0]), active_capacity=cap.active,
        active_rows=int(sinfo.stats.n_active),
        settle_steps=args.steps, settle_wall_s=settle_wall, newton_iterations_last_step=n_iter,
        newton_iterations_solve=solve_iterations,
        seconds=dict(bare_cholesky=t_chol, candidates=t_cand, assembly=t_asm, factorization=t_fact,
                     line_search=t_ls, iteration=t_iter, iteration_in_solve=t_in_solve, solve=t_solve,
                     step=t_step),
        ratio_to_bare_cholesky=dict(candidates=t_cand / t_chol, assembly=t_asm / t_chol,
                                    factorization=t_fact / t_chol, line_search=t_ls / t_chol,
                                    iteration=t_iter / t_chol, iteration_in_solve=t_in_solve / t_chol,
                                    step=t_step / t_chol),
        sparse=sparse,
        notes=("iteration = assembly + factorization + line search (candidates are queried only in "
               "iterations that leave the skin); iteration_in_solve = the jitted Newton solve of "
               "the step's problem divided by its iterations"),
    )
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

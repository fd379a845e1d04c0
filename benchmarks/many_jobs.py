"""Many jobs in one process (issue #31): memory and mappings as job after job compiles.

Runs, in this one process, a list of distinct jobs — Verlet rollouts and fits, IPC drapes
through :func:`ipcjax.step.simulate` with three linear solvers and two membrane models,
differentiable rollouts with their gradients and fits on the cantilever, distances and
their gradients in float32 and float64, coarse bag windows
and full-resolution bag windows from the tie checkpoint — of different shapes, capacities,
parameters and dtypes. Each job compiles programs of its own. After each job it prints the
process's resident memory (RSS), its memory mappings against ``vm.max_map_count``, the
compilations so far and the guard's releases (:mod:`ipcjax.compile_guard`).

``--rounds 2`` (the default) runs the list twice: the second round meets programs JAX
already holds, so RSS and mappings must stay flat there; the first round's growth is what
the compiled programs cost. ``--cap N`` lowers vm.max_map_count for the run (root only; put
back afterwards) so that the guard's releases happen within the list.

    python3 benchmarks/many_jobs.py                 # docs/benchmarks.md "Many compilations in one process"
    python3 benchmarks/many_jobs.py --quick         # the small jobs only (no bag windows)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.map_exhaustion import lowered_cap  # noqa: E402
from ipcjax import compile_guard  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIE = os.path.join(ROOT, "scenes", "data", "bag_full_tie.npz")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# --------------------------------------------------------------------------- the jobs

def verlet_rollout(n, iterations, steps):
    from baselines import verlet as V

    cloth, state = V.cloth_grid(n, iterations=iterations)
    out = V.rollout(cloth, V.VerletParams(stiffness=0.8), state, steps)
    assert bool(jnp.all(jnp.isfinite(out.state.x)))


def distances(count, dtype):
    """Point–triangle distances and their gradients over random stencils, in one dtype."""
    from ipcjax.distance import point_triangle_distance

    x = jax.random.normal(jax.random.PRNGKey(count), (count, 4, 3), dtype)
    f = jax.jit(jax.vmap(jax.value_and_grad(lambda s: point_triangle_distance(s[0], s[1], s[2], s[3]))))
    d, g = f(x)
    assert d.dtype == dtype and bool(jnp.all(jnp.isfinite(g)))


def verlet_fit(n, steps):
    from baselines import verlet as V

    cloth, state = V.cloth_grid(n, iterations=6)
    params = V.VerletParams(damping=0.8)
    target = float(V.sag(V.rollout(cloth, params._replace(stiffness=0.5), state, steps).state.x, n))
    fit = V.fit_stiffness(target, cloth, state, params, steps=steps, n_iter=5, init_stiffness=1.0)
    assert np.isfinite(float(fit.params.stiffness))


def drape(n, steps, solver, membrane="neo_hookean"):
    from ipcjax import step
    from ipcjax.model import Config, Controls, Params
    from scenes.film import drape_scene

    sc = drape_scene(n=n)
    frames, _, _ = step.simulate(sc.model, Params.film_defaults(), step.make_state(sc.x),
                                 Controls.empty(sc.model.n_particles), steps, dt=1 / 240,
                                 config=Config(linear_solver=solver, membrane=membrane))
    assert np.all(np.isfinite(frames))


def cantilever(n, steps, fit_iterations):
    import optax

    from fitting.fit import MeasuredRollout, fit_measured, to_z
    from ipcjax import candidates as C
    from ipcjax.implicit import make_rollout, stack_controls
    from ipcjax.model import Config, Controls, Params
    from scenes.film import cantilever_scene

    sc = cantilever_scene(n=n)
    m = sc.model
    roll = make_rollout(m, Config(), C.initial_capacity(m.topology), round_fp32=False)
    ctl = stack_controls([Controls.empty(m.n_particles, tolerance=1e-10)] * steps)
    x0 = jnp.asarray(sc.x)

    @jax.jit
    def rollout(p):
        frames, _, codes = roll(p, x0, jnp.zeros_like(x0), ctl, 1 / 240)
        return frames, codes

    tip = jnp.asarray(sc.tip)
    measure = lambda frames: jnp.mean(frames[-1, tip, 2])  # noqa: E731
    truth = Params.film_defaults()
    problem = MeasuredRollout(rollout, measure, ["bending_scale"])
    target = problem(to_z(["bending_scale"], truth), truth).y
    start = truth._replace(bending_scale=jnp.asarray(1.5))
    res = fit_measured(problem, target, start, optimizer=optax.adam(0.1), iterations=fit_iterations,
                       scale=1e-3, progress=False)
    assert np.isfinite(float(res.params.bending_scale))


def bag_window(resolution, steps, solver, resume=None):
    from scenes.bag import bag_scene
    from scenes.bag_run import BagRunOptions, run_bag

    dt = bag_scene(resolution).dt
    t0 = 0.0
    if resume is not None:
        t0 = float(np.load(resume)["t"])
    with tempfile.TemporaryDirectory() as out:
        res = run_bag(BagRunOptions(out=out, until=t0 + steps * dt, resolution=resolution, resume=resume,
                                    mesh_every=0, pictures=False, progress=False, linear_solver=solver,
                                    checkpoint_every=10_000))
    assert not res.summary["failure"], res.summary["failure"]


def job_list(quick: bool):
    jobs = []
    for n, it, steps in ((4, 2, 5), (6, 4, 10), (8, 6, 20), (12, 8, 30)):
        jobs.append((f"verlet rollout n={n} it={it} steps={steps}",
                     lambda n=n, it=it, s=steps: verlet_rollout(n, it, s)))
    for count, dtype in ((100, jnp.float32), (100, jnp.float64), (1000, jnp.float32), (1000, jnp.float64)):
        jobs.append((f"point-triangle distances ×{count} {np.dtype(dtype).name}",
                     lambda c=count, d=dtype: distances(c, d)))
    for n, steps in ((5, 20), (6, 30), (8, 40)):
        jobs.append((f"verlet fit n={n} steps={steps}", lambda n=n, s=steps: verlet_fit(n, s)))
    for n, steps, solver, membrane in ((4, 3, "dense", "neo_hookean"), (5, 3, "dense", "stvk"),
                                       (6, 4, "dense", "neo_hookean"), (5, 3, "cg", "neo_hookean"),
                                       (6, 3, "sparse", "neo_hookean"), (7, 4, "dense", "stvk"),
                                       (8, 3, "cg", "stvk"), (8, 3, "sparse", "stvk")):
        jobs.append((f"drape n={n} steps={steps} {solver} {membrane}",
                     lambda n=n, s=steps, so=solver, me=membrane: drape(n, s, so, me)))
    for n, steps, its in ((4, 4, 3), (5, 6, 3), (5, 4, 4), (6, 4, 3), (4, 8, 3), (6, 6, 2)):
        jobs.append((f"cantilever rollout+fit n={n} steps={steps} iterations={its}",
                     lambda n=n, s=steps, i=its: cantilever(n, s, i)))
    if not quick:
        for steps, solver in ((3, "sparse"), (4, "dense"), (5, "sparse")):
            jobs.append((f"bag coarse from t=0, {steps} steps, {solver}",
                         lambda s=steps, so=solver: bag_window("coarse", s, so)))
        for steps in (2, 3):
            jobs.append((f"bag full from the tie checkpoint, {steps} steps, sparse",
                         lambda s=steps: bag_window("full", s, "sparse", resume=TIE)))
    return jobs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="leave out the bag windows")
    ap.add_argument("--cap", type=int, default=None, help="vm.max_map_count for the run (root; restored after)")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    rows = []
    with lowered_cap(args.cap):
        jobs = job_list(args.quick)
        print(f"{len(jobs)} jobs × {args.rounds} rounds; vm.max_map_count {compile_guard.map_use().limit:,}")
        print(f"{'round':>5} {'job':>3}  {'wall s':>7} {'RSS MB':>8} {'maps':>7} {'compiles':>8} {'releases':>8}  job")
        for r in range(args.rounds):
            for j, (name, job) in enumerate(jobs):
                t = time.perf_counter()
                job()
                wall = time.perf_counter() - t
                use, s = compile_guard.map_use(), compile_guard.stats()
                row = dict(round=r + 1, job=j + 1, name=name, wall_s=round(wall, 2), rss_mb=round(rss_mb(), 1),
                           maps=use.count, compiles=s["compiles"], releases=s["releases"])
                rows.append(row)
                print(f"{r + 1:>5} {j + 1:>3}  {wall:7.1f} {row['rss_mb']:8.1f} {use.count:7d} {s['compiles']:8d} "
                      f"{s['releases']:8d}  {name}", flush=True)
    first = [x for x in rows if x["round"] == 1]
    print(f"round 1: RSS {first[0]['rss_mb']:.0f} → {first[-1]['rss_mb']:.0f} MB, "
          f"mappings {first[0]['maps']} → {first[-1]['maps']}, {first[-1]['compiles']} compilations")
    for r in range(2, args.rounds + 1):
        rr = [x for x in rows if x["round"] == r]
        print(f"round {r}: RSS {rr[0]['rss_mb']:.0f} → {rr[-1]['rss_mb']:.0f} MB (max {max(x['rss_mb'] for x in rr):.0f}), "
              f"mappings {rr[0]['maps']} → {rr[-1]['maps']}, compilations {rr[-1]['compiles'] - first[-1]['compiles']} new; "
              f"ru_maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

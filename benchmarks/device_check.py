"""The accelerator against the CPU (docs/spec.md §6 "GPU against CPU"; issue #35, item 4).

Each run is a child process of its own, pinned to one JAX platform (``JAX_PLATFORMS``):

* the vertex–triangle and edge–edge reference scenes (StVK membrane, dense solver), 6 steps
  of 1/240 s each, as §6 asks;
* the 481-vertex bag's first 6 steps from t = 0, through the same host driver as
  ``ipcjax bag`` (``ipcjax.step.advance`` with the choreography's controls), with the
  dense in-XLA Cholesky and, on the CPU only, with the host sparse LDLᵀ the bag uses by
  default.

Before every step a child also takes the step's first Newton system (∇Φ and the Hessian
blocks at x₀ over every candidate row) and the run's linear solver's direction Δx for it,
and records the relative linear residual ‖H Δx + ∇Φ‖ / ‖∇Φ‖ on that platform, in FP64.
After every step it queries the candidates of the step's swept motion on that platform and
counts the pairs that an all-pairs NumPy query finds at any of 17 evenly spaced instants of
the motion but the swept query lacks (§6: none missing; a step with no pair in reach
fails the check, which would then test nothing).

The parent compares the runs step by step: the largest |Δx| between the accelerator's and
the CPU's positions with the same solver (§6: within 2·10⁻⁷ m), and on the CPU between the
dense and the sparse solver for the bag; and the largest relative residual of every run
(§6: below 10⁻⁷), and the missing candidates (none). It prints one JSON document and
exits with status 1 when a check fails.
Without an accelerator it says so and runs the CPU's checks alone (dense against sparse,
the residuals)::

    python3 benchmarks/device_check.py [--steps 6] [--json out.json]
    bash benchmarks/gpu_check.sh          # the same, with the figures under $OUT

The ensemble's wall time per member (K = 1, 16, 64) is measured by
benchmarks/ensemble_step.py (one lockstep step of K coarse bags as one program), which
benchmarks/gpu_check.sh runs after this script.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POSITION_TOL = 2e-7   # m, docs/spec.md §6
RESIDUAL_TOL = 1e-7   # relative linear residual, docs/spec.md §6
DT = 1.0 / 240.0
INSTANTS = 17         # instants of each step's motion at which candidates are checked, docs/spec.md §6


# --------------------------------------------------------------------------- child


def _residual_fn():
    """A jitted ``(model, params, state, controls, dt, config) -> relative residual`` of the
    step's first Newton direction, for the configured linear solver."""
    from functools import partial

    import jax
    import jax.numpy as jnp

    from ipcjax.linear_solvers import linear_solver
    from ipcjax.newton import query_contacts
    from ipcjax.potential import gradient_and_blocks, hessian_matvec
    from ipcjax.problem import StepInputs
    from ipcjax.step import step_problem

    @partial(jax.jit, static_argnames=("capacity",))
    def residual(model, params, state, controls, dt, config, *, capacity):
        x0 = state.x.astype(jnp.float64)
        inputs = StepInputs(params, x0, state.v.astype(jnp.float64), controls, jnp.asarray(dt, jnp.float64))
        contacts0, _ = query_contacts(x0, x0, model, config, capacity, skin=config.skin)
        problem = step_problem(model, config, inputs, contacts0)
        g, hb = gradient_and_blocks(x0, problem, contacts0)
        solver = linear_solver(config)
        sol = solver.direction(g, solver.init(hb))
        r = hessian_matvec(hb, sol.value) + g
        return jnp.linalg.norm(r) / jnp.linalg.norm(g), sol.status

    return residual


def _missing_candidates(x0, x1, model, config, capacity, instants: int) -> int:
    """(missing, seen): of the candidate pairs within reach at any of ``instants`` evenly
    spaced instants of the motion x0 → x1 (NumPy, all pairs; ``seen`` of them), those that
    the swept query on this platform lacks."""
    from ipcjax.candidates import brute_force_candidates, find_candidates

    topo = model.topology
    c = find_candidates(x0, x1, topo, config.dhat, config.min_gap, capacity=capacity)
    if bool(c.overflow):
        raise SystemExit("the swept candidate query overflowed its capacity: no check made")
    kinds = ("vt", "ee", "sf")
    found = {k: {tuple(r) for r in np.asarray(getattr(c, k))[: int(getattr(c, "n_" + k))]} for k in kinds}
    seen = {k: set() for k in kinds}
    for s in np.linspace(0.0, 1.0, instants):
        xs = x0 + s * (x1 - x0)
        ref = brute_force_candidates(xs, xs, topo, config.dhat, config.min_gap)
        for k in kinds:
            seen[k] |= {tuple(r) for r in np.asarray(getattr(ref, k))}
    return sum(len(seen[k] - found[k]) for k in kinds), sum(len(seen[k]) for k in kinds)


def _child(job: str, solver: str, steps: int, out: str) -> None:
    """Run one job on this process's platform; write its frames and figures to ``out``."""
    sys.path.insert(0, ROOT)
    import jax

    jax.config.update("jax_enable_x64", True)
    from ipcjax.capacity import initial_capacity, resolve_capacity
    from ipcjax.model import Config, Controls, Params
    from ipcjax.step import advance, make_state

    residual = _residual_fn()
    if job == "bag":
        from scenes.bag import bag_scene

        sc = bag_scene("full", linear_solver=solver)
        model, params, config, dt = sc.model, sc.params, sc.config, sc.dt
        state = make_state(sc.x)
        choreo = sc.choreography

        def controls(k, t, x):  # as run_bag does: the choreography sees the film, then steers
            choreo.observe(t, x)
            return choreo.controls_at(k, t)
    else:
        from scenes.film import edge_edge_scene, vertex_triangle_scene

        sc = {"vertex_triangle": vertex_triangle_scene, "edge_edge": edge_edge_scene}[job]()
        model, params, dt = sc.model, Params.film_defaults(), DT
        config = Config(membrane="stvk", linear_solver=solver)
        state = make_state(sc.x, sc.v)
        empty = Controls.empty(model.n_particles, tolerance=5e-7)
        controls = lambda k, t, x: empty
    capacity = resolve_capacity(initial_capacity(model.topology), model.topology)
    frames, residuals, statuses, iterations, walls = [np.asarray(state.x, np.float64)], [], [], [], []
    missing, seen = [], []
    for k in range(steps):
        t = float(state.t)
        ctl = controls(k, t, np.asarray(state.x))
        res, status = residual(model, params, state, ctl, dt, config, capacity=capacity)
        residuals.append(float(res))
        statuses.append(int(status))
        t0 = time.perf_counter()
        state, rep = advance(model, params, state, ctl, dt, config=config, capacity=capacity)
        walls.append(time.perf_counter() - t0)
        rep.raise_if_failed()
        capacity = rep.capacity
        iterations.append(int(rep.iterations))
        frames.append(np.asarray(state.x, np.float64))
        m, n = _missing_candidates(frames[-2], frames[-1], model, config, capacity, INSTANTS)
        missing.append(m)
        seen.append(n)
    np.savez(out, frames=np.stack(frames), residuals=np.asarray(residuals), statuses=np.asarray(statuses),
             iterations=np.asarray(iterations), walls=np.asarray(walls), missing=np.asarray(missing),
             seen=np.asarray(seen),
             device=str(jax.devices()[0]), platform=jax.default_backend())


# --------------------------------------------------------------------------- parent


def _accelerator() -> str | None:
    """'gpu' (or 'tpu') when JAX sees one in a child process, else None."""
    code = "import jax; print(jax.default_backend())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(None))
    backend = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else "cpu"
    return None if backend == "cpu" else backend


def _env(platform: str | None) -> dict:
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    if platform:
        env["JAX_PLATFORMS"] = platform
    return env


def _run(platform: str, job: str, solver: str, steps: int, folder: str) -> dict:
    out = os.path.join(folder, f"{job}_{platform}_{solver}.npz")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", job, solver, str(steps), out],
                       capture_output=True, text=True, env=_env(platform), cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"{job} on {platform} with the {solver} solver failed (exit {r.returncode}):\n"
                         f"{r.stderr[-4000:]}")
    d = dict(np.load(out))
    return dict(frames=d["frames"], residuals=d["residuals"], statuses=d["statuses"], missing=d["missing"].tolist(),
                seen=d["seen"].tolist(),
                iterations=d["iterations"].tolist(), step_wall_s=[round(float(w), 4) for w in d["walls"]],
                device=str(d["device"]), wall_s=round(time.perf_counter() - t0, 1))


def _compare(a: dict, b: dict) -> dict:
    dx = np.abs(a["frames"] - b["frames"]).max(axis=(1, 2))
    return dict(max_abs_dx_per_step_m=[float(f"{v:.3g}") for v in dx[1:]], max_abs_dx_m=float(f"{dx.max():.3g}"),
                within_tolerance=bool(dx.max() <= POSITION_TOL))


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        job, solver, steps, out = sys.argv[2:6]
        _child(job, solver, int(steps), out)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--json", help="write the JSON document here too")
    ap.add_argument("--jobs", default="vertex_triangle,edge_edge,bag",
                    help="comma-separated: vertex_triangle, edge_edge, bag")
    args = ap.parse_args()
    accel = _accelerator()
    doc = dict(command="python3 benchmarks/device_check.py " + " ".join(sys.argv[1:]), steps=args.steps,
               accelerator=accel or "none: the CPU's checks only",
               position_tolerance_m=POSITION_TOL, residual_tolerance=RESIDUAL_TOL, jobs={})
    ok = True
    with tempfile.TemporaryDirectory() as folder:
        for job in args.jobs.split(","):
            runs = {("cpu", "dense"): _run("cpu", job, "dense", args.steps, folder)}
            if job == "bag":
                runs[("cpu", "sparse")] = _run("cpu", job, "sparse", args.steps, folder)
            if accel:
                runs[(accel, "dense")] = _run(accel, job, "dense", args.steps, folder)
            entry = dict(runs={}, comparisons={})
            for (platform, solver), r in runs.items():
                worst = float(np.max(r["residuals"]))
                good = bool(worst < RESIDUAL_TOL and not np.any(r["statuses"]))
                complete = not any(r["missing"]) and all(r["seen"])
                ok &= good and complete
                entry["runs"][f"{platform} {solver}"] = dict(
                    device=r["device"], newton_iterations=r["iterations"], step_wall_s=r["step_wall_s"],
                    wall_s=r["wall_s"], first_direction_relative_residual=[float(f"{v:.3g}") for v in r["residuals"]],
                    residual_below_tolerance=good, candidates_seen_per_step=r["seen"],
                    missing_candidates_per_step=r["missing"])
            pairs = [((accel, "dense"), ("cpu", "dense"))] if accel else []
            if job == "bag":
                pairs.append((("cpu", "dense"), ("cpu", "sparse")))
            for p, q in pairs:
                c = _compare(runs[p], runs[q])
                ok &= c["within_tolerance"]
                entry["comparisons"][f"{' '.join(p)} vs {' '.join(q)}"] = c
            doc["jobs"][job] = entry
    doc["all_checks_pass"] = bool(ok)
    text = json.dumps(doc, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

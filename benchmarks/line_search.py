"""The line search's expansion (``Config.line_search_expansions``) on a window of the bag:
Newton iterations per step with and without it, and why, replayed on the hardest step.

    python3 benchmarks/line_search.py [--state tests/data/bag_full_cinch.npz] [--steps 120]
                                      [--expansions 0 4] [--replay]

For each number of doublings in --expansions, one process steps the bag from --state for
--steps steps with the host driver (``ipcjax.step.advance``, the bag's choreography, the
bag's Config with only ``line_search_expansions`` changed) and reports the Newton
iterations (total, histogram, steps with ≥ 20 and ≥ 40), the iterations that took an
expanded step, the seconds per step after the first (a noisy figure: the A/B of record is
``benchmarks/ab_bag.py``) and the largest film difference from the first setting's last
frame.

``--replay`` then takes the first setting's hardest step (most iterations), steps to it
again, and replays that step's Newton iterations on the host with the functions the
jitted loop calls (``ipcjax.newton`` on its compacting path). Per iteration: max|Δx|, the
step bound α₀, the accepted α, and Φ(x + mΔx) − Φ(x) in units of |∇Φ·Δx| for m = 1, 2, 4,
…, 32 (each over the rows in reach of mΔx and within its step bound; a quadratic model
with the exact Hessian gives −0.5 at m = 1 and a minimum there).

Prints JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def _bag(state):
    import numpy as np

    from ipcjax.step import make_state
    from scenes.bag import bag_scene
    from scenes.bag_run import read_bag_state

    res = str(np.load(state)["resolution"])
    sc = bag_scene(res)
    rs = read_bag_state(state, sc, res)
    return sc, make_state(rs["x"], rs["v"], float(rs["t"])), int(rs["step"]), float(rs["t"])


def window(state, steps, expansions, stop_at=None):
    """Step the bag; returns (figures, the state before step ``stop_at`` and its controls)."""
    import numpy as np

    from ipcjax.step import advance

    sc, st, k, t = _bag(state)
    config = dataclasses.replace(sc.config, line_search_expansions=expansions)
    cap, its, exps, t1 = None, [], 0, None
    for i in range(steps):
        sc.choreography.observe(t, np.asarray(st.x))
        ctl = sc.choreography.controls_at(k, t)
        if i == stop_at:
            return sc, config, cap, st, ctl
        new, rep = advance(sc.model, sc.params, st, ctl, sc.dt, config=config, capacity=cap, validate=cap is None)
        rep.raise_if_failed()
        if i == 0:
            t1 = time.perf_counter()
        cap = rep.capacity
        its.append(rep.iterations)
        exps += rep.expansions
        st, k, t = new, k + 1, float(new.t)
    wall = time.perf_counter() - t1
    film = np.asarray(st.x)[sc.film]
    return dict(expansions=expansions, steps=steps, iterations=int(sum(its)),
                steps_ge_20=sum(i >= 20 for i in its), steps_ge_40=sum(i >= 40 for i in its),
                expanded_iterations=exps, s_per_step_after_first=wall / max(steps - 1, 1),
                histogram={str(n): int(c) for n, c in enumerate(np.bincount(its)) if c},
                per_step=its), film


def replay(state, stop_at):
    """The Newton iterations of step ``stop_at`` of the window (no expansion), on the host."""
    import jax
    import jax.numpy as jnp

    from ipcjax.line_search import armijo, compact_contacts, gap_lower_bound, reach_contacts, step_bound
    from ipcjax.linear_solvers import linear_solver
    from ipcjax.newton import active_size, query_contacts
    from ipcjax.potential import contact_gaps, gradient_and_blocks, incremental_potential, stencil_geometry
    from ipcjax.problem import StepInputs
    from ipcjax.step import step_problem

    sc, config, cap, st, ctl = window(state, stop_at + 1, 0, stop_at=stop_at)
    model = sc.model
    inputs = StepInputs(sc.params, jnp.asarray(st.x, jnp.float64), jnp.asarray(st.v, jnp.float64), ctl,
                        jnp.asarray(sc.dt, jnp.float64))
    active = active_size(cap)
    cs0, _ = jax.jit(lambda inp: query_contacts(inp.x0, inp.x0, model, config, cap, skin=config.skin))(inputs)
    problem = jax.jit(lambda inp, cs: step_problem(model, config, inp, cs, active=active))(inputs, cs0)
    solver = linear_solver(config)
    radius, min_gap, half_skin, dhat = model.radius, config.min_gap, 0.5 * config.skin, config.dhat
    fp, F = model.free_particles, model.n_free
    j_gaps = jax.jit(lambda x, cs: contact_gaps(x, cs, radius, min_gap)[0])
    j_lb = jax.jit(gap_lower_bound)
    j_near = jax.jit(lambda cs, lb: compact_contacts(cs, lb < dhat, active))
    j_asm = jax.jit(lambda x, pr, cs: gradient_and_blocks(
        x, pr, cs, geometry=stencil_geometry(x, cs, radius, min_gap)))
    j_dir = jax.jit(lambda g, hb: (lambda d: (d.value, d.ok))(solver.direction(g, solver.init(hb))))
    j_full = jax.jit(lambda dxf, x: jnp.zeros_like(x).at[fp].set(dxf.reshape(F, 3)))
    j_query = jax.jit(lambda x, dx: query_contacts(x, x + dx, model, config, cap, skin=config.skin))
    j_reach = jax.jit(lambda dx, cs, lb: reach_contacts(dx, cs, lb, dhat, active))
    j_bound = jax.jit(lambda x, dx, cs, pr: step_bound(x, dx, cs, pr, geometry=stencil_geometry(x, cs, radius, min_gap)))
    j_phi = jax.jit(lambda x, cs, pr: incremental_potential(x, pr, cs))
    j_armijo = jax.jit(lambda x, dx, cs, pr, slope, a0: armijo(
        lambda z: incremental_potential(z, pr, cs), x, dx, config,
        phi0=incremental_potential(x, pr, cs), slope=slope, alpha0=a0))
    x, cs, box = inputs.x0, cs0, (inputs.x0, inputs.x0)
    ref_x, ref_gap = x, j_gaps(x, cs)
    rows = []
    for it in range(int(config.max_newton)):
        lb = j_lb(x, ref_x, ref_gap, cs)
        if int(jnp.sum(lb < dhat)) > active:
            ref_x, ref_gap = x, j_gaps(x, cs)
            lb = ref_gap
        g, hb = j_asm(x, problem, j_near(cs, lb)[0])
        dxf, ok = j_dir(g, hb)
        assert bool(ok), f"replay: the direction failed at iteration {it}"
        dx = j_full(dxf, x)
        norm = float(jnp.max(jnp.abs(dxf)))
        lo, hi = jnp.minimum(x, x + dx), jnp.maximum(x, x + dx)
        if not bool(jnp.all(lo >= box[0] - half_skin) & jnp.all(hi <= box[1] + half_skin)):
            cs, _ = j_query(x, dx)
            box, ref_x, ref_gap = (lo, hi), x, j_gaps(x, cs)
        lb2 = j_lb(x, ref_x, ref_gap, cs)
        sub, _ = j_reach(dx, cs, lb2)
        a0 = j_bound(x, dx, sub, problem)
        slope = jnp.dot(g, dxf)
        a, _, ls_ok, _ = j_armijo(x, dx, sub, problem, slope, a0)
        assert bool(ls_ok), f"replay: the line search failed at iteration {it}"
        along = {}
        for m in (1, 2, 4, 8, 16, 32):
            sub_m, n = j_reach(m * dx, cs, lb2)
            if int(n) > active or float(j_bound(x, m * dx, sub_m, problem)) < 1.0:
                break  # past the rows' slots or the step bound of mΔx
            fall = float(j_phi(x + m * dx, sub_m, problem)) - float(j_phi(x, sub_m, problem))
            along[str(m)] = fall / abs(float(slope))
        rows.append(dict(iteration=it, max_dx_m=norm, step_bound=float(a0), alpha=float(a), phi_along=along))
        x = x + a * dx
        if norm < float(ctl.tolerance):
            break
    return dict(step=stop_at, tolerance_m=float(ctl.tolerance), iterations=rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", default=os.path.join(ROOT, "tests", "data", "bag_full_cinch.npz"))
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--expansions", type=int, nargs="+", default=[0, 4])
    ap.add_argument("--replay", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        import numpy as np

        kind, n, out = a.worker.split(":", 2)
        if kind == "window":
            res, film = window(a.state, a.steps, int(n))
            np.save(out + ".npy", film)
        else:
            res = replay(a.state, int(n))
        with open(out, "w") as f:
            json.dump(res, f)
        return
    import tempfile

    import numpy as np

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for e in a.expansions:
            out = os.path.join(tmp, f"w{e}.json")
            subprocess.run([sys.executable, __file__, "--state", a.state, "--steps", str(a.steps),
                            "--worker", f"window:{e}:{out}"], check=True)
            r = json.load(open(out))
            film = np.load(out + ".npy")
            if runs:
                r["film_difference_from_first_m"] = float(np.abs(film - first).max())
            else:
                first = film
            runs.append(r)
        report = dict(state=a.state, steps=a.steps, runs=runs)
        if a.replay:
            hardest = int(np.argmax(runs[0]["per_step"]))
            out = os.path.join(tmp, "replay.json")
            subprocess.run([sys.executable, __file__, "--state", a.state, "--steps", str(a.steps),
                            "--worker", f"replay:{hardest}:{out}"], check=True)
            report["replay"] = json.load(open(out))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""Newton's first iterate: the step start x₀ (what the solver does) against a predictor
toward the inertial target, as Newton iterations per step by phase of the bag.

    python3 benchmarks/newton_start.py [--state tests/data/bag_full_cinch.npz] [--steps 120]

Three runs of ``run_bag`` from --state for --steps steps, each in its own process:

* ``x0``: the library as it is (Newton starts at x₀);
* ``guarded``: Newton starts at x₀ + α(y − x₀) on the free particles, α the conservative
  step bound along that segment (so the start is feasible), when Φ there is below Φ(x₀);
  otherwise at x₀;
* ``always``: the same start without the Φ test.

The predictor is patched in here (``ipcjax.step.newton_solve`` wrapped), not in the
library: the candidates are queried again at the chosen start, so that the solve's
reuse test holds there. Prints, per run, the Newton iterations by phase with their
histogram (summary.json's ``newton_iterations_by_phase``), how often the guarded
predictor was taken, and the largest film difference from the ``x0`` run at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = ("x0", "guarded", "always")


def patch(mode):
    """Wrap ipcjax.step.newton_solve so that it starts from the predictor."""
    import jax
    import jax.numpy as jnp

    from ipcjax import newton, step
    from ipcjax.line_search import step_bound
    from ipcjax.potential import incremental_potential

    solve = step.newton_solve
    taken = []

    def start(x0, problem, make_friction, *, capacity):
        model, config = problem.model, problem.config
        p = jnp.where(model.fixed[:, None], 0.0, problem.context.y - x0)
        cs0, _ = newton.query_contacts(x0, x0, model, config, capacity, skin=config.skin)
        # frozen at x0's contacts (their gaps taken there), wherever the solve starts
        friction = make_friction(cs0, None)
        pb = problem._replace(context=problem.context._replace(friction=friction))
        cs, st = newton.query_contacts(x0, x0 + p, model, config, capacity, skin=config.skin)
        a0 = step_bound(x0, p, cs, pb)
        x1 = x0 + a0 * p
        take = ~st.overflow
        if mode == "guarded":
            take = take & (incremental_potential(x1, pb, cs) < incremental_potential(x0, pb, cs))
        jax.debug.callback(lambda t: taken.append(bool(t)), take)
        x_init = jnp.where(take, x1, x0)
        # the solve queries at x_init itself (ipcjax.newton.newton_solve's first pass)
        return solve(x_init, problem, lambda contacts0, gaps0: friction, capacity=capacity)

    step.newton_solve = start
    return taken


def worker(mode, state, steps, out):
    sys.path.insert(0, ROOT)
    os.chdir(ROOT)
    import numpy as np

    taken = patch(mode) if mode != "x0" else []
    from scenes.bag_run import BagRunOptions, run_bag

    until = (int(np.load(state)["step"]) + steps) / 240.0
    s = run_bag(BagRunOptions(out=out, resume=state, until=until, mesh_every=0, pictures=False, progress=False,
                              checkpoint_every=10 ** 9)).summary
    film = np.load(os.path.join(out, "trajectory.npz"))["film"][-1]
    np.save(os.path.join(out, "last_film.npy"), film)
    return dict(mode=mode, steps=s["steps_this_run"], newton_iterations=s["newton_iterations"],
                by_phase=s["newton_iterations_by_phase"], predictor_taken=sum(taken), predictor_tried=len(taken),
                min_gap_m=s["min_gap_m"], frames_with_self_intersection=s["audit"]["frames_with_self_intersection"],
                failure=s["failure"], last_film=os.path.join(out, "last_film.npy"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", default="tests/data/bag_full_cinch.npz")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--worker", nargs=2, metavar=("MODE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker[0], args.state, args.steps, args.worker[1])))
        return 0
    import numpy as np

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            out = os.path.join(tmp, mode)
            p = subprocess.run([sys.executable, __file__, "--state", args.state, "--steps", str(args.steps),
                                "--worker", mode, out], capture_output=True, text=True)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if p.returncode or not line:
                sys.stderr.write(p.stderr[-4000:])
                raise SystemExit(f"newton_start: the {mode} run failed (exit {p.returncode})")
            r = json.loads(line[0][len("RESULT "):])
            r["last_film_max_difference_from_x0_m"] = float(np.max(np.abs(np.load(r.pop("last_film"))
                                                                          - np.load(runs[0]["last_film"])))) \
                if runs else 0.0
            runs.append(r)
            print(f"{mode}: {r['newton_iterations']} Newton iterations in {r['steps']} steps; predictor taken "
                  f"{r['predictor_taken']} of {r['predictor_tried']}; film at the end "
                  f"{r['last_film_max_difference_from_x0_m'] * 1e3:.3f} mm from x0's", file=sys.stderr)
        runs[0].pop("last_film", None)
    print(json.dumps(dict(state=args.state, steps=args.steps, runs=runs), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One timestep before and after a change, side by side: the same jitted ``step`` timed with
the library of an earlier commit and of this working tree, alternating, in one run.

    python3 benchmarks/ab_step.py --before cbc62fe [--scenes bag,drape] [--rounds 2] [--repeat 5] [--bag-state F]

The earlier commit is checked out into a temporary ``git worktree`` (removed afterwards);
each (round, tree, scene) runs in its own process with that tree first on ``sys.path``.
Scenes: ``bag`` — the 481-vertex bag's step from --bag-state (default
tests/data/bag_full_8p50.npz, tying), its controls and capacity from one reference step of the same tree;
``drape`` — the 22×22 film after 5 steps onto a sphere. Timed: the jitted ``step``, median
of --repeat calls after a warm-up. Prints JSON: per tree and scene the step's seconds,
its Newton iterations and seconds per iteration, and after/before ratios.
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
BAG_STATE = os.path.join(ROOT, "tests", "data", "bag_full_8p50.npz")


def worker(root, scene, repeat, bag_state=BAG_STATE):
    sys.path.insert(0, root)
    import jax
    import numpy as np

    import ipcjax  # noqa: F401
    from ipcjax.step import make_state, simulate, step

    if scene == "bag":
        from fitting.bag import bag_window
        w = bag_window(bag_state, 1)
        m, cfg, p, dt = w["scene"]["model"], w["scene"]["config"], w["params"], w["dt"]
        ctl = jax.tree_util.tree_map(lambda a: a[0], w["controls"])
        st, cap = make_state(w["x0"], w["v0"], w["t0"]), w["capacity"]
    else:
        from ipcjax.model import Config, Controls, Params
        from scenes.film import drape_scene
        sc = drape_scene(n=22, size=0.1, sphere_radius=0.025, gap=1.5e-3, floor=True)
        m, cfg, p, dt = sc["model"], Config(), Params.film_defaults(), 1.0 / 240.0
        ctl = Controls.empty(m.n_particles, tolerance=1.2e-5)
        frames, _, reps = simulate(m, p, make_state(sc["x"]), ctl, 5, dt=dt, config=cfg)
        st, cap = make_state(frames[-1]), reps[-1].capacity
    from benchmarks.timing import median_time
    run = lambda: step(m, p, st, ctl, dt, config=cfg, capacity=cap)
    _, info = run()
    t = median_time(run, repeat)
    assert int(info.code) == 0, int(info.code)
    return dict(step_s=t, iterations=int(info.iterations), per_iteration_s=t / int(info.iterations))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", help="git revision of the earlier library")
    ap.add_argument("--scenes", default="bag,drape")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--bag-state", default=BAG_STATE, help="the bag scene's saved state")
    ap.add_argument("--worker", nargs=2, metavar=("ROOT", "SCENE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.repeat, os.path.abspath(args.bag_state))))
        return None
    if not args.before:
        ap.error("--before REV is required")
    scenes = args.scenes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        old = os.path.join(tmp, "before")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", old, args.before], check=True)
        try:
            res = {tree: {s: [] for s in scenes} for tree in ("before", "after")}
            for _ in range(args.rounds):
                for scene in scenes:
                    for tree, root in (("before", old), ("after", ROOT)):
                        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", root, scene,
                                            "--repeat", str(args.repeat), "--bag-state", args.bag_state],
                                           capture_output=True, text=True, cwd=ROOT)
                        if r.returncode != 0:
                            raise SystemExit(f"{tree} {scene} failed: {r.stderr.strip().splitlines()[-1:]}")
                        res[tree][scene].append(json.loads(r.stdout.strip().splitlines()[-1]))
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", old], check=False)
    out = dict(before=args.before, bag_state=args.bag_state, rounds=args.rounds, repeat=args.repeat,
               load_average=os.getloadavg(), runs=res, after_over_before={})
    for s in scenes:
        b = min(r["step_s"] for r in res["before"][s])
        a = min(r["step_s"] for r in res["after"][s])
        out["after_over_before"][s] = dict(step=a / b, before_best_step_s=b, after_best_step_s=a)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

"""The bag's stepping before and after a change, side by side: ``run_bag`` of an earlier
commit and of this working tree on the same window, each in its own process, alternated.

    python3 benchmarks/ab_bag.py --before REV [--state scenes/data/bag_full_tie.npz] [--steps 24] [--rounds 2]
    python3 benchmarks/ab_bag.py --before REV --state start --steps 2520 --rounds 1   # the whole protocol
    python3 benchmarks/ab_bag.py --before HEAD --xla-threads-before default   # XLA's threads, same code

The earlier commit is checked out into a temporary ``git worktree`` (removed afterwards);
each (round, tree) runs ``scenes.bag_run.run_bag`` of that tree, with the tree first on
``sys.path``, resuming from --state (``start``: from t = 0) for --steps steps of 1/240 s (no meshes, no pictures,
no progress bar), in a fresh process. Rounds alternate before, after, before, after, …
so that the machine's load falls on both alike. Timed: the stepping after the first step
(``wall_s − first_step_s`` of the run's summary.json: the host driver with its jitted
steps, without the first step's compilation), per step; and the whole ``run_bag`` call
(``run_bag_s``: scene, steps, checkpoints, the audit of every frame and the summary),
with what lies outside the stepping loop (``outside_stepping_s``: the scene and the
resumed state before it, the trajectory, the audit's wait and the summary after it).
Both trees' runs get the XLA threading the command-line jobs use
(:func:`ipcjax.xla_threads.single_threaded_xla`: one thread per program), unless
``--xla-threads-before`` / ``--xla-threads-after default`` give that tree XLA's own.
Compared: the Newton iterations, the last frame (largest difference of any film vertex,
m), the smallest gap and the self-intersection audit. Prints JSON: every run, and after/before as the ratio of each
tree's best per-step time and of its best ``run_bag_s`` (best: the run least disturbed by
other work).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
from benchmarks.alternate import alternate, before_tree  # noqa: E402


def worker(root, state, steps, out):
    sys.path.insert(0, root)
    os.chdir(root)
    from scenes.bag_run import BagRunOptions, run_bag

    dt = 1.0 / 240.0
    start = 0 if state is None else int(np.load(state)["step"])
    until = (start + steps) * dt
    t0 = time.perf_counter()
    res = run_bag(BagRunOptions(out=out, resume=state, until=until, mesh_every=0, pictures=False, progress=False,
                                checkpoint_every=10 ** 9))
    run_bag_s = time.perf_counter() - t0
    s = res.summary
    film = np.load(os.path.join(out, "trajectory.npz"))["film"][-1]
    np.save(os.path.join(out, "last_film.npy"), film)
    n = s["steps_this_run"]
    return dict(steps=n, wall_s=s["wall_s"], first_step_s=s["first_step_s"],
                per_step_after_first_s=(s["wall_s"] - s["first_step_s"]) / max(n - 1, 1),
                newton_iterations=s["newton_iterations"], candidate_queries=s.get("candidate_queries"),
                min_gap_m=s["min_gap_m"],
                frames_with_self_intersection=s["audit"]["frames_with_self_intersection"],
                audit_min_film_film_m=s["audit"]["min_film_film_m"], run_bag_s=run_bag_s,
                outside_stepping_s=run_bag_s - s["wall_s"],
                failure=s["failure"], measurements=s.get("measurements"), unfold_checked=s.get("unfold_checked"),
                last_film=os.path.join(out, "last_film.npy"))


def _env(threads: str) -> dict:
    """This process's environment with XLA_FLAGS as a job sets them for ``threads``."""
    from ipcjax import xla_threads

    env = dict(os.environ)
    if threads == "single":
        env["XLA_FLAGS"] = xla_threads.with_flags(env.get("XLA_FLAGS", ""))
    return env


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", help="git revision of the earlier tree")
    ap.add_argument("--state", default="scenes/data/bag_full_tie.npz",
                    help="a saved bag state to resume from, or 'start' for t = 0 (--steps 2520: the whole protocol)")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    for tree in ("before", "after"):
        ap.add_argument(f"--xla-threads-{tree}", choices=("single", "default"), default="single",
                        help=f"the {tree} tree's XLA threading (default: single, as the jobs set it)")
    ap.add_argument("--worker", nargs=2, metavar=("ROOT", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        state = None if args.state == "start" else args.state
        print(json.dumps(worker(args.worker[0], state, args.steps, args.worker[1])))
        return None
    if not args.before:
        ap.error("--before REV is required")
    state = args.state if args.state == "start" else os.path.abspath(args.state)
    with before_tree(args.before) as (tmp, old):
        runs = alternate(old, args.rounds, lambda tree, root, k: [
            os.path.abspath(__file__), "--worker", root, os.path.join(tmp, f"{tree}{k}"), "--state", state,
            "--steps", str(args.steps)], env_of=lambda tree: _env(getattr(args, f"xla_threads_{tree}")),
            report=lambda tree, k, r: print(
                f"{tree} round {k}: {r['per_step_after_first_s']:.3f} s per step, {r['newton_iterations']} Newton "
                "iterations", file=sys.stderr, flush=True))
        films = {t: [np.load(r.pop("last_film")) for r in runs[t]] for t in runs}
    b = min(r["per_step_after_first_s"] for r in runs["before"])
    a = min(r["per_step_after_first_s"] for r in runs["after"])
    out = dict(
        before=args.before, state=args.state, steps=args.steps, rounds=args.rounds, load_average=os.getloadavg(),
        xla_threads=dict(before=args.xla_threads_before, after=args.xla_threads_after),
        runs=runs, per_step_s=dict(before_best=b, after_best=a), after_over_before=a / b,
        run_bag_after_over_before=(min(r["run_bag_s"] for r in runs["after"])
                                   / min(r["run_bag_s"] for r in runs["before"])),
        last_frame_max_difference_m=float(np.max(np.abs(films["after"][0] - films["before"][0]))),
        last_frame_repeatable=dict(before=all(np.array_equal(f, films["before"][0]) for f in films["before"]),
                                   after=all(np.array_equal(f, films["after"][0]) for f in films["after"])),
    )
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

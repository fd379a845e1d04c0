"""The self-intersection audit before and after a change, side by side: ``audit_trajectory``
of an earlier commit and of this working tree on the same frames, each in its own process,
alternated.

    python3 benchmarks/ab_audit.py --before REV --run RUN_FOLDER [--every 1] [--rounds 2]

The earlier commit is checked out into a temporary ``git worktree`` (removed afterwards);
each (round, tree) audits every --every-th frame of RUN_FOLDER/trajectory.npz (an ``ipcjax
bag`` run: film and spheres) in a fresh process with that tree first on ``sys.path``, as
``scenes.bag_run`` calls it at the end of a run. Rounds alternate before, after, before,
after, … so that the machine's load falls on both alike. Prints JSON: every run's seconds,
after/before as the ratio of each tree's best time, and whether the two trees' audits
(every per-frame array) are identical.
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


def worker(root, run, every, out):
    sys.path.insert(0, root)
    os.chdir(root)
    from ipcjax.audit import audit_trajectory
    from scenes.bag import bag_scene

    traj = np.load(os.path.join(run, "trajectory.npz"))
    film, sph = traj["film"][::every], traj["spheres"][::every]
    summary = json.load(open(os.path.join(run, "summary.json")))
    sc = bag_scene(summary["resolution"])
    frames = np.concatenate([film, sph], axis=1)
    t = time.perf_counter()
    a = audit_trajectory(frames, sc.faces, np.arange(film.shape[1], film.shape[1] + sph.shape[1]),
                         sc.sphere_radius)
    wall = time.perf_counter() - t
    np.savez(out, **{k: np.asarray(v) for k, v in a.items()})
    return dict(frames=int(a["frames"]), wall_s=wall, frames_with_self_intersection=a["frames_with_self_intersection"],
                audit=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", help="git revision of the earlier tree")
    ap.add_argument("--run", help="an ipcjax bag run folder (trajectory.npz, summary.json)")
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--worker", nargs=2, metavar=("ROOT", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.run:
        ap.error("--run RUN_FOLDER is required")
    run = os.path.abspath(args.run)
    if args.worker:
        print(json.dumps(worker(args.worker[0], run, args.every, args.worker[1])))
        return None
    if not args.before:
        ap.error("--before REV is required")
    with before_tree(args.before) as (tmp, old):
        runs = alternate(old, args.rounds, lambda tree, root, k: [
            os.path.abspath(__file__), "--worker", root, os.path.join(tmp, f"{tree}{k}.npz"), "--run", run,
            "--every", str(args.every)], report=lambda tree, k, r: print(
                f"{tree} round {k}: {r['wall_s']:.1f} s", file=sys.stderr, flush=True))
        audits = {t: [dict(np.load(r.pop("audit"))) for r in runs[t]] for t in runs}
    same = all(np.array_equal(a[k], audits["before"][0][k]) for t in audits for a in audits[t] for k in a)
    b = min(r["wall_s"] for r in runs["before"])
    a = min(r["wall_s"] for r in runs["after"])
    out = dict(before=args.before, run=args.run, every=args.every, rounds=args.rounds, load_average=os.getloadavg(),
               runs=runs, wall_s=dict(before_best=b, after_best=a), after_over_before=a / b,
               audits_identical=same)
    print(json.dumps(out, indent=1))
    if not same:
        raise SystemExit("the two trees' audits differ")
    return out


if __name__ == "__main__":
    main()

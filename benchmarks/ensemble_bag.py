"""Wall time per member of ``ipcjax bag --ensemble K`` over a window (issue #35: K = 2
against K = 1 on this CPU; K = 1, 16 and 64 on a GPU, where the goal is 64 bags for at most
4× the wall time of one).

    python3 benchmarks/ensemble_bag.py [--members 1,2] [--resolution coarse] [--state F]
        [--until T] [--rounds 2] [--json out.json]

For each K in turn, ``--rounds`` times (alternated), :func:`scenes.bag_ensemble.run_bag_ensemble`
from ``--state`` (default: the coarse bag at 8.50 s, tests/data/bag_coarse_8p50.npz; for
the 481-vertex bag, scenes/data/bag_full_tie.npz) to ``--until``, dense solver, kicks of
1 cm/s rms. The first chunk of 12 steps compiles the program (its wall is reported apart,
and a K's first round is its compilation round); the figure is the wall of the chunks after
it, per step, and per member (divided by K). Prints JSON with every round, the medians and
the ratios to the first K.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", default="1,2", help="the K to time, comma-separated (the first is the base)")
    ap.add_argument("--resolution", default="coarse", choices=["coarse", "full"])
    ap.add_argument("--state", default=None, help="the state to start from (a run's state.npz)")
    ap.add_argument("--until", type=float, default=None, help="end time, s (default: the state's time + 0.2 s)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be ≥ 1 (a compiling round comes first); got {args.rounds}")
    sys.path.insert(0, ROOT)
    import jax
    import numpy as np

    from benchmarks.alternate import report_json
    from scenes.bag_ensemble import _chunks, run_bag_ensemble
    from scenes.bag_run import BagRunOptions

    state = args.state or os.path.join(ROOT, "tests", "data", "bag_coarse_8p50.npz")
    with np.load(state) as z:
        t0, step0 = float(z["t"]), int(z["step"])
    until = args.until or t0 + 0.2
    from scenes.bag import DT

    chunks = list(_chunks(step0, int(round(until / DT)), None))
    if len(chunks) < 2:  # the first chunk compiles: the figure is the chunks after it
        raise SystemExit(f"--until {until:g} s leaves {len(chunks)} chunk of steps after t = {t0:.4f} s; the "
                         "timing needs the compiling first chunk and at least one more")
    first_steps = chunks[0][1] - chunks[0][0]
    Ks = [int(k) for k in args.members.split(",")]
    rounds = {K: [] for K in Ks}
    for r in range(args.rounds + 1):  # round 0 compiles each K's program
        for K in Ks:
            with tempfile.TemporaryDirectory() as out:
                opts = BagRunOptions(out=out, resolution=args.resolution, resume=state, until=until,
                                     linear_solver="dense", progress=False, perturb=0.01)
                s = run_bag_ensemble(opts, K).summary
            if s["failure"]:
                raise SystemExit(f"K = {K}: {s['failure']}")
            steps = s["step_index"] - step0
            per_step = (s["wall_s"] - s["first_chunk_s"]) / (steps - first_steps)
            rounds[K].append(dict(wall_s=s["wall_s"], first_chunk_s=s["first_chunk_s"], steps=steps,
                                  per_step_s=per_step, per_member_step_s=per_step / K))
            print(f"round {r} K = {K}: {per_step:.3f} s a step after the first chunk ({per_step / K:.3f} s a member), "
                  f"first chunk {s['first_chunk_s']:.1f} s", flush=True)
    med = {K: statistics.median(x["per_step_s"] for x in rounds[K][1:]) for K in Ks}
    base = Ks[0]
    out = dict(resolution=args.resolution, state=os.path.relpath(state, ROOT), until=until, rounds=args.rounds,
               members=Ks, runs={str(K): v for K, v in rounds.items()}, median_per_step_s={str(K): v for K, v in med.items()},
               ratio_to_first={str(K): med[K] / med[base] for K in Ks},
               per_member_ratio_to_first={str(K): med[K] / K / (med[base] / base) for K in Ks},
               device=str(jax.devices()[0]))
    for K in Ks[1:]:
        print(f"K = {K} / K = {base}: {med[K] / med[base]:.2f} a step ({med[K]:.3f} against {med[base]:.3f} s), "
              f"{med[K] / K / (med[base] / base):.2f} a member")
    report_json(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

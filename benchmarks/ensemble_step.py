"""Wall time of the coarse bag's lockstep ensemble step at K members (issue #35: "on this
CPU, the wall time of K = 2 against K = 1"; on a GPU, K = 1, 16 and 64).

    python3 benchmarks/ensemble_step.py [--members 1,2] [--steps 6] [--rounds 3] [--json out.json]
    python3 benchmarks/ensemble_step.py --before REV [--members 1,2] [--rounds 2]

From tests/data/bag_coarse_8p50.npz (the 85-vertex bag tying at 8.50 s), dense solver
(``ipcjax.ensemble.ensemble_step`` needs a solve inside XLA), the capacity one
``advance`` grows to. Member 0 is the saved state; member k > 0 has a kick of 1 mm/s rms
with seed k (scenes/perturb.py). Every K's program compiles first; then, the K in turn in
this one process, ``--steps`` lockstep steps each round, controls from the choreography on
the host. Prints each round's seconds per step and, for each K, the median per step against
K = the first of ``--members``, and per member: K times the first K's means no gain over
running the members one after the other. Each round also times the unbatched jitted
``step`` over the same steps ("single"): K = 1 against it is what ``vmap`` itself costs.

With ``--before REV`` the script runs once per tree and round, alternated, each in its own
process with that tree's library first on ``sys.path`` (benchmarks/alternate.py), and
prints the after/before ratio of each K's median and of the single step.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", default="1,2", help="the K to time, comma-separated (the first is the base)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--tree", default=None, help="the checkout whose library is timed (default: this one)")
    ap.add_argument("--before", help="git revision: its library against this tree's, alternated, each in its own process")
    args = ap.parse_args()
    if args.before:
        return compare(args)
    sys.path.insert(0, ROOT)
    from benchmarks.alternate import report_json  # this tree's, before --tree's library goes first

    if args.tree:
        sys.path.insert(0, args.tree)

    from ipcjax import ensemble as E
    from ipcjax.step import advance, make_state, step
    from scenes.bag import bag_scene
    from scenes.bag_run import read_bag_state
    from scenes.perturb import film_kick

    sc = bag_scene("coarse", linear_solver="dense")
    rs = read_bag_state("tests/data/bag_coarse_8p50.npz", sc, "coarse")
    s0 = make_state(rs["x"], rs["v"], float(rs["t"]))
    k0, t0 = int(rs["step"]), float(rs["t"])
    controls = []
    for i in range(args.steps):  # the choreography's controls for each step, from member 0's start
        sc.choreography.observe(t0 + i * sc.dt, np.asarray(s0.x))
        controls.append(sc.choreography.controls_at(k0 + i, t0 + i * sc.dt))
    _, rep = advance(sc.model, sc.params, s0, controls[0], sc.dt, config=sc.config, capacity=None, validate=False)
    cap = rep.capacity

    def run(states):
        K = len(states)
        S, P = E.stack(states), E.stack([sc.params] * K)
        t = time.perf_counter()
        for c in controls:
            S, info = E.ensemble_step(sc.model, P, S, E.stack([c] * K), sc.dt, config=sc.config, capacity=cap)
            E.check_members(info)
        jax.block_until_ready(S.x)
        return (time.perf_counter() - t) / len(controls)

    single = jax.jit(lambda st, c: step(sc.model, sc.params, st, c, sc.dt, config=sc.config, capacity=cap))

    def run_single():
        st = s0
        t = time.perf_counter()
        for c in controls:
            st, info = single(st, c)
            assert int(info.code) == 0
        jax.block_until_ready(st.x)
        return (time.perf_counter() - t) / len(controls)

    Ks = [int(k) for k in args.members.split(",")]
    kicked = [s0] + [s0._replace(v=s0.v + film_kick(np.asarray(s0.x), sc.film, 1e-3, k)) for k in range(1, max(Ks))]
    members = {K: kicked[:K] for K in Ks}
    compile_s = {"single": run_single()}
    for K, states in members.items():  # compile (and warm) each program once
        t = time.perf_counter()
        run(states)
        compile_s[K] = time.perf_counter() - t
    per_step = {K: [] for K in Ks}
    per_step["single"] = []
    for r in range(args.rounds):
        per_step["single"].append(run_single())
        for K, states in members.items():
            per_step[K].append(run(states))
            print(f"round {r + 1} K = {K}: {per_step[K][-1]:.3f} s a step", flush=True)
    med = {K: statistics.median(v) for K, v in per_step.items()}
    print(f"K = 1 / single = {med.get(1, float('nan')) / med['single']:.2f} (the unbatched step: "
          f"{med['single']:.3f} s a step)")
    base = Ks[0]
    ratios = {K: med[K] / med[base] for K in Ks}
    for K in Ks[1:]:
        print(f"K = {K} / K = {base} = {ratios[K]:.2f} ({med[K]:.3f} s against {med[base]:.3f} s a step, medians of "
              f"{args.rounds}; per member {med[K] / K:.3f} s, {ratios[K] * base / K:.2f} of running them one after "
              "the other)")
    out = dict(steps=args.steps, rounds=args.rounds, members=Ks, per_step_s={str(k): v for k, v in per_step.items()},
               first_run_s={str(k): v for k, v in compile_s.items()}, ratio_to_first={str(k): v for k, v in ratios.items()},
               median_s={str(k): v for k, v in med.items()}, capacity=str(cap), device=str(jax.devices()[0]),
               tree=args.tree or os.getcwd())
    report_json(out, args.json)
    return 0


def compare(args) -> int:
    """--before: this script per tree and round, alternated (benchmarks/alternate.py)."""
    sys.path.insert(0, ROOT)
    from benchmarks.alternate import alternate, before_tree, report_json

    argv = lambda tree, root, k: [os.path.abspath(__file__), "--tree", root, "--members", args.members,  # noqa: E731
                                  "--steps", str(args.steps), "--rounds", "1"]
    with before_tree(args.before) as (_, old):
        runs = alternate(old, args.rounds, argv, report=lambda tree, k, r: print(
            f"round {k + 1} {tree}: " + ", ".join(f"{key} {v:.3f} s" for key, v in r["median_s"].items()), flush=True))
    keys = list(runs["after"][0]["median_s"])
    med = {tree: {key: statistics.median(r["median_s"][key] for r in rs) for key in keys} for tree, rs in runs.items()}
    ratios = {key: med["after"][key] / med["before"][key] for key in keys}
    out = dict(before=args.before, rounds=args.rounds, steps=args.steps, median_s=med, after_over_before=ratios, runs=runs)
    for key in keys:
        print(f"{key}: after / before = {ratios[key]:.2f} ({med['before'][key]:.3f} → {med['after'][key]:.3f} s a step)")
    report_json(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

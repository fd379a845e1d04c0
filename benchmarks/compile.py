"""The bag step's program: its size, lowering and compile time, the first and next call.

Then a check that a rollout never recompiles.

    python3 benchmarks/compile.py [--resolution full|coarse] [--steps 5] [--tree PATH | --before REV [--rounds 2]]

``--tree`` compiles another checkout's library with this script. ``--before REV``
checks REV out into a temporary ``git worktree`` and runs this script on it and on this
tree, each in its own process, alternated for ``--rounds``, and prints after/before of
each tree's best figures.

The step program's size (lines of its StableHLO), the time to trace and lower it
(``step.lower``) and to compile that (``.compile()``). Cold: the first call of the jitted
``step`` after that, in this process (it finds the program ``.compile()`` made, so it is
little more than a run; without the two lines before it, it would be trace + compile +
run).
Warm: the next call with new values and the same shapes (run only). Then ``--steps`` more
steps through the host driver, asserting that the jit cache does not grow. Prints JSON with
the cold/warm ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.alternate import add_tree_arguments, alternate, before_tree  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--resolution", choices=["full", "coarse"], default="full")
    ap.add_argument("--steps", type=int, default=5)
    add_tree_arguments(ap, "library is compiled")
    args = ap.parse_args(argv)
    if args.before:
        return compare(args)
    sys.path.insert(0, os.path.abspath(args.tree))
    import jax
    import numpy as np

    from ipcjax import candidates as C
    from ipcjax.step import advance, make_state, step
    from scenes.bag import bag_scene

    sc = bag_scene(args.resolution)
    m, p, cfg, dt = sc.model, sc.params, sc.config, sc.dt
    ch = sc.choreography
    st = make_state(sc.x)
    ch.observe(0.0, np.asarray(sc.x))  # the choreography captures the grab positions first
    cap = C.initial_capacity(m.topology)
    t = time.perf_counter()
    lowered = step.lower(m, p, st, ch.controls_at(0, 0.0), dt, config=cfg, capacity=cap)
    lower_s = time.perf_counter() - t
    hlo_lines = lowered.as_text().count("\n")
    t = time.perf_counter()
    lowered.compile()
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    st1, info = jax.block_until_ready(step(m, p, st, ch.controls_at(0, 0.0), dt, config=cfg, capacity=cap))
    cold = time.perf_counter() - t
    n_cache = step._cache_size()
    t = time.perf_counter()
    jax.block_until_ready(step(m, p, st1, ch.controls_at(1, dt), dt, config=cfg, capacity=cap))
    warm = time.perf_counter() - t
    state = st1
    for i in range(1, 1 + args.steps):
        ch.observe(float(state.t), np.asarray(state.x))
        state, rep = advance(m, p, state, ch.controls_at(i, float(state.t)), dt, config=cfg, capacity=cap, validate=False)
        assert rep.ok, rep.reason
        cap = rep.capacity
    grew = step._cache_size() - n_cache
    assert grew == 0, f"the rollout recompiled {grew} time(s)"
    out = dict(tree=os.path.abspath(args.tree), resolution=args.resolution, particles=m.n_particles, stablehlo_lines=hlo_lines, lower_s=lower_s,
               compile_s=compile_s, cold_s=cold, warm_s=warm,
               cold_over_warm=cold / warm, rollout_steps=args.steps, recompilations=grew)
    print(json.dumps(out, indent=2))
    return out


def compare(args):
    """Before and after, alternated, each run in its own process; the ratios of the best."""
    keys = ("stablehlo_lines", "lower_s", "compile_s", "cold_s", "warm_s")
    with before_tree(args.before) as (_, old):
        runs = alternate(old, args.rounds, lambda tree, root, k: [
            os.path.abspath(__file__), "--tree", root, "--resolution", args.resolution, "--steps", str(args.steps)],
            parse=lambda out: {key: json.loads(out[out.index("{"):])[key] for key in keys},
            report=lambda tree, k, r: print(f"{tree} round {k}: " + ", ".join(f"{key} {r[key]:.4g}" for key in keys),
                                            file=sys.stderr, flush=True))
    best = {t: {key: min(r[key] for r in runs[t]) for key in keys} for t in runs}
    out = dict(before=args.before, resolution=args.resolution, rounds=args.rounds, load_average=os.getloadavg(),
               runs=runs, best=best, after_over_before={key: best["after"][key] / best["before"][key] for key in keys})
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

"""Cold and warm jit time of the bag step, and a check that a rollout never recompiles.

    python3 benchmarks/compile.py [--resolution full|coarse] [--steps 5]

Cold: the first call of the jitted ``step`` in this process (trace + compile + run).
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax

import ipcjax  # noqa: F401
from ipcjax import candidates as C
from ipcjax.step import advance, make_state, step
from scenes.bag import bag_scene


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--resolution", choices=["full", "coarse"], default="full")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args(argv)
    sc = bag_scene(args.resolution)
    m, p, cfg, dt = sc["model"], sc["params"], sc["config"], sc["dt"]
    ch = sc["choreography"]
    st = make_state(sc["x"])
    cap = C.initial_capacity(m.topology)
    t = time.perf_counter()
    st1, info = jax.block_until_ready(step(m, p, st, ch.controls_at(0, 0.0), dt, config=cfg, capacity=cap))
    cold = time.perf_counter() - t
    n_cache = step._cache_size()
    t = time.perf_counter()
    jax.block_until_ready(step(m, p, st1, ch.controls_at(1, dt), dt, config=cfg, capacity=cap))
    warm = time.perf_counter() - t
    state = st1
    for i in range(1, 1 + args.steps):
        state, rep = advance(m, p, state, ch.controls_at(i, float(state.t)), dt, config=cfg, capacity=cap, validate=False)
        assert rep.ok, rep.reason
        cap = rep.capacity
    grew = step._cache_size() - n_cache
    assert grew == 0, f"the rollout recompiled {grew} time(s)"
    out = dict(resolution=args.resolution, particles=m.n_particles, cold_s=cold, warm_s=warm,
               cold_over_warm=cold / warm, rollout_steps=args.steps, recompilations=grew)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

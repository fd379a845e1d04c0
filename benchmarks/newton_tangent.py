"""Newton iterations on a window of the bag with other Hessians in the Newton direction:
the variants tried before the line search's expansion, and the library's
``Config.newton_tangent`` (docs/design.md).

    python3 benchmarks/newton_tangent.py [--state tests/data/bag_full_cinch.npz] [--steps 120] [--expansions 0]
        [--variants projected membrane_abs membrane_clamp hinge_clamp exact_first exact_first_uncapped]

Each variant runs in its own process: the bag from --state for --steps steps through the
host driver (``ipcjax.step.advance`` with a candidate cache, as ``run_bag`` steps; the
bag's choreography and Config with ``line_search_expansions`` --expansions, default 0 as
the bag's), with XLA's own threading:

* ``projected``: the specification's tangent (membrane S₊/Q₊, hinge kθ∇θ∇θᵀ), no cap on
  the direction (``newton_tangent="projected"``, ``max_direction=inf``);
* ``membrane_abs``: as ``projected`` with the membrane's exact 9×9 element Hessian, every
  eigenvalue replaced by its absolute value (patched in here, not in the library);
* ``membrane_clamp`` / ``hinge_clamp``: the exact element Hessian with negative
  eigenvalues set to 0 (patched in here);
* ``exact_first``: the bag's Config of stop 59 (``newton_tangent="exact_first"``,
  ``max_direction`` 3 mm; the bag takes the projected tangent since stop 60, docs/design.md
  "The exact tangent first"): the exact blocks of ``ipcjax.potential.EXACT_FIRST`` (the
  membrane's) factorized first, the projected ones where that fails;
* ``exact_first_uncapped``: the same with ``max_direction=inf``.

Before stop 59, ``exact_first`` was patched in here (the membrane's and the hinge's exact
blocks, no cap, through the host driver without a candidate cache): the figures of
2026-12-05 and of stop 58 in docs/benchmarks.md were taken so, and this script no longer
gives them.

Prints JSON per variant: Newton iterations (total, steps with ≥ 20 and ≥ 40), the
directions that fell back to the projected tangent, line-search trials, candidate
queries, capacity reallocations, and the wall time of the steps after the first (s; a
reallocation's recompilation included).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

STOP59_CAP = 3e-3  # m: the bag's max_direction with exact_first in stop 59
VARIANTS = ("projected", "membrane_abs", "membrane_clamp", "hinge_clamp", "exact_first", "exact_first_uncapped")


def patch(variant):
    """The patched variants' element tangents (membrane_abs, membrane_clamp, hinge_clamp)."""
    import jax.numpy as jnp

    from ipcjax.energies import bending as B
    from ipcjax.energies import membrane as M

    def mirrored(H):
        w, V = jnp.linalg.eigh(0.5 * (H + H.T))
        return (V * jnp.abs(w)) @ V.T

    nh, hinge = M.MEMBRANE_MODELS["neo_hookean"], B.BENDING_MODELS["hinge"]
    if variant == "membrane_abs":
        M.MEMBRANE_MODELS["neo_hookean"] = dataclasses.replace(nh, hessian_psd=lambda *a: mirrored(nh.hessian(*a)))
    elif variant == "membrane_clamp":
        M.MEMBRANE_MODELS["neo_hookean"] = dataclasses.replace(
            nh, hessian_psd=lambda *a: M.project_psd(nh.hessian(*a)))
    elif variant == "hinge_clamp":
        B.BENDING_MODELS["hinge"] = dataclasses.replace(hinge, hessian_psd=lambda *a: M.project_psd(hinge.hessian(*a)))


def run(variant, state, steps, expansions):
    import time

    import numpy as np

    from ipcjax.step import CandidateCache, advance, make_state
    from scenes.bag import bag_scene
    from scenes.bag_run import read_bag_state

    patch(variant)
    res = str(np.load(state)["resolution"])
    sc = bag_scene(res)
    rs = read_bag_state(state, sc, res)
    config = dataclasses.replace(sc.config, line_search_expansions=expansions)
    if variant == "exact_first":
        config = dataclasses.replace(config, newton_tangent="exact_first", max_direction=STOP59_CAP)
    elif variant == "exact_first_uncapped":
        config = dataclasses.replace(config, newton_tangent="exact_first", max_direction=float("inf"))
    else:
        config = dataclasses.replace(config, newton_tangent="projected", max_direction=float("inf"))
    st, k, t = make_state(rs["x"], rs["v"], float(rs["t"])), int(rs["step"]), float(rs["t"])
    cap, cache, reps, wall = None, CandidateCache(), [], 0.0
    for i in range(steps):
        sc.choreography.observe(t, np.asarray(st.x))
        t0 = time.perf_counter()
        st2, rep = advance(sc.model, sc.params, st, sc.choreography.controls_at(k, t), sc.dt, config=config,
                           capacity=cap, validate=cap is None, candidates=cache)
        rep.raise_if_failed()
        wall += (time.perf_counter() - t0) if i else 0.0
        cap, st, k, t = rep.capacity, st2, k + 1, float(st2.t)
        reps.append(rep)
    its = [r.iterations for r in reps]
    return dict(variant=variant, newton_tangent=config.newton_tangent, max_direction=config.max_direction,
                steps=steps, iterations=int(sum(its)), steps_ge_20=sum(i >= 20 for i in its),
                steps_ge_40=sum(i >= 40 for i in its), projected_directions=int(sum(r.projected for r in reps)),
                line_search_trials=int(sum(r.line_search_trials for r in reps)),
                candidate_queries=int(sum(r.queries for r in reps)),
                reallocations=int(sum(r.reallocations for r in reps)), wall_after_first_s=wall)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", default=os.path.join(ROOT, "tests", "data", "bag_full_cinch.npz"))
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--expansions", type=int, default=0,
                    help="Config.line_search_expansions (default 0, the bag's, as in the figures of 2026-12-05)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        variant, out = a.worker.split(":", 1)
        with open(out, "w") as f:
            json.dump(run(variant, a.state, a.steps, a.expansions), f)
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for v in a.variants:
            out = os.path.join(tmp, v + ".json")
            subprocess.run([sys.executable, __file__, "--state", a.state, "--steps", str(a.steps),
                            "--expansions", str(a.expansions), "--worker", f"{v}:{out}"], check=True)
            results.append(json.load(open(out)))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(json.dumps(dict(state=a.state, steps=a.steps, expansions=a.expansions, runs=results), indent=1))


if __name__ == "__main__":
    main()

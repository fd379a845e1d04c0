"""Newton iterations on a window of the bag with other Hessians in the Newton direction:
the variants tried before the line search's expansion (docs/design.md).

    python3 benchmarks/newton_tangent.py [--state tests/data/bag_full_cinch.npz] [--steps 120]
                                         [--variants projected membrane_abs membrane_clamp hinge_clamp exact_first]

Each variant runs in its own process: the bag from --state for --steps steps through the
host driver (``ipcjax.step.advance``, the bag's choreography and Config with
``line_search_expansions=0``), with the solver's element tangent patched in here, not in
the library:

* ``projected``: the library's (membrane S₊/Q₊, hinge kθ∇θ∇θᵀ);
* ``membrane_abs``: the membrane's exact 9×9 element Hessian with every eigenvalue
  replaced by its absolute value;
* ``membrane_clamp`` / ``hinge_clamp``: the exact element Hessian with negative eigenvalues
  set to 0;
* ``exact_first``: the exact membrane and hinge blocks (barrier, ties and the rest as
  projected), factorized first (the positive definite solve, CHOLMOD); where that finds
  a pivot ≤ 0, the projected blocks.

Prints JSON per variant: Newton iterations (total, steps with ≥ 20 and ≥ 40) and, for
``exact_first``, how many exact factorizations succeeded.
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
VARIANTS = ("projected", "membrane_abs", "membrane_clamp", "hinge_clamp", "exact_first")


def patch(variant, exact_ok):
    import jax
    import jax.numpy as jnp

    from ipcjax.energies import PSDProjection
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
    elif variant == "exact_first":
        import ipcjax.newton as N
        from ipcjax.linear_solvers import LinearSolution, positive_definite_solve

        assemble = N.gradient_and_blocks

        def both(x, problem, cs, geometry=None, **kw):
            g, hp = assemble(x, problem, cs, geometry=geometry, **kw)
            _, he = assemble(x, problem, cs, geometry=geometry, projection=PSDProjection.NONE, **kw)
            return g, (he._replace(blocks=tuple(he.blocks[:2]) + tuple(hp.blocks[2:])), hp)

        class ExactFirst:
            def init(self, pair):
                return pair

            def direction(self, g, pair):
                he, hp = pair
                dx, status = positive_definite_solve(he, -g)
                jax.debug.callback(lambda o: exact_ok.append(bool(o)), status == 0)
                dx, status = jax.lax.cond(status == 0, lambda: (dx, status),
                                          lambda: positive_definite_solve(hp, -g))
                return LinearSolution(jnp.where(status == 0, dx, 0.0), status, None)

        N.gradient_and_blocks = both
        N.linear_solver = lambda config: ExactFirst()


def run(variant, state, steps):
    import numpy as np

    from ipcjax.step import advance, make_state
    from scenes.bag import bag_scene
    from scenes.bag_run import read_bag_state

    exact_ok = []
    patch(variant, exact_ok)
    res = str(np.load(state)["resolution"])
    sc = bag_scene(res)
    rs = read_bag_state(state, sc, res)
    config = dataclasses.replace(sc.config, line_search_expansions=0)
    st, k, t = make_state(rs["x"], rs["v"], float(rs["t"])), int(rs["step"]), float(rs["t"])
    cap, its = None, []
    for _ in range(steps):
        sc.choreography.observe(t, np.asarray(st.x))
        st2, rep = advance(sc.model, sc.params, st, sc.choreography.controls_at(k, t), sc.dt, config=config,
                           capacity=cap, validate=cap is None)
        rep.raise_if_failed()
        cap, st, k, t = rep.capacity, st2, k + 1, float(st2.t)
        its.append(rep.iterations)
    out = dict(variant=variant, steps=steps, iterations=int(sum(its)), steps_ge_20=sum(i >= 20 for i in its),
               steps_ge_40=sum(i >= 40 for i in its))
    if variant == "exact_first":
        out.update(exact_factorizations=len(exact_ok), exact_succeeded=int(sum(exact_ok)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", default=os.path.join(ROOT, "tests", "data", "bag_full_cinch.npz"))
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        variant, out = a.worker.split(":", 1)
        with open(out, "w") as f:
            json.dump(run(variant, a.state, a.steps), f)
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for v in a.variants:
            out = os.path.join(tmp, v + ".json")
            subprocess.run([sys.executable, __file__, "--state", a.state, "--steps", str(a.steps),
                            "--worker", f"{v}:{out}"], check=True)
            results.append(json.load(open(out)))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(json.dumps(dict(state=a.state, steps=a.steps, runs=results), indent=1))


if __name__ == "__main__":
    main()

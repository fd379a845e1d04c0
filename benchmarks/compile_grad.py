"""A rollout gradient's program: its size, lowering and compile time, and the gradient.

    python3 benchmarks/compile_grad.py [--n 4] [--steps 2] [--tree PATH | --before REV [--rounds 2]]

The program is ``jax.jit(jax.grad(loss))`` for the mean height after ``--steps`` steps of
a drape (``scenes.film.drape_scene(n, size=0.03, sphere_radius=0.01, gap=0.5e-3)``, the
scene of tests/test_rollout_failures.py) through the implicit VJP of
:class:`ipcjax.implicit.Rollout`, with the capacity a first call outside jit sized. It
prints JSON: lines of its StableHLO, trace-and-lower and XLA compile seconds, and the
gradient in E (to check that both trees compute the same one). ``--before REV`` checks REV
out into a temporary ``git worktree`` and runs this script on it and on this tree, each in
its own process, alternated for ``--rounds``, and prints after/before of each tree's best
figures.
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
    ap.add_argument("--n", type=int, default=4, help="film vertices per side")
    ap.add_argument("--steps", type=int, default=2)
    add_tree_arguments(ap, "library is compiled")
    args = ap.parse_args(argv)
    if args.before:
        return compare(args)
    sys.path.insert(0, os.path.abspath(args.tree))
    import warnings

    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    from ipcjax.implicit import NonDifferentiableWarning, make_rollout, stack_controls
    from ipcjax.model import Config, Controls, Params
    from scenes.film import drape_scene

    warnings.simplefilter("ignore", NonDifferentiableWarning)  # the symmetric start's kinks
    sc = drape_scene(n=args.n, size=0.03, sphere_radius=0.01, gap=0.5e-3)
    m = sc["model"]
    ctl = stack_controls([Controls.empty(m.n_particles)] * args.steps)
    x0 = jnp.asarray(sc["x"])
    roll = make_rollout(m, Config())
    p = Params.film_defaults()
    roll(p, x0, jnp.zeros_like(x0), ctl, 1 / 240)  # sizes the capacity outside jit
    loss = lambda p: roll(p, x0, jnp.zeros_like(x0), ctl, 1 / 240)[0][-1, :, 2].mean()
    t = time.perf_counter()
    lowered = jax.jit(jax.grad(loss)).lower(p)
    lower_s = time.perf_counter() - t
    lines = lowered.as_text().count("\n")
    t = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t
    g = compiled(p)
    print(json.dumps({"tree": os.path.abspath(args.tree), "stablehlo_lines": lines, "lower_s": round(lower_s, 2),
                      "compile_s": round(compile_s, 2), "grad_youngs_modulus": float(g.youngs_modulus),
                      "capacity": str(roll.capacity)}))
    return 0


def compare(args):
    argv = lambda tree, root, k: [os.path.abspath(__file__), "--tree", root, "--n", str(args.n),
                                  "--steps", str(args.steps)]
    report = lambda tree, k, r: print(f"round {k + 1} {tree}: {r['stablehlo_lines']} lines, lower "
                                      f"{r['lower_s']} s, compile {r['compile_s']} s", flush=True)
    with before_tree(args.before) as (_, old):
        runs = alternate(old, args.rounds, argv, report=report)
    out = {"before": args.before, "rounds": args.rounds, "runs": runs}
    for key in ("stablehlo_lines", "lower_s", "compile_s"):
        b, a = (min(r[key] for r in runs[t]) for t in ("before", "after"))
        out[f"{key}_after_over_before"] = round(a / b, 3)
    grads = {t: {r["grad_youngs_modulus"] for r in runs[t]} for t in runs}
    out["same_gradient"] = grads["before"] == grads["after"] and len(grads["after"]) == 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

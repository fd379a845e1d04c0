"""Gradient cost and accuracy of the implicit VJP, measured side by side in one run.

    python3 benchmarks/gradient.py [--n 6] [--steps 10] [--repeat 5]

Scene: an n×n film draped with friction on a fixed sphere (contact throughout). Prints
JSON with the forward rollout time, the forward+backward time and their ratio, for the
exact and the projected backward Hessian, and the relative difference between the two
gradients (the error the projected Hessian causes).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

import ipcjax  # noqa: F401
from benchmarks.timing import median_time
from ipcjax import candidates as C
from ipcjax.implicit import make_rollout, stack_controls
from ipcjax.model import Config, Controls, Params
from scenes.film import drape_scene



def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    sc = drape_scene(n=args.n, size=0.03, sphere_radius=0.02, gap=4e-4)
    m, cfg = sc["model"], Config()
    cap = C.initial_capacity(m.topology)
    ctl = stack_controls([Controls.empty(m.n_particles, tolerance=5e-7)] * args.steps)
    x0 = jnp.asarray(sc["x"]); v0 = jnp.zeros_like(x0)
    W = jnp.asarray(np.random.default_rng(0).normal(size=x0.shape))
    p0 = Params.film_defaults()
    out = dict(particles=m.n_particles, steps=args.steps)
    grads = {}
    for hess in ("exact", "projected"):
        roll = make_rollout(m, cfg, cap, hessian=hess)
        loss = lambda p: jnp.sum(W * roll(p, x0, v0, ctl, 1 / 240)[0][-1])
        fwd = jax.jit(loss)
        both = jax.jit(jax.value_and_grad(loss))
        t_f = median_time(lambda: fwd(p0), args.repeat)
        t_b = median_time(lambda: both(p0), args.repeat)
        grads[hess] = both(p0)[1]
        out[hess] = dict(forward_s=t_f, forward_backward_s=t_b, ratio=t_b / t_f)
    rel = {}
    for name in ("youngs_modulus", "poisson", "bending_scale", "friction", "barrier_stiffness"):
        a, b = float(getattr(grads["projected"], name)), float(getattr(grads["exact"], name))
        rel[name] = abs(a - b) / max(abs(b), 1e-300)
    out["projected_vs_exact_relative_difference"] = rel
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

"""Gradient cost and accuracy of the implicit VJP, measured side by side in one run.

    python3 benchmarks/gradient.py [--n 6] [--steps 10] [--repeat 5] [--memory-steps 2,4,8,16]
    python3 benchmarks/gradient.py --bag-state runs/bag/state.npz [--steps 4] [--repeat 3]

Scene: an n×n film draped with friction on a fixed sphere (contact throughout). Prints
JSON with the forward rollout time, the forward+backward time and their ratio, for the
exact and the projected backward Hessian, and the relative difference between the two
gradients (the error the projected Hessian causes).

With ``--bag-state`` the scene is instead a window of --steps steps of the bag from a saved
``ipcjax bag`` state (``fitting.bag.bag_window``, the same rollout ``ipcjax fit --scene bag``
differentiates): forward and forward+backward of a scalar loss on the final frame, exact
Hessian only (no memory figures).

Memory against rollout length: XLA's own buffer assignment for the compiled forward and
forward+backward programs (``compiled.memory_analysis()``: temporaries + arguments +
outputs, bytes), for each length in --memory-steps, with the per-step slope from a
least-squares line. This is the peak the compiled program reserves, deterministic and
independent of the machine's other load. For comparison it prints the size of one
dense free-DOF Hessian, (3F)² · 8 bytes: what storing each step's factorization would
cost per step.
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



def _program_bytes(fn, *args):
    ma = jax.jit(fn).lower(*args).compile().memory_analysis()
    return int(ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes)


def memory_against_length(m, cfg, cap, x0, v0, W, p0, lengths):
    """Compiled forward and forward+backward bytes per rollout length, and the slopes."""
    roll = make_rollout(m, cfg, cap, tolerance=None)  # the controls' tolerance as stated
    rows = []
    for T in lengths:
        ctl = stack_controls([Controls.empty(m.n_particles, tolerance=5e-7)] * T)
        loss = lambda p, ctl=ctl: jnp.sum(W * roll(p, x0, v0, ctl, 1 / 240)[0][-1])
        rows.append(dict(steps=T, forward_bytes=_program_bytes(loss, p0),
                         forward_backward_bytes=_program_bytes(jax.value_and_grad(loss), p0)))
    T = np.array([r["steps"] for r in rows], float)
    slope = lambda key: float(np.polyfit(T, [r[key] for r in rows], 1)[0]) if len(T) > 1 else None
    dofs = 3 * int(m.n_free)
    return dict(rows=rows, forward_bytes_per_step=slope("forward_bytes"),
                forward_backward_bytes_per_step=slope("forward_backward_bytes"),
                one_dense_hessian_bytes=dofs * dofs * 8, free_dofs=dofs)


def bag_window_ratio(args):
    """Forward vs forward+backward of the bag window rollout (exact Hessian)."""
    from fitting.bag import bag_window

    w = bag_window(args.bag_state, args.steps)
    sc = w["scene"]
    m = sc["model"]
    roll = make_rollout(m, w["rollout_config"], w["capacity"], round_fp32=False, tolerance=None)
    x0, v0 = jnp.asarray(w["x0"]), jnp.asarray(w["v0"])
    W = jnp.asarray(np.random.default_rng(0).normal(size=x0.shape))
    loss = lambda p: jnp.sum(W * roll(p, x0, v0, w["controls"], w["dt"])[0][-1])
    fwd = jax.jit(loss)
    both = jax.jit(jax.value_and_grad(loss))
    p0 = w["params"]
    t_f = median_time(lambda: fwd(p0), args.repeat)
    t_b = median_time(lambda: both(p0), args.repeat)
    g = both(p0)[1]
    out = dict(scene="bag window", resolution=sc["resolution"], particles=m.n_particles, free_dofs=3 * int(m.n_free),
               steps=args.steps, t0_s=w["t0"], phases=w["phases"],
               exact=dict(forward_s=t_f, forward_backward_s=t_b, ratio=t_b / t_f),
               gradient={n: float(getattr(g, n)) for n in ("youngs_modulus", "friction", "bending_scale")})
    print(json.dumps(out, indent=2))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--memory-steps", default="2,4,8,16",
                    help="comma-separated rollout lengths for the memory figures ('' to skip)")
    ap.add_argument("--bag-state", default=None, help="time a bag window from this `ipcjax bag` state instead")
    args = ap.parse_args(argv)
    if args.bag_state:
        return bag_window_ratio(args)
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
        roll = make_rollout(m, cfg, cap, hessian=hess, tolerance=None)
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
    lengths = [int(t) for t in args.memory_steps.split(",") if t.strip()]
    if lengths:
        out["memory"] = memory_against_length(m, cfg, cap, x0, v0, W, p0, lengths)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

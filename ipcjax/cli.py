"""Command line: ``ipcjax drape | verlet`` (the bag, fit and compare jobs join as they land)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def _drape(argv):
    ap = argparse.ArgumentParser(prog="ipcjax drape", description=(
        "Drape a 30 µm film over a fixed sphere with friction and audit every frame for "
        "self-intersection. Writes trajectory.npz and summary.json to --out."))
    ap.add_argument("--resolution", type=int, default=10, help="film vertices per side (default 10)")
    ap.add_argument("--steps", type=int, default=60, help="timesteps of 1/240 s (default 60)")
    ap.add_argument("--size", type=float, default=0.08, help="film side length in m (default 0.08)")
    ap.add_argument("--radius", type=float, default=0.02, help="sphere radius in m (default 0.02)")
    ap.add_argument("--membrane", choices=["neo_hookean", "stvk"], default="neo_hookean")
    ap.add_argument("--bending", choices=["hinge", "discrete_shell"], default="hinge")
    ap.add_argument("--out", default="runs/drape", help="output folder (default runs/drape)")
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from ipcjax.audit import audit_trajectory
    from ipcjax.model import Config, Controls, Params
    from ipcjax.step import advance, make_state
    from scenes.film import drape_scene

    sc = drape_scene(n=args.resolution, size=args.size, sphere_radius=args.radius)
    model = sc["model"]
    params = Params.film_defaults()
    config = Config(membrane=args.membrane, bending=args.bending)
    controls = Controls.empty(model.n_particles)
    state = make_state(sc["x"])
    dt = 1.0 / 240.0
    frames, times, reports = [np.asarray(state.x)], [0.0], []
    capacity = None
    t0 = time.perf_counter()
    bar = tqdm(range(args.steps), desc="drape", unit="step")
    for _ in bar:
        state, rep = advance(model, params, state, controls, dt, config, capacity)
        capacity = rep.capacity
        if not rep.ok:
            bar.close()
            print(f"step at t = {float(state.t):.4f} s failed: {rep.reason}", file=sys.stderr)
            break
        reports.append(rep)
        frames.append(np.asarray(state.x))
        times.append(float(state.t))
        bar.set_postfix(t=f"{float(state.t):.3f}s", newton=rep.iterations, gap=f"{rep.min_gap*1e3:.3f}mm")
    wall = time.perf_counter() - t0
    frames = np.stack(frames)
    n_film = len(np.unique(sc["film_triangles"]))
    audit = audit_trajectory(frames, sc["film_triangles"], [sc["sphere"]], [args.radius])
    os.makedirs(args.out, exist_ok=True)
    np.savez_compressed(os.path.join(args.out, "trajectory.npz"), film=frames[:, :n_film],
                        faces=sc["film_triangles"], time=np.asarray(times))
    summary = dict(
        steps=len(reports), simulated_s=times[-1], wall_s=wall,
        newton_iterations=int(sum(r.iterations for r in reports)),
        min_gap_m=float(min((r.min_gap for r in reports), default=np.inf)),
        frames=audit["frames"], frames_with_self_intersection=audit["frames_with_self_intersection"],
        min_film_sphere_gap_m=float(np.min(audit["min_film_sphere"])),
        max_subdivision_depth=int(max((r.max_depth for r in reports), default=0)),
    )
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))
    return 0 if len(reports) == args.steps and audit["frames_with_self_intersection"] == 0 else 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    jobs = {"drape": _drape}
    try:
        from ipcjax import verlet as _verlet
        jobs["verlet"] = _verlet.main
    except ImportError:  # pragma: no cover
        pass
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in jobs:
        print("usage: ipcjax {" + ",".join(jobs) + "} [options]   (ipcjax JOB --help for options)")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return int(jobs[argv[0]](argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())

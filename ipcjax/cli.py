"""Command line: ``ipcjax drape | bag | fit | verlet``.

The CLI is the application layer: it is the one place in ``ipcjax`` that imports
``scenes`` and ``fitting``, lazily, inside each job.
"""
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
    ap.add_argument("--linear-solver", choices=["dense", "cg"], default="dense",
                    help="Newton linear solve: dense Cholesky, or matrix-free CG for large films")
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
    config = Config(membrane=args.membrane, bending=args.bending, linear_solver=args.linear_solver)
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


def _finite_or_none(obj):
    """JSON-safe copy: non-finite floats (an unmeasured gap is +inf) become null."""
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _bag(argv):
    ap = argparse.ArgumentParser(prog="ipcjax bag", description=(
        "The bag experiment (spec §5): place a 30 µm disk bag over a bin, drop seven spheres, carry "
        "the bag to the floor, unfold, gather, cinch, tie and release. Writes trajectory.npz, "
        "state.npz (for --resume) and summary.json (measurements and self-intersection audit) to --out."))
    ap.add_argument("--until", type=float, default=10.5, help="simulated end time in s (default 10.5)")
    ap.add_argument("--save-every", type=int, default=1, help="save every n-th step's frame (default 1)")
    ap.add_argument("--resolution", choices=["full", "coarse"], default="full",
                    help="full: 15 rings × 32 columns (481 vertices); coarse: 7 × 12 (85)")
    ap.add_argument("--out", default="runs/bag", help="run folder (default runs/bag)")
    ap.add_argument("--resume", default=None, help="state .npz written by an earlier run (its state.npz)")
    ap.add_argument("--checkpoint-every", type=int, default=120,
                    help="rewrite trajectory.npz and state.npz every n steps (default 120)")
    args = ap.parse_args(argv)
    if args.save_every < 1 or args.checkpoint_every < 1:
        ap.error("--save-every and --checkpoint-every must be ≥ 1")

    from tqdm import tqdm

    from ipcjax.audit import audit_trajectory
    from ipcjax.step import advance, make_state
    from scenes.bag import UnfoldIncomplete, check_unfolded, bag_scene, measurements

    sc = bag_scene(args.resolution)
    model, params, config, dt = sc["model"], sc["params"], sc["config"], sc["dt"]
    choreo = sc["choreography"]
    film_idx, sph_idx = sc["film"], sc["spheres"]
    t_unfold_end = choreo.track("unfold").t_off
    os.makedirs(args.out, exist_ok=True)
    traj_path = os.path.join(args.out, "trajectory.npz")
    state_path = os.path.join(args.out, "state.npz")

    step_index, unfold_checked = 0, False
    if args.resume:
        rs = np.load(args.resume)
        if str(rs["resolution"]) != args.resolution:
            ap.error(f"--resume state is for resolution {rs['resolution']}, not {args.resolution}")
        state = make_state(rs["x"], rs["v"], float(rs["t"]))
        step_index, unfold_checked = int(rs["step"]), bool(rs["unfold_checked"])
        choreo.load_captures(rs)
    else:
        state = make_state(sc["x"])
    frames_f, frames_s, times = [], [], []
    if args.resume and os.path.exists(traj_path):
        tr = np.load(traj_path)
        keep = tr["time"] <= float(state.t) + 1e-9
        frames_f, frames_s, times = list(tr["film"][keep]), list(tr["spheres"][keep]), list(tr["time"][keep])
    if not times or times[-1] < float(state.t) - 1e-9:
        x = np.asarray(state.x)
        frames_f.append(x[film_idx]); frames_s.append(x[sph_idx]); times.append(float(state.t))

    def write():
        np.savez_compressed(traj_path, film=np.stack(frames_f), spheres=np.stack(frames_s),
                            faces=sc["faces"], time=np.asarray(times))
        np.savez(state_path, x=np.asarray(state.x), v=np.asarray(state.v), t=float(state.t), step=step_index,
                 unfold_checked=unfold_checked, resolution=args.resolution, **choreo.captures_npz())

    n_total = int(round(args.until / dt))
    bar = tqdm(total=max(n_total - step_index, 0), desc="bag", unit="step")
    failure, reports, capacity = None, [], None
    min_gap = np.inf
    wall0 = time.perf_counter()
    first = True
    while step_index < n_total:
        t = float(state.t)
        phase = choreo.phase_at(t)
        x_now = np.asarray(state.x)
        choreo.observe(t, x_now)
        if not unfold_checked and t >= t_unfold_end - 1e-9:
            try:
                check_unfolded(x_now, sc["mesh"])
            except UnfoldIncomplete as e:
                failure = dict(phase="unfold", time_s=t, reason=f"unfold check: {e}", columns=e.columns)
                break
            unfold_checked = True
        try:
            state_new, rep = advance(model, params, state, choreo.controls_at(step_index, t), dt, config,
                                     capacity, validate=first)
        except KeyboardInterrupt:  # keep everything so far; --resume continues from here
            failure = dict(phase=phase, time_s=t, step=step_index, reason="interrupted")
            break
        first = False
        capacity = rep.capacity
        if not rep.ok:
            failure = dict(phase=phase, time_s=t, step=step_index, reason=rep.reason, code=int(rep.code))
            break
        state = state_new
        step_index += 1
        reports.append(rep)
        min_gap = min(min_gap, rep.min_gap)
        if step_index % args.save_every == 0 or step_index == n_total:
            x = np.asarray(state.x)
            frames_f.append(x[film_idx]); frames_s.append(x[sph_idx]); times.append(float(state.t))
        if step_index % args.checkpoint_every == 0:
            write()
        bar.update(1)
        bar.set_postfix(phase=phase, t=f"{float(state.t):.3f}s", gap=f"{rep.min_gap * 1e3:.4f}mm",
                        newton=rep.iterations, depth=rep.max_depth)
    bar.close()
    wall = time.perf_counter() - wall0
    write()
    if failure:
        print(f"bag: stopped in phase {failure['phase']!r} at t = {failure['time_s']:.4f} s: {failure['reason']}",
              file=sys.stderr)
    film, sph = np.stack(frames_f), np.stack(frames_s)
    audit = audit_trajectory(np.concatenate([film, sph], axis=1), sc["faces"],
                             np.arange(film.shape[1], film.shape[1] + sph.shape[1]), sc["sphere_radius"])
    summary = dict(
        resolution=args.resolution, steps_this_run=len(reports), step_index=step_index,
        simulated_s=float(state.t), wall_s=wall, steps_per_s=len(reports) / wall if wall > 0 else None,
        newton_iterations=int(sum(r.iterations for r in reports)),
        max_subdivision_depth=int(max((r.max_depth for r in reports), default=0)),
        min_gap_m=float(min_gap), unfold_checked=unfold_checked, failure=failure,
        measurements=measurements(film, sph, np.asarray(times), sc),
        audit=dict(frames=audit["frames"], frames_with_self_intersection=audit["frames_with_self_intersection"],
                   min_film_film_m=float(np.min(audit["min_film_film"])),
                   min_film_sphere_m=float(np.min(audit["min_film_sphere"]))),
    )
    summary = _finite_or_none(summary)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))
    return 1 if failure or audit["frames_with_self_intersection"] else 0


def _fit(argv):
    ap = argparse.ArgumentParser(prog="ipcjax fit", description=(
        "Fit a material parameter to a measured shape with optax and implicit gradients. "
        "Default scene: a clamped 30 µm film cantilever drooping under gravity; the "
        "measurement is its tip height after --steps steps. Without --target the target is "
        "simulated with the film's default parameters (synthetic recovery from --start)."))
    ap.add_argument("--param", default="bending_scale",
                    choices=["bending_scale", "youngs_modulus", "thickness"], help="parameter to fit")
    ap.add_argument("--start", type=float, default=None, help="initial value (default 2× the true value)")
    ap.add_argument("--target", type=float, default=None, help="measured tip height in m")
    ap.add_argument("--steps", type=int, default=6, help="rollout steps of 1/240 s (default 6)")
    ap.add_argument("--iterations", type=int, default=80)
    ap.add_argument("--lr", type=float, default=0.1, help="adam learning rate on log-parameters")
    ap.add_argument("--out", default="runs/fit", help="output folder (default runs/fit)")
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import optax

    from fitting.fit import fit, plot_history
    from ipcjax.candidates import initial_capacity
    from ipcjax.implicit import make_rollout, stack_controls
    from ipcjax.model import Config, Controls, Params
    from scenes.film import cantilever_scene

    sc = cantilever_scene()
    m = sc["model"]
    roll = make_rollout(m, Config(), initial_capacity(m.topology), round_fp32=False)
    ctl = stack_controls([Controls.empty(m.n_particles, tolerance=1e-10)] * args.steps)
    x0 = jnp.asarray(sc["x"])
    tip = jnp.asarray(sc["tip"])

    @jax.jit
    def rollout(p):
        frames, _, codes = roll(p, x0, jnp.zeros_like(x0), ctl, 1 / 240)
        return frames, codes

    measure = lambda frames: jnp.mean(frames[-1, tip, 2])
    truth = Params.film_defaults()
    target = args.target if args.target is not None else float(measure(rollout(truth)[0]))
    true_value = float(getattr(truth, args.param))
    start = args.start if args.start is not None else 2.0 * true_value
    p0 = truth._replace(**{args.param: jnp.asarray(start)})
    res = fit(rollout, measure, target, p0, [args.param], optimizer=optax.adam(args.lr, b1=0.5),
              iterations=args.iterations, loss_tol=1e-14, scale=1e-3)
    os.makedirs(args.out, exist_ok=True)
    res.to_json(os.path.join(args.out, "fit.json"))
    try:
        plot_history(res, os.path.join(args.out, "fit.png"))
    except ImportError:
        print("matplotlib not installed: no plot (pip install -e '.[plot]')", file=sys.stderr)
    fitted = float(getattr(res.params, args.param))
    summary = dict(param=args.param, start=start, fitted=fitted, target_tip_height_m=target,
                   iterations=len(res.history), final_loss=res.history[-1]["loss"], converged=res.converged)
    if args.target is None:
        summary["true_value"] = true_value
        summary["relative_error"] = abs(fitted - true_value) / abs(true_value)
    print(json.dumps(summary, indent=2))
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    jobs = {"drape": _drape, "bag": _bag, "fit": _fit}
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

"""Command line: ``ipcjax drape | bag | fit | compare | verlet``.

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

from ipcjax import runfolder
from ipcjax.model import LINEAR_SOLVERS


def _check(ok: bool, message: str) -> None:
    """Refuse a bad input: ``main`` prints ``message`` as one line and exits 2."""
    if not ok:
        raise ValueError(message)


def _positive(flag: str, value: float) -> None:
    _check(np.isfinite(value) and value > 0, f"{flag} must be a finite number > 0; got {value}")


def _first_step_bar(job: str, total: int, done: int = 0):
    """Progress bar (stderr) started after the first step, so that its rate and ETA leave out
    the jit compilation that step pays for; ``done`` steps, the first included, are already done."""
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc=job, unit="step")


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
    ap.add_argument("--linear-solver", choices=list(LINEAR_SOLVERS), default="dense",
                    help="Newton linear solve: dense Cholesky, sparse LDLT on the host, or matrix-free CG for large films")
    ap.add_argument("--out", default="runs/drape", help="output folder (default runs/drape)")
    args = ap.parse_args(argv)
    _check(args.steps >= 1, f"--steps must be ≥ 1; got {args.steps}")
    _check(args.resolution >= 2, f"--resolution must be ≥ 2 vertices per side; got {args.resolution}")
    _positive("--size", args.size)
    _positive("--radius", args.radius)
    runfolder.prepare(args.out)

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
    capacity, bar = None, None
    t0 = time.perf_counter()
    print("drape: compiling (first step)…", file=sys.stderr, flush=True)
    for _ in range(args.steps):
        state, rep = advance(model, params, state, controls, dt, config=config, capacity=capacity)
        capacity = rep.capacity
        if not rep.ok:
            if bar is not None:
                bar.close()
            print(f"step at t = {float(state.t):.4f} s failed: {rep.reason}", file=sys.stderr)
            break
        reports.append(rep)
        frames.append(np.asarray(state.x))
        times.append(float(state.t))
        if bar is None:
            bar = _first_step_bar("drape", args.steps, 1)
        else:
            bar.update(1)
        bar.set_postfix(t=f"{float(state.t):.3f}s", newton=rep.iterations, gap=f"{rep.min_gap*1e3:.3f}mm")
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - t0
    frames = np.stack(frames)
    n_film = len(np.unique(sc["film_triangles"]))
    audit = audit_trajectory(frames, sc["film_triangles"], [sc["sphere"]], [args.radius])
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
    print(runfolder.write_json(os.path.join(args.out, "summary.json"), summary))
    return 0 if len(reports) == args.steps and audit["frames_with_self_intersection"] == 0 else 1


def _read_bag_state(path, sc, resolution):
    """The ``--resume`` state, checked against this bag scene before anything runs: the
    checks of :func:`ipcjax.runfolder.read_state`, its step index against its time, and the
    choreography captures (grab positions, tie lengths) that its earlier steps recorded.
    Loads the captures into ``sc["choreography"]``.

    Raises:
        FileNotFoundError, ValueError: one message naming the file and what is wrong.
    """
    from scenes.bag import EPS_T

    ch, dt = sc["choreography"], sc["dt"]
    rs = runfolder.read_state(path, sc["model"].n_particles, resolution)
    t, step = float(rs["t"]), int(rs["step"])
    _check(abs(step * dt - t) < 1e-6,
           f"--resume {path}: step {step} does not match t = {t:.6f} s (steps of {dt:.6f} s)")
    # observe() records a capture when a step starts at or after its track's start; one that
    # an earlier step recorded cannot be re-made from the saved positions, so it must be here
    t_last = t - dt  # start of the state's last step
    due = [tr.name for tr in ch.tracks if tr.needs_capture() and t_last + EPS_T >= tr.t_on]
    if t_last + EPS_T >= ch.tie.t_on:
        due.append(ch.tie.name)
    missing = [f"capture_{n}" for n in due if f"capture_{n}" not in rs]
    _check(not missing, f"--resume {path}: missing {', '.join(missing)}, which the choreography records "
                        f"before t = {t:.4f} s")
    tie = rs.get(f"capture_{ch.tie.name}")
    _check(tie is None or tie.shape == (len(ch.tie.pairs),),
           f"--resume {path}: capture_{ch.tie.name} has shape {None if tie is None else tie.shape}; "
           f"expected ({len(ch.tie.pairs)},) tie lengths")
    try:
        ch.load_captures(rs)
    except ValueError as e:
        raise ValueError(f"--resume {path}: {e}") from None
    return rs


def _read_bag_trajectory(path, sc):
    """An earlier run's trajectory.npz in the ``--out`` folder that ``--resume`` extends, checked
    against the scene (film (T, N_f, 3), spheres (T, S, 3), time (T,))."""
    tr = runfolder.read_npz(path, "--out holds")
    missing = [k for k in ("film", "spheres", "time") if k not in tr]
    _check(not missing, f"--out holds {path} without {', '.join(missing)}: not an `ipcjax bag` trajectory")
    n_t, nf, ns = tr["time"].shape[0] if tr["time"].ndim == 1 else -1, len(sc["film"]), len(sc["spheres"])
    _check(tr["time"].shape == (n_t,) and tr["film"].shape == (n_t, nf, 3) and tr["spheres"].shape == (n_t, ns, 3),
           f"--out holds {path} with film {tr['film'].shape}, spheres {tr['spheres'].shape}, time "
           f"{tr['time'].shape}; this scene needs (T, {nf}, 3), (T, {ns}, 3), (T,): choose another --out")
    return tr


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
    ap.add_argument("--mesh-every", type=int, default=24,
                    help="write every n-th saved frame as .vtu/.obj under meshes/ (default 24; 0: none)")
    ap.add_argument("--no-pictures", action="store_true",
                    help="skip the time-series plot and the phase snapshots (PNG)")
    ap.add_argument("--linear-solver", choices=list(LINEAR_SOLVERS), default="sparse",
                    help="Newton linear solve (default sparse: host LDLT, exact; dense: FP64 Cholesky)")
    args = ap.parse_args(argv)
    _positive("--until", args.until)
    _check(args.save_every >= 1, f"--save-every must be ≥ 1; got {args.save_every}")
    _check(args.checkpoint_every >= 1, f"--checkpoint-every must be ≥ 1; got {args.checkpoint_every}")
    _check(args.mesh_every >= 0, f"--mesh-every must be ≥ 0; got {args.mesh_every}")

    from ipcjax.audit import audit_trajectory
    from ipcjax.step import advance, make_state
    from scenes.bag import UnfoldIncomplete, check_unfolded, bag_scene, measurements

    sc = bag_scene(args.resolution, linear_solver=args.linear_solver)
    model, params, config, dt = sc["model"], sc["params"], sc["config"], sc["dt"]
    choreo = sc["choreography"]
    film_idx, sph_idx = sc["film"], sc["spheres"]
    t_unfold_end = choreo.track("unfold2").t_off

    step_index, unfold_checked = 0, False
    if args.resume:
        rs = _read_bag_state(args.resume, sc, args.resolution)
        state = make_state(rs["x"], rs["v"], float(rs["t"]))
        step_index, unfold_checked = int(rs["step"]), bool(rs["unfold_checked"])
    else:
        state = make_state(sc["x"])
    n_total = int(round(args.until / dt))
    _check(n_total > step_index, f"--until {args.until:g} s leaves no step to run after t = {float(state.t):.4f} s "
                                 f"(one step is {dt:.6f} s)")
    runfolder.prepare(args.out)
    traj_path = os.path.join(args.out, "trajectory.npz")
    state_path = os.path.join(args.out, "state.npz")
    frames_f, frames_s, times = [], [], []
    if args.resume and os.path.exists(traj_path):
        tr = _read_bag_trajectory(traj_path, sc)
        keep = tr["time"] <= float(state.t) + 1e-9
        frames_f, frames_s, times = list(tr["film"][keep]), list(tr["spheres"][keep]), list(tr["time"][keep])
    if not times or times[-1] < float(state.t) - 1e-9:
        x = np.asarray(state.x)
        frames_f.append(x[film_idx]); frames_s.append(x[sph_idx]); times.append(float(state.t))

    def write():
        np.savez_compressed(traj_path, film=np.stack(frames_f), spheres=np.stack(frames_s),
                            faces=sc["faces"], time=np.asarray(times))
        runfolder.write_state(state_path, state.x, state.v, state.t, step_index, unfold_checked,
                              args.resolution, choreo.captures_npz())

    n_run = n_total - step_index
    bar = None  # started after the first step (see _first_step_bar)
    failure, reports, capacity = None, [], None
    min_gap = np.inf
    wall0 = time.perf_counter()
    first_step_s = None  # wall of this run's first step, which includes the jit compilation
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
        if first_step_s is None:
            print("bag: compiling (first step)…", file=sys.stderr, flush=True)
        try:
            state_new, rep = advance(model, params, state, choreo.controls_at(step_index, t), dt,
                                     config=config, capacity=capacity, validate=first_step_s is None)
        except KeyboardInterrupt:  # keep everything so far; --resume continues from here
            failure = dict(phase=phase, time_s=t, step=step_index, reason="interrupted")
            break
        if first_step_s is None:
            first_step_s = time.perf_counter() - wall0
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
        if bar is None:
            bar = _first_step_bar("bag", n_run, 1)
        else:
            bar.update(1)
        bar.set_postfix(phase=phase, t=f"{float(state.t):.3f}s", gap=f"{rep.min_gap * 1e3:.4f}mm",
                        newton=rep.iterations, depth=rep.max_depth)
    if bar is not None:
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
        linear_solver=config.linear_solver, first_step_s=first_step_s,
        wall_s_per_simulated_s_after_first_step=((wall - first_step_s) / ((len(reports) - 1) * dt)
                                                 if len(reports) > 1 and first_step_s is not None else None),
        newton_iterations=int(sum(r.iterations for r in reports)),
        max_subdivision_depth=int(max((r.max_depth for r in reports), default=0)),
        min_gap_m=float(min_gap), unfold_checked=unfold_checked, failure=failure,
        measurements=measurements(film, sph, np.asarray(times), sc),
        audit=dict(frames=audit["frames"], frames_with_self_intersection=audit["frames_with_self_intersection"],
                   min_film_film_m=float(np.min(audit["min_film_film"])),
                   min_film_sphere_m=float(np.min(audit["min_film_sphere"]))),
    )
    summary["outputs"] = _bag_outputs(args, sc, film, sph, np.asarray(times), audit, choreo.phases)
    print(runfolder.write_json(os.path.join(args.out, "summary.json"), summary))
    return 1 if failure or audit["frames_with_self_intersection"] else 0


def _bag_outputs(args, sc, film, sph, times, audit, phases):
    """Mesh sequence, time-series plot and phase snapshots of a bag run (paths relative to --out)."""
    from scenes.outputs import export_meshes, phase_snapshots, plot_timeseries

    out = {}
    if args.mesh_every:
        paths = export_meshes(os.path.join(args.out, "meshes"), film, sph, sc["faces"], sc["sphere_radius"],
                              times, every=args.mesh_every)
        out["meshes"] = dict(folder="meshes", files=len(paths), every_saved_frame=args.mesh_every,
                             paraview="meshes/frame.pvd")
    if not args.no_pictures:
        plot_timeseries(os.path.join(args.out, "timeseries.png"), times, film, sc["rim"] - sc["film"][0],
                        sc["neck"] - sc["film"][0], audit, phases, title=f"bag ({sc['resolution']})")
        x0 = np.asarray(sc["x"])
        bin_tris = np.asarray(sc["bin_triangles"])
        snaps = phase_snapshots(os.path.join(args.out, "snapshots"), times, film, sph, sc["faces"],
                                sc["sphere_radius"], phases, obstacles=(x0, bin_tris))
        out["timeseries"] = "timeseries.png"
        out["snapshots"] = [os.path.relpath(p, args.out) for p in snaps]
    return out


def _fit(argv):
    ap = argparse.ArgumentParser(prog="ipcjax fit", description=(
        "Fit material parameters to measured shapes with optax and implicit gradients. "
        "Default scene (pouch): a 30 µm film pouch around a sphere on a floor, pinched, tied "
        "and released; the measurements are its neck width (x, y) and flap height. Without "
        "targets they are simulated with the film's default parameters, and E, μf and kθ are "
        "each recovered alone from --start-factor × off (--joint: all three together). "
        "--scene bag: the same three from the 481-vertex bag's neck and flap, over a window of "
        "--window steps from a saved `ipcjax bag` state (--state, e.g. one saved before tying). "
        "--scene cantilever: a clamped film's tip height, one parameter, adam. "
        "The jobs are in fitting/app.py."))
    ap.add_argument("--scene", choices=["pouch", "bag", "cantilever"], default="pouch")
    ap.add_argument("--state", default=None, help="bag: an `ipcjax bag` state.npz to start the window from")
    ap.add_argument("--window", type=int, default=12, help="bag: window length in steps of 1/240 s (default 12)")
    ap.add_argument("--param", default=None,
                    choices=["bending_scale", "youngs_modulus", "thickness", "friction"],
                    help="fit only this parameter (pouch default: E, μf and kθ in turn; cantilever: bending_scale)")
    ap.add_argument("--joint", action="store_true", help="pouch, bag: fit E, μf and kθ together")
    ap.add_argument("--start", type=float, default=None, help="initial value of a single parameter")
    ap.add_argument("--start-factor", type=float, default=2.0, help="pouch: start at this × the known value (default 2)")
    ap.add_argument("--targets", default=None, help="pouch: JSON with neck_x_m, neck_y_m, flap_m (or an "
                    "`ipcjax bag` summary.json with neck_width_mm, flap_height_mm)")
    ap.add_argument("--neck-x", type=float, default=None, help="pouch: measured neck width along x, m")
    ap.add_argument("--neck-y", type=float, default=None, help="pouch: measured neck width along y, m")
    ap.add_argument("--flap", type=float, default=None, help="pouch: measured flap height, m")
    ap.add_argument("--target", type=float, default=None, help="cantilever: measured tip height in m")
    ap.add_argument("--steps", type=int, default=6, help="cantilever: rollout steps of 1/240 s (default 6)")
    ap.add_argument("--iterations", type=int, default=None, help="maximum iterations (pouch 30, cantilever 80)")
    ap.add_argument("--lr", type=float, default=0.1, help="cantilever: adam learning rate on log-parameters")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    ap.add_argument("--out", default="runs/fit", help="output folder (default runs/fit)")
    args = ap.parse_args(argv)

    # every input is checked here, before the job compiles anything; a ValueError or
    # OSError (a bad value, a missing or malformed --targets file) is one line from main()
    from fitting import app

    if args.scene == "cantilever":
        if args.param == "friction":
            ap.error("the cantilever has no contact: friction cannot be fitted there")
        summary = app.fit_cantilever(args.out, args.param or "bending_scale", target=args.target, start=args.start,
                                     steps=args.steps, iterations=80 if args.iterations is None else args.iterations,
                                     lr=args.lr, progress=not args.quiet)
        print(runfolder.dumps(summary))
        return 0
    options = app.ShapeFitOptions(param=args.param, joint=args.joint, start=args.start,
                                  start_factor=args.start_factor,
                                  iterations=30 if args.iterations is None else args.iterations,
                                  progress=not args.quiet)
    options.groups()
    flags = (args.neck_x, args.neck_y, args.flap)
    targets = None
    if args.targets is not None:
        if any(v is not None for v in flags):
            ap.error("give --targets or --neck-x, --neck-y and --flap, not both")
        targets = app.load_targets(args.targets)
    elif any(v is not None for v in flags):
        if any(v is None for v in flags):
            ap.error("give all three of --neck-x, --neck-y and --flap")
        try:
            targets = app.check_targets(flags, "--neck-x, --neck-y, --flap")
        except ValueError as e:
            ap.error(str(e))
    if args.scene == "pouch":
        summary = app.fit_pouch(args.out, targets, options)
    else:
        if args.state is None:
            ap.error("--scene bag needs --state: a state.npz written by `ipcjax bag` (e.g. runs/bag/state.npz)")
        if not os.path.exists(args.state):
            ap.error(f"--state {args.state}: no such file")
        if args.window < 1:
            ap.error(f"--window must be ≥ 1; got {args.window}")
        from fitting.bag import WindowFailed, bag_window

        runfolder.prepare(args.out)
        try:
            window = bag_window(args.state, args.window)
        except (ValueError, WindowFailed) as e:
            print(f"fit: {e}", file=sys.stderr)
            return 1
        summary = app.fit_bag(args.out, window, targets, options, state_path=args.state)
    print(runfolder.dumps(summary))
    return 1 if any("failed" in f for f in summary["fits"]) else 0


def _compare(argv):
    ap = argparse.ArgumentParser(prog="ipcjax compare", description=(
        "The bag on ipcjax IPC and Newton VBD side by side at the same instant: neck width, flap "
        "height, self-intersecting frames, sphere height range, minimum distances and wall time per "
        "simulated second, measured and audited by the same code. Reuses two run folders (--ipc, --vbd) "
        "or runs both (--run; VBD needs pip install -e '.[newton]'). Writes comparison.md, "
        "comparison.json and comparison.png to --out."))
    ap.add_argument("--ipc", default=None, help="run folder of `ipcjax bag`")
    ap.add_argument("--vbd", default=None, help="run folder of `python -m scenes.vbd_bag`")
    ap.add_argument("--run", action="store_true", help="run both solvers now (into --out/ipc and --out/vbd)")
    ap.add_argument("--resolution", choices=["full", "coarse"], default="coarse", help="with --run (default coarse)")
    ap.add_argument("--until", type=float, default=0.5, help="with --run: simulated end time, s (default 0.5)")
    ap.add_argument("--at", type=float, default=None,
                    help="compare at this instant, s (default: the latest time both runs reached)")
    ap.add_argument("--out", default="runs/compare", help="output folder (default runs/compare)")
    ap.add_argument("--linear-solver", choices=list(LINEAR_SOLVERS), default="sparse",
                    help="with --run: the IPC run's Newton linear solve (default sparse)")
    args = ap.parse_args(argv)
    if args.run == bool(args.ipc or args.vbd) or (not args.run and not (args.ipc and args.vbd)):
        ap.error("give either --run or both --ipc and --vbd")
    _positive("--until", args.until)
    _check(args.at is None or (np.isfinite(args.at) and args.at >= 0),
           f"--at must be a finite time ≥ 0 s; got {args.at}")
    for flag, folder in (("--ipc", args.ipc), ("--vbd", args.vbd)):
        _check(folder is None or os.path.isdir(folder), f"{flag} {folder}: no such folder")
    runfolder.prepare(args.out)

    import platform

    from scenes.compare import compare_runs, load_run

    timings = {}
    if args.run:
        import importlib.util

        from scenes.vbd_bag import run_vbd

        # before the IPC run, not after it
        _check(importlib.util.find_spec("newton") is not None,
               "--run needs Newton for the VBD run: pip install -e '.[newton]'")
        ipc_dir, vbd_dir = os.path.join(args.out, "ipc"), os.path.join(args.out, "vbd")
        t0 = time.perf_counter()
        _bag(["--resolution", args.resolution, "--until", str(args.until), "--out", ipc_dir,
              "--mesh-every", "0", "--no-pictures", "--linear-solver", args.linear_solver])
        t1 = time.perf_counter()
        run_vbd(args.resolution, args.until, vbd_dir)
        t2 = time.perf_counter()
        timings = dict(ipc_job_s=t1 - t0, vbd_job_s=t2 - t1)
        note = (f"Both runs were made by this command, one after the other, in the same session on "
                f"{platform.node()} ({os.cpu_count()} CPUs); whole jobs incl. compilation and set-up: IPC "
                f"{t1 - t0:.0f} s, VBD {t2 - t1:.0f} s; load average at the end {os.getloadavg()[0]:.1f}.")
    else:
        ipc_dir, vbd_dir = args.ipc, args.vbd
        stamp = lambda d: time.strftime("%Y-%m-%d %H:%M", time.localtime(
            os.path.getmtime(os.path.join(d, "summary.json")))) if os.path.exists(os.path.join(d, "summary.json")) else "?"
        note = (f"Reused run folders: the wall times were not measured by this command, nor necessarily in "
                f"the same session or under the same load (summary.json written {stamp(ipc_dir)} for IPC, "
                f"{stamp(vbd_dir)} for VBD).")
    t_eval = time.perf_counter()
    runs = {"ipcjax IPC": load_run(ipc_dir), "Newton VBD": load_run(vbd_dir)}  # errors: see main
    data = compare_runs(runs, args.out, args.at, timing_note=note)
    data.update(timings, evaluate_s=time.perf_counter() - t_eval, same_session=bool(args.run))
    runfolder.write_json(os.path.join(args.out, "comparison.json"), data)
    print(data["table"])
    print("\n".join(data["notes"]))
    print(f"wrote {os.path.join(args.out, 'comparison.md')}, comparison.json, comparison.png")
    return 0


def _one_line(e: BaseException) -> str:
    """The message of ``e`` on one line; an OSError from the system names its file."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        msg = f"{e.filename}: {e.strerror}"
    else:
        msg = str(e) or type(e).__name__
    return " ".join(msg.split())


def main(argv=None) -> int:
    """Run ``ipcjax JOB [options]`` and return its exit status.

    Each job checks its flags, input files and output folder before it simulates or
    compiles anything. A mistake in the inputs (a ValueError, TypeError or OSError: a flag
    out of range, a missing or corrupt file, an unwritable ``--out``) ends as one line on
    stderr, ``ipcjax JOB: error: MESSAGE``, with status 2, as argparse's own errors do; a
    step that fails (:class:`ipcjax.step.StepFailed`) ends as ``ipcjax JOB: failed: MESSAGE``
    with status 1. Set ``IPCJAX_TRACEBACK=1`` to get the traceback instead.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    jobs = {"drape": _drape, "bag": _bag, "fit": _fit, "compare": _compare}
    try:
        from ipcjax import verlet as _verlet
        jobs["verlet"] = _verlet.main
    except ImportError:  # pragma: no cover
        pass
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in jobs:
        print("usage: ipcjax {" + ",".join(jobs) + "} [options]   (ipcjax JOB --help for options)")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    job = argv[0]
    try:
        return int(jobs[job](argv[1:]) or 0)
    except (ValueError, TypeError, OSError) as e:
        if os.environ.get("IPCJAX_TRACEBACK"):
            raise
        print(f"ipcjax {job}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        from ipcjax.step import StepFailed

        if not isinstance(e, StepFailed) or os.environ.get("IPCJAX_TRACEBACK"):
            raise
        print(f"ipcjax {job}: failed: {_one_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

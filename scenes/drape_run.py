"""The drape run as a library function: what ``ipcjax drape`` does.

A 30 µm film dropped over a fixed sphere (:func:`scenes.film.drape_scene`) with friction,
stepped with :func:`ipcjax.step.advance`, every frame audited for self-intersection; the
trajectory and summary go to the run folder through :mod:`ipcjax.runfolder`, and the
snapshots of the first and last frames and the mesh sequence through the bag's own
output code (:mod:`scenes.outputs`).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from ipcjax import runfolder
from scenes.progress import first_step_bar

DT = 1.0 / 240.0  # s


@dataclass(frozen=True)
class DrapeRunOptions:
    """What ``ipcjax drape`` runs; the defaults are the command line's."""

    out: str = "runs/drape"         # run folder
    resolution: int = 10            # film vertices per side
    steps: int = 60                 # timesteps of DT
    size: float = 0.08              # film side, m
    radius: float = 0.02            # sphere radius, m
    membrane: str = "neo_hookean"   # membrane model name (ipcjax.model.Config)
    bending: str = "hinge"          # bending model name
    linear_solver: str = "dense"    # Newton linear solve
    mesh_every: int = 1             # write every n-th frame as .vtu/.obj in meshes/ (0: none)
    progress: bool = True           # progress bar and notes on stderr


def run_drape(options: DrapeRunOptions) -> tuple[dict, bool]:
    """Drape the film and write its run folder ``options.out``: ``trajectory.npz``,
    ``summary.json``, ``snapshots/`` (PNGs of the first and last frames) and ``meshes/``
    (``frame_*.vtu`` with a ParaView ``frame.pvd``, and ``frame_*.obj``), the last two
    with :mod:`scenes.outputs`, as ``ipcjax bag`` writes its own.

    Returns (summary, ok): ok is True when every step succeeded and no frame
    self-intersects; ``summary["outputs"]`` lists what was written (paths relative to
    ``options.out``). The run folder must have been checked (:func:`runfolder.prepare`).
    A failed step stops the run, and what ran up to it is still written.
    """
    from ipcjax import compile_guard
    from ipcjax import step as ipc_step
    from ipcjax.audit import audit_trajectory
    from ipcjax.model import Config, Controls, Params
    from scenes.film import drape_scene

    compile_guard.release_if_crowded()
    sc = drape_scene(n=options.resolution, size=options.size, sphere_radius=options.radius)
    params = Params.film_defaults()
    config = Config(membrane=options.membrane, bending=options.bending, linear_solver=options.linear_solver)
    controls = Controls.empty(sc.model.n_particles)
    state = ipc_step.make_state(sc.x)
    frames, times, reports = [np.asarray(state.x)], [0.0], []
    capacity, candidates, bar = None, ipc_step.CandidateCache(), None
    t0 = time.perf_counter()
    if options.progress:
        print("drape: compiling (first step)…", file=sys.stderr, flush=True)
    for _ in range(options.steps):
        state, rep = ipc_step.advance(sc.model, params, state, controls, DT, config=config, capacity=capacity,
                                      candidates=candidates)
        capacity = rep.capacity
        if not rep.ok:
            if bar is not None:
                bar.close()
            print(f"step at t = {float(state.t):.4f} s failed: {rep.reason}", file=sys.stderr)
            break
        reports.append(rep)
        frames.append(np.asarray(state.x))
        times.append(float(state.t))
        bar = first_step_bar("drape", options.steps, bar, enabled=options.progress)
        if bar is not None:
            bar.set_postfix(t=f"{float(state.t):.3f}s", newton=rep.iterations, gap=f"{rep.min_gap*1e3:.3f}mm")
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - t0
    frames = np.stack(frames)
    audit = audit_trajectory(frames, sc.film_triangles, [sc.sphere], [options.radius])
    film = runfolder.Trajectory(frames[:, :sc.n_film], None, sc.film_triangles, np.asarray(times))
    runfolder.write_trajectory(os.path.join(options.out, "trajectory.npz"), film)
    summary = dict(
        steps=len(reports), simulated_s=times[-1], wall_s=wall,
        newton_iterations=int(sum(r.iterations for r in reports)),
        candidate_queries=int(sum(r.queries for r in reports)),
        newton_tangent=config.newton_tangent,
        projected_directions=int(sum(r.projected for r in reports)),
        min_gap_m=float(min((r.min_gap for r in reports), default=np.inf)),
        frames=audit["frames"], frames_with_self_intersection=audit["frames_with_self_intersection"],
        min_film_sphere_gap_m=float(np.min(audit["min_film_sphere"])),
        max_subdivision_depth=int(max((r.max_depth for r in reports), default=0)),
        outputs=drape_outputs(options, film._replace(spheres=frames[:, [sc.sphere]])),
    )
    runfolder.write_json(os.path.join(options.out, "summary.json"), summary)
    ok = len(reports) == options.steps and audit["frames_with_self_intersection"] == 0
    return summary, ok


def drape_outputs(options: DrapeRunOptions, traj: runfolder.Trajectory) -> dict:
    """Snapshots of the first and last frames and the mesh sequence of a drape run, with the
    bag's :func:`scenes.outputs.phase_snapshots` and :func:`scenes.outputs.export_meshes`
    (``traj.spheres``: the fixed sphere's centre, (T, 1, 3)). Returns what was written,
    with paths relative to ``options.out``."""
    from scenes.outputs import export_meshes, phase_snapshots

    out = dict(trajectory="trajectory.npz", summary="summary.json")
    snaps = phase_snapshots(os.path.join(options.out, "snapshots"), traj, [options.radius], ())
    out["snapshots"] = [os.path.relpath(p, options.out) for p in snaps]
    if options.mesh_every:
        paths = export_meshes(os.path.join(options.out, "meshes"), traj, [options.radius], every=options.mesh_every)
        out["meshes"] = dict(folder="meshes", files=len(paths), every_frame=options.mesh_every,
                             paraview="meshes/frame.pvd", blender="meshes/frame_*.obj")
    return out


def where(out: str, outputs: dict) -> str:
    """One line per kind of output of :func:`drape_outputs`, each with its path under ``out``."""
    lines = [f"trajectory: {os.path.join(out, outputs['trajectory'])}",
             f"summary:    {os.path.join(out, outputs['summary'])}",
             "snapshots:  " + ", ".join(os.path.join(out, p) for p in outputs["snapshots"])]
    if "meshes" in outputs:
        m = outputs["meshes"]
        lines += [f"meshes:     {os.path.join(out, m['paraview'])} (ParaView), "
                  f"{os.path.join(out, m['blender'])} (Blender); {m['files']} files"]
    return "\n".join(lines)

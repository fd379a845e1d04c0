"""The bag run (docs/spec.md §5) as a library function: what ``ipcjax bag`` does.

:func:`run_bag` builds the scene, continues a saved state (``resume``), steps the
choreography with :func:`ipcjax.step.advance`, runs the unfold check when the unfold
tracks end, checkpoints ``trajectory.npz`` and ``state.npz``, and writes the summary
(measurements and self-intersection audit) and the pictures and meshes to the run folder,
through :mod:`ipcjax.runfolder`. The bag's ``state.npz`` (positions, velocities, time,
step, unfold check, resolution, protocol, choreography captures) is this module's own:
:func:`write_state`, :func:`read_state`. ``ipcjax compare --run`` calls it as well.

Inputs are checked before anything compiles; the messages name the command-line flags
(``--resume``, ``--out``, ``--until``) that :class:`BagRunOptions` mirrors.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ipcjax import cholmod_ffi, compilation_cache, runfolder, xla_threads
from scenes.bag import EPS_T, SHARED_UNTIL, BagScene
from scenes.progress import first_step_bar

STEP_TIME_TOL = 1e-6  # s: a saved step index must give its saved time to within this


@dataclass(frozen=True)
class BagRunOptions:
    """What ``ipcjax bag`` runs; the defaults are the command line's."""

    out: str = "runs/bag"              # run folder
    until: float | None = None         # simulated end time, s (None: the protocol's end)
    protocol: str = "full"             # "full" (end 10.50 s) or "short" (end 8.45 s): scenes.bag.PROTOCOLS
    resolution: str = "full"           # "full" (481 film vertices) or "coarse" (85)
    save_every: int = 1                # keep every n-th step's frame
    resume: str | None = None          # a state.npz written by an earlier run
    checkpoint_every: int = 120        # rewrite trajectory.npz and state.npz every n steps
    mesh_every: int = 24               # write every n-th saved frame as .vtu/.obj (0: none)
    pictures: bool = True              # time-series plot and phase snapshots (PNG)
    linear_solver: str = "sparse"      # Newton linear solve (ipcjax.model.LINEAR_SOLVERS)
    params: object = None              # ipcjax.model.Params of the film (None: Params.film_defaults())
    progress: bool = True              # progress bar and notes on stderr
    perturb: float = 0.0               # rms m/s of a seeded velocity kick of the film at the start
                                       # (scenes/perturb.py; 0: none), for ensembles of runs
    seed: int = 0                      # the kick's seed


@dataclass(frozen=True)
class BagRunResult:
    """What :func:`run_bag` did: the summary written to ``out/summary.json`` and the run's
    end in memory, so that a caller takes the rest-state derivative (or continues) without
    reading state.npz back. ``ok`` is False when the run stopped early or a frame
    self-intersects (``ipcjax bag`` then exits with status 1)."""

    summary: dict
    scene: BagScene        # the scene the run stepped; its choreography holds the run's captures
    state: object          # ipcjax.model.State at the run's end (what state.npz holds; the
                           # last accepted step's when the run stopped early)
    step: int              # the step index of ``state``

    @property
    def ok(self) -> bool:
        return not (self.summary["failure"] or self.summary["audit"]["frames_with_self_intersection"])

    @property
    def measurements(self) -> dict:
        """Neck widths and flap height at the end, m (``summary["measurements"]``)."""
        return self.summary["measurements"]


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


# --------------------------------------------------------------------------- state.npz


STATE_KEYS = ("x", "v", "t", "step", "unfold_checked", "resolution")  # besides capture_* arrays


def write_state(path, x, v, t: float, *, step: int, unfold_checked: bool, resolution: str,
                captures: dict, protocol: str = "full") -> None:
    """Write the state ``ipcjax bag --resume`` continues from: positions ``x`` and
    velocities ``v`` (N, 3) in m and m/s, time ``t`` in s, the step index, whether the
    unfold check has passed, the scene resolution, the protocol (``--protocol``) and
    ``captures`` ({``capture_NAME``: array}, the choreography's recorded grab positions and
    tie lengths)."""
    np.savez(path, x=np.asarray(x), v=np.asarray(v), t=float(t), step=int(step),
             unfold_checked=bool(unfold_checked), resolution=str(resolution), protocol=str(protocol),
             **captures)


def read_state(path, n_particles: int, resolution: str | None = None,
               what: str = "--resume") -> runfolder.Arrays:
    """Read a :func:`write_state` file and check it against the scene it will continue.

    Checks: every key of :data:`STATE_KEYS`; ``resolution`` equal to the given one; ``x``
    and ``v`` real, finite, shaped (``n_particles``, 3); ``t`` finite and ≥ 0; ``step`` an
    integer ≥ 0; every ``capture_*`` array real and finite. Which captures a state must
    hold depends on the choreography; the caller checks that.

    Raises:
        FileNotFoundError: no such file. ValueError: one message naming the file and what
            is wrong with it.
    """
    rs = runfolder.read_npz(path, what)
    where = f"{what} {path}"
    missing = [k for k in STATE_KEYS if k not in rs]
    if missing:
        raise ValueError(f"{where}: not an `ipcjax bag` state file: missing {', '.join(missing)} "
                         f"(it holds {', '.join(rs.files) or 'no arrays'})")
    if resolution is not None and str(rs["resolution"]) != resolution:
        raise ValueError(f"{where}: the state is for resolution {str(rs['resolution'])!r}, not {resolution!r}")
    for k in ("x", "v"):
        a = rs[k]
        if a.shape != (n_particles, 3):
            raise ValueError(f"{where}: {k} has shape {a.shape}; this scene needs ({n_particles}, 3)")
    for k in [k for k in rs.files if k in ("x", "v", "t") or k.startswith("capture_")]:
        a = rs[k]
        if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
            raise ValueError(f"{where}: {k} holds {a.dtype} values, not real numbers")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{where}: {k} is not finite ({int(np.size(a) - np.isfinite(a).sum())} "
                             f"of its {np.size(a)} values)")
    if rs["t"].shape != () or float(rs["t"]) < 0:
        raise ValueError(f"{where}: t must be one time ≥ 0 s; got {rs['t'].tolist()}")
    if rs["step"].shape != () or not np.issubdtype(rs["step"].dtype, np.integer) or int(rs["step"]) < 0:
        raise ValueError(f"{where}: step must be one integer ≥ 0; got {rs['step'].tolist()}")
    if rs["unfold_checked"].shape != () or rs["unfold_checked"].dtype != np.bool_:
        raise ValueError(f"{where}: unfold_checked must be one true/false; got {rs['unfold_checked'].tolist()}")
    return rs


def read_bag_state(path, sc: BagScene, resolution: str):
    """The ``resume`` state, checked against this bag scene before anything runs: the
    checks of :func:`read_state`, its step index against its time, its
    protocol (a state of the other protocol resumes only up to
    :data:`scenes.bag.SHARED_UNTIL`, where the two are the same; a state without one is of
    the full protocol), and the choreography captures (grab positions, tie lengths) that
    its earlier steps recorded. Loads the captures into ``sc.choreography``.

    Raises:
        FileNotFoundError, ValueError: one message naming the file and what is wrong.
    """
    ch, dt = sc.choreography, sc.dt
    rs = read_state(path, sc.model.n_particles, resolution)
    t, step = float(rs["t"]), int(rs["step"])
    _check(abs(step * dt - t) < STEP_TIME_TOL,
           f"--resume {path}: step {step} does not match t = {t:.6f} s (steps of {dt:.6f} s)")
    saved = str(rs["protocol"]) if "protocol" in rs else "full"
    _check(saved == ch.protocol or t <= SHARED_UNTIL + EPS_T,
           f"--resume {path}: the state is of the {saved!r} protocol at t = {t:.4f} s; the {ch.protocol!r} "
           f"protocol departs from it after {SHARED_UNTIL:.2f} s (--protocol {saved} continues it)")
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


def read_bag_trajectory(path, sc: BagScene) -> runfolder.Trajectory:
    """An earlier run's trajectory.npz in the ``out`` folder that ``resume`` extends, checked
    against the scene (film (T, N_f, 3), spheres (T, S, 3), time (T,))."""
    tr = runfolder.read_npz(path, "--out holds")
    missing = [k for k in ("film", "spheres", "time") if k not in tr]
    _check(not missing, f"--out holds {path} without {', '.join(missing)}: not an `ipcjax bag` trajectory")
    n_t, nf, ns = tr["time"].shape[0] if tr["time"].ndim == 1 else -1, len(sc.film), len(sc.spheres)
    _check(tr["time"].shape == (n_t,) and tr["film"].shape == (n_t, nf, 3) and tr["spheres"].shape == (n_t, ns, 3),
           f"--out holds {path} with film {tr['film'].shape}, spheres {tr['spheres'].shape}, time "
           f"{tr['time'].shape}; this scene needs (T, {nf}, 3), (T, {ns}, 3), (T,): choose another --out")
    return runfolder.Trajectory(tr["film"], tr["spheres"], sc.faces, tr["time"])


class _Frames:
    """The saved frames of a bag run, kept on the host, each handed to ``audit`` (an
    :class:`ipcjax.audit.BackgroundAudit` of film then spheres) as it comes."""

    def __init__(self, sc: BagScene, audit):
        self.sc, self.audit = sc, audit
        self.film, self.spheres, self.time = [], [], []

    def add(self, x, t: float) -> None:
        x = np.asarray(x)
        self.extend([x[self.sc.film]], [x[self.sc.spheres]], [t])

    def extend(self, film, spheres, times) -> None:
        for f, s, t in zip(film, spheres, times):
            self.film.append(f)
            self.spheres.append(s)
            self.time.append(float(t))
            self.audit.add(np.concatenate([f, s]))

    def trajectory(self) -> runfolder.Trajectory:
        return runfolder.Trajectory(np.stack(self.film), np.stack(self.spheres), self.sc.faces,
                                    np.asarray(self.time))


def run_bag(options: BagRunOptions) -> BagRunResult:
    """Run (or continue) the bag experiment and write its run folder.

    Writes ``trajectory.npz``, ``state.npz`` (for ``resume``; both also every
    ``checkpoint_every`` steps and on Ctrl-C), ``summary.json`` and, as asked, meshes,
    the time-series plot and phase snapshots, to ``options.out``; and, as the run passes
    them, the states at the start of the cinch and of the tie (``state_cinch.npz``,
    ``state_tie.npz``; the protocol's :attr:`scenes.bag.Protocol.checkpoints`), from which
    fits and tests resume. With ``options.perturb`` the film's velocities at the start
    are kicked by the seeded field of :func:`scenes.perturb.film_kick` (positions
    untouched), and summary.json's ``perturbation`` records it (null without one).

    Raises:
        FileNotFoundError, ValueError, OSError: a bad resume state, an ``out`` holding a
            trajectory of another scene, an end time with no step left, a kick that is not
            a finite speed ≥ 0, an unwritable ``out``; all before any step is taken.
    """
    from ipcjax import step as ipc_step
    from ipcjax import compile_guard
    from ipcjax.audit import BackgroundAudit
    from scenes.bag import bag_scene
    from scenes.perturb import film_kick

    compile_guard.release_if_crowded()
    sc = bag_scene(options.resolution, linear_solver=options.linear_solver, protocol=options.protocol,
                   params=options.params)
    dt = sc.dt
    until = sc.t_end if options.until is None else options.until

    step_index, unfold_checked = 0, False
    if options.resume:
        rs = read_bag_state(options.resume, sc, options.resolution)
        state = ipc_step.make_state(rs["x"], rs["v"], float(rs["t"]))
        step_index, unfold_checked = int(rs["step"]), bool(rs["unfold_checked"])
    else:
        state = ipc_step.make_state(sc.x)
    if options.perturb:  # the film's start velocities kicked (scenes/perturb.py); positions untouched
        kick = film_kick(np.asarray(state.x), np.arange(len(sc.film)), options.perturb, options.seed)
        state = ipc_step.make_state(np.asarray(state.x), np.asarray(state.v) + kick, float(state.t))
    n_total = int(round(until / dt))
    _check(n_total > step_index, f"--until {until:g} s leaves no step to run after t = "
                                 f"{float(state.t):.4f} s (one step is {dt:.6f} s)")
    runfolder.prepare(options.out)
    # the self-intersection audit of the summary runs in a worker process beside the stepping
    with BackgroundAudit(sc.faces, np.arange(len(sc.film), len(sc.film) + len(sc.spheres)),
                         sc.sphere_radius) as audit:
        return _run(options, sc, _Start(state, step_index, unfold_checked, n_total), _Frames(sc, audit))


class _Start(NamedTuple):
    """Where run_bag's stepping starts (checked) and where it ends."""

    state: object          # ipcjax.model.State
    step_index: int
    unfold_checked: bool
    n_total: int           # the step index to end at


def _run(options: BagRunOptions, sc: BagScene, start: _Start, frames: _Frames) -> BagRunResult:
    """run_bag's stepping loop, checkpoints and summary, from a checked start."""
    from ipcjax import step as ipc_step
    from scenes.bag import PROTOCOLS, UnfoldIncomplete, check_unfolded

    choreo, dt = sc.choreography, sc.dt
    state, step_index, unfold_checked, n_total = start
    checkpoints = PROTOCOLS[options.protocol].checkpoints
    t_unfold_end = choreo.track("unfold").t_off
    traj_path = os.path.join(options.out, "trajectory.npz")
    state_path = os.path.join(options.out, "state.npz")
    if options.resume and os.path.exists(traj_path):
        tr = read_bag_trajectory(traj_path, sc)
        keep = tr.time <= float(state.t) + EPS_T
        frames.extend(tr.film[keep], tr.spheres[keep], tr.time[keep])
    if not frames.time or frames.time[-1] < float(state.t) - EPS_T:
        frames.add(state.x, float(state.t))

    def write(state_file=None):
        """trajectory.npz and state.npz; or only the state, to ``state_file``."""
        if state_file is None:
            runfolder.write_trajectory(traj_path, frames.trajectory())
        write_state(state_file or state_path, state.x, state.v, state.t, step=step_index,
                    unfold_checked=unfold_checked, resolution=options.resolution,
                    captures=choreo.captures_npz(), protocol=options.protocol)

    n_run = n_total - step_index
    run_phases = [choreo.phase_at(k * dt) for k in range(step_index, n_total)]  # for the progress bar's ETA
    bar = None  # started after the first step (see first_step_bar)
    failure, reports, phases, capacity = None, [], [], None
    candidates = ipc_step.CandidateCache()  # the last step's candidate set, for the next step
    min_gap = np.inf
    wall0 = time.perf_counter()
    first_step_s = None  # wall of this run's first step, which includes the jit compilation
    first_step_cache = None
    cache0 = compilation_cache.counts()
    while step_index < n_total:
        t = float(state.t)
        phase = choreo.phase_at(t)
        x_now = np.asarray(state.x)
        choreo.observe(t, x_now)
        for name, t_mark in checkpoints.items():
            if abs(t - t_mark) < EPS_T and step_index < n_total:
                write(os.path.join(options.out, f"state_{name}.npz"))
        if not unfold_checked and t >= t_unfold_end - EPS_T:
            try:
                check_unfolded(x_now, sc.mesh)
            except UnfoldIncomplete as e:
                failure = dict(phase="unfold", time_s=t, reason=f"unfold check: {e}", columns=e.columns)
                break
            unfold_checked = True
        if first_step_s is None and options.progress:
            print("bag: compiling (first step)…", file=sys.stderr, flush=True)
        try:
            state_new, rep = ipc_step.advance(sc.model, sc.params, state, choreo.controls_at(step_index, t), dt,
                                              config=sc.config, capacity=capacity, validate=first_step_s is None,
                                              candidates=candidates)
        except KeyboardInterrupt:  # keep everything so far; resume continues from here
            failure = dict(phase=phase, time_s=t, step=step_index, reason="interrupted")
            break
        if first_step_s is None:
            first_step_s = time.perf_counter() - wall0
            first_step_cache = _first_step_cache(cache0)
        capacity = rep.capacity
        if not rep.ok:
            failure = dict(phase=phase, time_s=t, step=step_index, reason=rep.reason, code=int(rep.code))
            break
        state = state_new
        step_index += 1
        reports.append(rep)
        phases.append(phase)
        min_gap = min(min_gap, rep.min_gap)
        if step_index % options.save_every == 0 or step_index == n_total:
            frames.add(state.x, float(state.t))
        if step_index % options.checkpoint_every == 0:
            write()
        bar = first_step_bar("bag", n_run, bar, enabled=options.progress, phases=run_phases)
        if bar is not None:
            bar.set_postfix(phase=phase, t=f"{float(state.t):.3f}s", gap=f"{rep.min_gap * 1e3:.4f}mm",
                            newton=rep.iterations, depth=rep.max_depth)
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - wall0
    write()
    if failure:
        print(f"bag: stopped in phase {failure['phase']!r} at t = {failure['time_s']:.4f} s: {failure['reason']}",
              file=sys.stderr)
    summary = _summary(sc, options, frames.trajectory(), frames.audit.result(), reports, dict(
        step_index=step_index, simulated_s=float(state.t), wall_s=wall, first_step_s=first_step_s,
        first_step_compilation_cache=first_step_cache, min_gap_m=float(min_gap), unfold_checked=unfold_checked,
        failure=failure, phases=phases))
    runfolder.write_json(os.path.join(options.out, "summary.json"), summary)
    return BagRunResult(summary, sc, state, step_index)


def _first_step_cache(before: dict) -> dict:
    """The persistent compilation cache during the first step: its folder (None: off), the
    programs it returned (``hits``) and those compiled (``compiled``), and ``warm``: at
    least one hit and nothing compiled. The sparse step's direction is a custom call and is
    cached; where that call cannot be built the step calls the host (:mod:`ipcjax.ldl`),
    which JAX does not cache, so that step is never warm (see
    :mod:`ipcjax.compilation_cache`)."""
    import jax

    now = compilation_cache.counts()
    hits = now["hits"] - before["hits"]
    compiled = now["requests"] - before["requests"] - hits
    return dict(dir=jax.config.jax_compilation_cache_dir or None, hits=hits, compiled=compiled,
                warm=hits > 0 and compiled == 0)


def iterations_by_phase(phases, iterations) -> dict:
    """Newton iterations of this run's steps by choreography phase, in the order the phases
    came: per phase the steps, the iterations, and a histogram {iterations per step: steps}."""
    out: dict = {}
    for ph, k in zip(phases, iterations):
        d = out.setdefault(ph, dict(steps=0, iterations=0, histogram={}))
        d["steps"] += 1
        d["iterations"] += int(k)
        d["histogram"][str(int(k))] = d["histogram"].get(str(int(k)), 0) + 1
    for d in out.values():
        d["histogram"] = dict(sorted(d["histogram"].items(), key=lambda kv: int(kv[0])))
    return out


def _summary(sc: BagScene, options: BagRunOptions, traj: runfolder.Trajectory, audit: dict, reports,
             run: dict) -> dict:
    """summary.json of a bag run: timings, Newton statistics, measurements, ``audit`` (of
    every frame of ``traj``: :func:`ipcjax.audit.audit_trajectory`), outputs."""
    from scenes.bag import measurements
    from scenes.perturb import describe

    film, sph = traj.film, traj.spheres
    wall, first_step_s, n = run["wall_s"], run["first_step_s"], len(reports)
    summary = dict(
        resolution=options.resolution, protocol=options.protocol,
        params={k: float(getattr(sc.params, k)) for k in ("youngs_modulus", "friction", "bending_scale")},
        steps_this_run=n, step_index=run["step_index"],
        simulated_s=run["simulated_s"], wall_s=wall, steps_per_s=n / wall if wall > 0 else None,
        linear_solver=sc.config.linear_solver, sparse_solve=cholmod_ffi.solve_path(sc.config.linear_solver),
        first_step_s=first_step_s,
        first_step_compilation_cache=run["first_step_compilation_cache"], xla_threads=xla_threads.current(),
        wall_s_per_simulated_s_after_first_step=((wall - first_step_s) / ((n - 1) * sc.dt)
                                                 if n > 1 and first_step_s is not None else None),
        newton_iterations=int(sum(r.iterations for r in reports)),
        candidate_queries=int(sum(r.queries for r in reports)),
        newton_tangent=sc.config.newton_tangent,
        projected_directions=int(sum(r.projected for r in reports)),
        newton_iterations_by_phase=iterations_by_phase(run["phases"], [r.iterations for r in reports]),
        max_subdivision_depth=int(max((r.max_depth for r in reports), default=0)),
        min_gap_m=run["min_gap_m"], unfold_checked=run["unfold_checked"], failure=run["failure"],
        perturbation=describe(options.perturb, options.seed),
        measurements=measurements(film, sph, traj.time, sc),
        audit=dict(frames=audit["frames"], frames_with_self_intersection=audit["frames_with_self_intersection"],
                   min_film_film_m=float(np.min(audit["min_film_film"])),
                   min_film_sphere_m=float(np.min(audit["min_film_sphere"]))),
    )
    summary["outputs"] = bag_outputs(options, sc, traj, audit)
    return summary


def bag_outputs(options: BagRunOptions, sc: BagScene, traj: runfolder.Trajectory, audit: dict) -> dict:
    """Mesh sequence, time-series plot and phase snapshots of a bag run (paths relative to
    ``options.out``), as ``options.mesh_every`` and ``options.pictures`` ask."""
    from scenes.outputs import export_meshes, phase_snapshots, plot_timeseries

    out, phases = {}, sc.choreography.phases
    if options.mesh_every:
        paths = export_meshes(os.path.join(options.out, "meshes"), traj, sc.sphere_radius, every=options.mesh_every)
        out["meshes"] = dict(folder="meshes", files=len(paths), every_saved_frame=options.mesh_every,
                             paraview="meshes/frame.pvd")
    if options.pictures:
        plot_timeseries(os.path.join(options.out, "timeseries.png"), traj, sc.rim - sc.film[0], sc.neck - sc.film[0],
                        audit=audit, phases=phases, title=f"bag ({sc.resolution})")
        snaps = phase_snapshots(os.path.join(options.out, "snapshots"), traj, sc.sphere_radius, phases,
                                obstacles=(np.asarray(sc.x), np.asarray(sc.bin_triangles)))
        out["timeseries"] = "timeseries.png"
        out["snapshots"] = [os.path.relpath(p, options.out) for p in snaps]
    return out

"""K bags in lockstep as one batched program: what ``ipcjax bag --ensemble K`` does (#35).

:func:`run_bag_ensemble` runs the bag protocol (docs/spec.md §5) for K members through
:func:`ipcjax.ensemble.ensemble_rollout`: one ``vmap``ped program per chunk of steps, with
no host round trip inside it. The choreography's controls are computed in the program
from each member's own captures (:mod:`scenes.choreography_jax`), the steps subdivide in
the program (:func:`ipcjax.ensemble.subdivided_step`), and a capacity overflow reruns the
chunk at a larger capacity. Between chunks the host runs the unfold check on every member,
hands the kept frames to the self-intersection audit and stops at the first failure,
naming the member.

Members: member 0 starts from the run's start state (t = 0, or ``resume``); member j ≥ 1
from the same state with the film's velocities kicked by :func:`scenes.perturb.film_kick`,
rms ``perturb`` (none when 0), seed ``seed + j``; with ``params`` each member runs at its
own film parameters. So member j is the single run ``ipcjax bag --perturb V --seed S+j``
(member 0: no kick) on the same linear solver, to round-off: the controls computed in XLA
differ from the host's in the last bits (:mod:`scenes.choreography_jax`), and batched code
may round otherwise (docs/benchmarks.md, "Ensembles in lockstep"); over the whole coarse
protocol member 0 measured bit for bit but near zero (docs/validation.md).

The members are split over the devices (``jax.sharding``; summary.json's ``devices``),
those of several processes joined by ``jax.distributed`` too (``processes``): every
process runs this loop on every member's results, and process 0 alone audits the frames,
writes the run folder and prints the progress; its audit reaches the others, so every
process returns the same summary and status. The
run folder holds ``summary.json`` (every member's measurements, audit and Newton figures,
and their mean and sample standard deviation) and, per member,
``member<j>/trajectory.npz``, ``member<j>/state.npz`` (from which ``ipcjax bag --resume``
continues that member alone) and ``member<j>/summary.json``. There are no meshes or
pictures; ``ipcjax bag`` on one member's state gives them.
"""
from __future__ import annotations

import os
import sys
import time
from typing import NamedTuple

import numpy as np

from ipcjax import runfolder
from scenes.bag import EPS_T
from scenes.bag_run import BagRunOptions, read_bag_state, write_state

#: Steps per program call: 0.05 s of the bag, a divisor of the unfold check's step (6.05 s)
#: and of the protocols' ends, so that every chunk has one length and one program.
CHUNK = 12


class BagSchedule(NamedTuple):
    """The bag's choreography as an :func:`ipcjax.ensemble.ensemble_rollout` schedule: a
    :class:`scenes.choreography_jax.Protocol` shared by the members, their
    :class:`~scenes.choreography_jax.Captures` as ``aux``."""

    protocol: object

    def observe(self, aux, t, x):
        from scenes import choreography_jax as cj
        return cj.observe(self.protocol, aux, t, x)

    def controls(self, aux, t):
        from scenes import choreography_jax as cj
        return cj.controls_at(self.protocol, aux, t)


class EnsembleResult(NamedTuple):
    """What :func:`run_bag_ensemble` did: the summary written to ``out/summary.json``."""

    summary: dict

    @property
    def ok(self) -> bool:
        """No member failed and no member's frame self-intersects."""
        return not (self.summary["failure"]
                    or any(m["audit"]["frames_with_self_intersection"] for m in self.summary["members"]))


def check_ensemble_options(options: BagRunOptions, members: int, params) -> None:
    """Refuse what an ensemble cannot run, before anything compiles.

    Raises:
        ValueError: fewer than one member; the host linear solver; K identical members
            (no kick, no parameter sets); parameter sets that are not one per member; K
            not a multiple of the device count.
    """
    if isinstance(members, bool) or not isinstance(members, (int, np.integer)) or members < 1:
        raise ValueError(f"--ensemble needs an integer number of members ≥ 1; got {members!r}")
    if options.linear_solver == "sparse":
        raise ValueError("--ensemble runs its linear solve inside XLA: give --linear-solver dense (or cg); "
                         "'sparse' factorizes one member at a time on the CPU")
    if params is not None and len(params) != members:
        raise ValueError(f"--ensemble {members} needs one parameter set per member; got {len(params)}")
    if members > 1 and not options.perturb and params is None:
        raise ValueError(f"--ensemble {members} without --perturb V (or parameter sets) would run {members} "
                         f"identical bags")
    from ipcjax.ensemble import member_sharding

    member_sharding(members)  # the members must split over the devices (a ValueError names them)


def _member_starts(sc, options: BagRunOptions, members: int, protocol):
    """(states, start step, unfold checked, captures) of the K members, stacked; the kick as
    :func:`scenes.bag_run.run_bag` gives it to a single run; the captures of ``protocol``
    (:func:`scenes.choreography_jax.protocol`) that a resumed state brings."""
    from ipcjax.ensemble import stack
    from ipcjax.step import make_state
    from scenes import choreography_jax as cj
    from scenes.perturb import film_kick

    step, checked = 0, False
    if options.resume:
        rs = read_bag_state(options.resume, sc, options.resolution)
        base = make_state(rs["x"], rs["v"], float(rs["t"]))
        step, checked = int(rs["step"]), bool(rs["unfold_checked"])
    else:
        base = make_state(sc.x)
    x, v, film = np.asarray(base.x), np.asarray(base.v), np.arange(len(sc.film))
    kick = lambda j: film_kick(x, film, options.perturb, options.seed + j) if options.perturb else 0.0  # noqa: E731
    states = [base] + [make_state(x, v + kick(j), float(base.t)) for j in range(1, members)]
    caps = cj.captures_from_choreography(protocol, sc.choreography)
    return stack(states), step, checked, stack([caps] * members)


def _chunks(start: int, end: int, unfold_step: int | None):
    """Step ranges [a, b) of at most CHUNK steps, aligned to multiples of CHUNK, split at the
    unfold check's step."""
    marks = sorted({*range((start // CHUNK + 1) * CHUNK, end, CHUNK), end}
                   | ({unfold_step} if unfold_step is not None and start < unfold_step < end else set()))
    a = start
    for b in marks:
        yield a, b
        a = b


def run_bag_ensemble(options: BagRunOptions, members: int, *, params=None) -> EnsembleResult:
    """Run K bags in lockstep (module doc) and write the run folder ``options.out``.

    Args:
        options: as for :func:`scenes.bag_run.run_bag`; ``perturb`` and ``seed`` give the
            members' kicks, ``until`` and ``resume`` the window, ``save_every`` the frames
            kept. ``checkpoint_every``, ``mesh_every`` and ``pictures`` are not used.
        members: K.
        params: None (every member at ``options.params``) or K :class:`ipcjax.model.Params`.

    Raises:
        ValueError, FileNotFoundError, OSError: refused options (:func:`check_ensemble_options`),
            a bad resume state, an end with no step left, an unwritable ``out`` (over several
            processes in every process, when process 0 cannot write it); all before any step
            is taken.
    """
    import contextlib

    import jax

    from ipcjax.audit import BackgroundAudit
    from ipcjax.candidates import initial_capacity
    from ipcjax.ensemble import ensemble_rollout, stack
    from ipcjax.model import check_params
    from scenes import choreography_jax as cj
    from scenes.bag import bag_scene

    check_ensemble_options(options, members, params)
    lead = jax.process_index() == 0   # over several processes only process 0 writes and audits
    sc = bag_scene(options.resolution, linear_solver=options.linear_solver, protocol=options.protocol,
                   params=options.params)
    schedule = BagSchedule(cj.protocol(sc.choreography))
    states, step, checked, caps = _member_starts(sc, options, members, schedule.protocol)
    step0 = step
    until = sc.t_end if options.until is None else options.until
    n_total = int(round(until / sc.dt))
    if n_total <= step:
        raise ValueError(f"--until {until:g} s leaves no step to run after t = {step * sc.dt:.4f} s")
    _prepare_in_lead(options.out, lead)
    plist = [sc.params] * members if params is None else [check_params(p) for p in params]
    stacked = stack(plist)
    t_unfold = sc.choreography.track("unfold").t_off
    # the unfold check runs at the first step start at or after the unfold's end, as in run_bag
    unfold_step = None if checked else max(step, int(np.ceil((t_unfold - EPS_T) / sc.dt)))
    capacity = initial_capacity(sc.model.topology)
    kept = [[(np.asarray(states.x[j]), float(states.t[j]))] for j in range(members)]
    figures = [dict(iterations=0, projected=0, max_depth=0, min_gap=np.inf) for _ in range(members)]
    failure, first_chunk_s, wall0 = None, None, time.perf_counter()
    with (BackgroundAudit(sc.faces, np.arange(len(sc.film), len(sc.film) + len(sc.spheres)), sc.sphere_radius)
          if lead else contextlib.nullcontext()) as background:
        audit = _MemberAudit(background, np.r_[sc.film, sc.spheres])
        for j in range(members):
            audit.add(j, kept[j][0][0])
        for a, b in _chunks(step, n_total, unfold_step):
            if a == unfold_step:
                failure = _unfold_failure(sc, states, a)
                if failure:
                    break
                checked = True
            run, capacity = ensemble_rollout(sc.model, stacked, states, caps, schedule, dt=sc.dt, steps=b - a,
                                             config=sc.config, capacity=capacity)
            if first_chunk_s is None:
                first_chunk_s, first_steps = time.perf_counter() - wall0, b - step0
            failure = _take_chunk(run, a, kept, figures, options.save_every, audit, sc)
            states, caps, step = run.state, run.aux, b if failure is None else failure["step"]
            if options.progress and lead:
                _progress(float(states.t[0]), until, (step - step0, n_total - step0), time.perf_counter() - wall0,
                          (first_chunk_s, first_steps))
            if failure:
                break
        audits = audit.split(members)
    audits = _shared_audits(audits, [len(k) for k in kept])
    wall = time.perf_counter() - wall0
    if failure:
        print(f"bag ensemble: member {failure['member']} stopped in phase {failure['phase']!r} at t = "
              f"{failure['time_s']:.4f} s: {failure['reason']}", file=sys.stderr)
    return _write(sc, options, dict(states=states, caps=caps, step=step, checked=checked, kept=kept, figures=figures,
                                    audits=audits, failure=failure, wall=wall, first_chunk_s=first_chunk_s,
                                    params=plist, capacity=capacity), write=lead)


#: A member's audit, per kept frame: the field and its dtype (the same in every process).
AUDIT_FIELDS = (("intersecting_pairs", np.int64), ("min_film_film", np.float64), ("min_film_sphere", np.float64))


class _MemberAudit:
    """One :class:`ipcjax.audit.BackgroundAudit` for every member's frames, in the order they
    come (interleaved by chunk), each frame's member recorded, so that :meth:`split` gives
    each member the audit of its own frames, in order. ``background`` None (a process
    other than process 0) audits nothing: :meth:`split` gives None."""

    def __init__(self, background, order):
        self.background, self.order, self.owner = background, order, []

    def add(self, member: int, x) -> None:
        """Audit member's positions x (N, 3): film then spheres (``order``)."""
        if self.background is not None:
            self.background.add(np.asarray(x)[self.order])
        self.owner.append(member)

    def split(self, members: int) -> list | None:
        """Per member: its frames' intersecting pairs and smallest film–film and film–sphere gaps."""
        if self.background is None:
            return None
        r, owner = self.background.result(), np.asarray(self.owner)
        return [{k: np.asarray(r[k], dt)[owner == j] for k, dt in AUDIT_FIELDS} for j in range(members)]


def _broadcast(x: np.ndarray) -> np.ndarray:
    """Process 0's ``x`` in every process (``x`` of the same shape and dtype in each)."""
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.broadcast_one_to_all(x))


def _prepare_in_lead(out: str, lead: bool) -> None:
    """Process 0 prepares the run folder ``out``; when it cannot, every process raises
    before any step, not only process 0 (the others would wait for it in the program)."""
    import jax

    failure = None
    if lead:
        try:
            runfolder.prepare(out)
        except (OSError, ValueError) as e:
            failure = e
    if jax.process_count() > 1:   # every process joins the broadcast, process 0 included
        prepared = bool(_broadcast(np.array([failure is None], np.int64))[0])
        if not prepared and not lead:
            raise OSError(f"process 0 could not prepare the run folder {out!r}; its error names why")
    if failure is not None:
        raise failure


def _shared_audits(audits: list | None, frames: list) -> list:
    """Process 0's audit of every member (``audits``; None in the other processes) in every
    process, so that every process returns the same summary and status. ``frames``: each
    member's kept frames, the same in every process (they hold every member's results)."""
    import jax

    if jax.process_count() == 1:
        return audits
    return [{k: _broadcast(audits[j][k] if audits is not None else np.zeros(n, dt)) for k, dt in AUDIT_FIELDS}
            for j, n in enumerate(frames)]


def _progress(t: float, until: float, steps, wall: float, first) -> None:
    """One line on stderr per chunk: time, steps, wall so far and an ETA from the mean wall
    per step of the chunks after the first (``first``: its wall s and steps; it paid for
    the compilation)."""
    (done, total), (first_s, first_steps) = steps, first
    eta = ""
    if done > first_steps:
        per_step = (wall - first_s) / (done - first_steps)
        eta = f", ETA {(total - done) * per_step / 60:.1f} min"
    print(f"bag ensemble: t = {t:.3f} of {until:.2f} s, step {done}/{total}, {wall / 60:.1f} min{eta}",
          file=sys.stderr, flush=True)


def _unfold_failure(sc, states, step: int) -> dict | None:
    """The unfold check (:func:`scenes.bag.check_unfolded`) of every member at ``step``."""
    from scenes.bag import UnfoldIncomplete, check_unfolded

    for j in range(np.shape(states.x)[0]):
        try:
            check_unfolded(np.asarray(states.x[j]), sc.mesh)
        except UnfoldIncomplete as e:
            return dict(member=j, phase="unfold", step=step, time_s=float(states.t[j]),
                        reason=f"unfold check: {e}", columns=e.columns)
    return None


def _take_chunk(run, a: int, kept, figures, save_every: int, audit, sc) -> dict | None:
    """Keep a chunk's frames (every ``save_every``-th step), add them to the audit and the
    members' Newton figures; the first failed member's failure, or None."""
    from ipcjax.result import StepCode

    frames, times, rep = np.asarray(run.frames), np.asarray(run.times), run.reports
    failed_at, code = np.asarray(run.failed_at), np.asarray(run.code)
    for j in range(len(kept)):
        n = failed_at[j] if failed_at[j] >= 0 else frames.shape[1]
        for i in range(n):
            if (a + i + 1) % save_every == 0:
                kept[j].append((frames[j, i], float(times[j, i])))
                audit.add(j, frames[j, i])
        f = figures[j]
        f["iterations"] += int(np.asarray(rep.iterations[j, :n]).sum())
        f["projected"] += int(np.asarray(rep.projected[j, :n]).sum())
        f["max_depth"] = max(f["max_depth"], int(np.asarray(rep.max_depth[j, :n]).max(initial=0)))
        f["min_gap"] = min(f["min_gap"], float(np.asarray(rep.min_gap[j, :n]).min(initial=np.inf)))
    bad = np.flatnonzero(code != 0)
    if not bad.size:
        return None
    j = int(bad[0])
    step = a + int(failed_at[j])
    return dict(member=j, phase=sc.choreography.phase_at(step * sc.dt), step=step,
                time_s=float(run.state.t[j]), reason=StepCode.describe(int(code[j])), code=int(code[j]))


def _write(sc, options: BagRunOptions, r: dict, write: bool = True) -> EnsembleResult:
    """Every member's folder and the ensemble's summary.json; with ``write`` False (not
    process 0) the summary only."""
    import jax

    from scenes.bag import measurements
    from scenes.perturb import describe

    members = []
    for j, kept in enumerate(r["kept"]):
        folder = os.path.join(options.out, f"member{j}")
        x = np.stack([k[0] for k in kept])
        traj = runfolder.Trajectory(x[:, sc.film], x[:, sc.spheres], sc.faces, np.array([k[1] for k in kept]))
        t_j = float(r["states"].t[j])  # a member that did not fail ran to its chunk's end
        if write:
            runfolder.prepare(folder)
            runfolder.write_trajectory(os.path.join(folder, "trajectory.npz"), traj)
            write_state(os.path.join(folder, "state.npz"), r["states"].x[j], r["states"].v[j], t_j,
                        step=int(round(t_j / sc.dt)), unfold_checked=r["checked"], resolution=options.resolution,
                        captures=_captures_npz(sc, r["caps"], j), protocol=options.protocol)
        a, f = r["audits"][j], r["figures"][j]
        p = r["params"][j]
        m = dict(member=j, perturbation=describe(options.perturb, options.seed + j) if j else None,
                 params={k: float(getattr(p, k)) for k in ("youngs_modulus", "friction", "bending_scale")},
                 newton_iterations=f["iterations"], projected_directions=f["projected"],
                 max_subdivision_depth=f["max_depth"], min_gap_m=float(f["min_gap"]),
                 measurements=measurements(traj.film, traj.spheres, traj.time, sc),
                 audit=dict(frames=len(a["intersecting_pairs"]),
                            frames_with_self_intersection=int((a["intersecting_pairs"] > 0).sum()),
                            min_film_film_m=float(np.min(a["min_film_film"])),
                            min_film_sphere_m=float(np.min(a["min_film_sphere"]))))
        if write:
            runfolder.write_json(os.path.join(folder, "summary.json"), m)
        members.append(m)
    summary = dict(
        ensemble=len(members), resolution=options.resolution, protocol=options.protocol,
        linear_solver=sc.config.linear_solver, newton_tangent=sc.config.newton_tangent,
        devices=jax.device_count(), processes=jax.process_count(),
        step_index=r["step"],
        simulated_s=float(r["states"].t[0]),
        wall_s=r["wall"], first_chunk_s=r["first_chunk_s"], chunk_steps=CHUNK, capacity=r["capacity"]._asdict(),
        unfold_checked=r["checked"], failure=r["failure"], members=members,
        measurements_mean_sd=mean_sd([m["measurements"] for m in members]))
    if write:
        runfolder.write_json(os.path.join(options.out, "summary.json"), summary)
    return EnsembleResult(summary)


def _captures_npz(sc, caps, j: int) -> dict:
    """Member j's captures as :meth:`scenes.choreography.Choreography.captures_npz` writes them."""
    names = [tr.name for tr in sc.choreography.tracks if tr.needs_capture()]
    out = {f"capture_{n}": np.asarray(caps.positions[j, i]) for i, n in enumerate(names) if bool(caps.taken[j, i])}
    if bool(caps.tie_taken[j]):
        out[f"capture_{sc.choreography.tie.name}"] = np.asarray(caps.tie_length[j])
    return out


def mean_sd(measured: list) -> dict:
    """Mean and sample standard deviation (0 for one member) of the neck widths and the
    flap height over the members, mm."""
    neck = np.array([m["neck_width_mm"] for m in measured], np.float64)
    flap = np.array([m["flap_height_mm"] for m in measured], np.float64)
    sd = (lambda a: a.std(axis=0, ddof=1)) if len(measured) > 1 else (lambda a: np.zeros_like(a.mean(axis=0)))
    return dict(neck_width_mm=dict(mean=neck.mean(axis=0).tolist(), sd=sd(neck).tolist()),
                flap_height_mm=dict(mean=float(flap.mean()), sd=float(sd(flap))))

"""The bag experiment (docs/spec.md §5, §9) on Newton's Vertex Block Descent solver, for side-by-side runs.

Builds the same scene as :func:`scenes.bag.bag_scene` in ``newton`` 1.8 (``warp-lang`` 1.19,
Warp's CPU device), steps it with ``SolverVBD`` and writes the same ``trajectory.npz`` and
``summary.json`` as ``ipcjax bag``, so that :func:`scenes.bag.measurements` and
:func:`ipcjax.audit.audit_trajectory` judge both solvers with the same code.

Mapping of the IPC scene onto VBD (docs/vbd.md has the reasoning)
-----------------------------------------------------------------
* **Film**: the same mesh, vertex order and reference shape, the round pouch (particles [0, N_f)),
  ``add_cloth_mesh`` with areal density 0.02775 kg/m² (same lumped masses). Newton 1.8's
  VBD membrane is the stable Neo-Hookean of Smith et al. 2018 with ``tri_ke`` = μ and
  ``tri_ka`` = λ, Lamé coefficients per unit reference area (N/m): the plane-stress values
  μ = E h / (2(1 + ν)), λ = E h ν / (1 − ν²) of :func:`membrane_lame`, the same (μ, λ) as
  ipcjax's Neo-Hookean (the two energies agree to second order in strain). Triangle
  damping 0.
* **Bending**: Newton's dihedral energy is ½ (edge_ke ℓ)(θ − θ₀)², ipcjax's hinge is
  ½ kθ wrap(θ − θ₀)² with kθ = 6 D ℓ² / A; so ``edge_ke = 6 D ℓ / A`` *per edge*
  (:func:`edge_bending_stiffness`), written into the builder edge by edge since
  ``add_cloth_mesh`` takes one value. Edge damping 0.
* **Spheres**: seven rigid bodies (mass 250 kg/m³ · 4πR³/3, solid-sphere inertia) with
  sphere shapes, as in the specification's VBD run (docs/spec.md §9): VBD has no
  particle–particle or radius-aware particle–triangle contact, so a particle with a 26 mm
  radius would not touch the film.
* **Bin and floor**: four static box panels (2 mm thick, centred on the IPC wall planes,
  106 mm tall) and Newton's ground plane at z = 0, instead of IPC's fixed triangles.
* **Supports** ½ k ‖xᵢ − target‖²: one kinematic anchor particle (mass 0, flags 0, so no
  dynamics and no shape contact, and excluded from self-contact by the vertex–triangle
  filter map) per supported film point, joined to it by a zero-rest-length spring of
  stiffness Σk over the point's active slots, the anchor sitting at the k-weighted mean
  target (the same energy up to a constant). Springs are part of VBD's implicit per-vertex
  solve; an explicit force k (target − x) would be unstable at k = 300 N/m on ≈ 60 mg rim
  particles with dt = 1/960 s (√(k/m) dt ≈ 2.3 > 2).
* **Ties** ½·250·(‖xᵢ − xⱼ‖ − L)²: Newton springs between the film points, whose stiffness
  and rest length are rewritten from :meth:`Choreography.controls_at` every substep. Newton's
  graph colouring ignores springs, so two tied points of the same colour see each other's
  previous-iteration position (Jacobi coupling for that spring only).
* **External forces**: film drag −12·m·v and the sphere gravity cancellation (``Controls.force``
  rows) are explicit forces per substep (``State.particle_f``, ``State.body_f``).
* **Time**: dt = 1/960 s, 4 substeps per 1/240 s frame, 48 VBD iterations per substep.
  ``controls_at`` is called once per frame (activity at the frame start, targets at its end,
  as in the IPC run); substeps move each target linearly from the previous frame's target.
* **Contact**: vertex–face and edge–edge self-contact, 0.50 mm interaction distance plus
  1.50 mm detection width; rigid–film contact over the full film surface with DAT
  truncation and the log barrier; film particle radius 0.25 mm (half the self-contact
  range); contact stiffness 1000 N/m (the IPC barrier stiffness), friction 0.35, contact
  damping 0.

Needs the ``newton`` extra (``pip install -e '.[newton]'``); the pure-NumPy parts
(:func:`membrane_lame`, :func:`edge_bending_stiffness`, :func:`frame_problem`) do not.
``ipcjax compare`` puts a run of this driver beside an ``ipcjax bag`` run (scenes/compare.py;
``--run`` makes both runs: jobs/compare.py).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from ipcjax import runfolder
from ipcjax.energies.membrane import lame_from_young
from scenes.scene import ByName

FRAME_DT = 1.0 / 240.0
SUBSTEPS = 4
DT = FRAME_DT / SUBSTEPS           # 1/960 s (docs/spec.md §1, §9: the specification's VBD run)
ITERATIONS = 48                    # VBD iterations per substep
SELF_CONTACT_MARGIN = 0.50e-3      # m, self-contact interaction distance
SELF_CONTACT_GAP = 1.50e-3         # m, extra detection width
FILM_PARTICLE_RADIUS = 0.25e-3     # m, film offset against rigid shapes
SOFT_CONTACT_GAP = 1.50e-3         # m, extra detection width for film–shape contact
CONTACT_KE = 1000.0                # N/m, the IPC barrier stiffness
CONTACT_KD = 0.0
FRICTION = 0.35
WALL_HALF_THICKNESS = 1.0e-3       # m
MAX_SPEED = 50.0                   # m/s: above this a frame counts as a blow-up
MAX_COORD = 10.0                   # m


# --------------------------------------------------------------------------- material mapping

def membrane_lame(E, nu, h):
    """Newton VBD triangle stiffnesses (tri_ke, tri_ka) = plane-stress Lamé (μ, λ), N/m.

        tri_ke = μ = E h / (2 (1 + ν)),   tri_ka = λ = E h ν / (1 − ν²).

    Newton 1.8's VBD membrane is the stable Neo-Hookean ψ = μ/2 (I_C − 2) + λ'/2 (J − α)²
    with λ' = λ + μ, α = 1 + μ/λ' and per-triangle energy A₀ ψ, so tri_ke and tri_ka are
    Lamé coefficients per unit reference area; ipcjax's μ (tr ε − log J) + λ (log J)²/2
    uses the same pair.

    Args:
        E: Young's modulus, Pa. nu: Poisson's ratio. h: thickness, m.
    Returns:
        (tri_ke, tri_ka) in N/m: :func:`ipcjax.energies.membrane.lame_from_young`, the one
        formula both solvers use.
    """
    return lame_from_young(E, nu, h)


def edge_bending_stiffness(x_ref, edges, E, nu, h, *, scale=1.0):
    """Per-edge Newton ``edge_ke`` = 6 D ℓ / A (N) for ipcjax's hinge coefficient kθ = 6 D ℓ² / A.

    Newton's VBD bending energy is ½ (edge_ke ℓ)(θ − θ₀)², so edge_ke ℓ = kθ; D = E h³ /
    (12 (1 − ν²)), ℓ the rest length of the shared edge, A the summed rest area of its two
    faces. Boundary edges (an opposite vertex −1) get 0.

    Args:
        x_ref: (N, 3) rest positions, m. edges: (H, 4) Newton ``edge_indices`` rows
            (i, j, k, l): opposite vertices i, j and the shared edge k–l.
        E: Pa. nu: Poisson's ratio. h: m. scale: multiplies the result (ipcjax ``bending_scale``).
    Returns:
        (H,) edge_ke, N.
    """
    x = np.asarray(x_ref, dtype=np.float64)
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 4)
    interior = (e[:, 0] >= 0) & (e[:, 1] >= 0)
    i, j, k, l = (np.where(interior, e[:, c], 0) for c in range(4))
    xk, xl = x[k], x[l]
    area = 0.5 * (np.linalg.norm(np.cross(xk - x[i], xl - x[i]), axis=1)
                  + np.linalg.norm(np.cross(xl - x[j], xk - x[j]), axis=1))
    length = np.linalg.norm(xl - xk, axis=1)
    D = E * h ** 3 / (12.0 * (1.0 - nu * nu))
    ke = np.where(interior, 6.0 * D * length / np.where(interior, area, 1.0), 0.0)
    return scale * ke


def material(params) -> dict:
    """The film's VBD material numbers from ipcjax ``Params`` (floats, SI)."""
    E, nu, h = (float(params.youngs_modulus), float(params.poisson), float(params.thickness))
    mu, lam = membrane_lame(E, nu, h)
    return dict(youngs_modulus=E, poisson=nu, thickness=h, tri_ke=mu, tri_ka=lam,
                flexural_rigidity=E * h ** 3 / (12.0 * (1.0 - nu * nu)),
                bending_scale=float(params.bending_scale), drag=float(params.drag),
                gravity=np.asarray(params.gravity, float).tolist())


# --------------------------------------------------------------------------- supports

def anchor_springs(support_index, k, target, anchored):
    """Fold support slots into one zero-length spring per anchored particle.

    Σ_s ½ k_s ‖x − t_s‖² = ½ K ‖x − T‖² + const with K = Σ k_s, T = Σ k_s t_s / K, summed over
    the slots on each particle.

    Args:
        support_index: (S,) particle index per slot. k: (S,) N/m (0 = inactive).
        target: (S, 3) m. anchored: (P,) the particles that own an anchor, in anchor order.
    Returns:
        K (P,) N/m and T (P, 3) m (T is NaN-free; rows with K = 0 are zero).
    """
    anchored = np.asarray(anchored)
    slot_of = np.searchsorted(anchored, support_index)
    P = len(anchored)
    K = np.zeros(P)
    KT = np.zeros((P, 3))
    np.add.at(K, slot_of, k)
    np.add.at(KT, slot_of, k[:, None] * target)
    T = np.divide(KT, K[:, None], out=np.zeros_like(KT), where=K[:, None] > 0)
    return K, T


# --------------------------------------------------------------------------- model

@dataclass(frozen=True)
class VbdBag(ByName):
    """The bag on Newton (:func:`build_vbd_bag`); ``bag["model"]`` also reads a field
    (compatibility accessor, :class:`scenes.scene.ByName`)."""

    sc: object                   # the IPC scene (scenes.bag.BagScene)
    model: object                # newton.Model
    solver: object               # newton.solvers.SolverVBD
    state_0: object              # newton.State, swapped with state_1 every substep
    state_1: object
    control: object              # newton.Control
    n_film: int                  # film particles [0, n_film), the IPC scene's order
    anchored: np.ndarray         # film particles that a support slot drives
    anchor: np.ndarray           # their kinematic anchor particles
    tie_pairs: np.ndarray        # (Q, 2) tied film particles
    spring_anchor: slice         # the anchor springs among model.spring_*
    spring_tie: slice            # the tie springs among model.spring_*
    bodies: np.ndarray           # (7,) sphere bodies
    sphere_mass: np.ndarray      # (7,) kg
    edge_ke: np.ndarray          # per-edge bending stiffness written into the builder
    material: dict               # :func:`material` of the scene's parameters
    film_mass: np.ndarray        # (n_film,) kg


def build_vbd_bag(resolution: str = "coarse", *, iterations: int = ITERATIONS, device: str = "cpu",
                  protocol: str = "full") -> VbdBag:
    """Newton model, solver and state of the bag scene (the ``protocol`` choreography of
    :func:`scenes.bag.bag_scene`), as a :class:`VbdBag`."""
    import warp as wp

    wp.config.quiet = True                 # no start-up banner
    wp.config.log_level = wp.LOG_WARNING   # no per-module load lines
    import newton
    from scenes.bag import BIN_HALF, BIN_HEIGHT, bag_scene
    from scenes.film import FILM_DENSITY, FILM_THICKNESS

    sc = bag_scene(resolution, protocol=protocol)
    params, ch = sc.params, sc.choreography
    mat = material(params)
    film, faces = sc.film, np.asarray(sc.faces, np.int64)
    nf = len(film)
    x0 = np.asarray(sc.x, np.float64)
    film_x = x0[film]
    areal = FILM_THICKNESS * FILM_DENSITY  # 0.02775 kg/m², as the IPC scene's lumped masses
    g = np.asarray(params.gravity, float)

    builder = newton.ModelBuilder(up_axis=newton.Axis.Z, gravity=tuple(float(c) for c in g))
    builder.add_cloth_mesh(
        pos=wp.vec3(0.0, 0.0, 0.0), rot=wp.quat_identity(), scale=1.0, vel=wp.vec3(0.0, 0.0, 0.0),
        vertices=[wp.vec3(*p) for p in film_x], indices=faces.reshape(-1).tolist(), density=areal,
        tri_ke=mat["tri_ke"], tri_ka=mat["tri_ka"], tri_kd=0.0, edge_ke=0.0, edge_kd=0.0,
        particle_radius=FILM_PARTICLE_RADIUS,
    )
    edges = np.asarray(builder.edge_indices, np.int64)
    edge_ke = edge_bending_stiffness(film_x, edges, mat["youngs_modulus"], mat["poisson"],
                                     mat["thickness"], scale=mat["bending_scale"])
    builder.edge_bending_properties = [(float(k), 0.0) for k in edge_ke]

    # supports: one kinematic anchor per film particle that any support slot drives
    # the slot layout is fixed over the run (read from the schedule itself: its first
    # controls need the place hands' grab positions, which only the run observes)
    anchored = np.unique(ch.support_index)
    anchor = np.arange(builder.particle_count, builder.particle_count + len(anchored))
    for p in anchored:
        builder.add_particle(wp.vec3(*film_x[p]), wp.vec3(0.0, 0.0, 0.0), 0.0, radius=0.0, flags=0)
    for p, a in zip(anchored, anchor):
        builder.add_spring(int(p), int(a), 0.0, 0.0, 0.0)
    tie_pairs = np.asarray(ch.tie.pairs, np.int64).reshape(-1, 2)
    for i, j in tie_pairs:
        builder.add_spring(int(i), int(j), 0.0, 0.0, 0.0)
    builder.spring_rest_length = [0.0] * len(builder.spring_rest_length)

    # spheres: rigid bodies
    radii = np.asarray(sc.sphere_radius, float)
    masses = np.asarray(sc.model.mass)[sc.spheres]
    centres = x0[sc.spheres]
    cfg = newton.ModelBuilder.ShapeConfig(ke=CONTACT_KE, kd=CONTACT_KD, mu=FRICTION, density=0.0)
    bodies = []
    for c, r, m in zip(centres, radii, masses):
        I = 0.4 * m * r * r
        b = builder.add_body(xform=wp.transform(wp.vec3(*c), wp.quat_identity()), mass=float(m),
                             inertia=wp.mat33(I, 0.0, 0.0, 0.0, I, 0.0, 0.0, 0.0, I), lock_inertia=True)
        builder.add_shape_sphere(body=b, radius=float(r), cfg=cfg)
        bodies.append(b)
    # bin: four static panels centred on the IPC wall planes; floor: the ground plane z = 0
    t, h, H = WALL_HALF_THICKNESS, BIN_HALF, BIN_HEIGHT
    for cx, cy, hx, hy in ((0.0, -h, h + t, t), (0.0, h, h + t, t), (-h, 0.0, t, h), (h, 0.0, t, h)):
        builder.add_shape_box(-1, xform=wp.transform(wp.vec3(cx, cy, 0.5 * H), wp.quat_identity()),
                              hx=hx, hy=hy, hz=0.5 * H, cfg=cfg)
    builder.add_ground_plane(cfg=cfg)
    builder.color(include_bending=True)
    model = builder.finalize(device=device)
    model.soft_contact_ke = CONTACT_KE
    model.soft_contact_kd = CONTACT_KD
    model.soft_contact_mu = FRICTION

    pipeline = newton.CollisionPipeline(model, soft_contact_gap=SOFT_CONTACT_GAP,
                                        enable_rigid_soft_full_surface_contact=True)
    n_tri = int(model.tri_count)
    solver = newton.solvers.SolverVBD(
        model, iterations=iterations,
        particle_enable_self_contact=True,
        particle_self_contact_margin=SELF_CONTACT_MARGIN,
        particle_self_contact_gap=SELF_CONTACT_GAP,
        particle_external_vertex_contact_filtering_map={int(a): set(range(n_tri)) for a in anchor},
        rigid_soft_enable_dat=True,
        rigid_soft_contact_use_log_barrier=True,
        collision_pipeline=pipeline,
    )
    return VbdBag(sc=sc, model=model, solver=solver, state_0=model.state(), state_1=model.state(),
                  control=model.control(), n_film=nf, anchored=anchored, anchor=anchor,
                tie_pairs=tie_pairs, spring_anchor=slice(0, len(anchored)),
                spring_tie=slice(len(anchored), len(anchored) + len(tie_pairs)),
                bodies=np.asarray(bodies), sphere_mass=masses, edge_ke=edge_ke, material=mat,
                film_mass=model.particle_mass.numpy()[:nf].astype(np.float64))


# --------------------------------------------------------------------------- run

class _Frames:
    """Frames kept on the host (float32, as Warp holds them) and their trajectory.npz."""

    def __init__(self, out, faces):
        self.out, self.faces = out, faces
        self.film, self.spheres, self.time = [], [], []

    def add(self, film, spheres, t):
        self.film.append(np.asarray(film, np.float32))
        self.spheres.append(np.asarray(spheres, np.float32))
        self.time.append(float(t))

    def write(self):
        runfolder.write_trajectory(os.path.join(self.out, "trajectory.npz"), runfolder.Trajectory(
            np.stack(self.film), np.stack(self.spheres), self.faces, np.asarray(self.time)))


def frame_problem(film, spheres, film_v):
    """Reason string if a frame is not finite or has blown up, else None."""
    if not (np.isfinite(film).all() and np.isfinite(spheres).all() and np.isfinite(film_v).all()):
        return "non-finite positions or velocities"
    if np.abs(film).max() > MAX_COORD or np.abs(spheres).max() > MAX_COORD:
        return f"blow-up: a coordinate beyond {MAX_COORD} m"
    vmax = float(np.linalg.norm(film_v, axis=1).max())
    if vmax > MAX_SPEED:
        return f"blow-up: film speed {vmax:.1f} m/s > {MAX_SPEED} m/s"
    return None


def run_vbd(resolution: str = "coarse", until: float = 0.5, out: str = "runs/vbd", *, save_every: int = 1,
            iterations: int = ITERATIONS, progress: bool = True, checkpoint_every: int = 24,
            protocol: str = "full") -> dict:
    """Run the bag on Newton VBD and write trajectory.npz + summary.json to ``out``.

    Args:
        resolution: "coarse" (85 film vertices) or "full" (481). until: end time, s.
        out: run folder. save_every: keep every n-th 1/240 s frame. iterations: VBD
            iterations per substep. checkpoint_every: rewrite trajectory.npz every n frames.
        protocol: the choreography, "full" or "short" (:data:`scenes.bag.PROTOCOLS`), the
            same one ``ipcjax bag --protocol`` runs.
    Returns:
        The summary dict (also written to ``out/summary.json``). A non-finite or blown-up
        frame stops the run; ``failure`` names its time and reason and what was written is kept.
    """
    from ipcjax.audit import audit_trajectory
    from scenes.bag import measurements

    if save_every < 1:
        raise ValueError(f"save_every must be ≥ 1; got {save_every}")
    os.makedirs(out, exist_ok=True)
    t_build = time.perf_counter()
    v = build_vbd_bag(resolution, iterations=iterations, protocol=protocol)
    build_s = time.perf_counter() - t_build
    sc, model, solver, control = v.sc, v.model, v.solver, v.control
    s0, s1 = v.state_0, v.state_1
    ch, params = sc.choreography, sc.params
    nf, bodies = v.n_film, v.bodies
    anchored, anchor = v.anchored, v.anchor
    drag_m = float(params.drag) * v.film_mass
    x_ipc = np.asarray(sc.x, np.float64).copy()   # IPC particle layout, for observe()
    sph = np.asarray(sc.spheres)
    frames = _Frames(out, np.asarray(sc.faces))

    def positions(state):
        q = state.particle_q.numpy()
        return q[:nf].astype(np.float64), state.body_q.numpy()[bodies, :3].astype(np.float64)

    film, spheres = positions(s0)
    frames.add(film, spheres, 0.0)
    n_frames = int(round(until / FRAME_DT))
    prev_slots = None          # (k, target) of the previous frame, per support slot
    prev_tie = None
    failure = None
    stiff = model.spring_stiffness.numpy().astype(np.float32)
    rest = model.spring_rest_length.numpy().astype(np.float32)
    sa, st = v.spring_anchor, v.spring_tie
    wall0 = time.perf_counter()
    first_frame_s = None  # includes Warp's kernel loading (and compilation on a cold cache)
    frame, t = 0, 0.0
    try:
        from tqdm import tqdm
        bar = tqdm(total=n_frames, desc=f"vbd {resolution}", unit="frame", disable=not progress)
    except ImportError:  # pragma: no cover
        bar = None
    try:
        while frame < n_frames:
            t = frame * FRAME_DT
            x_ipc[:nf], x_ipc[sph] = film, spheres
            ch.observe(t, x_ipc)
            ctl = ch.controls_at(frame, t)
            idx = np.asarray(ctl.support_index)
            k = np.asarray(ctl.support_k, np.float64)
            tgt = np.asarray(ctl.support_target, np.float64)
            tie_k = np.asarray(ctl.tie_k, np.float64)
            tie_len = np.asarray(ctl.tie_length, np.float64)
            force = np.asarray(ctl.force, np.float64)
            if prev_slots is None:
                tgt0 = tgt
            else:  # slots active in both frames move linearly from last frame's target
                both = (prev_slots[0] > 0) & (k > 0)
                tgt0 = np.where(both[:, None], prev_slots[1], tgt)
            len0 = tie_len if prev_tie is None else np.where((prev_tie[0] > 0) & (tie_k > 0), prev_tie[1], tie_len)
            body_f = np.zeros((len(bodies), 6), np.float32)
            body_f[:, :3] = force[sph]
            for j in range(1, SUBSTEPS + 1):
                s = j / SUBSTEPS
                K, T = anchor_springs(idx, k, tgt0 + s * (tgt - tgt0), anchored)
                q = s0.particle_q.numpy()
                q[anchor] = np.where(K[:, None] > 0, T, q[anchored])
                s0.particle_q.assign(q)
                stiff[sa], stiff[st] = K, tie_k
                rest[st] = len0 + s * (tie_len - len0)
                model.spring_stiffness.assign(stiff)
                model.spring_rest_length.assign(rest)
                s0.clear_forces()
                f = np.zeros((model.particle_count, 3), np.float32)
                f[:nf] = force[:nf] - drag_m[:, None] * s0.particle_qd.numpy()[:nf]
                s0.particle_f.assign(f)
                s0.body_f.assign(body_f)
                solver.step(s0, s1, control, None, DT)
                s0, s1 = s1, s0
            frame += 1
            if first_frame_s is None:
                first_frame_s = time.perf_counter() - wall0
            prev_slots, prev_tie = (k, tgt), (tie_k, tie_len)
            film, spheres = positions(s0)
            problem = frame_problem(film, spheres, s0.particle_qd.numpy()[:nf])
            if problem:
                failure = dict(phase=ch.phase_at(t), time_s=frame * FRAME_DT, frame=frame, reason=problem)
                break
            if frame % save_every == 0 or frame == n_frames:
                frames.add(film, spheres, frame * FRAME_DT)
            if frame % checkpoint_every == 0:
                frames.write()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(phase=ch.phase_at(t), t=f"{frame * FRAME_DT:.3f}s")
    except KeyboardInterrupt:  # keep the frames so far
        failure = dict(phase=ch.phase_at(frame * FRAME_DT), time_s=frame * FRAME_DT, frame=frame,
                       reason="interrupted")
        frame += 1  # the interrupted frame is not kept
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - wall0
    frames.write()
    if failure:
        print(f"vbd: stopped in phase {failure['phase']!r} at t = {failure['time_s']:.4f} s: "
              f"{failure['reason']}", file=sys.stderr)
    F, S = np.stack(frames.film), np.stack(frames.spheres)
    times = np.asarray(frames.time)
    audit = audit_trajectory(np.concatenate([F, S], axis=1), sc.faces,
                             np.arange(F.shape[1], F.shape[1] + S.shape[1]), sc.sphere_radius)
    done = frame if failure is None else frame - 1
    summary = dict(
        solver="newton-vbd", newton_version=_version("newton"), warp_version=_version("warp"),
        device=str(model.device), resolution=resolution, protocol=protocol, frames_this_run=done,
        simulated_s=done * FRAME_DT, wall_s=wall, build_s=build_s,
        steps_per_s=done / wall if wall > 0 else None,
        substeps_per_s=SUBSTEPS * done / wall if wall > 0 else None,
        wall_s_per_simulated_s=wall / (done * FRAME_DT) if done else None,
        first_step_s=first_frame_s,
        wall_s_per_simulated_s_after_first_step=((wall - first_frame_s) / ((done - 1) * FRAME_DT)
                                                 if done > 1 and first_frame_s is not None else None),
        settings=dict(dt=DT, substeps_per_frame=SUBSTEPS, iterations=iterations,
                      self_contact_margin_m=SELF_CONTACT_MARGIN, self_contact_gap_m=SELF_CONTACT_GAP,
                      film_particle_radius_m=FILM_PARTICLE_RADIUS, soft_contact_gap_m=SOFT_CONTACT_GAP,
                      contact_ke=CONTACT_KE, contact_kd=CONTACT_KD, friction=FRICTION,
                      rigid_soft_dat=True, rigid_soft_log_barrier=True, **v.material),
        failure=failure,
        measurements=measurements(F, S, times, sc),
        audit=dict(frames=audit["frames"], frames_with_self_intersection=audit["frames_with_self_intersection"],
                   min_film_film_m=float(np.min(audit["min_film_film"])),
                   min_film_sphere_m=float(np.min(audit["min_film_sphere"]))),
    )
    summary = runfolder.json_safe(summary)
    runfolder.write_json(os.path.join(out, "summary.json"), summary)
    return summary


def _version(name):
    try:
        from importlib.metadata import version
        return version("warp-lang" if name == "warp" else name)
    except Exception:  # pragma: no cover
        return None


# --------------------------------------------------------------------------- command line

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m baselines.vbd_bag", description=(
        "The bag experiment on Newton's VBD solver (Warp CPU device). Writes trajectory.npz and "
        "summary.json in ipcjax's format to --out; `ipcjax compare --ipc DIR --vbd DIR` puts it "
        "beside an `ipcjax bag` run."))
    ap.add_argument("--resolution", choices=["coarse", "full"], default="coarse")
    ap.add_argument("--protocol", choices=["full", "short"], default="full",
                    help="the choreography (scenes.bag.PROTOCOLS), as `ipcjax bag --protocol`")
    ap.add_argument("--until", type=float, default=0.5, help="simulated end time, s (default 0.5)")
    ap.add_argument("--out", default="runs/vbd")
    ap.add_argument("--save-every", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=ITERATIONS)
    args = ap.parse_args(argv)
    summary = run_vbd(args.resolution, args.until, args.out, save_every=args.save_every, iterations=args.iterations,
                      protocol=args.protocol)
    print(runfolder.dumps({k: summary[k] for k in ("simulated_s", "wall_s", "steps_per_s", "failure", "audit",
                                                    "measurements")}))
    return 1 if summary["failure"] else 0


if __name__ == "__main__":
    sys.exit(main())

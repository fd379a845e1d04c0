"""A small film pouch around one sphere, cinched, tied and released: the default fit scene.

Built only from the library's public API (``build_model``, ``Controls``, ``Params``).

Geometry (SI units; z up; the fixed floor is the plane z = 0)
------------------------------------------------------------
* **Film**: the disk topology of the bag (:func:`scenes.mesh.bag_mesh`: a centre vertex
  and ``rings`` rings of ``columns`` points), 30 µm film with the bag's material
  (``Params.film_defaults()``), lumped masses at 0.02775 kg/m². Its rest shape is a
  pouch around the sphere (a thermoformed pouch: the rest shape is the start shape, so
  the film starts stress-free): ring 0–1 a flat bottom on the floor, rings 2–4 on a
  sphere of radius R + ``offset`` about the sphere centre (polar angles 120°, 90°, 60°),
  ring 5 the neck, ring 6 the rim, flaring up and out above the neck.
* **Sphere**: one free sphere centre of radius R with the bag's density (250 kg/m³)
  resting on the film bottom, which rests on the floor; both gaps start near the
  barrier's equilibrium under the sphere's weight (just inside d̂).
* **Floor**: two fixed triangles at z = 0.

Choreography (time-indexed Controls, one per step; every slot keeps its shape)
------------------------------------------------------------------------------
Defaults: 8 columns, dt = 1/60 s, 5 + 3 + 3 + 4 = 15 steps (0.25 s).

=======  ============  =========================================================
phase    steps         controls
=======  ============  =========================================================
cinch    n_cinch       neck ring supported (k_neck) on a smoothstep path from rest
                       to an ellipse pinched to ``pinch`` × its radius along y, at
                       the rest perimeter (no hoop compression, which a coarse ring
                       cannot take without locking), carried ``drag`` along +x (the
                       pouch slides on the floor); rim supported (k_rim), carried
                       along and raised by ``lift`` (the flap held up)
tie      n_tie         hands hold; ties (k_tie) across the pinched neck, column k to
                       column C − k, rest lengths shortened on a smoothstep from the
                       pinched widths to ``tie_ratio`` of them
release  n_release     support stiffness ramps to 0 on a smoothstep (hands let go)
settle   n_settle      ties only: the neck springs back against the ties, the flap
                       sinks against bending, the film slides on sphere and floor
=======  ============  =========================================================

Why these levers: E sets how far the pinched membrane springs back against the ties;
μf how far the pouch slid under the hands and how far it slides back; kθ (and E, through
D = Eh³/12(1 − ν²)) the flap's sag. Gradients and the measured Jacobian are in
docs/differentiation.md ("Default fit: the pouch").

Measurements (docs/spec.md §5; :mod:`scenes.measure`, the bag's own, differentiable on
JAX input): neck width = max − min of x and of y over the neck ring; flap height = median
z of the rim minus mean z of the neck ring.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

import ipcjax  # noqa: F401  (enables float64)
from ipcjax.candidates import Capacity
from ipcjax.model import Config, Controls, Params, build_model, check_controls, check_dt
from scenes.bag import SPHERE_DENSITY
from scenes.choreography import smoothstep
from scenes.film import lumped_mass
from scenes.measure import flap_height, neck_width
from scenes.measure import shape as measure
from scenes.mesh import bag_mesh, ring_index
from scenes.scene import ByName

__all__ = ["PouchScene", "pouch_scene", "pouch_profile", "neck_width", "flap_height", "measure"]

DT = 1.0 / 60.0
RADIUS = 0.020        # sphere radius, m
OFFSET = 0.0040       # film offset from the sphere along its sides, m
FLOOR_GAP = 0.00095   # film bottom above the floor (the barrier's range d̂ is 1 mm), m
SPHERE_GAP = 0.00095  # sphere surface above the film bottom, m
NECK_RING = 5
RINGS = 6


def _semi_axis_for_perimeter(perimeter, b):
    """The semi-axis a of an ellipse with semi-axis b and the given perimeter (Ramanujan)."""
    per = lambda a: np.pi * (3 * (a + b) - np.sqrt((3 * a + b) * (a + 3 * b)))
    lo, hi = b, perimeter
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if per(mid) < perimeter else (lo, mid)
    return 0.5 * (lo + hi)


def pouch_profile(radius: float = RADIUS, offset: float = OFFSET):
    """(r, z) of rings 0…6 of the rest pouch (m), with the sphere centre height z_c."""
    zb = FLOOR_GAP
    zc = zb + SPHERE_GAP + 0.5 * Config().min_gap + radius
    ro = radius + offset
    prof = [(0.0, zb), (0.45 * radius, zb)]
    for polar in (120.0, 90.0, 60.0):
        a = np.radians(polar)
        prof.append((ro * np.sin(a), zc + ro * np.cos(a)))
    a = np.radians(30.0)
    neck = (ro * np.sin(a), zc + ro * np.cos(a))
    prof.append(neck)
    prof.append((neck[0] + 0.35 * radius, neck[1] + 0.5 * radius))  # rim: flares up and out
    return np.asarray(prof), zc


@dataclass(frozen=True)
class PouchScene(ByName):
    """The pouch as built by :func:`pouch_scene` (``scene["x"]`` also reads a field:
    compatibility accessor, :class:`scenes.scene.ByName`)."""

    model: object               # ipcjax.model.Model
    capacity: Capacity | None   # candidate buffers for a rollout (None: use initial_capacity)
    x: np.ndarray               # (N, 3) start positions, m: film, sphere centre, floor
    v: np.ndarray               # (N, 3) start velocities, m/s (zero)
    controls: Controls          # stacked per step (leading axis = steps)
    controls_list: list         # the same, one Controls per step
    dt: float                   # timestep, s
    neck: np.ndarray            # (C,) neck-ring particles
    rim: np.ndarray             # (C,) rim particles
    sphere: int                 # the sphere centre's particle index
    film_triangles: np.ndarray  # (F, 3)
    n_film: int                 # film particles (they come first)
    params: Params              # the film defaults
    config: Config              # solver settings


def pouch_scene(columns: int = 8, *, n_cinch: int = 5, n_tie: int = 3, n_release: int = 3, n_settle: int = 4,
                dt: float = DT, offset: float = OFFSET, pinch: float = 0.6,
                drag: float = 0.004, lift: float = 0.001, k_neck: float = 100.0, k_rim: float = 20.0,
                k_tie: float = 250.0, tie_ratio: float = 0.9, tolerance: float = 1e-9) -> PouchScene:
    """Build the pouch: model, start positions and the stacked per-step Controls.

    Args:
        columns: points per ring (8–12 keep a rollout cheap).
        n_cinch, n_tie, n_release, n_settle: steps of the four phases (see module doc).
        dt: timestep, s.
        offset: film offset from the sphere along its sides at rest, m.
        pinch: the pinched neck's y semi-axis as a fraction of the rest neck radius (the x
            semi-axis keeps the rest perimeter).
        drag: how far the hands carry the neck and rim along +x while cinching, m (the
            pouch slides on the floor: the friction lever).
        lift: how far the rim supports raise the flap, m.
        k_neck, k_rim, k_tie: support and tie stiffnesses, N/m.
        tie_ratio: final tie length over the pinched neck's width at the tied columns.
        tolerance: Newton tolerance on max|Δx|, m (tight, so that gradients are clean).
    Returns:
        a :class:`PouchScene`.
    """
    phases = (n_cinch, n_tie, n_release, n_settle)
    if min(phases) < 1:
        raise ValueError(f"every phase needs ≥ 1 step; got cinch, tie, release, settle = {phases}")
    check_dt(dt)
    for name, v in dict(offset=offset, pinch=pinch, k_neck=k_neck, k_rim=k_rim, k_tie=k_tie, tie_ratio=tie_ratio,
                        tolerance=tolerance).items():
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a finite number > 0; got {v!r}")
    if not (np.isfinite(drag) and np.isfinite(lift)):
        raise ValueError(f"drag and lift must be finite; got {drag!r}, {lift!r}")
    steps = sum(phases)
    mesh = bag_mesh(RINGS, columns)
    prof, zc = pouch_profile(offset=offset)
    ang = 2 * np.pi * np.arange(columns) / columns
    pos = np.zeros((len(mesh.x), 3))
    pos[0] = [0.0, 0.0, prof[0, 1]]
    for r in range(1, RINGS + 1):
        idx = ring_index(r, np.arange(columns), columns)
        pos[idx] = np.stack([prof[r, 0] * np.cos(ang), prof[r, 0] * np.sin(ang), np.full(columns, prof[r, 1])], 1)
    tris = mesh.triangles
    n_film = len(pos)
    neck = ring_index(NECK_RING, np.arange(columns), columns)
    rim = ring_index(RINGS, np.arange(columns), columns)

    sphere = n_film
    h = 0.08
    floor = np.array([[-h, -h, 0.0], [h, -h, 0.0], [h, h, 0.0], [-h, h, 0.0]])
    x = np.concatenate([pos, [[0.0, 0.0, zc]], floor])
    mass = np.concatenate([lumped_mass(pos, tris), [SPHERE_DENSITY * 4 / 3 * np.pi * RADIUS ** 3], np.zeros(4)])
    radius = np.zeros(len(x)); radius[sphere] = RADIUS
    fixed = np.zeros(len(x), bool); fixed[n_film + 1:] = True
    b = n_film + 1
    model = build_model(x, tris, mass, obstacle_triangles=np.array([[b, b + 1, b + 2], [b, b + 2, b + 3]]),
                        fixed=fixed, radius=radius)

    # hand paths; targets are evaluated at each step's end time, the instant it solves for.
    # The hands pinch the neck flat along y at its rest perimeter (no hoop compression,
    # which a coarse ring cannot take without locking) and carry it along +x.
    r_neck = prof[NECK_RING, 0]
    neck0, rim0 = pos[neck], pos[rim]
    ry = pinch * r_neck
    rx = _semi_axis_for_perimeter(2 * np.pi * r_neck, ry)
    neck1 = np.stack([drag + rx * np.cos(ang), ry * np.sin(ang), neck0[:, 2]], 1)
    rim1 = rim0 + [drag, 0.0, lift]
    # ties across the pinched neck: column k to column C − k (k = 1 … C/2 − 1)
    kk = np.arange(1, (columns + 1) // 2)
    pairs = np.stack([neck[kk], neck[columns - kk]], 1).astype(np.int32)
    chord = np.linalg.norm(neck1[kk] - neck1[columns - kk], axis=1)
    sup_idx = np.concatenate([neck, rim]).astype(np.int32)
    k_hand = np.concatenate([np.full(columns, k_neck), np.full(columns, k_rim)])
    t_tie, t_release = n_cinch, n_cinch + n_tie
    ctls = []
    for i in range(steps):
        s = smoothstep((i + 1) / n_cinch)
        target = np.concatenate([neck0 + s * (neck1 - neck0), rim0 + s * (rim1 - rim0)])
        held = 1.0 - smoothstep((i + 1 - t_release) / n_release)  # hands let go gradually
        st = smoothstep((i + 1 - t_tie) / n_tie)
        length = chord * (1.0 - (1.0 - tie_ratio) * st)
        c = Controls.empty(len(x), tolerance=tolerance, n_supports=2 * columns, n_ties=len(kk))
        ctls.append(c._replace(support_index=jnp.asarray(sup_idx), support_k=jnp.asarray(k_hand * held),
                               support_target=jnp.asarray(target), tie_pairs=jnp.asarray(pairs),
                               tie_k=jnp.full(len(kk), k_tie * (i >= t_tie)), tie_length=jnp.asarray(length)))
    from ipcjax.candidates import GridCapacity
    from ipcjax.implicit import stack_controls
    # buffers ~1.5× the needs a host run of the default choreography reported (C = 8);
    # a rollout that overflows says so in its codes (CAPACITY_OVERFLOW)
    capacity = Capacity(vt=414, ee=942, sf=294, face_grid=GridCapacity(2616, 8316, 6264),
                        edge_grid=GridCapacity(3228, 3228, 15840)) if columns == 8 else None
    controls = check_controls(model, stack_controls(ctls), time_axis=True)
    return PouchScene(model=model, capacity=capacity, x=x, v=np.zeros_like(x), controls=controls,
                      controls_list=ctls, dt=dt, neck=neck, rim=rim, sphere=sphere, film_triangles=tris,
                      n_film=n_film, params=Params.film_defaults(), config=Config())


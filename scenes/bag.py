"""The bag experiment (docs/spec.md §1, §5): a 30 µm disk bag, an open bin, a floor, seven spheres,
and the spreading / cinching / tying choreography as data.

Built only from the library's public API (``build_model``, ``Params``, ``Controls``,
``Config``, ``ipcjax.audit``).

Geometry (SI units; z up; the floor is the plane z = 0)
------------------------------------------------------
* **Bag mesh** (:func:`bag_mesh`): vertex 0 is the centre; ring r = 1..R holds C points
  at angles 2π c / C, vertex index 1 + (r − 1) C + c. Defaults R = 15, C = 32 give 481
  vertices and C + 2C(R − 1) = 928 triangles; the rim is ring R (449–480) and the neck
  ring is ring 11 (321–352). For other ring counts the neck ring is ``round(11 R / 15)``
  (R = 7 → ring 5), the same proportion.
* **Radii** (docs/spec.md §5 leaves the inner rings open). The disk radius is 0.24 m. The outer
  rings, neck ring to rim, are equally spaced so that the reference edges along each
  column across them sum to 0.030 m (7.5 mm per edge at the defaults). The rings inside
  the neck are equally spaced in radius from the centre to the neck ring at 0.21 m
  (19.1 mm at the defaults, 42 mm for the coarse bag). Why 0.24 m: set on the floor,
  the film from the centre to the neck (0.21 m) is long enough to wrap the seven spheres
  (a cluster ≈ 0.12 m across and ≈ 0.07 m tall) and meet above them; held by its rim over
  the bin, the inner part sags into the bin, whose bottom lies 0.106 m down.
* **Bin**: four vertical walls 106 mm tall around a 0.20 × 0.20 m footprint centred at
  the origin, standing on the floor (the floor is the bin's bottom). Why 0.20 m: the
  three 52 mm and one 50 mm spheres fit side by side (2 × 2 = 104 mm) with room for the
  film, and the place phase's 0.12 m hand circle lies just outside the wall tops along
  the axes, so the film drapes over them into the bin. Walls are fixed triangles in
  ≈ 5 cm cells (zero-mass fixed vertices).
* **Floor**: fixed triangles in 5 cm cells over x ∈ [−0.30, 0.75], y ∈ [−0.35, 0.35],
  covering the bin and the set-down place at x = 0.40 m. Cells of ≈ 5 cm keep the broad
  phase's grid from entering one huge obstacle box into thousands of cells.
* **Spheres** (particles N_f … N_f + 6): radii 26, 26, 26, 12, 12, 12, 25 mm; masses
  250 kg/m³ · 4πR³/3. They wait above the bag mouth, gravity cancelled through
  ``Controls.force = −m g`` until their drop time: the three 26 mm spheres at angles
  90°, 210°, 330° on a 35 mm circle at z = 0.26 m, the three 12 mm spheres at 30°, 150°,
  270° at z = 0.30 m, the 25 mm sphere on the axis at z = 0.34 m (all pairwise
  surface gaps ≥ 8 mm; all above the highest point the rim passes, 0.20 m).
* The film starts flat at z = 0.14 m (34 mm above the wall tops), centred over the bin.

Choreography (``Choreography``; docs/spec.md §5 times, paths are our choice)
---------------------------------------------------------------------------
Support tracks are rows of data: a name, [t_on, t_off), particle indices, a stiffness
per particle (N/m) and keyframes (time, targets). A keyframe's targets are an (n, 3)
array; ``CAPTURE``, the supported points' positions when the track starts (a hand grabs
the film where it is); :class:`Above`, points over other particles' positions at the
start (the rim over its own column's neck point); or :class:`Ring`, a circle over the
contents' centre at the start. :meth:`Choreography.observe` records the positions when a
track starts, so after set-down every path is placed relative to where the bag actually
lies rather than to a precomputed spot. Between
keyframes targets move along a smoothstep (zero velocity at each keyframe). Every
track has its own fixed block of support slots in ``Controls`` (k = 0 while inactive),
so shapes never change across the run.

=============  ===========  ==============================  ======  =====================================
track          time (s)     particles                        k N/m   path
=============  ===========  ==============================  ======  =====================================
place          0.00–2.00    all rim points                   20      flat → circle r 0.13 m, z 0.20 (0.36 s)
                                                                     → circle r 0.12 m, z 0.17 (0.72 s), hold
lift           2.00–4.70    rim columns 0 and C/2            300     CAPTURE → up to z 0.40 and in to
                                                                     x = ±0.03 m (2.90) → over to x 0.40
                                                                     (3.70) → down to z 0.10 (4.50), hold
spread neck    4.70–6.05    neck ring                        10      CAPTURE → circle r 0.205 m
                                                                     (``SPREAD_NECK_RADIUS``, rest 0.21) at
                                                                     z 0.004 (``SPREAD_Z``) around the
                                                                     contents' centre (5.40), hold
unfold         4.70–5.50    all rim points                   10      CAPTURE → circle r 0.227 m at z 0.024:
                                                                     the neck circle plus 22 mm outward
                                                                     (``UNFOLD_OUTWARD``) and 20 mm up
                                                                     (``UNFOLD_RISE``) (5.40), hold
unfold2        5.50–6.05    all rim points                   10      CAPTURE → each rim point 20 mm over
                                                                     its column's neck point as it lies at
                                                                     5.50 and 22 mm further out from the
                                                                     contents' centre (5.90), hold
gather         6.05–7.40    all rim points                   10      CAPTURE → star over the contents' centre,
                                                                     z 0.10: even columns on r 0.025 m, odd
                                                                     ones out where rim neighbours are 0.9
                                                                     rest rim edges apart (7.10), hold
flap           7.40–9.40    5 rim columns round(jC/5)        50      CAPTURE, hold to 8.75 → circle r 0.035 m,
                                                                     z 0.09 over the contents (9.40)
cinch          7.40–9.40    every other column of the two    50      CAPTURE → circle r 0.015 m over the
                            neck bands (rings neck, neck − 1)        contents, neck band z 0.07, lower band
                                                                     0.6·(ring gap) below (8.40), hold
=============  ===========  ==============================  ======  =====================================

* Why the place circle is 0.12 m at z 0.17 m: it is about what the film reaches without
  pleating. A flat disk can only become a sack by folding circumferentially, which 12
  columns cannot do (membrane locking); a tighter circle leaves the rim lagging behind its
  targets with energy stored in the supports and the compressed membrane, which springs
  back when the place supports let go at 2.00 s.
* Why the unfold spreads the bag first: the rim ring is 14 % longer than the neck ring
  (2π·0.24 vs 2π·0.21 m) and the film barely compresses in-plane, so a hand circle much
  smaller than the rim, or rim targets straight over a bunched-up neck, force the rim
  polygon into a zigzag of alternating height whose low columns fold back down and fail
  :func:`check_unfolded`. Spreading the neck ring to near its rest radius gives the rim
  room for its length, so every column can rise from neck to rim by 6.05 s.
* Drops: sphere j (in the order 26, 26, 26, 12, 12, 12, 25 mm) gets gravity from
  0.89 + j (1.60 − 0.89)/6 s.
* Ties (``TieTrack``), active from 8.40 s: ½·250·(‖xᵢ − xⱼ‖ − Lᵢⱼ)² between consecutive
  cinched points around each band (closed loop) and between the two bands' points in
  the same column. Lᵢⱼ starts at the captured length at 8.40 s (no jolt) and follows a
  smoothstep to min(captured, target) by 8.75 s; targets: chords of a 12 mm circle
  within a band, 0.6 of the reference ring gap between bands.
* Tolerance: 0.012 mm until 9.40 s, 0.0005 mm after (all supports released).
* Timing convention of :meth:`Choreography.controls_at` ``(step_index, t)``: t is the
  step's start time. Activity (supports, ties, gravity cancellation, tolerance) is
  decided at the start time; targets and tie lengths are evaluated at the step's end
  time t + dt, the instant the implicit step solves for.
* The specification's check that all columns unfold upward (docs/spec.md §5,
  :func:`check_unfolded`) runs when the unfold track ends (6.05 s): along every column, z must increase strictly from the neck
  ring to the rim.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

import ipcjax  # noqa: F401  (enables float64)
from ipcjax.model import Config, Controls, Params, build_model, check_params
from scenes import measure
from scenes.film import FILM_DENSITY, FILM_THICKNESS, lumped_mass
from scenes.scene import ByName

DT = 1.0 / 240.0
BIN_HEIGHT = 0.106
BIN_HALF = 0.10
SPHERE_RADII = (0.026, 0.026, 0.026, 0.012, 0.012, 0.012, 0.025)
SPHERE_DENSITY = 250.0
DISK_RADIUS = 0.24
NECK_TO_RIM = 0.030
FILM_Z0 = 0.14
SET_DOWN = np.array([0.40, 0.0])
TOL_MANIPULATION = 0.012e-3
TOL_RELEASED = 0.0005e-3
T_RELEASE = 9.40
T_END = 10.50
TIE_K = 250.0
SPREAD_NECK_RADIUS = 0.205  # m: the neck ring's circle while the bag is spread (rest radius 0.21)
SPREAD_Z = 0.004            # m: its height (film on the floor)
UNFOLD_RISE = 0.020         # m: rim target over its column's neck point after unfolding
UNFOLD_OUTWARD = 0.022      # m: and this far outward from the contents' centre (chord 29.7 mm)
# Heights over the floor for gathering and cinching. After the carry the seven spheres lie in
# one layer on the floor (centres 14–28 mm up, tops ≈ 54 mm); the film from the bag's
# centre under them, up their side and over their top leaves only a few cm to the neck, so
# the rim is gathered low enough not to lift the bag and its contents off the floor.
GATHER_Z = 0.10             # m: rim star after gathering: even columns on r 25 mm, odd columns
GATHER_EDGE = 0.9           # out where consecutive rim points are 0.9 rim edges apart (pleats)
NECK_Z = 0.07               # m: cinched neck band (r 15 mm); the lower band 0.6 ring gaps below
FLAP_LOWERED_Z = 0.09       # m: the five flap supports' circle (r 35 mm) at release
MIN_LENGTH = 1e-12  # m: a horizontal offset shorter than this has no direction (no outward move)
EPS_T = 1e-9  # s: slack when accumulated step times are compared with phase boundaries

# Named phases, for progress display and for the measurements' windows (docs/spec.md §5).
PHASES = (
    ("place", 0.00, 0.72), ("hold", 0.72, 0.89), ("drops", 0.89, 1.60), ("settle", 1.60, 2.00),
    ("lift", 2.00, 4.70), ("unfold", 4.70, 6.05), ("gather", 6.05, 7.10), ("hold flap", 7.10, 7.40),
    ("cinch", 7.40, 8.40), ("tie", 8.40, 8.75), ("lower flap", 8.75, 9.40), ("released", 9.40, T_END),
)

CAPTURE = "capture"


# --------------------------------------------------------------------------- mesh

class BagMesh(NamedTuple):
    x: np.ndarray          # (1 + R C, 3) reference positions (flat disk at z = 0), m
    triangles: np.ndarray  # (C + 2C(R − 1), 3) int32
    ring_radius: np.ndarray  # (R + 1,) radius of ring r (ring 0 = centre), m
    rings: int
    columns: int
    neck_ring: int
    rim: np.ndarray        # (C,) indices of ring R
    neck: np.ndarray       # (C,) indices of the neck ring


def ring_index(ring: int, column, columns: int):
    """Vertex index of (ring ≥ 1, column) in :func:`bag_mesh`'s numbering."""
    return 1 + (ring - 1) * columns + np.mod(column, columns)


def neck_ring_of(rings: int) -> int:
    """The neck ring for a bag of ``rings`` rings: ring 11 of 15, same proportion otherwise."""
    neck = int(round(11 * rings / 15))
    return min(max(neck, 1), rings - 1)


def bag_mesh(rings: int = 15, columns: int = 32, radius: float = DISK_RADIUS,
             neck_to_rim: float = NECK_TO_RIM) -> BagMesh:
    """Flat disk bag: a centre vertex and ``rings`` rings of ``columns`` points.

    Ring radii: rings neck…R equally spaced with (R − neck) edges summing to
    ``neck_to_rim`` (m); rings 1…neck equally spaced from 0 to ``radius − neck_to_rim``.
    Triangles are counter-clockwise seen from +z; the diagonal of each quad alternates
    with (ring + column) parity so the mesh has no spiral bias.
    """
    if rings < 2 or columns < 3:
        raise ValueError(f"a bag needs rings ≥ 2 and columns ≥ 3; got rings={rings}, columns={columns}")
    if not 0 < neck_to_rim < radius:
        raise ValueError(f"need 0 < neck_to_rim < radius; got {neck_to_rim}, {radius}")
    neck = neck_ring_of(rings)
    r_neck = radius - neck_to_rim
    rr = np.empty(rings + 1)
    rr[: neck + 1] = np.linspace(0.0, r_neck, neck + 1)
    rr[neck:] = np.linspace(r_neck, radius, rings - neck + 1)
    ang = 2 * np.pi * np.arange(columns) / columns
    x = [np.zeros(3)]
    for r in range(1, rings + 1):
        x += list(np.stack([rr[r] * np.cos(ang), rr[r] * np.sin(ang), np.zeros(columns)], axis=1))
    x = np.asarray(x)
    tris = []
    for k in range(columns):
        tris.append((0, ring_index(1, k, columns), ring_index(1, k + 1, columns)))
    for r in range(1, rings):
        for k in range(columns):
            a, b = ring_index(r, k, columns), ring_index(r, k + 1, columns)
            A, B = ring_index(r + 1, k, columns), ring_index(r + 1, k + 1, columns)
            if (r + k) % 2 == 0:
                tris += [(a, A, B), (a, B, b)]
            else:
                tris += [(a, A, b), (b, A, B)]
    return BagMesh(x=x, triangles=np.asarray(tris, np.int32), ring_radius=rr, rings=rings,
                   columns=columns, neck_ring=neck, rim=ring_index(rings, np.arange(columns), columns),
                   neck=ring_index(neck, np.arange(columns), columns))


# --------------------------------------------------------------------------- obstacles

def _grid_quads(origin, u, v, nu, nv):
    """Vertices and triangles of a planar nu × nv cell grid spanned by vectors u, v."""
    i, j = np.meshgrid(np.arange(nu + 1), np.arange(nv + 1), indexing="ij")
    pts = origin + i.reshape(-1, 1) * (u / nu) + j.reshape(-1, 1) * (v / nv)
    idx = lambda a, b: a * (nv + 1) + b
    tris = []
    for a in range(nu):
        for b in range(nv):
            tris += [(idx(a, b), idx(a + 1, b), idx(a + 1, b + 1)), (idx(a, b), idx(a + 1, b + 1), idx(a, b + 1))]
    return pts, np.asarray(tris, np.int64)


def bin_and_floor(cell: float = 0.05):
    """Fixed obstacle surfaces: four bin walls and the floor. Returns (bin (x, tris), floor (x, tris))."""
    h, H = BIN_HALF, BIN_HEIGHT
    nw, nh = max(1, int(np.ceil(2 * h / cell))), max(1, int(np.ceil(H / cell)))
    corners = [(-h, -h), (h, -h), (h, h), (-h, h)]
    pts, tris = [], []
    for k in range(4):
        p0 = np.array([*corners[k], 0.0])
        p1 = np.array([*corners[(k + 1) % 4], 0.0])
        q, t = _grid_quads(p0, p1 - p0, np.array([0.0, 0.0, H]), nw, nh)
        tris.append(t + sum(len(p) for p in pts))
        pts.append(q)
    bin_x, bin_t = np.concatenate(pts), np.concatenate(tris)
    x0, x1, y0, y1 = -0.30, 0.75, -0.35, 0.35
    fx, ft = _grid_quads(np.array([x0, y0, 0.0]), np.array([x1 - x0, 0, 0]), np.array([0, y1 - y0, 0.0]),
                         int(round((x1 - x0) / cell)), int(round((y1 - y0) / cell)))
    return (bin_x, bin_t), (fx, ft)


def sphere_start():
    """(7, 3) sphere centres waiting above the bag mouth (see module docstring)."""
    out = []
    for j, deg in enumerate((90, 210, 330)):
        a = np.radians(deg)
        out.append((0.035 * np.cos(a), 0.035 * np.sin(a), 0.26))
    for deg in (30, 150, 270):
        a = np.radians(deg)
        out.append((0.035 * np.cos(a), 0.035 * np.sin(a), 0.30))
    out.append((0.0, 0.0, 0.34))
    return np.asarray(out)


# --------------------------------------------------------------------------- choreography

def smoothstep(s):
    s = np.clip(s, 0.0, 1.0)
    return s * s * (3.0 - 2.0 * s)


@dataclass(frozen=True)
class Above:
    """Keyframe targets over other particles: the positions of ``source`` (one particle per
    supported point) when the track starts, raised by ``rise`` (m) and moved ``outward`` (m)
    horizontally away from the xy centroid of ``about``'s positions at that time (``about``
    defaults to ``source``)."""

    source: np.ndarray
    rise: float
    outward: float = 0.0
    about: np.ndarray | None = None

    def resolve(self, x):
        p = np.asarray(x, np.float64)[np.asarray(self.source)].copy()
        about = self.source if self.about is None else self.about
        c = np.asarray(x, np.float64)[np.asarray(about), :2].mean(axis=0)
        d = p[:, :2] - c
        n = np.linalg.norm(d, axis=1, keepdims=True)
        p[:, :2] += self.outward * np.where(n > MIN_LENGTH, d / np.maximum(n, MIN_LENGTH), 0.0)
        p[:, 2] += self.rise
        return p


@dataclass(frozen=True)
class Ring:
    """Keyframe targets on a horizontal circle of ``radius`` (m) at height ``z`` (m), centred
    over the xy centroid of ``about``'s positions when the track starts, one point per
    supported particle at ``angles`` (rad)."""

    about: np.ndarray
    radius: float | np.ndarray  # one radius, or one per point (a star)
    z: float
    angles: np.ndarray

    def resolve(self, x):
        c = np.asarray(x, np.float64)[np.asarray(self.about), :2].mean(axis=0)
        a = np.asarray(self.angles, np.float64)
        r = np.broadcast_to(np.asarray(self.radius, np.float64), a.shape)
        return np.stack([c[0] + r * np.cos(a), c[1] + r * np.sin(a),
                         np.full(len(a), float(self.z))], axis=1)


class _Bands(Ring):
    """A :class:`Ring` whose points have their own heights (``z`` is an (n,) array)."""

    def resolve(self, x):
        p = Ring(self.about, self.radius, 0.0, self.angles).resolve(x)
        p[:, 2] = np.asarray(self.z, np.float64)
        return p


@dataclass
class SupportTrack:
    """One hand: ½ k ‖xᵢ − targetᵢ(t)‖² on ``index`` while t_on ≤ t < t_off.

    keys: list of (time s, targets), where targets are an (n, 3) array of fixed positions,
    ``CAPTURE`` (the supported points where they are when the track starts), or an
    :class:`Above` / :class:`Ring` placed relative to particles' positions at the start.
    """

    name: str
    t_on: float
    t_off: float
    index: np.ndarray
    k: float
    keys: list

    def needs_capture(self) -> bool:
        return any(isinstance(v, (str, Above, Ring)) for _, v in self.keys)

    def resolve(self, x):
        """The keyframes as (time, (n, 3) array) with captures taken from positions x (N, 3)."""
        out = []
        for tk, v in self.keys:
            if isinstance(v, str):
                v = np.asarray(x, np.float64)[self.index]
            elif isinstance(v, (Above, Ring)):
                v = v.resolve(x)
            v = np.asarray(v, np.float64)
            if v.shape != (len(self.index), 3):
                raise ValueError(f"track {self.name!r}: keyframe at {tk} s has shape {v.shape}, "
                                 f"expected ({len(self.index)}, 3)")
            out.append((tk, v))
        return out


@dataclass
class TieTrack:
    """Tie springs ½ k (‖xᵢ − xⱼ‖ − L(t))² from t_on; L goes from the captured lengths to
    min(captured, target) along a smoothstep ending at t_full."""

    name: str
    t_on: float
    t_full: float
    pairs: np.ndarray   # (Q, 2)
    k: float
    target: np.ndarray  # (Q,) m


def _path(keys, t):
    """Targets at time t along the smoothstep path through resolved keyframes (time, array)."""
    times = [tk for tk, _ in keys]
    vals = [v for _, v in keys]
    if t <= times[0]:
        return vals[0]
    for (t0, v0), (t1, v1) in zip(zip(times, vals), zip(times[1:], vals[1:])):
        if t <= t1:
            s = smoothstep((t - t0) / (t1 - t0))
            return v0 + s * (v1 - v0)
    return vals[-1]


@dataclass
class Choreography:
    """The docs/spec.md §5 schedule as data, compiled into fixed-size :class:`Controls`.

    Support slots: the tracks' particles concatenated in table order (a particle may sit in
    several tracks' slots; each is inactive outside its track). Tie slots: the tie track's
    pairs. Captures are filled by :meth:`observe`: for a track whose keyframes depend on
    where the film is (``CAPTURE``, :class:`Above`, :class:`Ring`), all particle positions
    (N, 3) when the track starts; for the tie, its pairs' lengths at 8.40 s.
    """

    n_particles: int
    dt: float
    tracks: list
    tie: TieTrack
    sphere_index: np.ndarray
    sphere_mass: np.ndarray
    drop_times: np.ndarray
    gravity: np.ndarray
    t_release: float = T_RELEASE
    tol_manipulation: float = TOL_MANIPULATION
    tol_released: float = TOL_RELEASED
    phases: tuple = PHASES
    captures: dict = field(default_factory=dict)

    # ---- slot layout
    @property
    def support_index(self) -> np.ndarray:
        return np.concatenate([tr.index for tr in self.tracks]).astype(np.int32)

    def slots(self, name: str) -> slice:
        """The support-slot range of the named track."""
        s = 0
        for tr in self.tracks:
            if tr.name == name:
                return slice(s, s + len(tr.index))
            s += len(tr.index)
        raise KeyError(name)

    def track(self, name: str) -> SupportTrack:
        return next(tr for tr in self.tracks if tr.name == name)

    def phase_at(self, t: float) -> str:
        for name, a, b in self.phases:
            if a - EPS_T <= t < b - EPS_T:
                return name
        return self.phases[-1][0]

    # ---- captures
    def observe(self, t: float, x) -> list:
        """Record grab positions for tracks (and tie lengths) starting at or before the
        step start time t, from positions x (N, 3). Returns the names captured now."""
        x = np.asarray(x, dtype=np.float64)
        done = []
        for tr in self.tracks:
            if tr.needs_capture() and tr.name not in self.captures and t + EPS_T >= tr.t_on:
                self.captures[tr.name] = x.copy()
                done.append(tr.name)
        if self.tie.name not in self.captures and t + EPS_T >= self.tie.t_on:
            p = self.tie.pairs
            self.captures[self.tie.name] = np.linalg.norm(x[p[:, 0]] - x[p[:, 1]], axis=1)
            done.append(self.tie.name)
        return done

    def keyframes(self, name: str, t: float | None = None) -> list:
        """The named track's keyframes resolved to (time, (n, 3) targets).

        Raises:
            RuntimeError: the track depends on where the film is when it starts but
                :meth:`observe` has not recorded that (``t`` is only used in the message).
        """
        tr = self.track(name)
        if not tr.needs_capture():
            return tr.resolve(None)
        cap = self.captures.get(name)
        if cap is None:
            when = "" if t is None else f" at t = {t:.4f} s"
            raise RuntimeError(f"support track {name!r} is active{when} but its grab positions were not "
                               f"captured; call observe(t, x) first")
        return tr.resolve(cap)

    # ---- compile
    def controls_at(self, step_index: int, t: float) -> Controls:
        """Controls for the step starting at time t (s); see the module's timing convention.

        Raises:
            RuntimeError: a track that grabs the film where it is has started but
                :meth:`observe` has not recorded its grab positions.
        """
        import jax.numpy as jnp

        t = float(t)
        t_end = t + self.dt
        ks, targets = [], []
        for tr in self.tracks:
            n = len(tr.index)
            active = tr.t_on - EPS_T <= t < tr.t_off - EPS_T
            if active:
                targets.append(_path(self.keyframes(tr.name, t), t_end))
                ks.append(np.full(n, tr.k))
            else:
                targets.append(np.zeros((n, 3)))
                ks.append(np.zeros(n))
        tie = self.tie
        q = len(tie.pairs)
        if t + EPS_T >= tie.t_on:
            cap = self.captures.get(tie.name)
            if cap is None:
                raise RuntimeError(f"tie {tie.name!r} is active at t = {t:.4f} s but its start lengths were "
                                   f"not captured; call observe(t, x) first")
            s = smoothstep((t_end - tie.t_on) / (tie.t_full - tie.t_on))
            tie_len = cap + s * (np.minimum(cap, tie.target) - cap)
            tie_k = np.full(q, tie.k)
        else:
            tie_len, tie_k = np.zeros(q), np.zeros(q)
        force = np.zeros((self.n_particles, 3))
        waiting = t < self.drop_times - EPS_T
        force[self.sphere_index[waiting]] = -self.sphere_mass[waiting, None] * self.gravity[None, :]
        tol = self.tol_manipulation if t < self.t_release - EPS_T else self.tol_released
        return Controls(
            support_index=jnp.asarray(self.support_index, jnp.int32),
            support_k=jnp.asarray(np.concatenate(ks)),
            support_target=jnp.asarray(np.concatenate(targets, axis=0)),
            tie_pairs=jnp.asarray(tie.pairs, jnp.int32),
            tie_k=jnp.asarray(tie_k),
            tie_length=jnp.asarray(tie_len),
            force=jnp.asarray(force),
            tolerance=jnp.asarray(tol, jnp.float64),
        )

    def captures_npz(self) -> dict:
        return {f"capture_{k}": v for k, v in self.captures.items()}

    def load_captures(self, npz) -> None:
        """Restore captures written by :meth:`captures_npz` (e.g. from a run's state.npz).

        Raises:
            ValueError: a track's capture is not (N, 3) positions of this scene's particles.
        """
        names = {tr.name for tr in self.tracks}
        for key in npz.files:
            if key.startswith("capture_"):
                name, v = key[len("capture_"):], np.asarray(npz[key])
                if name in names and v.shape != (self.n_particles, 3):
                    raise ValueError(f"capture {name!r} has shape {v.shape}; expected ({self.n_particles}, 3) "
                                     f"positions of every particle (a state saved by an older choreography?)")
                self.captures[name] = v


def star_radii(columns: int, inner: float, edge: float) -> np.ndarray:
    """Radii of a star of ``columns`` points at angles 2π c / C: even points on the circle
    of radius ``inner``, odd points out where consecutive points are ``edge`` apart.

    A closed ring of C film edges cannot be gathered onto a circle smaller than its rest
    perimeter (the film barely compresses in-plane), but it can fold into a star whose
    sides keep their length: the pleats of a gathered bag.
    """
    c = np.cos(2 * np.pi / columns)
    disc = (inner * c) ** 2 - inner ** 2 + edge ** 2
    if disc <= 0:
        raise ValueError(f"edge {edge} m is too short for a star around r = {inner} m")
    r = np.full(columns, float(inner))
    r[1::2] = inner * c + np.sqrt(disc)
    return r


def _circle(n, r, z, center=(0.0, 0.0), phase=0.0):
    a = phase + 2 * np.pi * np.arange(n) / n
    return np.stack([center[0] + r * np.cos(a), center[1] + r * np.sin(a), np.full(n, z)], axis=1)


def make_choreography(mesh: BagMesh, n_particles: int, sphere_index, sphere_mass, *, gravity=(0, 0, -9.81),
                      dt: float = DT) -> Choreography:
    """The docs/spec.md §5 schedule for ``mesh`` (see the table in the module docstring)."""
    C = mesh.columns
    rim = mesh.rim
    flat_rim = mesh.x[rim] + np.array([0.0, 0.0, FILM_Z0])
    cx, _ = SET_DOWN
    # place: all rim points contract onto a circle over the bin and come down to hold it open
    place = SupportTrack("place", 0.0, 2.00, rim, 20.0, [
        (0.0, flat_rim), (0.36, _circle(C, 0.13, 0.20)), (0.72, _circle(C, 0.12, 0.17))])
    # lift: two opposing rim points carry the bag out of the bin and set it on the floor
    pair = np.array([rim[0], rim[C // 2]])
    at = lambda x, z: np.array([[x + 0.03, 0.0, z], [x - 0.03, 0.0, z]])
    lift = SupportTrack("lift", 2.00, 4.70, pair, 300.0, [
        (2.00, CAPTURE), (2.90, at(0.0, 0.40)), (3.70, at(cx, 0.40)), (4.50, at(cx, 0.10))])
    spheres = np.asarray(sphere_index)
    rim_edge = 2 * mesh.ring_radius[mesh.rings] * np.sin(np.pi / C)  # rest length of a rim edge
    col_angle = 2 * np.pi * np.arange(C) / C
    # unfold (spread the bag and raise its hem): the neck ring is drawn out onto a circle
    # near its rest radius on the floor around the contents while the rim is drawn onto a
    # slightly larger, higher circle, so each column's last 30 mm rises outward like the rim
    # of a dish; then a second pass places each rim point over its own column's neck point,
    # from where the neck ring actually is at 5.50 s.
    spread = SPREAD_NECK_RADIUS
    neck_hand = SupportTrack("spread neck", 4.70, 6.05, mesh.neck, 10.0, [
        (4.70, CAPTURE), (5.40, Ring(spheres, spread, SPREAD_Z, col_angle))])
    unfold = SupportTrack("unfold", 4.70, 5.50, rim, 10.0, [
        (4.70, CAPTURE), (5.40, Ring(spheres, spread + UNFOLD_OUTWARD, SPREAD_Z + UNFOLD_RISE, col_angle))])
    unfold2 = SupportTrack("unfold2", 5.50, 6.05, rim, 10.0, [
        (5.50, CAPTURE), (5.90, Above(mesh.neck, rise=UNFOLD_RISE, outward=UNFOLD_OUTWARD, about=spheres))])
    # gather: the rim closes onto a small circle over the contents
    gather = SupportTrack("gather", 6.05, 7.40, rim, 10.0, [
        (6.05, CAPTURE), (7.10, Ring(spheres, star_radii(C, 0.025, GATHER_EDGE * rim_edge), GATHER_Z, col_angle))])
    five = (np.arange(5) * C / 5).round().astype(int) % C
    flap = SupportTrack("flap", 7.40, T_RELEASE, rim[five], 50.0, [
        (7.40, CAPTURE), (8.75, CAPTURE), (T_RELEASE, Ring(spheres, 0.035, FLAP_LOWERED_Z, col_angle[five]))])
    cols = np.arange(0, C, 2)
    neck, lower = mesh.neck_ring, mesh.neck_ring - 1
    band_gap = mesh.ring_radius[neck] - mesh.ring_radius[lower]
    z_neck = NECK_Z
    band_a = ring_index(neck, cols, C)
    band_b = ring_index(lower, cols, C)
    ang = np.concatenate([col_angle[cols], col_angle[cols]])
    z_band = np.concatenate([np.full(len(cols), z_neck), np.full(len(cols), z_neck - 0.6 * band_gap)])
    cinch = SupportTrack("cinch", 7.40, T_RELEASE, np.concatenate([band_a, band_b]), 50.0, [
        (7.40, CAPTURE), (8.40, _Bands(spheres, 0.015, z_band, ang))])
    m = len(cols)
    within = [(band[i], band[(i + 1) % m]) for band in (band_a, band_b) for i in range(m)]
    between = [(band_a[i], band_b[i]) for i in range(m)]
    chord = 2 * 0.012 * np.sin(np.pi / m)
    tie = TieTrack("tie", 8.40, 8.75, np.asarray(within + between, np.int32), TIE_K,
                   np.concatenate([np.full(len(within), chord), np.full(m, 0.6 * band_gap)]))
    sphere_index = spheres
    drops = 0.89 + np.arange(len(sphere_index)) * (1.60 - 0.89) / max(len(sphere_index) - 1, 1)
    return Choreography(n_particles=n_particles, dt=dt, tracks=[place, lift, neck_hand, unfold, unfold2, gather, flap, cinch],
                        tie=tie, sphere_index=sphere_index, sphere_mass=np.asarray(sphere_mass, float),
                        drop_times=drops, gravity=np.asarray(gravity, float))


# --------------------------------------------------------------------------- scene

RESOLUTIONS = {"full": (15, 32), "coarse": (7, 12)}


@dataclass(frozen=True)
class BagScene(ByName):
    """The bag experiment as built by :func:`bag_scene` (``scene["name"]`` also reads a
    field: a compatibility accessor, see :class:`scenes.scene.ByName`).

    Particles: film [0, N_f), spheres [N_f, N_f + 7), then bin and floor vertices (fixed,
    zero mass). Index arrays are particle indices unless named triangles.
    """

    model: object                # ipcjax.model.Model
    x: np.ndarray                # (N, 3) initial positions, m
    params: Params               # material parameters (the film defaults unless given)
    config: Config               # solver settings
    dt: float                    # timestep, s
    mesh: BagMesh                # the film's disk mesh
    faces: np.ndarray            # (F, 3) film triangles (= mesh.triangles)
    film: np.ndarray             # (N_f,) film particles
    rim: np.ndarray              # (C,) rim ring
    neck: np.ndarray             # (C,) neck ring
    spheres: np.ndarray          # (7,) sphere centres
    sphere_radius: np.ndarray    # (7,) m
    bin: np.ndarray              # bin wall vertices
    floor: np.ndarray            # floor vertices
    bin_triangles: np.ndarray    # (B, 3) bin wall triangles (particle indices)
    floor_triangles: np.ndarray  # (G, 3) floor triangles (particle indices)
    choreography: Choreography   # the schedule; records its captures as a run goes
    t_end: float                 # end of the protocol, s
    resolution: str              # "full" or "coarse"


def bag_scene(resolution: str = "full", *, rings: int | None = None, columns: int | None = None,
              params: Params | None = None, dhat: float = 1.0e-3, linear_solver: str = "sparse") -> BagScene:
    """The bag experiment. Particles: film [0, N_f), spheres [N_f, N_f + 7), then bin and
    floor vertices (fixed, zero mass).

    ``linear_solver``: the Newton linear solve (:class:`ipcjax.model.Config`); the bag
    defaults to ``"sparse"`` (host LDLᵀ, exact like the dense Cholesky and, on the CPU,
    0.66× its Newton iteration on the 481-vertex bag: docs/benchmarks.md).

    Returns a :class:`BagScene`.
    """
    if resolution not in RESOLUTIONS:
        raise ValueError(f"resolution must be one of {sorted(RESOLUTIONS)}; got {resolution!r}")
    R, C = RESOLUTIONS[resolution]
    mesh = bag_mesh(rings or R, columns or C)
    nf = len(mesh.x)
    film_x = mesh.x + np.array([0.0, 0.0, FILM_Z0])
    areal = FILM_THICKNESS * FILM_DENSITY
    film_m = lumped_mass(mesh.x, mesh.triangles, areal)
    radii = np.asarray(SPHERE_RADII)
    sph_m = SPHERE_DENSITY * 4.0 / 3.0 * np.pi * radii ** 3
    (bx, bt), (fx, ft) = bin_and_floor()
    n_s, n_b = len(radii), len(bx)
    x = np.concatenate([film_x, sphere_start(), bx, fx])
    n = len(x)
    mass = np.concatenate([film_m, sph_m, np.zeros(n_b + len(fx))])
    radius = np.zeros(n)
    radius[nf:nf + n_s] = radii
    fixed = np.zeros(n, bool)
    fixed[nf + n_s:] = True
    obstacles = np.concatenate([bt + nf + n_s, ft + nf + n_s + n_b]).astype(np.int32)
    model = build_model(x, mesh.triangles, mass, obstacle_triangles=obstacles,
                        fixed=fixed, radius=radius)
    # build_model takes its rest shape from x; the flat disk at z = FILM_Z0 is congruent to the mesh.
    params = Params.film_defaults() if params is None else check_params(params)
    config = Config(membrane="neo_hookean", bending="hinge", dhat=dhat, min_gap=0.030e-3, max_newton=150,
                    linear_solver=linear_solver)
    spheres = np.arange(nf, nf + n_s)
    choreo = make_choreography(mesh, n, spheres, sph_m, gravity=np.asarray(params.gravity), dt=DT)
    return BagScene(
        model=model, x=x, params=params, config=config, dt=DT, mesh=mesh, faces=mesh.triangles,
        film=np.arange(nf), rim=mesh.rim, neck=mesh.neck, spheres=spheres, sphere_radius=radii,
        bin=np.arange(nf + n_s, nf + n_s + n_b), floor=np.arange(nf + n_s + n_b, n),
        bin_triangles=bt + nf + n_s, floor_triangles=ft + nf + n_s + n_b,
        choreography=choreo, t_end=T_END, resolution=resolution,
    )


# --------------------------------------------------------------------------- checks and measurements

class UnfoldIncomplete(RuntimeError):
    """Raised by :func:`check_unfolded` when some columns do not rise from neck to rim."""

    def __init__(self, columns, message):
        super().__init__(message)
        self.columns = list(columns)


def unfolded_columns(x, mesh: BagMesh):
    """(C,) bool: along column c, z increases strictly from the neck ring to the rim."""
    x = np.asarray(x)
    rings = np.arange(mesh.neck_ring, mesh.rings + 1)
    z = np.stack([x[ring_index(r, np.arange(mesh.columns), mesh.columns), 2] for r in rings])  # (rings, C)
    return np.all(np.diff(z, axis=0) > 0, axis=0)


def check_unfolded(x, mesh: BagMesh):
    """Raise :class:`UnfoldIncomplete` naming the columns that do not unfold upward."""
    ok = unfolded_columns(x, mesh)
    if not ok.all():
        bad = np.flatnonzero(~ok)
        raise UnfoldIncomplete(bad.tolist(), f"{len(bad)} of {mesh.columns} columns do not unfold upward "
                               f"(z not increasing from neck ring {mesh.neck_ring} to rim): columns "
                               f"{bad.tolist()}")
    return True


def neck_width(x, neck):
    """(wx, wy) in m: max − min of x and of y over the neck-ring points (:mod:`scenes.measure`)."""
    w = measure.neck_width(np.asarray(x), neck)
    return float(w[0]), float(w[1])


def flap_height(x, rim, neck):
    """Median z of the rim minus mean z of the neck ring, m (:mod:`scenes.measure`)."""
    return float(measure.flap_height(np.asarray(x), rim, neck))


def _window(times, span):
    times = np.asarray(times)
    return times >= times[-1] - span - EPS_T


def sphere_height_range(spheres, times, span: float = 1.0):
    """Per sphere, max − min of the centre height over the final ``span`` s. spheres (T, S, 3)."""
    w = _window(times, span)
    z = np.asarray(spheres)[w, :, 2]
    return z.max(axis=0) - z.min(axis=0)


def sphere_motion(spheres, times, span: float = 1.10):
    """Per sphere over the final ``span`` s: max speed (m/s, finite differences of the
    saved centres), final speed, and max displacement ‖c(t) − c(t_window_start)‖ (m)."""
    w = _window(times, span)
    c = np.asarray(spheres, dtype=np.float64)[w]
    t = np.asarray(times, dtype=np.float64)[w]
    if len(t) < 2:
        z = np.zeros(c.shape[1])
        return dict(max_speed=z, final_speed=z, max_displacement=z)
    v = np.diff(c, axis=0) / np.diff(t)[:, None, None]
    speed = np.linalg.norm(v, axis=2)
    disp = np.linalg.norm(c - c[0], axis=2)
    return dict(max_speed=speed.max(axis=0), final_speed=speed[-1], max_displacement=disp.max(axis=0))


def min_film_sphere_gap(film, spheres, faces, sphere_radius, times=None, *, span: float | None = None):
    """Smallest film–sphere surface distance (m) over the frames (optionally only the final
    ``span`` s), by :func:`ipcjax.audit.audit_frame`."""
    from ipcjax.audit import audit_frame

    film, spheres = np.asarray(film), np.asarray(spheres)
    idx = np.arange(len(film)) if span is None else np.flatnonzero(_window(times, span))
    nf = film.shape[1]
    best = np.inf
    for i in idx:
        x = np.concatenate([film[i], spheres[i]])
        a = audit_frame(x, faces, np.arange(nf, nf + spheres.shape[1]), sphere_radius)
        best = min(best, a.min_film_sphere)
    return float(best)


def measurements(film, spheres, times, scene: BagScene) -> dict:
    """The docs/spec.md §5/§6 measurements of a saved trajectory (film (T, N_f, 3), spheres (T, 7, 3))."""
    film, spheres = np.asarray(film), np.asarray(spheres)
    wx, wy = neck_width(film[-1], scene.neck)
    mot = sphere_motion(spheres, times, 1.10)
    hr = sphere_height_range(spheres, times, 1.0)
    return dict(
        time_s=float(times[-1]),
        neck_width_mm=[1e3 * wx, 1e3 * wy],
        flap_height_mm=1e3 * flap_height(film[-1], scene.rim, scene.neck),
        sphere_height_range_final_1s_mm=(1e3 * hr).tolist(),
        max_sphere_height_range_final_1s_mm=float(1e3 * hr.max()),
        sphere_max_speed_final_1p1s_m_s=mot["max_speed"].tolist(),
        sphere_final_speed_m_s=mot["final_speed"].tolist(),
        sphere_max_displacement_final_1p1s_mm=(1e3 * mot["max_displacement"]).tolist(),
        min_film_sphere_gap_final_1p1s_mm=1e3 * min_film_sphere_gap(
            film, spheres, scene.faces, scene.sphere_radius, times, span=1.10),
    )

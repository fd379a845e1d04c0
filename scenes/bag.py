"""The bag experiment (docs/spec.md §1, §5): a 30 µm bag of disk topology, an open bin, a
floor, seven spheres, and the placing / carrying / gathering / cinching / tying
choreography as data.

Built only from the library's public API (``build_model``, ``Params``, ``Controls``,
``Config``, ``ipcjax.audit``). SI units; z up; the floor is the plane z = 0.

* :func:`bag_scene` builds it as a :class:`BagScene`. Particles: film [0, N_f) (the
  round pouch of :func:`scenes.mesh.pouch_mesh`, its bottom ``POUCH_Z0`` over the
  floor), spheres [N_f, N_f + 7) (:func:`sphere_start`), then bin and floor vertices
  (:func:`bin_and_floor`; fixed, zero mass).
* :data:`PROTOCOLS` time the closing half: ``"full"`` (released at 9.40 s, end 10.50 s)
  and ``"short"`` (released at 7.35 s, end 8.45 s), the same up to ``SHARED_UNTIL``.
* :func:`make_choreography` writes the hands, ties and drops as tracks of
  :mod:`scenes.choreography`; :func:`check_unfolded` is the unfold check at 6.05 s;
  :func:`measurements` gives the docs/spec.md §5/§6 measurements of a saved trajectory.

The meshes (:mod:`scenes.mesh`) and the choreography engine (:mod:`scenes.choreography`)
keep their old names here too (``scenes.bag.bag_mesh``, ``scenes.bag.Choreography``, …).
The geometry, the table of tracks and why each choice was made: docs/design.md, "The bag
scene".
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import ipcjax  # noqa: F401  (enables float64)
from ipcjax.model import Config, Params, build_model, check_params
from scenes import measure
from scenes.choreography import (  # the engine; its names stay importable from here
    CAPTURE, EPS_T, MIN_LENGTH, Above, Choreography, Ring, SupportTrack, TieTrack, smoothstep)
from scenes.film import FILM_DENSITY, FILM_THICKNESS, lumped_mass
from scenes.mesh import (  # the film meshes; their names stay importable from here
    DISK_RADIUS, NECK_TO_RIM, POUCH_RADIUS, POUCH_RIM_POLAR, BagMesh, bag_mesh, neck_ring_of, pouch_mesh,
    pouch_polar_angles, ring_index)
from scenes.mesh import quad_grid_triangles
from scenes.scene import ByName

DT = 1.0 / 240.0
BIN_HEIGHT = 0.106
BIN_HALF = 0.12
SPHERE_RADII = (0.026, 0.026, 0.026, 0.012, 0.012, 0.012, 0.025)
SPHERE_DENSITY = 250.0
SET_DOWN = np.array([0.40, 0.0])
TOL_MANIPULATION = 0.012e-3
TOL_RELEASED = 0.0005e-3
T_RELEASE = 9.40
T_END = 10.50
TIE_K = 250.0
POUCH_Z0 = 0.030            # m: the pouch's bottom over the floor (the bin's bottom) at t = 0
PLACE_LOWER = 0.025         # m: the place hands lower the rim this far by 0.72 s
SPHERE_Z0 = 0.24            # m: the lowest waiting sphere's centre (the rim is at 0.205 m)
SPHERE_STACK_GAP = 0.006    # m: surface gap between consecutive waiting spheres
SPHERE_STACK_OFFSET = 0.003 # m: their horizontal offset from the axis
LIFT_SET_Z = 0.16           # m: the lift hands' height when the bag is set on the floor
GATHER_OUTER = 0.025        # m: the gathered rim star's outer radius ...
GATHER_EDGE = 0.9           # ... its sides 0.9 of a rest rim edge
CINCH_OVER_TOP = 0.030      # m: the cinched neck band over the contents' top; the lower band CINCH_BAND band gaps below
CINCH_BAND = 0.9
CINCH_OUTER = 0.017         # m: the cinched stars' outer radius (the pleats' outer folds) ...
CINCH_EDGE = 0.95           # ... their sides 0.95 of a rest ring edge
CINCH_K = 50.0              # N/m per point, the cinch hands
FLAP_K = 20.0               # N/m per point, the flap hands ...
FLAP_RISE = 0.026           # m: ... hold the rim this far over the cinched neck band
STAR_MIN_INNER = 0.004      # m: innermost fold radius allowed in a star
FADE_FROM = 9.00            # s: cinch and flap hands fade out from here to T_RELEASE


@dataclass(frozen=True)
class Protocol:
    """The closing half of a bag protocol (docs/spec.md §5): when the gather, cinch, tie,
    fade and release happen. Both protocols share everything up to ``SHARED_UNTIL``
    (place, drops, lift, unfold and the unfold check at 6.05 s)."""

    name: str
    gather: tuple       # (t_on, star reached, t_off) s: the rim hands' gather
    cinch: tuple        # (t_on, stars reached) s: cinch and flap hands start and reach their targets
    tie: tuple          # (t_on, t_full) s: the ties act, and reach their target lengths
    fade_from: float    # s: cinch and flap hands fade out from here to t_release
    t_release: float    # s: all external support released
    t_end: float        # s: end of the protocol

    @property
    def checkpoints(self) -> dict:
        """States a bag run writes as it passes these times (scenes.bag_run.run_bag), to
        resume from: the start of the cinch and the start of the tie."""
        return {"cinch": self.cinch[0], "tie": self.tie[0]}

    @property
    def phases(self) -> tuple:
        """Named phases, for progress display and for the measurements' windows."""
        g0, g1, g2 = self.gather
        return (
            ("place", 0.00, 0.72), ("hold", 0.72, 0.89), ("drops", 0.89, 1.60), ("settle", 1.60, 2.00),
            ("lift", 2.00, 4.70), ("unfold", 4.70, SHARED_UNTIL), ("gather", g0, g1), ("hold", g1, g2),
            ("cinch", self.cinch[0], self.tie[0]), ("tie", self.tie[0], self.tie[1]),
            ("lower flap", self.tie[1], self.t_release), ("released", self.t_release, self.t_end),
        )


SHARED_UNTIL = 6.05  # s: both protocols are the same up to here (a state saved no later resumes in either)
PROTOCOLS = {
    # the specification's protocol: flap supported while cinching, released at 9.40 s, end 10.50 s
    "full": Protocol("full", gather=(6.05, 7.10, 7.40), cinch=(7.40, 8.40), tie=(8.40, 8.75),
                     fade_from=FADE_FROM, t_release=T_RELEASE, t_end=T_END),
    # the earlier short protocol (docs/spec.md §5, §9): released at 7.35 s, end 8.45 s; the
    # same gather, cinch, tie and fade as "full", each in about 40 % of the time
    "short": Protocol("short", gather=(6.05, 6.45, 6.55), cinch=(6.55, 6.95), tie=(6.95, 7.10),
                      fade_from=7.10, t_release=7.35, t_end=8.45),
}


def protocol_named(name: str) -> Protocol:
    """The :data:`PROTOCOLS` entry ``name``; ValueError naming the choices otherwise."""
    if name not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {sorted(PROTOCOLS)}; got {name!r}")
    return PROTOCOLS[name]


# The full protocol's checkpoints and phases (kept as names: tests and docs use them).
CHECKPOINTS = PROTOCOLS["full"].checkpoints
PHASES = PROTOCOLS["full"].phases


# --------------------------------------------------------------------------- obstacles

def _grid_quads(origin, u, v, nu, nv):
    """Vertices and triangles of a planar nu × nv cell grid spanned by vectors u, v."""
    i, j = np.meshgrid(np.arange(nu + 1), np.arange(nv + 1), indexing="ij")
    pts = origin + i.reshape(-1, 1) * (u / nu) + j.reshape(-1, 1) * (v / nv)
    return pts, quad_grid_triangles(nu, nv, lambda a, b: a * (nv + 1) + b, u_outer=True, dtype=np.int64)


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
    """(7, 3) sphere centres waiting over the pouch's mouth (docs/design.md, "The bag
    scene"): one above the other, each ``SPHERE_STACK_GAP`` over the one below, alternately
    ``SPHERE_STACK_OFFSET`` to either side of the axis, the lowest at ``SPHERE_Z0``."""
    r = np.asarray(SPHERE_RADII)
    z = SPHERE_Z0 + np.concatenate([[0.0], np.cumsum(r[:-1] + r[1:] + SPHERE_STACK_GAP)])
    a = np.radians(120.0) * np.arange(len(r))
    return np.stack([SPHERE_STACK_OFFSET * np.cos(a), SPHERE_STACK_OFFSET * np.sin(a), z], axis=1)


def star_outer(columns: int, outer: float, edge: float) -> np.ndarray:
    """Radii of a star of ``columns`` points at angles 2π c / C: even points on the circle
    of radius ``outer``, odd points in where consecutive points are ``edge`` apart (the
    inner radius is clamped at ``STAR_MIN_INNER`` when ``edge`` is longer than that allows;
    the extra length then goes into height)."""
    c = np.cos(2 * np.pi / columns)
    disc = edge ** 2 - outer ** 2 * (1.0 - c ** 2)
    inner = outer * c - np.sqrt(max(disc, 0.0))
    r = np.full(columns, float(outer))
    r[1::2] = max(inner, STAR_MIN_INNER)
    return r


def make_choreography(mesh: BagMesh, n_particles: int, sphere_index, sphere_mass, *, gravity=(0, 0, -9.81),
                      dt: float = DT, sphere_radius=SPHERE_RADII, protocol: str = "full") -> Choreography:
    """The docs/spec.md §5 schedule for ``mesh`` (the table in docs/design.md, "The bag scene");
    ``protocol`` names the :data:`PROTOCOLS` entry that times the gather, cinch, tie and release."""
    pr = protocol_named(protocol)
    C = mesh.columns
    rim, neck = mesh.rim, mesh.neck
    spheres = np.asarray(sphere_index)
    radii = np.asarray(sphere_radius, np.float64)
    col_angle = 2 * np.pi * np.arange(C) / C
    cx, _ = SET_DOWN
    # place: the rim lowers the pouch into the bin and holds it open there
    place = SupportTrack("place", 0.0, 2.00, rim, 20.0, [
        (0.0, CAPTURE), (0.72, Above(rim, rise=-PLACE_LOWER))])
    # lift: two opposing rim points carry the bag out of the bin and set it on the floor
    pair = np.array([rim[0], rim[C // 2]])
    at = lambda x, z: np.array([[x + 0.03, 0.0, z], [x - 0.03, 0.0, z]])
    lift = SupportTrack("lift", 2.00, 4.70, pair, 300.0, [
        (2.00, CAPTURE), (2.90, at(0.0, 0.40)), (3.70, at(cx, 0.40)), (4.50, at(cx, LIFT_SET_Z))])
    # unfold: the neck ring and the rim back onto their rest circles round the contents,
    # at the neck ring's height and the rim's rest height over it
    r_neck, r_rim = mesh.ring_radius[mesh.neck_ring], mesh.ring_radius[mesh.rings]
    rim_rise = mesh.x[rim[0], 2] - mesh.x[neck[0], 2]
    neck_hand = SupportTrack("neck", 4.70, 6.05, neck, 10.0, [
        (4.70, CAPTURE), (5.40, Ring(spheres, r_neck, 0.0, col_angle, level=neck))])
    unfold = SupportTrack("unfold", 4.70, 6.05, rim, 10.0, [
        (4.70, CAPTURE), (5.40, Ring(spheres, r_rim, rim_rise, col_angle, level=neck))])
    # gather: the rim closes into a star over the contents (pleats whose sides keep 0.9 of
    # a rim edge) at the height where it is at 6.05 s
    rim_edge = 2 * r_rim * np.sin(np.pi / C)
    rim_star = star_outer(C, GATHER_OUTER, GATHER_EDGE * rim_edge)
    g0, g1, g2 = pr.gather
    gather = SupportTrack("gather", g0, g2, rim, 10.0, [
        (g0, CAPTURE), (g1, Ring(spheres, rim_star, 0.0, col_angle, level=rim))])
    # cinch: every point of the two neck bands into a star round the contents' axis
    lower = mesh.neck_ring - 1
    band_a, band_b = neck, ring_index(lower, np.arange(C), C)
    band_gap = float(np.linalg.norm(mesh.x[band_a[0]] - mesh.x[band_b[0]]))
    edge_a = 2 * r_neck * np.sin(np.pi / C)
    edge_b = 2 * mesh.ring_radius[lower] * np.sin(np.pi / C)
    star_a = star_outer(C, CINCH_OUTER, CINCH_EDGE * edge_a)
    star_b = star_outer(C, CINCH_OUTER, CINCH_EDGE * edge_b)
    z_b = CINCH_OVER_TOP - CINCH_BAND * band_gap
    c0, c1 = pr.cinch
    cinch = SupportTrack("cinch", c0, pr.t_release, np.concatenate([band_a, band_b]), CINCH_K, [
        (c0, CAPTURE), (c1, Ring(spheres, np.concatenate([star_a, star_b]),
                                     np.concatenate([np.full(C, CINCH_OVER_TOP), np.full(C, z_b)]),
                                     np.concatenate([col_angle, col_angle]), over_top=radii))],
        fade_from=pr.fade_from)
    # flap: the rim follows the neck down, FLAP_RISE over the cinched neck band, and is let
    # go with the cinch
    flap = SupportTrack("flap", c0, pr.t_release, rim, FLAP_K, [
        (c0, CAPTURE), (c1, Ring(spheres, rim_star, CINCH_OVER_TOP + FLAP_RISE, col_angle, over_top=radii))],
        fade_from=pr.fade_from)
    # tie: each band's points to the points two columns on (a loop through the pleats'
    # outer folds and one through their inner folds), and the bands to each other
    nxt = (np.arange(C) + 2) % C
    within = [(band[i], band[nxt[i]]) for band in (band_a, band_b) for i in range(C)]
    between = [(band_a[i], band_b[i]) for i in range(C)]
    chord = lambda r: 2 * r * np.sin(2 * np.pi / C)
    target = np.concatenate([chord(star_a), chord(star_b), np.full(C, CINCH_BAND * band_gap)])
    tie = TieTrack("tie", *pr.tie, np.asarray(within + between, np.int32), TIE_K, target)
    drops = 0.89 + np.arange(len(spheres)) * (1.60 - 0.89) / max(len(spheres) - 1, 1)
    return Choreography(n_particles=n_particles, dt=dt,
                        tracks=[place, lift, neck_hand, unfold, gather, flap, cinch],
                        tie=tie, sphere_index=spheres, sphere_mass=np.asarray(sphere_mass, float),
                        drop_times=drops, gravity=np.asarray(gravity, float), t_release=pr.t_release,
                        tol_manipulation=TOL_MANIPULATION, tol_released=TOL_RELEASED,
                        phases=pr.phases, protocol=pr.name)


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
    mesh: BagMesh                # the film's mesh (the pouch of pouch_mesh)
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
              params: Params | None = None, dhat: float = 1.0e-3, linear_solver: str = "sparse",
              protocol: str = "full") -> BagScene:
    """The bag experiment. Particles: film [0, N_f), spheres [N_f, N_f + 7), then bin and
    floor vertices (fixed, zero mass).

    ``protocol``: ``"full"`` (released at 9.40 s, end 10.50 s) or ``"short"`` (released at
    7.35 s, end 8.45 s), the :data:`PROTOCOLS` entries.

    ``linear_solver``: the Newton linear solve (:class:`ipcjax.model.Config`); the bag
    defaults to ``"sparse"`` (sparse Cholesky, exact like the dense Cholesky and, on the CPU,
    faster: 0.66× the dense Newton iteration on the 481-vertex bag already with the host's
    QDLDL, before #30 made it CHOLMOD's inside XLA; docs/benchmarks.md).

    Returns a :class:`BagScene`.
    """
    if resolution not in RESOLUTIONS:
        raise ValueError(f"resolution must be one of {sorted(RESOLUTIONS)}; got {resolution!r}")
    protocol_named(protocol)  # refused before anything is built
    R, C = RESOLUTIONS[resolution]
    mesh = pouch_mesh(rings or R, columns or C)
    nf = len(mesh.x)
    film_x = mesh.x + np.array([0.0, 0.0, POUCH_Z0])
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
    # build_model takes its rest shape from x; the pouch lifted by POUCH_Z0 is congruent to the mesh.
    params = Params.film_defaults() if params is None else check_params(params)
    # no line_search_expansions: over the whole protocol they save 8 % of the Newton
    # iterations and no time, and move the neck by 2× the model's scatter (docs/benchmarks.md);
    # the projected tangent (Config's default), not newton_tangent="exact_first": the exact
    # membrane tangent first cut the cinch window's iterations 3,596 -> 2,343, but whole
    # bags ended elsewhere (neck 4.4 mm narrower in x, 5.6 mm wider in y on average over 7
    # runs a tangent) and one of its 7 failed the unfold check (docs/design.md, "The exact tangent first")
    config = Config(membrane="neo_hookean", bending="hinge", dhat=dhat, min_gap=0.030e-3, max_newton=150,
                    linear_solver=linear_solver)
    spheres = np.arange(nf, nf + n_s)
    choreo = make_choreography(mesh, n, spheres, sph_m, gravity=np.asarray(params.gravity), dt=DT,
                               sphere_radius=radii, protocol=protocol)
    return BagScene(
        model=model, x=x, params=params, config=config, dt=DT, mesh=mesh, faces=mesh.triangles,
        film=np.arange(nf), rim=mesh.rim, neck=mesh.neck, spheres=spheres, sphere_radius=radii,
        bin=np.arange(nf + n_s, nf + n_s + n_b), floor=np.arange(nf + n_s + n_b, n),
        bin_triangles=bt + nf + n_s, floor_triangles=ft + nf + n_s + n_b,
        choreography=choreo, t_end=PROTOCOLS[protocol].t_end, resolution=resolution,
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
    ``span`` s), by :func:`ipcjax.audit.min_film_sphere` (the audit's, without its
    intersection test)."""
    from ipcjax.audit import min_film_sphere

    film, spheres = np.asarray(film), np.asarray(spheres)
    idx = np.arange(len(film)) if span is None else np.flatnonzero(_window(times, span))
    nf = film.shape[1]
    best = np.inf
    for i in idx:
        x = np.concatenate([film[i], spheres[i]])
        best = min(best, min_film_sphere(x, faces, np.arange(nf, nf + spheres.shape[1]), sphere_radius))
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

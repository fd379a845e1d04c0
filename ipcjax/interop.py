"""Build an ipcjax :class:`~ipcjax.model.Model` from a Newton cloth (``newton.ModelBuilder`` or a
finalized ``newton.Model``).

The core, :func:`model_from_arrays`, takes plain NumPy arrays in Newton's layout, so it is
usable and testable without ``newton``; :func:`model_from_newton` only reads those arrays
off a builder or model. Newton's rigid bodies, shapes and springs are not translated.

What is read, and what it becomes:

* ``particle_q`` → positions (and, unless ``rest_positions`` is given, the rest shape: ipcjax
  recomputes its rest data from it with :func:`ipcjax.model.build_model`);
* ``tri_indices`` → film triangles;
* ``particle_mass``, ``particle_flags`` → masses and fixed flags: a particle is fixed when it
  is not ``ParticleFlags.ACTIVE`` (bit 1) or has zero mass (Newton's kinematic particles);
* ``tri_poses`` → checked: ipcjax's ``Model.dm_inv`` uses Newton's convention (rest triangle
  flattened with e1 = (x1 − x0)/|x1 − x0|, e2 = n × e1 normalised; docs/energies.md), so the
  two must agree to storage precision, else the rest shape is not the positions given;
* ``edge_indices`` rows (o0, o1, v0, v1) → matched to ipcjax hinges (a, b, c, d)
  (:func:`ipcjax.topology.hinge_topology`): each interior Newton edge is either the same row
  or the same hinge seen from its other face, (o1, o0, v1, v0), which has the same signed
  dihedral angle; ``edge_rest_angle`` is checked against ``Model.theta0``;
* ``tri_materials`` (tri_ke = μ, tri_ka = λ, N/m) and ``edge_bending_properties`` (edge_ke, N)
  → per-triangle Lamé pairs and per-hinge kθ = edge_ke · ℓ (Newton's bending energy is
  ½ edge_ke ℓ (θ − θ₀)², ipcjax's ½ kθ (θ − θ₀)²); :func:`params_from_newton` turns uniform
  ones into ipcjax :class:`~ipcjax.model.Params` for a given thickness.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ipcjax.energies.bending import hinge_stiffness
from ipcjax.model import Model, Params, build_model
from ipcjax.topology import as_triangles

ACTIVE = 1  # newton.ParticleFlags.ACTIVE


class Interop(NamedTuple):
    """An ipcjax model built from a Newton cloth, and how its parts map back."""

    model: Model
    hinge_edge: np.ndarray      # (H,) Newton edge row of each ipcjax hinge
    hinge_flipped: np.ndarray   # (H,) bool: that row is (o1, o0, v1, v0) of the hinge (a, b, c, d)
    boundary_edges: np.ndarray  # (Eb,) Newton edge rows with an opposite vertex −1 (no hinge)
    lame: np.ndarray | None     # (T, 2) Newton (tri_ke, tri_ka) = (μ, λ) per triangle, N/m
    k_theta: np.ndarray | None  # (H,) Newton's bending coefficient edge_ke · ℓ per hinge, N·m
    rest_mismatch: float        # max over triangles of |dm_inv − tri_poses| / |tri_poses| (0 if unchecked)


def newton_fixed(masses, flags=None) -> np.ndarray:
    """(N,) bool: Newton particles that do not move (not ACTIVE, or zero mass)."""
    masses = np.asarray(masses, np.float64)
    fixed = masses <= 0.0
    if flags is not None:
        fixed |= (np.asarray(flags, np.int64) & ACTIVE) == 0
    return fixed


def match_hinges(triangles, hinges, edge_indices):
    """Match Newton ``edge_indices`` rows (o0, o1, v0, v1) to ipcjax hinges (a, b, c, d).

    Args:
        triangles: (T, 3) the mesh (to tell boundary edges). hinges: (H, 4) ipcjax hinges.
        edge_indices: (E, 4) Newton rows; a −1 opposite vertex marks a boundary edge.
    Returns:
        hinge_edge (H,) int, hinge_flipped (H,) bool, boundary_edges (Eb,) int.
    Raises:
        ValueError: a hinge with no Newton edge, a Newton interior edge with no hinge, or a row
            whose four vertices are not the hinge's in either orientation.
    """
    e = np.asarray(edge_indices, np.int64).reshape(-1, 4)
    h = np.asarray(hinges, np.int64).reshape(-1, 4)
    interior = (e[:, 0] >= 0) & (e[:, 1] >= 0)
    key_of_hinge = {(min(c, d), max(c, d)): i for i, (_, _, c, d) in enumerate(h.tolist())}
    hinge_edge = np.full(len(h), -1, np.int64)
    flipped = np.zeros(len(h), bool)
    for row in np.flatnonzero(interior):
        o0, o1, v0, v1 = e[row].tolist()
        i = key_of_hinge.get((min(v0, v1), max(v0, v1)))
        if i is None:
            raise ValueError(f"Newton edge {row} {e[row].tolist()} is interior but ipcjax has no hinge on "
                             f"edge ({v0}, {v1}) (non-manifold or not in the triangles?)")
        if hinge_edge[i] >= 0:
            raise ValueError(f"Newton edges {hinge_edge[i]} and {row} both lie on hinge {i} {h[i].tolist()}")
        a, b, c, d = h[i].tolist()
        if (o0, o1, v0, v1) == (a, b, c, d):
            pass
        elif (o0, o1, v0, v1) == (b, a, d, c):
            flipped[i] = True
        else:
            raise ValueError(f"Newton edge {row} {e[row].tolist()} does not order hinge {i} {h[i].tolist()} "
                             f"as (a, b, c, d) or (b, a, d, c)")
        hinge_edge[i] = row
    missing = np.flatnonzero(hinge_edge < 0)
    if missing.size:
        i = int(missing[0])
        raise ValueError(f"ipcjax hinge {i} {h[i].tolist()} has no interior Newton edge ({missing.size} missing)")
    return hinge_edge, flipped, np.flatnonzero(~interior)


def model_from_arrays(positions, triangles, masses, flags=None, *, tri_poses=None, edge_indices=None,
                      edge_rest_angle=None, edge_rest_length=None, tri_materials=None, edge_ke=None,
                      rest_positions=None, rtol: float = 1e-4, angle_atol: float = 1e-4) -> Interop:
    """ipcjax model of a cloth given in Newton's array layout (see the module docstring).

    Args:
        positions: (N, 3) particle positions, m (Newton ``particle_q``).
        triangles: (T, 3) ``tri_indices``. masses: (N,) kg ``particle_mass``.
        flags: (N,) int ``particle_flags`` (None: all active).
        tri_poses: (T, 2, 2) Newton rest inverses, 1/m; checked against ipcjax's ``dm_inv``.
        edge_indices: (E, 4) rows (o0, o1, v0, v1); matched to the hinges (needed for k_theta).
        edge_rest_angle: (E,) rad; checked against ``theta0``. edge_rest_length: (E,) m (ℓ in
            k_theta; default: ipcjax's rest edge lengths).
        tri_materials: (T, ≥2) rows (tri_ke, tri_ka, ...) in N/m. edge_ke: (E,) N.
        rest_positions: (N, 3) rest shape, m, if ``positions`` is not it.
        rtol: tolerance of the tri_poses check, relative to each triangle's |tri_poses|
            (Newton stores float32). angle_atol: tolerance of the rest-angle check, rad.
    Returns:
        :class:`Interop`. Positions are not part of the model: start a state from ``positions``.
    Raises:
        ValueError: shape errors (from build_model), a rest shape that does not match
            ``tri_poses`` or ``edge_rest_angle`` (naming the first triangle/edge), or edges that
            do not match the hinges.
    """
    x = np.asarray(positions, np.float64).reshape(-1, 3)
    x_ref = x if rest_positions is None else np.asarray(rest_positions, np.float64).reshape(-1, 3)
    tris = as_triangles(np.asarray(triangles).reshape(-1, 3), len(x))
    masses = np.asarray(masses, np.float64).reshape(-1)
    model = build_model(x_ref, tris, masses, fixed=newton_fixed(masses, flags))

    mismatch = 0.0
    if tri_poses is not None:
        tp = np.asarray(tri_poses, np.float64).reshape(-1, 2, 2)
        if len(tp) != len(tris):
            raise ValueError(f"tri_poses has {len(tp)} entries for {len(tris)} triangles")
        dm = np.asarray(model.dm_inv)
        rel = np.linalg.norm(dm - tp, axis=(1, 2)) / np.linalg.norm(tp, axis=(1, 2))
        mismatch = float(rel.max(initial=0.0))
        if mismatch > rtol:
            i = int(np.argmax(rel))
            raise ValueError(
                f"triangle {i} {tris[i].tolist()}: ipcjax rest inverse {dm[i].tolist()} differs from Newton's "
                f"tri_poses {tp[i].tolist()} (relative {rel[i]:.2e} > {rtol:g}); the positions are not the "
                f"rest shape Newton was built from (pass rest_positions=...)")

    hinge_edge = np.zeros(0, np.int64)
    flipped = np.zeros(0, bool)
    boundary = np.zeros(0, np.int64)
    k_theta = None
    if edge_indices is not None:
        hinge_edge, flipped, boundary = match_hinges(tris, model.hinges, edge_indices)
        if edge_rest_angle is not None:
            ang = np.asarray(edge_rest_angle, np.float64).reshape(-1)[hinge_edge]
            diff = np.abs(ang - np.asarray(model.theta0))
            if diff.size and diff.max() > angle_atol:
                i = int(np.argmax(diff))
                raise ValueError(f"hinge {i} {np.asarray(model.hinges[i]).tolist()}: Newton rest angle "
                                 f"{ang[i]:.6f} rad (edge {hinge_edge[i]}) ≠ ipcjax theta0 "
                                 f"{float(model.theta0[i]):.6f} rad")
        if edge_ke is not None:
            ell = (np.asarray(model.hinge_length) if edge_rest_length is None
                   else np.asarray(edge_rest_length, np.float64).reshape(-1)[hinge_edge])
            k_theta = np.asarray(edge_ke, np.float64).reshape(-1)[hinge_edge] * ell
    lame = None if tri_materials is None else np.asarray(tri_materials, np.float64).reshape(len(tris), -1)[:, :2]
    return Interop(model, hinge_edge, flipped, boundary, lame, k_theta, mismatch)


def params_from_newton(interop: Interop, thickness: float, rtol: float = 1e-6, **overrides) -> Params:
    """ipcjax :class:`Params` equivalent to a Newton cloth's uniform membrane and bending stiffness.

    Inverts the plane-stress mapping μ = E h/(2(1 + ν)), λ = E h ν/(1 − ν²):
    ν = λ/(λ + 2μ), E = 4μ(μ + λ)/((2μ + λ) h); and bending_scale = kθ_Newton / (6 D ℓ²/A)
    with D from that (E, ν, h). Other fields are ``Params.film_defaults`` unless overridden.

    Args:
        interop: from :func:`model_from_newton` with tri_materials and edge_ke.
        thickness: film thickness h, m (Newton's coefficients are per unit area and do not hold it).
    Raises:
        ValueError: missing or non-uniform (μ, λ), or a bending scale that differs between
            hinges (ipcjax has one scalar ``bending_scale``).
    """
    if interop.lame is None or interop.k_theta is None:
        raise ValueError("need tri_materials and edge_ke (build with model_from_newton on a Newton cloth)")
    mu, lam = interop.lame[:, 0], interop.lame[:, 1]
    if not (np.allclose(mu, mu[0], rtol=rtol, atol=0) and np.allclose(lam, lam[0], rtol=rtol, atol=0)):
        raise ValueError("tri_ke / tri_ka differ between triangles; ipcjax Params hold one material")
    mu, lam = float(mu[0]), float(lam[0])
    nu = lam / (lam + 2.0 * mu)
    E = 4.0 * mu * (mu + lam) / ((2.0 * mu + lam) * thickness)
    m = interop.model
    k_phys = np.asarray(hinge_stiffness(E, nu, thickness, np.asarray(m.hinge_length), np.asarray(m.hinge_area)))
    scale = interop.k_theta / k_phys
    if scale.size and not np.allclose(scale, scale[0], rtol=1e-4, atol=0):
        raise ValueError(f"edge_ke gives bending scales {scale.min():.4g}…{scale.max():.4g} of the physical "
                         f"6Dℓ²/A; ipcjax has one scalar bending_scale (set edge_ke = 6Dℓ/A per edge)")
    base = dict(youngs_modulus=E, poisson=nu, thickness=thickness,
                bending_scale=float(scale[0]) if scale.size else 1.0)
    base.update(overrides)
    return Params.film_defaults(**base)


def _field(obj, name):
    """A builder list or a finalized model's warp array as NumPy (None if absent or empty)."""
    v = getattr(obj, name, None)
    if v is None:
        return None
    if hasattr(v, "numpy"):
        return v.numpy()
    if len(v) == 0:
        return None
    if name == "particle_flags":
        return np.asarray([int(f) for f in v], np.int64)
    return np.asarray([list(r) if hasattr(r, "__len__") else r for r in v], np.float64)


def newton_arrays(builder_or_model) -> dict:
    """The cloth arrays of a ``newton.ModelBuilder`` or finalized ``newton.Model``, as NumPy."""
    o = builder_or_model
    f = {k: _field(o, k) for k in ("particle_q", "tri_indices", "tri_poses", "particle_mass", "particle_flags",
                                   "edge_indices", "edge_rest_angle", "edge_rest_length", "tri_materials",
                                   "edge_bending_properties")}
    if f["particle_q"] is None or f["tri_indices"] is None:
        raise ValueError("the Newton builder/model has no particles or no triangles (add a cloth first)")
    ebp = f["edge_bending_properties"]
    return dict(
        positions=f["particle_q"], triangles=f["tri_indices"].astype(np.int64), masses=f["particle_mass"],
        flags=f["particle_flags"], tri_poses=f["tri_poses"],
        edge_indices=None if f["edge_indices"] is None else f["edge_indices"].astype(np.int64),
        edge_rest_angle=f["edge_rest_angle"], edge_rest_length=f["edge_rest_length"],
        tri_materials=f["tri_materials"], edge_ke=None if ebp is None else np.asarray(ebp).reshape(-1, 2)[:, 0],
    )


def model_from_newton(builder_or_model, *, rest_positions=None, rtol: float = 1e-4,
                      angle_atol: float = 1e-4) -> Interop:
    """ipcjax model of the cloth in a ``newton.ModelBuilder`` (or finalized ``newton.Model``).

    Reads particle_q, tri_indices, tri_poses, particle_mass, particle_flags, edge_indices,
    edge_rest_angle, edge_rest_length, tri_materials and edge_bending_properties and calls
    :func:`model_from_arrays` (which checks the rest shape against tri_poses and the hinges
    against edge_indices). Needs no ``newton`` import itself.
    """
    return model_from_arrays(**newton_arrays(builder_or_model), rest_positions=rest_positions, rtol=rtol,
                             angle_atol=angle_atol)

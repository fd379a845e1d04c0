"""The small reference solves of docs/spec.md §6, printed as JSON:

    python3 -m scenes.reference

12 steps each of the vertex–triangle and edge–edge scenes (minimum mid-surface distance
over all steps, measured independently of the solver with ipcjax.audit's distance
routines), the hinge scene's angle before and after 12 steps, and the first step bound of
a fast crossing attempt (20 m/s).
"""
from __future__ import annotations

import json

import numpy as np

from ipcjax.audit import _point_triangle_dist
from ipcjax.energies.bending import dihedral_angle
from ipcjax.model import Config, Controls, Params
from ipcjax.step import make_state, simulate
from scenes.film import edge_edge_scene, hinge_scene, vertex_triangle_scene

DT = 1.0 / 240.0
TOL = 5e-7


def _segment_distance(p0, p1, q0, q1, samples=2001):
    """Edge–edge distance by dense sampling of one segment against the exact point–segment
    distance to the other (independent of ipcjax.distance)."""
    s = np.linspace(0.0, 1.0, samples)[:, None]
    p = p0 + s * (p1 - p0)
    d = q1 - q0
    t = np.clip((p - q0) @ d / (d @ d), 0.0, 1.0)[:, None]
    return float(np.min(np.linalg.norm(p - (q0 + t * d), axis=1)))


def _run(sc, steps, params=None):
    m = sc.model
    frames, _, reports = simulate(m, params or Params.film_defaults(), make_state(sc.x, sc.v),
                                  Controls.empty(m.n_particles, tolerance=TOL), steps, dt=DT, config=Config())
    return frames.astype(np.float64), reports


def main():
    out = {}
    frames, reps = _run(vertex_triangle_scene(), 12)
    d = [min(_point_triangle_dist(f[[p]], f[[3]], f[[4]], f[[5]])[0] for p in range(3)) for f in frames[1:]]
    out["vertex_triangle"] = dict(min_distance_um=1e6 * min(d), first_step_bound=reps[0].min_step_bound,
                                  newton_iterations=sum(r.iterations for r in reps))
    frames, reps = _run(edge_edge_scene(), 12)
    film_e = [(0, 1), (1, 2), (0, 2)]
    ridge_e = [(3, 4), (3, 5), (4, 5), (3, 6), (4, 6)]
    d = [min(_segment_distance(f[a], f[b], f[c], f[e]) for a, b in film_e for c, e in ridge_e) for f in frames[1:]]
    out["edge_edge"] = dict(min_distance_um=1e6 * min(d), first_step_bound=reps[0].min_step_bound,
                            newton_iterations=sum(r.iterations for r in reps))
    sc = hinge_scene()
    h = np.asarray(sc.model.hinges)[0]
    frames, _ = _run(sc, 12, Params.film_defaults(gravity=(0.0, 0.0, 0.0)))
    ang = [float(np.degrees(dihedral_angle(*f[h]))) for f in frames]
    out["hinge"] = dict(angle_start_deg=ang[0], angle_end_deg=ang[-1])
    frames, reps = _run(vertex_triangle_scene(speed=20.0), 1)
    out["fast_crossing"] = dict(first_step_bound=reps[0].min_step_bound, substeps=reps[0].substeps)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

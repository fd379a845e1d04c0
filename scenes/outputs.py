"""What a bag run (``scenes/bag_run.py``) and a drape run (``scenes/drape_run.py``) leave in
their folders besides trajectory.npz and summary.json: a mesh sequence for ParaView or
Blender (meshio), a time-series plot of the measurements (the bag), and rendered
snapshots of the key phases, or of the first and last frames (matplotlib, headless).

Every function takes a :class:`ipcjax.runfolder.Trajectory` (film (T, N_f, 3), spheres
(T, S, 3), faces, time (T,)) or one frame's arrays, so it works on any trajectory with that
layout: ours, Newton VBD's, an imported sequence.
"""
from __future__ import annotations

import os
from xml.sax.saxutils import quoteattr

import numpy as np

TIME_SLACK = 1e-9  # s: a phase that ends within this of the last frame counts as reached
FLAT = 1e-9        # m: height span below which the film is coloured as flat


# --------------------------------------------------------------------------- meshes

def icosphere(subdivisions: int = 1):
    """Unit icosphere: (vertices (V, 3), triangles (F, 3)); 1 subdivision = 42 vertices."""
    t = (1.0 + 5 ** 0.5) / 2
    v = [(-1, t, 0), (1, t, 0), (-1, -t, 0), (1, -t, 0), (0, -1, t), (0, 1, t), (0, -1, -t), (0, 1, -t),
         (t, 0, -1), (t, 0, 1), (-t, 0, -1), (-t, 0, 1)]
    f = [(0, 11, 5), (0, 5, 1), (0, 1, 7), (0, 7, 10), (0, 10, 11), (1, 5, 9), (5, 11, 4), (11, 10, 2),
         (10, 7, 6), (7, 1, 8), (3, 9, 4), (3, 4, 2), (3, 2, 6), (3, 6, 8), (3, 8, 9), (4, 9, 5),
         (2, 4, 11), (6, 2, 10), (8, 6, 7), (9, 8, 1)]
    v = [np.asarray(p, float) / np.linalg.norm(p) for p in v]
    for _ in range(subdivisions):
        mid, nf = {}, []

        def m(a, b):
            key = (min(a, b), max(a, b))
            if key not in mid:
                p = v[a] + v[b]
                v.append(p / np.linalg.norm(p))
                mid[key] = len(v) - 1
            return mid[key]

        for a, b, c in f:
            ab, bc, ca = m(a, b), m(b, c), m(c, a)
            nf += [(a, ab, ca), (b, bc, ab), (c, ca, bc), (ab, bc, ca)]
        f = nf
    return np.asarray(v), np.asarray(f, np.int64)


def _frame_mesh(film, spheres, faces, radii, unit):
    """One frame's film and spheres as one triangle mesh, plus a per-vertex body id."""
    uv, uf = unit
    pts, tris, body = [np.asarray(film, float)], [np.asarray(faces, np.int64)], [np.zeros(len(film), np.int32)]
    off = len(film)
    for j, (c, r) in enumerate(zip(np.asarray(spheres, float), np.asarray(radii, float))):
        pts.append(c + r * uv)
        tris.append(uf + off)
        body.append(np.full(len(uv), j + 1, np.int32))
        off += len(uv)
    return np.concatenate(pts), np.concatenate(tris), np.concatenate(body)


def export_meshes(folder, trajectory, sphere_radius, *, every: int = 1, formats=("vtu", "obj"),
                  prefix: str = "frame"):
    """Write the trajectory as a mesh sequence with meshio.

    For every ``every``-th frame: ``{prefix}_{i:05d}.vtu`` (film and spheres as one mesh,
    point data ``body``: 0 film, j + 1 sphere j) and/or ``.obj``; for .vtu also a ParaView
    collection ``{prefix}.pvd`` carrying the simulated times. Returns the written paths.
    """
    import meshio

    film, spheres, times = (np.asarray(a) for a in (trajectory.film, trajectory.spheres, trajectory.time))
    faces = trajectory.faces
    if film.ndim != 3 or spheres.ndim != 3 or len(film) != len(spheres) or len(film) != len(times):
        raise ValueError(f"need film (T, N, 3), spheres (T, S, 3) and times (T,) of one length T; got "
                         f"{film.shape}, {spheres.shape}, {times.shape}")
    bad = [f for f in formats if f not in ("vtu", "obj")]
    if bad:
        raise ValueError(f"unknown mesh formats {bad}; use 'vtu' and/or 'obj'")
    os.makedirs(folder, exist_ok=True)
    unit = icosphere(1)
    written, collection = [], []
    for i in range(0, len(film), max(int(every), 1)):
        pts, tris, body = _frame_mesh(film[i], spheres[i], faces, sphere_radius, unit)
        for fmt in formats:
            path = os.path.join(folder, f"{prefix}_{i:05d}.{fmt}")
            mesh = meshio.Mesh(pts, [("triangle", tris)],
                               point_data={"body": body} if fmt == "vtu" else {})
            meshio.write(path, mesh, file_format="vtu" if fmt == "vtu" else "obj")
            written.append(path)
            if fmt == "vtu":
                collection.append((float(times[i]), os.path.basename(path)))
    if collection:
        path = os.path.join(folder, f"{prefix}.pvd")
        with open(path, "w") as f:
            f.write('<?xml version="1.0"?>\n<VTKFile type="Collection" version="0.1">\n<Collection>\n')
            for t, name in collection:
                f.write(f'  <DataSet timestep="{t:.6f}" part="0" file={quoteattr(name)}/>\n')
            f.write("</Collection>\n</VTKFile>\n")
        written.append(path)
    return written


# --------------------------------------------------------------------------- plots

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _shade_phases(ax, phases, t_max):
    for k, (name, a, b) in enumerate(phases):
        if a >= t_max:
            break
        if k % 2:
            ax.axvspan(a, min(b, t_max), color="0.93", lw=0)


def plot_timeseries(path, trajectory, rim, neck, *, audit=None, phases=(), title="bag"):
    """Neck width (x, y), flap height (``rim``, ``neck``: film vertex indices) and the minimum
    film–film / film–sphere distances (from an :func:`ipcjax.audit.audit_trajectory` dict)
    against time, saved as a PNG."""
    plt = _plt()
    from scenes.measure import flap_height, neck_width

    times, film = np.asarray(trajectory.time), np.asarray(trajectory.film)
    wx, wy = neck_width(film, neck).T
    flap = flap_height(film, rim, neck)
    rows = 3 if audit is not None else 2
    fig, axes = plt.subplots(rows, 1, figsize=(8, 2.4 * rows), sharex=True)
    t_max = float(times[-1]) if len(times) else 0.0
    for ax in axes:
        _shade_phases(ax, phases, t_max)
    axes[0].plot(times, 1e3 * wx, label="neck width x")
    axes[0].plot(times, 1e3 * wy, label="neck width y")
    axes[0].set_ylabel("mm")
    axes[0].legend(loc="upper right", fontsize=8)
    axes[1].plot(times, 1e3 * flap, color="C2", label="flap height")
    axes[1].set_ylabel("mm")
    axes[1].legend(loc="upper right", fontsize=8)
    if audit is not None:
        axes[2].semilogy(times, 1e3 * np.asarray(audit["min_film_film"]), label="min film–film distance")
        axes[2].semilogy(times, 1e3 * np.asarray(audit["min_film_sphere"]), label="min film–sphere gap")
        axes[2].set_ylabel("mm")
        axes[2].legend(loc="upper right", fontsize=8)
    for name, a, b in phases:
        if a < t_max:
            axes[0].annotate(name, (a, 1.0), xycoords=("data", "axes fraction"), fontsize=6,
                             rotation=90, va="top", ha="left")
    axes[-1].set_xlabel("simulated time (s)")
    axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render_frame(path, film, faces, *, spheres=(), sphere_radius=(), obstacles=None, title="",
                 bounds=None):
    """A matplotlib 3-D picture of one frame: film triangles shaded by height, spheres as
    wireframe balls, optional obstacle triangles (vertices, triangles) in light grey."""
    plt = _plt()
    from mpl_toolkits.mplot3d.art3d import Poly3DCollection

    film = np.asarray(film)
    fig = plt.figure(figsize=(5.5, 5))
    ax = fig.add_subplot(projection="3d")
    if obstacles is not None:
        ov, ot = obstacles
        ax.add_collection3d(Poly3DCollection(np.asarray(ov)[np.asarray(ot)], facecolor=(0.8, 0.8, 0.8, 0.15),
                                             edgecolor=(0.6, 0.6, 0.6, 0.2), lw=0.2))
    tri = film[np.asarray(faces)]
    z = tri[..., 2].mean(axis=1)
    zn = (z - z.min()) / max(np.ptp(z), FLAT)
    colors = plt.get_cmap("viridis")(0.15 + 0.75 * zn)
    colors[:, 3] = 0.85
    ax.add_collection3d(Poly3DCollection(tri, facecolor=colors, edgecolor=(0, 0, 0, 0.25), lw=0.2))
    u, v = np.mgrid[0:2 * np.pi:16j, 0:np.pi:9j]
    for c, r in zip(np.asarray(spheres).reshape(-1, 3), np.asarray(sphere_radius).reshape(-1)):
        ax.plot_wireframe(c[0] + r * np.cos(u) * np.sin(v), c[1] + r * np.sin(u) * np.sin(v),
                          c[2] + r * np.cos(v), color="C3", lw=0.4)
    pts = np.concatenate([film, np.asarray(spheres).reshape(-1, 3)]) if len(spheres) else film
    if bounds is None:
        lo, hi = pts.min(axis=0), pts.max(axis=0)
        mid, half = (lo + hi) / 2, max(np.max(hi - lo) / 2, 1e-3) * 1.05
        bounds = (mid - half, mid + half)
    ax.set_xlim(bounds[0][0], bounds[1][0])
    ax.set_ylim(bounds[0][1], bounds[1][1])
    z0 = max(bounds[0][2], -0.01)  # equal axis spans, so spheres look round
    ax.set_zlim(z0, z0 + (bounds[1][2] - bounds[0][2]))
    ax.set_box_aspect((1, 1, 1))
    ax.set_xlabel("x (m)", fontsize=7)
    ax.set_ylabel("y (m)", fontsize=7)
    ax.set_zlabel("z (m)", fontsize=7)
    ax.tick_params(labelsize=6)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def phase_snapshots(folder, trajectory, sphere_radius, phases, *, obstacles=None, prefix: str = "snapshot"):
    """Render the frame closest to the end of each phase that the trajectory reaches (and
    the first and last frames) as PNGs. Returns the written paths."""
    times, film, spheres = np.asarray(trajectory.time), trajectory.film, trajectory.spheres
    os.makedirs(folder, exist_ok=True)
    picks = [(0, "start")]
    for name, _a, b in phases:
        if b <= times[-1] + TIME_SLACK:
            picks.append((int(np.argmin(np.abs(times - b))), f"end of {name}"))
    picks.append((len(times) - 1, "last frame"))
    seen, out = set(), []
    for i, label in picks:
        if i in seen:
            continue
        seen.add(i)
        path = os.path.join(folder, f"{prefix}_{i:05d}.png")
        render_frame(path, film[i], trajectory.faces, spheres=spheres[i], sphere_radius=sphere_radius,
                     obstacles=obstacles, title=f"t = {times[i]:.2f} s ({label})")
        out.append(path)
    return out

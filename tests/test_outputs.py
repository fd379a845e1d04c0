"""Run-folder outputs: meshio sequences, the time-series plot and phase snapshots."""
import numpy as np
import pytest

from ipcjax.runfolder import Trajectory
from scenes import outputs as O
from scenes.bag import PHASES, bag_mesh


def _tiny_run(T=5):
    mesh = bag_mesh(rings=3, columns=6)
    film = np.stack([mesh.x + np.array([0.0, 0.0, 0.01 * i]) for i in range(T)])
    spheres = np.zeros((T, 2, 3))
    spheres[:, 0] = [0.0, 0.0, 0.1]
    spheres[:, 1] = [0.05, 0.0, 0.2]
    spheres[:, :, 2] -= 0.01 * np.arange(T)[:, None]
    return mesh, film, spheres, np.arange(T) / 240.0


def test_icosphere_is_a_closed_unit_sphere():
    v, f = O.icosphere(1)
    assert v.shape == (42, 3) and f.shape == (80, 3)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-12)
    # closed and consistently oriented: every directed edge appears once, its reverse once
    e = np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]])
    assert len({tuple(x) for x in e}) == len(e)
    assert {tuple(x) for x in e} == {(b, a) for a, b in e}
    # outward normals
    n = np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]])
    assert np.all(np.einsum("ij,ij->i", n, v[f].mean(axis=1)) > 0)


def test_export_meshes_round_trips_through_meshio(tmp_path):
    import meshio

    mesh, film, spheres, times = _tiny_run()
    radii = [0.02, 0.01]
    paths = O.export_meshes(tmp_path, Trajectory(film, spheres, mesh.triangles, times), radii, every=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([f"frame_{i:05d}.{e}" for i in (0, 2, 4) for e in ("vtu", "obj")] + ["frame.pvd"])
    assert len(paths) == 7
    m = meshio.read(tmp_path / "frame_00004.vtu")
    nf = len(mesh.x)
    np.testing.assert_allclose(m.points[:nf], film[4], atol=1e-12)
    body = m.point_data["body"]
    assert np.all(body[:nf] == 0) and set(np.unique(body[nf:])) == {1, 2}
    # sphere 1's vertices lie on its surface
    p = m.points[body == 2]
    np.testing.assert_allclose(np.linalg.norm(p - spheres[4, 1], axis=1), radii[1], rtol=1e-9)
    tris = m.cells_dict["triangle"]
    np.testing.assert_array_equal(tris[: len(mesh.triangles)], mesh.triangles)
    assert len(tris) == len(mesh.triangles) + 2 * 80
    o = meshio.read(tmp_path / "frame_00002.obj")
    np.testing.assert_allclose(o.points[:nf], film[2], atol=1e-6)
    pvd = (tmp_path / "frame.pvd").read_text()
    assert pvd.count("<DataSet") == 3 and 'timestep="0.016667"' in pvd


def test_export_meshes_rejects_mismatched_shapes_and_formats(tmp_path):
    mesh, film, spheres, times = _tiny_run()
    with pytest.raises(ValueError, match="one length T"):
        O.export_meshes(tmp_path, Trajectory(film, spheres[:-1], mesh.triangles, times), [0.02, 0.01])
    with pytest.raises(ValueError, match="unknown mesh formats"):
        O.export_meshes(tmp_path, Trajectory(film, spheres, mesh.triangles, times), [0.02, 0.01], formats=("stl",))


def test_plot_and_snapshots_write_pngs(tmp_path):
    mesh, film, spheres, times = _tiny_run()
    audit = dict(min_film_film=np.full(len(times), 1e-3), min_film_sphere=np.linspace(1e-3, 2e-3, len(times)))
    traj = Trajectory(film, spheres, mesh.triangles, times)
    p = O.plot_timeseries(tmp_path / "ts.png", traj, mesh.rim, mesh.neck, audit=audit, phases=PHASES)
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    phases = (("a", 0.0, 1.4 / 240), ("b", 1.4 / 240, 1.0))  # only "a" ends inside the run
    snaps = O.phase_snapshots(tmp_path / "snap", traj, [0.02, 0.01], phases)
    # start, end of phase a (frame 1 is nearest 1.4/240 s), last frame
    assert [s.rsplit("_", 1)[1] for s in snaps] == ["00000.png", "00001.png", "00004.png"]
    for s in snaps:
        with open(s, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"

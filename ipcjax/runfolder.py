"""Run folders: writing and checking what a job leaves on disk, for any scene.

Every JSON file a job writes goes through :func:`write_json`, so the output is always
valid JSON (RFC 8259 has no ``Infinity`` or ``NaN``): a non-finite float, such as the
smallest gap of a run that measured none, is written as ``null``. :func:`prepare` makes
the output folder and proves it writable *before* any simulation starts, so a bad
``--out`` costs nothing. :func:`read_npz` reads an ``.npz`` a job left (without pickle);
:func:`write_trajectory` / :func:`read_trajectory` write and check ``trajectory.npz`` (film
(T, N_f, 3), spheres (T, S, 3), faces, time (T,)), the one layout every bag run (IPC or a
baseline) leaves, so a bad file is refused before anything runs. A scene's own files build
on these (the bag's ``state.npz``: :mod:`scenes.bag_run`).
"""
from __future__ import annotations

import json
import math
import os
import zipfile
import zlib
from typing import NamedTuple

import numpy as np


def json_safe(obj):
    """A JSON-encodable copy of ``obj``: NumPy scalars and arrays become Python numbers and
    lists, non-finite floats become ``None``, tuples become lists."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(float(obj)) else None
    return obj


def dumps(obj) -> str:
    """``obj`` as indented, strictly valid JSON (see :func:`json_safe`)."""
    return json.dumps(json_safe(obj), indent=2, allow_nan=False)


def read_json(path) -> dict:
    """A JSON file a job wrote (e.g. ``summary.json``); ``{}`` when there is none.

    Raises:
        ValueError: the file is not valid JSON (one line naming it).
    """
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def write_json(path, obj) -> str:
    """Write ``obj`` to ``path`` as strictly valid JSON; returns the text written."""
    text = dumps(obj)
    with open(path, "w") as f:
        f.write(text + "\n")
    return text


def prepare(out) -> str:
    """Create the run folder ``out`` and check that a file can be written in it.

    Raises:
        OSError: naming the folder, when it cannot be created or written.
    """
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise OSError(f"cannot write the run folder {out!r}: {e.strerror or e}") from None
    return out


class Arrays(dict):
    """The arrays of an ``.npz`` file by name; ``files`` lists the names, as NumPy's
    ``NpzFile`` does, so code written for ``np.load`` reads either."""

    @property
    def files(self) -> list:
        return list(self)


def read_npz(path, what: str = "file") -> Arrays:
    """Every array in the ``.npz`` file at ``path``, read whole and without pickle.

    Args:
        path: the file. what: how messages name it (e.g. ``"--resume"``).
    Raises:
        FileNotFoundError: no such file.
        ValueError: not a readable ``.npz`` (not a zip of arrays, truncated, corrupt, a
            single ``.npy`` array, or holding object arrays, which would need pickle).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} {path}: no such file")
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValueError("a single .npy array, not an .npz archive of named arrays")
        with z:
            return Arrays((k, np.asarray(z[k])) for k in z.files)
    except ValueError as e:
        if "Object arrays" in str(e):
            raise ValueError(f"{what} {path}: holds object arrays, which only pickle could read "
                             f"(refused)") from None
        if "pickle" in str(e):  # np.load's words for a file that is neither .npz nor .npy
            raise ValueError(f"{what} {path}: not an .npz file (neither a zip of arrays nor an "
                             f".npy array)") from None
        raise ValueError(f"{what} {path}: {e}") from None
    except (OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise ValueError(f"{what} {path}: unreadable or corrupt .npz ({type(e).__name__}: {e})") from None


class Trajectory(NamedTuple):
    """The arrays of a ``trajectory.npz``; ``spheres`` is None for a film-only run (drape)."""

    film: np.ndarray            # (T, N_f, 3) m
    spheres: np.ndarray | None  # (T, S, 3) m
    faces: np.ndarray           # (F, 3) film triangles
    time: np.ndarray            # (T,) s


def write_trajectory(path, trajectory: Trajectory) -> None:
    """Write ``trajectory`` to ``path`` (``.npz``; no ``spheres`` key when None).

    Not compressed: the bag's whole trajectory (2,521 frames of FP32 positions, which
    compress poorly) is 14.8 MB as it is and 12.4 MB compressed, and compressing took 0.44 s
    a write against 0.03 s (docs/benchmarks.md). A run rewrites the file at every checkpoint
    (``ipcjax bag``: every 120 steps), so compression cost the whole bag run ≈ 5 s.
    """
    arrays = dict(film=trajectory.film, faces=trajectory.faces, time=np.asarray(trajectory.time))
    if trajectory.spheres is not None:
        arrays["spheres"] = trajectory.spheres
    np.savez(path, **arrays)


def read_trajectory(path, what: str = "file", *, spheres: bool = True) -> Trajectory:
    """Read and check a :func:`write_trajectory` file: film (T, N, 3), spheres (T, S, 3)
    (when ``spheres``), faces and time (T,) of one length T.

    Raises:
        FileNotFoundError: no such file. ValueError: one line naming the file and what
            is wrong (corrupt, keys missing, shapes that disagree).
    """
    tr = read_npz(path, what)
    need = ("film", "spheres", "time") if spheres else ("film", "time")
    missing = [k for k in need if k not in tr]
    if missing:
        raise ValueError(f"{what} {path} without {', '.join(missing)}: not a bag run's trajectory")
    film, time = tr["film"], tr["time"]
    sph = tr["spheres"] if spheres else None
    n = len(time) if time.ndim == 1 else -1
    if film.ndim != 3 or film.shape[0] != n or film.shape[2:] != (3,) or (
            sph is not None and (sph.ndim != 3 or sph.shape[0] != n or sph.shape[2:] != (3,))):
        raise ValueError(f"{what} {path}: need film (T, N, 3), spheres (T, S, 3) and time (T,) of one "
                         f"length; got {film.shape}, {None if sph is None else sph.shape}, {time.shape}")
    return Trajectory(film, sph, tr.get("faces"), time)

"""Perturbed starts for ensembles of bag runs: a seeded, smooth velocity kick of the film.

One run of the bag is one instance of its pleat pattern; a fit to one measured bag wants
the mean of several runs whose pleats fall differently (docs/differentiation.md,
"Ensembles"). Each run starts from the same saved state with the film's velocities kicked
by a seeded field:

    Δv(x) = c · Σ_{m=1..M} a_m sin(2π k_m·x / λ + φ_m)          (m/s)

over the film's particles at their positions x, with M = :data:`MODES` modes, k_m unit
directions (uniform on the sphere), φ_m uniform in [0, 2π) and a_m standard normal
3-vectors, all drawn from ``numpy.random.default_rng(seed)``, and c such that the rms of
|Δv| over the film is ``rms``. The wavelength λ = :data:`WAVELENGTH` is long against the
gaps between film layers and short against the bag, so layers that lie against each other
get nearly the same kick while the pleats across the bag get different ones.

Why a velocity and not a displacement: at the tie checkpoint film layers lie 69 µm apart
and the film touches the spheres; a displacement of the positions would have to be
checked against every pair and could start the run overlapping. A kick changes no
position: the first step's solve takes it, and its barrier, step bound and line search
keep every gap positive as in any step.
"""
from __future__ import annotations

import numpy as np

#: Modes of the kick field.
MODES = 8
#: Wavelength of the kick field's modes, m (the neck is about 40 mm across).
WAVELENGTH = 0.04
#: The rms kick, m/s, of the bag fit's ensemble members (``ipcjax fit --scene bag
#: --runs-per-node K``): the largest kick measured from the tie checkpoint, which ran
#: without failure. No kick measured, 0.01–0.3 m/s at the tie and 0.03 m/s at the cinch,
#: moved the end by more than 0.02 mm (``benchmarks/perturb_size.py``;
#: docs/differentiation.md "Ensembles").
ENSEMBLE_KICK = 0.3


def film_kick(x, particles, rms: float, seed: int, *, wavelength: float = WAVELENGTH, modes: int = MODES) -> np.ndarray:
    """The velocity kick Δv (len(x), 3) in m/s of the module docstring: non-zero on
    ``particles`` (indices into x; the film), zero elsewhere, its rms over ``particles``
    equal to ``rms`` m/s; the same ``seed`` gives the same field.

    Raises:
        ValueError: ``rms`` not finite or < 0, ``wavelength`` not > 0, no particles, a
            field that vanishes on them (nothing to scale to ``rms``).
    """
    if not (np.isfinite(rms) and rms >= 0):
        raise ValueError(f"the kick's rms must be a finite speed ≥ 0 m/s; got {rms}")
    if not (np.isfinite(wavelength) and wavelength > 0):
        raise ValueError(f"the kick's wavelength must be > 0 m; got {wavelength}")
    x = np.asarray(x, np.float64)
    idx = np.asarray(particles, np.int64)
    if idx.size == 0:
        raise ValueError("the kick needs at least one particle")
    rng = np.random.default_rng(int(seed))
    k = rng.normal(size=(modes, 3))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    phase = rng.uniform(0.0, 2.0 * np.pi, size=modes)
    a = rng.normal(size=(modes, 3))
    s = np.sin(2.0 * np.pi * (x[idx] @ k.T) / wavelength + phase)    # (n, modes)
    field = s @ a                                                     # (n, 3)
    norm = float(np.sqrt(np.mean(np.sum(field**2, axis=1))))
    out = np.zeros_like(x)
    if rms == 0:
        return out
    if not norm > 0:  # every mode vanishes on these particles: no field to scale, never a silent zero kick
        raise ValueError(f"the kick field of seed {seed} vanishes on the {idx.size} particles; choose another seed")
    out[idx] = field * (rms / norm)
    return out


def describe(rms: float, seed: int) -> dict | None:
    """What a run's summary.json records of its kick; None for no kick (``rms`` 0)."""
    if rms == 0:
        return None
    return dict(kind="film velocity kick (scenes/perturb.py)", rms_m_s=float(rms), seed=int(seed),
                wavelength_m=WAVELENGTH, modes=MODES)


def describe_ensemble(rms: float, runs: int) -> dict | None:
    """What a fit's fit.json records of its ensembles of ``runs`` runs per node: run 0
    unperturbed, run j ≥ 1 kicked with seed j; None for one run per node."""
    if runs <= 1:
        return None
    return dict(kind="film velocity kick (scenes/perturb.py)", rms_m_s=float(rms), seeds=list(range(1, int(runs))),
                unperturbed_run=0, wavelength_m=WAVELENGTH, modes=MODES)

"""Element energies of the incremental potential, each beside its hand-derived derivatives.

Every module holds small pure functions of a few particles' positions; :mod:`ipcjax.potential`
lifts them to the mesh with ``vmap``. Which element Hessian the solver uses is named once,
by :class:`PSDProjection`.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Callable


class PSDProjection(str, enum.Enum):
    """Which element Hessians are assembled (after IPC Toolkit's ``PSDProjectionMethod``).

    ``NONE`` ("exact"): every element Hessian as derived, so the blocks sum to ∇²Φ itself
    (the implicit VJP's default). ``PER_ELEMENT`` ("projected"): each element Hessian
    replaced by a positive-semidefinite one (the Newton solve's): membrane S₊/Q₊ tangents,
    the hinge's Gauss–Newton kθ∇θ∇θᵀ, the discrete shell's eigenvalue clamp, the barrier's
    max(B″, 0) jjᵀ and the PSD tie; the element functions of this form end in ``_psd``.
    The string values are accepted wherever a projection is (``hessian="exact"``).
    """

    NONE = "exact"
    PER_ELEMENT = "projected"

    @classmethod
    def _missing_(cls, value):
        allowed = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"hessian projection must be one of {allowed} (or a PSDProjection); got {value!r}")


@dataclasses.dataclass(frozen=True)
class ElementModel:
    """One element model (a membrane material, a bending model) as its element functions."""

    name: str
    energy: Callable       # -> J
    gradient: Callable     # -> per-vertex rows, N
    hessian: Callable      # -> vertex-major matrix, N/m, exact
    hessian_psd: Callable  # -> the same, PSD (PSDProjection.PER_ELEMENT)

    def element_hessian(self, projection: PSDProjection) -> Callable:
        """The element Hessian of this ``projection``."""
        return self.hessian if PSDProjection(projection) is PSDProjection.NONE else self.hessian_psd


def model_named(models: dict, what: str, name: str):
    """``models[name]``; an unknown name raises ValueError naming ``what`` and the known names."""
    if name not in models:
        raise ValueError(f"{what} must be one of {tuple(models)}; got {name!r}")
    return models[name]

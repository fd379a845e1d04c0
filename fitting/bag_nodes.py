"""One node of the bag fit's lattice: a forward run of the bag in its own run folder,
reused when met again (:class:`NodeCache`), and the rest-state derivative at its end
(:func:`run_node`)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time

import numpy as np

from fitting.rest_derivative import BAG_NAMES, make_rest_jacobian

#: The final state must have ‖G(x)‖∞ below this × the largest force of one energy term on
#: one particle for its rest-state derivative to be used (the unbalanced force of a bag
#: that still moves; at the bag's end it is the FP32 rounding of the stored positions,
#: 8e-4: docs/differentiation.md).
REST_RESIDUAL_TOL = 0.01


class NodeFailed(RuntimeError):
    """A smoothing node's forward run or rest-state derivative failed (``params``,
    ``reason``)."""

    def __init__(self, params: dict, reason: str):
        what = ", ".join(f"{k} = {v:.6g}" for k, v in params.items())
        super().__init__(f"bag node at {what}: {reason}")
        self.params, self.reason = params, reason


@dataclasses.dataclass(frozen=True)
class NodeResult:
    """One smoothing node: its measurements, their rest-state Jacobian and diagnostics."""

    z: np.ndarray          # (3,) log of BAG_NAMES at this node
    y: np.ndarray          # (3,) neck x, neck y, flap (m) at the end of the run
    J: np.ndarray          # (3, 3) dy/dz over BAG_NAMES, the rest-state derivative
    residual_ratio: float  # ‖G(x)‖∞ / the largest force of one energy term on one particle
    stable: bool           # H positive definite
    max_speed: float       # m/s, the fastest particle at the end
    wall_s: float
    run_dir: str
    runs: int = 1                      # forward runs this node is the mean of (:func:`mean_node`)
    spread: np.ndarray | None = None   # (3,) m, their sample standard deviation (None for one run)


def mean_node(members) -> NodeResult:
    """One node from the runs of its ensemble (member 0 the unperturbed run, the others
    from kicked starts: :func:`run_node`'s ``perturb``): the mean of their measurements
    and of their rest-state derivatives, their sample standard deviation (``spread``), the
    largest residual ratio and speed, stable only if every run is, the summed wall time and
    member 0's run folder. One member is returned as it is."""
    members = list(members)
    if len(members) == 1:
        return members[0]
    Y = np.stack([m.y for m in members])
    return NodeResult(z=members[0].z, y=Y.mean(axis=0), J=np.stack([m.J for m in members]).mean(axis=0),
                      residual_ratio=max(m.residual_ratio for m in members), stable=all(m.stable for m in members),
                      max_speed=max(m.max_speed for m in members), wall_s=sum(m.wall_s for m in members),
                      run_dir=members[0].run_dir, runs=len(members), spread=Y.std(axis=0, ddof=1))


_WORKER: dict = {}  # per worker process: the scene and jitted rest Jacobian, built once


def _rest_jacobian_for(sc, capacity):
    key = (sc.resolution, capacity)
    if key not in _WORKER:
        import jax.numpy as jnp

        from scenes.measure import shape

        neck, rim = jnp.asarray(sc.neck), jnp.asarray(sc.rim)
        _WORKER[key] = make_rest_jacobian(sc.model, sc.config, capacity, lambda x: shape(x, neck, rim))
    return _WORKER[key]


def run_node(start: str, z: np.ndarray, out: str, *, until: float | None = None, audit_every: int = 6,
             reuse: bool = False, perturb: float = 0.0, seed: int = 0) -> NodeResult:
    """Run the bag from the state ``start`` with the log-parameters z (over BAG_NAMES) to
    ``until`` (default: the protocol's end) and take the rest-state derivative there.

    ``reuse``: take the run in ``out`` if it finished with these parameters and end time
    (:meth:`NodeCache.finished`; a sweep or fit that continues, ``out`` then being
    :meth:`NodeCache.folder`). Whether the rest-state derivative may be used (``stable``,
    ``residual_ratio``) is the caller's check (:func:`check_rest`). ``perturb``, ``seed``:
    the start's film velocity kick (:func:`scenes.perturb.film_kick`; 0: none), for the
    members of an ensemble (:func:`mean_node`).

    Raises:
        NodeFailed: a failed step, a self-intersecting audited frame, a contact query that
            overflowed at the final state.
    """
    import jax.numpy as jnp

    from ipcjax import runfolder
    from ipcjax.model import Params
    from ipcjax.step import check_geometry
    from scenes.bag import PROTOCOLS, bag_scene
    from scenes.bag_run import BagRunOptions, read_bag_state, run_bag
    from scenes.perturb import describe

    t0 = time.perf_counter()
    known = dict(zip(BAG_NAMES, np.exp(np.asarray(z, np.float64)).tolist()))
    params = Params.film_defaults(**known)
    rs = runfolder.read_npz(start, "--start")
    resolution, protocol = str(rs["resolution"]), str(rs["protocol"]) if "protocol" in rs.files else "full"
    t_end = PROTOCOLS[protocol].t_end if until is None else float(until)
    s = NodeCache.finished(out, params, t_end, describe(perturb, seed)) if reuse else None
    if s is None:
        res = run_bag(BagRunOptions(out=out, resume=start, params=params, resolution=resolution, protocol=protocol,
                                    until=until, save_every=audit_every, mesh_every=0, pictures=False,
                                    progress=False, perturb=perturb, seed=seed))
        s, sc, end = res.summary, res.scene, (res.state.x, res.state.v, res.state.t, res.step)
    else:  # the finished run in ``out``: its end is its state.npz
        sc = bag_scene(resolution, protocol=protocol, params=params)
        final = read_bag_state(os.path.join(out, "state.npz"), sc, resolution)
        end = (final["x"], final["v"], final["t"], final["step"])
    if s["failure"]:
        raise NodeFailed(known, f"the forward run stopped: {s['failure']['reason']} at t = "
                                f"{s['failure']['time_s']:.4f} s")
    bad = s["audit"]["frames_with_self_intersection"]
    if bad:
        raise NodeFailed(known, f"{bad} audited frames self-intersect")
    x, v = np.asarray(end[0], np.float64), np.asarray(end[1], np.float64)
    t, k = float(end[2]), int(end[3])
    sc.choreography.observe(t, x)
    controls = sc.choreography.controls_at(k, t)
    capacity = check_geometry(sc.model, x, sc.config)
    jac = _rest_jacobian_for(sc, capacity)
    y, J, L, residual, force, overflow = jac(jnp.asarray(x), jnp.asarray(v), params, controls, jnp.asarray(sc.dt))
    if bool(overflow):
        raise NodeFailed(known, "the rest state's contact query overflowed its capacity")
    stable = bool(np.all(np.isfinite(np.asarray(L))))
    ratio = float(np.max(np.abs(np.asarray(residual))) / float(force))
    J = np.asarray(J)
    return NodeResult(z=np.asarray(z, np.float64), y=np.asarray(y), J=J, residual_ratio=ratio, stable=stable,
                      max_speed=float(np.max(np.linalg.norm(v, axis=1))), wall_s=time.perf_counter() - t0,
                      run_dir=out)


def check_rest(node: NodeResult) -> None:
    """NodeFailed unless the node's final state is a stable rest state (H positive
    definite, ‖G‖∞ below REST_RESIDUAL_TOL of the largest term force)."""
    known = dict(zip(BAG_NAMES, np.exp(node.z).tolist()))
    if not node.stable:
        raise NodeFailed(known, "the final state is not a stable equilibrium: the Hessian ∇²(V + D) is not "
                                "positive definite")
    if not node.residual_ratio < REST_RESIDUAL_TOL:
        raise NodeFailed(known, f"the bag is not at rest: unbalanced force {node.residual_ratio:.3g} × the largest "
                                f"force of one energy term (limit {REST_RESIDUAL_TOL})")
    if not np.all(np.isfinite(node.J)):
        raise NodeFailed(known, "the rest-state derivative is not finite")


class NodeCache:
    """The run folders of the bag fit's nodes under ``root``, all started from the state
    file ``start``: a node met again (in one fit, in a fit that continues, in a sweep
    writing to the same folder) reuses its finished run.

    The folder of the node at the log-parameters z (over BAG_NAMES) is named

        node_<digest>_youngs_modulus=<v>_friction=<v>_bending_scale=<v>[_member<j>]

    ``<digest>``: the first 10 hexadecimal digits (lower case) of the SHA-256 of the start
    file's bytes, computed once, when the cache is made (:attr:`digest`); a start file
    whose bytes differ gives other folders. Then, for each name of BAG_NAMES in that order,
    ``{n}={v:.9g}`` with v = exp(zᵢ) in the parameter's units (E in Pa, μf, kθ), joined by
    ``_``: nodes whose values agree to 9 significant digits share a folder (and its run
    only under the rules below). ``_member<j>``: the j-th kicked run of an ensemble node
    (j ≥ 1; member 0, the unperturbed run, has no suffix, as a node of one run).

    A run in a node's folder is reused (:meth:`finished`) when its ``summary.json`` reads as
    JSON, records for every name of BAG_NAMES a value within 1e-12 relative of the node's,
    reached the end time (``simulated_s`` within 1e-6 s of it), records the same start kick
    (``perturbation``, null for none) and has no ``failure``; otherwise the node runs again
    in that folder.
    """

    def __init__(self, start: str, root: str):
        self.start, self.root = start, root
        with open(start, "rb") as f:
            self.digest = hashlib.sha256(f.read()).hexdigest()[:10]   # of the start file, once

    def folder(self, z, member: int = 0) -> str:
        """The run folder of the node at the log-parameters z (over BAG_NAMES); ``member``:
        which run of an ensemble node (0: the unperturbed one)."""
        values = np.exp(np.asarray(z, np.float64))
        name = f"node_{self.digest}_" + "_".join(f"{n}={v:.9g}" for n, v in zip(BAG_NAMES, values))
        return os.path.join(self.root, name + (f"_member{int(member)}" if member else ""))

    @staticmethod
    def finished(run_dir: str, params, t_end: float, perturbation: dict | None = None, *,
                 failed: bool = False) -> dict | None:
        """The summary (summary.json) of the run in ``run_dir`` if it reached ``t_end`` (s)
        with ``params`` (a :class:`ipcjax.model.Params`; BAG_NAMES compared) and the start
        kick ``perturbation`` (:func:`scenes.perturb.describe`; None: none) and did not
        fail, else None (the class docstring's rules). With ``failed`` a run with those
        parameters and kick that failed is returned too: it would fail again."""
        try:
            with open(os.path.join(run_dir, "summary.json")) as f:
                s = json.load(f)
        except (OSError, ValueError):
            return None
        same = all(math.isclose(s.get("params", {}).get(n, math.nan), float(getattr(params, n)), rel_tol=1e-12)
                   for n in BAG_NAMES)
        reached = abs(float(s.get("simulated_s", -1.0)) - t_end) < 1e-6
        kicked = s.get("perturbation") == perturbation
        ended = (reached and not s.get("failure")) or (failed and bool(s.get("failure")))
        return s if same and kicked and ended else None


def full_z(names, z) -> np.ndarray:
    """z over BAG_NAMES: the film defaults' logs with ``names`` set from z."""
    from ipcjax.model import Params

    d0 = Params.film_defaults()
    full = np.log([float(getattr(d0, n)) for n in BAG_NAMES])
    for n, v in zip(names, z):
        full[BAG_NAMES.index(n)] = v
    return full

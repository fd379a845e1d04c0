"""A fitting window on the bag experiment: a few steps from a saved ``ipcjax bag`` state.

The full protocol (10.5 s, with subdivided steps in the hard phases) is a GPU-sized job
for a fit; on a CPU the fit starts from a state the bag run saved (its ``state.npz``,
e.g. one taken before tying) and differentiates a window of ``steps`` timesteps.

How the window's controls are made: the choreography grabs the film where it is when a
track starts (captures), so the controls depend on the trajectory. :func:`bag_window`
runs the window once on the host at the reference parameters with the same driver as
``ipcjax bag`` (``advance``, with capacity growth and subdivision) and records each
step's controls; the differentiable rollout then replays those controls for every trial
parameter set. So the supports, tie lengths and tolerances are those of the reference
run and carry no gradient (a hand that holds the film where the reference film was);
the film, spheres and contacts respond to the parameters. The reference run also gives
the candidate capacity the rollout is compiled with. A rollout cannot subdivide a step as
the host driver does, so its config allows ``ROLLOUT_MAX_NEWTON`` Newton iterations per
step (the run's 150 is too few for some trial parameters) before a step counts as failed.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ipcjax import runfolder
from ipcjax.candidates import Capacity, GridCapacity
from ipcjax.implicit import stack_controls
from ipcjax.model import Config, Controls, Params
from ipcjax.step import advance, make_state
from scenes.scene import ByName


ROLLOUT_MAX_NEWTON = 600


class WindowFailed(RuntimeError):
    """The reference run of the window failed (``step``, ``time_s`` and ``reason``)."""

    def __init__(self, step: int, time_s: float, reason: str):
        super().__init__(f"bag window: reference step {step} at t = {time_s:.4f} s failed: {reason}")
        self.step, self.time_s, self.reason = step, time_s, reason


def with_headroom(capacity: Capacity, factor: float = 1.25) -> Capacity:
    """Every candidate buffer ×factor (+8): trial parameters move the film and its contacts
    a little from the reference run's (an overflow still stops the fit with its reason)."""
    g = lambda n: int(factor * n) + 8
    grids = [None if gc is None else GridCapacity(*(g(v) for v in gc))
             for gc in (capacity.face_grid, capacity.edge_grid)]
    return capacity._replace(vt=g(capacity.vt), ee=g(capacity.ee), sf=g(capacity.sf),
                             face_grid=grids[0], edge_grid=grids[1],
                             active=None if capacity.active is None else g(capacity.active))


@dataclasses.dataclass(frozen=True)
class BagWindow(ByName):
    """A fitting window of the bag (:func:`bag_window`); ``window["x0"]`` also reads a
    field (compatibility accessor, :class:`scenes.scene.ByName`)."""

    scene: object             # scenes.bag.BagScene
    params: Params            # the reference parameters
    x0: np.ndarray            # (N, 3) FP64 start positions, m
    v0: np.ndarray            # (N, 3) FP64 start velocities, m/s
    controls: Controls        # time-indexed, one per step of the window
    dt: float                 # s
    capacity: Capacity        # covers every step of the reference run, with headroom
    rollout_config: Config    # the scene's config with ROLLOUT_MAX_NEWTON
    t0: float                 # window start, s
    t1: float                 # window end, s
    step0: int                # step index of the start
    phases: list              # phase names in the window


def load_state(path: str):
    """An ``ipcjax bag`` state file: (arrays, resolution). Raises ValueError naming what is
    missing or why the file cannot be read."""
    rs = runfolder.read_npz(path, "--state")
    need = ("x", "v", "t", "step", "resolution")
    missing = [k for k in need if k not in rs.files]
    if missing:
        raise ValueError(f"{path} is not an `ipcjax bag` state file: missing {', '.join(missing)}")
    return rs, str(rs["resolution"])


def bag_window(state_path: str, steps: int, params=None):
    """Scene, controls and reference of a ``steps``-step window from a saved bag state.

    Args:
      state_path: ``state.npz`` written by ``ipcjax bag`` (positions, velocities, time,
        step index, resolution and the choreography's captures).
      steps: window length in timesteps of 1/240 s (≥ 1).
      params: reference parameters (default: the scene's).

    Returns:
      a :class:`BagWindow`.

    Raises:
      ValueError: bad ``steps`` or state file. WindowFailed: the reference run failed.
    """
    from scenes.bag import bag_scene

    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be a positive integer; got {steps}")
    rs, resolution = load_state(state_path)
    sc = bag_scene(resolution)
    model, config, dt = sc.model, sc.config, sc.dt
    params = sc.params if params is None else params
    if rs["x"].shape != (model.n_particles, 3):
        raise ValueError(f"{state_path}: x has shape {rs['x'].shape}; the {resolution} bag has "
                         f"{model.n_particles} particles")
    choreo = sc.choreography
    choreo.load_captures(rs)
    state = make_state(rs["x"], rs["v"], float(rs["t"]))
    x0, v0 = np.asarray(state.x, np.float64), np.asarray(state.v, np.float64)
    k0 = int(rs["step"])
    controls, phases, capacity = [], [], None
    for i in range(int(steps)):
        t = float(state.t)
        choreo.observe(t, np.asarray(state.x))
        ctl = choreo.controls_at(k0 + i, t)
        state, rep = advance(model, params, state, ctl, dt, config=config, capacity=capacity, validate=i == 0)
        if not rep.ok:
            raise WindowFailed(k0 + i, t, rep.reason)
        capacity = rep.capacity
        controls.append(ctl)
        ph = choreo.phase_at(t)
        if ph not in phases:
            phases.append(ph)
    capacity = with_headroom(capacity)
    return BagWindow(scene=sc, params=params, x0=x0, v0=v0, controls=stack_controls(controls), dt=dt,
                     capacity=capacity, rollout_config=dataclasses.replace(config, max_newton=ROLLOUT_MAX_NEWTON),
                     t0=float(rs["t"]), t1=float(state.t), step0=k0, phases=phases)

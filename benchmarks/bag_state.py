"""A saved bag state made ready to step, for the benchmark scripts that time one step or its parts."""
from __future__ import annotations

from typing import NamedTuple


class BagStepInputs(NamedTuple):
    scene: object      # scenes.bag.BagScene
    time_s: float      # the state's time, s
    state: object      # ipcjax.model.State
    controls: object   # the choreography's Controls at that step
    report: object     # the StepReport of one host-driver step from the state (its capacity)


def bag_step_inputs(path) -> BagStepInputs:
    """The bag scene, state and controls of a saved ``ipcjax bag`` state (``state.npz``, a
    checkpoint), and one host-driver step from it (``advance``, validating, as ``ipcjax bag
    --resume`` takes its first step), whose report carries the capacity a run has there."""
    import numpy as np

    from ipcjax.step import advance, make_state
    from scenes.bag import bag_scene
    from scenes.bag_run import read_bag_state

    resolution = str(np.load(path)["resolution"])
    sc = bag_scene(resolution)
    rs = read_bag_state(path, sc, resolution)
    st = make_state(rs["x"], rs["v"], float(rs["t"]))
    sc.choreography.observe(float(rs["t"]), np.asarray(st.x))
    ctl = sc.choreography.controls_at(int(rs["step"]), float(rs["t"]))
    _, rep = advance(sc.model, sc.params, st, ctl, sc.dt, config=sc.config, validate=True)
    return BagStepInputs(sc, float(rs["t"]), st, ctl, rep)

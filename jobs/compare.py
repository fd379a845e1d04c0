"""``ipcjax compare``: two bag runs side by side, read from their folders or made first.

The job that runs both solvers, the IPC bag (:mod:`scenes.bag_run`) and the VBD baseline
(:mod:`baselines.vbd_bag`), lives here above both; the comparison itself (evaluation,
table, picture) is :mod:`scenes.compare`'s.
"""
from __future__ import annotations

import os

from ipcjax import runfolder
from scenes.compare import compare_runs, load_run


def run_options(protocol: str | None, resolution: str | None, until: float | None, linear_solver: str):
    """The :class:`scenes.bag_run.BagRunOptions` of ``ipcjax compare --run``: without a
    protocol a 0.5 s coarse run (of the full protocol's start); with one, by default the
    full-resolution bag to the protocol's end (the specification's comparison)."""
    from scenes.bag import PROTOCOLS
    from scenes.bag_run import BagRunOptions

    until = until if until is not None else (PROTOCOLS[protocol].t_end if protocol else 0.5)
    return BagRunOptions(until=until, resolution=resolution or ("full" if protocol else "coarse"), mesh_every=0,
                         pictures=False, linear_solver=linear_solver, protocol=protocol or "full")


def compare_job(out: str, *, ipc: str | None = None, vbd: str | None = None, at: float | None = None,
                run=None) -> dict:
    """What ``ipcjax compare`` does: compare two run folders, or make both runs first.

    Args:
        out: output folder (checked writable by the caller).
        ipc, vbd: run folders of ``ipcjax bag`` and ``python -m baselines.vbd_bag``.
        at: instant, s (default: the latest time both runs reached).
        run: a :class:`scenes.bag_run.BagRunOptions` (``out``, ``resolution``, ``until``,
            ``protocol``, ``linear_solver`` used) to run both solvers now into ``out/ipc`` and
            ``out/vbd`` instead of reading ``ipc`` and ``vbd``; the VBD run needs Newton.
    Returns:
        The comparison.json dict (see :func:`compare_runs`) with the job's timings.
    """
    import platform
    import time

    timings = {}
    if run is not None:
        import dataclasses
        import importlib.util

        from baselines.vbd_bag import run_vbd
        from scenes.bag_run import run_bag

        if importlib.util.find_spec("newton") is None:  # before the IPC run, not after it
            raise ValueError("--run needs Newton for the VBD run: pip install -e '.[newton]'")
        ipc, vbd = os.path.join(out, "ipc"), os.path.join(out, "vbd")
        t0 = time.perf_counter()
        run_bag(dataclasses.replace(run, out=ipc))
        t1 = time.perf_counter()
        run_vbd(run.resolution, run.until, vbd, protocol=run.protocol)
        t2 = time.perf_counter()
        timings = dict(ipc_job_s=t1 - t0, vbd_job_s=t2 - t1)
        note = (f"Both runs were made by this command, one after the other, in the same session on "
                f"{platform.node()} ({os.cpu_count()} CPUs); whole jobs incl. compilation and set-up: IPC "
                f"{t1 - t0:.0f} s, VBD {t2 - t1:.0f} s; load average at the end {os.getloadavg()[0]:.1f}.")
    else:
        def stamp(d):
            p = os.path.join(d, "summary.json")
            return time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(p))) if os.path.exists(p) else "?"

        note = (f"Reused run folders: the wall times were not measured by this command, nor necessarily in "
                f"the same session or under the same load (summary.json written {stamp(ipc)} for IPC, "
                f"{stamp(vbd)} for VBD).")
    t_eval = time.perf_counter()
    runs = {"ipcjax IPC": load_run(ipc), "Newton VBD": load_run(vbd)}
    data = compare_runs(runs, out, at, timing_note=note)
    data.update(timings, evaluate_s=time.perf_counter() - t_eval, same_session=run is not None)
    runfolder.write_json(os.path.join(out, "comparison.json"), data)
    return data

"""Where a whole bag run's stepping time goes, by choreography phase (issue #30).

    python3 benchmarks/protocol_phases.py --out runs/phases [--until 10.5] [--json FILE] [--active N]

Runs ``scenes.bag_run.run_bag`` (no meshes, no pictures, no progress bar) with every
``ipcjax.step.advance`` call timed from outside, and prints per phase of the protocol: its
steps, their wall time (the first step, with its compilation, left out), ms per step,
Newton iterations and candidate queries per step, line-search trials per iteration; then
the steps slower than 3 s (a compilation: the first step, or a step whose capacity grew)
with their capacity. JSON (``--json``): the same per phase and every step's record
(t, wall s, iterations, queries, trials, substeps, capacity grown). ``--active N``: the run
starts with ``Capacity.active`` N instead of :func:`ipcjax.capacity.initial_capacity`'s (the
rest of that capacity unchanged; it grows on an overflow as any run's), to see what fewer
slots cost and save.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/phases", help="run folder (overwritten)")
    ap.add_argument("--until", type=float, default=None, help="simulated end time, s (default: the protocol's)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--active", type=int, default=None, help="start Capacity.active at N")
    args = ap.parse_args(argv)

    from ipcjax import step as ipc_step
    from ipcjax.xla_threads import single_threaded_xla
    from scenes.bag_run import BagRunOptions, run_bag

    single_threaded_xla()  # as the command-line jobs run
    records, last_capacity = [], [None]
    advance = ipc_step.advance

    def timed(model, params, state, controls, dt, **kw):
        t0 = time.perf_counter()
        new, rep = advance(model, params, state, controls, dt, **kw)
        grown = last_capacity[0] is not None and rep.capacity != last_capacity[0]
        last_capacity[0] = rep.capacity
        records.append(dict(t=float(state.t), wall_s=time.perf_counter() - t0, iterations=int(rep.iterations),
                            queries=int(rep.queries), trials=int(rep.line_search_trials), substeps=int(rep.substeps),
                            capacity_grown=bool(grown), capacity=str(rep.capacity)))
        return new, rep

    ipc_step.advance = timed
    from ipcjax import candidates
    initial = candidates.initial_capacity
    if args.active is not None:  # advance and check_geometry read it from ipcjax.candidates
        candidates.initial_capacity = lambda topo, x=None: initial(topo, x)._replace(active=args.active)
    try:
        res = run_bag(BagRunOptions(out=args.out, until=args.until, mesh_every=0, pictures=False, progress=False))
    finally:
        ipc_step.advance = advance
        candidates.initial_capacity = initial
    choreo = res.scene.choreography
    phases = {}
    for r in records[1:]:  # the first step holds the compilation
        p = phases.setdefault(choreo.phase_at(r["t"]), dict(steps=0, wall_s=0.0, iterations=0, queries=0, trials=0))
        p["steps"] += 1
        for k in ("wall_s", "iterations", "queries", "trials"):
            p[k] += r[k]
    total = dict(steps=0, wall_s=0.0, iterations=0, queries=0, trials=0)
    print(f"{'phase':<11}{'steps':>6}{'wall s':>9}{'ms/step':>9}{'it/step':>9}{'queries/step':>14}{'trials/it':>11}")
    for name, p in phases.items():
        print(f"{name:<11}{p['steps']:>6}{p['wall_s']:>9.1f}{1e3 * p['wall_s'] / p['steps']:>9.1f}"
              f"{p['iterations'] / p['steps']:>9.2f}{p['queries'] / p['steps']:>14.2f}"
              f"{p['trials'] / max(p['iterations'], 1):>11.2f}")
        for k in total:
            total[k] += p[k]
    print(f"{'all':<11}{total['steps']:>6}{total['wall_s']:>9.1f}{1e3 * total['wall_s'] / total['steps']:>9.1f}"
          f"{total['iterations'] / total['steps']:>9.2f}{total['queries'] / total['steps']:>14.2f}"
          f"{total['trials'] / max(total['iterations'], 1):>11.2f}")
    slow = [(i, r) for i, r in enumerate(records) if r["wall_s"] > 3.0]
    for i, r in slow:
        print(f"step {i} at t = {r['t']:.4f} s: {r['wall_s']:.1f} s"
              + (f", capacity grown to {r['capacity']}" if r["capacity_grown"] else ""))
    out = dict(command="python3 benchmarks/protocol_phases.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               load_average=list(os.getloadavg()), phases=phases, all=total,
               newton_iterations=res.summary["newton_iterations"], measurements=res.summary.get("measurements"),
               frames_with_self_intersection=res.summary["audit"]["frames_with_self_intersection"], steps=records)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":  # the audit's worker processes import this module again
    main()

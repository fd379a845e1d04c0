"""Where one bag step's time goes inside XLA: a ``jax.profiler`` trace, summed by operation.

    python3 benchmarks/trace_step.py [--state scenes/data/bag_full_tie.npz] [--calls 3] [--top 25] [--json F]
                                     [--host-callback]

Steps once from a saved ``ipcjax bag`` state (the tie checkpoint by default) through the
host driver (``advance``, which gives the capacity a run has there), then traces
``--calls`` calls of the jitted ``step`` from it with ``jax.profiler`` (XLA's CPU runtime
records each operation it runs: a fusion, a sort, a ``while`` loop, the host callback)
and sums each operation's time over the calls. With one XLA thread per program, as the
command-line jobs set it (``ipcjax.xla_threads``; ``IPCJAX_XLA_THREADS=default`` for XLA's
own). The Newton direction is the CHOLMOD custom call (``ipcjax.cholmod_ffi``; its
operation is an ``ffi_call`` in the trace). With ``--host-callback`` the
step takes the host callback instead (``cholmod_ffi.switched_off``), as where the custom
call cannot be built, and the host solve (``ipcjax.ldl.host_solve``) is timed from
inside its callback, so that the callback's own cost (the copies of its arguments and
results) is the callback's time less it.

Prints, per call: the step, its Newton iterations, the custom call or the callback (and
the host solve inside it), and the ``--top`` operations by time (ms per call, how many times each ran per call).
``benchmarks/profile_bag.py`` gives the same step by phase of the Newton iteration; this
one names the kernels inside the phases (docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", default=os.path.join(ROOT, "scenes/data/bag_full_tie.npz"))
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", default=None, help="also write the JSON here")
    ap.add_argument("--host-callback", action="store_true", help="the direction through the host callback")
    args = ap.parse_args(argv)
    import contextlib

    from ipcjax import cholmod_ffi

    with cholmod_ffi.switched_off("--host-callback") if args.host_callback else contextlib.nullcontext():
        return _trace(args)


def _trace(args):
    from ipcjax import xla_threads

    threads = xla_threads.single_threaded_xla()
    import jax
    import numpy as np

    from benchmarks.bag_state import bag_step_inputs
    from ipcjax import ldl
    from ipcjax.step import step

    inside = []
    original = ldl.host_solve

    def timed(*a, **k):
        t = time.perf_counter()
        out = original(*a, **k)
        inside.append(time.perf_counter() - t)
        return out

    ldl.host_solve = timed
    sc, t_state, st, ctl, rep = bag_step_inputs(args.state)
    run = lambda: jax.block_until_ready(step(sc.model, sc.params, st, ctl, sc.dt, config=sc.config,
                                              capacity=rep.capacity))
    run()
    inside.clear()
    walls = []
    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder)
        for _ in range(args.calls):
            t = time.perf_counter()
            _, info = run()
            walls.append(time.perf_counter() - t)
        jax.profiler.stop_trace()
        trace = glob.glob(os.path.join(folder, "**", "*.trace.json.gz"), recursive=True)
        if not trace:
            raise RuntimeError(f"jax.profiler wrote no trace under {folder}")
        events = json.load(gzip.open(trace[0]))["traceEvents"]
    total, count = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X":
            total[e["name"]] += e["dur"]
            count[e["name"]] += 1
    callback = sum(v for k, v in total.items() if k.startswith("pure_callback")) / args.calls / 1e3
    custom = sum(v for k, v in total.items() if k.startswith("ffi_call")) / args.calls / 1e3
    out = dict(state=args.state, t=t_state, phase=sc.choreography.phase_at(t_state),
               newton_iterations=int(info.iterations), step_ms=1e3 * float(np.min(walls)),
               direction="host callback" if args.host_callback else "custom call", custom_call_ms=custom,
               callback_ms=callback, host_solve_ms=1e3 * sum(inside) / args.calls,
               xla_threads=threads, load_average=os.getloadavg(),
               operations=[dict(name=k, ms=v / args.calls / 1e3, per_call=count[k] // args.calls)
                           for k, v in total.most_common(args.top)])
    print(f"step {out['step_ms']:.1f} ms, {out['newton_iterations']} Newton iterations; custom call "
          f"{out['custom_call_ms']:.1f} ms; host callback {out['callback_ms']:.1f} ms, of which the host solve "
          f"{out['host_solve_ms']:.1f} ms")
    for op in out["operations"]:
        print(f"{op['ms']:9.2f} ms {op['per_call']:6d}×  {op['name'][:100]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()

"""The Newton direction's custom call (``ipcjax/native/cholmod_ffi.c``) by phase, at a saved
bag state; with ``--before REV``, that commit's handler beside this tree's (issue #30).

    python3 benchmarks/cholmod_phases.py [--state scenes/data/bag_full_tie.npz] [--repeat 5]
    python3 benchmarks/cholmod_phases.py --before REV [--rounds 2]

A copy of the handler's source is given timers, by text, around four phases of a call:

* ``scan``: the pass over the element blocks that finds the used elements and checks
  that every entry read is finite (``mark_used``);
* ``pattern``: the pattern's signature and its lookup among the kept ones (and, for a
  pattern not met before, its build);
* ``assembly``: H's upper triangle into the kept pattern's CSC values;
* ``factorize_solve``: CHOLMOD's factorization (and its symbolic analysis for a new
  pattern) and the triangular solves.

The copy is compiled into a temporary folder (``cholmod_ffi.build`` with ``SOURCE``
pointed at it) and loaded in a fresh process, which steps once from --state (compiling),
then times --repeat jitted steps from the same state (``ipcjax.step.step``, the capacity
of a host-driver step, one XLA thread as the jobs run) and reads the timers. With
--before, the same is done with REV's library and handler, each tree in its own process,
alternated --rounds times. Prints JSON: per tree the best round's ms per call of each
phase, the calls per step and the step's ms, and after/before of each.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
from benchmarks.alternate import alternate, before_tree, last_json_line  # noqa: E402

PHASES = ("scan", "pattern", "assembly", "factorize_solve")
_HEADER = """#include <time.h>
static double ipcjax_T[4];
static long ipcjax_calls;
static double ipcjax_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
void ipcjax_phase_times(double *out, long *calls) {
  for (int i = 0; i < 4; ++i) out[i] = ipcjax_T[i], ipcjax_T[i] = 0.0;
  *calls = ipcjax_calls, ipcjax_calls = 0;
}
"""


def instrumented(source: str) -> str:
    """The handler's source with the phase timers (module docstring). Raises ValueError
    where a line it times is not found exactly once."""
    def around(pattern, before="", after=""):
        nonlocal source
        found = re.findall(pattern, source, flags=re.M)
        if len(found) != 1:
            raise ValueError(f"{len(found)} lines match {pattern!r} in the handler's source")
        source = re.sub(pattern, lambda m: before + m.group(0) + after, source, count=1, flags=re.M)

    # clock_gettime is POSIX: its declaration needs the feature macro before any include
    source = "#define _POSIX_C_SOURCE 200809L\n" + source.replace("#include <math.h>", "#include <math.h>\n" + _HEADER, 1)
    around(r"^ *if \(!mark_used\(.*\n", "  double ipcjax_t0 = ipcjax_now();\n",
           "  ipcjax_T[0] += ipcjax_now() - ipcjax_t0, ++ipcjax_calls;\n")
    around(r"^ *int32_t \*sig = signature\(.*\n", "    ipcjax_t0 = ipcjax_now();\n")
    around(r"^ *double \*x = pat \? calloc\(.*\n", "    ipcjax_T[1] += ipcjax_now() - ipcjax_t0, ipcjax_t0 = ipcjax_now();\n")
    around(r"^ *s = solve_assembled\(.*\n", "      ipcjax_T[2] += ipcjax_now() - ipcjax_t0, ipcjax_t0 = ipcjax_now();\n",
           "      ipcjax_T[3] += ipcjax_now() - ipcjax_t0;\n")
    return source


def worker(root, state, repeat):
    sys.path.insert(0, root)
    os.chdir(root)
    from ipcjax import xla_threads

    xla_threads.single_threaded_xla()
    import ctypes

    import jax

    from benchmarks.bag_state import bag_step_inputs
    from ipcjax import cholmod_ffi
    from ipcjax.step import step

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "cholmod_ffi_timed.c")
        with open(os.path.join(root, "ipcjax", "native", "cholmod_ffi.c")) as f:
            timed = instrumented(f.read())
        with open(src, "w") as f:
            f.write(timed)
        cholmod_ffi.SOURCE = src
        os.environ[cholmod_ffi.ENV_CACHE] = tmp
        sc, _, st, ctl, rep = bag_step_inputs(state)
        run = lambda: step(sc.model, sc.params, st, ctl, sc.dt, config=sc.config, capacity=rep.capacity)
        _, info = jax.block_until_ready(run())  # compiles; the kept patterns are made here
        lib = cholmod_ffi._state.get("lib")
        if lib is None:
            raise SystemExit(f"the custom call is not in use here: {cholmod_ffi.why_not()}")
        times, calls = (ctypes.c_double * 4)(), ctypes.c_long()
        lib.ipcjax_phase_times(times, ctypes.byref(calls))
        t = time.perf_counter()
        for _ in range(repeat):
            jax.block_until_ready(run())
        step_s = (time.perf_counter() - t) / repeat
        lib.ipcjax_phase_times(times, ctypes.byref(calls))
    n = max(calls.value, 1)
    return dict(state=state, newton_iterations=int(info.iterations), calls_per_step=calls.value / repeat,
                step_ms=1e3 * step_s, ms_per_call={p: 1e3 * times[i] / n for i, p in enumerate(PHASES)})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", default=os.path.join(ROOT, "scenes/data/bag_full_tie.npz"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--before", help="git revision whose handler to time beside this tree's")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--worker", metavar="ROOT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    state = os.path.abspath(args.state)
    if args.worker:
        print(json.dumps(worker(args.worker, state, args.repeat)))
        return None
    if not args.before:
        out = dict(tree=ROOT, load_average=os.getloadavg(), **worker(ROOT, state, args.repeat))
        print(json.dumps(out, indent=1))
        return out
    with before_tree(args.before) as (_, old):
        runs = alternate(old, args.rounds, lambda tree, root, k: [
            os.path.abspath(__file__), "--worker", root, "--state", state, "--repeat", str(args.repeat)],
            parse=last_json_line)
    best = {t: min(runs[t], key=lambda r: r["step_ms"]) for t in runs}
    out = dict(before=args.before, state=args.state, repeat=args.repeat, rounds=args.rounds,
               load_average=os.getloadavg(), runs=runs, best=best,
               after_over_before={p: best["after"]["ms_per_call"][p] / best["before"]["ms_per_call"][p]
                                  for p in PHASES} | {"step": best["after"]["step_ms"] / best["before"]["step_ms"]})
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

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

The copy also counts the patterns a call meets for the first time (``new_patterns``: their
CSC structure and scatter map built, ``build_ms_per_new``, and CHOLMOD's symbolic analysis
made, ``analysis_ms_per_new``; both are inside ``pattern`` and ``factorize_solve``).

The copy is compiled into a temporary folder (``cholmod_ffi.build`` with ``SOURCE``
pointed at it) and loaded in a fresh process, which steps once from --state (compiling),
then times --repeat jitted steps from the same state (``ipcjax.step.step``, the capacity
of a host-driver step, one XLA thread as the jobs run) and reads the timers. A repeated
step meets its patterns again; ``--steps N`` instead times N consecutive host-driver steps
from the state (``advance`` with a ``CandidateCache``, as ``ipcjax bag`` steps), where a
stencil that enters or leaves d̂ makes a new pattern:

    python3 benchmarks/cholmod_phases.py --state tests/data/bag_full_cinch.npz --steps 40 [--before REV]

With --before, the same is done with REV's library and handler, each tree in its own process,
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
static double ipcjax_T[4], ipcjax_B[2], ipcjax_t1;
static long ipcjax_calls, ipcjax_new;
static double ipcjax_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
void ipcjax_phase_times(double *out, long *calls) {
  for (int i = 0; i < 4; ++i) out[i] = ipcjax_T[i], ipcjax_T[i] = 0.0;
  *calls = ipcjax_calls, ipcjax_calls = 0;
}
void ipcjax_pattern_stats(double *out, long *n_new) {
  out[0] = ipcjax_B[0], out[1] = ipcjax_B[1], ipcjax_B[0] = ipcjax_B[1] = 0.0;
  *n_new = ipcjax_new, ipcjax_new = 0;
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
    # a new pattern: its build, and CHOLMOD's analysis of it
    found = re.findall(r"^( *)\} else if \(\(pat = build_pattern\((.*)\)\)\) \{\n", source, flags=re.M)
    if len(found) != 1:
        raise ValueError(f"{len(found)} lines build a new pattern in the handler's source")
    source = re.sub(r"^( *)\} else if \(\(pat = build_pattern\((.*)\)\)\) \{\n", lambda m: (
        m.group(1) + "} else if ((++ipcjax_new, ipcjax_t1 = ipcjax_now(), pat = build_pattern(" + m.group(2) +
        ")) && (ipcjax_B[0] += ipcjax_now() - ipcjax_t1, 1)) {\n"), source, count=1, flags=re.M)
    around(r"^  if \(!pat->L && !\(pat->L = cholmod_analyze\(&A, common\)\)\) \{\n",
           "  const int ipcjax_fresh = !pat->L;\n  ipcjax_t1 = ipcjax_now();\n")
    around(r"^  if \(!cholmod_factorize\(&A, pat->L, common\)\) \{\n",
           "  if (ipcjax_fresh) ipcjax_B[1] += ipcjax_now() - ipcjax_t1;\n")
    return source


def worker(root, state, repeat, steps=0):
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
        built, n_new = (ctypes.c_double * 2)(), ctypes.c_long()
        lib.ipcjax_phase_times(times, ctypes.byref(calls))
        lib.ipcjax_pattern_stats(built, ctypes.byref(n_new))
        if steps:
            iterations, step_s = _consecutive_steps(state, sc, rep, steps)
        else:
            iterations = int(info.iterations)
            t = time.perf_counter()
            for _ in range(repeat):
                jax.block_until_ready(run())
            step_s = (time.perf_counter() - t) / repeat
        lib.ipcjax_phase_times(times, ctypes.byref(calls))
        lib.ipcjax_pattern_stats(built, ctypes.byref(n_new))
    n, count = max(calls.value, 1), steps or repeat
    return dict(state=state, steps=steps, newton_iterations=iterations, calls_per_step=calls.value / count,
                step_ms=1e3 * step_s, ms_per_call={p: 1e3 * times[i] / n for i, p in enumerate(PHASES)},
                new_patterns=n_new.value, calls=calls.value,
                build_ms_per_new=1e3 * built[0] / max(n_new.value, 1),
                analysis_ms_per_new=1e3 * built[1] / max(n_new.value, 1))


def _consecutive_steps(state, sc, rep, steps):
    """``steps`` host-driver steps from the state after its first (``rep``'s): their Newton
    iterations and wall seconds per step."""
    import numpy as np

    from ipcjax.step import CandidateCache, advance, make_state
    from scenes.bag_run import read_bag_state

    resolution = str(np.load(state)["resolution"])
    rs = read_bag_state(state, sc, resolution)
    st, k, cap, cache = make_state(rs["x"], rs["v"], float(rs["t"])), int(rs["step"]), rep.capacity, CandidateCache()
    iterations, t0 = 0, time.perf_counter()
    for _ in range(steps):
        t = float(st.t)
        sc.choreography.observe(t, np.asarray(st.x))
        st, r = advance(sc.model, sc.params, st, sc.choreography.controls_at(k, t), sc.dt, config=sc.config,
                        capacity=cap, candidates=cache, validate=False)
        r.raise_if_failed()
        cap, k, iterations = r.capacity, k + 1, iterations + r.iterations
    return iterations, (time.perf_counter() - t0) / steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", default=os.path.join(ROOT, "scenes/data/bag_full_tie.npz"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--before", help="git revision whose handler to time beside this tree's")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0, help="consecutive host-driver steps instead of --repeat")
    ap.add_argument("--worker", metavar="ROOT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    state = os.path.abspath(args.state)
    if args.worker:
        print(json.dumps(worker(args.worker, state, args.repeat, args.steps)))
        return None
    if not args.before:
        out = dict(tree=ROOT, load_average=os.getloadavg(), **worker(ROOT, state, args.repeat, args.steps))
        print(json.dumps(out, indent=1))
        return out
    with before_tree(args.before) as (_, old):
        runs = alternate(old, args.rounds, lambda tree, root, k: [
            os.path.abspath(__file__), "--worker", root, "--state", state, "--repeat", str(args.repeat),
            "--steps", str(args.steps)],
            parse=last_json_line)
    best = {t: min(runs[t], key=lambda r: r["step_ms"]) for t in runs}
    out = dict(before=args.before, state=args.state, repeat=args.repeat, steps=args.steps, rounds=args.rounds,
               load_average=os.getloadavg(), runs=runs, best=best,
               after_over_before={p: best["after"]["ms_per_call"][p] / best["before"]["ms_per_call"][p]
                                  for p in PHASES} | {"step": best["after"]["step_ms"] / best["before"]["step_ms"]})
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

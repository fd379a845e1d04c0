"""Run every benchmark script in benchmarks/ with short settings and collect their JSON in one file.

    python3 benchmarks/run_all.py [--out benchmarks.json] [--full] [--only step,scale]

Each script runs in its own process (so timings and peak memory do not mix) with the
short arguments below; ``--full`` runs them with their own defaults instead. A script
that fails is recorded with its return code and the tail of its stderr, and the others
still run. Every script found in benchmarks/ must have an entry here, so a new one is not
silently left out.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# per script: its short arguments, or {result name: arguments} for several runs of it
SHORT = {
    "ab_step.py": ["--before", "cbc62fe", "--scenes", "bag", "--rounds", "1", "--repeat", "3"],
    "step.py": {"step": ["--steps", "5", "--repeat", "3"],
                "step_bag": ["--bag-state", "tests/data/bag_full_8p50.npz", "--repeat", "5"]},
    "gradient.py": ["--steps", "4", "--repeat", "2"],
    "compile.py": ["--resolution", "coarse", "--steps", "2"],
    "scale.py": ["--sizes", "500,2000", "--dense-max", "2100", "--repeat", "1"],
}
# Not run here: helpers, this runner, and scripts run by hand that print a table or a verdict
# rather than JSON figures (their commands and output are in docs/: bad_inputs in
# validation.md, gradient_tolerance and same_trajectory in benchmarks.md, bag_sweep — an
# hour of bag runs — in differentiation.md); and the before/after comparisons of one
# change against an earlier commit, the profiles and the long-process checks, each run by
# hand with the command docs/benchmarks.md gives beside its figure.
NOT_BENCHMARKS = {"__init__.py", "timing.py", "run_all.py", "alternate.py",
                  "bad_inputs.py", "gradient_tolerance.py", "same_trajectory.py", "bag_sweep.py",
                  "ab_audit.py", "ab_bag.py", "ab_tests.py", "compile_cache.py", "compile_grad.py",
                  "compile_share.py", "many_jobs.py", "map_exhaustion.py", "map_sizes.py", "newton_start.py",
                  "opt_level.py", "profile_bag.py",
                  # profiles and by-hand checks added since (#30, #35), each with its command in docs/
                  "bag_state.py", "device_check.py", "ensemble_bag.py", "ensemble_step.py", "kernel_census.py",
                  "kind_slots.py", "line_search.py", "newton_tangent.py", "perturb_size.py", "protocol_phases.py",
                  "query_cost.py", "sparse_solvers.py", "suite_order.py", "taylor_base_points.py", "trace_step.py",
                  "trajectory_write.py", "used_rows.py", "cholmod_phases.py",
                  "whole_history.py", "tangent_ensemble.py"}


def _json_of(stdout: str):
    """The JSON object a script printed last (scripts print one, possibly indented)."""
    start = stdout.rfind("\n{")
    return json.loads(stdout[start + 1:] if start >= 0 else stdout)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks.json")
    ap.add_argument("--full", action="store_true", help="each script's own defaults instead of the short settings")
    ap.add_argument("--only", help="comma-separated script stems to run")
    args = ap.parse_args(argv)

    scripts = sorted(f for f in os.listdir(HERE) if f.endswith(".py") and f not in NOT_BENCHMARKS)
    missing = [s for s in scripts if s not in SHORT]
    if missing:
        raise SystemExit(f"run_all.py has no settings for {missing}; add them to SHORT")
    if args.only:
        keep = {s + ".py" for s in args.only.split(",")}
        scripts = [s for s in scripts if s in keep]
    runs = []
    for s in scripts:
        settings = SHORT[s] if isinstance(SHORT[s], dict) else {s[:-3]: SHORT[s]}
        for name, short in settings.items():
            if args.full:  # the script's own defaults; a run on a saved state keeps that state
                i = short.index("--bag-state") if "--bag-state" in short else None
                short = [] if i is None else short[i:i + 2]
            runs.append((s, name, short))
    results = {}
    for s, name, extra in runs:
        cmd = [sys.executable, os.path.join(HERE, s)] + extra
        print("running", " ".join(cmd[1:]), file=sys.stderr, flush=True)
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        entry = dict(command="python3 " + " ".join(os.path.relpath(c) if c.endswith(".py") else c for c in cmd[1:]),
                     wall_s=time.perf_counter() - t, returncode=r.returncode)
        if r.returncode == 0:
            entry["result"] = _json_of(r.stdout)
        else:
            entry["stderr_tail"] = r.stderr.strip().splitlines()[-5:]
        results[name] = entry
        print(f"  {s}: rc {r.returncode}, {entry['wall_s']:.0f} s", file=sys.stderr, flush=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=2)
    print(json.dumps({k: dict(returncode=v["returncode"], wall_s=v["wall_s"]) for k, v in results.items()}, indent=2))
    return 0 if all(v["returncode"] == 0 for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

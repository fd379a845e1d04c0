"""The persistent compilation cache, cold and warm: the same job twice on one empty cache.

    python3 benchmarks/compile_cache.py [--jobs bag,drape] [--out DIR]

Each job runs twice, each time in a fresh process, with ``IPCJAX_COMPILATION_CACHE`` set
to a new empty folder, the cache turned on as the command line turns it on
(:func:`ipcjax.compilation_cache.enable_compilation_cache`, then ``jobs.cli.main``):
the first run compiles into the empty cache (cold), the second reads it back (warm).
Jobs: ``bag`` — ``ipcjax bag`` resumed from the tie checkpoint for 3 steps (its
summary.json's ``first_step_s`` and ``first_step_compilation_cache``); ``drape`` —
``ipcjax drape --steps 5`` (the dense path, no host callback). Timed: each process's
wall, and for the bag its first step. Prints JSON, with the entries the cache holds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = {
    "bag": ["bag", "--resume", "scenes/data/bag_full_tie.npz", "--until", "8.4125", "--mesh-every", "0",
            "--no-pictures"],
    "drape": ["drape", "--steps", "5"],
}
RUN = ("import sys; from ipcjax.compilation_cache import enable_compilation_cache; enable_compilation_cache(); "
       "from jobs.cli import main; sys.exit(main(sys.argv[1:]))")


def run_job(job, cache, out):
    argv = JOBS[job] + ["--out", out]
    env = {**os.environ, "IPCJAX_COMPILATION_CACHE": cache}
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", RUN, *argv], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{job} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    res = dict(process_wall_s=wall)
    summary = os.path.join(out, "summary.json")
    if job == "bag":
        with open(summary) as f:
            s = json.load(f)
        res.update(first_step_s=s["first_step_s"], first_step_compilation_cache=s["first_step_compilation_cache"],
                   wall_s=s["wall_s"])
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", default="bag,drape")
    ap.add_argument("--out", help="keep the run folders and caches here (default: a temporary folder)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        base = args.out or tmp
        result = {}
        for job in args.jobs.split(","):
            cache = os.path.join(base, f"cache_{job}")
            runs = {w: run_job(job, cache, os.path.join(base, f"{job}_{w}")) for w in ("cold", "warm")}
            entries = sorted(os.listdir(cache))
            result[job] = dict(runs, cache_entries=len(entries),
                               cache_mb=sum(os.path.getsize(os.path.join(cache, e)) for e in entries) / 1e6,
                               largest_entries=sorted(entries, key=lambda e: -os.path.getsize(os.path.join(cache, e)))[:5])
            print(json.dumps({job: result[job]}), file=sys.stderr, flush=True)
    out = dict(load_average=os.getloadavg(), jobs=result)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

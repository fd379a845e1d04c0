"""Is a change behaviour-neutral? The bag run of an earlier commit and of this working tree,
compared bit for bit.

    python3 benchmarks/same_trajectory.py --before 7d0b1ef [--coarse-until 2.0]

Runs ``ipcjax bag`` twice per tree, each in its own process with that tree first on
``sys.path``: the 481-vertex bag's first two steps (``--resolution full --until 0.00834``)
and the coarse bag from 0 to ``--coarse-until`` s. The earlier commit is checked out into a
temporary ``git worktree`` (removed afterwards). Prints JSON: per run whether film, spheres,
faces and time in trajectory.npz are bit-identical, and the largest difference if not.
Exit status 1 if any run differs or fails. Not part of ``run_all.py``: it is a check, and it
takes minutes (the coarse bag to 2.0 s is 480 steps per tree).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TWO_STEPS_S = 0.00834  # s: rounds to 2 steps of 1/240 s
KEYS = ("film", "spheres", "faces", "time")


def _cli_module(tree: str) -> str:
    """The command line's module in ``tree``: ``jobs.cli``, or ``ipcjax.cli`` in a tree from
    before #32 moved it. Chosen by the file, not by trying the import: the editable install
    would find this checkout's ``jobs`` for a tree that has none."""
    return "jobs.cli" if os.path.isfile(os.path.join(tree, "jobs", "cli.py")) else "ipcjax.cli"


def _run_bag(tree: str, out: str, resolution: str, until: float) -> None:
    code = (f"import sys; sys.path.insert(0, sys.argv[1]); from {_cli_module(tree)} import main; "
            "sys.exit(main(sys.argv[2:]))")
    argv = ["bag", "--resolution", resolution, "--until", repr(until), "--out", out,
            "--no-pictures", "--mesh-every", "0"]
    subprocess.run([sys.executable, "-c", code, tree, *argv], cwd=tree, check=True,
                   stdout=subprocess.DEVNULL)


def _compare(a: str, b: str) -> dict:
    A, B = np.load(os.path.join(a, "trajectory.npz")), np.load(os.path.join(b, "trajectory.npz"))
    out = {}
    for k in KEYS:
        same = A[k].shape == B[k].shape and np.array_equal(A[k], B[k])
        diff = float(np.max(np.abs(A[k] - B[k]))) if A[k].shape == B[k].shape else None
        out[k] = dict(identical=bool(same), shape=list(A[k].shape), max_abs_diff=diff)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="git revision to compare against")
    ap.add_argument("--coarse-until", type=float, default=2.0, help="end of the coarse run, s")
    args = ap.parse_args(argv)
    runs = {"full_2_steps": ("full", TWO_STEPS_S), "coarse": ("coarse", args.coarse_until)}
    report = dict(before=args.before, runs={})
    with tempfile.TemporaryDirectory() as tmp:
        old = os.path.join(tmp, "before")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", old, args.before], check=True)
        try:
            for name, (resolution, until) in runs.items():
                dirs = {tree: os.path.join(tmp, f"{name}_{tree}") for tree in ("before", "after")}
                _run_bag(old, dirs["before"], resolution, until)
                _run_bag(ROOT, dirs["after"], resolution, until)
                report["runs"][name] = dict(resolution=resolution, until_s=until,
                                            **_compare(dirs["before"], dirs["after"]))
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", old], check=False)
    report["identical"] = all(v["identical"] for r in report["runs"].values() for k, v in r.items() if k in KEYS)
    print(json.dumps(report, indent=1))
    return 0 if report["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Tests' wall time in two trees, each in its own process, alternated (issue #31).

    python3 benchmarks/ab_tests.py --before 028bed5 --rounds 1 NODE_ID [NODE_ID ...]

Checks out ``--before`` into a temporary worktree, then runs ``python3 -m pytest -q -n 0``
on the same node ids there and here, alternating, ``--rounds`` times, and prints each run's
wall time and the ratio after / before of the medians. Both runs must pass.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(tree: str, ids: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": tree}
    where = subprocess.run([sys.executable, "-c", "import ipcjax; print(ipcjax.__file__)"], cwd=tree, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.realpath(where).startswith(os.path.realpath(tree)), f"{tree} imports ipcjax from {where}"
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *ids],
                       cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"pytest failed in {tree} (exit {r.returncode}):\n{r.stdout[-3000:]}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the commit to compare with")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("ids", nargs="+")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = os.path.join(tmp, "before")
        subprocess.run(["git", "worktree", "add", "--detach", before, args.before], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            walls = {"before": [], "after": []}
            for i in range(args.rounds):
                for name, tree in (("before", before), ("after", ROOT)):
                    walls[name].append(timed(tree, args.ids))
                    print(f"round {i + 1} {name}: {walls[name][-1]:.1f} s", flush=True)
            b, a = statistics.median(walls["before"]), statistics.median(walls["after"])
            print(f"after / before = {a / b:.2f} ({a:.0f} s against {b:.0f} s, medians of {args.rounds})")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", before], cwd=ROOT, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

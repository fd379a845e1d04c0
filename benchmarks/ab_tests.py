"""Tests' wall time in two trees, each in its own process, alternated (issue #31).

    python3 benchmarks/ab_tests.py --before 028bed5 --rounds 1 NODE_ID [NODE_ID ...]

Checks out ``--before`` into a temporary worktree, then runs ``python3 -m pytest -q -n 0``
(``-n N`` with ``--workers N``, as the default suite runs: ``--workers 2 tests``) on the
same node ids there and here, alternating, ``--rounds`` times, and prints each run's wall
time and the ratio after / before of the medians. Both runs must pass. A node id whose
file one tree does not have (a test file moved or merged between the two) is left out of
that tree's runs, and the script says so: name both the old and the new file to compare
the same tests before and after a move.
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


def present(tree: str, ids: list[str]) -> list[str]:
    """The node ids whose test file exists in ``tree``."""
    return [i for i in ids if os.path.exists(os.path.join(tree, i.split("::")[0]))]


def timed(tree: str, ids: list[str], workers: int = 0) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": tree}
    where = subprocess.run([sys.executable, "-c", "import ipcjax; print(ipcjax.__file__)"], cwd=tree, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.realpath(where).startswith(os.path.realpath(tree)), f"{tree} imports ipcjax from {where}"
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", str(workers), "-p", "no:cacheprovider", *ids],
                       cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"pytest failed in {tree} (exit {r.returncode}):\n{r.stdout[-3000:]}")
    passed = [ln for ln in r.stdout.splitlines() if " passed" in ln]
    return wall, passed[-1].strip() if passed else "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the commit to compare with")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0, help="pytest-xdist workers (0: one process)")
    ap.add_argument("ids", nargs="+")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = os.path.join(tmp, "before")
        subprocess.run(["git", "worktree", "add", "--detach", before, args.before], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            runs = {"before": present(before, args.ids), "after": present(ROOT, args.ids)}
            for name, ids in runs.items():
                if not ids:
                    raise SystemExit(f"none of the node ids exists in the {name} tree")
                if len(ids) < len(args.ids):
                    print(f"{name}: left out (no such file there): {sorted(set(args.ids) - set(ids))}", flush=True)
            walls = {"before": [], "after": []}
            for i in range(args.rounds):
                for name, tree in (("before", before), ("after", ROOT)):
                    wall, summary = timed(tree, runs[name], args.workers)
                    walls[name].append(wall)
                    print(f"round {i + 1} {name}: {wall:.1f} s ({summary})", flush=True)
            b, a = statistics.median(walls["before"]), statistics.median(walls["after"])
            print(f"after / before = {a / b:.2f} ({a:.0f} s against {b:.0f} s, medians of {args.rounds})")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", before], cwd=ROOT, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

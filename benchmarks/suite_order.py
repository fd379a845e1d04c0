"""How long the default suite's two workers take under two orders of its test files, from
one run's durations (issue #31; docs/tests.md "Keep the slowest files first").

    python3 -m pytest -q -p no:cacheprovider --durations=80 > durations.log
    python3 benchmarks/suite_order.py durations.log

The suite runs each test file whole in one of two xdist workers (``--dist loadfile``).
xdist hands the files out in a queue; each worker holds the file it runs and one more, and
takes the next from the queue when it starts its last one. This script replays that queue
on the seconds of each file (the durations the log lists, summed per file, plus
``--other`` seconds for each test the log leaves out) for two orders:

* xdist's own (``--loadscope-reorder``): the files with the most tests first;
* this suite's (``--no-loadscope-reorder``): the collection order of tests/conftest.py,
  the files of ``HEAVY_FIRST`` first.

It prints each worker's busy seconds and the larger of the two (the suite's wall time in
this model) for both. The files and their test counts come from ``pytest --collect-only``
in this tree. The model leaves out start-up and the workers' effect on each other: the
durations were measured with both workers running, so it holds for the same machine.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def durations(log: str) -> tuple[collections.Counter, collections.Counter]:
    """Seconds per file (call, setup and teardown summed) and the tests listed per file."""
    secs, tests = collections.Counter(), collections.Counter()
    for line in open(log):
        m = re.match(r"\s*([\d.]+)s (call|setup|teardown)\s+(\S+?)::", line)
        if m:
            secs[m.group(3)] += float(m.group(1))
            tests[m.group(3)] += m.group(2) == "call"
    if not secs:
        raise SystemExit(f"{log}: no durations (run pytest with --durations=N and save its output)")
    return secs, tests


def collection() -> list[str]:
    """The default suite's test ids in this tree's collection order (conftest's included)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"],
                       cwd=ROOT, capture_output=True, text=True)
    ids = [ln.strip() for ln in r.stdout.splitlines() if "::" in ln]
    if r.returncode != 0 or not ids:
        raise SystemExit(f"pytest --collect-only failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return ids


def makespan(queue: list[str], seconds: dict[str, float], workers: int = 2) -> list[float]:
    """Each worker's busy seconds when ``queue`` is handed out as xdist's loadfile does."""
    queue = list(queue)
    held = [[] for _ in range(workers)]
    busy = [0.0] * workers
    for w in range(workers):           # one file each, then a second each
        if queue:
            held[w].append(queue.pop(0))
    for w in range(workers):
        if queue:
            held[w].append(queue.pop(0))
    while any(held):
        w = min((k for k in range(workers) if held[k]), key=lambda k: busy[k])
        busy[w] += seconds[held[w].pop(0)]
        if len(held[w]) <= 1 and queue:
            held[w].append(queue.pop(0))
    return busy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="the output of pytest --durations=N")
    ap.add_argument("--other", type=float, default=0.6,
                    help="seconds for each collected test the log does not list (default 0.6)")
    args = ap.parse_args()
    secs, listed = durations(args.log)
    ids = collection()
    count = collections.Counter(i.split("::")[0] for i in ids)
    files = list(dict.fromkeys(i.split("::")[0] for i in ids))   # this tree's order
    seconds = {f: secs[f] + args.other * max(0, count[f] - listed[f]) for f in files}
    xdist = sorted(sorted(files), key=lambda f: -count[f])         # most tests first, ties by path
    print(f"{len(ids)} tests in {len(files)} files, {sum(seconds.values()):.0f} s in all")
    for name, order in (("xdist's order (most tests first)", xdist), ("this suite's order (conftest)", files)):
        busy = makespan(order, seconds)
        print(f"{name}: workers busy {', '.join(f'{b:.0f}' for b in busy)} s; wall {max(busy):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

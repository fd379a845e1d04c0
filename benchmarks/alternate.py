"""Before/after runs for the A/B scripts: an earlier commit in a temporary ``git worktree``
and this tree, each run in its own process, alternated round by round."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def before_tree(rev):
    """Yields (a temporary folder, the checkout of ``rev`` inside it); both are removed after."""
    with tempfile.TemporaryDirectory() as tmp:
        old = os.path.join(tmp, "before")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", old, rev], check=True)
        try:
            yield tmp, old
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", old], check=False)


def add_tree_arguments(ap, what: str) -> None:
    """The flags of a script that measures one tree or compares two: ``--tree`` (the
    checkout whose ``what`` it measures), ``--before REV`` and ``--rounds``."""
    ap.add_argument("--tree", default=ROOT, help=f"the checkout whose {what} (default: this one)")
    ap.add_argument("--before", help="git revision: compare its library with this tree's, each in its own process")
    ap.add_argument("--rounds", type=int, default=2, help="with --before: alternated rounds")


def last_json_line(stdout: str):
    return json.loads(stdout.strip().splitlines()[-1])


def report_json(out: dict, path=None) -> None:
    """Write ``out`` to ``path`` (when given) and print it, less its ``runs``, as the last
    line (what :func:`last_json_line` reads)."""
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}))


def alternate(old, rounds, argv_of, *, parse=last_json_line, report=None, env_of=None):
    """Runs ``python3 *argv_of(tree, root, k)`` from ROOT for k in range(rounds), the tree
    "before" (root ``old``) then "after" (root ROOT); a failed run stops with its stderr.
    Returns {"before": [parse(stdout), …], "after": […]}; ``report(tree, k, result)`` after
    each run. ``env_of(tree)``, when given, is the environment of that tree's runs (else
    this process's)."""
    runs = {"before": [], "after": []}
    for k in range(rounds):
        for tree, root in (("before", old), ("after", ROOT)):
            r = subprocess.run([sys.executable, *argv_of(tree, root, k)], capture_output=True, text=True, cwd=ROOT,
                               env=None if env_of is None else env_of(tree))
            if r.returncode != 0:
                raise SystemExit(f"{tree} round {k} failed:\n{r.stderr[-3000:]}")
            runs[tree].append(parse(r.stdout))
            if report is not None:
                report(tree, k, runs[tree][-1])
    return runs

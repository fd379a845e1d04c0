"""Where a test's time goes: XLA compiling, JAX tracing and lowering, or running (issue #31;
docs/benchmarks.md "The test suite").

Runs the given tests in this one process (``pytest -n 0``) with a plugin that sums JAX's own
monitoring events per test: ``backend_compile_duration`` (XLA compiling a program),
``jaxpr_trace_duration`` + ``jaxpr_to_mlir_module_duration`` (tracing and lowering); the rest
of the test's wall time is running, Python and I/O. Prints one line per test, slowest first,
and the totals; ``--programs N`` adds each test's N longest compilations by function name;
``--json`` writes the per-test figures.

    python3 benchmarks/compile_share.py tests/test_fitting.py "tests/test_implicit.py::test_backward_solve_with_too_few_active_rows_refuses"
    python3 -m pytest -q -n 0 --durations=40 > durations.txt
    python3 benchmarks/compile_share.py --slowest 27 durations.txt   # the 27 slowest of that listing

With JAX's persistent compilation cache on (``JAX_COMPILATION_CACHE_DIR``), it also prints
how many compilations the cache served.

A test that starts a subprocess (the sharded sweep, some command-line jobs) compiles there,
where this process cannot see it: its time counts as running.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMPILE = "/jax/core/compile/backend_compile_duration"
TRACE = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")


class CompileShare:
    """A pytest plugin: per test, the seconds in each JAX compile phase and the wall time."""

    def __init__(self):
        import jax

        self.current, self.rows, self.cache = None, {}, {"requests": 0, "hits": 0}
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        jax.monitoring.register_event_listener(self._cache_event)

    def _cache_event(self, event, **_):
        if event == "/jax/compilation_cache/compile_requests_use_cache":
            self.cache["requests"] += 1
        elif event == "/jax/compilation_cache/cache_hits":
            self.cache["hits"] += 1

    def _listen(self, event, secs, fun_name="", **_):
        if self.current is None:
            return
        row = self.rows.setdefault(self.current, {"compile_s": 0.0, "compilations": 0, "trace_s": 0.0})
        if event == COMPILE:
            row["compile_s"] += secs
            row["compilations"] += 1
            row.setdefault("programs", []).append((secs, fun_name))
        elif event in TRACE:
            row["trace_s"] += secs

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.current, t = item.nodeid, time.perf_counter()
        self.rows.setdefault(item.nodeid, {"compile_s": 0.0, "compilations": 0, "trace_s": 0.0})
        yield
        self.rows[item.nodeid]["wall_s"] = time.perf_counter() - t
        self.current = None


def node_ids(path: str, n: int) -> list[str]:
    """The first ``n`` node ids of a ``pytest --durations`` listing."""
    ids = []
    for ln in open(path):
        m = re.match(r"\s*[0-9.]+s\s+(?:call|setup|teardown)\s+(\S.*?)\s*$", ln)
        if m and m.group(1) not in ids:
            ids.append(m.group(1))
    return ids[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tests", nargs="+", help="test node ids or files (or, with --slowest, one --durations listing)")
    ap.add_argument("--slowest", type=int, default=None, help="read the first N node ids of a --durations listing")
    ap.add_argument("--json", default=None, help="write the per-test figures here")
    ap.add_argument("--programs", type=int, default=0,
                    help="also list each test's N longest compilations (seconds, function name)")
    args = ap.parse_args()
    ids = node_ids(args.tests[0], args.slowest) if args.slowest else args.tests
    os.chdir(ROOT)
    sys.path.insert(0, ROOT)
    plugin = CompileShare()
    rc = pytest.main(["-q", "-n", "0", "-p", "no:cacheprovider", *ids], plugins=[plugin])
    rows = sorted(plugin.rows.items(), key=lambda kv: -kv[1].get("wall_s", 0.0))
    tot = {"wall_s": 0.0, "compile_s": 0.0, "trace_s": 0.0, "compilations": 0}
    print(f"{'wall s':>8} {'compile s':>10} {'(n)':>6} {'trace s':>8} {'other s':>8}  test")
    for nodeid, r in rows:
        w = r.get("wall_s", 0.0)
        for k in tot:
            tot[k] += r.get(k, 0.0) if k != "compilations" else r["compilations"]
        print(f"{w:8.1f} {r['compile_s']:10.1f} {r['compilations']:6d} {r['trace_s']:8.1f} "
              f"{w - r['compile_s'] - r['trace_s']:8.1f}  {nodeid}")
        for secs, name in sorted(r.get("programs", []), reverse=True)[:args.programs]:
            print(f"{'':>8} {secs:10.1f} {'':>6}   compiling {name}")
    w = tot["wall_s"] or 1.0
    print(f"total: {tot['wall_s']:.0f} s wall; XLA compiling {tot['compile_s']:.0f} s ({tot['compile_s'] / w:.0%}) "
          f"in {tot['compilations']} compilations; tracing and lowering {tot['trace_s']:.0f} s "
          f"({tot['trace_s'] / w:.0%}); the rest {w - tot['compile_s'] - tot['trace_s']:.0f} s")
    if plugin.cache["requests"]:
        print(f"persistent compilation cache: {plugin.cache['hits']} hits of {plugin.cache['requests']} "
              "compilations that looked it up")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows), f, indent=1)
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())

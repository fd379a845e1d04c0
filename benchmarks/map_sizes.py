"""How many memory mappings compiled programs hold (issue #31; docs/benchmarks.md "Many
compilations in one process").

In this one process: 200 distinct small jitted programs (mappings per program, and what
``jax.clear_caches()`` gives back); then a 4 × 4 drape of 2 steps with the dense solver and
the same drape with the CG solver, each with the mappings it added by permission
(``r-xp``: executable code pages, one per compiled kernel), its compilations and the largest
growth of one compilation (:mod:`ipcjax.compile_guard`). Then the dense drape again in a
child process with ``XLA_FLAGS=--xla_cpu_parallel_codegen_split_count=1``, to see whether
XLA's code splitting sets the count.

    python3 benchmarks/map_sizes.py
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.many_jobs import drape  # noqa: E402
from ipcjax import compile_guard  # noqa: E402


def by_permission() -> Counter:
    c = Counter()
    with open("/proc/self/maps") as f:
        for ln in f:
            p = ln.split()
            c[p[1] + (" file" if len(p) > 5 else "")] += 1
    return c


def measured(what, job) -> None:
    c0, s0 = by_permission(), compile_guard.stats()
    job()
    c1, s1 = by_permission(), compile_guard.stats()
    delta = {k: c1[k] - c0[k] for k in sorted(c1) if c1[k] != c0[k]}
    print(f"{what}: +{sum(c1.values()) - sum(c0.values()):,} mappings in {s1['compiles'] - s0['compiles']} "
          f"compilations (largest growth of one so far {s1['largest_growth']:,}); anonymous r-xp "
          f"+{delta.get('r-xp', 0):,}; by permission {delta}", flush=True)


def small_programs(n=200):
    for i in range(n):
        jax.jit(lambda x, i=i: jnp.sin(x * i) + jnp.cumsum(x) ** 2)(jnp.ones(10 + i)).block_until_ready()


def main() -> int:
    if sys.argv[1:] == ["--child"]:
        measured("drape 4², 2 steps, dense", lambda: drape(4, 2, "dense"))
        return 0
    before = compile_guard.map_use().count
    measured("200 small programs", small_programs)
    held = compile_guard.map_use().count
    print(f"  {(held - before) / 200:.2f} mappings per small program", flush=True)
    jax.clear_caches()
    gc.collect()
    print(f"  jax.clear_caches(): {held:,} → {compile_guard.map_use().count:,} mappings", flush=True)
    measured("drape 4², 2 steps, dense", lambda: drape(4, 2, "dense"))
    measured("drape 4², 2 steps, cg (after the dense one)", lambda: drape(4, 2, "cg"))
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_parallel_codegen_split_count=1")
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=1800)
    print("child with --xla_cpu_parallel_codegen_split_count=1:", r.stdout.strip() or r.stderr[-2000:])
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())

"""Reproduce the crash of issue #31 and show the guard that prevents it (ipcjax.compile_guard).

XLA's CPU compiler keeps each compiled program's code in memory mappings of its own; at the
kernel's cap ``vm.max_map_count`` the next compilation dies inside LLVM ("Cannot allocate
memory", then SIGSEGV or SIGABRT). This script compiles ``--programs`` distinct small
programs in a child process, three ways, and reports how each child ended:

* ``off``: the guard's compile listener removed, nothing freed: the crash;
* ``listener``: the listener installed by ``import ipcjax`` only: a MapLimitError, a Python
  error that names the cap, in place of the crash;
* ``release``: ``compile_guard.release_if_crowded()`` between programs, as the library's jobs
  and the test suite call it: every program compiled, no crash.

The default cap is 65,530 and a crash there takes some 20,000 programs; ``--cap N`` lowers
it for the run (root only; it is put back afterwards), so that the crash comes in seconds::

    sudo python3 benchmarks/map_exhaustion.py --cap 1500 --programs 600

Without root it runs at the machine's cap and prints the mappings gained per program.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAP = "/proc/sys/vm/max_map_count"

CHILD = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp
    from jax import monitoring
    from ipcjax import compile_guard as g
    mode, n = sys.argv[1], int(sys.argv[2])
    if mode == "off":
        monitoring.unregister_event_duration_listener(g._after_compile)
    first = g.map_use()
    print("start", first.count, first.limit, flush=True)
    for i in range(n):
        if mode == "release":
            g.release_if_crowded()
        f = jax.jit(lambda x, i=i: jnp.sin(x * i) + jnp.cumsum(x) ** 2)
        try:
            f(jnp.ones(8 + i)).block_until_ready()
        except g.MapLimitError as e:
            print("MapLimitError after", i, "programs:", str(e)[:160], flush=True)
            sys.exit(3)
        if (i + 1) % 50 == 0:
            print("programs", i + 1, "maps", g.map_use().count, flush=True)
    print("done", n, "programs; maps", g.map_use().count, "releases", g.stats()["releases"], flush=True)
""")


@contextlib.contextmanager
def lowered_cap(cap: int | None):
    """vm.max_map_count set to ``cap`` inside the block (root only: without it, Python's
    PermissionError), the machine's own value put back after; None changes nothing.
    Yields the machine's own value."""
    with open(CAP) as f:
        old = int(f.read())
    if cap is not None:
        with open(CAP, "w") as f:
            f.write(str(cap))
    try:
        yield old
    finally:
        if cap is not None:
            with open(CAP, "w") as f:
                f.write(str(old))


def run_child(mode: str, programs: int) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(programs)], cwd=ROOT,
                       capture_output=True, text=True, timeout=1800)
    lines = r.stdout.strip().splitlines()
    err = [ln for ln in r.stderr.splitlines() if "LLVM" in ln or "Cannot allocate" in ln or "ipcjax:" in ln]
    return {"mode": mode, "rc": r.returncode, "last": lines[-1] if lines else "", "start": lines[0] if lines else "",
            "stderr": err[:2], "trace": lines}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=600, help="distinct programs each child compiles")
    ap.add_argument("--cap", type=int, default=None, help="vm.max_map_count for the run (root; restored after)")
    ap.add_argument("--modes", default="off,listener,release")
    args = ap.parse_args(argv)
    with lowered_cap(args.cap) as old:
        results = [run_child(m, args.programs) for m in args.modes.split(",")]
    cap = args.cap if args.cap is not None else old
    print(f"vm.max_map_count {cap:,} (machine's own {old:,}); {args.programs} programs per child")
    for r in results:
        how = {0: "finished", 3: "MapLimitError"}.get(r["rc"], f"died (exit status {r['rc']})")
        print(f"  {r['mode']:9s} {how:26s} {r['last']}")
        for ln in r["stderr"]:
            print(f"  {'':9s} stderr: {ln.strip()[:150]}")
    for r in results:
        if r["mode"] == "off":
            pts = [ln.split() for ln in r["trace"] if ln.startswith("programs")]
            if len(pts) >= 2:
                (_, a, _, ma), (_, b, _, mb) = pts[0], pts[-1]
                per = (int(mb) - int(ma)) / (int(b) - int(a))
                base = int(r["start"].split()[1])
                print(f"  mappings per program {per:.2f}; at the default cap 65,530 the crash "
                      f"comes after about {(65530 - base) / per:,.0f} such programs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

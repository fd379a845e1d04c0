"""A guard for long processes that compile many programs: XLA's CPU compiler and the
kernel's limit on memory mappings (issue #31, docs/benchmarks.md "Many compilations in one
process").

What goes wrong without it. XLA's CPU backend places the machine code of every compiled
program in memory mappings of its own: three for a small program, more for a large one.
JAX keeps a compiled program for as long as the function it was compiled for is alive, up to
4096 programs per function, and never frees it otherwise. A process that compiles program
after program (a notebook running fit after fit, a sweep, a test suite in one process)
therefore gains mappings without end. Linux caps the mappings of one process at
``vm.max_map_count`` (65,530 by default). At the cap, the next mapping XLA's JIT asks for
fails, and the process dies inside the compiler: ``LLVM compilation error: Cannot allocate
memory``, then a segmentation fault or an abort, with no Python traceback (likely the
crash of JAX issue 27201 upstream). ``benchmarks/map_exhaustion.py`` reproduces it in a few seconds at a lowered
cap, and shows the guard keeping the same sequence of compilations alive.

What the guard does.

* :func:`release_if_crowded` is called by the library's jobs before they compile: each
  :func:`ipcjax.step.simulate`, each fit (:func:`fitting.fit.fit_measured`, which
  :func:`fitting.fit.fit` calls), each bag and drape run (:mod:`scenes.bag_run`,
  :mod:`scenes.drape_run`), and the test suite before each test (``tests/conftest.py``).
  When the process holds more than :data:`RELEASE_FRACTION` of the cap, it calls :func:`jax.clear_caches`, which frees every
  compiled program JAX holds (each is compiled again on its next use), and says so once on
  stderr with the figures. Nothing is cleared while a program compiles or runs.
* :func:`install` registers a listener on JAX's backend-compile event (the package does it
  on import; it changes no JAX setting). After each compilation it counts the mappings. When
  the room left is less than twice the largest growth one compilation has shown (and at least
  :data:`MIN_ROOM_FRACTION` of the cap), it raises :class:`MapLimitError`: a Python error
  that names the cap and what to do, in place of a dead process. It cannot free programs
  itself, because JAX's caches are in use during a compilation.

A count reads ``/proc/self/maps``: about 1 ms at 500 mappings, 15 ms at 30,000 (this
machine), once per compilation and once per job.

The cap can be raised by an administrator: ``sysctl -w vm.max_map_count=262144``. On a
system without ``/proc`` (not Linux) the guard does nothing.
"""
from __future__ import annotations

import sys
from typing import NamedTuple

#: The share of vm.max_map_count above which release_if_crowded frees JAX's compiled programs.
RELEASE_FRACTION = 0.5
#: The share of vm.max_map_count the compile listener keeps free at the least (1,311 of 65,530).
MIN_ROOM_FRACTION = 0.02

_MAPS = "/proc/self/maps"
_LIMIT = "/proc/sys/vm/max_map_count"
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"

_state = {"installed": False, "last": None, "largest_growth": 0, "releases": 0, "compiles": 0,
          "peak": 0, "warned": False}


class MapUse(NamedTuple):
    """Memory mappings of this process (``count``) and the kernel's cap (``limit``)."""
    count: int
    limit: int


class MapLimitError(RuntimeError):
    """This process is about to reach vm.max_map_count, where XLA's CPU compiler crashes."""


def map_use() -> MapUse | None:
    """The process's memory mappings and the cap on them, or None where /proc cannot tell."""
    try:
        with open(_LIMIT, "rb") as f:
            limit = int(f.read().strip())
        count = 0
        with open(_MAPS, "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                count += chunk.count(b"\n")
    except (OSError, ValueError):
        return None
    return MapUse(count, limit)


def release_if_crowded(fraction: float = RELEASE_FRACTION, *, use: MapUse | None = None) -> bool:
    """Free JAX's compiled programs when the process holds more than ``fraction`` of
    vm.max_map_count. Returns whether it did. Call it between programs, never inside a
    traced function; ``use`` overrides the measurement (for tests)."""
    use = map_use() if use is None else use
    if use is None or use.count <= fraction * use.limit:
        return False
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
    _state["releases"] += 1
    after = map_use()
    _state["last"] = after.count if after else None  # the next growth counts from here
    if not _state["warned"]:
        _state["warned"] = True
        print(f"ipcjax: this process held {use.count:,} memory mappings, more than "
              f"{fraction:.0%} of vm.max_map_count ({use.limit:,}), where XLA's CPU compiler "
              f"crashes; freed JAX's compiled programs ({after.count if after else '?'} mappings "
              "now; each is compiled again on next use). Raise the cap with "
              "`sysctl -w vm.max_map_count=262144` to keep them (ipcjax.compile_guard).",
              file=sys.stderr)
    return True


def _after_compile(event: str, duration: float, **_) -> None:
    if event != _BACKEND_COMPILE:
        return
    _state["compiles"] += 1
    use = map_use()
    if use is None:
        return
    last = _state["last"]
    if last is not None and use.count > last:
        _state["largest_growth"] = max(_state["largest_growth"], use.count - last)
    _state["last"] = use.count
    _state["peak"] = max(_state["peak"], use.count)
    room = use.limit - use.count
    need = max(MIN_ROOM_FRACTION * use.limit, 2 * _state["largest_growth"])
    if room < need:
        raise MapLimitError(
            f"this process holds {use.count:,} memory mappings of the {use.limit:,} that "
            "vm.max_map_count allows; XLA's CPU compiler crashes the process when it runs out "
            f"(one compilation here has taken up to {_state['largest_growth']:,}). Call "
            "ipcjax.compile_guard.release_if_crowded() or jax.clear_caches() between jobs to "
            "free compiled programs, or raise the cap: sysctl -w vm.max_map_count=262144.")


def install() -> None:
    """Register the compile listener (once per process; see the module docstring)."""
    if _state["installed"]:
        return
    from jax import monitoring

    monitoring.register_event_duration_secs_listener(_after_compile)
    _state["installed"] = True


def stats() -> dict:
    """Compilations seen, releases made, the most mappings counted after a compilation and
    the largest growth in mappings of one compilation."""
    return {k: _state[k] for k in ("compiles", "releases", "peak", "largest_growth")}

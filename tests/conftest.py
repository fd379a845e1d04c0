"""Test configuration: every test runs in float64 (derivative comparisons need it), the
command-line jobs the tests start write no persistent compilation cache into the user's
home (tests/test_compile_cache.py sets its own folders), XLA compiles with its older CPU
kernel emitter (below), and before each test (before its fixtures) the library's guard
frees compiled programs when the process holds too many memory mappings."""
import os

# Most of the suite's time is XLA compiling (docs/benchmarks.md "The test suite"). With
# XLA's older CPU kernel emitter the same programs compile in about 0.7 of the time and
# gave the same bits; the library does not set it for its users, because the
# bag's stepping ran 1.12x slower under it (docs/benchmarks.md "The older kernel emitter").
# Set before JAX starts its backends (XLA reads XLA_FLAGS once, then); inherited by the
# xdist workers and the jobs the tests start; an XLA_FLAGS that names the flag wins
# (``=true``: XLA's default emitters, docs/tests.md).
FAST_COMPILE_FLAG = "--xla_cpu_use_fusion_emitters=false"
if "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAG}".strip()

import jax  # noqa: E402
import pytest

from ipcjax import compile_guard  # noqa: E402

os.environ.setdefault("IPCJAX_COMPILATION_CACHE", "off")

jax.config.update("jax_enable_x64", True)


#: The test files that take longest, slowest first: each worker gets one of them while the
#: other works through the rest, so that neither is left with a heavy file at the end. The
#: seconds: each file's tests summed from ``python3 -m pytest -q -p no:cacheprovider
#: --durations=0`` at 1adfd08 (stop 60's machine, 2026-12-07, 669 passed in 17 min 58 s),
#: less the dense whole-step test of tests/test_newton_tangent.py moved to the slow tests
#: since (53 s). docs/tests.md "Keeping the suite fast". A stale order costs only time:
#: every collected test still runs.
HEAVY_FIRST = (
    "tests/test_sparse.py",            # 397 s
    "tests/test_step.py",              # 271 s
    "tests/test_implicit.py",          # 189 s
    "tests/test_readme.py",            # 180 s
    "tests/test_newton_tangent.py",    # 158 s
    "tests/test_layers_gradient.py",   # 154 s
    "tests/test_rollout_failures.py",  # 128 s
    "tests/test_cli.py",               # 103 s
    "tests/test_bag_fit.py",           # 74 s
    "tests/test_candidates.py",        # 51 s
    "tests/test_bag.py",               # 51 s
)


def pytest_collection_modifyitems(items):
    """Run the files of HEAVY_FIRST first, in that order; the others after them in
    collection order, each file's tests in their own order.

    The suite runs with ``--dist loadfile --no-loadscope-reorder`` (pyproject.toml): each
    file goes whole to one of the two workers, in this order. pytest-xdist's own order
    (files with the most tests first) left the files with two or three long tests for
    the end, where one worker ran them while the other had finished."""
    rank = {f: i for i, f in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(HEAVY_FIRST)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Between tests, the library's guard frees JAX's compiled programs when the process
    holds more than half of vm.max_map_count (ipcjax.compile_guard, issue #31).

    A hook that runs before any of the test's fixtures is set up, not an autouse fixture:
    pytest sets up module-scoped fixtures before function-scoped ones, so a release from a
    fixture came after a module fixture had compiled what its tests need, and threw that
    away (a hypothesis example then spent its deadline recompiling)."""
    compile_guard.release_if_crowded()


def pytest_terminal_summary(terminalreporter, config):
    """One line on the compile guard: how many programs this process compiled, the most
    memory mappings it held after one, and how often the guard freed them. Under xdist the
    tests compile in the workers, whose figures this process cannot see: the line says so."""
    workers = config.getoption("numprocesses", None)
    if workers not in (None, 0, "0"):
        terminalreporter.write_line(f"compile guard: on in each of the {workers} worker processes "
                                    "(its figures print with -n 0)")
        return
    s, use = compile_guard.stats(), compile_guard.map_use()
    if use is not None:
        terminalreporter.write_line(
            f"compile guard: {s['compiles']} compilations, at most {s['peak']:,} memory mappings "
            f"of vm.max_map_count {use.limit:,}, {s['releases']} releases")

"""JAX's persistent compilation cache for the command-line jobs: compile once per machine.

The jobs (``ipcjax bag``, ``drape``, ``fit``, ``compare``) call
:func:`enable_compilation_cache` before they compile anything; the library never turns it
on at import, so a program that uses ipcjax keeps its own JAX settings. Where it lives:

* ``$IPCJAX_COMPILATION_CACHE`` when set: a folder, or ``0`` / ``off`` / ``false`` / ``no``
  / ``none`` to run without the cache;
* otherwise ``$JAX_COMPILATION_CACHE_DIR`` when the user set JAX's own variable;
* otherwise ``$XDG_CACHE_HOME/ipcjax/jax``, i.e. ``~/.cache/ipcjax/jax``.

Deleting the folder empties it; JAX keys every entry by the program, the JAX and jaxlib
versions, the backend and the compile options, so an entry is never used for anything
but the program that wrote it. The cache writes programs whose compilation took at least
:data:`MIN_COMPILE_TIME_S`; a smaller program recompiles in less time than a job notices.

What it cannot hold: JAX (0.10) writes no entry for a program with a host callback. The
bag's step on the sparse path (``linear_solver="sparse"``) solves for its direction by a
custom call (:mod:`ipcjax.cholmod_ffi`), not a callback, so it is cached like the dense
and CG steps; where that call cannot be built the step calls the host
(``jax.pure_callback``, :mod:`ipcjax.ldl`) and compiles in every process, as do rollout
gradients on the sparse path (the exact implicit Hessian's LDLᵀ is on the host). A folder
that cannot be created or written leaves the job running without the cache, with one line
on stderr saying so; a failed read or write of an entry is JAX's warning, and the program
is compiled as without a cache.
"""
from __future__ import annotations

import os
import sys

ENV = "IPCJAX_COMPILATION_CACHE"
#: jax_persistent_cache_min_compile_time_secs: the programs worth an entry (JAX's default is 1 s).
MIN_COMPILE_TIME_S = 0.5
_OFF = {"0", "off", "false", "no", "none"}

_counts = {"requests": 0, "hits": 0, "misses": 0}
_listening = False


def cache_dir(environ=None) -> str | None:
    """The folder the jobs cache compiled programs in, or None when it is switched off
    (see the module docstring for the variables read)."""
    env = os.environ if environ is None else environ
    value = env.get(ENV)
    if value is not None:
        value = value.strip()
        return None if value.lower() in _OFF or not value else os.path.abspath(os.path.expanduser(value))
    if env.get("JAX_COMPILATION_CACHE_DIR"):
        return env["JAX_COMPILATION_CACHE_DIR"]
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ipcjax", "jax")


def _count(event: str, **_):
    if event == "/jax/compilation_cache/compile_requests_use_cache":
        _counts["requests"] += 1
    elif event == "/jax/compilation_cache/cache_hits":
        _counts["hits"] += 1
    elif event == "/jax/compilation_cache/cache_misses":
        _counts["misses"] += 1


def counts() -> dict:
    """Compilations in this process since the cache was enabled: ``requests`` (every
    compilation while the cache is on), ``hits`` (read back from the cache) and ``misses``
    (looked up, not found). A program with a host callback is a request that is neither a
    hit nor a miss: it is compiled, and not written. So requests − hits were compiled."""
    return dict(_counts)


def enable_compilation_cache(path: str | None = None, *, min_compile_time_s: float = MIN_COMPILE_TIME_S,
                             quiet: bool = False) -> str | None:
    """Turn on JAX's persistent compilation cache in ``path`` (default :func:`cache_dir`).

    Also sets ``JAX_COMPILATION_CACHE_DIR`` and ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``
    in the environment, so that worker processes the job starts (the bag fit's node runs)
    use the same cache. Returns the folder, or None when the cache is off or the folder
    cannot be written (then one line on stderr, unless ``quiet``).
    """
    import jax

    global _listening
    path = cache_dir() if path is None else path
    if path is None:
        return None
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write-test-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        if not quiet:
            print(f"ipcjax: compilation cache off: cannot write {path} ({e.strerror or e}); "
                  f"set {ENV} to another folder, or to 0", file=sys.stderr)
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(float(min_compile_time_s))
    try:  # JAX decides once per process whether to use the cache; let it decide again
        from jax._src import compilation_cache as _cc
        _cc.reset_cache()
    except (ImportError, AttributeError):
        pass
    if not _listening:
        jax.monitoring.register_event_listener(_count)
        _listening = True
    return path

"""XLA's CPU threads for the command-line jobs: Eigen's kernels run on one thread (issue #30).

A bag step runs many small XLA kernels in every Newton iteration. XLA's CPU runtime hands
pieces of them to Eigen's threads; for kernels this small that costs more than the second
core gives back. With :data:`FLAGS` the whole bag protocol
stepped in 0.90 of the time per step (0.75–0.92 in three pairs, with the machine's load),
with the same Newton iterations and the last frame the same bit for bit
(docs/benchmarks.md, "One XLA thread per program", with the command that measures it).

Every job (``jobs.cli.main``) calls :func:`single_threaded_xla` before JAX starts its
backend. The library never sets it at import: a program that uses
ipcjax keeps its own XLA settings, and can set the same flags itself::

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false" python3 my_script.py

The flags were measured with a second word, ``intra_op_parallelism_threads=1``, a setting
often quoted for JAX that is not an XLA flag. XLA's parser stops at the first word of
``XLA_FLAGS`` that does not start with ``--`` and silently ignores it and every flag after
it (``--xla_force_host_platform_device_count=2`` after it gave one device; an unknown
``--xla_`` flag after it raised no error). It came last, so it changed nothing, and it is
gone: the measured runs had the same flags in effect. :func:`with_flags` refuses such a word
(docs/benchmarks.md, "One XLA thread per program").

What decides:

* ``$IPCJAX_XLA_THREADS``: ``single`` (the default) adds the flags, ``default`` leaves
  XLA's own threading; anything else is an error that names the variable.
* A flag that ``$XLA_FLAGS`` already names keeps the user's value.
* XLA reads ``XLA_FLAGS`` once, when JAX starts its backend. A job started after that in
  the same process (a test or a notebook that calls ``jobs.cli.main``) runs with the
  threading that process already has, and :func:`single_threaded_xla` says so in its
  return value.
"""
from __future__ import annotations

import os

ENV = "IPCJAX_XLA_THREADS"

#: The XLA flags of one thread per program, name → value.
FLAGS = {"--xla_cpu_multi_thread_eigen": "false"}


def check_xla_flags(xla_flags: str) -> None:
    """Refuse an ``XLA_FLAGS`` value that XLA would read only in part.

    XLA parses ``XLA_FLAGS`` word by word and stops at the first word that does not start
    with ``--``: that word and every flag after it are ignored, with no message (as the
    first word, XLA takes it for a file of flags). So a flag added after it, here or by a
    worker process, would never apply.

    Raises:
        ValueError: a word that does not start with ``--``, naming it and the flags XLA
            would ignore.
    """
    words = xla_flags.split()
    for i, word in enumerate(words):
        if not word.startswith("--"):
            raise ValueError(
                f"XLA_FLAGS word {word!r} does not start with '--': XLA stops reading XLA_FLAGS there and "
                f"ignores it and every flag after it ({' '.join(words[i + 1:]) or 'none yet'}); "
                "remove it, or write it as --NAME=VALUE if it is an XLA flag (intra_op_parallelism_threads=1, "
                "often quoted for JAX, is not one)")


def with_flags(xla_flags: str) -> str:
    """``xla_flags`` (an ``XLA_FLAGS`` value) with each of :data:`FLAGS` appended as
    ``name=value``, unless it names that flag already.

    Raises:
        ValueError: ``xla_flags`` holds a word that XLA would stop at
            (:func:`check_xla_flags`), so the flags appended would not apply.
    """
    check_xla_flags(xla_flags)
    named = {item.split("=", 1)[0] for item in xla_flags.split()}
    extra = [f"{name}={value}" for name, value in FLAGS.items() if name not in named]
    return " ".join([*xla_flags.split(), *extra])


def _backend_started() -> bool:
    """Whether JAX has started its backend in this process (then XLA_FLAGS was read)."""
    try:
        from jax._src import xla_bridge
        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # another JAX: assume it has, so nothing is claimed
        return True


def single_threaded_xla(environ=None) -> str:
    """Give XLA's CPU programs one thread each, for the jobs (see the module docstring).

    Returns what holds now: ``"single"`` (the flags are in ``XLA_FLAGS`` for this process
    and the workers it starts), ``"default"`` (``IPCJAX_XLA_THREADS=default``: XLA's own
    threading) or ``"unchanged"`` (JAX's backend had started before, so XLA keeps the
    threading it started with; the flags are not added).

    Raises:
        ValueError: ``IPCJAX_XLA_THREADS`` is neither ``single`` nor ``default``, or
            ``XLA_FLAGS`` holds a word XLA would stop at (:func:`check_xla_flags`).
    """
    env = os.environ if environ is None else environ
    value = env.get(ENV, "single").strip().lower()
    if value == "default":
        return "default"
    if value != "single":
        raise ValueError(f"{ENV}={env.get(ENV)!r}: use 'single' (one XLA thread per program, the jobs' default) "
                         "or 'default' (XLA's own threading)")
    if _backend_started():
        return "unchanged"
    env["XLA_FLAGS"] = with_flags(env.get("XLA_FLAGS", ""))
    return "single"


def current() -> str:
    """``"single"`` when this process's ``XLA_FLAGS`` holds :data:`FLAGS` as set here,
    else ``"default"``: what a summary records."""
    named = dict(item.split("=", 1) for item in os.environ.get("XLA_FLAGS", "").split() if "=" in item)
    return "single" if all(named.get(k) == v for k, v in FLAGS.items()) else "default"

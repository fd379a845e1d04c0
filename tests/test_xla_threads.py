"""The jobs' XLA threading (ipcjax/xla_threads.py): flags added before JAX starts, the
user's own flags kept, a bad setting refused, and nothing claimed once JAX has started."""
import os
import subprocess
import sys

import pytest

from ipcjax import xla_threads
from ipcjax.xla_threads import single_threaded_xla, with_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SINGLE = "--xla_cpu_multi_thread_eigen=false"


def test_with_flags_appends_only_what_the_user_did_not_name():
    assert with_flags("") == SINGLE
    assert with_flags("--xla_cpu_use_fusion_emitters=false") == "--xla_cpu_use_fusion_emitters=false " + SINGLE
    # the user's own value of a flag wins
    assert with_flags("--xla_cpu_multi_thread_eigen=true") == "--xla_cpu_multi_thread_eigen=true"
    assert with_flags(SINGLE) == SINGLE


def test_a_word_xla_would_stop_at_is_refused_naming_what_it_hides(monkeypatch):
    """XLA stops reading XLA_FLAGS at a word without '--' and ignores everything after it,
    silently: a flag appended after it would not apply, so it is an error."""
    monkeypatch.setattr(xla_threads, "_backend_started", lambda: False)  # as in a job's fresh process
    with pytest.raises(ValueError, match=r"'intra_op_parallelism_threads=1' does not start with '--'.*"
                                         r"\(--xla_dump_to=/tmp/x\)"):
        with_flags("--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1 --xla_dump_to=/tmp/x")
    with pytest.raises(ValueError, match="'threads=1' does not start with '--'.*none yet"):
        single_threaded_xla({"XLA_FLAGS": "threads=1"})


def test_xla_ignores_the_flags_after_such_a_word():
    """What the refusal guards against, in XLA itself: after the word, two host devices are
    not made and an unknown flag is not reported; without it, both take effect."""
    code = "import jax; print(len(jax.devices()))"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "IPCJAX_XLA_THREADS")}

    def run(flags):
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                              env={**env, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}, timeout=120)

    two = "--xla_force_host_platform_device_count=2"
    assert run(two).stdout.strip() == "2"
    assert run(f"{SINGLE} intra_op_parallelism_threads=1 {two}").stdout.strip() == "1"
    hidden = run(f"{SINGLE} intra_op_parallelism_threads=1 --xla_no_such_flag=1")
    assert hidden.returncode == 0 and hidden.stdout.strip() == "1"
    assert run(f"{SINGLE} --xla_no_such_flag=1").returncode != 0


def test_single_threaded_xla_by_the_environment(monkeypatch):
    monkeypatch.setattr(xla_threads, "_backend_started", lambda: False)
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    assert single_threaded_xla(env) == "single" and env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x " + SINGLE
    env = {"IPCJAX_XLA_THREADS": "default", "XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    assert single_threaded_xla(env) == "default" and env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
    with pytest.raises(ValueError, match="IPCJAX_XLA_THREADS='2': use 'single'"):
        single_threaded_xla({"IPCJAX_XLA_THREADS": "2"})
    # after JAX has started its backend, XLA has read its flags: nothing is added or claimed
    monkeypatch.setattr(xla_threads, "_backend_started", lambda: True)
    env = {}
    assert single_threaded_xla(env) == "unchanged" and "XLA_FLAGS" not in env


def test_a_fresh_process_gets_the_flags_before_jax_starts():
    """In a new process the flags land in XLA_FLAGS before the backend starts, and the
    backend then runs; once it has started, a second call changes nothing."""
    code = ("import os; from ipcjax import xla_threads as t\n"
            "print(t.single_threaded_xla()); import jax.numpy as jnp; float(jnp.ones(3).sum())\n"
            "print(os.environ['XLA_FLAGS']); print(t.current()); print(t.single_threaded_xla())\n")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "IPCJAX_XLA_THREADS")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:4] == ["single", SINGLE, "single", "unchanged"]

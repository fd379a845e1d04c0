"""The command-line jobs' persistent compilation cache (ipcjax/compilation_cache.py): where
it lives, that enabling it sets JAX's options and writes entries, and that it can be
switched off. Nothing here needs a warm cache: each check that compiles runs in a fresh
process with its own empty folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ipcjax.compilation_cache import ENV, cache_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_default_folder_is_under_the_user_cache():
    assert cache_dir({}) == os.path.join(os.path.expanduser("~"), ".cache", "ipcjax", "jax")
    assert cache_dir({"XDG_CACHE_HOME": "/c"}) == "/c/ipcjax/jax"
    assert cache_dir({"JAX_COMPILATION_CACHE_DIR": "/j"}) == "/j"


@pytest.mark.parametrize("off", ["0", "off", "OFF", "false", "no", "none", ""])
def test_the_variable_switches_it_off(off):
    assert cache_dir({ENV: off, "JAX_COMPILATION_CACHE_DIR": "/j"}) is None


def test_the_variable_moves_it(tmp_path):
    assert cache_dir({ENV: str(tmp_path), "JAX_COMPILATION_CACHE_DIR": "/j"}) == str(tmp_path)


def _run(code, env):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, **env}, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


PROBE = """
    import json, os, jax, jax.numpy as jnp
    from ipcjax.compilation_cache import counts, enable_compilation_cache
    path = enable_compilation_cache(min_compile_time_s=0.0)
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + jnp.cumsum(x))
    f(jnp.arange(5.0)).block_until_ready()
    print(json.dumps(dict(path=path, dir=jax.config.jax_compilation_cache_dir,
                          min_s=jax.config.jax_persistent_cache_min_compile_time_secs,
                          env=os.environ.get("JAX_COMPILATION_CACHE_DIR"), counts=counts(),
                          files=sorted(os.listdir(path)) if path else [])))
"""


def test_enabling_sets_jax_options_and_writes_entries(tmp_path):
    d = tmp_path / "cache"
    out, _ = _run(PROBE, {ENV: str(d)})
    assert out["path"] == out["dir"] == out["env"] == str(d)
    assert out["min_s"] == 0.0
    assert any("jit__lambda" in f for f in out["files"]), out["files"]
    assert out["counts"]["misses"] >= 1 and out["counts"]["requests"] >= out["counts"]["misses"]


def test_switched_off_leaves_jax_alone(tmp_path):
    out, _ = _run(PROBE, {ENV: "0", "JAX_COMPILATION_CACHE_DIR": ""})
    assert out["path"] is None and not out["dir"] and out["counts"] == {"requests": 0, "hits": 0, "misses": 0}


def test_an_unwritable_folder_runs_without_the_cache_and_says_so(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out, err = _run(PROBE, {ENV: str(blocker / "cache")})
    assert out["path"] is None and not out["dir"]
    assert "compilation cache off" in err



SPARSE_PROBE = """
    import json, os, jax, jax.numpy as jnp
    import ipcjax
    from ipcjax.compilation_cache import counts, enable_compilation_cache
    from ipcjax.linear_solvers import SparseLDL
    from ipcjax.potential import HessianBlocks
    path = enable_compilation_cache(min_compile_time_s=0.0)
    rows = jnp.arange(6, dtype=jnp.int32).reshape(1, 6)
    B = jnp.eye(6)[None] + 0.1
    hb = HessianBlocks(jnp.full(6, 2.0), (rows,), (B,), jnp.int32(0))
    sol = jax.jit(lambda g: SparseLDL().direction(g, hb))(jnp.arange(6.0))
    assert bool(sol.ok)
    print(json.dumps(dict(counts=counts(), files=sorted(os.listdir(path)))))
"""


def test_the_sparse_direction_is_cached_and_read_back_unless_it_calls_the_host(tmp_path):
    """The sparse path's Newton direction is a custom call (ipcjax.cholmod_ffi), so its
    program is written to the cache and read back by the next process; through the host
    callback (IPCJAX_NATIVE=0) JAX writes no entry for it."""
    d = tmp_path / "cache"
    first, _ = _run(SPARSE_PROBE, {ENV: str(d)})
    assert any("jit__lambda" in f for f in first["files"]), first["files"]
    again, _ = _run(SPARSE_PROBE, {ENV: str(d)})
    assert again["counts"]["hits"] >= 1, again["counts"]
    host, _ = _run(SPARSE_PROBE, {ENV: str(tmp_path / "host"), "IPCJAX_NATIVE": "0"})
    assert not any("jit__lambda" in f for f in host["files"]), host["files"]

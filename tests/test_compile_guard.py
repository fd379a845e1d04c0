"""ipcjax.compile_guard: the count of memory mappings, the release of compiled programs when
the process is crowded, and the compile listener's error before the kernel's cap (#31).
The crash itself, at a lowered cap, is benchmarks/map_exhaustion.py (it needs root)."""
import jax
import jax.numpy as jnp
import pytest

from ipcjax import compile_guard as g


def _fresh(k):
    return jax.jit(lambda x: jnp.tanh(x * (k + 0.5)) + jnp.cumprod(x)[::-1])


def test_map_use_counts_this_process_and_grows_with_compiled_programs():
    before, compiles = g.map_use(), g.stats()["compiles"]
    assert before is not None and 0 < before.count < before.limit
    keep = [_fresh(k) for k in range(20)]
    for k, f in enumerate(keep):
        f(jnp.ones(7 + k)).block_until_ready()
    after = g.map_use()
    assert after.count > before.count  # XLA's CPU JIT maps the code of each program
    assert g.stats()["compiles"] - compiles >= 20  # the listener saw them


def test_release_if_crowded_frees_compiled_programs_only_when_crowded(monkeypatch):
    for key in ("releases", "warned", "last"):
        monkeypatch.setitem(g._state, key, g._state[key])  # the suite's own counts come back
    f = _fresh(1)
    f(jnp.ones(5)).block_until_ready()
    assert f._cache_size() == 1
    assert not g.release_if_crowded(0.5, use=g.MapUse(count=400, limit=1000))
    assert f._cache_size() == 1
    releases = g.stats()["releases"]
    assert g.release_if_crowded(0.5, use=g.MapUse(count=600, limit=1000))
    assert f._cache_size() == 0 and g.stats()["releases"] == releases + 1
    assert float(f(jnp.ones(5))[0]) == pytest.approx(float(jnp.tanh(1.5)) + 1.0)  # compiled again


def test_the_listener_raises_a_named_error_before_the_cap(monkeypatch):
    for key, value in (("last", None), ("largest_growth", 0), ("peak", g._state["peak"])):
        monkeypatch.setitem(g._state, key, value)  # the real counts come back afterwards
    monkeypatch.setattr(g, "map_use", lambda: g.MapUse(count=64_900, limit=65_530))
    with pytest.raises(g.MapLimitError, match="vm.max_map_count"):
        _fresh(2)(jnp.ones(11)).block_until_ready()
    monkeypatch.setattr(g, "map_use", lambda: g.MapUse(count=30_000, limit=65_530))
    _fresh(3)(jnp.ones(11)).block_until_ready()  # room enough: no error


def test_the_package_installs_the_listener_once():
    from jax._src import monitoring

    g.install()
    listeners = monitoring.get_event_duration_listeners()
    assert listeners.count(g._after_compile) == 1

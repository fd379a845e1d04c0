"""Batched sweeps: vmap over parameter sets, sharded over two forced CPU devices."""
import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import pytest

from fitting.sweep import stack_params, sweep
from ipcjax.model import Params

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    import ipcjax
    from ipcjax import candidates as C
    from ipcjax.implicit import make_rollout, stack_controls
    from ipcjax.model import Config, Controls, Params
    from fitting.sweep import sweep, stack_params
    from scenes.film import cantilever_scene
    assert len(jax.devices()) == 2, jax.devices()
    sc = cantilever_scene(n=4); m = sc.model
    roll = make_rollout(m, Config(), C.initial_capacity(m.topology), round_fp32=False)
    ctl = stack_controls([Controls.empty(m.n_particles, tolerance=1e-10)] * 3)
    x0 = jnp.asarray(sc.x); tip = jnp.asarray(sc.tip)
    def tipz(p):
        f, _, codes = roll(p, x0, jnp.zeros_like(x0), ctl, 1 / 240)
        return jnp.mean(f[-1, tip, 2]), codes
    scales = [0.5, 1.0, 2.0, 4.0]
    out, codes = sweep(tipz, stack_params([Params.film_defaults(bending_scale=s) for s in scales]))
    assert len(out.sharding.device_set) == 2
    assert np.all(np.asarray(codes) == 0)
    single = np.array([float(jax.jit(tipz)(Params.film_defaults(bending_scale=s))[0]) for s in scales])
    # the sharded, vmapped program sums in another order than the single runs; round-off then
    # moves each Newton iterate, and two runs may stop an iteration apart, each within the
    # Newton tolerance (1e-10 m) of the minimiser: so they agree to that per step, not to eps
    assert np.max(np.abs(np.asarray(out) - single)) < len(ctl.tolerance) * 1e-10
    assert np.all(np.diff(np.asarray(out)) > 0)  # stiffer film droops less
    print("ok")
""")


def test_sweep_sharded_over_two_cpu_devices_matches_single_runs():
    # two host devices, beside the suite's own XLA flags (tests/conftest.py)
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_sweep_rejects_ragged_batches_and_runs_on_the_default_devices():
    b = stack_params([Params.film_defaults(), Params.film_defaults()])
    with pytest.raises(ValueError, match="same batch size"):
        sweep(lambda p: p.friction, b._replace(friction=jnp.ones(3)))
    import jax
    if len(jax.devices()) == 1:
        one = stack_params([Params.film_defaults()])
        assert float(sweep(lambda p: p.friction, one)[0]) == pytest.approx(0.35)

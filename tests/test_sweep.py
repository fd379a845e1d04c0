"""Batched sweeps: vmap over parameter sets, sharded over two forced CPU devices (a rollout
in the slow test, a scalar Newton loop in its fast sibling)."""
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


#: The fast sibling's evaluation: a damped Newton loop (``lax.while_loop``, a stopping
#: tolerance, a host callback per member), the constructs a rollout brings to ``sweep``,
#: on one scalar equation instead of a film: the sag z of a spring of stiffness E·h under
#: gravity with a cubic stiffening, k z + k z³/L² = m g.
TOY = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from fitting.sweep import sweep, stack_params
    from ipcjax.model import Params
    assert len(jax.devices()) == 2, jax.devices()
    seen = []

    def sag(p):
        k, load = p.youngs_modulus * p.thickness, 1e-3 * 9.81

        def body(c):
            z, it, _ = c
            r = k * z + k * z ** 3 / 1e-4 - load
            dz = -r / (k + 3 * k * z ** 2 / 1e-4)
            return z + dz, it + 1, jnp.abs(dz)

        z, it, _ = jax.lax.while_loop(lambda c: (c[2] > 1e-15) & (c[1] < 50), body,
                                      (jnp.zeros(()), jnp.asarray(0), jnp.asarray(jnp.inf)))
        jax.debug.callback(lambda n: seen.append(int(n)), it)
        return z, it

    scales = [0.5, 1.0, 2.0, 4.0]
    batch = stack_params([Params.film_defaults(youngs_modulus=s * 3.15e8) for s in scales])
    out, its = sweep(sag, batch)
    assert len(out.sharding.device_set) == 2
    assert np.all(np.asarray(its) < 50) and len(seen) == len(scales), (its, seen)
    single = np.array([float(jax.jit(sag)(Params.film_defaults(youngs_modulus=s * 3.15e8))[0]) for s in scales])
    assert np.max(np.abs(np.asarray(out) - single)) <= 1e-12 * np.max(np.abs(single))
    assert np.all(np.diff(np.asarray(out)) < 0)  # a stiffer spring sags less
    print("ok")
""")


def _run_on_two_cpu_devices(script):
    # two host devices, beside the suite's own XLA flags (tests/conftest.py)
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.slow  # two rollout programs in a process of its own (≈ 60 s in the suite); the sharding itself
# is checked in the default suite by test_sweep_sharded_over_two_cpu_devices_runs_a_solver_loop_per_member
def test_sweep_sharded_over_two_cpu_devices_matches_single_runs():
    _run_on_two_cpu_devices(SCRIPT)


def test_sweep_sharded_over_two_cpu_devices_runs_a_solver_loop_per_member():
    """The same sharded sweep as the rollout's above, on a scalar Newton loop: the batch
    splits over the two devices, each member stops on its own tolerance, its callback
    runs, and the members equal their single runs."""
    _run_on_two_cpu_devices(TOY)


def test_sweep_rejects_ragged_batches_and_runs_on_the_default_devices():
    b = stack_params([Params.film_defaults(), Params.film_defaults()])
    with pytest.raises(ValueError, match="same batch size"):
        sweep(lambda p: p.friction, b._replace(friction=jnp.ones(3)))
    import jax
    if len(jax.devices()) == 1:
        one = stack_params([Params.film_defaults()])
        assert float(sweep(lambda p: p.friction, one)[0]) == pytest.approx(0.35)

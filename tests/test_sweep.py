"""Batched sweeps: vmap over parameter sets, sharded over two forced CPU devices (a rollout
in the slow test, a scalar Newton loop in its fast sibling)."""
import os
import socket
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import pytest

from fitting.sweep import stack_params, sweep
from ipcjax.model import Params

ROLLOUT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    import ipcjax
    from ipcjax import candidates as C
    from ipcjax.implicit import make_rollout, stack_controls
    from ipcjax.model import Config, Controls, Params
    from fitting.sweep import sweep, stack_params
    from scenes.film import cantilever_scene
    sc = cantilever_scene(n=4); m = sc.model
    roll = make_rollout(m, Config(), C.initial_capacity(m.topology), round_fp32=False)
    ctl = stack_controls([Controls.empty(m.n_particles, tolerance=1e-10)] * 3)
    x0 = jnp.asarray(sc.x); tip = jnp.asarray(sc.tip)
    def tipz(p):
        f, _, codes = roll(p, x0, jnp.zeros_like(x0), ctl, 1 / 240)
        return jnp.mean(f[-1, tip, 2]), codes
    scales = [0.5, 1.0, 2.0, 4.0]
    out, codes = sweep(tipz, stack_params([Params.film_defaults(bending_scale=s) for s in scales]))
    assert np.all(np.asarray(codes) == 0)
    single = np.array([float(jax.jit(tipz)(Params.film_defaults(bending_scale=s))[0]) for s in scales])
    # the sharded, vmapped program sums in another order than the single runs; round-off then
    # moves each Newton iterate, and two runs may stop an iteration apart, each within the
    # Newton tolerance (1e-10 m) of the minimiser: so they agree to that per step, not to eps
    assert np.max(np.abs(np.asarray(out) - single)) < len(ctl.tolerance) * 1e-10
    assert np.all(np.diff(np.asarray(out)) > 0)  # stiffer film droops less
""")


#: A 3-step cantilever rollout swept over four kθ values in one process with two devices.
SCRIPT = ("import jax\nassert len(jax.devices()) == 2, jax.devices()\n" + ROLLOUT
          + "assert len(out.sharding.device_set) == 2\nprint('ok')\n")

#: The fast sibling's evaluation: a damped Newton loop (``lax.while_loop``, a stopping
#: tolerance, a host callback, called once per member under vmap), the constructs a rollout brings to ``sweep``,
#: on one scalar equation instead of a film: the sag z of a spring of stiffness E·h under
#: gravity with a cubic stiffening, k z + k z³/L² = m g.
SAG = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from fitting.sweep import sweep, stack_params
    from ipcjax.model import Params
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

    def batch_of(scales):
        return stack_params([Params.film_defaults(youngs_modulus=s * 3.15e8) for s in scales])

    def single(scales):
        return np.array([float(jax.jit(sag)(Params.film_defaults(youngs_modulus=s * 3.15e8))[0]) for s in scales])
""")

TOY = SAG + textwrap.dedent("""
    assert len(jax.devices()) == 2, jax.devices()
    scales = [0.5, 1.0, 2.0, 4.0]
    out, its = sweep(sag, batch_of(scales))
    assert len(out.sharding.device_set) == 2
    assert np.all(np.asarray(its) < 50) and len(seen) == len(scales), (its, seen)
    ref = single(scales)
    assert np.max(np.abs(np.asarray(out) - ref)) <= 1e-12 * np.max(np.abs(ref))
    assert np.all(np.diff(np.asarray(out)) < 0)  # a stiffer spring sags less
    print("ok")
""")

#: The same sweep over two processes (``jax.distributed``, a coordinator on this machine),
#: each with two CPU devices: eight members, two per device, four per process.
DISTRIBUTED = textwrap.dedent("""
    import sys
    import jax
    pid, port = int(sys.argv[1]), int(sys.argv[2])
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid, initialization_timeout=120)
""") + SAG + textwrap.dedent("""
    assert jax.process_count() == 2 and len(jax.devices()) == 4 and len(jax.local_devices()) == 2
    scales = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    out, its = sweep(sag, batch_of(scales))
    assert isinstance(out, np.ndarray) and out.shape == (8,) and its.shape == (8,)
    # a debug callback runs only in the process of the mesh's first device, once per member:
    # process 0 sees every member's iteration count, in order, and process 1 none
    assert np.all(its < 50) and seen == (its.tolist() if pid == 0 else []), (pid, its, seen)
    ref = single(scales)
    assert np.max(np.abs(out - ref)) <= 1e-12 * np.max(np.abs(ref))
    assert np.all(np.diff(out) < 0)
    try:  # a batch that differs between the processes is refused in both
        sweep(sag, batch_of([s * (1 + pid) for s in scales]))
    except ValueError as e:
        assert "the parameter batch of a sweep over several processes must be the same in every process" in str(e), e
    else:
        raise AssertionError("different batches were not refused")
    jax.distributed.shutdown()
    print("ok")
""")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _two_cpu_devices_env():
    # two host devices, beside the suite's own XLA flags (tests/conftest.py)
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()
    return dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")


def _run_on_two_cpu_devices(script):
    r = subprocess.run([sys.executable, "-c", script], env=_two_cpu_devices_env(), cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def _free_port():
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


#: The rollout sweep over two processes, one CPU device each.
DISTRIBUTED_ROLLOUT = textwrap.dedent("""
    import sys
    import jax
    pid, port = int(sys.argv[1]), int(sys.argv[2])
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid, initialization_timeout=120)
    assert jax.process_count() == 2 and len(jax.devices()) == 2
""") + ROLLOUT + textwrap.dedent("""
    assert isinstance(out, np.ndarray) and out.shape == (4,)
    jax.distributed.shutdown()
    print("ok")
""")


def _run_two_processes(script, env):
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", script, str(pid), port], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for pid in (0, 1)]
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for pid, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and out.strip().endswith("ok"), f"process {pid}: {err[-3000:]}"


@pytest.mark.slow  # a rollout compiled in each of two processes (≈ 1 min); the distributed sweep itself is
# checked in the default suite by test_sweep_over_two_processes_with_jax_distributed
def test_rollout_sweep_over_two_processes_with_jax_distributed():
    """The cantilever rollout's sweep over two processes of one CPU device each: every
    step succeeds and every process gets the four results, equal to single runs to the
    Newton tolerance per step."""
    _run_two_processes(DISTRIBUTED_ROLLOUT, dict(os.environ, JAX_PLATFORMS="cpu"))


def test_sweep_over_two_processes_with_jax_distributed():
    """Two processes started with jax.distributed, two CPU devices each: the sweep splits
    eight members over the four devices, every process gets all eight results, equal to
    single runs, and batches that differ between the processes are refused."""
    _run_two_processes(DISTRIBUTED, _two_cpu_devices_env())


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

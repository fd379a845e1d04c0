"""Batched parameter sweeps: ``vmap`` a rollout measurement over parameter sets, sharded
over the available devices with ``jax.sharding`` (one GPU, several GPUs or hosts, or CPU
devices from ``XLA_FLAGS=--xla_force_host_platform_device_count=N``), unchanged.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ipcjax.model import Params


def stack_params(params_list) -> Params:
    """Stack a list of :class:`Params` into one with a leading batch axis."""
    return jax.tree_util.tree_map(lambda *a: jnp.stack([jnp.asarray(x) for x in a]), *params_list)


def sweep(evaluate, batch: Params, devices=None):
    """Evaluate ``evaluate(params) -> pytree`` for every parameter set in ``batch``.

    The batch axis is split over ``devices`` (default: all) with a 1-D mesh; the batch
    size must be a multiple of the device count. Returns the stacked results, in order.

    Raises:
        ValueError: a batch that is not a multiple of the number of devices, or leaves
            with different batch sizes.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = {int(np.shape(x)[0]) for x in jax.tree_util.tree_leaves(batch)}
    if len(sizes) != 1:
        raise ValueError(f"all parameter leaves need the same batch size; got sizes {sorted(sizes)}")
    (b,) = sizes
    if b % len(devices):
        raise ValueError(f"batch of {b} parameter sets does not split over {len(devices)} devices")
    mesh = Mesh(np.asarray(devices), ("batch",))
    spec = NamedSharding(mesh, PartitionSpec("batch"))
    batch = jax.device_put(batch, spec)
    return jax.jit(jax.vmap(evaluate), in_shardings=spec, out_shardings=spec)(batch)

"""Batched parameter sweeps: ``vmap`` a rollout measurement over parameter sets, sharded
over the available devices with ``jax.sharding`` (one GPU, several GPUs, CPU devices from
``XLA_FLAGS=--xla_force_host_platform_device_count=N``, or the devices of several processes
started with ``jax.distributed``), unchanged.

Across processes (docs/usage.md, "Sweeps over several processes"): every process calls
``jax.distributed.initialize(coordinator_address, num_processes, process_id)`` before any
other JAX call, then :func:`sweep` with the same batch. Each process evaluates the members
that fall on its own devices and gets every member's result back.
"""
from __future__ import annotations

import jax
import numpy as np

from ipcjax.ensemble import gather, member_sharding, place, stack
from ipcjax.model import Params


def stack_params(params_list) -> Params:
    """Stack a list of :class:`Params` into one with a leading batch axis
    (:func:`ipcjax.ensemble.stack`)."""
    return stack(params_list)


def sweep(evaluate, batch: Params, devices=None):
    """Evaluate ``evaluate(params) -> pytree`` for every parameter set in ``batch``.

    The batch axis is split over ``devices`` (default: all, every process's included) with
    a 1-D mesh; the batch size must be a multiple of the device count. Returns the stacked
    results, in order: JAX arrays sharded over ``devices`` when this process holds them
    all; NumPy arrays gathered from every process when the devices span several
    (``jax.distributed``), where every process must call it with the same batch.

    Raises:
        ValueError: a batch that is not a multiple of the number of devices, leaves with
            different batch sizes, or (across processes) batches that differ between the
            processes.
    """
    sizes = {int(np.shape(x)[0]) for x in jax.tree_util.tree_leaves(batch)}
    if len(sizes) != 1:
        raise ValueError(f"all parameter leaves need the same batch size; got sizes {sorted(sizes)}")
    (b,) = sizes
    spec = member_sharding(b, devices)  # one device: None
    if spec is None:
        return jax.jit(jax.vmap(evaluate))(batch)
    run = jax.jit(jax.vmap(evaluate), in_shardings=spec, out_shardings=spec)
    # across processes each process places the rows of its own devices, and every process
    # must hold the same batch (checked: a mismatch would mix two sweeps)
    return gather(run(place(batch, spec, what="the parameter batch of a sweep")))

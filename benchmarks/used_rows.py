"""What the step's row-wise kernels cost over every row and over the used rows only, and
what XLA's CPU sorts cost by operand (issue #30).

    python3 benchmarks/used_rows.py [--state scenes/data/bag_full_tie.npz] [--state runs/lift25_state.npz]
                                    [--band 2e-4] [--repeat 40]

For each saved bag state (one host-driver step gives the capacity a run has there,
:func:`benchmarks.bag_state.bag_step_inputs`), with one XLA thread as the jobs run, each
jitted alone, best of --repeat, ms:

* the gaps of a query's candidate set: ``stencils.contact_gaps`` over every row against
  ``stencils.used_row_gaps`` (passes up to each kind's last valid row);
* Φ and the step bound over a compacted set (the rows within d̂ + --band of x₀, in
  ``Capacity.active`` slots blocked by kind, as a reach set is): ``potential.incremental_potential``
  against ``used_rows.line_search_potential``, and ``line_search.step_bound`` with the
  whole set's geometry against it without (single bounds over the used rows); along a
  random direction of 0.2 mm;
* the same Φ and bound over every slot with ``Capacity.active`` at 700, 1,000, 1,400
  and the run's own: what fewer slots would save (the rows fit all of them);
* XLA's CPU sorts at the grid's sizes: (key, owner) pairs against one packed int64 key,
  float64 against int64 (the median extent), and ``lax.top_k`` of 65 against the step
  bound's two compactions.

Prints JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def state_figures(path, band, repeat):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.bag_state import bag_step_inputs
    from benchmarks.timing import best_time
    from ipcjax.capacity import kind_slots
    from ipcjax.line_search import compact_contacts, step_bound
    from ipcjax.newton import active_size, query_contacts
    from ipcjax.potential import incremental_potential
    from ipcjax.used_rows import line_search_potential
    from ipcjax.step import StepInputs, step_problem
    from ipcjax.stencils import contact_gaps, stencil_geometry, used_row_gaps

    sc, t, st, ctl, rep = bag_step_inputs(path)
    m, cfg, cap = sc.model, sc.config, rep.capacity
    x0, v0 = jnp.asarray(st.x, jnp.float64), jnp.asarray(st.v, jnp.float64)
    inputs = StepInputs(sc.params, x0, v0, ctl, jnp.asarray(sc.dt, jnp.float64))
    cs, _ = jax.jit(lambda z: query_contacts(z, z, m, cfg, cap, skin=cfg.skin))(x0)
    ms = lambda fn, *a: 1e3 * best_time(lambda: fn(*a), repeat)
    every = jax.jit(lambda z, c: contact_gaps(z, c, m.radius, cfg.min_gap))
    used = jax.jit(lambda z, c: used_row_gaps(z, c, m.radius, cfg.min_gap))
    g0 = every(x0, cs)[0]
    gap_diff = max(float(np.max(np.abs(np.where(np.isinf(a), 0, np.asarray(a) - np.asarray(b)))))
                   for a, b in zip(every(x0, cs), used(x0, cs)))
    out = dict(state=path, t=float(t), capacity=str(cap), candidate_rows=int(cs.idx.shape[0]),
               candidate_rows_valid=int(jnp.sum(cs.valid)),
               gaps_ms=dict(every_row=ms(every, x0, cs), used_rows=ms(used, x0, cs)),
               gaps_largest_difference=gap_diff)
    pb = jax.jit(lambda inp, c: step_problem(m, cfg, inp, c, active=active_size(cap)))(inputs, cs)
    dx = jnp.asarray(np.random.default_rng(0).normal(size=x0.shape) * 2e-4)
    near = g0 < cfg.dhat + band
    by_size = []
    for size in sorted({700, 1000, 1400, int(cap.active)}):
        sub, need = compact_contacts(cs, near, size)
        if int(need) > size:
            continue
        phi = jax.jit(lambda z, c: incremental_potential(z, pb, c))
        bound = jax.jit(lambda z, d, c: step_bound(z, d, c, pb, geometry=stencil_geometry(z, c, m.radius,
                                                                                            cfg.min_gap)))
        row = dict(active=size, slots=list(kind_slots(size, cs.blocks)), rows=int(jnp.sum(sub.valid)),
                   phi_every_slot=ms(phi, x0, sub), bound_every_slot=ms(bound, x0, dx, sub))
        if size == int(cap.active):
            phi_u = jax.jit(lambda z, c: line_search_potential(z, pb, c))
            bound_u = jax.jit(lambda z, d, c: step_bound(z, d, c, pb))
            row.update(phi_used_rows=ms(phi_u, x0, sub), bound_used_rows=ms(bound_u, x0, dx, sub),
                       phi_difference_J=float(phi(x0, sub) - phi_u(x0, sub)),
                       bound_every_slot_value=float(bound(x0, dx, sub)), bound_used_rows_value=float(bound_u(x0, dx, sub)))
        by_size.append(row)
    out["compacted_set"] = by_size
    return out


def sort_figures(repeat):
    import jax
    import jax.numpy as jnp

    from benchmarks.timing import best_time
    from ipcjax.line_search import _smallest_bounds

    ms = lambda fn, *a: 1e3 * best_time(lambda: fn(*a), repeat)
    out = {}
    for n in (14112, 21320):  # the tie's face-grid and edge-grid insert capacities
        keys = jax.random.randint(jax.random.PRNGKey(0), (n,), 0, 1 << 60, dtype=jnp.int64)
        owner = jnp.arange(n, dtype=jnp.int32)
        out[f"insert_{n}"] = dict(
            key_owner_pairs_stable=ms(jax.jit(lambda k: jax.lax.sort((k, owner), num_keys=1, is_stable=True)[1]), keys),
            one_packed_int64=ms(jax.jit(lambda k: jnp.sort((k >> 16) * 32768 + owner)), keys))
    ext = jax.random.uniform(jax.random.PRNGKey(1), (2537,), dtype=jnp.float64)
    out["median_2537"] = dict(
        float64=ms(jax.jit(jnp.median), ext),
        int64_bits=ms(jax.jit(lambda a: jax.lax.bitcast_convert_type(
            jnp.sort(jax.lax.bitcast_convert_type(a, jnp.int64)), jnp.float64)[1268]), ext))
    single = jnp.ones(2337, jnp.float64).at[jnp.arange(0, 2337, 97)].set(0.5)
    out["smallest_65_of_2337"] = dict(top_k=ms(jax.jit(lambda v: jax.lax.top_k(-v, 65)), single),
                                      two_compactions=ms(jax.jit(lambda v: _smallest_bounds(v, 64)), single))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", action="append", default=None)
    ap.add_argument("--band", type=float, default=2e-4, help="rows within d̂ + band of x₀ form the compacted set, m")
    ap.add_argument("--repeat", type=int, default=40)
    args = ap.parse_args(argv)
    from ipcjax import xla_threads

    threads = xla_threads.single_threaded_xla()
    import jax

    jax.config.update("jax_enable_x64", True)
    states = args.state or [os.path.join(ROOT, "scenes/data/bag_full_tie.npz")]
    out = dict(xla_threads=threads, load_average=os.getloadavg(),
               states=[state_figures(p, args.band, args.repeat) for p in states],
               sorts=sort_figures(args.repeat))
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

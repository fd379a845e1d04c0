"""Φ and the closest points over a compacted contact set, blocked by kind or in one run of slots.

    python3 benchmarks/kind_slots.py [--state scenes/data/bag_full_tie.npz] [--band 1e-4] [--repeat 30]

From a saved bag state (default: the tie, 8.40 s), one host-driver step gives the capacity a
run has there (:func:`benchmarks.bag_state.bag_step_inputs`); the candidates are queried at
x₀ as a step's first pass does, and the rows within d̂ + --band of x₀ are compacted into
``Capacity.active`` slots two ways: blocked by kind (``line_search.compact_contacts`` on the
query's set: each kind in its ``capacity.kind_slots``, one closest-point formula per row),
and in one run of slots as before #30's change (the same rows through a set without
``blocks``: every slot computes the point–triangle and the edge–edge weights). Timed, each
jitted alone with one XLA thread as the jobs run (``xla_threads``), best of --repeat: Φ (``potential.incremental_potential``),
each of its terms, and the stencil geometry (positions, weights, offsets). Also checked: Φ
and the barrier are the same both ways (printed). Prints JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _best(fn, args, repeat):
    import jax
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", default=os.path.join(ROOT, "scenes/data/bag_full_tie.npz"))
    ap.add_argument("--band", type=float, default=1e-4, help="rows within d̂ + band of x₀ (m)")
    ap.add_argument("--repeat", type=int, default=30)
    a = ap.parse_args(argv)
    from ipcjax import xla_threads

    threads = xla_threads.single_threaded_xla()  # as the jobs run, before JAX starts its backend
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.bag_state import bag_step_inputs
    from ipcjax.capacity import kind_slots
    from ipcjax.line_search import compact_contacts
    from ipcjax.newton import active_size, query_contacts
    from ipcjax.potential import TERMS, incremental_potential
    from ipcjax.problem import StepInputs
    from ipcjax.stencils import ContactSet, contact_gaps, stencil_geometry
    from ipcjax.step import step_problem

    b = bag_step_inputs(a.state)
    sc, st, cap = b.scene, b.state, b.report.capacity
    model, config, active = sc.model, sc.config, active_size(cap)
    x0 = jnp.asarray(st.x, jnp.float64)
    cs, _ = jax.jit(lambda x: query_contacts(x, x, model, config, cap, skin=config.skin))(x0)
    g0 = contact_gaps(x0, cs, model.radius, config.min_gap)[0]
    mask = cs.valid & (g0 < config.dhat + a.band)
    blocked, need = compact_contacts(cs, mask, active)
    one_run, n = compact_contacts(ContactSet(cs.idx, cs.kind, cs.valid), mask, active)
    assert int(need) <= active and int(n) <= active, "the rows do not fit the slots: lower --band"
    inputs = StepInputs(sc.params, x0, jnp.asarray(st.v, jnp.float64), b.controls, jnp.asarray(sc.dt, jnp.float64))
    pb = jax.jit(lambda i: step_problem(model, config, i, cs, active=active))(inputs)
    out = dict(state=a.state, time_s=b.time_s, band_m=a.band, capacity_active=active, candidate_blocks=cs.blocks,
               rows=int(n), rows_by_kind=np.bincount(np.asarray(cs.kind)[np.asarray(mask)], minlength=4).tolist(),
               kind_slots=kind_slots(active, cs.blocks), slots_needed=int(need), xla_threads=threads,
               ms={})
    for name, sub in (("blocked_by_kind", blocked), ("one_run", one_run)):
        r = dict(phi=_best(jax.jit(lambda x, p, c: incremental_potential(x, p, c)), (x0, pb, sub), a.repeat),
                 geometry=_best(jax.jit(lambda x, c: stencil_geometry(x, c, model.radius, config.min_gap)),
                                (x0, sub), a.repeat))
        for term in TERMS:
            r[term.name] = _best(jax.jit(lambda x, p, c, term=term: term.value(x, p, c)), (x0, pb, sub), a.repeat)
        r["phi_value_J"] = float(incremental_potential(x0, pb, sub))
        out["ms"][name] = r
    out["phi_difference_J"] = out["ms"]["blocked_by_kind"]["phi_value_J"] - out["ms"]["one_run"]["phi_value_J"]
    out["blocked_over_one_run"] = {k: out["ms"]["blocked_by_kind"][k] / out["ms"]["one_run"][k]
                                   for k in ("phi", "geometry", "barrier")}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

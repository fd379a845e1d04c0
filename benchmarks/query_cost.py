"""What one candidate query costs at a saved bag state, with one XLA thread as the jobs run (issue #30).

    python3 benchmarks/query_cost.py [--state scenes/data/bag_full_tie.npz] [--repeat 20]

Steps once from the state through the host driver (``advance``, which gives the capacity a
run has there), then times, each jitted alone and best of ``--repeat``: the broad phase
(``candidates.find_candidates`` for the point box x₀ → x₀, widened by d̂ + skin, as the
Newton solve's step-start query makes it), the whole query (broad phase and stencils,
``newton.query_contacts``) and the gaps of every candidate row (``stencils.contact_gaps``,
which the step start, a reference retake and the FP32 recheck each take). Prints JSON: the
capacity, the rows (padded, valid, inside d̂), the work the grid needed against its
capacity, and the milliseconds.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", default=os.path.join(ROOT, "scenes/data/bag_full_tie.npz"))
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)
    from ipcjax import xla_threads

    threads = xla_threads.single_threaded_xla()
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.bag_state import bag_step_inputs
    from benchmarks.timing import best_time
    from ipcjax import candidates
    from ipcjax.newton import query_contacts
    from ipcjax.stencils import contact_gaps

    sc, t_state, st, _, rep = bag_step_inputs(args.state)
    cap, m, cfg = rep.capacity, sc.model, sc.config
    x = jnp.asarray(st.x, jnp.float64)
    broad = jax.jit(lambda z: candidates.find_candidates(z, z, m.topology, cfg.dhat + cfg.skin, cfg.min_gap,
                                                         capacity=cap))
    query = jax.jit(lambda z: query_contacts(z, z, m, cfg, cap, skin=cfg.skin))
    gaps = jax.jit(lambda z, cs: contact_gaps(z, cs, m.radius, cfg.min_gap))
    cs, stats = query(x)
    g = np.asarray(gaps(x, cs)[0])
    ms = lambda fn, *a: 1e3 * best_time(lambda: fn(*a), args.repeat)
    out = dict(state=args.state, t=t_state, xla_threads=threads, load_average=os.getloadavg(),
               capacity=str(cap), rows=int(cs.idx.shape[0]), rows_valid=int(np.sum(np.asarray(cs.valid))),
               rows_inside_dhat=int(np.sum(g < cfg.dhat)),
               grid_work_face_edge=np.asarray(stats.work).tolist(),
               broad_phase_ms=ms(broad, x), query_ms=ms(query, x), gaps_of_every_row_ms=ms(gaps, x, cs))
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

"""Where one bag step's time goes, by phase: the step, one Newton iteration, the host driver.

    python3 benchmarks/profile_bag.py [--state tie] [--state cinch] [--state NAME=PATH] [--repeat 5] [--json F]

For each saved ``ipcjax bag`` state (default: the tie checkpoint, scenes/data/bag_full_tie.npz,
8.40 s; ``cinch`` is tests/data/bag_full_cinch.npz, 7.40 s; ``NAME=PATH`` any state.npz a
bag run wrote), in this process:

1. One host-driver step (``advance``, validating, as ``ipcjax bag --resume`` takes its first
   step) gives the capacity a run has there; the step from the state is then timed with it.
2. **The step** (the jitted ``step``, best of --repeat) and its pieces, each jitted
   alone on the same inputs: the candidate query at x₀ with the gaps there over each
   block's used rows (as the solve's first pass takes them), the step problem (inertial
   target, and the lagged friction set from those gaps, as ``solve_positions`` makes it;
   before stop 61 both took the gaps over every candidate row, which a step does not), the
   whole Newton solve, and the FP32
   rounding with its gap recheck (on the used rows of the solve's last candidate set, as
   its last pass takes it; and, for reference, with a second full candidate query at the
   rounded positions, as the step did before #30). The query and the recheck are the
   solve's first and last passes, so they are parts of its time, not beside it.
3. **The Newton iterations**, replayed on the host from x₀ with the same functions the
   jitted loop calls on its compacting path (``ipcjax.newton``), each phase jitted alone
   and timed at every iterate the step visits (the replay's iterates equal the jitted
   solve's: checked, bit for bit): the reference (the rows' gap lower bounds, retaken
   where too many rows pass, and their compaction), the closest-point weights of the
   rows that may lie inside d̂, the assembly (∇Φ and the element blocks), the direction
   (the CHOLMOD custom call as the loop calls it, ``ipcjax.cholmod_ffi``; and, for
   reference, the host callback's path that the loop takes where the custom call cannot
   be built, split into the upper-triangle CSC matrix (``ldl.upper_csc``, its kept
   pattern built before the timing), CHOLMOD's AMD ordering + symbolic analysis (which
   the library keeps per pattern: counted only at the iterates whose pattern the step has
   not met before), numeric factorization, solve; the callback's own cost and transfers
   are not in it), the skin check
   and requery (only where an iterate leaves the skin), the reach set
   (``line_search.reach_contacts``), the step bound (its single bounds over each kind's
   used rows, ``stencils.fold_used_rows``) and the Armijo line search (Φ(x) on its rows
   included, ``used_rows.line_search_potential``), the last two over the reach set when
   it fits, as the loop does. The replay also counts the barrier and friction blocks the
   direction's custom call reads (the elements with a row of a free DOF; the others add
   nothing and are left unread, ``potential.Elements``). Each phase's time is the best of --repeat calls at each
   iterate, summed over the step's iterations, and given per iteration.
4. **The host driver** around the step, as ``scenes.bag_run.run_bag`` runs it: the
   choreography (``observe``, ``controls_at``), ``advance``'s own time beside the jitted
   ``step`` it calls (parameter checks, the reads of the step's figures; timed inside one
   ``advance`` call), the validation
   of the first step (``validate=True``), the copy of each frame, and a checkpoint
   (trajectory.npz with every frame so far, rewritten, and state.npz).

Prints a table per state, and JSON with every figure (--json writes it to a file too).
Timings on a shared machine are noisy; compare phases within one run, not across runs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

import ipcjax  # noqa: F401  (float64)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATES = {"cinch": "tests/data/bag_full_cinch.npz", "tie": "scenes/data/bag_full_tie.npz"}


def _timed(fn, repeat):
    """(best seconds, last result) of ``fn()`` over ``repeat`` calls after one warm call.

    The best, not the median: on a machine shared with other work, a phase's own cost is
    what it takes when nothing else holds the core."""
    out = jax.block_until_ready(fn())
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    return float(np.min(ts)), out


def host_solve_phases(diag, rows, blocks, rhs, repeat):
    """The host sparse solve of :func:`ipcjax.ldl.host_solve`, split into its phases (s):
    the upper-triangle CSC matrix, CHOLMOD's symbolic analysis (AMD ordering, supernodes;
    kept per pattern by the library, so paid only when the pattern is new), its numeric
    factorization (with the hand-over of the CSC arrays) and the triangular solves."""
    from cvxopt import cholmod, matrix

    from ipcjax import ldl

    t_csc, U = _timed(lambda: ldl.upper_csc(diag, rows, blocks), repeat)  # the pattern is kept after the first
    r = ldl.upper_triangle(diag, rows, blocks)[0]  # the coordinate entries, for the report

    def fresh():
        ldl._ANALYSES.clear()
        return ldl.cholmod_solve(U, rhs)

    t_fresh, _ = _timed(fresh, repeat)
    t_kept, u = _timed(lambda: ldl.cholmod_solve(U, rhs), repeat)  # the analysis kept: numeric + solve
    F = ldl._analysis(U)[0]

    def solve_only():
        b = matrix(np.array(rhs, np.float64))
        cholmod.solve(F, b)
        return b

    t_sol, _ = _timed(solve_only, repeat)
    # the replay counts the analysis where the pattern is new
    return dict(upper_csc=t_csc, ordering_symbolic=max(t_fresh - t_kept, 0.0),
                numeric_factorization=max(t_kept - t_sol, 0.0), triangular_solve=t_sol,
                host_total=t_csc + t_kept, pattern=ldl._pattern_key(U)), u, int(U.nnz), int(r.shape[0])


def profile_state(name, path, repeat):
    from ipcjax import runfolder
    from ipcjax.line_search import armijo, compact_contacts, gap_lower_bound, reach_contacts, step_bound
    from ipcjax.linear_solvers import linear_solver
    from ipcjax.model import State
    from ipcjax.newton import active_size, newton_solve, query_contacts
    from ipcjax.potential import TERMS, contact_gaps, gradient_and_blocks, stencil_geometry
    from ipcjax.stencils import friction_set, used_row_gaps
    from ipcjax.used_rows import line_search_potential
    from ipcjax.problem import StepInputs
    from ipcjax.step import (advance, check_geometry, make_state, recheck_rounded, step, step_problem,
                             validate_state)
    from scenes.bag import bag_scene
    from scenes.bag_run import read_bag_state, write_state

    t_wall0 = time.perf_counter()
    rs0 = np.load(path)
    sc = bag_scene(str(rs0["resolution"]))
    rs = read_bag_state(path, sc, str(rs0["resolution"]))
    model, params, config, dt, choreo = sc.model, sc.params, sc.config, sc.dt, sc.choreography
    st = make_state(rs["x"], rs["v"], float(rs["t"]))
    k0, t0 = int(rs["step"]), float(rs["t"])
    choreo.observe(t0, np.asarray(st.x))
    ctl = choreo.controls_at(k0, t0)
    t = time.perf_counter()
    _, rep0 = advance(model, params, st, ctl, dt, config=config, validate=True)
    first_advance_s = time.perf_counter() - t  # compiles the step
    cap = rep0.capacity
    out = dict(state=name, path=path, t=t0, phase=choreo.phase_at(t0), particles=model.n_particles,
               free_dofs=3 * model.n_free, linear_solver=config.linear_solver,
               first_advance_s_with_compile=first_advance_s,
               driver_step=dict(ok=rep0.ok, iterations=rep0.iterations, substeps=rep0.substeps))

    # ---------------------------------------------------------------- the step and its pieces
    run_step = lambda: step(model, params, st, ctl, dt, config=config, capacity=cap)
    t_step, (_, info) = _timed(run_step, repeat)
    assert int(info.code) == 0, f"the step from {path} failed with code {int(info.code)}"
    x0 = jnp.asarray(st.x, jnp.float64)
    v0 = jnp.asarray(st.v, jnp.float64)
    inputs = StepInputs(params, x0, v0, ctl, jnp.asarray(dt, jnp.float64))

    # as the solve's first pass: the query, and the gaps at x₀ over each block's used rows
    @jax.jit
    def query0(inputs, model):
        cs, stats = query_contacts(inputs.x0, inputs.x0, model, config, cap, skin=config.skin)
        at_x0 = used_row_gaps(inputs.x0, cs, model.radius, config.min_gap)
        return cs, stats, at_x0

    # as solve_positions: the inertial target, and the friction set from those gaps
    @jax.jit
    def problem0(inputs, model, cs, at_x0):
        pb = step_problem(model, config, inputs, None)
        friction = friction_set(inputs.x0, cs, model.radius, inputs.params, config, active=active_size(cap),
                                gaps=at_x0)
        return pb._replace(context=pb.context._replace(friction=friction))

    t_query0, (cs0, stats0, at_x0) = _timed(lambda: query0(inputs, model), repeat)
    t_problem, problem = _timed(lambda: problem0(inputs, model, cs0, at_x0), repeat)
    # the solve makes its own step-start query; the friction set stays the one frozen above
    solve = jax.jit(lambda x, problem: newton_solve(x, problem, lambda c, g: problem.context.friction,
                                                    capacity=cap))
    t_solve, (x_star, cs_star, sinfo, _, _) = _timed(lambda: solve(x0, problem), repeat)
    n_it = int(sinfo.iterations)
    # as the solve's last pass: the smallest gap at x* rounded to FP32, over its last set's used rows
    recheck = jax.jit(lambda x, model, cs: jnp.min(used_row_gaps(x.astype(jnp.float32).astype(x.dtype), cs,
                                                                 model.radius, config.min_gap)[0], initial=jnp.inf))
    t_recheck, _ = _timed(lambda: recheck(x_star, model, cs_star), repeat)
    requery = jax.jit(lambda x, model: recheck_rounded(model, x.astype(jnp.float32), config, cap))
    t_requery, _ = _timed(lambda: requery(x_star, model), repeat)
    valid = int(jnp.sum(cs0.valid))
    g0, _, _ = contact_gaps(x0, cs0, model.radius, config.min_gap)
    inside = int(jnp.sum(g0 < config.dhat))
    out.update(
        candidate_rows=int(cs0.idx.shape[0]), candidate_rows_valid=valid, candidate_rows_inside_dhat=inside,
        active_rows_capacity=active_size(cap), active_rows_used=int(sinfo.stats.n_active),
        newton_iterations=n_it, line_search_trials=int(sinfo.line_search_trials),
        step=dict(step=t_step, query_x0=t_query0, step_problem=t_problem, newton_solve=t_solve,
                  fp32_round_and_recheck=t_recheck,
                  # the solve's first pass is the query at x₀ and its last the FP32 recheck:
                  # query_x0 and fp32_round_and_recheck are parts of newton_solve
                  rest=t_step - (t_problem + t_solve),
                  recheck_with_a_new_query_for_reference=t_requery))

    # ---------------------------------------------------------------- the iterations, replayed
    # the loop of ipcjax.newton.newton_solve on its compacting path (Capacity.active below
    # the candidate rows, as the bag's capacity always is), phase by phase
    solver = linear_solver(config)
    radius, min_gap, half_skin, dhat = model.radius, config.min_gap, 0.5 * config.skin, config.dhat
    fp, F, active = model.free_particles, model.n_free, active_size(cap)
    assert active is not None and active < cs0.idx.shape[0], "the replay follows the compacting path only"
    j_gaps = jax.jit(lambda x, cs: contact_gaps(x, cs, radius, min_gap)[0])
    j_lb = jax.jit(lambda x, rx, rg, cs: gap_lower_bound(x, rx, rg, cs))
    j_near = jax.jit(lambda cs, lb: compact_contacts(cs, lb < dhat, active))
    j_geom = jax.jit(lambda x, cs: stencil_geometry(x, cs, radius, min_gap))
    j_asm = jax.jit(lambda x, problem, cs, geom: gradient_and_blocks(x, problem, cs, geometry=geom))
    j_dir = jax.jit(lambda g, hb: (lambda d: (d.value, d.ok))(solver.direction(g, solver.init(hb))))
    j_full = jax.jit(lambda dxf, x: jnp.zeros_like(x).at[fp].set(dxf.reshape(F, 3)))
    j_query = jax.jit(lambda x, dx, model: query_contacts(x, x + dx, model, config, cap, skin=config.skin))
    j_reach = jax.jit(lambda dx, cs, lb: reach_contacts(dx, cs, lb, dhat, active))
    j_bound = jax.jit(lambda x, dx, cs, problem: step_bound(x, dx, cs, problem))
    j_armijo = jax.jit(lambda x, dx, cs, problem, slope, a0: armijo(
        lambda z: line_search_potential(z, problem, cs), x, dx, config,
        phi0=line_search_potential(x, problem, cs), slope=slope, alpha0=a0))

    phases = {k: 0.0 for k in ("reference", "weights", "assembly", "direction", "upper_csc",
                               "ordering_symbolic", "numeric_factorization", "triangular_solve",
                               "skin_check_and_requery", "reach_set", "step_bound", "line_search")}
    x, cs, box = x0, cs0, (x0, x0)
    ref_x, ref_gap, ref_here = x0, j_gaps(x0, cs0), True
    requeries, retakes, overflows, trials, nnz, coo, reach, near = 0, 0, 0, 0, [], [], [], []
    groups = [t.name for t in TERMS if t.name != "inertia"]  # HessianBlocks' groups, in order
    contact_groups, read = [groups.index("barrier"), groups.index("friction")], []
    patterns = set()  # the Hessian patterns met so far in this step
    for it in range(n_it):
        # the reference's lower bound, the rows it lets near d̂, retaken when too many
        # (unless it was taken at this iterate: then the bound is the gap itself)
        tr0, lb = _timed(lambda: j_lb(x, ref_x, ref_gap, cs), repeat)
        if int(jnp.sum(lb < dhat)) > active and not ref_here:
            tr0 += _timed(lambda: j_gaps(x, cs), repeat)[0]
            ref_x, ref_gap, ref_here = x, j_gaps(x, cs), True
            lb = ref_gap
            retakes += 1
        t, (sub_a, n_near) = _timed(lambda: j_near(cs, lb), repeat)
        tr0 += t
        near.append(int(n_near))
        tw, geom = _timed(lambda: j_geom(x, sub_a), repeat)
        ta, (g, hb) = _timed(lambda: j_asm(x, problem, sub_a, geom), repeat)
        td, (dxf, ok) = _timed(lambda: j_dir(g, hb), repeat)
        assert bool(ok), f"replay: the direction failed at iteration {it}"
        hp, u, nz, nc = host_solve_phases(np.asarray(hb.diag), [np.asarray(r) for r in hb.rows],
                                          [np.asarray(b) for b in hb.blocks], -np.asarray(g), repeat)
        assert np.allclose(u, np.asarray(dxf), rtol=0, atol=1e-12 * np.max(np.abs(u))), "host split ≠ the custom call"
        nnz.append(nz)
        read.append(sum(int(jnp.sum(jnp.any(hb.rows[k] < hb.diag.shape[0], axis=1))) for k in contact_groups))
        coo.append(nc)
        pattern = hp.pop("pattern")
        if pattern in patterns:  # the library kept this pattern's analysis
            hp["ordering_symbolic"] = 0.0
        patterns.add(pattern)
        dx = j_full(dxf, x)
        step_norm = float(jnp.max(jnp.abs(dxf)))
        lo, hi = jnp.minimum(x, x + dx), jnp.maximum(x, x + dx)
        inside_box = bool(jnp.all(lo >= box[0] - half_skin) & jnp.all(hi <= box[1] + half_skin))
        tq = 0.0
        if not inside_box:
            tq, (cs, _) = _timed(lambda: j_query(x, dx, model), repeat)
            tq += _timed(lambda: j_gaps(x, cs), repeat)[0]
            box, ref_x, ref_gap, ref_here = (lo, hi), x, j_gaps(x, cs), True
            requeries += 1
        # the step bound and the line search over the reach set when it fits; otherwise the
        # solve stops with an overflow (counted here; the replay goes on over every row)
        tr, lb2 = _timed(lambda: j_lb(x, ref_x, ref_gap, cs), repeat)
        t, (sub, n_reach) = _timed(lambda: j_reach(dx, cs, lb2), repeat)
        tr += t
        reach.append(int(n_reach))
        ls_cs = sub
        if int(n_reach) > active:
            ls_cs = cs
            overflows += 1
        tb, a0 = _timed(lambda: j_bound(x, dx, ls_cs, problem), repeat)
        slope = jnp.dot(g, dxf)
        tl, (a, k, ls_ok, _) = _timed(lambda: j_armijo(x, dx, ls_cs, problem, slope, a0), repeat)
        assert bool(ls_ok), f"replay: the line search failed at iteration {it}"
        trials += int(k)
        for key, val in (("reference", tr0), ("weights", tw), ("assembly", ta), ("direction", td),
                         ("reach_set", tr), ("step_bound", tb), ("line_search", tl),
                         ("skin_check_and_requery", tq)):
            phases[key] += val
        for key in ("upper_csc", "ordering_symbolic", "numeric_factorization", "triangular_solve"):
            phases[key] += hp[key]
        x, ref_here = x + a * dx, False
        if step_norm < float(ctl.tolerance):
            break
    same = bool(jnp.array_equal(x, x_star))
    phases["host_path_for_reference"] = sum(phases[k] for k in ("upper_csc", "ordering_symbolic",
                                                                 "numeric_factorization", "triangular_solve"))
    per_it = {k: v / n_it for k, v in phases.items()}
    per_it["sum_of_phases"] = sum(per_it[k] for k in ("reference", "weights", "assembly", "direction",
                                                      "skin_check_and_requery", "reach_set", "step_bound",
                                                      "line_search"))
    per_it["in_jitted_solve"] = t_solve / n_it
    out["iteration"] = per_it
    out["replay"] = dict(iterates_equal_jitted_solve=same, requeries=requeries, line_search_trials=trials,
                         near_rows=near, reach_rows=reach, reference_retakes=retakes,
                         reach_overflows=overflows,
                         hessian_nnz_upper=[min(nnz), max(nnz)], coo_entries=[min(coo), max(coo)],
                         padded_active_blocks_sent=[int(b.shape[0]) for b in hb.blocks],
                         contact_blocks_sent=sum(int(hb.blocks[k].shape[0]) for k in contact_groups),
                         contact_blocks_read=[min(read), max(read)])

    # ---------------------------------------------------------------- the host driver
    t_choreo, _ = _timed(lambda: (choreo.observe(t0, np.asarray(st.x)), choreo.controls_at(k0, t0)), repeat)
    import ipcjax.step as _step_module
    inside = []

    def timed_step(*a, **k):  # advance's call of the jitted step, timed from inside advance
        t = time.perf_counter()
        r = jax.block_until_ready(step(*a, **k))
        inside.append(time.perf_counter() - t)
        return r

    _step_module.step = timed_step
    try:
        over = []
        for _ in range(repeat + 1):
            del inside[:]
            t = time.perf_counter()
            advance(model, params, st, ctl, dt, config=config, capacity=cap, validate=False)
            over.append(time.perf_counter() - t - sum(inside))
    finally:
        _step_module.step = step
    t_over = float(np.min(over[1:]))
    t_val, _ = _timed(lambda: (validate_state(model, st), check_geometry(model, st.x, config, cap)), repeat)
    t_copy, _ = _timed(lambda: (np.asarray(st.x)[sc.film].copy(), np.asarray(st.x)[sc.spheres].copy()), repeat)
    n_frames = k0 + 1
    film = np.repeat(np.asarray(st.x)[sc.film][None], n_frames, axis=0)
    sph = np.repeat(np.asarray(st.x)[sc.spheres][None], n_frames, axis=0)
    traj = runfolder.Trajectory(film, sph, sc.faces, np.arange(n_frames) * dt)
    with tempfile.TemporaryDirectory() as tmp:
        t_ckpt, _ = _timed(lambda: (runfolder.write_trajectory(os.path.join(tmp, "t.npz"), traj),
                                    write_state(os.path.join(tmp, "s.npz"), st.x, st.v, st.t, step=k0,
                                                          unfold_checked=True, resolution=sc.resolution,
                                                          captures=choreo.captures_npz(), protocol="full")),
                           max(1, repeat // 2))
    out["driver"] = dict(choreography=t_choreo, advance_over_step=t_over,
                         validate_first_step=t_val, frame_copy=t_copy,
                         checkpoint=t_ckpt, checkpoint_frames=n_frames,
                         checkpoint_per_step_at_every_120=t_ckpt / 120)
    out["profile_wall_s"] = time.perf_counter() - t_wall0
    return out


def table(r):
    """The per-state table, in ms."""
    ms = lambda s: f"{1e3 * s:8.2f}"
    st, it, dr = r["step"], r["iteration"], r["driver"]
    n = r["newton_iterations"]
    lines = [f"## {r['state']}: t = {r['t']:.2f} s ({r['phase']}), {n} Newton iterations, "
             f"{r['line_search_trials']} line-search trials, {r['replay']['requeries']} requeries; "
             f"candidate rows {r['candidate_rows']} ({r['candidate_rows_valid']} valid, "
             f"{r['candidate_rows_inside_dhat']} inside d̂ at x₀); active rows {r['active_rows_used']} "
             f"of {r['active_rows_capacity']}",
             "", "| phase | ms | share |", "|---|---:|---:|"]
    total = st["step"]
    for k in ("query_x0", "step_problem", "newton_solve", "fp32_round_and_recheck", "rest"):
        part = " (part of the newton solve)" if k in ("query_x0", "fp32_round_and_recheck") else ""
        lines.append(f"| step: {k.replace('_', ' ')}{part} | {ms(st[k])} | {st[k] / total:5.1%} |")
    lines.append(f"| **step (jitted `step`)** | {ms(total)} | 100% |")
    lines.append(f"| for reference: the recheck with a new full query (before #30) | "
                 f"{ms(st['recheck_with_a_new_query_for_reference'])} | |")
    lines.append(f"| iteration, in the jitted solve (solve / {n}) | {ms(it['in_jitted_solve'])} | |")
    for k in ("reference", "weights", "assembly", "direction", "skin_check_and_requery", "reach_set",
              "step_bound", "line_search"):
        lines.append(f"| iteration: {k.replace('_', ' ')} | {ms(it[k])} | {it[k] / it['sum_of_phases']:5.1%} |")
        if k == "direction":
            for h in ("upper_csc", "ordering_symbolic", "numeric_factorization", "triangular_solve",
                      "host_path_for_reference"):
                lines.append(f"| &nbsp;&nbsp;for reference, the host callback's path: {h.replace('_', ' ')} | "
                             f"{ms(it[h])} | |")
    lines.append(f"| **iteration, sum of phases** | {ms(it['sum_of_phases'])} | 100% |")
    rp = r["replay"]
    lines.append(f"| the direction's barrier and friction blocks: read / sent | "
                 f"{rp['contact_blocks_read'][0]}–{rp['contact_blocks_read'][1]} / {rp['contact_blocks_sent']} | |")
    for k in ("choreography", "advance_over_step", "frame_copy", "checkpoint_per_step_at_every_120"):
        lines.append(f"| driver per step: {k.replace('_', ' ')} | {ms(dr[k])} | {dr[k] / total:5.1%} of the step |")
    lines.append(f"| driver, once: validate the first step | {ms(dr['validate_first_step'])} | |")
    lines.append(f"| driver, per checkpoint: trajectory.npz ({dr['checkpoint_frames']} frames) + state.npz | "
                 f"{ms(dr['checkpoint'])} | |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", action="append", help="tie, cinch or NAME=PATH (repeatable; default tie)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="also write the JSON here")
    args = ap.parse_args(argv)
    results = []
    for s in args.state or ["tie"]:
        name, _, path = s.partition("=")
        path = path or os.path.join(ROOT, STATES[name])
        results.append(profile_state(name, path, args.repeat))
        print(table(results[-1]), "\n", flush=True)
    out = dict(command="python3 benchmarks/profile_bag.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                       f"{jax.devices()[0].platform}, jax {jax.__version__}",
               load_average=os.getloadavg(), repeat=args.repeat, states=results)
    text = json.dumps(out, indent=1, default=float)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print(text)
    return out


if __name__ == "__main__":
    main()

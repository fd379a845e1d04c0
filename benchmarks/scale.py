"""Seconds per Newton iteration against film size: the dense Cholesky, sparse LDLᵀ and CG paths.

    python3 benchmarks/scale.py [--sizes 500,2000,4000,8000,16000,32000] [--dense-max 4200]
                                [--paths dense,sparse,cg] [--repeat 3] [--json scale.json]
                                [--plot scale.png]

Scene per size: an n×n film (n = round(√size)) at the 484-vertex drape's spacing
(0.1 m / 21 = 4.76 mm, so the film grows with n and the contact width d̂ = 1 mm stays
well below the edge length), laid 0.4 mm above a fixed sphere of radius side/4 (inside
d̂: barrier and lagged friction are active from the start) with a floor below. On that
state the phases of the first Newton iteration are timed separately (jitted, median of
--repeat after a warm-up call): assembly (∇Φ and the PSD Hessian: the dense matrix, or
the element blocks), direction (equilibrated Cholesky solve, host sparse LDLᵀ of the
blocks, or block-Jacobi PCG),
candidates (swept query x → x + Δx) and line search (step bound + Armijo loop). Beside
them, for the dense path, the bare Cholesky (``cho_factor`` of the same Hessian).

Each (size, path) runs in its own subprocess, so ``ru_maxrss`` is that path's peak
resident memory (it includes JAX's own ~0.3–0.5 GB). The dense path runs only up to
--dense-max vertices; beyond that the script prints what the (3F)² matrix would need.
Prints a table and JSON; --plot writes a log-log plot of seconds per iteration.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SPACING = 0.1 / 21  # m, the 22×22 drape of benchmarks/step.py


def _worker(n: int, path: str, repeat: int) -> dict:
    import jax
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl

    import ipcjax  # noqa: F401
    from benchmarks.timing import median_time
    from ipcjax import candidates as C
    from ipcjax.line_search import armijo, step_bound
    from ipcjax.linear_solvers import linear_solver
    from ipcjax.model import Config, Controls, Params
    from ipcjax.newton import query_contacts
    from ipcjax.potential import gradient_and_blocks, incremental_potential, stencil_geometry
    from ipcjax.problem import StepInputs, StepProblem
    from ipcjax.step import step_problem
    from scenes.film import drape_scene

    t_start = time.perf_counter()
    size = SPACING * (n - 1)
    sc = drape_scene(n=n, size=size, sphere_radius=size / 4, gap=0.4e-3, floor=True)
    m, p = sc["model"], Params.film_defaults()
    cfg = Config(linear_solver=path)
    ctl = Controls.empty(m.n_particles, tolerance=1.2e-5)
    dt = jnp.asarray(1.0 / 240.0)
    x = jnp.asarray(sc["x"])
    _, cap = C.find_candidates_host(x, x, m.topology, cfg.dhat + cfg.skin, cfg.min_gap)
    cs, _ = query_contacts(x, x, m, cfg, cap, skin=cfg.skin)
    ctx = jax.jit(lambda x: step_problem(m, cfg, StepInputs(p, x, jnp.zeros_like(x), ctl, dt), cs,
                                         active=cap.active).context)(x)
    problem = StepProblem(model=m, params=p, controls=ctl, context=ctx, config=cfg)
    geometry = jax.jit(lambda x: stencil_geometry(x, cs, m.radius, cfg.min_gap))
    geom = geometry(x)

    # as in the Newton loop: the stencils' weights once per iterate, shared by the
    # assembly (over the Capacity.active rows inside d̂) and the step bound
    blocks = jax.jit(lambda x: gradient_and_blocks(x, problem, cs, geometry=geometry(x), active=cap.active))
    assert int(blocks(x)[1].n_active) <= cap.active, "active-row overflow"
    # the Newton loop's own solver object: its operator (the dense matrix, or the blocks)
    # counts to the assembly, its direction to the direction
    solver = linear_solver(cfg)
    assemble = jax.jit(lambda x: (lambda g, hb: (g, solver.init(hb)))(*blocks(x)))
    direction = jax.jit(lambda g, A: (lambda d: (d.value, d.ok, d.stats.iterations))(solver.direction(g, A)))
    g, A = assemble(x)
    dxf, ok, cg_iters = direction(g, A)
    assert bool(ok), f"{path} direction failed at n={n}"
    dx = jnp.zeros_like(x).at[m.free_particles].set(dxf.reshape(-1, 3))
    cand = jax.jit(lambda x, dx: query_contacts(x, x + dx, m, cfg, cap, skin=cfg.skin))
    c2, st2 = cand(x, dx)
    assert not bool(st2.overflow), "candidate overflow"

    phi = lambda z: incremental_potential(z, problem, cs)
    phi_x = jax.jit(phi)(x)

    @jax.jit
    def line_search(x, dx, g, dxf, geom, phi_x):
        # Φ(x) is carried from the previous iteration's line search in the Newton loop
        a0 = step_bound(x, dx, cs, problem, geometry=geom)
        return armijo(phi, x, dx, cfg, phi0=phi_x, slope=jnp.dot(g, dxf), alpha0=a0)[:3]

    t = dict(
        assembly=median_time(lambda: assemble(x), repeat),
        direction=median_time(lambda: direction(g, A), repeat),
        candidates=median_time(lambda: cand(x, dx), repeat),
        line_search=median_time(lambda: line_search(x, dx, g, dxf, geom, phi_x), repeat),
    )
    t["iteration"] = sum(t.values())
    if path == "dense":
        chol = jax.jit(lambda M: jsl.cho_factor(M, lower=True)[0])
        t["bare_cholesky"] = median_time(lambda: chol(A), repeat)
    n_cand = int(jnp.sum(cs.valid))
    return dict(
        n=n, vertices=n * n, particles=m.n_particles, free_dofs=int(g.shape[0]), path=path,
        contacts=n_cand, friction_active=int(jnp.sum(ctx.friction.load > 0)), cg_iterations=int(cg_iters),
        active_rows=int(blocks(x)[1].n_active), active_capacity=cap.active,
        seconds=t, max_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        wall_s=time.perf_counter() - t_start,
    )


def _run(n, path, repeat):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(n), path, "--repeat", str(repeat)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return dict(n=n, vertices=n * n, path=path, error=r.stderr.strip().splitlines()[-1:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def _plot(rows, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for key, label, style in (("dense", "dense path, one Newton iteration", "o-"),
                              ("sparse", "sparse LDLᵀ path, one Newton iteration", "D-"),
                              ("cg", "CG path, one Newton iteration", "s-"),
                              ("bare_cholesky", "bare dense Cholesky", "^--")):
        pts = [(r["vertices"], r[key]) for r in rows if r.get(key)]
        if pts:
            ax.loglog(*zip(*pts), style, label=label)
    v = [r["vertices"] for r in rows]
    cg = [(r["vertices"], r["cg"]) for r in rows if r.get("cg")]
    if cg:
        v0, t0 = cg[0]
        ax.loglog(v, [t0 * (u / v0) ** 1.5 for u in v], ":", color="gray", label="∝ N^1.5 (from the first CG point)")
    ax.set_xlabel("film vertices N")
    ax.set_ylabel("seconds")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="500,2000,4000,8000,16000,32000", help="film vertex counts, comma-separated")
    ap.add_argument("--dense-max", type=int, default=4200, help="largest vertex count run on the dense path")
    ap.add_argument("--paths", default="dense,sparse,cg", help="linear-solve paths to run (dense up to --dense-max)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="write a log-log plot of seconds per iteration here (png)")
    ap.add_argument("--worker", nargs=2, metavar=("N", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        import jax
        jax.config.update("jax_enable_x64", True)
        print(json.dumps(_worker(int(args.worker[0]), args.worker[1], args.repeat)))
        return None

    from ipcjax.model import LINEAR_SOLVERS
    paths = args.paths.split(",")
    unknown = set(paths) - set(LINEAR_SOLVERS)
    if unknown:
        ap.error(f"unknown paths {sorted(unknown)}")
    rows, runs = [], []
    cols = [("dense", 10, ".4f"), ("bare_cholesky", 11, ".4f"), ("sparse", 8, ".4f"), ("cg", 8, ".4f"),
            ("cg_iterations", 6, "d"), ("sparse_over_dense", 8, ".2f"), ("cg_over_dense", 8, ".2f"),
            ("dense_over_bare_cholesky", 10, ".2f"), ("rss_dense_gb", 9, ".2f"), ("rss_sparse_gb", 9, ".2f"),
            ("rss_cg_gb", 6, ".2f")]
    print(f"{'vertices':>8} {'DOFs':>6} {'contacts':>8} " + " ".join(k[:w].rjust(w) for k, w, _ in cols),
          file=sys.stderr)
    for size in [int(s) for s in args.sizes.split(",")]:
        n = max(3, round(size ** 0.5))
        row = dict(vertices=n * n)
        for path in paths:
            if path == "dense" and n * n > args.dense_max:
                dofs = 3 * n * n
                row["dense_skipped"] = f"dense (3F)² would need {8 * dofs**2 / 1e9:.1f} GB per matrix"
                print(f"{n * n:>8}  skipped: {row['dense_skipped']}", file=sys.stderr)
                continue
            r = _run(n, path, args.repeat)
            runs.append(r)
            if "error" in r:
                print(f"{n * n:>8}  {path} failed: {r['error']}", file=sys.stderr)
                continue
            row.update({path: r["seconds"]["iteration"], f"rss_{path}_gb": r["max_rss_gb"],
                        "free_dofs": r["free_dofs"], "contacts": r["contacts"]})
            if path == "dense":
                row["bare_cholesky"] = r["seconds"]["bare_cholesky"]
            if path == "cg":
                row["cg_iterations"] = r["cg_iterations"]
        for path in ("sparse", "cg"):
            if row.get("dense") and row.get(path):
                row[f"{path}_over_dense"] = row[path] / row["dense"]
        if row.get("sparse") and row.get("cg"):
            row["sparse_over_cg"] = row["sparse"] / row["cg"]
        if row.get("bare_cholesky"):
            for path in ("dense", "sparse", "cg"):
                if row.get(path):
                    row[f"{path}_over_bare_cholesky"] = row[path] / row["bare_cholesky"]
        rows.append(row)
        f = lambda k, w, fmt: format(row[k], fmt).rjust(w) if k in row else "—".rjust(w)
        print(f"{n * n:>8} {row.get('free_dofs', 0):>6} {row.get('contacts', 0):>8} "
              + " ".join(f(k, w, fmt) for k, w, fmt in cols), file=sys.stderr)
    import jax
    out = dict(
        benchmark="scale",
        machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {jax.devices()[0].platform}",
        spacing_m=SPACING, repeat=args.repeat, rows=rows, runs=runs,
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    if args.plot:
        _plot(rows, args.plot)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

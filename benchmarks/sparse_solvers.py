"""The bag's Newton systems solved by the library's host solve, by QDLDL and by KLU inside XLA (issue #30).

    python3 -m pip install klujax==0.5.2   # not a dependency of ipcjax: only this comparison uses it
    python3 benchmarks/sparse_solvers.py [--state scenes/data/bag_full_tie.npz] [--repeat 15]

Steps once from a saved bag state (the tie checkpoint by default) and keeps the element
blocks and right-hand sides that the step's Newton iterations hand to the host
(``ipcjax.ldl.host_solve``; the step is taken with ``cholmod_ffi.switched_off`` so that
they do). Then, for the first, a middle and the last of them, the best
of ``--repeat`` calls of:

* ``cholmod_ffi.solve`` under ``jax.jit``: what the library's Newton direction does
  (``ipcjax.cholmod_ffi``: the assembly into a kept pattern, CHOLMOD's supernodal
  Cholesky with its analysis kept per pattern, the solve, inside XLA as a custom call);
* ``host_solve``: what the host callback does where the custom call cannot be built
  (upper-triangle CSC from the blocks with numpy, CHOLMOD through cvxopt with its
  analysis kept per pattern, solve; the callback's own cost not included), and QDLDL's ordering and
  factorization of the same ready CSC matrix (``qdldl.Solver``: the library's host
  factorization before #30's change to CHOLMOD, and still its LDLᵀ for indefinite H);
* ``cholmod_solve`` on the same matrix, with its symbolic analysis made anew and with it
  kept (as the library keeps it while a step's pattern repeats); CHOLMOD's analysis and
  numeric factorization alone, supernodal (the library's) and simplicial (an up-looking
  LDLᵀ like QDLDL's); and ``cholespy``'s CHOLMOD where it is installed
  (``python3 -m pip install cholespy==2.2.0``, not a dependency), which analyses and
  factorizes in one call;
* ``klujax.solve`` under ``jax.jit``: KLU (BTF, AMD, partial pivoting) inside XLA as an FFI
  custom call, with no host round trip, on the full symmetric matrix in coordinate form,
  duplicates already summed (klujax needs them so, and its ``coalesce`` cannot be jitted:
  the time to build that form inside a program is not counted here); and KLU's symbolic
  analysis and numeric factorization alone.

Prints one JSON object: per system its size and the milliseconds, and the relative
difference of KLU's solution from the library's.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.timing import best_time  # noqa: E402


def best_ms(fn, repeat):
    """The best of ``repeat`` calls after one warm call, in ms."""
    return 1e3 * best_time(fn, repeat)


def capture(path):
    """The (diag, rows, blocks, rhs) of every host solve of one step from the state at ``path``."""
    from benchmarks.bag_state import bag_step_inputs
    from ipcjax import cholmod_ffi, ldl

    saved, original = [], ldl.host_solve

    def spy(diag, rows, blocks, rhs, require_pd=True):
        saved.append((np.array(diag), [np.array(r) for r in rows], [np.array(b) for b in blocks], np.array(rhs)))
        return original(diag, rows, blocks, rhs, require_pd)

    ldl.host_solve = spy
    try:
        with cholmod_ffi.switched_off("sparse_solvers.py captures what the host callback is handed"):
            rep = bag_step_inputs(path).report
        assert rep.ok, rep.reason
    finally:
        ldl.host_solve = original
    return saved, rep.iterations


def compare(system, repeat):
    import jax
    import jax.numpy as jnp
    import qdldl
    import scipy.sparse as sp

    from ipcjax import ldl

    diag, rows, blocks, rhs = system
    out = dict(n=int(diag.shape[0]))
    out["host_solve_ms"] = best_ms(lambda: ldl.host_solve(diag, rows, blocks, rhs), repeat)
    u_ref, status = ldl.host_solve(diag, rows, blocks, rhs)
    assert int(status) == 0
    U = ldl.upper_csc(diag, rows, blocks)
    out["upper_csc_ms"] = best_ms(lambda: ldl.upper_csc(diag, rows, blocks), repeat)
    out["qdldl_order_and_factor_ms"] = best_ms(lambda: qdldl.Solver(U, upper=True), repeat)

    def fresh():  # CHOLMOD with its analysis made anew (a pattern the library has not kept)
        ldl._ANALYSES.clear()
        return ldl.cholmod_solve(U, rhs)

    out["cholmod_analysis_factor_and_solve_ms"] = best_ms(fresh, repeat)
    out["cholmod_factor_and_solve_ms"] = best_ms(lambda: ldl.cholmod_solve(U, rhs), repeat)  # analysis kept
    out.update(custom_call(system, u_ref, repeat))
    out.update(other_factorizations(U, rhs, repeat))
    try:
        import klujax
    except ImportError:
        out["klujax"] = "not installed (python3 -m pip install klujax==0.5.2)"
        return out
    A = (U + sp.triu(U, 1).T).tocoo()
    A.sum_duplicates()
    out["nnz_full"] = int(A.nnz)
    Ai, Aj = jnp.asarray(A.row, jnp.int32), jnp.asarray(A.col, jnp.int32)
    Ax, b = jnp.asarray(A.data), jnp.asarray(rhs)
    solve = jax.jit(klujax.solve)
    out["klujax_solve_ms"] = best_ms(lambda: solve(Ai, Aj, Ax, b), repeat)
    u = np.asarray(solve(Ai, Aj, Ax, b))
    out["klujax_relative_difference"] = float(np.linalg.norm(u - u_ref) / np.linalg.norm(u_ref))
    sym = klujax.analyze(Ai, Aj, out["n"])
    out["klu_analyze_ms"] = best_ms(lambda: klujax.analyze(Ai, Aj, out["n"]), repeat)
    out["klu_factor_ms"] = best_ms(lambda: klujax.factor(Ai, Aj, Ax, sym), repeat)
    return out


def custom_call(system, u_ref, repeat):
    """The library's solve inside XLA (``ipcjax.cholmod_ffi.solve`` under ``jax.jit``, its
    arguments already device arrays): the assembly into a kept pattern, CHOLMOD's numeric
    factorization with its analysis kept, the solve; ms, and its relative difference
    from ``host_solve``'s answer."""
    import jax
    import jax.numpy as jnp

    from ipcjax import cholmod_ffi
    from ipcjax.potential import HessianBlocks

    diag, rows, blocks, rhs = system
    hb = HessianBlocks(jnp.asarray(diag), tuple(jnp.asarray(r) for r in rows), tuple(jnp.asarray(b) for b in blocks),
                       jnp.int32(0))
    b = jnp.asarray(rhs)
    solve = jax.jit(cholmod_ffi.solve)
    u, status = solve(hb, b)
    assert int(status) == 0
    return dict(custom_call_ms=best_ms(lambda: jax.block_until_ready(solve(hb, b)), repeat),
                custom_call_relative_difference=float(np.linalg.norm(np.asarray(u) - u_ref) / np.linalg.norm(u_ref)))


def other_factorizations(U, rhs, repeat):
    """CHOLMOD's simplicial LDLᵀ (``cvxopt``, supernodal off) of the upper triangle U, its
    analysis and its numeric factorization apart; and ``cholespy``'s CHOLMOD, which
    analyses and factorizes in one call (timed only where it is installed: not a
    dependency of ipcjax), ms."""
    import scipy.sparse as sp
    from cvxopt import cholmod, matrix, spmatrix

    from ipcjax import ldl

    n = U.shape[0]
    _, rows, cols = ldl._analysis(U)  # the index vectors the library hands CHOLMOD
    A = spmatrix(matrix(U.data), rows, cols, (n, n))
    out = {}
    for name, supernodal in (("simplicial", 0), ("supernodal", 2)):
        with ldl._CholmodOptions(supernodal=supernodal):
            F = cholmod.symbolic(A, uplo="U")
            out[f"cholmod_{name}_analysis_ms"] = best_ms(lambda: cholmod.symbolic(A, uplo="U"), repeat)
            out[f"cholmod_{name}_factor_ms"] = best_ms(lambda: cholmod.numeric(A, F), repeat)
    try:
        import cholespy
    except ImportError:
        out["cholespy"] = "not installed (python3 -m pip install cholespy==2.2.0)"
        return out
    full = (U + sp.triu(U, 1).T).tocsc()
    full.sort_indices()
    ip, ix = full.indptr.astype(np.int32), full.indices.astype(np.int32)
    out["cholespy_analysis_and_factor_ms"] = best_ms(
        lambda: cholespy.CholeskySolverD(n, ip, ix, full.data, cholespy.MatrixType.CSC), repeat)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", default=os.path.join(ROOT, "scenes/data/bag_full_tie.npz"))
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args(argv)
    systems, iterations = capture(args.state)
    picks = sorted({0, len(systems) // 2, len(systems) - 1})
    out = dict(state=args.state, newton_iterations=iterations, host_solves=len(systems),
               load_average=os.getloadavg(), systems={str(k): compare(systems[k], args.repeat) for k in picks})
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

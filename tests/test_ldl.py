"""The sparse direct path: host LDLᵀ of the element blocks, reached from jit (ipcjax.ldl)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipcjax import candidates as C
from ipcjax.implicit import make_rollout, stack_controls
from ipcjax import ldl
from ipcjax.ldl import sparse_solve, upper_csc, upper_triangle
from ipcjax.linear_solvers import DenseCholesky, SparseLDL
from ipcjax.model import Config, Controls, Params
from ipcjax.potential import dense_hessian
from ipcjax.result import StepCode
from ipcjax.step import make_state, step
from scenes.film import vertex_triangle_scene
from tests.helpers import assert_nonzero, rel_err
from tests.test_sparse import contact_system  # noqa: F401  (the 9×9 film-over-sphere blocks)
from tests.test_sparse import drape_runs

DT = 1.0 / 240.0
SPARSE = Config(linear_solver="sparse")


def sparse_direction(g, hb):
    dx, ok, _ = SparseLDL().direction(g, hb)
    return dx, ok


def test_upper_triangle_is_the_dense_matrix(contact_system):
    """The host's coordinate form, duplicates summed, is the dense scatter's upper triangle:
    fixed particles' rows dropped, padded contact rows' zeros left out, diagonal kept."""
    import scipy.sparse as sp
    _, hb = contact_system(False)
    H = np.asarray(dense_hessian(hb))
    hbn = jax.tree_util.tree_map(np.asarray, hb)
    r, c, v = upper_triangle(hbn.diag, hbn.rows, hbn.blocks)
    assert np.all(r <= c) and np.all(c < H.shape[0]) and np.all(v != 0)
    U = sp.csc_matrix((v, (r, c)), shape=H.shape).toarray()
    assert rel_err(U, np.triu(H)) < 1e-14
    assert len(v) < 0.5 * sum(B.size for B in hbn.blocks)  # the padding really was dropped


def test_upper_csc_is_the_dense_matrix_and_keeps_its_pattern(contact_system):
    """The host's CSC matrix (kept pattern for the first groups + coordinate form for the
    rest) is the dense scatter's upper triangle; the pattern is built once per set of rows
    and another set of rows gets its own, right, pattern."""
    _, hb = contact_system(False)
    H = np.asarray(dense_hessian(hb))
    hbn = jax.tree_util.tree_map(np.asarray, hb)
    assert len(hbn.rows) > ldl.STATIC_GROUPS and hbn.rows[0].shape[0] > 0
    U = upper_csc(hbn.diag, hbn.rows, hbn.blocks)
    assert U.has_sorted_indices and U.shape == H.shape
    assert rel_err(U.toarray(), np.triu(H)) < 1e-14
    first = ldl.static_pattern(H.shape[0], hbn.rows[:ldl.STATIC_GROUPS])
    assert ldl.static_pattern(H.shape[0], [r.copy() for r in hbn.rows[:ldl.STATIC_GROUPS]]) is first
    # new values on the same rows reuse it; the matrix follows the values
    blocks2 = tuple(2.0 * b for b in hbn.blocks)
    U2 = upper_csc(2.0 * hbn.diag, hbn.rows, blocks2)
    assert rel_err(U2.toarray(), 2.0 * np.triu(H)) < 1e-14
    # other rows in the first group (one element dropped): another pattern, the right matrix
    rows3 = (hbn.rows[0][1:],) + tuple(hbn.rows[1:])
    blocks3 = (hbn.blocks[0][1:],) + tuple(hbn.blocks[1:])
    assert ldl.static_pattern(H.shape[0], rows3[:ldl.STATIC_GROUPS]) is not first
    hb3 = hb._replace(rows=tuple(jnp.asarray(r) for r in rows3), blocks=tuple(jnp.asarray(b) for b in blocks3))
    U3 = upper_csc(hbn.diag, rows3, blocks3)
    assert rel_err(U3.toarray(), np.triu(np.asarray(dense_hessian(hb3)))) < 1e-14
    assert rel_err(U3.toarray(), np.triu(H)) > 1e-6  # the dropped element really changed it


def test_sparse_direction_matches_the_cholesky_direction(contact_system):
    g, hb = contact_system(False)
    dense, ok_dense, _ = DenseCholesky().direction(g, dense_hessian(hb))
    sparse, ok_sparse = jax.jit(sparse_direction)(g, hb)
    assert bool(ok_dense) and bool(ok_sparse)
    assert_nonzero(sparse)
    assert rel_err(sparse, dense) < 1e-10


def test_sparse_solve_tells_indefinite_from_singular(contact_system):
    """The exact Hessian away from a minimiser is indefinite: a failure for the Newton
    direction (as for Cholesky), a valid solve for the implicit VJP's exact Hessian."""
    _, hb = contact_system(True)
    H = np.asarray(dense_hessian(hb))
    assert np.linalg.eigvalsh(H).min() < 0
    rhs = jnp.asarray(np.random.default_rng(3).normal(size=H.shape[0]))
    solve = jax.jit(sparse_solve, static_argnums=2)
    u, ok = solve(hb, rhs, True)
    assert not bool(ok) and np.all(np.isnan(np.asarray(u)))
    u, ok = solve(hb, rhs, False)
    assert bool(ok)
    assert rel_err(u, np.linalg.solve(H, np.asarray(rhs))) < 1e-8
    # the implicit VJP's solve on the sparse path, both Hessians, against the dense path
    sparse, dense = SparseLDL(), DenseCholesky()
    solve_sp = jax.jit(sparse.solve, static_argnums=2)
    solve_d = jax.jit(lambda hb, rhs, projection: dense.solve(dense.init(hb), rhs, projection), static_argnums=2)
    assert rel_err(solve_sp(hb, rhs, "exact"), solve_d(hb, rhs, "exact")) < 1e-8
    _, hb_p = contact_system(False)
    assert rel_err(solve_sp(hb_p, rhs, "projected"), solve_d(hb_p, rhs, "projected")) < 1e-10
    # a singular matrix (a zero row and column) is a failure even without the PD requirement
    F3 = H.shape[0]
    hb_sing = hb._replace(diag=hb.diag.at[0].set(0.0),
                          rows=tuple(jnp.where(r == 0, F3 + 5, r) for r in hb.rows))
    u, ok = solve(hb_sing, rhs, False)
    assert not bool(ok) and np.all(np.isnan(np.asarray(u)))


def test_sparse_solve_rejects_non_finite_input(contact_system):
    g, hb = contact_system(False)
    dx, ok = sparse_direction(g.at[4].set(jnp.nan), hb)
    assert not bool(ok) and not np.any(np.asarray(dx))
    blocks = list(hb.blocks)
    blocks[0] = blocks[0].at[0, 0, 0].set(jnp.inf)
    assert not bool(sparse_direction(g, hb._replace(blocks=tuple(blocks)))[1])


def test_sparse_solve_under_vmap(contact_system):
    _, hb = contact_system(False)
    H = np.asarray(dense_hessian(hb))
    R = jnp.asarray(np.random.default_rng(5).normal(size=(3, H.shape[0])))
    U, ok = jax.jit(jax.vmap(lambda r: sparse_solve(hb, r)))(R)
    assert np.all(np.asarray(ok))
    assert rel_err(U, np.linalg.solve(H, np.asarray(R).T).T) < 1e-10


def test_sparse_drape_follows_the_dense_drape():
    """Same Newton iterations, same positions to round-off, no intersection; a failed
    factorization (negative mass makes H indefinite) is reported, not stepped over."""
    sc, p, ctl, runs = drape_runs((Config(), SPARSE))
    m = sc["model"]
    (fd, rd), (fs, rs) = runs["dense"], runs["sparse"]
    assert [r.iterations for r in rd] == [r.iterations for r in rs]
    assert np.max(np.abs(fs[-1] - fd[-1])) < 1e-9  # m
    assert np.max(np.abs(fd[-1] - fd[0])) > 3e-4
    assert min(r.min_gap for r in rs) > 0

    bad = m._replace(mass=-m.mass)
    state = make_state(fs[-1])
    out, info = step(bad, p, state, ctl, DT, config=SPARSE, capacity=rs[-1].capacity)
    assert int(info.code) & int(StepCode.FACTORIZATION_FAILED)
    assert np.array_equal(np.asarray(out.x), np.asarray(state.x))


@pytest.mark.slow  # two rollout compilations (≈ 1 min); the backward solve itself is in the default suite above
def test_rollout_gradient_on_the_sparse_path_equals_the_dense_one():
    """The implicit VJP through a frictional contact rollout: the sparse backward solve
    gives the dense path's gradients."""
    sc = vertex_triangle_scene()
    x = sc["x"].copy(); x[:3, 2] -= 0.0015
    v = np.zeros_like(x); v[:3] = [0.3, 0.1, -0.02]
    m = sc["model"]
    cap = C.initial_capacity(m.topology)
    ctl = stack_controls([Controls.empty(m.n_particles, tolerance=1e-12)] * 3)
    W = jnp.asarray(np.random.default_rng(1).normal(size=x.shape))
    grads = {}
    for cfg in (Config(), SPARSE):
        rollout = make_rollout(m, cfg, cap, round_fp32=False)

        def loss(p):
            frames, _, codes = rollout(p, jnp.asarray(x), jnp.asarray(v), ctl, DT)
            return jnp.sum(W * frames[-1]), codes

        (_, codes), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(Params.film_defaults())
        assert np.all(np.asarray(codes) == 0)
        grads[cfg.linear_solver] = g
    for name in ("youngs_modulus", "friction", "barrier_stiffness"):
        a, b = getattr(grads["sparse"], name), getattr(grads["dense"], name)
        assert_nonzero(a, name)
        assert rel_err(a, b) < 1e-8, name


def test_unknown_linear_solver_is_named():
    with pytest.raises(ValueError, match="linear_solver must be one of .*'sparse'.*got 'lu'"):
        Config(linear_solver="lu")

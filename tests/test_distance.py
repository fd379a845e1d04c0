"""Distances, branch types, closest-point weights and their derivatives (ipcjax.distance).

References: IPC Toolkit (ipctk, squared distances) on random and degenerate configurations;
central differences inside a fixed branch; the envelope identity ∂d/∂xᵢ = wᵢ n.
"""
from __future__ import annotations

import ipctk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ipcjax  # noqa: F401  (float64)
from ipcjax import distance as D
from tests.helpers import assert_nonzero, central_gradient, rel_err

PT, EE = D.PointTriangleType, D.EdgeEdgeType


def _stencil(f):
    """f(x0, x1, x2, x3, *rest) -> g(X (4, 3), *rest)."""
    return lambda X, *rest: f(X[0], X[1], X[2], X[3], *rest)


BATCH = 4096  # every batched call is padded to this size: one compilation per function


def _padded(f):
    """Run batched ``f`` in chunks of BATCH rows (the last padded by repeating a row)."""

    def chunk(args):
        n = len(args[0])
        pad = [np.concatenate([a, np.repeat(a[:1], BATCH - n, axis=0)]) for a in args]
        return jax.tree_util.tree_map(lambda y: np.asarray(y)[:n], f(*pad))

    def g(*args):
        args = [np.asarray(a) for a in args]
        parts = [chunk([a[i:i + BATCH] for a in args]) for i in range(0, len(args[0]), BATCH)]
        return jax.tree_util.tree_map(lambda *ys: np.concatenate(ys), *parts)

    return g


def _kind_funcs(dist, dtype, weights, fixed, branch_weights, ref, ref_type, enum):
    """Jitted, batched evaluations for one primitive pair (few compilations keep the file fast)."""
    dist, dtype, weights, fixed, branch_weights = map(_stencil, (dist, dtype, weights, fixed, branch_weights))

    def evaluate(X):
        w, t = weights(X)
        d, n = D.stencil_distance(X, w)
        return dict(d=dist(X), type=dtype(X), w=w, n=n, grad=jax.grad(dist)(X), wd=d, wb=branch_weights(X)[t])

    def evaluate_fixed(X, t):
        w = branch_weights(X)[t]
        return dict(d=fixed(X, t), grad=jax.grad(fixed)(X, t), w=w, n=D.stencil_distance(X, w)[1])

    return dict(
        eval=_padded(jax.jit(jax.vmap(evaluate))),
        eval_fixed=_padded(jax.jit(jax.vmap(evaluate_fixed))),
        fixed=jax.jit(fixed),
        hessian_fixed=jax.jit(jax.hessian(fixed)),
        ref=ref,
        ref_type=ref_type,
        enum=enum,
    )


FUNCS = {
    "pt": _kind_funcs(
        D.point_triangle_distance, D.point_triangle_distance_type, D.point_triangle_weights,
        D.point_triangle_distance_fixed, D._point_triangle_branch_weights,
        lambda X: np.sqrt(ipctk.point_triangle_distance(*X)),
        lambda X: ipctk.point_triangle_distance_type(*X).name,
        PT,
    ),
    "ee": _kind_funcs(
        D.edge_edge_distance, D.edge_edge_distance_type, D.edge_edge_weights,
        D.edge_edge_distance_fixed, D._edge_edge_branch_weights,
        lambda X: np.sqrt(ipctk.edge_edge_distance(*X)),
        lambda X: ipctk.edge_edge_distance_type(*X).name,
        EE,
    ),
}


def _ev(kind, X, key):
    return np.asarray(FUNCS[kind]["eval"](np.asarray(X))[key])


def _random_configs(rng, n):
    """n random stencils (4, 3) at scales 1e-6 .. 1 m, translated by up to 10 scales."""
    scale = 10.0 ** rng.uniform(-6, 0, size=(n, 1, 1))
    X = rng.normal(size=(n, 4, 3)) * scale + rng.uniform(-10, 10, size=(n, 1, 3)) * scale
    return X, scale[:, 0, 0]


def _unit(v):
    return v / np.linalg.norm(v)


def _degenerate_pt(rng, n_each=40):
    """Point–triangle configurations on branch boundaries, touching, coplanar, at all scales."""
    out, scales = [], []
    for _ in range(n_each):
        s = 10.0 ** rng.uniform(-6, 0)
        T = rng.normal(size=(3, 3)) * s
        nrm = _unit(np.cross(T[1] - T[0], T[2] - T[0]))
        h = rng.choice([0.0, 1e-12, -1e-12, 1e-3, 0.3]) * s
        b = rng.dirichlet(np.ones(3))
        k = rng.integers(3)
        lam = rng.uniform()
        e0, e1 = T[k], T[(k + 1) % 3]
        inplane_out = _unit(np.cross(e1 - e0, nrm))  # outward from edge k
        ps = [
            b @ T + h * nrm,  # over the interior (touching when h = 0)
            (1 - lam) * e0 + lam * e1 + h * nrm,  # over an edge (P_T / P_E boundary)
            T[k] + h * nrm,  # over a vertex
            T[k],  # on a vertex
            (1 - lam) * e0 + lam * e1 + rng.uniform(0.1, 1.0) * s * inplane_out,  # coplanar outside
            e0 + rng.choice([-0.5, 1.5]) * (e1 - e0),  # on an edge's line, beyond the edge
            e0 + (e0 - e1) * 1e-12 + h * nrm,  # just past a vertex along the edge
        ]
        for p in ps:
            out.append(np.stack([p, T[0], T[1], T[2]]))
            scales.append(s)
    return np.array(out), np.array(scales)


def _degenerate_ee(rng, n_each=40):
    """Edge–edge configurations: parallel, nearly parallel, intersecting, collinear, T-junctions."""
    out, scales = [], []
    for _ in range(n_each):
        s = 10.0 ** rng.uniform(-6, 0)
        a0, a1 = rng.normal(size=(2, 3)) * s
        u = a1 - a0
        off = rng.normal(size=3) * s
        k = rng.choice([-2.0, -0.7, 0.5, 1.0, 1.3])
        lam, mu = rng.uniform(size=2)
        v_other = rng.normal(size=3) * s
        pa = (1 - lam) * a0 + lam * a1
        nrm = _unit(np.cross(u, v_other))
        h = rng.choice([0.0, 1e-12, 1e-6, 0.2]) * s
        eps = rng.normal(size=3) * 1e-12 * s
        cases = [
            (a0 + off, a0 + off + k * u),  # exactly parallel
            (a0 + off, a0 + off + k * u + eps),  # nearly parallel, 1e-12 offsets
            (a0 + 0.3 * u + h * nrm, a0 + 0.3 * u + h * nrm + k * u),  # parallel, overlapping
            (pa - mu * v_other + h * nrm, pa + (1 - mu) * v_other + h * nrm),  # crossing/touching
            (pa + h * nrm, pa + h * nrm + v_other),  # T-junction
            (a0 + rng.choice([-1.5, 0.2, 1.2]) * u, a0 + rng.choice([-0.3, 0.6, 2.0]) * u),  # collinear
            (a1 + eps, a1 + v_other),  # sharing (almost) a vertex
        ]
        for b0, b1 in cases:
            out.append(np.stack([a0, a1, b0, b1]))
            scales.append(s)
    return np.array(out), np.array(scales)


# ----------------------------------------------------------------- values vs ipctk


@pytest.mark.parametrize("kind", ["pt", "ee"])
def test_random_configurations_match_ipctk(kind):
    F = FUNCS[kind]
    X, _ = _random_configs(np.random.default_rng(1), 1500)
    out = F["eval"](X)
    ref = np.array([F["ref"](x) for x in X])
    assert rel_err(np.asarray(out["d"]) / ref, np.ones_like(ref)) <= 1e-10
    # generic configurations sit off branch boundaries: the branch must agree by name
    names = np.array([F["enum"](int(t)).name for t in out["type"]])
    ref_names = np.array([F["ref_type"](x) for x in X])
    assert np.array_equal(names, ref_names), np.flatnonzero(names != ref_names)[:10]
    assert len(set(names)) == len(F["enum"]), "every branch is exercised"


@pytest.mark.parametrize("kind", ["pt", "ee"])
def test_degenerate_configurations_match_ipctk(kind):
    rng = np.random.default_rng(2)
    X, scale = (_degenerate_pt if kind == "pt" else _degenerate_ee)(rng)
    assert len(X) >= 250
    F = FUNCS[kind]
    d = _ev(kind, X, "d")
    ref = np.array([F["ref"](x) for x in X])
    # touching cases are compared to an absolute floor of 1e-14 of the scene scale
    err = np.abs(d - ref)
    ok = err <= 1e-10 * ref + 1e-14 * scale
    assert ok.all(), (np.flatnonzero(~ok)[:10], (err / (ref + scale))[~ok][:10])
    assert np.sum(ref < 1e-14 * scale) >= 20, "touching configurations are covered"


_point_edge = jax.jit(jax.vmap(D.point_edge_distance))


def test_degenerate_primitives_reduce_to_edges():
    """Zero-area triangles and zero-length edges: distance to the remaining segments/points."""
    rng = np.random.default_rng(3)
    X = []
    for _ in range(50):
        p, t0, t1 = rng.normal(size=(3, 3))
        X.append([p, t0, t1, t0 + rng.uniform(-1, 2) * (t1 - t0)])  # collinear triangle
    X = np.array(X)
    ref = np.min([_point_edge(X[:, 0], X[:, i], X[:, j]) for i, j in ((1, 2), (2, 3), (3, 1))], axis=0)
    assert rel_err(_ev("pt", X, "d"), ref) <= 1e-12
    # zero-length edge A: distance from its point to segment B
    Y = X.copy()
    Y[:, 1] = Y[:, 0]
    assert rel_err(_ev("ee", Y, "d"), _point_edge(Y[:, 0], Y[:, 2], Y[:, 3])) <= 1e-12


def test_point_point_and_point_edge_distance():
    rng = np.random.default_rng(4)
    p, e0, e1 = rng.normal(size=(3, 200, 3))
    assert rel_err(jax.jit(jax.vmap(D.point_point_distance))(p, e0), np.linalg.norm(p - e0, axis=1)) <= 1e-14
    ref = np.array([np.sqrt(ipctk.point_edge_distance(*x)) for x in zip(p, e0, e1)])
    assert rel_err(_point_edge(p, e0, e1), ref) <= 1e-12


# ---------------------------------------------------------------------- weights


@pytest.mark.parametrize("kind", ["pt", "ee"])
def test_weights_reproduce_distance(kind):
    rng = np.random.default_rng(5)
    Xr, sr = _random_configs(rng, 300)
    Xd, sd = (_degenerate_pt if kind == "pt" else _degenerate_ee)(rng)
    X, scale = np.concatenate([Xr, Xd]), np.concatenate([sr, sd])
    out = {k: np.asarray(v) for k, v in FUNCS[kind]["eval"](X).items()}
    w, d = out["w"], out["d"]
    assert np.max(np.abs(w.sum(axis=1))) <= 1e-14
    r = np.einsum("bi,bij->bj", w, X - X[:, :1])
    assert np.all(np.abs(np.linalg.norm(r, axis=1) - d) <= 1e-13 * (d + scale))
    assert np.array_equal(out["wd"], d)
    # the chosen candidate's weights are the named branch's, to the bit
    assert np.array_equal(w, out["wb"])
    if kind == "pt":
        assert w[:, 0].min() == 1.0 and w[:, 0].max() == 1.0
        bary = -w[:, 1:]  # barycentric coordinates of the closest point
    else:
        bary = np.concatenate([w[:, :2], -w[:, 2:]], axis=1)  # (1 − s, s, 1 − t, t)
    assert bary.min() >= 0.0 and bary.max() <= 1.0
    touching = d == 0.0
    assert np.allclose(np.linalg.norm(out["n"][~touching], axis=1), 1.0, atol=1e-14)
    assert np.all(out["n"][touching] == 0.0)


def test_sphere_pair_weights():
    w = D.sphere_pair_weights()
    c = np.array([[0.0, 0.0, 0.0], [0.3, 0.4, 0.0]])
    d, n = D.stencil_distance(jnp.stack([c[0], c[1], c[1], c[1]]), w)
    assert np.array_equal(w, [1.0, -1.0, 0.0, 0.0])
    assert abs(float(d) - 0.5) <= 1e-15
    assert rel_err(n, [-0.6, -0.8, 0.0]) <= 1e-15


# -------------------------------------------------------------------- gradients


def _branch_samples(kind, per_branch=3, h=1e-6):
    """Unit-scale configurations well inside each branch: the branch is unchanged at ±h."""
    F = FUNCS[kind]
    X = np.random.default_rng(7).normal(size=(600, 4, 3))
    steps = h * np.concatenate([np.eye(12), -np.eye(12)]).reshape(24, 4, 3)
    shifted = X[:, None] + np.concatenate([np.zeros((1, 4, 3)), steps])[None]
    types = _ev(kind, shifted.reshape(-1, 4, 3), "type").reshape(len(X), 25)
    stable = np.all(types == types[:, :1], axis=1)
    samples = {}
    for t in F["enum"]:
        samples[t] = X[stable & (types[:, 0] == t)][:per_branch]
        assert len(samples[t]) == per_branch, f"no stable samples for {t.name}"
    return samples


@pytest.mark.parametrize("kind", ["pt", "ee"])
def test_fixed_branch_gradient_matches_central_differences(kind):
    F = FUNCS[kind]
    for t, xs in _branch_samples(kind).items():
        out = F["eval_fixed"](xs, jnp.full(len(xs), t, jnp.int32))
        for x, g in zip(xs, np.asarray(out["grad"])):
            fd = central_gradient(lambda X: F["fixed"](X, t), x, h=1e-6)
            assert_nonzero(g, f"{kind} {t.name} gradient")
            assert rel_err(g, fd) <= 1e-6, (t.name, rel_err(g, fd))
        # the automatic distance is this fixed branch here
        assert np.array_equal(_ev(kind, xs, "d"), out["d"])


@pytest.mark.parametrize("kind", ["pt", "ee"])
def test_gradient_is_weights_times_normal(kind):
    """Envelope theorem: ∂d/∂xᵢ = wᵢ n for the automatic and every fixed branch."""
    F = FUNCS[kind]
    X, _ = _random_configs(np.random.default_rng(8), 400)
    X = X / np.max(np.abs(X), axis=(1, 2), keepdims=True)  # unit scale, d well above rounding
    out = {k: np.asarray(v) for k, v in F["eval"](X).items()}
    wn = out["w"][:, :, None] * out["n"][:, None, :]
    assert max(rel_err(a, b) for a, b in zip(out["grad"], wn)) <= 1e-10
    nb = len(F["enum"])
    ts = np.repeat(np.arange(nb, dtype=np.int32), len(X))
    fx = F["eval_fixed"](np.tile(X, (nb, 1, 1)), ts)
    fx = {k: v.reshape((nb, len(X)) + v.shape[1:]) for k, v in fx.items()}
    for t in F["enum"]:
        keep = np.ones(len(X), bool)
        if kind == "ee" and t == EE.EA_EB:  # line–line parameters are ill-conditioned near parallel
            u, v = X[:, 1] - X[:, 0], X[:, 3] - X[:, 2]
            sin2 = np.sum(np.cross(u, v) ** 2, axis=1) / np.sum(u * u, axis=1) / np.sum(v * v, axis=1)
            keep = sin2 > 1e-4
            assert keep.sum() > 0.9 * len(X)
        wnt = fx["w"][t][:, :, None] * fx["n"][t][:, None, :]
        assert max(rel_err(a, b) for a, b in zip(fx["grad"][t][keep], wnt[keep])) <= 1e-9, t.name


def _nan_traps():
    """(kind, X) configurations where naive formulas divide by zero or take sqrt(0)."""
    rng = np.random.default_rng(9)
    a, b, c = rng.normal(size=(3, 3))
    z = np.zeros(3)
    return [
        ("pt", np.stack([(a + b + c) / 3, a, b, c])),  # point in the triangle, d = 0
        ("pt", np.stack([a, a, b, c])),  # point on a vertex
        ("pt", np.stack([(a + b) / 2, a, b, c])),  # point on an edge
        ("pt", np.stack([c, a, b, a + 2 * (b - a)])),  # collinear triangle
        ("pt", np.stack([c, a, a, a])),  # triangle collapsed to a point
        ("pt", np.stack([z, z, z, z])),
        ("ee", np.stack([a, b, c, c + 0.7 * (b - a)])),  # parallel
        ("ee", np.stack([a, b, a + 0.3 * (b - a), a + 2.0 * (b - a)])),  # collinear, overlapping
        ("ee", np.stack([a, b, (a + b) / 2 - (c - a), (a + b) / 2 + (c - a)])),  # intersecting
        ("ee", np.stack([a, b, b, c])),  # shared vertex
        ("ee", np.stack([a, a, c, c])),  # both edges collapsed
        ("ee", np.stack([z, z, z, z])),
    ]


@pytest.mark.parametrize("kind", ["pt", "ee"])
def test_gradients_are_nan_free_at_degenerate_configurations(kind):
    F = FUNCS[kind]
    X = np.array([x for k, x in _nan_traps() if k == kind])
    out = {k: np.asarray(v) for k, v in F["eval"](X).items()}
    assert np.all(np.isfinite(out["grad"]))
    for d, g in zip(out["d"], out["grad"]):
        if d == 0.0:
            assert np.all(g == 0.0)
        else:
            assert_nonzero(g)
    assert np.sum(out["d"] == 0.0) >= 2
    # every fixed branch, including the line-line one at parallel edges, and its Hessian
    nb = len(F["enum"])
    ts = np.repeat(np.arange(nb, dtype=np.int32), len(X))
    gf = np.asarray(F["eval_fixed"](np.tile(X, (nb, 1, 1)), ts)["grad"])
    assert np.all(np.isfinite(gf))
    if kind == "ee":  # the Hessian of the branch chosen at parallel edges
        assert np.all(np.isfinite(np.asarray(F["hessian_fixed"](X[0], out["type"][0]))))


# ------------------------------------------------------------------- jit / vmap


@pytest.mark.parametrize("kind", ["pt", "ee"])
def test_fixed_branch_vmaps_over_traced_branch_and_does_not_recompile(kind):
    F = FUNCS[kind]
    X = np.random.default_rng(10).normal(size=(len(F["enum"]), 4, 3))
    ts = jnp.arange(len(F["enum"]), dtype=jnp.int32)
    fixed = D.point_triangle_distance_fixed if kind == "pt" else D.edge_edge_distance_fixed
    traces = []

    def counted(X, t):
        traces.append(1)
        return jax.vmap(_stencil(fixed))(X, t)

    f = jax.jit(counted)
    batched = np.asarray(f(X, ts))
    f(X + 1.0, ts[::-1])
    assert len(traces) == 1
    single = [float(F["fixed"](x, t)) for x, t in zip(X, ts)]
    assert rel_err(batched, single) <= 1e-14

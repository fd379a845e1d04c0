"""Fuzzing the host boundary with hypothesis: every bad input gets a clear error, fast,
and the caller's arrays are left as they were.

Each example has a deadline, so a bad input that starts a simulation (or a recompile)
instead of being refused fails the test rather than hanging it.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipcjax.model import PARAM_RANGES, Config, Controls, Params, State, build_model
from ipcjax.step import advance, check_geometry, make_state, simulate
from scenes.film import drape_scene, film_grid, lumped_mass

FAST = settings(deadline=2000, max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])

BAD_FLOATS = st.sampled_from([float("nan"), float("inf"), -float("inf")])
# values outside each parameter's range (gravity: only non-finite values are bad)
OUT_OF_RANGE = {
    "youngs_modulus": st.floats(max_value=0.0, allow_nan=False),
    "poisson": st.one_of(st.floats(max_value=-1.0, allow_nan=False), st.floats(min_value=0.5, allow_nan=False)),
    "thickness": st.floats(max_value=0.0, allow_nan=False),
    "bending_scale": st.floats(max_value=-1e-300, allow_nan=False),
    "friction": st.floats(max_value=-1e-300, allow_nan=False),
    "barrier_stiffness": st.floats(max_value=0.0, allow_nan=False),
    "drag": st.floats(max_value=-1e-300, allow_nan=False),
}


@pytest.fixture(scope="module")
def scene():
    sc = drape_scene(n=4, size=0.03, sphere_radius=0.01, gap=0.5e-3)
    return sc.model, np.asarray(sc.x, np.float32)


def _state(x):
    return State(np.array(x, copy=True), np.zeros_like(x), np.float64(0.0))


@st.composite
def bad_params(draw):
    name = draw(st.sampled_from(sorted(PARAM_RANGES)))
    if name == "gravity":
        g = [0.0, 0.0, -9.81]
        g[draw(st.integers(0, 2))] = draw(BAD_FLOATS)
        return name, tuple(g)
    return name, draw(st.one_of(OUT_OF_RANGE[name], BAD_FLOATS))


@FAST
@given(bad=bad_params())
def test_out_of_range_parameters_are_refused_naming_the_parameter(scene, bad):
    name, value = bad
    with pytest.raises(ValueError, match=f"parameter {name} must be"):
        Params.film_defaults(**{name: value})
    model, x = scene
    state = _state(x)
    before = np.array(state.x, copy=True)
    p = Params.film_defaults()._replace(**{name: np.asarray(value, np.float64)})
    with pytest.raises(ValueError, match=f"parameter {name} must be"):
        advance(model, p, state, Controls.empty(model.n_particles), 1 / 240)
    np.testing.assert_array_equal(state.x, before)


@FAST
@given(dt=st.one_of(st.floats(max_value=0.0, allow_nan=False), BAD_FLOATS),
       steps=st.one_of(st.integers(max_value=0), st.just(2.5), st.just(True)))
def test_bad_timesteps_and_spans_are_refused(scene, dt, steps):
    model, x = scene
    ctl = Controls.empty(model.n_particles)
    with pytest.raises(ValueError, match="dt must be a finite scalar > 0"):
        advance(model, Params.film_defaults(), _state(x), ctl, dt)
    with pytest.raises(ValueError, match="steps must be an integer ≥ 1"):
        simulate(model, Params.film_defaults(), _state(x), ctl, steps, dt=1 / 240)


@FAST
@given(data=st.data())
def test_bad_states_are_refused_and_left_unchanged(scene, data):
    model, x = scene
    n = model.n_particles
    kind = data.draw(st.sampled_from(["nan_x", "nan_v", "shape", "dtype", "type"]))
    xs, vs = np.array(x, copy=True), np.zeros_like(x)
    if kind == "nan_x":
        xs[data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, 2))] = data.draw(BAD_FLOATS)
    elif kind == "nan_v":
        vs[data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, 2))] = data.draw(BAD_FLOATS)
    elif kind == "shape":
        xs = xs[: data.draw(st.integers(0, n - 1))]
    elif kind == "dtype":
        xs = xs.astype(data.draw(st.sampled_from([np.complex64, np.bool_, np.str_])))
    state = State(xs, vs, np.float64(0.0)) if kind != "type" else (xs, vs, 0.0)
    snapshot = (np.array(xs, copy=True), np.array(vs, copy=True))
    with pytest.raises((ValueError, TypeError), match=r"state|not finite|shape|dtype"):
        advance(model, Params.film_defaults(), state, Controls.empty(model.n_particles), 1 / 240)
    np.testing.assert_array_equal(xs, snapshot[0])
    np.testing.assert_array_equal(vs, snapshot[1])


@FAST
@given(data=st.data())
def test_bad_controls_are_refused(scene, data):
    model, x = scene
    n = model.n_particles
    ctl = Controls.empty(n, n_supports=2, n_ties=1)
    kind = data.draw(st.sampled_from(["index", "k", "target", "tie", "length", "tolerance", "force"]))
    if kind == "index":
        ctl = ctl._replace(support_index=np.asarray([0, data.draw(st.one_of(st.integers(n, 10 ** 6),
                                                                          st.integers(-10 ** 6, -1)))], np.int32))
        match = "support_index must hold particle indices"
    elif kind == "k":
        ctl = ctl._replace(support_k=np.asarray([1.0, data.draw(st.floats(max_value=-1e-12, allow_nan=False, allow_infinity=False))]))
        match = "support_k must be ≥ 0"
    elif kind == "target":
        ctl = ctl._replace(support_target=np.full((2, 3), data.draw(BAD_FLOATS)))
        match = "support_target must be finite"
    elif kind == "tie":
        ctl = ctl._replace(tie_pairs=np.asarray([[0, n + data.draw(st.integers(0, 100))]], np.int32))
        match = "tie_pairs must hold particle indices"
    elif kind == "length":
        ctl = ctl._replace(tie_length=np.asarray([data.draw(st.floats(max_value=-1e-12, allow_nan=False, allow_infinity=False))]))
        match = "tie_length must be ≥ 0"
    elif kind == "tolerance":
        ctl = ctl._replace(tolerance=np.asarray(data.draw(st.one_of(st.floats(max_value=0.0, allow_nan=False),
                                                                    st.just(float("nan"))))))
        match = "tolerance must be"
    else:
        ctl = ctl._replace(force=np.zeros((n + data.draw(st.integers(1, 5)), 3)))
        match = "force must have shape"
    with pytest.raises(ValueError, match=match):
        advance(model, Params.film_defaults(), _state(x), ctl, 1 / 240)


@FAST
@given(data=st.data())
def test_degenerate_and_malformed_meshes_are_refused(data):
    pos, tris = film_grid(3, 0.02)
    kind = data.draw(st.sampled_from(["collinear", "repeated", "index", "nan", "mass"]))
    mass = lumped_mass(pos, tris)
    if kind == "collinear":  # move one vertex onto the line through two others of a triangle
        t = tris[data.draw(st.integers(0, len(tris) - 1))]
        s = data.draw(st.floats(-2.0, 3.0))
        pos = pos.copy()
        pos[t[2]] = pos[t[0]] + s * (pos[t[1]] - pos[t[0]])
        match = "degenerate"
    elif kind == "repeated":
        tris = tris.copy()
        k = data.draw(st.integers(0, len(tris) - 1))
        tris[k, 2] = tris[k, data.draw(st.integers(0, 1))]
        match = "repeats a vertex"
    elif kind == "index":
        tris = tris.copy()
        tris[data.draw(st.integers(0, len(tris) - 1)), data.draw(st.integers(0, 2))] = \
            data.draw(st.one_of(st.integers(len(pos), 10 ** 6), st.integers(-10 ** 6, -1)))
        match = "range|index"
    elif kind == "nan":
        pos = pos.copy()
        pos[data.draw(st.integers(0, len(pos) - 1)), data.draw(st.integers(0, 2))] = data.draw(BAD_FLOATS)
        match = "not finite"
    else:
        mass = mass.copy()
        mass[data.draw(st.integers(0, len(mass) - 1))] = data.draw(st.one_of(st.floats(max_value=-1e-12,
                                                                                     allow_nan=False), BAD_FLOATS))
        match = "mass must be finite and ≥ 0"
    with pytest.raises(ValueError, match=match):
        build_model(pos, tris, mass)


@pytest.fixture(scope="module")
def two_sheets():
    """Two 3 × 3 sheets; the second is dropped onto the first by the examples."""
    a, ta = film_grid(3, 0.02, z=0.0)
    b, tb = film_grid(3, 0.02, z=0.01)
    x = np.concatenate([a, b])
    tris = np.concatenate([ta, tb + len(a)])
    model = build_model(x, tris, lumped_mass(x, tris))
    check_geometry(model, x)  # apart: fine
    # the refusal the examples meet, once here, so that each example's deadline times the
    # refusal and not the compilation of its checks
    y = x.copy()
    y[9:, 2] -= 0.01  # the second sheet in the first's plane
    with pytest.raises(ValueError):
        advance(model, Params.film_defaults(), make_state(y), Controls.empty(model.n_particles), 1 / 240,
                config=Config())
    return model, x


@settings(deadline=5000, max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dz=st.floats(-0.004, 0.004), dx=st.floats(-0.003, 0.003), dy=st.floats(-0.003, 0.003))
def test_overlapping_sheets_are_refused_naming_the_primitives(two_sheets, dz, dx, dy):
    """A sheet placed closer than the film gap to the other, or through it, is an initial
    overlap (or an edge through a face); the error names the primitives."""
    model, x = two_sheets
    y = x.copy()
    y[9:] += np.array([dx, dy, -0.01 + dz * 1e-3])  # within ±4 µm of the first sheet's plane
    before = y.copy()
    with pytest.raises(ValueError, match=r"initial overlap: .* gap .* ≤ 0|edge-through-face penetration"):
        advance(model, Params.film_defaults(), make_state(y), Controls.empty(model.n_particles), 1 / 240,
                config=Config())
    np.testing.assert_array_equal(y, before)


# --------------------------------------------------------------- files: states

N_STATE = 12


def _valid_state(path):
    from scenes.bag_run import write_state
    x = np.linspace(0.0, 1.0, N_STATE * 3).reshape(N_STATE, 3)
    write_state(path, x, np.zeros_like(x), 0.5, step=120, unfold_checked=True, resolution="coarse",
                captures={"capture_tie": np.ones(4)})


@settings(deadline=2000, max_examples=40)
@given(data=st.data())
def test_corrupt_or_truncated_state_files_are_refused_naming_the_file(tmp_path_factory, data):
    """A state file cut short, overwritten with junk, missing an array, or holding an array
    of the wrong shape, dtype or values gets one ValueError naming the file."""
    from scenes.bag_run import read_state, write_state
    path = str(tmp_path_factory.mktemp("state") / "state.npz")
    _valid_state(path)
    read_state(path, N_STATE, "coarse")  # the untouched file reads
    raw = open(path, "rb").read()
    kind = data.draw(st.sampled_from(["truncate", "junk", "drop", "shape", "nan", "dtype", "resolution"]))
    x = np.linspace(0.0, 1.0, N_STATE * 3).reshape(N_STATE, 3)
    fields = dict(x=x, v=np.zeros_like(x), t=0.5, step=120, unfold_checked=True, resolution="coarse")
    if kind == "truncate":
        open(path, "wb").write(raw[:data.draw(st.integers(0, len(raw) - 1))])
    elif kind == "junk":
        open(path, "wb").write(data.draw(st.binary(min_size=0, max_size=400)))
    else:
        if kind == "drop":
            fields.pop(data.draw(st.sampled_from(sorted(fields))))
        elif kind == "shape":
            rows = data.draw(st.integers(0, 30).filter(lambda m: m != N_STATE))
            fields[data.draw(st.sampled_from(["x", "v"]))] = np.zeros((rows, data.draw(st.integers(1, 4))))
        elif kind == "nan":
            bad = np.array(x, copy=True)
            bad[data.draw(st.integers(0, N_STATE - 1)), data.draw(st.integers(0, 2))] = data.draw(BAD_FLOATS)
            fields[data.draw(st.sampled_from(["x", "v"]))] = bad
        elif kind == "dtype":
            fields["x"] = np.full((N_STATE, 3), "a")
        else:
            fields["resolution"] = "full"
        np.savez(path, **fields)
    with pytest.raises((ValueError, FileNotFoundError), match="state.npz"):
        read_state(path, N_STATE, "coarse")


# --------------------------------------------------------------- files: fit targets

JSON = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=8)


@settings(deadline=2000, max_examples=60)
@given(data=st.data())
def test_corrupt_or_malformed_target_files_are_refused_naming_the_file(tmp_path_factory, data):
    """Cut-short, junk or wrongly structured target files get one error naming the file."""
    import json

    from fitting.targets import load_targets
    path = tmp_path_factory.mktemp("targets") / "targets.json"
    good = json.dumps(dict(neck_x_m=0.0388, neck_y_m=0.0372, flap_m=0.0184))
    path.write_text(good)
    np.testing.assert_allclose(load_targets(str(path)), [0.0388, 0.0372, 0.0184])
    kind = data.draw(st.sampled_from(["truncate", "junk", "json", "values"]))
    if kind == "truncate":
        path.write_text(good[:data.draw(st.integers(0, len(good) - 2))])
    elif kind == "junk":
        path.write_bytes(data.draw(st.binary(max_size=200)))
    elif kind == "json":
        path.write_text(json.dumps(data.draw(JSON)))
    else:
        bad = data.draw(st.one_of(st.just(None), st.text(max_size=4), st.floats(max_value=0.0),
                                  st.lists(st.floats(), max_size=3), st.just(float("inf"))))
        key = data.draw(st.sampled_from(["neck_x_m", "neck_y_m"]))
        path.write_text(json.dumps({**json.loads(good), key: bad}))
    with pytest.raises((ValueError, OSError), match="targets file .*targets.json"):
        load_targets(str(path))

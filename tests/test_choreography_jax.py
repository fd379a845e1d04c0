"""The bag's choreography in JAX (scenes/choreography_jax.py) against the host's
(scenes/choreography.py) on the coarse bag's docs/spec.md §5 protocol: the same Controls at
every step start, alone and for two vmapped members with their own captures; NaN targets
for an active, uncaptured track; captures of a saved state carried over.

Agreement: ints, forces, tie stiffnesses and tolerances bit for bit; support stiffnesses,
targets and tie lengths to relative 1e-12 (XLA fuses a·b + c into FMAs: measured ≤ 1.1e-16 m,
7.1e-15 N/m). controls_at and observe are compiled once each (module-level jits, reused by
every test); the two-member lockstep once more.
"""
import dataclasses

import jax
import numpy as np
import pytest

from scenes import bag as B
from scenes import choreography_jax as cj
from scenes.choreography import CAPTURE, Above, Choreography, Ring, SupportTrack, TieTrack
from scenes.bag_run import read_bag_state

RTOL, ATOL = 1e-12, 1e-14  # relative; absolute (m, N/m) for entries near zero
EXACT = ("support_index", "tie_pairs", "tie_k", "force", "tolerance")
STATE = "tests/data/bag_coarse_8p50.npz"  # a coarse bag at 8.50 s (tying)

_observe = jax.jit(cj.observe)
_controls = jax.jit(cj.controls_at)


@jax.jit
def _lockstep(p, caps, t, xs):
    """Every member's observe, then its controls, at the members' common step start t (s)."""
    caps = jax.vmap(cj.observe, in_axes=(None, 0, None, 0))(p, caps, t, xs)
    return caps, jax.vmap(cj.controls_at, in_axes=(None, 0, None))(p, caps, t)


@pytest.fixture(scope="module")
def bag():
    sc = B.bag_scene("coarse")
    return sc, cj.protocol(sc.choreography)


def fresh(sc):
    """The scene's choreography with nothing captured (the tracks are shared, never changed)."""
    return dataclasses.replace(sc.choreography, captures={})


def trajectory(sc, seed):
    """t (s) → (N, 3) float32 positions (like State.x): rest plus a seeded, smooth wobble of
    about 1 cm, so that tracks starting at different times capture different positions."""
    rng = np.random.default_rng(seed)
    amp, omega = rng.normal(0.0, 0.01, sc.x.shape), rng.uniform(0.5, 3.0, sc.x.shape)
    phase = rng.uniform(0.0, 2 * np.pi, sc.x.shape)
    return lambda t: (sc.x + amp * np.sin(omega * t + phase)).astype(np.float32)


def n_steps(ch):
    return int(round(B.T_END / ch.dt))


def accumulated_times(ch):
    """Step start times as the host loop has them: t ← t + dt from 0 in float64 (ipcjax.step.step)."""
    t = [0.0]
    for _ in range(n_steps(ch)):
        t.append(t[-1] + ch.dt)
    return t


def boundary_steps(ch):
    """Steps two before to two after every phase boundary (track on/off, keyframes, fades,
    tie on/full, drops, release), and every 25th step between."""
    times = [ch.tie.t_on, ch.tie.t_full, ch.t_release, *ch.drop_times]
    for tr in ch.tracks:
        times += [tr.t_on, tr.t_off, *(tk for tk, _ in tr.keys)] + ([tr.fade_from] if tr.fade_from else [])
    ks = {int(round(b / ch.dt)) + d for b in times for d in range(-2, 3)} | set(range(0, n_steps(ch), 25))
    return sorted(k for k in ks if 0 <= k < n_steps(ch))


def assert_same(host, ours, where):
    """Every Controls field: dtype and shape, ints/forces/tie k/tolerance exact, the rest to RTOL."""
    for name in host._fields:
        a, b = np.asarray(getattr(host, name)), np.asarray(getattr(ours, name))
        assert (a.dtype, a.shape) == (b.dtype, b.shape), (where, name)
        if name in EXACT:
            assert np.array_equal(a, b), (where, name)
        else:
            np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL, err_msg=f"{name} at {where}")


def sweep(sc, p, traj, steps, times):
    """Host and JAX side by side, as the host loop: at each step start observe, then controls.
    Returns {step: our Controls as NumPy} and the final Captures."""
    ch, cap, out = fresh(sc), cj.empty_captures(p), {}
    for k in steps:
        t, x = times[k], traj(times[k])
        ch.observe(t, x)
        cap = _observe(p, cap, t, x)
        ours = _controls(p, cap, t)
        assert_same(ch.controls_at(k, t), ours, f"step {k}, t = {t!r} s")
        out[k] = jax.tree.map(np.asarray, ours)
    return out, cap


def assert_the_protocol_acts(ch, out, cap):
    """The comparisons were not of zeros: hands switch on and off and move their targets,
    the fade lowers k, the tie shortens, gravity is cancelled until each drop, the tolerance
    switches, and the captures at different starts differ."""
    step = lambda t: int(round(t / ch.dt))  # noqa: E731
    for tr in ch.tracks:
        sl, on, off = ch.slots(tr.name), step(tr.t_on), step(tr.t_off)
        assert np.all(out[on].support_k[sl] == tr.k) and np.all(out[off].support_k[sl] == 0), tr.name
        assert on == 0 or np.all(out[on - 1].support_k[sl] == 0), tr.name
        moved = np.abs(out[off - 1].support_target[sl] - out[on].support_target[sl]).max()
        assert moved > 1e-3, (tr.name, moved)  # m
        if tr.fade_from is not None:
            k_mid = out[next(k for k in sorted(out) if step(tr.fade_from) + 2 < k < off - 2)].support_k[sl]
            assert np.all(out[step(tr.fade_from) - 2].support_k[sl] == tr.k) and np.all((0 < k_mid) & (k_mid < tr.k))
    tie_on, tie_full = out[step(ch.tie.t_on)], out[step(ch.tie.t_full)]
    assert np.all(tie_on.tie_k == ch.tie.k) and np.all(out[step(ch.tie.t_on) - 1].tie_k == 0)
    assert np.all(tie_full.tie_length <= tie_on.tie_length) and np.any(tie_full.tie_length < tie_on.tie_length - 1e-3)
    for s, t_drop, m in zip(ch.sphere_index, ch.drop_times, ch.sphere_mass):
        assert out[step(t_drop) - 1].force[s, 2] == pytest.approx(-m * ch.gravity[2]) and m > 0
        assert out[step(t_drop) + 1].force[s, 2] == 0
    release = step(ch.t_release)
    assert out[release - 1].tolerance == ch.tol_manipulation != ch.tol_released == out[release].tolerance
    assert np.all(np.asarray(cap.taken)) and bool(cap.tie_taken)
    starts = [tr.t_on for tr in ch.tracks if tr.needs_capture()]  # neck/unfold and flap/cinch share theirs
    for b in range(1, len(starts)):
        apart = np.abs(np.asarray(cap.positions[b - 1] - cap.positions[b])).max()
        assert (apart > 1e-4) if starts[b - 1] != starts[b] else (apart == 0), (b, apart)  # m


@pytest.mark.parametrize("clock", ["accumulated", "k_dt"])
def test_every_step_matches_the_host(bag, clock):
    """The whole protocol, every step start with the host loop's accumulated t; and t = k·dt
    around every phase boundary."""
    sc, p = bag
    ch = sc.choreography
    if clock == "accumulated":
        steps, times = range(n_steps(ch)), accumulated_times(ch)
    else:
        steps, times = boundary_steps(ch), [k * ch.dt for k in range(n_steps(ch) + 1)]
    out, cap = sweep(sc, p, trajectory(sc, 7), steps, times)
    assert_the_protocol_acts(ch, out, cap)


def test_two_vmapped_members_each_match_their_own_host(bag):
    """Members with different films share t, not captures: each member's controls equal the
    host's for its own positions, and the two differ."""
    sc, p = bag
    trajs, chs = [trajectory(sc, 1), trajectory(sc, 2)], [fresh(sc), fresh(sc)]
    caps = jax.tree.map(lambda a: np.stack([a, a]), cj.empty_captures(p))
    apart = 0.0
    for k in boundary_steps(sc.choreography):
        t = k * sc.dt
        xs = np.stack([tr(t) for tr in trajs])
        caps, ours = _lockstep(p, caps, t, xs)
        for m, ch in enumerate(chs):
            ch.observe(t, xs[m])
            assert_same(ch.controls_at(k, t), jax.tree.map(lambda a: a[m], ours), f"member {m}, step {k}")
        apart = max(apart, float(np.abs(np.diff(np.asarray(ours.support_target), axis=0)).max()))
    assert apart > 1e-3  # m: the members' hands did go to different places


def test_an_active_uncaptured_track_gives_nan_targets_where_the_host_raises(bag):
    sc, p = bag
    ch, x, empty = fresh(sc), trajectory(sc, 3), cj.empty_captures(p)
    with pytest.raises(RuntimeError, match="'place' is active"):
        ch.controls_at(120, 0.5)
    ours = _controls(p, empty, 0.5)
    place = np.zeros(len(ours.support_k), bool)
    place[ch.slots("place")] = True
    assert np.isnan(np.asarray(ours.support_target)[place]).all() and np.all(np.asarray(ours.support_k)[place] == 20.0)
    assert np.all(np.asarray(ours.support_target)[~place] == 0)  # inactive uncaptured tracks: zeros, as the host
    # every hand captured at 8.00 s, the tie (on at 8.40 s) not: its lengths are NaN at 8.50 s
    ch.observe(8.0, x(8.0))
    cap = _observe(p, empty, 8.0, x(8.0))
    with pytest.raises(RuntimeError, match="tie 'tie' is active"):
        ch.controls_at(2040, 8.5)
    ours = _controls(p, cap, 8.5)
    assert np.isnan(np.asarray(ours.tie_length)).all() and np.isfinite(np.asarray(ours.support_target)).all()
    ch.observe(8.5, x(8.5))
    assert_same(ch.controls_at(2040, 8.5), _controls(p, _observe(p, cap, 8.5, x(8.5)), 8.5), "8.50 s")


def test_a_saved_states_captures_carry_over(bag):
    """tests/data/bag_coarse_8p50.npz through read_bag_state: its captures as Captures give
    the host's controls from 8.50 s through the fade and the release; observe keeps them."""
    sc, p = bag
    sc2 = dataclasses.replace(sc, choreography=fresh(sc))
    rs = read_bag_state(STATE, sc2, "coarse")
    ch, t0, k0 = sc2.choreography, float(rs["t"]), int(rs["step"])
    cap = cj.captures_from_choreography(p, ch)
    assert np.all(np.asarray(cap.taken)) and bool(cap.tie_taken)
    for m, name in enumerate(tr.name for tr in ch.tracks if tr.needs_capture()):
        assert np.array_equal(np.asarray(cap.positions[m]), np.asarray(ch.captures[name], np.float64))
    assert np.array_equal(np.asarray(cap.tie_length), ch.captures["tie"])
    kept = _observe(p, cap, t0, rs["x"])
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(cap)))
    t = t0
    for k in range(k0, k0 + 260):  # to 9.58 s: the tie's end, the fade, the release
        if (k - k0) % 10 == 0 or k in (2099, 2100, 2159, 2160, 2255, 2256):
            assert_same(ch.controls_at(k, t), _controls(p, cap, t), f"step {k}")
        t = t + sc.dt
    length = np.asarray(_controls(p, cap, t0).tie_length)  # mid-tie: between the target and the start
    assert np.all(length <= ch.captures["tie"]) and np.any(length < ch.captures["tie"] - 1e-4)
    # nothing captured converts to the empty captures; a wrong shape is refused
    assert not np.any(np.asarray(cj.captures_from_choreography(p, fresh(sc)).taken))
    bad = fresh(sc)
    bad.captures["flap"] = np.zeros((12, 3))
    with pytest.raises(ValueError, match="capture 'flap' has shape"):
        cj.captures_from_choreography(p, bad)


def test_the_short_protocol_shares_the_structure_and_matches_its_host(bag):
    """'full' and 'short' differ only in numbers: one treedef, so one compiled program."""
    sc, p = bag
    ch = B.make_choreography(sc.mesh, sc.model.n_particles, sc.spheres, sc.choreography.sphere_mass,
                             gravity=sc.choreography.gravity, sphere_radius=sc.sphere_radius, protocol="short")
    q = cj.protocol(ch)
    assert jax.tree.structure(q) == jax.tree.structure(p)
    assert not np.array_equal(q.tracks[4].keys[1].time, p.tracks[4].keys[1].time)  # the gather's star
    x = trajectory(sc, 5)
    cap = cj.empty_captures(q)
    for t in (6.05, 6.30, 6.45, 7.00, 7.20, 7.35):
        ch.observe(t, x(t))
        cap = _observe(q, cap, t, x(t))
        assert_same(ch.controls_at(int(round(t / ch.dt)), t), _controls(q, cap, t), f"short, t = {t} s")


def test_the_keyframe_kinds_the_bag_leaves_out():
    """A six-particle schedule with what the bag does not use: an Above moving points outward
    from another set's centroid, one point on that centroid (the MIN_LENGTH guard: it only
    rises), a scalar Ring, a track of fixed keyframes only, a fade on a track of four keys."""
    base = np.array([[1, 0, 0], [-1, 0, 0], [0, 1, 5], [0, 3, 0], [3, 3, 3], [0, 1, 1]], np.float64)
    wobble = np.random.default_rng(11).normal(0.0, 0.1, base.shape)
    x = lambda t: base + wobble * t  # noqa: E731  (t = 0: particle 2 exactly over the centroid of 0, 1, 3)
    ch = Choreography(
        n_particles=6, dt=0.01, tie=TieTrack("tie", 0.5, 0.8, np.array([[0, 1]]), 10.0, np.array([0.5])),
        tracks=[SupportTrack("out", 0.0, 1.2, np.array([0, 1, 2]), 5.0, [
                    (0.0, CAPTURE), (0.6, Above(np.array([0, 1, 2]), rise=0.1, outward=0.05,
                                                about=np.array([0, 1, 3])))]),
                SupportTrack("fixed", 0.1, 0.9, np.array([4]), 7.0, [
                    (0.2, np.array([[0.0, 0.0, 1.0]])), (0.5, np.array([[1.0, 0.0, 1.0]]))]),
                SupportTrack("ring", 0.2, 1.4, np.array([0, 1, 3]), 9.0, [
                    (0.2, CAPTURE), (0.4, Ring(np.array([0, 1]), 0.2, 0.1, np.array([0, 1.5, 3.0]),
                                               level=np.array([5]))),
                    (0.7005, np.zeros((3, 3))), (0.9, CAPTURE)], fade_from=1.0)],  # 0.7005: off the steps
        sphere_index=np.array([5]), sphere_mass=np.array([0.1]), drop_times=np.array([0.3]),
        gravity=np.array([0.0, 0.0, -9.81]), t_release=1.3, tol_manipulation=1e-5, tol_released=1e-6,
        phases=(("all", 0.0, 1.5),))
    p, cap = cj.protocol(ch), None
    cap = cj.empty_captures(p)
    for k in range(150):
        t = k * ch.dt
        ch.observe(t, x(t))
        cap = _observe(p, cap, t, x(t))
        ours = _controls(p, cap, t)
        assert_same(ch.controls_at(k, t), ours, f"step {k}")
        if k == 70:  # the Above reached: 0 and 1 moved 5 cm away from (0, 1), 2 (on it) only rose
            w = 0.05 / np.sqrt(2)
            np.testing.assert_allclose(np.asarray(ours.support_target[:3]),
                                       base[:3] + [[w, -w, 0.1], [-w, -w, 0.1], [0, 0, 0.1]], atol=1e-14)
    with pytest.raises(ValueError, match="places 2 points; expected 3"):
        cj.protocol(dataclasses.replace(ch, tracks=[SupportTrack("bad", 0, 1, np.arange(3), 1.0,
                                                                 [(0, np.zeros((2, 3)))])]))

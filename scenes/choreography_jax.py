"""The bag's choreography (docs/spec.md §5) as pure, jittable, vmappable JAX: the numbers
of :meth:`scenes.choreography.Choreography.controls_at` and the capture rule of its
``observe``, with t traced and the captures carried as data, so that K ensemble members
(each with its own film, hence its own captures) run the protocol in lockstep in one XLA
program with no host round trip. Under ``jax.vmap`` over members, keep the protocol and
t unbatched (``in_axes=None``): members share the time, not the captures.

* :func:`protocol` turns a host ``Choreography`` into a :class:`Protocol` (times,
  stiffnesses, keyframes and indices of its tracks, tie, drops and tolerances).
* :class:`Captures`: per track that grabs the film where it is (table order), the (N, 3)
  positions at its start and a "taken" flag; the tie's (Q,) start lengths and its flag.
  :func:`empty_captures` starts a run; :func:`captures_from_choreography` converts the
  host's (e.g. after :func:`scenes.bag_run.read_bag_state`) to resume from a saved state.

A pytree, not a static argument: the numbers are leaves, the structure (track and keyframe
kinds, a Ring's optional parts, counts, names, capture slots) is the treedef. So the arrays
are arguments, not baked constants, one compilation serves every protocol of one structure
("full" and "short" differ only in numbers), and nothing hashes array contents.

An active track whose capture was not taken cannot raise inside jit as the host does: its
targets (an uncaptured active tie: its lengths) are NaN, so the step that uses them fails
loudly instead of pulling the film towards zeros (measured with the dense solve: the step
code FACTORIZATION_FAILED, the solve refusing a non-finite gradient; not a retryable code).

Agreement with the host is to round-off, not bit for bit: XLA:CPU fuses a·b + c into one
rounding (an FMA: the path v0 + s·(v1 − v0), the fade k·(1 − s)) and sums means in its own
order. Over a whole coarse-bag protocol: ≤ 1.1e-16 m in targets, 1.4e-17 m in tie lengths,
7.1e-15 N/m in k; ints, forces, tolerances exact (tests/test_choreography_jax.py). A Ring's
r·cos a, r·sin a are taken with NumPy when the protocol is built, so sin/cos add nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import ipcjax  # noqa: F401  (enables float64)
from ipcjax.model import Controls
from scenes.choreography import EPS_T, MIN_LENGTH, Above, Choreography, Ring, SupportTrack


def _pytree(*meta):
    """A frozen dataclass registered as a pytree; the fields named in ``meta`` are static."""
    def wrap(cls):
        cls = dataclass(frozen=True)(cls)
        data = [f.name for f in fields(cls) if f.name not in meta]
        return jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=list(meta))
    return wrap


_f64 = lambda v: np.asarray(v, np.float64)  # noqa: E731
_i32 = lambda v: np.asarray(v, np.int32)  # noqa: E731


@_pytree()
class CaptureKey:
    """Keyframe at ``time`` (s): the track's particles where they were when it started."""
    time: np.ndarray


@_pytree()
class FixedKey:
    """Keyframe at ``time`` (s): fixed (n, 3) targets ``value`` (m)."""
    time: np.ndarray
    value: np.ndarray


@_pytree()
class AboveKey:
    """Keyframe ``Above`` (m; ``about`` filled in): ``source`` raised, moved outward from ``about``."""
    time: np.ndarray
    source: np.ndarray
    about: np.ndarray
    rise: np.ndarray
    outward: np.ndarray


@_pytree()
class RingKey:
    """Keyframe ``Ring`` (m): ``about``'s xy centroid + (dx, dy) = r·(cos a, sin a) per point,
    at height z + mean z of ``level`` + max(z + over_top) of ``about`` (None: no such term)."""
    time: np.ndarray
    about: np.ndarray
    dx: np.ndarray
    dy: np.ndarray
    z: np.ndarray
    level: np.ndarray | None
    over_top: np.ndarray | None


@_pytree("name", "slot")
class Track:
    """One hand (:class:`~scenes.choreography.SupportTrack`); ``slot``: its place in
    :class:`Captures` (-1: needs none). ``fade_from`` None: never fades."""
    t_on: np.ndarray
    t_off: np.ndarray
    k: np.ndarray          # N/m
    fade_from: np.ndarray | None
    index: np.ndarray      # (n,) particles
    keys: tuple
    name: str
    slot: int


@_pytree("name")
class Tie:
    """The tie (:class:`~scenes.choreography.TieTrack`)."""
    t_on: np.ndarray
    t_full: np.ndarray
    pairs: np.ndarray      # (Q, 2) int32
    k: np.ndarray          # N/m
    target: np.ndarray     # (Q,) m
    name: str


@_pytree("n_particles")
class Protocol:
    """Everything time- and track-dependent of a :class:`Choreography`, as pytree leaves."""
    tracks: tuple          # of Track, in table order (= support-slot order)
    tie: Tie
    capture_t_on: np.ndarray  # (C,) s: t_on of the tracks with a capture slot, slot order
    support_index: np.ndarray  # (K,) int32
    sphere_index: np.ndarray
    sphere_mass: np.ndarray    # kg
    drop_times: np.ndarray     # s
    gravity: np.ndarray        # (3,) m/s²
    t_release: np.ndarray
    tol_manipulation: np.ndarray  # m
    tol_released: np.ndarray      # m
    dt: np.ndarray                # s
    eps_t: np.ndarray             # s: slack on phase boundaries (EPS_T)
    n_particles: int


class Captures(NamedTuple):
    """Per member: the positions (m) each capture slot's track grabbed at its start, and the tie's start lengths."""
    positions: jnp.ndarray   # (C, N, 3) float64
    taken: jnp.ndarray       # (C,) bool
    tie_length: jnp.ndarray  # (Q,) float64, m
    tie_taken: jnp.ndarray   # () bool


def _key(tk, v, tr: SupportTrack):
    """One host keyframe (time s, targets) as a key; ValueError unless it places len(index) points."""
    if isinstance(v, str):  # CAPTURE (the host takes any string so)
        key, m = CaptureKey(_f64(tk)), len(tr.index)
    elif isinstance(v, Above):
        about = v.source if v.about is None else v.about
        key, m = AboveKey(_f64(tk), _i32(v.source), _i32(about), _f64(v.rise), _f64(v.outward)), len(v.source)
    elif isinstance(v, Ring):
        a = _f64(v.angles)
        r, z = np.broadcast_to(_f64(v.radius), a.shape), np.array(np.broadcast_to(_f64(v.z), a.shape))
        key, m = RingKey(_f64(tk), _i32(v.about), r * np.cos(a), r * np.sin(a), z,
                         None if v.level is None else _i32(v.level),
                         None if v.over_top is None else _f64(v.over_top)), len(a)
    else:
        key = FixedKey(_f64(tk), _f64(v))
        m = len(key.value) if key.value.shape[1:] == (3,) else -1
    if m != len(tr.index):
        raise ValueError(f"track {tr.name!r}: keyframe at {tk} s places {m} points; expected {len(tr.index)}")
    return key


def protocol(choreo: Choreography) -> Protocol:
    """The :class:`Protocol` of a host choreography (its captures are not read)."""
    slots = [tr.name for tr in choreo.tracks if tr.needs_capture()]
    tracks = tuple(
        Track(_f64(tr.t_on), _f64(tr.t_off), _f64(tr.k), None if tr.fade_from is None else _f64(tr.fade_from),
              _i32(tr.index), tuple(_key(tk, v, tr) for tk, v in tr.keys), tr.name,
              slots.index(tr.name) if tr.needs_capture() else -1)
        for tr in choreo.tracks)
    tie = choreo.tie
    return Protocol(
        tracks, Tie(_f64(tie.t_on), _f64(tie.t_full), _i32(tie.pairs), _f64(tie.k), _f64(tie.target), tie.name),
        _f64([tr.t_on for tr in choreo.tracks if tr.needs_capture()]), _i32(choreo.support_index),
        _i32(choreo.sphere_index), _f64(choreo.sphere_mass), _f64(choreo.drop_times), _f64(choreo.gravity),
        _f64(choreo.t_release), _f64(choreo.tol_manipulation), _f64(choreo.tol_released), _f64(choreo.dt),
        _f64(EPS_T), int(choreo.n_particles))


def empty_captures(p: Protocol) -> Captures:
    """Nothing captured yet (zeros, flags False): the start of a run from t = 0."""
    c, q = len(p.capture_t_on), len(p.tie.pairs)
    return Captures(jnp.zeros((c, p.n_particles, 3)), jnp.zeros(c, bool), jnp.zeros(q), jnp.asarray(False))


def captures_from_choreography(p: Protocol, choreo: Choreography) -> Captures:
    """The host's ``choreo.captures`` (by observe or load_captures) as :class:`Captures`;
    ValueError for a capture of the wrong shape."""
    have = choreo.captures
    def got(name, shape):  # the capture as float64, zeros when not taken
        v = _f64(have.get(name, np.zeros(shape)))
        if v.shape != shape:
            raise ValueError(f"capture {name!r} has shape {v.shape}; expected {shape}")
        return v
    names = [tr.name for tr in p.tracks if tr.slot >= 0]  # slots are in table order
    pos = np.reshape([got(n, (p.n_particles, 3)) for n in names], (len(names), p.n_particles, 3))
    return Captures(jnp.asarray(pos), jnp.asarray([n in have for n in names], bool),
                    jnp.asarray(got(p.tie.name, (len(p.tie.pairs),))), jnp.asarray(p.tie.name in have))


def observe(p: Protocol, cap: Captures, t, x) -> Captures:
    """:meth:`Choreography.observe` at step start t (s, traced): each slot not yet taken with
    t + EPS_T ≥ its t_on takes x (N, 3, m) as float64; the tie, its pairs' lengths likewise."""
    x = jnp.asarray(x).astype(jnp.float64)
    take = ~cap.taken & (t + p.eps_t >= p.capture_t_on)
    tie_take = ~cap.tie_taken & (t + p.eps_t >= p.tie.t_on)
    length = jnp.linalg.norm(x[p.tie.pairs[:, 0]] - x[p.tie.pairs[:, 1]], axis=1)
    return Captures(jnp.where(take[:, None, None], x[None], cap.positions), cap.taken | take,
                    jnp.where(tie_take, length, cap.tie_length), cap.tie_taken | tie_take)


def smoothstep(s):
    """3s² − 2s³ of s clipped to [0, 1] (the host's :func:`~scenes.choreography.smoothstep`)."""
    s = jnp.clip(s, 0.0, 1.0)
    return s * s * (3.0 - 2.0 * s)


def _above(key: AboveKey, x):
    """:meth:`Above.resolve` on captured positions x (N, 3): (n, 3) targets, m."""
    p = x[key.source]
    d = p[:, :2] - x[key.about, :2].mean(axis=0)
    n = jnp.linalg.norm(d, axis=1, keepdims=True)
    # a point on the centroid has no outward direction (the host's MIN_LENGTH guard)
    xy = p[:, :2] + key.outward * jnp.where(n > MIN_LENGTH, d / jnp.maximum(n, MIN_LENGTH), 0.0)
    return jnp.concatenate([xy, (p[:, 2] + key.rise)[:, None]], axis=1)


def _ring(key: RingKey, x):
    """:meth:`Ring.resolve` on captured positions x (N, 3): (n, 3) targets, m."""
    c, z = x[key.about, :2].mean(axis=0), key.z
    if key.level is not None:
        z = z + x[key.level, 2].mean()
    if key.over_top is not None:
        z = z + jnp.max(x[key.about, 2] + key.over_top)
    return jnp.stack([c[0] + key.dx, c[1] + key.dy, z], axis=1)


def _resolve(key, tr: Track, x):
    """One keyframe's (n, 3) targets (m) from the track's captured positions x (N, 3)."""
    kind = {CaptureKey: lambda k, x: x[tr.index], AboveKey: _above, RingKey: _ring,
            FixedKey: lambda k, x: jnp.asarray(k.value)}
    return kind[type(key)](key, x)


def _path(times, vals, t):
    """The host's ``_path``: the smoothstep path through keyframes (static count) at time t."""
    out = vals[-1]
    for i in reversed(range(len(times) - 1)):  # the first segment with t ≤ its end wins
        t0, t1, v0, v1 = times[i], times[i + 1], vals[i], vals[i + 1]
        out = jnp.where(t <= t1, v0 + smoothstep((t - t0) / (t1 - t0)) * (v1 - v0), out)
    return jnp.where(t <= times[0], vals[0], out)


def stiffness(tr: Track, t):
    """:meth:`SupportTrack.stiffness`: k (N/m) at time t (s), faded to 0 from fade_from to t_off."""
    if tr.fade_from is None:
        return tr.k
    s = smoothstep((t - tr.fade_from) / (tr.t_off - tr.fade_from))
    return jnp.where(t <= tr.fade_from, tr.k, tr.k * (1.0 - s))


def _support(p: Protocol, cap: Captures, tr: Track, t):
    """One track's slots at step start t (s): (k (n,) N/m, targets (n, 3) m)."""
    t_end = t + p.dt
    active = (tr.t_on - p.eps_t <= t) & (t < tr.t_off - p.eps_t)
    x = cap.positions[tr.slot] if tr.slot >= 0 else None
    target = _path([k.time for k in tr.keys], [_resolve(k, tr, x) for k in tr.keys], t_end)
    if tr.slot >= 0:  # active but never captured: NaN, so the step fails as non-finite
        target = jnp.where(cap.taken[tr.slot], target, jnp.nan)
    k = jnp.broadcast_to(stiffness(tr, t_end), tr.index.shape)
    return jnp.where(active, k, 0.0), jnp.where(active, target, 0.0)


def _tie(p: Protocol, cap: Captures, t):
    """The tie's (k (Q,) N/m, lengths (Q,) m) at step start t (s)."""
    tie, q = p.tie, p.tie.pairs.shape[0]
    s = smoothstep((t + p.dt - tie.t_on) / (tie.t_full - tie.t_on))
    c = jnp.where(cap.tie_taken, cap.tie_length, jnp.nan)  # active uncaptured: NaN, like the supports
    active = t + p.eps_t >= tie.t_on
    length = c + s * (jnp.minimum(c, tie.target) - c)
    return jnp.where(active, jnp.broadcast_to(tie.k, (q,)), 0.0), jnp.where(active, length, 0.0)


def controls_at(p: Protocol, cap: Captures, t) -> Controls:
    """:meth:`Choreography.controls_at` for the step starting at time t (s), traced: activity
    at t; targets, fades and tie lengths at t + dt. Same shapes and dtypes as the host's."""
    t = jnp.asarray(t, jnp.float64)
    ks, targets = zip(*[_support(p, cap, tr, t) for tr in p.tracks])
    tie_k, tie_length = _tie(p, cap, t)
    waiting = t < p.drop_times - p.eps_t  # gravity cancelled on the spheres not yet dropped
    lift = jnp.where(waiting[:, None], -p.sphere_mass[:, None] * p.gravity[None, :], 0.0)
    force = jnp.zeros((p.n_particles, 3)).at[p.sphere_index].set(lift)
    tol = jnp.where(t < p.t_release - p.eps_t, p.tol_manipulation, p.tol_released)
    f64 = lambda a: jnp.asarray(a, jnp.float64)  # noqa: E731
    return Controls(jnp.asarray(p.support_index, jnp.int32), f64(jnp.concatenate(ks)), f64(jnp.concatenate(targets)),
                    jnp.asarray(p.tie.pairs, jnp.int32), f64(tie_k), f64(tie_length), f64(force), f64(tol))

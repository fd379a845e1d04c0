"""A schedule of hands, ties and gravity cancellation as data, compiled one step at a time
into fixed-size :class:`ipcjax.model.Controls` (the bag's is :func:`scenes.bag.make_choreography`).

* A :class:`SupportTrack` is one hand: ½ k ‖xᵢ − targetᵢ(t)‖² on its particles while
  t_on ≤ t < t_off, along keyframes (time, targets). Targets are an (n, 3) array,
  ``CAPTURE`` (the supported points where they are when the track starts), or an
  :class:`Above` / :class:`Ring` placed relative to particles' positions at the start.
  Between keyframes targets move along a :func:`smoothstep` (zero velocity at each
  keyframe); a faded track's stiffness falls to zero along one, so it lets go without a jolt.
* A :class:`TieTrack` holds springs between pairs, their lengths going from those captured
  when it starts to min(captured, target).
* :class:`Choreography` gives every track its own fixed block of support slots (k = 0 while
  inactive), so shapes never change across a run; :meth:`Choreography.observe` records the
  positions a track depends on when it starts.

Timing convention of :meth:`Choreography.controls_at` ``(step_index, t)``: t is the step's
start time. Activity (supports, ties, gravity cancellation, tolerance) is decided at the
start time; targets, fades and tie lengths are evaluated at the step's end time t + dt,
the instant the implicit step solves for.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import ipcjax  # noqa: F401  (enables float64)
from ipcjax.model import Controls

MIN_LENGTH = 1e-12  # m: a horizontal offset shorter than this has no direction (no outward move)
EPS_T = 1e-9  # s: slack when accumulated step times are compared with phase boundaries
CAPTURE = "capture"


def smoothstep(s):
    s = np.clip(s, 0.0, 1.0)
    return s * s * (3.0 - 2.0 * s)


@dataclass(frozen=True)
class Above:
    """Keyframe targets over other particles: the positions of ``source`` (one particle per
    supported point) when the track starts, raised by ``rise`` (m) and moved ``outward`` (m)
    horizontally away from the xy centroid of ``about``'s positions at that time (``about``
    defaults to ``source``)."""

    source: np.ndarray
    rise: float
    outward: float = 0.0
    about: np.ndarray | None = None

    def resolve(self, x):
        p = np.asarray(x, np.float64)[np.asarray(self.source)].copy()
        about = self.source if self.about is None else self.about
        c = np.asarray(x, np.float64)[np.asarray(about), :2].mean(axis=0)
        d = p[:, :2] - c
        n = np.linalg.norm(d, axis=1, keepdims=True)
        p[:, :2] += self.outward * np.where(n > MIN_LENGTH, d / np.maximum(n, MIN_LENGTH), 0.0)
        p[:, 2] += self.rise
        return p


@dataclass(frozen=True)
class Ring:
    """Keyframe targets on a horizontal circle of ``radius`` (m) at height ``z`` (m), centred
    over the xy centroid of ``about``'s positions when the track starts, one point per
    supported particle at ``angles`` (rad). ``radius`` may give one radius per point (a
    star) and ``z`` one height per point. ``z`` is measured from the floor; with ``level``
    (particle indices) from their mean height at the start; with ``over_top`` (the radii
    of ``about``'s particles, m) from the contents' top at the start, the highest
    ``z + radius`` among ``about``."""

    about: np.ndarray
    radius: float | np.ndarray
    z: float | np.ndarray
    angles: np.ndarray
    level: np.ndarray | None = None
    over_top: np.ndarray | None = None

    def resolve(self, x):
        x = np.asarray(x, np.float64)
        about = np.asarray(self.about)
        c = x[about, :2].mean(axis=0)
        a = np.asarray(self.angles, np.float64)
        r = np.broadcast_to(np.asarray(self.radius, np.float64), a.shape)
        z = np.broadcast_to(np.asarray(self.z, np.float64), a.shape)
        if self.level is not None:
            z = z + float(x[np.asarray(self.level), 2].mean())
        if self.over_top is not None:
            z = z + float(np.max(x[about, 2] + np.asarray(self.over_top, np.float64)))
        return np.stack([c[0] + r * np.cos(a), c[1] + r * np.sin(a), z], axis=1)


@dataclass
class SupportTrack:
    """One hand: ½ k ‖xᵢ − targetᵢ(t)‖² on ``index`` while t_on ≤ t < t_off; with
    ``fade_from``, k ramps smoothly to 0 between fade_from and t_off (evaluated at the
    step's end time, like the targets), so the hand lets go without a jolt.

    keys: list of (time s, targets), where targets are an (n, 3) array of fixed positions,
    ``CAPTURE`` (the supported points where they are when the track starts), or an
    :class:`Above` / :class:`Ring` placed relative to particles' positions at the start.
    """

    name: str
    t_on: float
    t_off: float
    index: np.ndarray
    k: float
    keys: list
    fade_from: float | None = None  # s: from here k ramps to 0 along a smoothstep ending at t_off

    def stiffness(self, t: float) -> float:
        """k (N/m) at time t (s) within [t_on, t_off): ``k``, faded out after ``fade_from``."""
        if self.fade_from is None or t <= self.fade_from:
            return float(self.k)
        return float(self.k) * (1.0 - float(smoothstep((t - self.fade_from) / (self.t_off - self.fade_from))))

    def needs_capture(self) -> bool:
        return any(isinstance(v, (str, Above, Ring)) for _, v in self.keys)

    def resolve(self, x):
        """The keyframes as (time, (n, 3) array) with captures taken from positions x (N, 3)."""
        out = []
        for tk, v in self.keys:
            if isinstance(v, str):
                v = np.asarray(x, np.float64)[self.index]
            elif isinstance(v, (Above, Ring)):
                v = v.resolve(x)
            v = np.asarray(v, np.float64)
            if v.shape != (len(self.index), 3):
                raise ValueError(f"track {self.name!r}: keyframe at {tk} s has shape {v.shape}, "
                                 f"expected ({len(self.index)}, 3)")
            out.append((tk, v))
        return out


@dataclass
class TieTrack:
    """Tie springs ½ k (‖xᵢ − xⱼ‖ − L(t))² from t_on; L goes from the captured lengths to
    min(captured, target) along a smoothstep ending at t_full."""

    name: str
    t_on: float
    t_full: float
    pairs: np.ndarray   # (Q, 2)
    k: float
    target: np.ndarray  # (Q,) m


def _path(keys, t):
    """Targets at time t along the smoothstep path through resolved keyframes (time, array)."""
    times = [tk for tk, _ in keys]
    vals = [v for _, v in keys]
    if t <= times[0]:
        return vals[0]
    for (t0, v0), (t1, v1) in zip(zip(times, vals), zip(times[1:], vals[1:])):
        if t <= t1:
            s = smoothstep((t - t0) / (t1 - t0))
            return v0 + s * (v1 - v0)
    return vals[-1]


@dataclass
class Choreography:
    """A schedule of tracks as data, compiled into fixed-size :class:`Controls` (the bag's,
    docs/spec.md §5, is :func:`scenes.bag.make_choreography`).

    Support slots: the tracks' particles concatenated in table order (a particle may sit in
    several tracks' slots; each is inactive outside its track). Tie slots: the tie track's
    pairs. Captures are filled by :meth:`observe`: for a track whose keyframes depend on
    where the film is (``CAPTURE``, :class:`Above`, :class:`Ring`), all particle positions
    (N, 3) when the track starts; for the tie, its pairs' lengths when it starts (in the
    bag, 8.40 s; 6.95 s in the short protocol).
    """

    n_particles: int
    dt: float
    tracks: list
    tie: TieTrack
    sphere_index: np.ndarray
    sphere_mass: np.ndarray
    drop_times: np.ndarray
    gravity: np.ndarray
    t_release: float             # s: all support released; the tolerance changes here
    tol_manipulation: float      # m: Newton's tolerance on max|Δx| (Controls.tolerance) before t_release
    tol_released: float          # m: ... and from t_release on
    phases: tuple                # ((name, t_start s, t_end s), ...): for phase_at
    protocol: str = "full"       # the scenes.bag.PROTOCOLS entry this schedule follows
    captures: dict = field(default_factory=dict)

    # ---- slot layout
    @property
    def support_index(self) -> np.ndarray:
        return np.concatenate([tr.index for tr in self.tracks]).astype(np.int32)

    def slots(self, name: str) -> slice:
        """The support-slot range of the named track."""
        s = 0
        for tr in self.tracks:
            if tr.name == name:
                return slice(s, s + len(tr.index))
            s += len(tr.index)
        raise KeyError(name)

    def track(self, name: str) -> SupportTrack:
        return next(tr for tr in self.tracks if tr.name == name)

    def phase_at(self, t: float) -> str:
        for name, a, b in self.phases:
            if a - EPS_T <= t < b - EPS_T:
                return name
        return self.phases[-1][0]

    # ---- captures
    def observe(self, t: float, x) -> list:
        """Record grab positions for tracks (and tie lengths) starting at or before the
        step start time t, from positions x (N, 3). Returns the names captured now."""
        x = np.asarray(x, dtype=np.float64)
        done = []
        for tr in self.tracks:
            if tr.needs_capture() and tr.name not in self.captures and t + EPS_T >= tr.t_on:
                self.captures[tr.name] = x.copy()
                done.append(tr.name)
        if self.tie.name not in self.captures and t + EPS_T >= self.tie.t_on:
            p = self.tie.pairs
            self.captures[self.tie.name] = np.linalg.norm(x[p[:, 0]] - x[p[:, 1]], axis=1)
            done.append(self.tie.name)
        return done

    def keyframes(self, name: str, t: float | None = None) -> list:
        """The named track's keyframes resolved to (time, (n, 3) targets).

        Raises:
            RuntimeError: the track depends on where the film is when it starts but
                :meth:`observe` has not recorded that (``t`` is only used in the message).
        """
        tr = self.track(name)
        if not tr.needs_capture():
            return tr.resolve(None)
        cap = self.captures.get(name)
        if cap is None:
            when = "" if t is None else f" at t = {t:.4f} s"
            raise RuntimeError(f"support track {name!r} is active{when} but its grab positions were not "
                               f"captured; call observe(t, x) first")
        return tr.resolve(cap)

    # ---- compile
    def controls_at(self, step_index: int, t: float) -> Controls:
        """Controls for the step starting at time t (s); see the module's timing convention.

        Raises:
            RuntimeError: a track that grabs the film where it is has started but
                :meth:`observe` has not recorded its grab positions.
        """
        import jax.numpy as jnp

        t = float(t)
        t_end = t + self.dt
        ks, targets = [], []
        for tr in self.tracks:
            n = len(tr.index)
            active = tr.t_on - EPS_T <= t < tr.t_off - EPS_T
            if active:
                targets.append(_path(self.keyframes(tr.name, t), t_end))
                ks.append(np.full(n, tr.stiffness(t_end)))
            else:
                targets.append(np.zeros((n, 3)))
                ks.append(np.zeros(n))
        tie = self.tie
        q = len(tie.pairs)
        if t + EPS_T >= tie.t_on:
            cap = self.captures.get(tie.name)
            if cap is None:
                raise RuntimeError(f"tie {tie.name!r} is active at t = {t:.4f} s but its start lengths were "
                                   f"not captured; call observe(t, x) first")
            s = smoothstep((t_end - tie.t_on) / (tie.t_full - tie.t_on))
            tie_len = cap + s * (np.minimum(cap, tie.target) - cap)
            tie_k = np.full(q, tie.k)
        else:
            tie_len, tie_k = np.zeros(q), np.zeros(q)
        force = np.zeros((self.n_particles, 3))
        waiting = t < self.drop_times - EPS_T
        force[self.sphere_index[waiting]] = -self.sphere_mass[waiting, None] * self.gravity[None, :]
        tol = self.tol_manipulation if t < self.t_release - EPS_T else self.tol_released
        return Controls(
            support_index=jnp.asarray(self.support_index, jnp.int32),
            support_k=jnp.asarray(np.concatenate(ks)),
            support_target=jnp.asarray(np.concatenate(targets, axis=0)),
            tie_pairs=jnp.asarray(tie.pairs, jnp.int32),
            tie_k=jnp.asarray(tie_k),
            tie_length=jnp.asarray(tie_len),
            force=jnp.asarray(force),
            tolerance=jnp.asarray(tol, jnp.float64),
        )

    def captures_npz(self) -> dict:
        return {f"capture_{k}": v for k, v in self.captures.items()}

    def load_captures(self, npz) -> None:
        """Restore captures written by :meth:`captures_npz` (e.g. from a run's state.npz).

        Raises:
            ValueError: a track's capture is not (N, 3) positions of this scene's particles.
        """
        names = {tr.name for tr in self.tracks}
        for key in npz.files:
            if key.startswith("capture_"):
                name, v = key[len("capture_"):], np.asarray(npz[key])
                if name in names and v.shape != (self.n_particles, 3):
                    raise ValueError(f"capture {name!r} has shape {v.shape}; expected ({self.n_particles}, 3) "
                                     f"positions of every particle (a state saved by an older choreography?)")
                self.captures[name] = v

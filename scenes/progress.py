"""The progress bar of the scene runs (``ipcjax drape``, ``ipcjax bag``), on stderr.

Its ETA is :class:`RunningEta`'s, not tqdm's: tqdm's default estimate divides the steps
left by a rate smoothed over the last few steps, so on the bag, whose steps cost from
0.05 to over 1 s depending on the phase and on one step's subdivisions, it swung between
1:10:12 and 2:13:36 within a second. Here the steps left in each phase are priced at the
mean wall time of the steps already run in that phase, and those of a phase not reached
yet at the mean of all steps so far.
"""
from __future__ import annotations

import time
from collections.abc import Sequence


class RunningEta:
    """Seconds left from the running mean cost of each phase.

    Args:
      phases: the phase of every step to run, in order (None: ``total`` steps of one phase).
      total: the number of steps to run, when ``phases`` is None.

    :meth:`record` takes the wall seconds of the next step in that order; :meth:`eta`
    prices every step not yet recorded at the mean of the recorded steps of its phase, or
    at the mean of all recorded steps where its phase has none yet. None before the first
    record (no cost measured yet).
    """

    def __init__(self, phases: Sequence[str] | None = None, total: int | None = None):
        if phases is None:
            if total is None or total < 0:
                raise ValueError(f"RunningEta needs phases or a total ≥ 0; got total={total!r}")
            phases = [""] * int(total)
        self.phases = list(phases)
        self.done = 0
        self._sum: dict[str, float] = {}
        self._n: dict[str, int] = {}
        self._left: dict[str, int] = {}
        for p in self.phases:
            self._left[p] = self._left.get(p, 0) + 1

    def record(self, seconds: float, phase: str | None = None) -> None:
        """The next step took ``seconds`` (its phase is the next of ``phases``; ``phase``,
        when given, must agree — a check that the caller counts the same steps)."""
        if self.done >= len(self.phases):
            raise ValueError(f"RunningEta: more steps recorded than the {len(self.phases)} to run")
        p = self.phases[self.done]
        if phase is not None and phase != p:
            raise ValueError(f"RunningEta: step {self.done} is in phase {p!r}, not {phase!r}")
        self._sum[p] = self._sum.get(p, 0.0) + float(seconds)
        self._n[p] = self._n.get(p, 0) + 1
        self._left[p] -= 1
        self.done += 1

    def mean(self, phase: str | None = None) -> float | None:
        """Mean seconds per recorded step (of ``phase``; of all when None or not seen)."""
        if phase is not None and self._n.get(phase):
            return self._sum[phase] / self._n[phase]
        n = sum(self._n.values())
        return sum(self._sum.values()) / n if n else None

    def eta(self) -> float | None:
        """Seconds for the steps not yet recorded (None before the first record)."""
        if not self._n:
            return None
        return sum(left * self.mean(p) for p, left in self._left.items() if left > 0)


def _format_eta(seconds):
    if seconds is None:
        return "?"
    from tqdm import tqdm

    return tqdm.format_interval(seconds)


def _bar_class():
    from tqdm import tqdm

    class EtaBar(tqdm):
        """tqdm with :class:`RunningEta`'s estimate in place of its own."""

        eta_model: RunningEta | None = None

        @property
        def format_dict(self):
            d = super().format_dict
            d["eta_mean"] = _format_eta(None if self.eta_model is None else self.eta_model.eta())
            return d

    return EtaBar


BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{eta_mean}{postfix}]"


def first_step_bar(job: str, total: int, bar=None, *, enabled: bool = True, phases: Sequence[str] | None = None):
    """Count one more step on ``bar``; with no bar yet, start one that counts this first
    step as done, so that its rate and ETA leave out the jit compilation that step paid
    for. Returns the bar (None when not ``enabled``).

    The ETA is a :class:`RunningEta` over the wall time between calls (each step with its
    host-side work): ``phases``, given when the bar starts, names the phase of each of the
    ``total`` steps (the first included); without them every step counts alike.
    """
    if not enabled:
        return None
    now = time.perf_counter()
    if bar is None:
        bar = _bar_class()(total=total, initial=1, desc=job, unit="step", bar_format=BAR_FORMAT)
        bar.eta_model = RunningEta(list(phases)[1:] if phases is not None else None,
                                   total=None if phases is not None else max(total - 1, 0))
        bar.last_step_end = now
        bar.refresh()
        return bar
    if bar.eta_model.done < len(bar.eta_model.phases):  # a caller counting past total keeps its bar
        bar.eta_model.record(now - bar.last_step_end)
    bar.last_step_end = now
    bar.update(1)
    return bar

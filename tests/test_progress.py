"""The progress bar's ETA (scenes/progress.py) on synthetic step timings: the running mean
per phase, never the last step's rate."""
from __future__ import annotations

import io

import pytest

from scenes.progress import RunningEta, first_step_bar


def test_no_estimate_before_a_step_is_measured():
    assert RunningEta(total=10).eta() is None


def test_eta_is_the_running_mean_times_the_steps_left():
    eta = RunningEta(total=100)
    for s in (1.0, 3.0):
        eta.record(s)
    assert eta.eta() == pytest.approx(98 * 2.0)


def test_one_slow_step_moves_the_estimate_by_its_share_of_the_mean():
    # tqdm's smoothed rate after a 100 s step (a subdivided one) predicts ~100 s per step left
    eta = RunningEta(total=200)
    for _ in range(99):
        eta.record(1.0)
    before = eta.eta()
    eta.record(100.0)
    assert before == pytest.approx(101 * 1.0)
    assert eta.eta() == pytest.approx(100 * (199.0 / 100))


def test_each_phase_is_priced_at_its_own_mean_and_unseen_phases_at_the_overall_mean():
    eta = RunningEta(["place"] * 4 + ["unfold"] * 6 + ["tie"] * 10)
    for s in (0.1, 0.3):
        eta.record(s)  # two place steps: mean 0.2
    assert eta.eta() == pytest.approx(2 * 0.2 + 6 * 0.2 + 10 * 0.2)
    for s in (0.1, 0.3, 1.0, 3.0):
        eta.record(s)  # the rest of place, and two unfold steps: mean 2.0
    overall = (0.1 + 0.3 + 0.1 + 0.3 + 1.0 + 3.0) / 6
    assert eta.mean("place") == pytest.approx(0.2)
    assert eta.eta() == pytest.approx(4 * 2.0 + 10 * overall)


def test_a_phase_that_comes_back_keeps_its_mean():
    eta = RunningEta(["hold", "gather", "hold"])
    eta.record(2.0)
    eta.record(10.0)
    assert eta.eta() == pytest.approx(2.0)


def test_counting_past_the_steps_or_out_of_phase_is_an_error():
    eta = RunningEta(["a", "b"])
    with pytest.raises(ValueError, match="phase 'a'"):
        eta.record(1.0, phase="b")
    eta.record(1.0, phase="a")
    eta.record(1.0)
    with pytest.raises(ValueError, match="more steps"):
        eta.record(1.0)


def test_the_bar_shows_the_running_mean_eta(monkeypatch):
    clock = iter([0.0, 1.0, 3.0, 4.0])  # a step of 1 s, then one of 2 s
    monkeypatch.setattr("scenes.progress.time.perf_counter", lambda: next(clock))
    out = io.StringIO()
    import tqdm

    real = tqdm.tqdm.__init__
    monkeypatch.setattr(tqdm.tqdm, "__init__", lambda self, *a, **k: real(self, *a, file=out, mininterval=0, **k))
    bar = first_step_bar("bag", 10, enabled=True, phases=["x"] * 10)
    for _ in range(2):
        bar = first_step_bar("bag", 10, bar)
    assert bar.n == 3
    assert bar.eta_model.eta() == pytest.approx(7 * 1.5)
    assert "00:10<" in out.getvalue() or "<00:10" in out.getvalue()
    bar.close()


def test_disabled_bar_is_none():
    assert first_step_bar("bag", 10, enabled=False) is None

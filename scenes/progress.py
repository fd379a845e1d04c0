"""The progress bar of the scene runs (``ipcjax drape``, ``ipcjax bag``), on stderr."""
from __future__ import annotations


def first_step_bar(job: str, total: int, bar=None, *, enabled: bool = True):
    """Count one more step on ``bar``; with no bar yet, start one that counts this first
    step as done, so that its rate and ETA leave out the jit compilation that step paid
    for. Returns the bar (None when not ``enabled``)."""
    if not enabled:
        return None
    if bar is None:
        from tqdm import tqdm

        return tqdm(total=total, initial=1, desc=job, unit="step")
    bar.update(1)
    return bar

"""Run folders: the one place that writes and checks what a job leaves on disk.

Every JSON file a job writes goes through :func:`write_json`, so the output is always
valid JSON (RFC 8259 has no ``Infinity`` or ``NaN``): a non-finite float, such as the
smallest gap of a run that measured none, is written as ``null``. :func:`prepare` makes
the output folder and proves it writable *before* any simulation starts, so a bad
``--out`` costs nothing.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np


def json_safe(obj):
    """A JSON-encodable copy of ``obj``: NumPy scalars and arrays become Python numbers and
    lists, non-finite floats become ``None``, tuples become lists."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(float(obj)) else None
    return obj


def dumps(obj) -> str:
    """``obj`` as indented, strictly valid JSON (see :func:`json_safe`)."""
    return json.dumps(json_safe(obj), indent=2, allow_nan=False)


def write_json(path, obj) -> str:
    """Write ``obj`` to ``path`` as strictly valid JSON; returns the text written."""
    text = dumps(obj)
    with open(path, "w") as f:
        f.write(text + "\n")
    return text


def prepare(out) -> str:
    """Create the run folder ``out`` and check that a file can be written in it.

    Raises:
        OSError: naming the folder, when it cannot be created or written.
    """
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise OSError(f"cannot write the run folder {out!r}: {e.strerror or e}") from None
    return out

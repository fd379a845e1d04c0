"""The measured targets of the shape fits, (neck x, neck y, flap) in m: from ``ipcjax fit``'s
flags, in m or mm, or from a JSON file; each mistake is one error naming the flag or the file."""
from __future__ import annotations

import json
import os

import numpy as np


def check_targets(t, source: str) -> np.ndarray:
    """(neck x, neck y, flap) in m as a float array; ValueError naming ``source`` otherwise."""
    if isinstance(t, (list, tuple)) and any(isinstance(v, (str, bool)) for v in t):
        raise ValueError(f"{source}: targets must be three numbers (m), not strings or booleans; got {t!r}")
    try:
        t = np.asarray(t, np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{source}: targets must be three numbers (m); got {t!r}") from None
    if t.shape != (3,) or not np.all(np.isfinite(t)) or t[0] <= 0 or t[1] <= 0:
        raise ValueError(f"{source}: targets must be finite with positive neck widths; got {t.tolist()}")
    return t


class FlagError(ValueError):
    """Target flags given in a combination that means nothing (a usage error)."""


TARGET_FLAGS = (("--neck-x", "neck width along x"), ("--neck-y", "neck width along y"), ("--flap", "flap height"))
PLAUSIBLE_M = (1e-4, 1.0)  # m: a neck width or flap height outside 0.1 mm … 1 m is almost surely in the other unit


def parse_length(value, flag: str, what: str, unit: str = "m") -> float:
    """One measurement flag's value in m.

    ``value`` is a number in ``unit`` ("m" for ``--neck-x``, "mm" for ``--neck-x-mm``) or a
    string: a number, taken in ``unit``, or a number with its unit (``38.83mm``,
    ``0.03883m``), which wins over the flag's. Non-finite values pass (the target check
    refuses them); None (not given) stays None.

    Raises:
        FlagError: not a number, or a magnitude outside 0.1 mm … 1 m: the message says which
            unit the value was almost surely meant in (a neck of 38.83 m is 38.83 mm).
    """
    if value is None:
        return None
    text = str(value).strip().lower()
    for suffix in ("mm", "m"):
        if text.endswith(suffix):
            text, unit = text[:-len(suffix)].strip(), suffix
            break
    try:
        number = float(text)
    except ValueError:
        raise FlagError(f"{flag} {value!r}: not a length; give a number in {unit}, or a number with its unit "
                        f"(38.83mm, 0.03883m)") from None
    metres = number * (1e-3 if unit == "mm" else 1.0)
    lo, hi = PLAUSIBLE_M
    if not np.isfinite(metres) or metres == 0 or lo <= abs(metres) < hi:
        return metres
    base = flag[:-3] if flag.endswith("-mm") else flag
    message = f"{flag} {value}: a {what} of {number:g} {unit} is implausible (expected 0.1 mm to 1 m)"
    if unit == "m" and lo <= abs(number) * 1e-3 < hi:
        message += f"; it is almost surely in mm: write {base}-mm {number:g} or {base} {number:g}mm"
    elif unit == "mm" and lo <= abs(number) < hi:
        message += f"; it is almost surely in m: write {base} {number:g} or {base}-mm {number * 1e3:g}"
    raise FlagError(message)


def targets_from(path: str | None, values, values_mm=(None, None, None)) -> np.ndarray | None:
    """The measured targets of ``ipcjax fit``, in m: from the JSON file ``path``
    (``--targets``), or from ``values`` (``--neck-x``, ``--neck-y``, ``--flap``: m, or with a
    unit, ``38.83mm``) and ``values_mm`` (``--neck-x-mm``, ``--neck-y-mm``, ``--flap-mm``:
    mm), None where not given (:func:`parse_length`), or None (synthetic targets) when
    none is given.

    Raises:
        FlagError: both sources, a measurement in both units, only some of the three,
            values out of range or implausible for their unit.
        ValueError, OSError: from :func:`load_targets`.
    """
    for (flag, _), v, v_mm in zip(TARGET_FLAGS, values, values_mm):
        if v is not None and v_mm is not None:
            raise FlagError(f"give {flag} (m) or {flag}-mm (mm), not both")
    values = [parse_length(v, flag, what) if v_mm is None else parse_length(v_mm, f"{flag}-mm", what, "mm")
              for (flag, what), v, v_mm in zip(TARGET_FLAGS, values, values_mm)]
    given = [v is not None for v in values]
    if path is not None:
        if any(given):
            raise FlagError("give --targets or --neck-x, --neck-y and --flap, not both")
        return load_targets(path)
    if not any(given):
        return None
    if not all(given):
        raise FlagError("give all three of --neck-x, --neck-y and --flap (in m, or their -mm forms in mm)")
    try:
        return check_targets(tuple(values), "--neck-x, --neck-y, --flap")
    except ValueError as e:
        raise FlagError(str(e)) from None


def check_window_flags(state_path: str | None, steps: int) -> None:
    """The ``--state`` and ``--window`` of ``ipcjax fit --scene bag``; FlagError if unusable."""
    if state_path is None:
        raise FlagError("--scene bag --window needs --state: a state.npz written by `ipcjax bag` "
                        "(e.g. runs/bag/state.npz)")
    if not os.path.exists(state_path):
        raise FlagError(f"--state {state_path}: no such file")
    if steps < 1:
        raise FlagError(f"--window must be ≥ 1; got {steps}")


def load_targets(path: str) -> np.ndarray:
    """Measured (neck x, neck y, flap) in m from a JSON file.

    The file holds an object with ``neck_x_m``, ``neck_y_m`` and ``flap_m`` (m), or with
    ``neck_width_mm`` ([x, y]) and ``flap_height_mm`` (mm), at the top level or under
    ``measurements`` (so an ``ipcjax bag`` summary.json works as is).

    Raises:
        FileNotFoundError / OSError: the file cannot be read (the message names it).
        ValueError: not JSON, not an object, keys missing, or values not finite numbers.
    """
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"targets file {path}: no such file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"targets file {path}: not a text file ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise OSError(f"targets file {path}: cannot read it ({e.strerror or e})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"targets file {path}: not valid JSON ({e.msg} at line {e.lineno}, "
                         f"column {e.colno})") from None
    if isinstance(d, dict) and isinstance(d.get("measurements"), dict):
        d = d["measurements"]
    if not isinstance(d, dict):
        raise ValueError(f"targets file {path}: expected a JSON object with neck_x_m, neck_y_m, flap_m; "
                         f"got a JSON {type(d).__name__}")
    try:
        if "neck_width_mm" in d:
            w = d["neck_width_mm"]
            if not isinstance(w, (list, tuple)) or len(w) != 2:
                raise ValueError(f"targets file {path}: neck_width_mm must be [x, y] in mm; got {w!r}")
            t = [1e-3 * w[0], 1e-3 * w[1], 1e-3 * d["flap_height_mm"]]
        else:
            t = [d["neck_x_m"], d["neck_y_m"], d["flap_m"]]
    except KeyError as e:
        raise ValueError(f"targets file {path}: needs neck_x_m, neck_y_m, flap_m (m) or neck_width_mm, "
                         f"flap_height_mm (mm); missing {e}") from None
    except TypeError:
        raise ValueError(f"targets file {path}: the measurements must be numbers; got {d!r}") from None
    return check_targets(t, f"targets file {path}")

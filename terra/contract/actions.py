"""The world model's action contract: each frame's action is ``[6, 3]`` floats ``[y, x, time]``."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from terra.core.errors import TerraInputError, past

FRAME_RATE_HZ = 10.0  # frames of a Terra clip
FUTURE_RATE_HZ = 20.0  # points of an instruction trajectory
FUTURE_POINTS = 60  # 3 s at 20 Hz
MAX_SPEED_MPS = 100.0  # 360 km/h: the fastest a trajectory may move between two samples
NUM_ACTION_TOKENS = 6
PATH_START = 9  # index of the first sampled point (0.45 s)
PATH_STEP = 10  # points between samples (0.5 s)
ACTION_POINT_INDICES = PATH_START + PATH_STEP * np.arange(NUM_ACTION_TOKENS)  # 9, 19, ..., 59
ACTION_TIMES = (ACTION_POINT_INDICES / FUTURE_RATE_HZ).astype(np.float32)  # 0.45, 0.95, ..., 2.95
MAX_ACTION_M = 2 * MAX_SPEED_MPS * FUTURE_POINTS / FUTURE_RATE_HZ  # |value| of actions / instruction points (600 m)


RULE = "num_context + num_frames - 1: an action for every frame but the last generated"


def validate_actions(actions: Any, source: str = "actions", min_frames: int = 1) -> np.ndarray:
    """Check an actions array ``[T, 6, 3]`` with ``T >= min_frames`` and return it as float32."""
    arr = finite_array(actions, source)
    if arr.ndim != 3 or arr.shape[1:] != (NUM_ACTION_TOKENS, 3):
        raise TerraInputError(
            f"{source}: actions must have shape [frames, {NUM_ACTION_TOKENS}, 3] ([y, x, time] per slot), "
            f"got {list(arr.shape)}"
        )
    if len(arr) < min_frames:
        raise TerraInputError(
            f"{source}: covers {len(arr)} frames but the rollout needs actions for {min_frames} ({RULE}); "
            "give a longer trajectory or generate fewer frames"
        )
    return in_reach(arr, source).astype(np.float32)


def finite_array(value: Any, source: str) -> np.ndarray:
    """``value`` (numbers in nested lists, or a real-valued array) as a float64 array of finite numbers."""
    if isinstance(value, (list, tuple)):
        try:
            cells = np.asarray(value, dtype=object)
        except (TypeError, ValueError, RecursionError):
            raise TerraInputError(f"{source}: holds rows of unequal length") from None
        kinds = set(map(type, cells.flat))
        if not all(issubclass(kind, _NUMBERS) and not issubclass(kind, _BOOLEANS) for kind in kinds):
            bad = next(cell for cell in cells.flat if not isinstance(cell, _NUMBERS) or isinstance(cell, _BOOLEANS))
            raise TerraInputError(f"{source}: {_not_a_number(bad)}")
    else:
        kind = np.asarray(value).dtype.kind
        if kind not in "iuf":
            what = {"b": "booleans", "U": "strings", "S": "bytes", "c": "complex numbers"}.get(kind, "values")
            raise TerraInputError(f"{source}: holds {what}, not {'real ' if kind == 'c' else ''}numbers; give real "
                                  "numbers (a float array)")
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise TerraInputError(f"{source}: holds values that are not numbers or rows of unequal length") from None
    if not np.all(np.isfinite(arr)):
        raise TerraInputError(f"{source}: holds NaN or inf; replace them with finite numbers")
    return arr


def number_from_text(text: str) -> float:
    """A number written as text (a CSV cell): sign, digits, decimal point, exponent only; ``nan``/``inf`` read; else
    ValueError."""
    stripped = text.strip()
    if not _NUMBER_TEXT.fullmatch(stripped):
        raise ValueError(f"{stripped[:40]!r} is not a number")
    return float(stripped)


_NUMBERS = (int, float, np.integer, np.floating)
_BOOLEANS = (bool, np.bool_)
_NUMBER_TEXT = re.compile(r"[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)


def _not_a_number(cell: Any) -> str:
    if isinstance(cell, (list, tuple)):
        return "holds rows of unequal length"
    if isinstance(cell, _BOOLEANS):
        return f"holds values that are not numbers: {str(bool(cell)).lower()} (a boolean); give a number"
    if cell is None:
        return "holds values that are not numbers: null; give a number"
    text = repr(cell)
    text = text if len(text) <= 40 else f"{text[:37]}..."
    if isinstance(cell, str):
        return f"holds values that are not numbers: the string {text}; write numbers without quotes"
    return f"holds values that are not numbers: {text} (a {type(cell).__name__})"


def in_reach(values: np.ndarray, source: str) -> np.ndarray:
    """``values`` (action or instruction-trajectory entries, metres within 3 s) if none exceeds :data:`MAX_ACTION_M`."""
    if values.size and np.abs(values).max() > MAX_ACTION_M:
        raise TerraInputError(f"{source}: holds {past(np.abs(values).max(), MAX_ACTION_M)}, but points 3 s ahead lie "
                              f"within {MAX_ACTION_M:g} m; give positions in metres")
    return values

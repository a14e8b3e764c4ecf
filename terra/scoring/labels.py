"""ACT-Bench's nine action classes, how a sample's ``label`` maps to one, and its reference trajectory in the
estimator's frame (ACT-Bench's ``act_bench/compute_score.py``)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

LABELS = (
    "curving_to_left",
    "curving_to_right",
    "straight_constant_high_speed",
    "straight_constant_low_speed",
    "straight_accelerating",
    "straight_decelerating",
    "starting",
    "stopping",
    "stopped",
)
SUMMARY_ORDER = tuple(sorted(LABELS))
SHORT_NAMES = {  # axis labels of the confusion matrix
    "curving_to_left": "Curv. Left", "curving_to_right": "Curv. Right", "straight_constant_high_speed": "Str. Fast",
    "straight_constant_low_speed": "Str. Slow", "straight_accelerating": "Str. Accel",
    "straight_decelerating": "Str. Decel", "starting": "Starting", "stopping": "Stopping", "stopped": "Stopped",
}
CONSTANT_SPEED = "straight_constant_speed"
LOW_SPEED_MAX_KMH = 20  # straight_constant_speed/<N>kmph with N at most this is low speed
SPEED = re.compile(r"(\d+)kmph$")


def command_label(label: Any) -> str | None:
    """The class of an ACT-Bench ``label``, or None when it is none of the nine (the sample is left out)."""
    if not isinstance(label, str) or label.count("/") != 1:
        raise ValueError(f"label {label!r} is not 'category/subcategory' (e.g. 'curving_to_left/r20m')")
    category, subcategory = label.split("/")
    if category == CONSTANT_SPEED:
        speed = SPEED.search(subcategory)
        if speed is None:
            raise ValueError(f"label {label!r} has no speed; {CONSTANT_SPEED} labels end in <N>kmph, e.g. "
                             f"'{CONSTANT_SPEED}/30kmph'")
        low = int(speed.group(1)) <= LOW_SPEED_MAX_KMH
        return "straight_constant_low_speed" if low else "straight_constant_high_speed"
    return category if category in LABELS else None


def reference_waypoints(trajectory: Any, num_points: int) -> np.ndarray:
    """The first ``num_points`` points of a ``reference_traj`` in the estimator's frame ``(-y, x)``, ``[num_points,
    2]``."""
    try:
        points = np.asarray(trajectory, dtype=np.float64)
    except (TypeError, ValueError):
        points = None
    if points is None or points.ndim != 2 or points.shape[1] < 2:
        raise ValueError("reference_traj must be a list of [x, y, ...] points")
    if len(points) < num_points:
        raise ValueError(f"reference_traj has {len(points)} points; scoring compares the first {num_points}")
    points = points[:num_points, 1::-1].copy()  # (y, x)
    points[:, 0] *= -1
    if not np.isfinite(points).all():
        raise ValueError("reference_traj holds a number that is not finite")
    return points

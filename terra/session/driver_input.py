"""One frame's action from what a driver gives: an actions array, a short trajectory, steering and speed, a
manoeuvre, or arrow keys. Every form ends as ``[6, 3]`` actions ``[y, x, time]`` in the frame's ego frame.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from terra.config.checks import check_number
from terra.contract.actions import ACTION_TIMES, FRAME_RATE_HZ, finite_array, validate_actions
from terra.core.errors import TerraInputError
from terra.inputs.actions import actions_for_manoeuvre, trajectory_action
from terra.inputs.ego_motion import along_arc
from terra.inputs.routes import ROUTE_HINTS

MAX_SPEED_KMH = 130.0
ACCEL_RANGE = (-8.0, 4.0)  # m/s^2 a drive action may ask for
KEY_ACCEL = 2.5  # m/s^2 while the up key is held
KEY_BRAKE = -4.0  # m/s^2 while the down key is held
KEY_STEER_RATE = 0.25  # steering change per frame towards the held arrow (full lock in 0.4 s)
KEYS = ("up", "down", "left", "right")
ACTION_KEYS = {"actions": {"actions"}, "trajectory": {"trajectory"}, "steer": {"steer", "speed_kmh", "accel_mps2"},
               "manoeuvre": {"manoeuvre", "speed_kmh"}}  # each kind of action mapping and the keys it takes
ACTION_KINDS = tuple(ACTION_KEYS)
NO_STEP_ROUTE = ("a step takes no route: a session on the built-in world is told its scene's road at every step, one "
                 "on frames or codes of your own runs without (docs/serve.md)")


def max_curvature(speed_mps: float) -> float:
    """Curvature (1/m) of full steering at ``speed_mps``: radius at least 12 m and lateral acceleration <= 6 m/s^2."""
    return min(1.0 / 12.0, 6.0 / max(speed_mps, 1e-3) ** 2)


def drive_action(steer: float, speed_kmh: float, accel_mps2: float = 0.0) -> np.ndarray:
    """``[6, 3]`` action of an arc: ``steer`` in [-1, 1] (left > 0) at ``speed_kmh``, changing at ``accel_mps2``."""
    steer = check_number(steer, "steer", -1.0, 1.0)
    v0 = check_number(speed_kmh, "speed_kmh", 0.0, MAX_SPEED_KMH) / 3.6
    accel = check_number(accel_mps2, "accel_mps2", *ACCEL_RANGE)
    t = ACTION_TIMES.astype(np.float64)
    if accel < 0:
        t = np.minimum(t, v0 / -accel)
    distance = v0 * t + 0.5 * accel * t * t
    x, y, _ = along_arc(steer * max_curvature(max(v0, 1.0)), distance)
    return np.stack([y, x, ACTION_TIMES], axis=-1).astype(np.float32)


def parse_action(value: Any) -> np.ndarray:
    """One frame's ``[6, 3]`` action from an array or a mapping with exactly one of :data:`ACTION_KINDS`:

    * ``{"actions": [[y, x, t], ...6]}`` or a bare ``[6, 3]`` array;
    * ``{"trajectory": {"x": [...], "y": [...]}}`` (or ``[[x, y], ...]``): the path in the current ego frame at 10 Hz;
    * ``{"steer": s, "speed_kmh": v, "accel_mps2": a}`` (:func:`drive_action`);
    * ``{"manoeuvre": "curve_left", "speed_kmh": 30}``: the first frame of a named manoeuvre.
    """
    if not isinstance(value, dict):
        return _action_array(value)
    refuse_route(value, "an action")
    if isinstance(value.get("trajectory"), dict):
        refuse_route(value["trajectory"], "an action's trajectory")
    kinds = [k for k in ACTION_KINDS if k in value]
    if len(kinds) != 1:
        raise TerraInputError(f"an action needs exactly one of {', '.join(ACTION_KINDS)} (got keys {sorted(value)})")
    kind = kinds[0]
    extra = sorted(set(value) - ACTION_KEYS[kind])
    if extra:
        raise TerraInputError(f"unknown action keys {extra}; this kind of action takes {sorted(ACTION_KEYS[kind])}")
    if kind == "actions":
        return _action_array(value["actions"])
    if kind == "trajectory":
        return trajectory_action(value["trajectory"])
    if kind == "steer":
        if "speed_kmh" not in value:
            raise TerraInputError("a steer action needs speed_kmh too, e.g. {\"steer\": 0.2, \"speed_kmh\": 30}")
        return drive_action(value["steer"], value["speed_kmh"], value.get("accel_mps2", 0.0))
    speed = check_number(value.get("speed_kmh", 30.0), "speed_kmh", 0.0, MAX_SPEED_KMH)
    if not isinstance(value["manoeuvre"], str):
        raise TerraInputError(f"manoeuvre must be a name (got {value['manoeuvre']!r})")
    return actions_for_manoeuvre(value["manoeuvre"], 1, speed_kmh=speed)[0]


def refuse_route(mapping: dict, where: str) -> None:
    """One line when ``mapping`` gives a route under any spelling of its key: a step takes none."""
    for key in mapping:
        if isinstance(key, str) and re.sub(r"[\s-]+", "_", key.strip().lower()) in ROUTE_HINTS:
            raise TerraInputError(f"{where} gives {key!r:.40}, but {NO_STEP_ROUTE}; leave it out")


def _action_array(value: Any) -> np.ndarray:
    """A ``[6, 3]`` array of finite numbers in reach, checked once."""
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise TerraInputError(f"an action must be a [6, 3] array of numbers or an object with one of "
                              f"{', '.join(ACTION_KINDS)} (got {type(value).__name__})")
    arr = finite_array(value, "an action")
    if arr.shape != (6, 3):
        raise TerraInputError(f"an action array must have shape [6, 3] ([y, x, time] per slot), got {list(arr.shape)}")
    return validate_actions(arr[None], "action")[0]


class KeyDriver:
    """Arrow keys → drive actions: up accelerates, down brakes, left/right steer (eased over a few frames)."""

    def __init__(self, speed_kmh: float = 30.0) -> None:
        self.speed_kmh = check_number(speed_kmh, "speed_kmh", 0.0, MAX_SPEED_KMH)
        self.steer = 0.0
        self.keys = dict.fromkeys(KEYS, False)

    def set_keys(self, keys: Any) -> None:
        """Update held keys from ``{"up": bool, "down": bool, "left": bool, "right": bool}`` (missing: kept)."""
        if not isinstance(keys, dict) or not set(keys) <= set(KEYS) or \
                not all(isinstance(v, bool) for v in keys.values()):
            raise TerraInputError(f"keys must map some of {', '.join(KEYS)} to true/false (got {keys!r})")
        self.keys.update(keys)

    def action(self) -> np.ndarray:
        """The next frame's action under the held keys; updates speed and steering."""
        accel = KEY_ACCEL * self.keys["up"] + KEY_BRAKE * self.keys["down"]
        target = float(self.keys["left"]) - float(self.keys["right"])
        self.steer += float(np.clip(target - self.steer, -KEY_STEER_RATE, KEY_STEER_RATE))
        action = drive_action(self.steer, self.speed_kmh, accel)
        dt = 1.0 / FRAME_RATE_HZ
        self.speed_kmh = float(np.clip(self.speed_kmh + 3.6 * accel * dt, 0.0, MAX_SPEED_KMH))
        return action

"""Actions from a driver's inputs (terra/session/driver_input.py): forms, errors, arrow keys and ego motion."""

from __future__ import annotations

import math

import numpy as np
import pytest

from terra.core.errors import TerraInputError
from terra.contract.actions import ACTION_TIMES
from terra.inputs.actions import actions_for_manoeuvre
from terra.inputs.ego_motion import advance_pose, ego_motion, speed_of
from terra.session.driver_input import KeyDriver, drive_action, parse_action


def test_drive_action_straight_and_arc():
    straight = drive_action(0.0, 36.0)
    np.testing.assert_allclose(straight[:, 1], 10.0 * ACTION_TIMES, rtol=1e-6)  # x = v t
    np.testing.assert_allclose(straight[:, 0], 0.0)
    np.testing.assert_allclose(straight[:, 2], ACTION_TIMES)
    left, right = drive_action(0.5, 36.0), drive_action(-0.5, 36.0)
    assert (left[:, 0] > 0).all() and (right[:, 0] < 0).all()  # y is to the left
    np.testing.assert_allclose(np.hypot(left[:, 1], left[:, 0])[0], 4.5, rtol=1e-2)  # chord ~ arc at the start
    braking = drive_action(0.0, 36.0, accel_mps2=-8.0)  # stops after 1.25 s, 6.25 m
    np.testing.assert_allclose(braking[-1, 1], 6.25, rtol=1e-5)


def test_ego_motion_is_exact_on_arcs():
    action = drive_action(1.0, 36.0)  # full lock at 10 m/s: lateral acceleration 6 m/s^2, curvature 0.06 / m
    k = 0.06
    dx, dy, dyaw = ego_motion(action)  # 1 m along the arc
    np.testing.assert_allclose([dx, dy, dyaw], [math.sin(k) / k, (1 - math.cos(k)) / k, k], rtol=1e-4)
    assert speed_of(action) == pytest.approx(36.0, rel=1e-4)
    pose = (0.0, 0.0, 0.0)
    for _ in range(10):  # 10 m along the circle
        pose = advance_pose(pose, action)
    np.testing.assert_allclose(pose, [math.sin(10 * k) / k, (1 - math.cos(10 * k)) / k, 10 * k], rtol=1e-4)
    assert ego_motion(drive_action(1.0, 7.2))[2] == pytest.approx(0.2 / 12, rel=1e-4)  # slower: radius 12 m


def test_parse_action_forms():
    array = drive_action(0.2, 30.0)
    np.testing.assert_array_equal(parse_action(array), array)
    np.testing.assert_array_equal(parse_action(array.tolist()), array)
    np.testing.assert_array_equal(parse_action({"actions": array.tolist()}), array)
    np.testing.assert_array_equal(parse_action({"steer": 0.2, "speed_kmh": 30}), array)
    np.testing.assert_array_equal(parse_action({"manoeuvre": "curve_left", "speed_kmh": 40}),
                                  actions_for_manoeuvre("curve_left", 1, speed_kmh=40)[0])
    path = parse_action({"trajectory": {"x": [0, 1, 2, 3], "y": [0, 0, 0, 0]}})  # 1 m per frame at 10 Hz
    np.testing.assert_allclose(path[:, 1], 10.0 * ACTION_TIMES, rtol=1e-5)


@pytest.mark.parametrize("value, message", [
    (np.zeros((2, 6, 3)), r"shape \[6, 3\]"),
    ([[1, 2]] * 6, r"shape \[6, 3\]"),
    ("left", "array of numbers"),
    (np.full((6, 3), np.inf), "NaN or inf"),
    ({"steer": 0.1}, "needs speed_kmh"),
    ({"steer": float("nan"), "speed_kmh": 30}, "finite number"),
    ({"steer": True, "speed_kmh": 30}, "finite number"),
    ({"steer": 0, "speed_kmh": 500}, "speed_kmh must be a number from 0 to 130"),
    ({"steer": 0, "speed_kmh": 30, "gear": 2}, "unknown action keys"),
    ({"steer": 0, "actions": []}, "exactly one of"),
    ({"manoeuvre": "fly"}, "unknown manoeuvre"),
    ({"trajectory": {"x": [0]}}, "lacks y"),
    ({"trajectory": {"x": [0, 1], "y": [0, 0], "routes": []}}, "an action's trajectory gives 'routes', but a step"),
    ({"steer": 0, "speed_kmh": 30, "route": []}, "an action gives 'route', but a step takes no route"),
    ({"trajectory": {"x": [0, "1"], "y": [0, 0]}}, "the string '1'"),
    ([[True, 1, 0.45]] * 6, "true \\(a boolean\\)"),
])
def test_parse_action_rejects_bad_input_in_one_line(value, message):
    with pytest.raises(TerraInputError, match=message) as err:
        parse_action(value)
    assert "\n" not in str(err.value)


def test_key_driver():
    driver = KeyDriver(speed_kmh=30.0)
    assert driver.action()[0, 0] == 0.0  # no keys: straight
    driver.set_keys({"up": True, "left": True})
    for _ in range(10):
        action = driver.action()
    assert driver.speed_kmh == pytest.approx(30.0 + 3.6 * 2.5, rel=1e-6)  # 1 s at 2.5 m/s^2
    assert driver.steer == 1.0 and action[0, 0] > 0
    driver.set_keys({"up": False, "left": False, "down": True})
    for _ in range(100):
        driver.action()
    assert driver.speed_kmh == 0.0 and driver.steer == 0.0
    with pytest.raises(TerraInputError, match="keys must map"):
        driver.set_keys({"jump": True})
    with pytest.raises(TerraInputError, match="keys must map"):
        driver.set_keys({"up": 1})

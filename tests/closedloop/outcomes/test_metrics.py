"""Closed-loop metrics on hand-made trajectories against hand-computed values, and the true world's truth."""

from __future__ import annotations

import numpy as np
import pytest

from terra.closedloop.outcomes.mapless import extended_comfort, history_comfort, kinematics, progress
from terra.closedloop.plans import Plan
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.outcomes.truth import OUT_OF_LANE_M, parked_cars, truth_metrics
from terra.sim.scene import Scene

DT = 0.1


def test_constant_acceleration_along_a_line():
    """x = v0 t + a t^2 / 2 along +x: speed v0 + a t, lon accel a, no lateral accel, no jerk, no yaw rate."""
    t = np.arange(21) * DT
    v0, a = 5.0, 2.0
    poses = np.stack([v0 * t + 0.5 * a * t**2, np.zeros_like(t), np.zeros_like(t)], -1)
    k = kinematics(poses)
    np.testing.assert_allclose(k["speed"], v0 + a * t, atol=1e-9)
    np.testing.assert_allclose(k["lon_accel"], a, atol=1e-9)
    np.testing.assert_allclose(k["lat_accel"], 0.0, atol=1e-9)
    np.testing.assert_allclose(k["jerk"], 0.0, atol=1e-7)
    np.testing.assert_allclose(k["yaw_rate"], 0.0, atol=1e-12)
    hc = history_comfort(poses)
    assert hc["comfortable"] and hc["max_lon_accel"] == pytest.approx(2.0)
    p = progress(poses)
    assert p["distance_m"] == pytest.approx(v0 * 2.0 + 0.5 * a * 4.0)  # 14 m in 2 s
    assert p["mean_speed_mps"] == pytest.approx(7.0)
    braking = poses.copy()
    braking[:, 0] = 20.0 * t - 0.5 * 5.0 * t**2  # -5 m/s^2: beyond NAVSIM's -4.05
    assert not history_comfort(braking)["comfortable"]


def test_circle_at_constant_speed():
    """A circle of radius 20 m at 10 m/s: lateral acceleration v^2 / r = 5 m/s^2 (over 4.89), yaw rate 0.5 rad/s."""
    t = np.arange(31) * DT
    r, v = 20.0, 10.0
    heading = v / r * t
    poses = np.stack([r * np.sin(heading), r * (1 - np.cos(heading)), heading], -1)
    k = kinematics(poses)
    np.testing.assert_allclose(k["lat_accel"][1:-1], v * v / r, rtol=2e-3)
    np.testing.assert_allclose(k["yaw_rate"], v / r, atol=1e-9)
    np.testing.assert_allclose(k["speed"][1:-1], v, rtol=1e-3)
    hc = history_comfort(poses)
    assert not hc["comfortable"] and hc["max_abs_lat_accel"] == pytest.approx(5.0, rel=3e-3)


def test_extended_comfort_of_consistent_and_jumping_plans():
    """Plans of one straight 8 m/s motion agree over their shared time (EC 1); plans that alternate between
    cruising and accelerating at 2 m/s^2 differ in acceleration by 2 m/s^2 (RMS over 0.7): EC 0."""
    poses = np.stack([8.0 * DT * np.arange(4), np.zeros(4), np.zeros(4)], -1)
    steady = [Plan.trajectory(np.c_[8.0 * DT * np.arange(1, 41), np.zeros((40, 2))], dt=DT) for _ in range(4)]
    ec = extended_comfort(steady, poses)
    assert ec["score"] == 1.0 and ec["max_rms_accel"] == pytest.approx(0.0, abs=1e-9)
    t = DT * np.arange(1, 41)
    jumping = [Plan.trajectory(np.c_[8.0 * t + (i % 2) * t**2, np.zeros((40, 2))], dt=DT) for i in range(4)]
    ec = extended_comfort(jumping, poses)
    assert ec["score"] == 0.0 and ec["max_rms_accel"] == pytest.approx(2.0, abs=1e-6)
    assert ec["max_rms_yaw_rate"] == pytest.approx(0.0, abs=1e-9)


def test_lane_centre_has_zero_offset_and_stays_in_lane():
    scene = Scene.generate(5)
    s = 40.0 + 8.0 * DT * np.arange(41)
    m = truth_metrics(scene, scene.lane_pose(s))
    assert m["mean_abs_lane_offset_m"] < 0.01 and m["max_abs_lane_offset_m"] < 0.01
    assert m["time_in_lane"] == 1.0 and not m["off_road"] and not m["collision"]
    assert m["progress_along_road_m"] == pytest.approx(32.0, abs=1e-6)
    drifting = scene.lane_pose(s, scene.ego_lane_offset_m + np.linspace(0.0, 2.0, len(s)))
    m = truth_metrics(scene, drifting)
    expected = np.mean(np.linspace(0.0, 2.0, len(s))[1:] > OUT_OF_LANE_M)
    assert m["time_in_lane"] == pytest.approx(1.0 - expected) and m["max_abs_lane_offset_m"] == pytest.approx(2.0)


def test_the_signed_offset_and_heading_say_which_side():
    scene = Scene.generate(5)
    s = 40.0 + 8.0 * DT * np.arange(41)
    for side in (0.4, -0.4):  # metres left of the lane's centre, the car turned 0.05 rad left as well
        poses = scene.lane_pose(s, scene.ego_lane_offset_m + side) + [0.0, 0.0, 0.05]
        m = truth_metrics(scene, poses)
        assert m["mean_lane_offset_m"] == pytest.approx(side, abs=1e-6)
        assert m["mean_heading_error_rad"] == pytest.approx(0.05, abs=1e-6)
        assert m["mean_abs_lane_offset_m"] == pytest.approx(0.4, abs=1e-6)


def test_a_drive_into_a_parked_car_is_a_collision():
    scene = Scene.generate(3)
    car = parked_cars(scene)[0]
    s, d = scene.road_coords(car[:1, None][0], car[1:2])
    approach = np.linspace(s[0] - 30.0, s[0], 31)
    lateral = np.linspace(scene.ego_lane_offset_m, d[0], 31)
    m = truth_metrics(scene, scene.lane_pose(approach, lateral))
    assert m["collision"] and m["off_road"] and m["first_collision_frame"] is not None
    passing = truth_metrics(scene, scene.lane_pose(approach))  # the same stretch in the lane
    assert not passing["collision"]


def test_synthetic_scenarios_are_reproducible_and_start_in_lane():
    a, b = synthetic_scenarios(2, 7, (144, 256)), synthetic_scenarios(2, 7, (144, 256))
    assert [s.id for s in a] == [s.id for s in b]
    np.testing.assert_array_equal(a[1].images, b[1].images)
    for s in a:
        assert s.images.shape == (3, 144, 256, 3) and s.actions.shape == (2, 6, 3)
        route = s.route(s.start_pose)
        assert abs(route[0, 1]) < 0.01 and route[-1, 0] > 50.0  # the lane's centre ahead, in the ego frame


def test_plan_following_compares_the_estimator_with_the_commanded_path(tmp_path):
    """The driven path (ACT-Bench's reference) is the drive's own path over the estimator's 44 frames in ACT-Bench's
    (-y, x) frame; the ADE / FDE are the distances to the estimate (a random-weight tiny estimator: any numbers,
    finite)."""
    from terra.closedloop.loop import DriveSpec, run_drives
    from terra.closedloop.outcomes.plan_following import PlanFollowing
    from terra.closedloop.worlds import TrueWorld
    from tests.conftest import load_script

    bench = load_script("bench/benchmark_scoring")
    scorer = PlanFollowing(bench.write_estimator(tmp_path / "estimator", bench.PRESETS["tiny"]))

    class Straight:
        name = "straight"

        def reset(self, scenario):
            pass

        def plan(self, obs):
            return np.c_[4.0 * np.arange(1, 9), np.zeros((8, 2))]  # 8 m/s ahead

        def close(self):
            pass

    scenario = synthetic_scenarios(1, 2, (72, 128))[0]
    # the exact vehicle: the car at the plan's 8 m/s from the first frame (a bicycle accelerates to it from the
    # scenario's speed)
    long = run_drives(TrueWorld((72, 128)), [DriveSpec(scenario, "straight", Straight)], 43, vehicle="exact")[0]
    short = run_drives(TrueWorld((72, 128)), [DriveSpec(scenario, "straight", Straight)], 10, vehicle="exact")[0]
    driven = scorer.driven_path(long)
    np.testing.assert_allclose(driven[:, 0], 0.0, atol=1e-9)  # straight ahead: no lateral motion
    np.testing.assert_allclose(driven[:, 1], 0.8 * np.arange(44), atol=1e-6)  # 0.8 m a frame
    [score, none] = scorer.score([long, short])
    assert none is None and np.isfinite(score["ade_m"]) and score["fde_m"] >= 0 and score["estimated_class"]

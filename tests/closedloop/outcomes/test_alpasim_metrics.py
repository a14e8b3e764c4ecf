"""AlpaSim's metrics on the true world (terra/closedloop/outcomes/alpasim.py): hand-made boxes for each collision
class, the box at the asphalt's edge, progress halfway along a straight expert, truncation after the first event,
every rule of the scene score, and real drives on the true world recorded with their metrics: an oracle at the
expert's pace, and two controls, one veering off the road, one driving into a parked car."""

from __future__ import annotations

import json

import numpy as np
import pytest

from terra.closedloop.outcomes.alpasim import (
    MAX_DIST_TO_GT_M, MetricBox, VehicleBox, alpasim_metrics, clip, collision_classes, drive_values, expert_trajectory,
    offroad, project, scene_score, timestep_metrics, wrong_lane)
from terra.closedloop.loop import DriveSpec
from terra.closedloop.plans import Plan
from terra.closedloop.recording.run import RunSettings
from tests.closedloop.conftest import drive_and_record
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.outcomes.truth import parked_cars
from terra.closedloop.worlds import TrueWorld
from terra.inputs.ego_motion import compose, to_ego
from terra.sim.scene import ROAD_HALF_WIDTH_M, Scene

SIZE = (72, 128)
EGO = MetricBox.of(5.0, 2.0)  # shrunk to 4.9 x 1.96, corners rounded with radius 0.49
CAR = MetricBox.of(4.5, 1.8)


@pytest.fixture(scope="module")
def scene() -> Scene:
    scene = Scene.generate(3)
    assert scene.seg_curv[0] == 0.0 and scene.seg_len[0] > 80.0  # straight for its first 80 m
    return scene


def classes(where) -> tuple[bool, bool, bool]:
    return collision_classes(EGO, np.zeros(3), [(CAR, np.array(where, dtype=float))])


def test_each_collision_class_by_the_bumper_band_the_other_box_touches():
    side = 0.98 + 2.205  # a car across the ego's side: its end at the ego's side (half widths and length)
    assert classes([4.6, 0.0, 0.0]) == (True, False, False)  # nose to tail, 5.5 cm into the ego's front
    assert classes([-4.6, 0.3, 0.0]) == (False, True, False)  # tail to nose, offset to the left
    assert classes([0.0, side - 0.05, np.pi / 2]) == (False, False, True)  # T-bone, 5 cm into the left side
    assert classes([-1.0, -side + 0.05, np.pi / 2]) == (False, False, True)  # and the right side
    assert classes([2.3, side - 0.05, np.pi / 2]) == (True, False, False)  # across the front-left corner
    assert classes([4.7, 0.0, 0.0]) == (False, False, False)  # 4.5 cm apart
    assert classes([0.0, side + 0.05, np.pi / 2]) == (False, False, False)
    assert classes([4.555, 1.762, 0.0]) == (False, False, False)  # sharp corners would overlap; rounded, they miss
    assert collision_classes(EGO, np.zeros(3), [(CAR, np.array([4.6, 0.0, 0.0])), (CAR, np.array([-4.6, 0.0, 0.0]))]
                             ) == (True, True, False)  # several cars: each class set by any of them
    turned = np.array([5.0, -2.0, 0.4])  # the ego turned and moved: the same front hit in its frame
    assert collision_classes(EGO, turned, [(CAR, compose(turned, [4.6, 0.0, 0.0]))]) == (True, False, False)


def test_sharp_boxes_that_only_touch_collide_on_the_line_they_touch():
    sharp, other = MetricBox.of(4.0, 2.0, shrink=0.0, roundness=0.0), MetricBox.of(2.0, 2.0, shrink=0.0, roundness=0.0)
    assert collision_classes(sharp, np.zeros(3), [(other, np.array([3.0, 0.0, 0.0]))]) == (True, False, False)
    assert collision_classes(sharp, np.zeros(3), [(other, np.array([0.0, -2.0, 0.0]))]) == (False, False, True)
    assert collision_classes(sharp, np.zeros(3), [(other, np.array([3.0 + 1e-6, 0.0, 0.0]))]) == (False,) * 3
    square = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    assert np.isclose(_area(clip(square, square + 0.5)), 0.25)
    assert not len(clip(square, square + 2.0))


def _area(polygon: np.ndarray) -> float:
    x, y = polygon.T
    return 0.5 * float(x @ np.roll(y, -1) - y @ np.roll(x, -1))


def test_the_metric_box_is_alpasims_rounded_and_shrunk():
    box = MetricBox.of(5.393, 2.109)
    assert np.isclose(box.length, 5.393 * 0.98) and np.isclose(box.radius, 0.5 * 2.109 * 0.98 / 2)
    r, full = box.radius, 5.393 * 0.98 * 2.109 * 0.98
    assert _area(box.outline) == pytest.approx(full - (4 - np.pi) * r**2, rel=2e-3)  # corners of 16 segments
    assert np.ptp(box.outline[:, 0]) == pytest.approx(box.length) and np.ptp(box.outline[:, 1]) == pytest.approx(
        2.109 * 0.98)
    centre = VehicleBox().centres(np.array([[10.0, 5.0, np.pi / 2]]))[0]  # rear axle to box centre: 1.3965 m ahead
    assert np.allclose(centre, [10.0, 5.0 + 5.393 / 2 - 1.3, np.pi / 2])


def test_offroad_when_the_box_touches_or_crosses_the_asphalts_edge(scene):
    half = 2.109 * 0.98 / 2  # the metric box's half width
    box = MetricBox.of(5.393, 2.109)
    d = np.array([-ROAD_HALF_WIDTH_M + half + 0.01,  # 1 cm inside the right edge
                  -ROAD_HALF_WIDTH_M + half - 0.01,  # 1 cm across it
                  ROAD_HALF_WIDTH_M - half + 0.02,  # its left edge 2 cm across the left edge of the road
                  ROAD_HALF_WIDTH_M + half + 0.0005,  # beyond the edge, touching it within 1 mm
                  -ROAD_HALF_WIDTH_M - half - 0.01,  # beyond the edge, apart: not offroad (AlpaSim's rule)
                  0.0])
    poses = scene.lane_pose(np.full(len(d), 20.0), d)
    assert offroad(scene, box, poses).tolist() == [False, True, True, True, False, False]
    turned = poses[:1] + [0.0, 0.0, 0.2]  # the same place turned 0.2 rad: its corner crosses
    assert offroad(scene, box, turned).tolist() == [True]


def test_wrong_lane_when_heading_against_the_lane_the_box_is_in(scene):
    poses = scene.lane_pose(np.full(4, 30.0), np.array([-1.75, 1.75, 1.75, -1.75]))
    poses[2:, 2] += np.pi  # turned around: right in the oncoming lane, wrong in its own
    poses[0, 2] += 2.0  # 2 rad off its lane's direction: not yet wrong (2 pi / 3 = 2.09)
    assert wrong_lane(scene, poses).tolist() == [False, True, False, True]


def test_projection_onto_a_polyline_as_shapely():
    line = np.array([[0.0, 0.0], [10.0, 0.0], [10.0, 10.0]])
    along, distance = project(line, np.array([[5.0, 2.0], [12.0, 4.0], [-3.0, -4.0], [11.0, 11.0]]))
    assert np.allclose(along, [5.0, 14.0, 0.0, 20.0]) and np.allclose(distance, [2.0, 2.0, 5.0, np.sqrt(2)])
    along, distance = project(line, np.array([[12.0, 4.0], [12.0, 4.0], [12.0, 4.0]]), upto=np.array([0, 1, 2]))
    assert np.allclose(along, [0.0, 10.0, 14.0]) and np.allclose(distance, [np.hypot(12, 4), np.hypot(2, 4), 2.0])


def halfway(scene: Scene, steps: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """A straight expert at 5 m/s from s = 5 m, and an ego on it that stops halfway in time."""
    expert = expert_trajectory(scene, scene.lane_pose(5.0), 5.0, steps)
    ego = expert.copy()
    ego[steps // 2:] = expert[steps // 2]
    return expert, ego


def test_progress_is_one_half_halfway_along_a_straight_expert(scene):
    expert, ego = halfway(scene)
    metrics = timestep_metrics(scene, ego, expert)
    assert metrics["gt_dist_traveled_m"][0] == pytest.approx(20.0)
    assert metrics["progress"][-1] == pytest.approx(0.5, abs=1e-12)
    assert np.allclose(metrics["progress_rel"][:21], 1.0) and metrics["progress_rel"][-1] == pytest.approx(0.5)
    assert np.allclose(metrics["dist_to_gt_trajectory"], 0.0, atol=1e-9)
    assert metrics["dist_to_gt_location"][-1] == pytest.approx(10.0)
    values = drive_values(metrics)
    assert values["progress"] == pytest.approx(0.5) and values["progress_rel"] == pytest.approx(0.5)
    assert values["score"] == pytest.approx(0.5 / 0.8) and values["failure_reason"] is None
    assert values["duration_frac_20s"] == pytest.approx(0.2) and values["dist_traveled_m"] == pytest.approx(10.0)
    assert not any(values[k] for k in ("collision_any", "offroad")) and values["truncated_by"] is None


def steps_of(**events) -> dict[str, np.ndarray]:
    """Per-timestep metrics of 10 timesteps: progress 0.1 per step, 1 m from the expert, ``events`` at steps."""
    n = 10
    metrics = {name: np.zeros(n, dtype=bool) for name in ("collision_front", "collision_rear", "collision_lateral",
                                                           "offroad", "wrong_lane")}
    for name, step in events.items():
        if name in metrics:
            metrics[name][step] = True
    metrics["progress"] = metrics["progress_rel_to_total"] = np.arange(n) / (n - 1)
    metrics["progress_rel"] = np.linspace(1.0, 0.9, n)
    metrics["dist_to_gt_trajectory"] = np.ones(n)
    if "far" in events:
        metrics["dist_to_gt_trajectory"][events["far"]:] = MAX_DIST_TO_GT_M
    metrics["dist_to_gt_location"] = np.arange(n, dtype=float)
    metrics["dist_traveled_m"] = np.arange(n) * 2.0
    metrics["gt_dist_traveled_m"] = np.full(n, 18.0)
    metrics["duration_frac_20s"] = np.arange(n) * 0.1 / 20.0
    front, rear, lateral = (metrics[f"collision_{c}"] for c in ("front", "rear", "lateral"))
    metrics["collision_any"], metrics["collision_at_fault"] = front | rear | lateral, front | lateral
    metrics["offroad_or_collision"] = metrics["collision_any"] | metrics["offroad"]
    metrics["offroad_or_collision_at_fault"] = metrics["collision_at_fault"] | metrics["offroad"]
    return metrics


def test_timesteps_after_the_first_event_are_dropped():
    values = drive_values(steps_of(offroad=3, collision_front=6))
    assert values["kept_timesteps"] == 4 and values["truncated_by"] == "offroad_or_collision"
    assert values["offroad"] and not values["collision_any"]  # the collision came after the cut
    assert values["progress"] == pytest.approx(3 / 9) and values["progress_clipped_rel"] == pytest.approx(3 / 9)
    assert values["dist_to_gt_location"] == 3.0 and values["duration_frac_20s"] == pytest.approx(0.015)
    assert values["progress_rel"] == pytest.approx(np.linspace(1.0, 0.9, 10)[3])
    assert (values["score"], values["failure_reason"]) == (0.0, "offroad")
    far = drive_values(steps_of(far=5, collision_front=7))
    assert far["kept_timesteps"] == 6 and far["truncated_by"] == "dist_to_gt_trajectory"
    assert far["dist_to_gt_trajectory"] == MAX_DIST_TO_GT_M and not far["collision_any"]
    assert far["score"] == pytest.approx(min(5 / 9 / 0.8, 1.0)) and far["status"] == "pass"
    both = drive_values(steps_of(far=4, collision_rear=4))
    assert both["kept_timesteps"] == 5 and both["truncated_by"] == "offroad_or_collision"
    untouched = drive_values(steps_of())
    assert untouched["kept_timesteps"] == 10 and untouched["truncated_by"] is None and untouched["score"] == 1.0


def test_scene_score_rules():
    assert scene_score(True, True, 1.0, 50.0) == (0.0, 1.0, "collision_at_fault")  # checked first
    assert scene_score(False, True, 1.0, 50.0) == (0.0, 1.0, "offroad")
    assert scene_score(False, False, 0.4, 50.0) == (pytest.approx(0.5), pytest.approx(0.5), None)
    assert scene_score(False, False, 0.8, 50.0)[0] == 1.0  # saturates at 0.8
    assert scene_score(False, False, 0.79, 50.0)[0] == pytest.approx(0.9875)
    assert scene_score(False, False, 1.7, 50.0)[0] == 1.0 and scene_score(False, False, -0.2, 50.0)[0] == 0.0
    assert scene_score(False, False, 0.0, 4.9) == (1.0, 1.0, None)  # an expert that drives under 5 m
    assert scene_score(True, False, 0.0, 4.9)[0] == 0.0
    rear = drive_values(steps_of(collision_rear=9))  # a rear collision is not at fault
    assert rear["collision_rear"] and not rear["collision_at_fault"] and rear["score"] == 1.0


class Expert:
    """An oracle: plans the expert's path (the ego lane's centre at the scenario's speed) over 4 s at 10 Hz."""

    name = "expert"

    def reset(self, scenario):
        self.scenario = scenario

    def plan(self, obs):
        scene, speed = self.scenario.scene, self.scenario.speed_kmh / 3.6
        pose = compose(self.scenario.start_pose, obs.pose)
        s, _ = scene.road_coords(pose[:1], pose[1:2])
        ahead = scene.lane_pose(s[0] + speed * 0.1 * np.arange(1, 41))
        return Plan.trajectory(np.c_[to_ego(ahead[:, :2], pose), ahead[:, 2] - pose[2]], dt=0.1)

    def close(self):
        pass


class Veer(Expert):
    """A control: plans a 30 m circle to the right at the scenario's speed (off the road on the side without parked
    cars, within about 1.5 s)."""

    name = "veer"

    def plan(self, obs):
        arc = self.scenario.speed_kmh / 3.6 * 0.1 * np.arange(1, 41) / 30.0
        return Plan.trajectory(np.c_[30.0 * np.sin(arc), -30.0 * (1.0 - np.cos(arc)), -arc], dt=0.1)


class Rammer(Expert):
    """A control: drives at the scenario's speed straight at the road side of the first parked car ahead (its
    front-left corner meets the car's side before it crosses the road's edge)."""

    name = "rammer"

    def plan(self, obs):
        scene = self.scenario.scene
        pose = compose(self.scenario.start_pose, obs.pose)
        cars = parked_cars(scene)
        ahead = to_ego(cars[:, :2], pose)[:, 0]
        car = cars[np.flatnonzero(ahead > 3.0)[0]]
        target = to_ego(compose(car, [0.0, -0.9, 0.0])[:2], pose)
        direction = target / np.hypot(*target)
        points = direction * (self.scenario.speed_kmh / 3.6 * 0.1 * np.arange(1, 41))[:, None]
        return Plan.trajectory(np.c_[points, np.full(40, np.arctan2(direction[1], direction[0]))], dt=0.1)


def test_real_drives_on_the_true_world_carry_alpasims_metrics(tmp_path):
    scenarios = synthetic_scenarios(2, 9, SIZE)  # a parked car 27 m and 13 m ahead
    specs = [DriveSpec(s, policy.name, policy) for s in scenarios for policy in (Expert, Veer, Rammer)]
    result = drive_and_record(TrueWorld(SIZE), specs, RunSettings(tmp_path / "run", num_steps=35, videos=False,
                                                                  progress=False))
    drives = {content["drive"]: content["metrics"]["alpasim"] for content in result.drives.values()}
    for scenario in scenarios:
        expert = drives[f"{scenario.id}__expert"]
        assert expert["score"] == 1.0 and expert["status"] == "pass" and expert["kept_timesteps"] == 36
        assert expert["dist_to_gt_trajectory"] < 0.1 and expert["dist_to_gt_location"] < 0.5
        assert 0.97 < expert["progress"] <= 1.0 and expert["gt_dist_traveled_m"] == pytest.approx(
            scenario.speed_kmh / 3.6 * 3.5, rel=0.02)  # the speed is along the road's centre: the lane's differs
        assert expert["duration_frac_20s"] == pytest.approx(3.5 / 20) and not expert["wrong_lane"]
        veer = drives[f"{scenario.id}__veer"]  # the controls fail, each its own way
        assert (veer["score"], veer["failure_reason"], veer["truncated_by"]) == (0.0, "offroad", "offroad_or_collision")
        assert 5 < veer["kept_timesteps"] < 25 and not veer["collision_any"]
        rammer = drives[f"{scenario.id}__rammer"]
        assert (rammer["score"], rammer["failure_reason"]) == (0.0, "collision_at_fault") and rammer["collision_front"]
        assert not rammer["collision_rear"] and rammer["kept_timesteps"] < 36
    on_disk = json.loads((tmp_path / "run" / f"{scenarios[0].id}__expert.json").read_text())
    assert on_disk["metrics"]["alpasim"]["score"] == 1.0
    summary = json.loads((tmp_path / "run" / "manifest.summary.json").read_text())["alpasim"]
    assert summary["drives"] == 6 and summary["scene_score"]["estimate"] == pytest.approx(1 / 3)
    assert summary["by_policy"]["expert"]["estimate"] == 1.0 and summary["by_policy"]["rammer"]["high"] == 0.0
    assert summary["failure_reasons"] == {"passed": 2, "offroad": 2, "collision_at_fault": 2}


def test_a_failed_drive_scores_zero_with_its_reason():
    scenario = synthetic_scenarios(1, 11, SIZE)[0]
    expert = expert_trajectory(scenario.scene, scenario.start_pose, scenario.speed_kmh / 3.6, 5)
    ok = alpasim_metrics(scenario, expert)
    failed = alpasim_metrics(scenario, expert, "policy p failed at step 5: boom")
    assert ok["score"] == 1.0 and failed["score"] == 0.0 and failed["status"] == "fail"
    assert failed["failure_reason"] == "policy p failed at step 5: boom" and failed["progress"] == ok["progress"]

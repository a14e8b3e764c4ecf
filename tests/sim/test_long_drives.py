"""The long drives of terra/sim/long_drives.py: what they hold (behaviours, states off the lane and off the road,
stops), that they are kinematic (heading = direction of motion) and reproducible, and that no drive is set in a
scene of the closed-loop study's scenarios."""

import json

import numpy as np
import pytest

from terra.closedloop.scenarios import synthetic_scenarios
from terra.core.errors import TerraInputError
from terra.sim.clips import DATASET_ROUTE_POINTS
from terra.sim.dataset import ClipDataset, write_dataset
from terra.sim import long_drives
from terra.sim.long_drives import (BEHAVIOURS, GRID_M, WOBBLE_AMPLITUDE_M, WOBBLE_MAX_CURVATURE, WOBBLE_MAX_SLOPE,
                                   WOBBLE_WAVELENGTH_M, lateral_profile, random_long_drive, reserved_scene_seeds)
from terra.sim.scene import ROAD_HALF_WIDTH_M, Scene

FRAMES = 200


def _drives(count: int, seed: int = 0):
    return [random_long_drive(np.random.default_rng([seed, i]), FRAMES) for i in range(count)]


def _frame_poses(drive):
    return drive.trajectory.poses_at(drive.trajectory.t[0] + np.arange(FRAMES) / 10.0)


def test_drives_cover_the_states_policies_reach():
    drives = _drives(60)
    names = " ".join(d.manoeuvre for d in drives)
    for behaviour in BEHAVIOURS:
        assert behaviour in names
    assert "chain:" in names and "long:" in names
    offsets, stops = [], 0
    for drive in drives:
        poses = _frame_poses(drive)
        _, d = drive.scene.road_coords(poses[:, 0], poses[:, 1])
        offsets.append(d[np.isfinite(d)])
        speed = np.hypot(*np.diff(poses[:, :2], axis=0).T) * 10.0
        stops += bool((speed < 0.05).any())
    d = np.concatenate(offsets)
    assert (np.abs(d) > ROAD_HALF_WIDTH_M).mean() > 0.02  # off the road
    assert (d > 0).mean() > 0.05  # in the other lane or beyond
    assert np.std(d) > 1.0
    assert 1 <= stops < 30


def test_heading_is_the_direction_of_motion_and_turns_smoothly():
    for drive in _drives(20, seed=3):
        if not drive.manoeuvre.startswith("long:"):
            continue
        tr = drive.trajectory
        step = np.hypot(np.diff(tr.x), np.diff(tr.y))
        moving = step > 1e-3
        motion = np.arctan2(np.diff(tr.y), np.diff(tr.x))[moving]
        error = np.angle(np.exp(1j * (motion - tr.yaw[1:][moving])))
        assert np.abs(error).max() < 0.02
        # per 10 ms: no kinks (a kink turns by up to MAX_SLOPE, 0.4 rad, at once); the recipe's sharpest turns, a
        # short weave or wobble at 70 km/h, reach ~0.065 rad per 10 ms
        assert np.abs(np.diff(tr.yaw)).max() < 0.08


def test_wobbles_survive_the_smoothing(monkeypatch):
    """A profile of wobbles alone swings about its lane at 4-12 m wavelengths, as far as drawn (the smoothing of the
    slower offsets, 2-4 m, would leave a 6-m swing a tenth of itself), within the wobble's slope and curvature bounds,
    its offset and heading continuous."""
    monkeypatch.setattr(long_drives, "BEHAVIOUR_WEIGHTS", tuple(float(b == "wobble") for b in BEHAVIOURS))
    lane = 1.75
    swings, wavelengths = [], []
    for i in range(40):
        profile, names = lateral_profile(np.random.default_rng([11, i]), np.zeros(1200), lane)
        assert set(names) == {"wobble"}
        swing = profile[100:] - lane  # past the first ramp back to the lane, smoothed
        slope, curvature = np.diff(swing) / GRID_M, np.diff(swing, 2) / GRID_M**2
        assert np.abs(slope).max() <= WOBBLE_MAX_SLOPE + 1e-9
        assert np.abs(curvature).max() <= WOBBLE_MAX_CURVATURE + 1e-9
        swings.append(np.abs(swing).max())
        crossings = np.flatnonzero(np.diff(np.sign(swing[np.abs(swing) > 1e-4])) != 0)
        if len(crossings) > 4:
            wavelengths.append(2 * np.median(np.diff(crossings)) * GRID_M)
    assert WOBBLE_AMPLITUDE_M[0] * 0.9 <= np.median(swings) <= WOBBLE_AMPLITUDE_M[1]
    assert max(swings) > 0.1
    assert WOBBLE_WAVELENGTH_M[0] - 0.5 <= min(wavelengths) and max(wavelengths) <= WOBBLE_WAVELENGTH_M[1] + 0.5
    assert np.ptp(wavelengths) > 4.0


def test_same_generator_same_drive_and_frames_render():
    a, b = (random_long_drive(np.random.default_rng([5, 1]), 30) for _ in range(2))
    assert a.manoeuvre == b.manoeuvre and np.array_equal(a.trajectory.x, b.trajectory.x)
    clip = a.render(30, 36, 64)
    assert clip.frames.shape == (30, 36, 64, 3) and clip.actions.shape == (30, 6, 3)
    assert np.isfinite(clip.actions).all()


def test_study_scenes_are_never_training_scenes():
    scenario_seeds = {s.scene.seed for s in synthetic_scenarios(8, 0, (36, 64), indices=range(8))}
    assert scenario_seeds <= reserved_scene_seeds()
    assert not scenario_seeds & {d.scene.seed for d in _drives(200)}


def test_dataset_recipe_is_recorded_and_checked(tmp_path):
    data = ClipDataset(write_dataset(tmp_path / "d", 2, 12, 36, 64, recipe="long_drives", progress=False))
    assert data.meta["recipe"] == "long_drives"
    assert data[0].frames.shape == (12, 36, 64, 3)
    with pytest.raises(TerraInputError, match="recipe"):
        write_dataset(tmp_path / "e", 2, 12, 36, 64, recipe="long_drive", progress=False)


def test_a_dataset_carries_each_frames_route_and_old_datasets_still_load(tmp_path):
    """Every frame's route is Scene.route at its pose, at the dataset's 16 points (clip 1 is a manoeuvre chain, clip 0
    lane-relative); a dataset written before routes (no routes array, no route_points) reads with routes None."""
    data = ClipDataset(write_dataset(tmp_path / "d", 2, 12, 24, 40, seed=3, recipe="long_drives", progress=False))
    assert data.route_points == DATASET_ROUTE_POINTS == 16
    for clip in data:
        scene = Scene.generate(clip.seed, clip.scene_length_m, clip.domain)
        assert clip.routes.shape == (12, 16, 3) and clip.routes.dtype == np.float32
        np.testing.assert_array_equal(clip.routes, scene.route(clip.poses, 16))
    assert {c.manoeuvre.split(":")[0] for c in data} == {"long", "chain"}
    shard = tmp_path / "d" / data.meta["shards"][0]["file"]
    with np.load(shard) as arrays:
        np.savez(shard, **{k: arrays[k] for k in arrays.files if k != "routes"})
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    del meta["route_points"]
    (tmp_path / "d" / "meta.json").write_text(json.dumps(meta))
    old = ClipDataset(tmp_path / "d")
    assert old.route_points is None and old[1].routes is None
    np.testing.assert_array_equal(old[1].actions, data[1].actions)

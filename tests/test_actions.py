"""Trajectory → action conversion (docs/ARCHITECTURE.md, "Actions") and the trajectory file loaders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from terra import TerraInputError
from terra.inputs.actions import (
    actions_for_manoeuvre, actions_from_instruction_trajs, actions_from_trajectory, load_actions,
)
from terra.inputs.trajectory import EgoTrajectory, MANOEUVRES


def linear_trajs(frames: int = 2) -> np.ndarray:
    """Point i of every frame's future: x = 0.5 i, y = 0.1 i, z = 0.01."""
    i = np.arange(60, dtype=np.float64)
    one = np.stack([0.5 * i, 0.1 * i, np.full(60, 0.01)], axis=-1)
    return np.stack([one] * frames)


def test_instruction_trajs_hand_computed():
    actions = actions_from_instruction_trajs(linear_trajs())
    assert actions.shape == (2, 6, 3) and actions.dtype == np.float32
    # point 9 + 10k: y = 0.1 (9 + 10k), x = 0.5 (9 + 10k), time = 0.05 (9 + 10k)
    expected = np.array([[0.9, 4.5, 0.45], [1.9, 9.5, 0.95], [2.9, 14.5, 1.45],
                         [3.9, 19.5, 1.95], [4.9, 24.5, 2.45], [5.9, 29.5, 2.95]], dtype=np.float32)
    np.testing.assert_allclose(actions[0], expected, rtol=1e-6)
    np.testing.assert_allclose(actions[1], expected, rtol=1e-6)


def test_world_trajectory_is_expressed_in_each_frames_ego_frame():
    # Driving north (+y in the world) at 10 m/s: in the ego frame the car goes straight ahead.
    t = np.arange(0, 6, 0.1)
    traj = EgoTrajectory.from_arrays(x=np.full_like(t, 5.0), y=10.0 * t, t=t)
    actions = actions_from_trajectory(traj, num_frames=5)
    np.testing.assert_allclose(actions[:, :, 0], 0.0, atol=1e-6)  # no lateral offset
    np.testing.assert_allclose(actions[:, :, 1], np.broadcast_to(10.0 * (np.arange(6) * 0.5 + 0.45), (5, 6)), rtol=1e-5)
    # Beyond its end the trajectory continues at its final speed, so late frames keep full 3 s futures.
    late = actions_from_trajectory(traj, num_frames=traj.num_frames())
    np.testing.assert_allclose(late[-1, :, 1], actions[0, :, 1], rtol=1e-5)


def test_manoeuvres_turn_the_commanded_way():
    left = actions_for_manoeuvre("curve_left", 4)
    right = actions_for_manoeuvre("curve_right", 4)
    straight = actions_for_manoeuvre("straight", 4, speed_kmh=36)
    assert (left[:, -1, 0] > 1.0).all() and (right[:, -1, 0] < -1.0).all()
    np.testing.assert_allclose(left[..., 0], -right[..., 0], atol=1e-5)
    np.testing.assert_allclose(straight[0, :, 1], 10.0 * (np.arange(6) * 0.5 + 0.45), rtol=1e-4)
    stop = actions_for_manoeuvre("stop", 40, speed_kmh=20, accel_mps2=3)
    assert stop[-1, -1, 1] == pytest.approx(0.0, abs=1e-4)  # standing still at the end
    for name in MANOEUVRES:
        assert actions_for_manoeuvre(name, 3).shape == (3, 6, 3)
    change = actions_for_manoeuvre("lane_change_left", 1, speed_kmh=50)
    assert 2.5 < change[0, -1, 0] < 4.0  # about one lane to the left after 3 s


def test_load_every_file_format(tmp_path):
    trajs = linear_trajs(5)
    expected = actions_from_instruction_trajs(trajs)
    np.save(tmp_path / "trajs.npy", trajs)
    np.save(tmp_path / "actions.npy", expected)
    (tmp_path / "actbench.json").write_text(json.dumps({"instruction_trajs": trajs.tolist()}))
    (tmp_path / "bare.json").write_text(json.dumps(expected.tolist()))
    for name in ("trajs.npy", "actions.npy", "actbench.json", "bare.json"):
        np.testing.assert_allclose(load_actions(tmp_path / name), expected, rtol=1e-6, err_msg=name)

    t = np.arange(0, 3.01, 0.1)
    (tmp_path / "world.csv").write_text("t,x,y\n" + "\n".join(f"{a},{8 * a},0" for a in t))
    (tmp_path / "world.json").write_text(json.dumps({"trajectory": {"x": (8 * t).tolist(), "y": [0] * len(t)}}))
    csv_actions, json_actions = load_actions(tmp_path / "world.csv"), load_actions(tmp_path / "world.json")
    assert csv_actions.shape == (31, 6, 3)
    np.testing.assert_allclose(csv_actions, json_actions, atol=1e-5)
    np.testing.assert_allclose(csv_actions[0, :, 1], 8 * (np.arange(6) * 0.5 + 0.45), rtol=1e-5)

    (tmp_path / "m.json").write_text(json.dumps({"manoeuvre": {"name": "curve_left", "speed_kmh": 40}}))
    np.testing.assert_allclose(load_actions(tmp_path / "m.json", num_frames=7),
                               actions_for_manoeuvre("curve_left", 7, speed_kmh=40), rtol=1e-6)


BAD_FILES = {
    "shape.npy": (lambda p: np.save(p, np.zeros((4, 5))), "not a trajectory"),
    "short.npy": (lambda p: np.save(p, np.zeros((4, 59, 3))), "60 points"),
    "nan.json": (lambda p: p.write_text(json.dumps({"actions": [[[float("nan")] * 3] * 6]})), "NaN"),
    "inf.npy": (lambda p: np.save(p, np.full((2, 6, 3), np.inf)), "NaN or inf"),
    "unknown.json": (lambda p: p.write_text(json.dumps({"manoeuvre": "barrel_roll"})), "unknown manoeuvre"),
    "broken.json": (lambda p: p.write_text("{not json"), "cannot be read"),
    "corrupt.npy": (lambda p: p.write_bytes(b"garbage"), "cannot be read"),
    "time.csv": (lambda p: p.write_text("t,x,y\n0,0,0\n0.2,1,0\n0.1,2,0\n"), "increase strictly"),
    "cols.csv": (lambda p: p.write_text("a,b\n0,0\n1,1\n"), "must name columns x and y"),
    "keys.json": (lambda p: p.write_text(json.dumps({"path": []})), "unknown key .path.; a trajectory holds one of"),
    "traj.txt": (lambda p: p.write_text("1 2 3"), "unknown type"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_malformed_trajectory_files_give_one_line_errors(tmp_path, name):
    write, message = BAD_FILES[name]
    path = tmp_path / name
    write(path)
    with pytest.raises(TerraInputError, match=message) as err:
        load_actions(path, num_frames=2)
    text = str(err.value)
    assert "\n" not in text and (name in text or "manoeuvre" in text)


def test_missing_file_and_too_short_trajectory(tmp_path):
    with pytest.raises(TerraInputError, match="does not exist"):
        load_actions(tmp_path / "nope.json")
    np.save(tmp_path / "a.npy", np.zeros((3, 6, 3)))
    with pytest.raises(TerraInputError, match="needs actions for 10"):
        load_actions(tmp_path / "a.npy", num_frames=10)

"""scripts/experiments/replay_lane_response.py: the paths it tells (the driven path at the action times, the arc held
from the next step, which the session's rule reads back as that step), the pooled gain, its interval and the
step-to-step error, the made-up weaves, and a replay of two of them on the demo model, whose control (the truth through
the tokenizer) reads near 1."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from terra.contract.actions import ACTION_TIMES
from terra.inputs.ego_motion import compose, ego_motion, to_ego
from tests.conftest import SCRIPTS, load_script

script = load_script("experiments/replay_lane_response")
SCRIPT = SCRIPTS / "experiments" / "replay_lane_response.py"
SMALL = ["--told", "held", "--frames", "1"]  # the least work a run does, were a check to come after it


def run(args: list[str], cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, cwd=cwd)


def refused(args: list[str], *words: str) -> str:
    """The script run on ``args`` ends with exit 2 and one stderr line holding ``words``, no traceback."""
    done = run(args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


def arc_poses(curvature: float, speed: float, steps: int, start=(3.0, -2.0, 0.7)) -> np.ndarray:
    """World poses every 0.1 s of a car driving a circle of ``curvature`` at ``speed`` from ``start``."""
    s = speed * 0.1 * np.arange(steps)
    heading = curvature * s
    if curvature:
        local = np.stack([np.sin(heading) / curvature, (1 - np.cos(heading)) / curvature, heading], axis=-1)
    else:
        local = np.stack([s, 0 * s, 0 * s], axis=-1)
    return compose(np.asarray(start), local)


@pytest.mark.parametrize("curvature", [0.0, 0.03, -0.08])
def test_the_held_arc_is_read_back_as_the_next_step(curvature):
    poses = arc_poses(curvature, 9.0, 40)
    x, y, yaw = ego_motion(script.held_action(poses, 0))  # how a session moves the car by an action
    assert np.allclose([x, y], to_ego(poses[1, :2], poses[0]), atol=1e-6)
    assert yaw == pytest.approx(curvature * 0.9, abs=1e-6)
    # on a circle the held arc is the path itself: the path driven, but for the chords between frames (< 1 cm)
    assert np.allclose(script.held_action(poses, 5), script.driven_action(poses, 5), atol=1e-2)


def test_the_driven_path_is_the_poses_at_the_action_times():
    rng = np.random.default_rng(0)
    poses = np.cumsum(rng.normal(0, 0.3, (50, 3)), axis=0)
    action = script.driven_action(poses, 3)
    assert np.allclose(action[:, 2], ACTION_TIMES)
    at = 3 + ACTION_TIMES * 10  # 7.5, 12.5, ...: halfway between frames
    halfway = (poses[np.floor(at).astype(int), :2] + poses[np.ceil(at).astype(int), :2]) / 2
    assert np.allclose(action[:, [1, 0]], to_ego(halfway, poses[3]), atol=1e-5)


def test_the_gain_is_pooled_over_drives_and_bounded_by_them():
    truth = np.array([[0.1, -0.2, 0.3, 0.9], [0.2, np.nan, -0.1, 0.05]])
    half = script.lane_gain(0.5 * truth, truth, within=0.5)
    assert half["gain"] == pytest.approx(0.5) and half["interval"] == pytest.approx([0.5, 0.5])
    assert half["frames"] == 6 and half["noise_m"] == pytest.approx(0.0)  # the NaN and the 0.9 m frame left out
    mixed = script.lane_gain(truth * np.array([[1.0], [0.0]]), truth, within=0.5)
    assert 0 < mixed["gain"] < 1 and mixed["interval"] == pytest.approx([0.0, 1.0])  # one drive drawn twice


def test_a_made_up_weave_swings_as_asked_and_starts_where_its_scenario_does():
    from terra.closedloop.scenarios import synthetic_scenarios

    record = script.weave_record(1, 40, 16.0, 0.5)
    scenario = synthetic_scenarios(2, 0, (144, 256), indices=[1])[0]
    poses = np.asarray(record["world_poses"])
    assert record["scenario"] == scenario.id and len(poses) == 40 + 1 + 30 and len(record["actions"]) == 40
    assert np.allclose(poses[0, :2], scenario.start_pose[:2], atol=1e-6)
    _, offset = scenario.scene.road_coords(poses[:, 0], poses[:, 1])
    swing = offset - offset[0]
    assert 0.45 < np.abs(swing).max() <= 0.5 + 1e-6
    crossings = np.flatnonzero(np.diff(np.sign(swing[5:])) != 0)  # past the start, where it is grown from 0
    step = scenario.speed_kmh / 3.6 / 10
    assert 2 * np.median(np.diff(crossings)) * step == pytest.approx(16.0, rel=0.1)
    assert np.allclose(record["actions"][3], script.driven_action(poses, 3))


def test_the_step_to_step_error_is_what_moves_between_frames():
    truth = np.array([[0.0, 0.1, 0.2, 0.3]])
    assert script.lane_gain(truth + 0.05, truth, within=0.5)["step_m"] == pytest.approx(0.0)  # a steady offset
    shaken = script.lane_gain(truth + np.array([[0.02, -0.02, 0.02, -0.02]]), truth, within=0.5)
    assert shaken["step_m"] == pytest.approx(0.04)


def test_a_replay_on_the_demo_model_reads_its_control_near_one(tmp_path, capsys):
    for index in (0, 1):
        (tmp_path / f"drive{index}.json").write_text(json.dumps(script.weave_record(index, 8, 16.0, 0.5)))
    out = tmp_path / "response.json"
    script.main(["--drives", str(tmp_path / "drive*.json"), "--told", "held", "forecast", "--frames", "8",
                 "--within", "1.0", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["drives"] == 2 and report["frames"] == 8 and set(report["told"]) == {"held", "forecast"}
    control = report["control_tokenizer_on_truth"]
    assert control["frames"] >= 12 and 0.8 < control["gain"] < 1.2, control
    assert all(np.isfinite(row["model_on_truth"]["gain"]) for row in report["told"].values())
    assert np.load(out.with_suffix(".npz"))["held"].shape == (2, 8, 3)
    assert "control: the truth through the tokenizer on the truth" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        script.main(["--drives", str(tmp_path / "none*.json")])
    assert exit_.value.code == 2 and "matches no file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        script.main(["--weave", "0", "0.3"])
    assert exit_.value.code == 2 and "wavelength > 0" in capsys.readouterr().err


@pytest.mark.parametrize("args", [
    ["--weave", "8", "0.3", "--frames", "100000000"],
    ["--weave", "8", "0.3", "--frames", "0"],
    ["--weave", "8", "0.3", "--within", "-1"],
    ["--weave", "8", "0.3", "--within", "nan"],
    ["--weave", "8", "0.3", "--temperature", "inf"],
    ["--weave", "8", "0.3", "--seed", "-1"],
    ["--weave", "8", "0.3", "--scenarios", "-3"],
    ["--weave", "nan", "0.3"],
    ["--weave", "8", "-0.3"],
], ids=["frames-huge", "frames-0", "within-negative", "within-nan", "temperature-inf", "seed-negative",
        "scenarios-negative", "weave-nan", "amplitude-negative"])
def test_numbers_out_of_range_are_one_line(args):
    refused(args, "replay_lane_response: error: argument", "takes a")


def test_a_bad_out_is_refused_before_the_work(tmp_path):
    drive = tmp_path / "drive0.json"
    drive.write_text(json.dumps(script.weave_record(0, 4, 16.0, 0.5)))
    refused(["--weave", "8", "0.3", "--scenarios", "1", *SMALL, "--out", str(tmp_path / "missing" / "r.json")],
            "--out", "does not exist")
    refused(["--weave", "8", "0.3", "--scenarios", "1", *SMALL, "--out", str(tmp_path)], "--out", "is a folder")
    refused(["--drives", str(drive), *SMALL, "--out", str(drive)], "--out", "would overwrite the input")


@pytest.mark.parametrize("text, words", [
    ('{"scenario": "synthetic-0",\n "world_poses": [[0.0, 1.0', ["line 2", "not JSON"]),
    ('{"scenario": "synthetic-0", "actions": []}', ["'world_poses'"]),
    ('{"scenario": "synthetic-0", "world_poses": [["1.5", 0, 0]]}', ["'world_poses'"]),
    ('{"scenario": "synthetic-0", "world_poses": [[NaN, 0, 0]]}', ["'world_poses'"]),
    ('{"scenario": 7, "world_poses": [[0, 0, 0]]}', ["'scenario'"]),
    ('[1, 2]', ["no JSON object"]),
], ids=["torn", "no-poses", "string-poses", "nan-poses", "no-scenario-name", "not-an-object"])
def test_a_torn_drive_file_is_one_line_naming_it(tmp_path, text, words):
    (tmp_path / "drive.json").write_text(text)
    refused(["--drives", str(tmp_path / "*.json"), *SMALL], str(tmp_path / "drive.json"), *words)


def test_the_default_and_checkout_paths_work_from_another_folder(tmp_path):
    out = tmp_path / "r.json"
    done = run(["--weave", "8", "0.3", "--scenarios", "1", *SMALL, "--out", "r.json"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(out.read_text())["frames"] == 1 and out.with_suffix(".npz").is_file()
    refused(["--weave", "8", "0.3", "--model", "no/such/model"], "--model", "no/such/model is no folder")
    assert script.main(["--weave", "8", "0.3", "--scenarios", "1", *SMALL, "--model",
                        "terra/assets/demo/world_model"]) == 0  # the docs' path, found in the checkout

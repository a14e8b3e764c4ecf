"""terra-drive ``road=FILE``: one road file (JSON, CSV or a clipgt zip) tells every scenario's model world its
routes; each drive's record says per step whether a route was told and why not, stdout sums it up in one line; a
road that does not reach the car is one line before any model loads."""

from __future__ import annotations

import json
import time

import numpy as np
from hydra import compose, initialize_config_dir

from terra.apps.runner import CONF_DIR
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.study.settings import terra_drive_settings
from tests.closedloop.test_drive_app import drive
from tests.conftest import one_error_line, save_tiny_tokenizer, tiny_route_model

STEPS = 6


def straight_lane(start_pose: np.ndarray, behind_m: float, ahead_m: float, shift_m: float = 0.0) -> list:
    """A straight lane through world ``start_pose`` along its heading, ``shift_m`` to its left, [x, y] rows."""
    x, y, yaw = start_pose
    forward, left = np.array([np.cos(yaw), np.sin(yaw)]), np.array([-np.sin(yaw), np.cos(yaw)])
    return [(np.array([x, y]) + shift_m * left + s * forward).round(3).tolist() for s in (-behind_m, ahead_m)]


def test_a_road_file_tells_each_step_and_says_where_it_ended(tmp_path, capsys):
    from terra.closedloop.study.drives import terra_drive

    [scenario] = synthetic_scenarios(1, 0, (16, 16))  # the drive's start: its 3 context frames'
    road = tmp_path / "road.csv"  # ends 41.5 m ahead: a route needs 40 m of road ahead, the car drives 3 m or more
    road.write_text("x,y\n" + "\n".join(f"{x},{y}" for x, y in straight_lane(scenario.start_pose, 20.0, 41.5)))
    tiny_route_model().save_pretrained(tmp_path / "world_model")
    save_tiny_tokenizer(tmp_path / "tokenizer")
    args = ["world=model", "num_scenarios=1", f"num_steps={STEPS}", "policies=[constant_speed]", "backend=hf",
            "device=cpu", "num_threads=1", "progress=false", "videos=false", f"road={road}",
            f"model.world_model={tmp_path / 'world_model'}", f"tokenizer.path={tmp_path / 'tokenizer'}"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        outcome = terra_drive(terra_drive_settings(compose("drive", overrides=args), tmp_path / "out"))
    assert outcome.exit_code == 0, outcome.lines
    [record] = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json") if "__" in p.name]
    told = record["route_told"]
    ended = told.count("road ended")
    assert told == ["told"] * (STEPS - ended) + ["road ended"] * ended and 0 < ended < STEPS, told
    assert (record["route"], record["route_source"], record["routed_steps"]) == (True, "road.csv", STEPS - ended)
    assert f"terra-drive: route told in {STEPS - ended} of {STEPS} frames: {ended} road ended" in outcome.lines


def test_a_road_file_off_the_car_is_one_line_naming_the_nearest_lane_before_any_model(tmp_path):
    [scenario] = synthetic_scenarios(1, 0, (16, 16))
    road = tmp_path / "beside.json"
    road.write_text(json.dumps({"road": straight_lane(scenario.start_pose, 20.0, 200.0, shift_m=6.0)}))
    started = time.monotonic()
    result = drive("num_scenarios=1", f"road={road}", f"output_dir={tmp_path / 'out'}", cwd=tmp_path)
    one_error_line(result, "terra-drive", f"road={road}: scenario {scenario.id}: the car does not lie on a lane of "
                                          "the road (within 4 m of a centreline, heading within 60 degrees of it): "
                                          "the nearest lane is 6.")
    assert "heading 0 degrees off the car's; give the road in the scenario's world frame" in result.stderr
    assert time.monotonic() - started < 20 and not (tmp_path / "out").exists()  # no model loaded, nothing written

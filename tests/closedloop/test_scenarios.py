"""Scenarios from a driving-log folder and from a batch JSONL: context frames, the actions between them, the speed
and (logs) the recorded path ahead as route."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from terra.closedloop.loop import DriveSpec, run_drives
from terra.closedloop.policies.builtin import reference_policy
from terra.closedloop.scenarios import log_scenarios, scenario_source, synthetic_scenarios
from terra.closedloop.worlds import TrueWorld
from terra.core.errors import TerraInputError
from terra.sim.logs import write_driving_logs

SIZE = (72, 128)


def test_driving_log_clips_become_scenarios_with_their_path_as_route(tmp_path):
    logs = write_driving_logs(tmp_path / "logs", 2, 12, *SIZE, seed=3, progress=False)
    scenarios = log_scenarios(logs, SIZE, num_context=3)
    assert [s.id for s in scenarios] == ["log-day-3-00000", "log-day-3-00001"]
    for scenario in scenarios:
        assert scenario.images.shape == (3, *SIZE, 3) and scenario.actions.shape == (2, 6, 3)
        assert scenario.speed_kmh > 5 and scenario.scene is None
        route = scenario.route(scenario.start_pose)
        assert len(route) > 10 and route[0, 0] == pytest.approx(0.0, abs=0.5) and route[-1, 0] > 5.0
    clip = json.loads((logs / "clips.json").read_text())["clips"][0]
    assert abs(scenarios[0].speed_kmh - clip["speed_kmh"]) < 8.0  # the start speed, within what 0.2 s can change
    with pytest.raises(TerraInputError, match="does not exist"):
        log_scenarios(tmp_path / "nowhere", SIZE)


def test_batch_samples_become_scenarios(tmp_path):
    frames = synthetic_scenarios(1, 5, SIZE)[0].images
    for i, frame in enumerate(frames):
        Image.fromarray(frame).save(tmp_path / f"f{i}.png")
    lines = [{"sample_id": "a", "context": [f"f{i}.png" for i in range(3)], "manoeuvre": "curve_left"},
             {"sample_id": 7, "context": "f*.png", "trajectory": {"x": list(np.arange(40.0)), "y": [0.0] * 40}}]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    scenarios = scenario_source(tmp_path / "s.jsonl").load(SIZE, 3)
    assert [s.id for s in scenarios] == ["sample-a", "sample-7"]
    np.testing.assert_array_equal(scenarios[0].images, frames)  # PNG round trip of the same size: exact
    assert scenarios[1].speed_kmh == pytest.approx(36.0, rel=1e-3)  # 1 m per 0.1 s
    assert len(scenarios[0].route(np.zeros(3))) == 0  # no route: a JSONL sample has none
    # a scenario without a scene drives in the model world only
    [drive] = run_drives(TrueWorld(SIZE), [DriveSpec(scenarios[0], "lane", reference_policy("lane_follower"))], 2)
    assert drive.stage == "setup" and "synthetic scene" in drive.error
    (tmp_path / "bad.jsonl").write_text('{"sample_id": 1}\n')
    with pytest.raises(TerraInputError, match="line 1"):
        scenario_source(tmp_path / "bad.jsonl").load(SIZE)


def test_a_jsonl_scenario_refuses_a_route_in_one_line(tmp_path):
    """terra-drive takes no route from a sample (its drives go where the policy steers): a route beside the
    trajectory (even 7 points, which terra-rollout refuses) or in its trajectory file is one line, never dropped;
    a misspelt key and a number in quotes too."""
    frames = synthetic_scenarios(1, 5, SIZE)[0].images
    for i, frame in enumerate(frames):
        Image.fromarray(frame).save(tmp_path / f"f{i}.png")
    base = {"sample_id": "a", "context": [f"f{i}.png" for i in range(3)], "manoeuvre": "curve_left"}
    seven = [[[10.0 * (k + 1), 0.0] for k in range(7)]] * 4
    (tmp_path / "routed.json").write_text(json.dumps({"manoeuvre": "straight", "ego_routes": seven}))
    cases = {"ego_routes": ({**base, "ego_routes": seven}, "line 1: gives ego_routes, but terra-drive takes no route "
                                                           "from a JSONL sample"),
             "road": ({**base, "road": [[0, 0], [100, 0]]}, "line 1: gives road, but terra-drive takes no route"),
             "old": ({**base, "routes": seven}, "line 1: unknown key 'routes' (did you mean 'ego_routes'?)"),
             "typo": ({**base, "route": seven}, "line 1: unknown key 'route' (did you mean 'ego_routes'?)"),
             "file": ({"sample_id": "a", "context": base["context"], "trajectory": "routed.json"},
                      "sample 'a': the trajectory carries routes, but terra-drive takes no route"),
             "quoted": ({"sample_id": "a", "context": base["context"],
                         "trajectory": {"x": ["0", 1.0, 2.0], "y": [0.0, 0.0, 0.0]}}, "the string '0'")}
    for name, (line, text) in cases.items():
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(line) + "\n")
        with pytest.raises(TerraInputError) as err:
            scenario_source(tmp_path / f"{name}.jsonl").load(SIZE, 3)
        assert text in str(err.value) and "\n" not in str(err.value), (name, str(err.value))
    (tmp_path / "null.jsonl").write_text(json.dumps({**base, "ego_routes": None}) + "\n")  # null: no route, as before
    assert len(scenario_source(tmp_path / "null.jsonl").load(SIZE, 3)) == 1

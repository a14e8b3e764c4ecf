"""A drive's JSON says whether the world model was told a route and from where (terra/closedloop/recording/files.py):
the scenario's scene, a clipgt map read for it (``road=FOLDER``), a route control's road, or none (the true world, a
model without route slots, ``no_route``, a scenario whose road is not known); its top-down picture draws the road,
the told route (only where one was told) and the driven path."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from terra.closedloop.loop import DriveSpec
from terra.closedloop.policies.builtin import reference_policy
from terra.closedloop.recording.run import RunSettings
from terra.closedloop.scenarios import Scenario, synthetic_scenarios
from terra.closedloop.study.control_worlds import control_world
from terra.closedloop.worlds import ModelWorld, TrueWorld
from terra.config.sampling import SamplingConfig
from terra.generation.backends import model_backend
from terra.models.presets import TINY_TOKENIZER
from terra.pipeline import WorldModelPipeline
from terra.sim.scene import scene_road
from terra.tokenizer.lfq import LFQTokenizer
from tests.closedloop.conftest import drive_and_record
from tests.conftest import tiny_model, tiny_route_model

SIZE = (64, 64)


@pytest.fixture(scope="module")
def scenario(single_thread) -> Scenario:
    return synthetic_scenarios(1, seed=2, image_size=SIZE, num_context=2)[0]


def told(world, scenario: Scenario, out: Path) -> tuple[bool, str | None]:
    """``(route, route_source)`` of a one-step drive of ``scenario`` in ``world``, read from its JSON file."""
    spec = DriveSpec(scenario, "lane_follower", reference_policy("lane_follower"))
    result = drive_and_record(world, [spec], RunSettings(out, num_steps=1, progress=False, videos=False))
    assert result.counts["ok"] == 1, result.records
    content = json.loads((out / f"{spec.id}.json").read_text())
    return content["route"], content["route_source"]


def model_world(model) -> ModelWorld:
    return ModelWorld(WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), model_backend(model)),
                      SamplingConfig(temperature=0))


def test_a_drive_record_says_which_road_the_model_was_told(scenario, tmp_path):
    model = model_world(tiny_route_model())
    try:
        assert told(model, scenario, tmp_path / "scene") == (True, "scene")
        mapped = replace(scenario, road=scene_road(scenario.scene))  # road=FOLDER: read from its clipgt map
        assert told(model, mapped, tmp_path / "map") == (True, "clipgt map")
        roadless = Scenario("log", scenario.images, scenario.actions, scenario.speed_kmh, scenario.start_pose)
        assert told(model, roadless, tmp_path / "log") == (False, None)
        wrong = control_world("wrong_route", SIZE, model)
        assert told(wrong, scenario, tmp_path / "wrong") == (True, "wrong_route: another scenario's road")
        assert told(control_world("no_route", SIZE, model), scenario, tmp_path / "none") == (False, None)
    finally:
        model.shutdown()
    plain = model_world(tiny_model())
    try:
        assert told(plain, scenario, tmp_path / "plain") == (False, None)  # no route slots: nothing told
    finally:
        plain.shutdown()
    assert told(TrueWorld(SIZE), scenario, tmp_path / "truth") == (False, None)


def picture_shares(path: Path) -> dict[str, float]:
    """The shares of a top-down picture's pixels in the told route's magenta, the path's blue and the road edge's
    grey."""
    rgb = np.asarray(Image.open(path).convert("RGB")).astype(int)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return {"route": float(((r > 220) & (g > 90) & (g < 190) & (b > 200)).mean()),
            "path": float(((r < 90) & (g > 80) & (g < 150) & (b > 170)).mean()),
            "road": float(((np.abs(r - 51) < 12) & (np.abs(g - 51) < 12) & (np.abs(b - 51) < 12)).mean())}


def test_a_drive_writes_a_picture_of_its_road_the_told_route_and_its_path(scenario, tmp_path):
    spec = DriveSpec(scenario, "lane_follower", reference_policy("lane_follower"))
    model = model_world(tiny_route_model())
    try:
        for world, name in ((model, "model"), (TrueWorld(SIZE), "truth")):
            result = drive_and_record(world, [spec], RunSettings(tmp_path / name, num_steps=20, progress=False))
            assert result.counts["ok"] == 1, result.records
    finally:
        model.shutdown()
    told, untold = (picture_shares(tmp_path / name / f"{spec.id}.png") for name in ("model", "truth"))
    assert told["route"] > 0.0005 and untold["route"] == 0.0  # the truth is told no route: none drawn, nor named
    for shares in (told, untold):
        assert shares["path"] > 0.0005 and shares["road"] > 0.002, shares

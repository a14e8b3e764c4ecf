"""A route model in the closed loop's model world: each drive is told its scenario's road ahead of every pose it
reaches (and its context frames'), a model without route slots is told nothing, a scenario without a known road
runs with "no route"."""

from __future__ import annotations

import numpy as np
import pytest

from terra.closedloop.scenarios import Scenario, synthetic_scenarios
from terra.closedloop.worlds import ModelWorld
from terra.config.sampling import SamplingConfig
from terra.generation.hf_backend import HFBackend
from terra.models.presets import TINY_TOKENIZER
from terra.pipeline import WorldModelPipeline
from terra.tokenizer.lfq import LFQTokenizer
from tests.conftest import TINY_ROUTES, tiny_model, tiny_route_model


def world_of(model) -> ModelWorld:
    return ModelWorld(WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), HFBackend(model)),
                      SamplingConfig(temperature=0))


@pytest.fixture(scope="module")
def scenario(single_thread) -> Scenario:
    return synthetic_scenarios(1, seed=2, image_size=(64, 64), num_context=2)[0]


def test_drives_are_told_the_road_ahead_of_each_pose(scenario):
    world = world_of(tiny_route_model())
    try:
        drive = world.open(scenario, seed=1, max_frames=4)
        poses = [scenario.start_pose + [0.8 * k * np.cos(scenario.start_pose[2]), 0.8 * k * np.sin(
            scenario.start_pose[2]), 0.0] for k in range(1, 4)]
        for pose in poses:
            world.step([drive], [scenario.actions[-1]], [pose])
        state = drive.rollout.state
        expected = scenario.scene.route(np.stack([scenario.context_poses[1], *poses]), TINY_ROUTES)
        np.testing.assert_allclose(state.routes[:4], expected, atol=1e-5)
    finally:
        world.shutdown()


def test_no_road_or_no_route_slots_means_no_route(scenario):
    roadless = Scenario("log", scenario.images, scenario.actions, scenario.speed_kmh, scenario.start_pose)
    world = world_of(tiny_route_model())
    try:
        drive = world.open(roadless, seed=1, max_frames=2)
        world.step([drive], [scenario.actions[-1]], [scenario.start_pose])
        assert np.isnan(drive.rollout.state.routes).all()
    finally:
        world.shutdown()
    plain = world_of(tiny_model())
    try:
        drive = plain.open(scenario, seed=1, max_frames=2)
        plain.step([drive], [scenario.actions[-1]], [scenario.start_pose])
        assert drive.rollout.state.routes.shape[1] == 0
    finally:
        plain.shutdown()

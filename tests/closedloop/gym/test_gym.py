"""The gymnasium environments pass gymnasium's own checker, on the true frames and on a world model."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

gymnasium = pytest.importorskip("gymnasium")
from gymnasium.utils.env_checker import check_env  # noqa: E402

from terra.closedloop.gym.env import DriveEnv, DriveVectorEnv  # noqa: E402
from terra.closedloop.car.motion import VEHICLES  # noqa: E402
from terra.closedloop.plans import as_plan  # noqa: E402
from terra.closedloop.scenarios import synthetic_scenarios  # noqa: E402
from terra.closedloop.worlds import ModelWorld, TrueWorld  # noqa: E402
from terra.config.sampling import SamplingConfig  # noqa: E402
from terra.contract.routes import route_slot_values  # noqa: E402
from terra.core.errors import TerraInputError  # noqa: E402
from terra.generation.backends import model_backend  # noqa: E402
from terra.models.presets import TINY_TOKENIZER  # noqa: E402
from terra.pipeline import WorldModelPipeline  # noqa: E402
from terra.tokenizer.lfq import LFQTokenizer  # noqa: E402
from tests.conftest import tiny_model  # noqa: E402

SIZE = (72, 128)


def checked(env) -> list[str]:
    """Run check_env; the checker's warnings about the env itself (spaces, determinism), not about gym.make."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=False)
    return [str(w.message) for w in caught if "spec" not in str(w.message)]


@pytest.mark.parametrize("vehicle", ["bicycle", "exact"])
def test_drive_env_passes_check_env_on_true_frames(vehicle):
    """The reward is the metres the car drove: 0.8 a step at the plan's 8 m/s with the exact vehicle; the bicycle
    speeds up to it from the scenario's 6.04 m/s (0.61, 0.63, 0.66, 0.69 m), as a vehicle given the plans does."""
    scenarios = synthetic_scenarios(3, 1, SIZE)
    env = DriveEnv(TrueWorld(SIZE), scenarios, num_steps=4, vehicle=vehicle, action_mode="plan")
    assert checked(env) == []
    obs, info = env.reset(seed=5, options={"scenario": 2})
    assert obs["frame"].shape == (*SIZE, 3) and info["scenario"].endswith("002")
    straight = np.c_[4.0 * np.arange(1, 9), np.zeros((8, 2))]  # 8 m/s straight ahead
    car = VEHICLES[vehicle](scenarios[2].speed_kmh / 3.6)
    rewards, driven, truncated = [], [], False
    while not truncated:
        obs, reward, terminated, truncated, info = env.step(straight)
        rewards.append(reward)
        before = car.pose
        after = car.step(as_plan(straight))
        driven.append(np.cos(before[2]) * (after[0] - before[0]) + np.sin(before[2]) * (after[1] - before[1]))
    assert len(rewards) == 4 and np.allclose(rewards, driven, atol=1e-9) and not terminated
    assert np.allclose(rewards, 0.8, atol=1e-6) if vehicle == "exact" else 0.6 < rewards[0] < rewards[-1] < 0.8
    assert env.render().shape == (*SIZE, 3)
    env.close()


def test_an_unknown_vehicle_is_one_line():
    with pytest.raises(TerraInputError, match="unknown vehicle 'car'; choose one of: bicycle, exact"):
        DriveEnv(TrueWorld(SIZE), synthetic_scenarios(1, 1, SIZE), vehicle="car", action_mode="plan")


def test_drive_env_passes_check_env_on_a_world_model(single_thread):
    pipeline = WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), model_backend(tiny_model(), max_batch_size=4))
    world = ModelWorld(pipeline, SamplingConfig(temperature=1.0))
    try:
        env = DriveEnv(world, synthetic_scenarios(2, 1, TINY_TOKENIZER["image_size"]), num_steps=3)
        assert checked(env) == []
        env.close()
    finally:
        world.shutdown()


def test_vector_env_steps_drives_together_and_resets_ended_ones():
    env = DriveVectorEnv(TrueWorld(SIZE), synthetic_scenarios(2, 1, SIZE), num_envs=3, num_steps=2, action_mode="plan")
    obs, _ = env.reset(seed=0)
    assert obs["frame"].shape == (3, *SIZE, 3) and obs["ego"].shape == (3, 3)
    straight = np.broadcast_to(np.c_[4.0 * np.arange(1, 9), np.zeros((8, 2))], (3, 8, 3))
    outcomes = [env.step(straight)[1:4] for _ in range(3)]
    (r1, _, t1), (r2, _, t2), (r3, _, t3) = outcomes
    assert not t1.any() and t2.all()  # two steps each, then truncated
    np.testing.assert_allclose(r3, 0.0)  # the next step resets them (no motion, no reward)
    assert env.drives[0].steps == 0 and len(env.render()) == 3
    env.close()


def test_a_route_model_in_the_env_is_told_the_road_ahead_of_each_pose(single_thread):
    from tests.conftest import TINY_ROUTES, tiny_route_model

    pipeline = WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), model_backend(tiny_route_model(), max_batch_size=4))
    world = ModelWorld(pipeline, SamplingConfig(temperature=0))
    try:
        scenarios = synthetic_scenarios(1, 1, TINY_TOKENIZER["image_size"])
        env = DriveEnv(world, scenarios, num_steps=3, action_mode="plan")
        env.reset(seed=0)
        straight = np.c_[4.0 * np.arange(1, 9), np.zeros((8, 2))]
        for _ in range(2):
            env.step(straight)
            drive = env.drive
            state = drive.handle.rollout.state
            route = scenarios[0].scene.route(drive.reached(), TINY_ROUTES)
            np.testing.assert_allclose(state.route_slots[state.next_frame - 2], route_slot_values(route), atol=1e-5)
        env.close()
    finally:
        world.shutdown()

"""The gymnasium env as a gymnasium user meets it: registered ids, the actuation action mode through the vehicle's
limits, ``command`` as Discrete(4), the lane-keeping reward, stable-baselines3's checker, and hostile inputs refused
as gymnasium's own envs refuse them (one line, nothing changed; ``reset()`` needed after the end or a failed step;
vector steps all or nothing). All on the true world at 36x64."""

from __future__ import annotations

import dataclasses
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import ClosedEnvironmentError, InvalidAction, ResetNeeded

from terra.closedloop.gym.env import ENV_ID, DriveEnv, DriveVectorEnv
from terra.closedloop.gym.spaces import LANE_PENALTY, actuation_of
from terra.closedloop.plans import COMMANDS, Plan
from terra.closedloop.scenarios import Scenario, synthetic_scenarios
from terra.closedloop.car.vehicle import VehicleParams
from terra.closedloop.worlds import TrueWorld
from terra.core.errors import TerraInputError

SIZE = (36, 64)
SMALL = {"num_scenarios": 2, "image_size": SIZE}
WHEELBASE = VehicleParams().wheelbase_m


def refused(error: type, match: str, call, *args, **kwargs) -> str:
    """The one line ``call`` is refused with."""
    with pytest.raises(error, match=match) as caught:
        call(*args, **kwargs)
    assert "\n" not in str(caught.value)
    return str(caught.value)


# ---------------------------------------------------------------- registration


def test_the_ids_make_the_single_and_the_vector_env():
    env = gym.make(ENV_ID, **SMALL, num_steps=3)
    assert isinstance(env.unwrapped, DriveEnv) and env.spec.id == "terra/Drive-v0"
    obs, info = env.reset(seed=0, options={"scenario": 1})
    assert info["scenario"] == "synthetic-0-001" and env.observation_space.contains(obs)
    env.close()
    venv = gym.make_vec(ENV_ID, num_envs=3, **SMALL)  # the vector_entry_point, gymnasium's default for it
    assert isinstance(venv, DriveVectorEnv) and venv.num_envs == 3
    assert venv.metadata["render_fps"] == 10 and venv.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    obs, _ = venv.reset(seed=0)
    assert obs["frame"].shape == (3, *SIZE, 3) and obs["command"].dtype == np.int64
    assert venv.observation_space.contains(obs)
    venv.close()
    env = gym.make("terra.closedloop.gym.env:terra/Drive-v0", **SMALL)  # gymnasium's module:id form
    assert isinstance(env.unwrapped, DriveEnv)


def test_stable_baselines3_check_env_warns_nothing():
    env_checker = pytest.importorskip("stable_baselines3.common.env_checker")
    for reward in ("progress", "lane_keeping"):
        env = gym.make(ENV_ID, **SMALL, num_steps=5, reward=reward)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env_checker.check_env(env, warn=True)
        assert [str(w.message) for w in caught] == []
        env.close()
    with warnings.catch_warnings(record=True) as caught:  # control: the plan mode's Box is not normalized
        warnings.simplefilter("always")
        env_checker.check_env(gym.make(ENV_ID, **SMALL, action_mode="plan"), warn=True)
    assert any("symmetric and normalized Box" in str(w.message) for w in caught)


# ---------------------------------------------------------------- actuation actions, command, reward


def test_actuation_actions_scale_to_the_vehicle_limits():
    params = VehicleParams()
    for action, (steer, accel) in [([1, 0], (0.6, 0.0)), ([-1, 1], (-0.6, 6.0)), ([0.5, -1], (0.3, -8.0)),
                                   ([0, -0.25], (0.0, -2.0)), (np.float32([0.1, 0.5]), (0.06, 3.0))]:
        actuation = actuation_of(action, params)
        assert actuation.steer == pytest.approx(steer, abs=1e-7) and actuation.accel == pytest.approx(accel, abs=1e-7)


def test_actuation_actions_drive_the_bicycle():
    """Zero actions hold the speed and the heading; held full throttle for 1 s gains 6 m/s less the 0.1 s lag's share
    (5.4 m/s); a tenth of full lock turns the wheels at the 0.4 rad/s rate limit to 0.06 rad, then the car turns at
    v tan(0.06) / wheelbase."""
    env = DriveEnv(**SMALL, num_steps=40)
    obs, _ = env.reset(seed=0, options={"scenario": 0})
    speed = float(obs["ego"][0])
    for _ in range(5):
        obs, reward, *_ = env.step(np.zeros(2, np.float32))
        assert reward == pytest.approx(speed * 0.1, abs=1e-6)  # the speed observed in float32
        assert obs["ego"][1] == pytest.approx(0.0, abs=1e-9)
    for _ in range(10):
        obs, *_ = env.step(np.array([0.0, 1.0], np.float32))
    assert obs["ego"][0] - speed == pytest.approx(6.0 * (1 - 0.1 * (1 - np.exp(-10))), abs=0.02)
    obs, _ = env.reset(seed=0, options={"scenario": 0})
    for _ in range(7):  # 0.15 s at the rate limit, then 0.55 s of the lag: within 0.5 % of the command
        obs, *_ = env.step(np.array([0.1, 0.0], np.float32))
    assert obs["ego"][1] == pytest.approx(obs["ego"][0] * np.tan(0.06) / WHEELBASE, rel=0.005)
    assert env.drive.vehicle.state.steer == pytest.approx(0.06, rel=0.005)


def episode_lengths(env, episodes: int) -> list[int]:
    env.action_space.seed(0)
    lengths = []
    for seed in range(episodes):
        env.reset(seed=seed)
        steps, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            steps, done = steps + 1, terminated or truncated
        lengths.append(steps)
    return lengths


def test_random_actuation_actions_stay_on_the_road_for_seconds():
    """Random actions of the actuation mode keep the car on the road for 26 steps on average here (23, 13, 20, 29, 45;
    benchmarks/rl.md: 29.6 over 60 episodes); random plans followed exactly, the control known to throw the car off,
    last 1-2 steps (the issue's 1-8). Seeded: the same numbers every run."""
    control = episode_lengths(DriveEnv(num_scenarios=8, image_size=SIZE, num_steps=300), 5)
    plans = episode_lengths(DriveEnv(num_scenarios=8, image_size=SIZE, num_steps=300, action_mode="plan",
                                     vehicle="exact"), 5)
    assert np.mean(control) >= 15 and min(control) >= 6, control
    assert np.mean(plans) <= 4, plans


def test_command_is_discrete():
    env = DriveEnv(**SMALL)
    obs, _ = env.reset(seed=0)
    assert env.observation_space["command"] == gym.spaces.Discrete(4)
    assert obs["command"] == COMMANDS.index(env.drive.observation(1).ego.command)


def test_lane_keeping_pays_progress_along_the_road_less_the_lane_offset():
    env = DriveEnv(**SMALL, num_steps=30, reward="lane_keeping")
    env.reset(seed=0, options={"scenario": 0})
    scene = env.drive.spec.scenario.scene
    rewards, expected = [], []
    for k in range(25):
        _, reward, terminated, _, info = env.step(np.array([0.4 if k < 8 else 0.0, 0.0], np.float32))
        xy = env.drive.world_poses()[-2:, :2]  # the step's start and end
        along, across = scene.road_coords(xy[:, 0], xy[:, 1])
        offset = abs(across[1] - scene.ego_lane_offset_m)
        rewards.append(reward)
        expected.append(along[1] - along[0] - LANE_PENALTY * offset)
        assert info["lane_offset_m"] == pytest.approx(offset, abs=1e-9)
        if terminated:
            break
    np.testing.assert_allclose(rewards, expected, atol=1e-9)
    assert rewards[0] > 0.5 and rewards[-1] < rewards[0] - 0.2  # steered off the centre, it earns less


def test_settings_are_refused_in_one_line():
    for mode in ("controls", "control"):
        refused(TerraInputError, f"unknown action_mode '{mode}'; choose one of: actuation, plan", DriveEnv,
                action_mode=mode, **SMALL)
    refused(TerraInputError, "unknown reward 'lane'; choose one of: progress, lane_keeping", DriveEnv, reward="lane",
            **SMALL)
    refused(TerraInputError, "action_mode='actuation' steers the bicycle vehicle", DriveEnv, vehicle="exact", **SMALL)
    refused(TerraInputError, "world='model': the env builds only the true world", DriveEnv, world="model", **SMALL)
    refused(TerraInputError, "image_size must be \\(height, width\\)", DriveEnv, image_size=64)
    refused(TerraInputError, "image_size", DriveEnv, image_size=(4, 64))
    refused(TerraInputError, "num_scenarios", DriveEnv, num_scenarios=0)
    for steps in (0, -3, 2.5, "20"):
        refused(TerraInputError, "num_steps", DriveEnv, num_steps=steps, **SMALL)
        refused(TerraInputError, "num_steps", gym.make, ENV_ID, num_steps=steps, **SMALL)
    for count in (0, -1, 1.5, True):
        refused(TerraInputError, "num_envs", DriveVectorEnv, num_envs=count, **SMALL)
    [scenario] = synthetic_scenarios(1, 0, SIZE)
    logged = Scenario("log", scenario.images, scenario.actions, scenario.speed_kmh, scenario.start_pose)
    refused(TerraInputError, "reward='lane_keeping' needs synthetic scenarios", DriveEnv, TrueWorld(SIZE), [logged],
            reward="lane_keeping")


# ---------------------------------------------------------------- hostile inputs (as gymnasium's own envs check them)


def test_bad_scenarios_and_options_are_refused_before_anything_changes():
    env = DriveEnv(**SMALL)
    for options, text in [({"scenario": 99}, "reset option 'scenario'"), ({"scenario": -1}, "reset option"),
                          ({"scenario": 1.7}, "reset option"), ({"scenario": "first"}, "reset option"),
                          ({"scenario": True}, "reset option"),
                          ({"scenaro": 0}, "unknown reset option\\(s\\) \\['scenaro'\\]"),
                          ([0], "reset options must be a dict")]:
        refused(TerraInputError, text, env.reset, seed=0, options=options)
    assert env.drive is None
    refused(ResetNeeded, "call reset\\(\\) before step\\(\\): no drive yet", env.step, np.zeros(2))


def test_what_an_env_is_given_is_checked_at_construction():
    [scenario] = synthetic_scenarios(1, 0, SIZE)
    other = synthetic_scenarios(1, 0, (40, 64))[0]
    nan = dataclasses.replace(scenario, images=np.full(scenario.images.shape, np.nan))
    for world, scenarios, text in [
        ("truth", [scenario, nan], "scenarios\\[1\\] .* holds no context frames uint8 \\[n, H, W, 3\\] \\(got float64"),
        (object(), [scenario], "world: a object is not a World \\(no callable open, context_frames, step, close\\)"),
        ("truth", scenario, "scenarios must be a list of Scenario \\(got a Scenario\\)"),
        ("truth", "abc", "scenarios must be a list of Scenario"),
        ("truth", [scenario, {"id": 1}], "scenarios\\[1\\] is a dict, not a Scenario"),
        ("truth", [scenario, other], "scenarios\\[1\\] .* has 40x64 frames, scenarios\\[0\\] 36x64"),
        ("truth", [], "at least one scenario"),
    ]:
        refused(TerraInputError, text, DriveEnv, world, scenarios)
        refused(TerraInputError, text, DriveVectorEnv, world, scenarios, num_envs=2)
    refused(TerraInputError, "render_mode must be 'rgb_array' or None", DriveEnv, render_mode="human", **SMALL)



def test_a_scenario_of_yours_is_checked_whole_at_construction():
    """Every field of a caller's Scenario, once, as the env is made: one line naming scenarios[i] and the field. A
    scene that is not a Scene escaped reset() as an AttributeError, poses of another shape ended in a reshape
    error's words, and NaN poses became NaN routes, which a route model reads as "no route"."""
    [scenario] = synthetic_scenarios(1, 0, SIZE)
    where = "scenarios\\[1\\] \\(synthetic-0-000\\): "
    for change, text in [
        ({"scene": "abc"}, where + "scene must be a Scene or None \\(got a str\\)"),
        ({"road": "abc"}, where + "road must be a Road or None \\(got a str\\)"),
        ({"context_poses": np.zeros((2, 2))}, where + "context_poses must be None or \\[3, 3\\] finite numbers"),
        ({"context_poses": np.full((3, 3), np.nan)}, where + "context_poses must be None or .*holds NaN or inf"),
        ({"context_poses": [[0, 0, 0]] * 2 + [["a", 0, 0]]}, where + "context_poses must be None or"),
        ({"start_pose": np.array([0.0, np.nan, 0.0])}, where + "start_pose must be \\[3\\] finite numbers"),
        ({"start_pose": np.zeros(2)}, where + "start_pose must be \\[3\\] finite numbers .*got shape \\[2\\]"),
        ({"path": np.zeros(3)}, where + "path must be None or \\[M, 2\\] finite numbers"),
        ({"path": np.array([[0.0, 0.0], [np.inf, 1.0]])}, where + "path must be None or .*holds NaN or inf"),
        ({"speed_kmh": float("nan")}, where + "speed_kmh must be a number from 0 to 360"),
        ({"speed_kmh": "30"}, where + "speed_kmh must be a number from 0 to 360"),
        ({"actions": np.zeros((2, 5))}, where + "actions must be \\[2, 6, 3\\] finite numbers"),
        ({"id": 7}, "scenarios\\[1\\]: id must be a non-empty string \\(got 7\\)"),
    ]:
        bad = dataclasses.replace(scenario, **change)
        refused(TerraInputError, text, DriveEnv, "truth", [scenario, bad])
    DriveEnv("truth", [dataclasses.replace(scenario, context_poses=None, scene=None, path=np.zeros((0, 2)))])

def test_a_hundred_thousand_scenarios_are_built_when_driven():
    env = DriveEnv(num_scenarios=100_000, image_size=SIZE, num_steps=2)  # a documented value: nothing built yet
    assert len(env._drives.scenarios) == 100_000 and env._drives.scenarios._built.cache_info().currsize == 0
    obs, info = env.reset(seed=0, options={"scenario": 99_999})
    [expected] = synthetic_scenarios(100_000, 0, SIZE, indices=[99_999])
    assert info["scenario"] == expected.id and env._drives.scenarios._built.cache_info().currsize == 1
    np.testing.assert_array_equal(env.drive.frames[0], expected.images[0])
    env.close()


def test_step_or_reset_after_close_is_one_clear_error():
    env = DriveEnv(**SMALL, num_steps=3)
    env.reset(seed=0)
    env.close()
    env.close()  # closing twice is harmless
    refused(ClosedEnvironmentError, "step\\(\\) on a closed env", env.step, np.zeros(2))
    refused(ClosedEnvironmentError, "reset\\(\\) on a closed env", env.reset, seed=0)
    made = gym.make(ENV_ID, **SMALL, num_steps=3)
    made.reset(seed=0)
    made.close()
    refused(ClosedEnvironmentError, "step\\(\\) on a closed env", made.step, np.zeros(2, np.float32))
    vector = DriveVectorEnv(**SMALL, num_envs=2, num_steps=3)
    vector.reset(seed=0)
    frames = vector.render()
    frames[0][...] = 0  # the caller's copy: the recorded frame stays
    assert vector.drives[0].frames[-1].any()
    vector.close()
    refused(ClosedEnvironmentError, "step\\(\\) on a closed env", vector.step, np.zeros((2, 2)))
    refused(ClosedEnvironmentError, "reset\\(\\) on a closed env", vector.reset, seed=0)


def test_plan_actions_outside_the_declared_box_are_refused():
    env = DriveEnv(**SMALL, action_mode="plan", num_steps=4)
    env.reset(seed=0)
    inside = np.c_[5.0 * np.arange(1, 9), np.zeros((8, 2))]
    assert env.action_space.contains(inside.astype(np.float32))
    for outside, text in [(np.c_[500.0 * np.arange(1, 9), np.zeros((8, 2))],
                           "plan pose 0 \\(500, 0, 0\\) lies outside"),
                          (np.c_[5.0 * np.arange(1, 9), np.full(8, -40.0), np.zeros(8)], "plan pose 0 .*y -10 to 10"),
                          (np.c_[-5.0 * np.arange(1, 9), np.zeros((8, 2))], "plan pose 0 .*x 0 to 45"),
                          ({"poses": np.c_[90.0 * np.arange(1, 5), np.zeros(4)], "dt": 1.0}, "plan pose 0")]:
        assert not env.action_space.contains(np.asarray(outside["poses"] if isinstance(outside, dict) else outside,
                                                        np.float32)) or isinstance(outside, dict)
        refused(InvalidAction, text, env.step, outside)
        assert env.drive.steps == 0
    assert env.step(inside)[4]["pose"] is not None
    mine = Plan.trajectory(inside)
    env.step(mine)
    mine.poses.setflags(write=True)
    mine.poses[...] = 0.0  # the caller's Plan, changed after the step: the recorded plan is the env's own copy
    assert env.drive.plans[-1] is not mine and np.array_equal(env.drive.plans[-1].poses, Plan.trajectory(inside).poses)


@pytest.mark.parametrize("mode, action, text", [
    ("actuation", {"steer": 0.0}, "action is no actuation action"),
    ("actuation", np.zeros(3), "2 numbers \\[steering, acceleration\\], got shape \\[3\\]"),
    ("actuation", [np.nan, 0.0], "NaN or inf"),
    ("actuation", [1.5, 0.0], "lies in \\[-1, 1\\]"),
    ("actuation", "left", "not numbers"),
    ("plan", {"steer": 0.0}, "action is no plan action"),
    ("plan", np.full((8, 3), np.nan), "not finite numbers"),
    ("plan", np.zeros((7, 3)), "shape \\[7, 3\\]"),
])
def test_bad_actions_are_invalid_and_change_nothing(mode, action, text):
    env = DriveEnv(**SMALL, action_mode=mode, num_steps=3)
    env.reset(seed=0)
    pose = env.drive.vehicle.pose
    refused(InvalidAction, text, env.step, action)
    assert env.drive.steps == 0 and np.array_equal(env.drive.vehicle.pose, pose)
    assert env.step(env.action_space.sample())[4]["pose"] is not None  # the env goes on


def test_step_after_the_end_or_a_failed_world_step_needs_reset():
    env = DriveEnv(**SMALL, num_steps=2)
    env.reset(seed=0)
    env.step(np.zeros(2))
    assert env.step(np.zeros(2))[3]  # truncated
    refused(ResetNeeded, "the drive ended \\(terminated or truncated\\)", env.step, np.zeros(2))
    broken = DriveEnv(FailingWorld(SIZE), synthetic_scenarios(1, 0, SIZE), num_steps=5)
    broken.reset(seed=0)
    broken.step(np.zeros(2))
    broken._drives.world.fail = True
    refused(RuntimeError, "renderer died", broken.step, np.zeros(2))
    refused(ResetNeeded, "the world failed the last step", broken.step, np.zeros(2))
    broken._drives.world.fail = False
    broken.reset(seed=0)
    assert broken.step(np.zeros(2))[0]["frame"].shape == (*SIZE, 3)


def test_leaving_the_road_terminates_and_needs_reset():
    env = DriveEnv(**SMALL, num_steps=200)
    env.reset(seed=0, options={"scenario": 0})
    for step in range(200):  # noqa: B007 (read after the loop)
        _, _, terminated, truncated, info = env.step(np.array([1.0, 1.0], np.float32))
        if terminated or truncated:
            break
    assert terminated and info["ended"] == "the car left the road" and step < 60
    refused(ResetNeeded, "the drive ended", env.step, np.zeros(2))


class FailingWorld(TrueWorld):
    """The true world, whose steps fail while ``fail`` is set (a renderer or engine dying mid-step)."""

    fail = False

    def step(self, drives, actions, poses):
        return [RuntimeError("renderer died")] * len(drives) if self.fail else super().step(drives, actions, poses)


class MisshapenWorld(TrueWorld):
    """The true world, whose frames are one column too wide (``where``: from context_frames or step) or float."""

    where = None
    dtype = np.uint8

    def context_frames(self, drive):
        frames = super().context_frames(drive)
        return self.misshapen(frames) if self.where == "context_frames" else frames

    def step(self, drives, actions, poses):
        frames = super().step(drives, actions, poses)
        return [self.misshapen(f) for f in frames] if self.where == "step" else frames

    def misshapen(self, frames):
        return np.concatenate([frames, frames[..., :1, :]], axis=-2).astype(self.dtype)


def test_a_worlds_frame_outside_the_observation_space_is_one_line_naming_the_world():
    world = MisshapenWorld(SIZE)
    env = DriveEnv(world, synthetic_scenarios(1, 0, SIZE), num_steps=5)
    venv = DriveVectorEnv(world, synthetic_scenarios(1, 0, SIZE), num_envs=2, num_steps=5)
    env.reset(seed=0)
    venv.reset(seed=0)
    world.where = "step"
    text = "world truth: step returned a uint8 frame of shape \\[36, 65, 3\\]; the env's frames are uint8 of shape"
    refused(TerraInputError, text, env.step, np.zeros(2))
    refused(ResetNeeded, "the world failed the last step", env.step, np.zeros(2))
    refused(TerraInputError, text, venv.step, np.zeros((2, 2)))
    world.where, world.dtype = "context_frames", np.float64
    refused(TerraInputError, "world truth: context_frames \\(frame 0\\) returned a float64 frame", env.reset, seed=0)
    assert env.drive is None
    world.where = None
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and env.observation_space.contains(env.step(np.zeros(2))[0])


def test_vector_steps_are_all_or_nothing():
    venv = DriveVectorEnv(num_envs=3, **SMALL, num_steps=4)
    refused(ResetNeeded, "call reset\\(\\) before step\\(\\)", venv.step, np.zeros((3, 2)))
    for seed, text in [([0, 1], "lists 2 seeds for 3 envs"), ([0, 1, -2], "seed"), (-1, "seed"), ("0", "seed")]:
        refused(TerraInputError, text, venv.reset, seed=seed)
    venv.reset(seed=[0, 1, None])
    venv.step(np.zeros((3, 2)))
    before = [(d.steps, d.vehicle.pose) for d in venv.drives]
    bad_batches = [(np.zeros((2, 2)), "step\\(\\) got 2 actions for 3 envs"), ({"a": 1}, "no batch of actions"),
                   (np.array([[0, 0], [0, 0], [np.nan, 0]]), "action 2 is no actuation action: .*NaN"),
                   ([[0, 0], [0, 0], [0, 0, 0]], "action 2 is no actuation action")]
    for actions, text in bad_batches:
        refused(InvalidAction, text, venv.step, actions)
        assert all(d.steps == s and np.array_equal(d.vehicle.pose, p) for d, (s, p) in zip(venv.drives, before))
    rewards = venv.step(np.zeros((3, 2)))[1]
    assert [d.steps for d in venv.drives] == [2, 2, 2] and np.all(rewards > 0)


def test_a_vector_step_the_world_failed_needs_reset():
    venv = DriveVectorEnv(FailingWorld(SIZE), synthetic_scenarios(1, 0, SIZE), num_envs=2, num_steps=5)
    venv.reset(seed=0)
    venv._drives.world.fail = True
    refused(RuntimeError, "renderer died", venv.step, np.zeros((2, 2)))
    refused(ResetNeeded, "the world failed the last step", venv.step, np.zeros((2, 2)))
    venv._drives.world.fail = False
    venv.reset(seed=0)
    assert np.all(venv.step(np.zeros((2, 2)))[1] > 0)

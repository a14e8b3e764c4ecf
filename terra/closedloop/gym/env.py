"""The loop as ``gymnasium`` envs: :class:`DriveEnv` and :class:`DriveVectorEnv`, registered as :data:`ENV_ID`.

``gymnasium.make("terra/Drive-v0")``; ``world="truth"`` or a caller's World; ``terminated`` when the car leaves the road
or hits a parked car, ``truncated`` after ``num_steps`` or when it leaves the scene. Bad calls raise in one line.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence as SequenceABC
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.error import ClosedEnvironmentError, InvalidAction, ResetNeeded
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from terra.closedloop.car.motion import VEHICLES
from terra.closedloop.car.motion import Actuation
from terra.closedloop.gym.spaces import (ACTION_MODES, REWARDS, action_space, checked_frame, observation,
                                         observation_space, read_action, reward_of)
from terra.closedloop.loop import Drive, DriveSpec, close_drives, start_drive
from terra.closedloop.outcomes.truth import truth_metrics
from terra.closedloop.plans import Plan
from terra.closedloop.recording.config import DriveRunConfig
from terra.closedloop.scenarios import Scenario, check_scenario, synthetic_scenarios
from terra.closedloop.worlds import TRUTH, TrueWorld, WORLD_METHODS, World
from terra.config.checks import MAX_SEED, check_choice, check_whole_number, shown
from terra.config.schema import schema_settings
from terra.core.errors import TerraInputError


RESET_OPTIONS = ("scenario",)  # what reset(options=...) takes
IMAGE_SIZE = (72, 128)  # the synthetic scenarios' frames (height, width) when none are given
MAX_PIXELS = 4096  # largest image_size side
SETTINGS = schema_settings(DriveRunConfig)  # terra-drive's, checked alike
KEPT_SCENARIOS = 64  # synthetic scenarios an env keeps built (each is built again when asked for after)


class _StepPolicy:
    """The env's stand-in policy: the action comes from ``step``."""

    name = "gym"

    def reset(self, scenario) -> None:
        pass

    def close(self) -> None:
        pass


class SyntheticScenarios(SequenceABC):
    """``count`` synthetic scenarios drawn with ``seed`` at ``size``, each built lazily on first reset."""

    def __init__(self, count: int, seed: int, size: tuple[int, int]) -> None:
        self.count = count
        self._built = functools.lru_cache(maxsize=KEPT_SCENARIOS)(
            lambda index: synthetic_scenarios(count, seed, size, indices=[index])[0])

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Scenario:
        if not -self.count <= index < self.count:
            raise IndexError(index)
        return self._built(index % self.count)


def env_scenarios(world: Any, scenarios: Any, num_scenarios: int, scenario_seed: int,
                  image_size: Sequence[int]) -> tuple[World, Sequence[Scenario], tuple[int, int]]:
    """The world, the scenarios an env drives and their frames' size, checked now."""
    if isinstance(world, str):
        if world != TRUTH:
            raise TerraInputError(f"world={world!r}: the env builds only the true world ('{TRUTH}'); pass a World "
                                  "for any other, e.g. ModelWorld(pipeline) for the world model")
    else:
        missing = [name for name in WORLD_METHODS if not callable(getattr(world, name, None))]
        if missing:
            raise TerraInputError(f"world: a {type(world).__name__} is not a World (no callable {', '.join(missing)});"
                                  f" pass world='{TRUTH}' or a World such as ModelWorld(pipeline)")
    if scenarios is None:
        if not isinstance(image_size, (list, tuple)) or len(image_size) != 2:
            raise TerraInputError(f"image_size must be (height, width), e.g. image_size={IMAGE_SIZE} (got "
                                  f"{image_size!r})")
        size = tuple(check_whole_number(n, "image_size", 8, f"image_size={IMAGE_SIZE}", MAX_PIXELS) for n in image_size)
        scenarios = SyntheticScenarios(SETTINGS["num_scenarios"].check(num_scenarios),
                                       SETTINGS["scenario_seed"].check(scenario_seed), size)
    else:
        scenarios = user_scenarios(scenarios)
        size = tuple(scenarios[0].images.shape[1:3])
    return (TrueWorld(size) if isinstance(world, str) else world), scenarios, size


def user_scenarios(scenarios: Any) -> list[Scenario]:
    """The caller's ``scenarios``."""
    if isinstance(scenarios, (str, bytes, Scenario)) or not isinstance(scenarios, SequenceABC):
        raise TerraInputError(f"scenarios must be a list of Scenario (got a {type(scenarios).__name__}); or leave it "
                              "None for num_scenarios synthetic ones")
    if not scenarios:
        raise TerraInputError("a driving env needs at least one scenario")
    for i, scenario in enumerate(scenarios):
        if not isinstance(scenario, Scenario):
            raise TerraInputError(f"scenarios[{i}] is a {type(scenario).__name__}, not a Scenario (terra/closedloop/"
                                  "scenarios.py: synthetic_scenarios, log_scenarios)")
        check_scenario(scenario, f"scenarios[{i}]")  # every field, once
        images = scenario.images
        if images.shape[1:3] != scenarios[0].images.shape[1:3]:
            raise TerraInputError(f"scenarios[{i}] ({scenario.id}) has {images.shape[1]}x{images.shape[2]} frames, "
                                  f"scenarios[0] {scenarios[0].images.shape[1]}x{scenarios[0].images.shape[2]}; an "
                                  "env's frames have one size")
    return list(scenarios)


class EnvDrives:
    """What both envs share: their settings checked, opening a drive on a scenario, stepping drives with actions."""

    def __init__(self, world: World | str, scenarios: Sequence[Scenario] | None, num_steps: int, vehicle: str,
                 action_mode: str, reward: str, num_scenarios: int, scenario_seed: int,
                 image_size: Sequence[int]) -> None:
        self.num_steps = SETTINGS["num_steps"].check(num_steps)
        self.vehicle = check_choice(vehicle, "vehicle", VEHICLES)
        self.action_mode = check_choice(action_mode, "action_mode", ACTION_MODES)
        self.reward = check_choice(reward, "reward", REWARDS)
        if self.action_mode == "actuation" and self.vehicle != "bicycle":
            raise TerraInputError(f"action_mode='actuation' steers the bicycle vehicle; vehicle={vehicle!r} follows "
                                  "plans only: set vehicle='bicycle' or action_mode='plan'")
        self.world, self.scenarios, self.size = env_scenarios(world, scenarios, num_scenarios, scenario_seed,
                                                              image_size)
        if self.reward == "lane_keeping" and isinstance(self.scenarios, list) \
                and any(s.scene is None for s in self.scenarios):
            raise TerraInputError("reward='lane_keeping' needs synthetic scenarios (their scene knows the lane); "
                                  "use reward='progress' on others")
        self.observation_space = observation_space(*self.size)
        self.action_space = action_space(self.action_mode)

    def scenario_index(self, options: Any) -> int | None:
        """The scenario ``reset(options=...)`` asks for (None: drawn with the seed), checked."""
        if options is None:
            return None
        if not isinstance(options, dict):
            raise TerraInputError(f"reset options must be a dict such as {{'scenario': 0}} (got "
                                  f"{type(options).__name__})")
        unknown = sorted(str(key) for key in options if key not in RESET_OPTIONS)
        if unknown:
            raise TerraInputError(f"unknown reset option(s) {unknown}; the env takes {list(RESET_OPTIONS)}")
        index = options.get("scenario")
        if index is None:
            return None
        return check_whole_number(index, "reset option 'scenario'", 0, "options={'scenario': 0}",
                                  len(self.scenarios) - 1)

    def open(self, rng: np.random.Generator, index: int | None) -> Drive:
        index = int(rng.integers(len(self.scenarios))) if index is None else index
        spec = DriveSpec(self.scenarios[index], "gym", _StepPolicy, seed=int(rng.integers(2**31)))
        drive = start_drive(self.world, spec, self.num_steps, vehicle=self.vehicle)
        if not drive.ok:
            raise TerraInputError(f"scenario {spec.scenario.id} cannot be driven: {drive.error}")
        try:
            for k, frame in enumerate(drive.frames):
                checked_frame(frame, self.size, drive.world, f"context_frames (frame {k})")
        except TerraInputError:
            close_drives(self.world, [drive])
            raise
        return drive

    def step(self, drives: list[Drive], commands: Sequence[tuple[Plan | Actuation, np.ndarray]]) -> list[tuple]:
        """Step ``drives`` by their checked ``commands`` (``read_action``); each one's reward, ends and info."""
        for drive, (plan, action) in zip(drives, commands):
            drive.command(plan, action)
        frames = self.world.step([d.handle for d in drives], [d.actions[-1] for d in drives],
                                 [d.reached() for d in drives])
        out = []
        for drive, frame in zip(drives, frames):
            if isinstance(frame, BaseException):
                raise frame
            before = drive.poses[-1]
            drive.advance(checked_frame(frame, self.size, drive.world, "step"))
            info: dict[str, Any] = {"pose": drive.poses[-1].copy()}
            scene, truth, terminated = drive.spec.scenario.scene, None, False
            if scene is not None:
                truth = truth_metrics(scene, drive.world_poses()[-2:])
                info["lane_offset_m"] = truth["mean_abs_lane_offset_m"]
                terminated = truth["off_road"] or truth["collision"]
                if terminated:
                    info["ended"] = "the car hit a parked car" if truth["collision"] else "the car left the road"
            left = drive.spec.scenario.left_scene(drive.reached())
            if left is not None and not terminated:
                info["ended"] = left
            reward = reward_of(self.reward, before, drive.poses[-1], truth)
            out.append((reward, bool(terminated), drive.steps >= self.num_steps or left is not None, info))
        return out


ENV_ID = "terra/Drive-v0"  # gymnasium's id of both envs (the vector env: its vector_entry_point)
RENDER_MODES = ("rgb_array", None)


class DriveEnv(gym.Env):
    """One drive at a time."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, world: World | str = TRUTH, scenarios: Sequence[Scenario] | None = None, num_steps: int = 20,
                 render_mode: str | None = "rgb_array", vehicle: str = "bicycle", action_mode: str = "actuation",
                 reward: str = "progress", num_scenarios: int = 4, scenario_seed: int = 0,
                 image_size: Sequence[int] = IMAGE_SIZE) -> None:
        self.render_mode = check_render_mode(render_mode)
        self._drives = EnvDrives(world, scenarios, num_steps, vehicle, action_mode, reward, num_scenarios,
                                 scenario_seed, image_size)
        self.observation_space, self.action_space = self._drives.observation_space, self._drives.action_space
        self.drive: Drive | None = None
        self._needs_reset: str | None = "no drive yet"  # why step() needs reset() first (None: it does not)
        self.closed = False

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        refuse_closed(self.closed, "reset")
        index = self._drives.scenario_index(options)
        super().reset(seed=seed)
        self._end_drive()
        self.drive = self._drives.open(self.np_random, index)
        self._needs_reset = None
        return observation(self.drive), {"scenario": self.drive.spec.scenario.id}

    def step(self, action):
        refuse_closed(self.closed, "step", self._needs_reset)
        command = read_action(self._drives.action_mode, self.drive, action)
        self._needs_reset = "the world failed the last step"  # until the step is whole
        [(reward, terminated, truncated, info)] = self._drives.step([self.drive], [command])
        self._needs_reset = "the drive ended (terminated or truncated)" if terminated or truncated else None
        return observation(self.drive), reward, terminated, truncated, info

    def render(self) -> np.ndarray | None:
        return None if self.drive is None or self.render_mode is None else np.array(self.drive.frames[-1])

    def close(self) -> None:
        """End the drive; the env takes no step or reset after it (closing again is harmless)."""
        self._end_drive()
        self.closed = True

    def _end_drive(self) -> None:
        if self.drive is not None:
            close_drives(self._drives.world, [self.drive])
            self.drive = None


class DriveVectorEnv(VectorEnv):
    """``num_envs`` drives stepped together in one world; a drive that ends is reset on its next step."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10, "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, world: World | str = TRUTH, scenarios: Sequence[Scenario] | None = None, num_envs: int = 1,
                 num_steps: int = 20, render_mode: str | None = "rgb_array", vehicle: str = "bicycle",
                 action_mode: str = "actuation", reward: str = "progress", num_scenarios: int = 4,
                 scenario_seed: int = 0, image_size: Sequence[int] = IMAGE_SIZE) -> None:
        self.num_envs = check_whole_number(num_envs, "num_envs", 1, "num_envs=4", 4096)
        self.render_mode = check_render_mode(render_mode)
        self._drives = EnvDrives(world, scenarios, num_steps, vehicle, action_mode, reward, num_scenarios,
                                 scenario_seed, image_size)
        self.single_observation_space = self._drives.observation_space
        self.single_action_space = self._drives.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.drives: list[Drive | None] = [None] * self.num_envs
        self._ended = np.zeros(self.num_envs, dtype=bool)
        self._rngs: list[np.random.Generator] = []
        self._needs_reset: str | None = "no drives yet"

    def _batch(self, observations: list[dict]) -> dict:
        return concatenate(self.single_observation_space, observations,
                           create_empty_array(self.single_observation_space, self.num_envs))

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict | None = None):
        refuse_closed(self.closed, "reset")
        if isinstance(seed, (list, tuple)):
            if len(seed) != self.num_envs:
                raise TerraInputError(f"reset(seed=...) lists {len(seed)} seeds for {self.num_envs} envs; give one "
                                      "per env, or one seed (env i then takes seed + i)")
            seeds = [None if s is None else check_whole_number(s, "seed", 0, "seed=0", MAX_SEED) for s in seed]
        else:
            first = None if seed is None else check_whole_number(seed, "seed", 0, "seed=0", MAX_SEED - self.num_envs)
            seeds = [None if first is None else first + i for i in range(self.num_envs)]
        index = self._drives.scenario_index(options)
        self._rngs = [np.random.default_rng(s) for s in seeds]
        for i in range(self.num_envs):
            self._reopen(i, index)
        self._ended[:] = False
        self._needs_reset = None
        return self._batch([observation(d) for d in self.drives]), {}

    def _reopen(self, i: int, index: int | None = None) -> None:
        if self.drives[i] is not None:
            close_drives(self._drives.world, [self.drives[i]])
        self.drives[i] = self._drives.open(self._rngs[i], index)

    def step(self, actions):
        refuse_closed(self.closed, "step", self._needs_reset)
        count = None if isinstance(actions, (str, bytes, dict)) or not hasattr(actions, "__len__") else len(actions)
        if count != self.num_envs:
            raise InvalidAction(f"step() got {'no batch of' if count is None else count} actions for {self.num_envs} "
                                "envs; give one action per env")
        going = [i for i in range(self.num_envs) if not self._ended[i]]
        # all checked before any moves
        commands = [read_action(self._drives.action_mode, self.drives[i], actions[i], f"action {i}") for i in going]
        rewards = np.zeros(self.num_envs)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        self._needs_reset = "the world failed the last step"  # until the step is whole
        for i in np.flatnonzero(self._ended):
            self._reopen(int(i))
        outcomes = self._drives.step([self.drives[i] for i in going], commands) if going else []
        for i, (reward, term, trunc, _) in zip(going, outcomes):
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
        self._ended = terminated | truncated
        self._needs_reset = None
        return self._batch([observation(d) for d in self.drives]), rewards, terminated, truncated, {}

    def render(self) -> tuple[np.ndarray, ...] | None:
        if self.render_mode is None:
            return None
        return tuple(np.array(d.frames[-1]) for d in self.drives if d is not None)  # copies: the records stay

    def close_extras(self, **kwargs: Any) -> None:
        close_drives(self._drives.world, [d for d in self.drives if d is not None])
        self.drives = [None] * self.num_envs


def check_render_mode(render_mode: Any) -> str | None:
    if render_mode not in RENDER_MODES:
        raise TerraInputError(f"render_mode must be 'rgb_array' or None (got {shown(render_mode)})")
    return render_mode


def refuse_closed(closed: bool, call: str, needs_reset: str | None = None) -> None:
    """``ClosedEnvironmentError`` for a ``call`` on a closed env, ``ResetNeeded`` while ``needs_reset`` says why."""
    if closed:
        raise ClosedEnvironmentError(f"{call}() on a closed env: make a new one (gymnasium.make) after close()")
    if needs_reset is not None:
        raise ResetNeeded(f"call reset() before step(): {needs_reset}")


if ENV_ID not in gym.registry:  # gymnasium's registry: make() and make_vec() find the envs by id
    gym.register(ENV_ID, entry_point="terra.closedloop.gym.env:DriveEnv",
                 vector_entry_point="terra.closedloop.gym.env:DriveVectorEnv")

"""What both gymnasium envs share: settings, the world and scenarios, opening and stepping drives."""

from __future__ import annotations

import functools
from collections.abc import Sequence as SequenceABC
from typing import Any, Sequence

import numpy as np

from terra.closedloop.gym.spaces import (
    ACTION_MODES,
    REWARDS,
    action_space,
    checked_frame,
    read_action,
    observation_space,
    reward_of,
)
from terra.closedloop.loop import Drive, DriveSpec, close_drive, start_drive
from terra.closedloop.car.motion import VEHICLES
from terra.closedloop.plans import Plan
from terra.closedloop.scenarios import Scenario, check_scenario, synthetic_scenarios
from terra.closedloop.car.tracking import Actuation
from terra.closedloop.outcomes.truth import truth_metrics
from terra.closedloop.recording.settings import SETTINGS
from terra.closedloop.worlds import TRUTH, WORLD_METHODS, TrueWorld, World
from terra.config.checks import check_choice, check_whole_number
from terra.core.errors import TerraInputError

RESET_OPTIONS = ("scenario",)  # what reset(options=...) takes
IMAGE_SIZE = (72, 128)  # the synthetic scenarios' frames (height, width) when none are given
MAX_PIXELS = 4096  # largest image_size side
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
        self.count, self.seed, self.size = count, seed, size
        self._built = functools.lru_cache(maxsize=KEPT_SCENARIOS)(self._build)

    def _build(self, index: int) -> Scenario:
        return synthetic_scenarios(self.count, self.seed, self.size, indices=[index])[0]

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):  # a slice builds every scenario in it
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
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
        size = image_size if isinstance(image_size, (list, tuple)) else None
        if size is None or len(size) != 2:
            raise TerraInputError(f"image_size must be (height, width), e.g. image_size={IMAGE_SIZE} (got "
                                  f"{image_size!r})")
        size = tuple(check_whole_number(n, "image_size", 8, f"image_size={IMAGE_SIZE}", MAX_PIXELS) for n in size)
        scenarios = SyntheticScenarios(SETTINGS["num_scenarios"].check(num_scenarios, "num_scenarios"),
                                       SETTINGS["scenario_seed"].check(scenario_seed, "scenario_seed"), size)
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
        self.num_steps = SETTINGS["num_steps"].check(num_steps, "num_steps")
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
            close_drive(self.world, drive)
            raise
        return drive

    def command(self, drive: Drive, action: Any, where: str = "action") -> tuple[Plan | Actuation, np.ndarray]:
        """A step's ``action`` checked (spaces ``read_action``); the car does not move yet."""
        return read_action(self.action_mode, drive, action, where)

    def step(self, drives: list[Drive], commands: Sequence[tuple[Plan | Actuation, np.ndarray]]) -> list[tuple]:
        """Step ``drives`` by their checked ``commands`` (:meth:`command`); each one's reward, ends and info."""
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

"""The loop as a ``gymnasium`` environment: :class:`DriveEnv` (one drive) and :class:`DriveVectorEnv` (many drives
stepped together on one world, so a world model's engine batches them).

* ``reset(seed, options)``: a scenario (``options={"scenario": i}``, else drawn with the seed) opened in the world,
  the world model's sampling seeded from ``seed``;
* ``step(plan)``: the action space is NAVSIM's trajectory, 8 poses ``(x, y, heading)`` at 0.5 s in the ego frame
  (any form :func:`~terra.closedloop.plans.as_plan` reads is taken too); it goes to the drive's vehicle as in the
  loop (terra/closedloop/loop.py; ``vehicle``: terra/closedloop/motion.py), which moves the car and forecasts the
  world model's action;
* observation: ``{"frame": uint8 [H, W, 3], "ego": [speed m/s, yaw rate rad/s, acceleration m/s^2],
  "command": NAVSIM's one-hot [left, straight, right, unknown]}``;
* reward: metres driven forward in the step (along the previous heading); ``terminated`` when the car leaves the
  road or hits a parked car (synthetic scenarios: terra/closedloop/truth.py), ``truncated`` after ``num_steps``;
  ``info`` holds the pose and, in the synthetic world, the lane offset;
* ``render()``: the newest frame (``render_mode="rgb_array"``).

Bad calls are refused as gymnasium's own envs refuse them, in one line, before anything changes: an action that is
no plan raises ``gymnasium.error.InvalidAction``, ``step()`` before ``reset()`` or after the drive ended
(terminated or truncated) ``gymnasium.error.ResetNeeded``, a bad scenario index, reset option, seed list or
``num_steps`` / ``num_envs`` a :class:`~terra.core.errors.TerraInputError` (a ``ValueError``). The vector env
checks every action of a step before it moves any drive: a refused step changes no env.
"""

from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.error import InvalidAction, ResetNeeded
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from terra.closedloop.loop import Drive, DriveSpec, close_drive, start_drive
from terra.closedloop.motion import VEHICLES
from terra.closedloop.plans import NAVSIM_POSES, Plan, as_plan
from terra.closedloop.scenarios import Scenario
from terra.closedloop.truth import truth_metrics
from terra.closedloop.worlds import World
from terra.config.checks import MAX_FRAMES, MAX_SEED, check_choice, check_whole_number
from terra.core.errors import TerraInputError, error_line
from terra.inputs.ego_motion import to_ego

# Plans a random sample of the action space gives stay within a car's reach (100 m/s between samples).
PLAN_LOW = np.tile(np.array([0.0, -10.0, -np.pi], dtype=np.float32), (NAVSIM_POSES, 1))
PLAN_HIGH = np.tile(np.array([30.0, 10.0, np.pi], dtype=np.float32), (NAVSIM_POSES, 1))
# Largest speed (m/s), |yaw rate| (rad/s) and |acceleration| (m/s^2) between two frames any plan can command.
EGO_LIMIT = np.array([100.0, 100.0, 2000.0], dtype=np.float32)
RESET_OPTIONS = ("scenario",)  # what reset(options=...) takes


class _Driver:
    """The env's stand-in policy: the plan comes from ``step``."""

    name = "gym"

    def reset(self, scenario) -> None:
        pass

    def close(self) -> None:
        pass


def _spaces(height: int, width: int) -> tuple[spaces.Dict, spaces.Box]:
    observation = spaces.Dict({
        "frame": spaces.Box(0, 255, (height, width, 3), np.uint8),
        "ego": spaces.Box(np.array([0.0, -EGO_LIMIT[1], -EGO_LIMIT[2]], np.float32), EGO_LIMIT),
        "command": spaces.Box(0, 1, (4,), np.int64),
    })
    return observation, spaces.Box(PLAN_LOW, PLAN_HIGH, dtype=np.float32)


def _observation(drive: Drive) -> dict[str, np.ndarray]:
    obs = drive.observation(1)
    return {"frame": np.array(obs.frame, dtype=np.uint8),  # a copy: users keep what they are given
            "ego": np.array([obs.ego.speed_mps, obs.ego.yaw_rate, obs.ego.accel_mps2], dtype=np.float32),
            "command": obs.ego.command_one_hot()}


class _Drives:
    """What both envs share: opening a drive on a scenario, stepping drives with plans, their outcome."""

    def __init__(self, world: World, scenarios: Sequence[Scenario], num_steps: int, vehicle: str) -> None:
        if not scenarios:
            raise TerraInputError("a driving env needs at least one scenario")
        self.world, self.scenarios = world, list(scenarios)
        self.num_steps = check_whole_number(num_steps, "num_steps", 1, "num_steps=20", MAX_FRAMES)
        self.vehicle = check_choice(vehicle, "vehicle", VEHICLES)
        self.size = scenarios[0].images.shape[1:3]

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
        spec = DriveSpec(self.scenarios[index], "gym", _Driver, seed=int(rng.integers(2**31)))
        drive = start_drive(self.world, spec, self.num_steps, vehicle=self.vehicle)
        if not drive.ok:
            raise TerraInputError(f"scenario {spec.scenario.id} cannot be driven: {drive.error}")
        return drive

    @staticmethod
    def command(drive: Drive, action: Any, where: str = "action") -> tuple[Plan, np.ndarray]:
        """A step's ``action`` as a plan and the world model's action for ``drive`` (its vehicle's forecast; the car
        does not move yet), or ``InvalidAction`` in one line."""
        try:
            plan = as_plan(np.asarray(action, dtype=np.float64) if isinstance(action, np.ndarray) else action)
            return plan, drive.action_for(plan)
        except (TerraInputError, TypeError, ValueError) as err:
            raise InvalidAction(f"{where} is no plan: {error_line(err)}; give {NAVSIM_POSES} poses (x, y, heading) "
                                "at 0.5 s in the ego frame, as the action space says") from None

    def step(self, drives: list[Drive], commands: Sequence[tuple[Plan, np.ndarray]]) -> list[tuple]:
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
            drive.advance(frame)
            after = drive.poses[-1]
            reward = float(to_ego(after[:2], before)[0])  # metres forward along the previous heading
            info: dict[str, Any] = {"pose": after.copy()}
            terminated = False
            scene = drive.spec.scenario.scene
            if scene is not None:
                truth = truth_metrics(scene, drive.world_poses()[-2:])
                info["lane_offset_m"] = truth["mean_abs_lane_offset_m"]
                terminated = truth["off_road"] or truth["collision"]
            out.append((reward, bool(terminated), drive.steps >= self.num_steps, info))
        return out


class DriveEnv(gym.Env):
    """One drive at a time in ``world`` over ``scenarios``, the car a ``vehicle`` (see the module docstring)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, world: World, scenarios: Sequence[Scenario], num_steps: int = 20,
                 render_mode: str | None = "rgb_array", vehicle: str = "bicycle") -> None:
        self._drives = _Drives(world, scenarios, num_steps, vehicle)
        self.observation_space, self.action_space = _spaces(*self._drives.size)
        self.render_mode = render_mode
        self.drive: Drive | None = None
        self._ended = False  # the drive terminated or was truncated: step() needs reset()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        index = self._drives.scenario_index(options)
        super().reset(seed=seed)
        self.close()
        self.drive, self._ended = self._drives.open(self.np_random, index), False
        return _observation(self.drive), {"scenario": self.drive.spec.scenario.id}

    def step(self, action):
        if self.drive is None or self._ended:
            raise ResetNeeded("call reset() before step(): " + ("the drive ended (terminated or truncated)"
                                                                  if self._ended else "no drive yet"))
        command = self._drives.command(self.drive, action)
        [(reward, terminated, truncated, info)] = self._drives.step([self.drive], [command])
        self._ended = terminated or truncated
        return _observation(self.drive), reward, terminated, truncated, info

    def render(self) -> np.ndarray | None:
        return None if self.drive is None else np.array(self.drive.frames[-1])

    def close(self) -> None:
        if self.drive is not None:
            close_drive(self._drives.world, self.drive)
            self.drive = None


class DriveVectorEnv(VectorEnv):
    """``num_envs`` drives stepped together in one ``world`` (one batched world step per ``step``); a drive that
    ends is reset on its next step (gymnasium's next-step autoreset)."""

    metadata = {"render_modes": ["rgb_array"], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, world: World, scenarios: Sequence[Scenario], num_envs: int, num_steps: int = 20,
                 render_mode: str | None = "rgb_array", vehicle: str = "bicycle") -> None:
        self._drives = _Drives(world, scenarios, num_steps, vehicle)
        self.num_envs = check_whole_number(num_envs, "num_envs", 1, "num_envs=4")
        self.single_observation_space, self.single_action_space = _spaces(*self._drives.size)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.render_mode = render_mode
        self.drives: list[Drive | None] = [None] * self.num_envs
        self._ended = np.zeros(self.num_envs, dtype=bool)
        self._rngs: list[np.random.Generator] = []

    def _batch(self, observations: list[dict]) -> dict:
        return concatenate(self.single_observation_space, observations,
                           create_empty_array(self.single_observation_space, self.num_envs))

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict | None = None):
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
        return self._batch([_observation(d) for d in self.drives]), {}

    def _reopen(self, i: int, index: int | None = None) -> None:
        if self.drives[i] is not None:
            close_drive(self._drives.world, self.drives[i])
        self.drives[i] = self._drives.open(self._rngs[i], index)

    def step(self, actions):
        if not self._rngs:
            raise ResetNeeded("call reset() before step()")
        count = None if isinstance(actions, (str, bytes, dict)) or not hasattr(actions, "__len__") else len(actions)
        if count != self.num_envs:
            raise InvalidAction(f"step() got {'no batch of' if count is None else count} actions for {self.num_envs} "
                                "envs; give one plan per env")
        going = [i for i in range(self.num_envs) if not self._ended[i]]
        # all checked before any moves
        commands = [self._drives.command(self.drives[i], actions[i], f"action {i}") for i in going]
        rewards = np.zeros(self.num_envs)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        for i in np.flatnonzero(self._ended):
            self._reopen(int(i))
        outcomes = self._drives.step([self.drives[i] for i in going], commands) if going else []
        for i, (reward, term, trunc, _) in zip(going, outcomes):
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
        self._ended = terminated | truncated
        return self._batch([_observation(d) for d in self.drives]), rewards, terminated, truncated, {}

    def render(self) -> tuple[np.ndarray, ...] | None:
        return tuple(np.asarray(d.frames[-1]) for d in self.drives if d is not None)

    def close_extras(self, **kwargs: Any) -> None:
        for i, drive in enumerate(self.drives):
            if drive is not None:
                close_drive(self._drives.world, drive)
                self.drives[i] = None

"""The loop as ``gymnasium`` envs: :class:`DriveEnv` and :class:`DriveVectorEnv`, registered as :data:`ENV_ID`.

``gymnasium.make("terra/Drive-v0")``; ``world="truth"`` or a caller's World; ``terminated`` when the car leaves the road
or hits a parked car, ``truncated`` after ``num_steps`` or when it leaves the scene. Bad calls raise in one line.
"""

from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.error import ClosedEnvironmentError, InvalidAction, ResetNeeded
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from terra.closedloop.gym.drives import IMAGE_SIZE, EnvDrives
from terra.closedloop.gym.spaces import observation
from terra.closedloop.loop import Drive, close_drive
from terra.closedloop.scenarios import Scenario
from terra.closedloop.worlds import TRUTH, World
from terra.config.checks import MAX_SEED, check_whole_number, shown
from terra.core.errors import TerraInputError

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
        refuse_closed(self.closed, "step")
        if self._needs_reset is not None:
            raise ResetNeeded(f"call reset() before step(): {self._needs_reset}")
        command = self._drives.command(self.drive, action)
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
            close_drive(self._drives.world, self.drive)
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
            close_drive(self._drives.world, self.drives[i])
        self.drives[i] = self._drives.open(self._rngs[i], index)

    def step(self, actions):
        refuse_closed(self.closed, "step")
        if self._needs_reset is not None:
            raise ResetNeeded(f"call reset() before step(): {self._needs_reset}")
        count = None if isinstance(actions, (str, bytes, dict)) or not hasattr(actions, "__len__") else len(actions)
        if count != self.num_envs:
            raise InvalidAction(f"step() got {'no batch of' if count is None else count} actions for {self.num_envs} "
                                "envs; give one action per env")
        going = [i for i in range(self.num_envs) if not self._ended[i]]
        # all checked before any moves
        commands = [self._drives.command(self.drives[i], actions[i], f"action {i}") for i in going]
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
        for i, drive in enumerate(self.drives):
            if drive is not None:
                close_drive(self._drives.world, drive)
                self.drives[i] = None


def check_render_mode(render_mode: Any) -> str | None:
    if render_mode not in RENDER_MODES:
        raise TerraInputError(f"render_mode must be 'rgb_array' or None (got {shown(render_mode)})")
    return render_mode


def refuse_closed(closed: bool, call: str) -> None:
    """``ClosedEnvironmentError`` in one line for a ``call`` on a closed env."""
    if closed:
        raise ClosedEnvironmentError(f"{call}() on a closed env: make a new one (gymnasium.make) after close()")


if ENV_ID not in gym.registry:  # gymnasium's registry: make() and make_vec() find the envs by id
    gym.register(ENV_ID, entry_point="terra.closedloop.gym.env:DriveEnv",
                 vector_entry_point="terra.closedloop.gym.env:DriveVectorEnv")

"""A NAVSIM agent class drives through the adapter: it gets NAVSIM's AgentInput (ego statuses 0.5 s apart, the
front camera's frame) and its Trajectory (8 poses at 0.5 s) becomes the plan."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from terra.closedloop.loop import DriveSpec, run_drives
from terra.closedloop.navsim import NavsimPolicy
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.worlds import TrueWorld

SIZE = (72, 128)


@dataclass(frozen=True)
class TrajectorySampling:  # nuplan's, as NAVSIM agents hold it
    time_horizon: float = 4.0
    interval_length: float = 0.5

    @property
    def num_poses(self) -> int:
        return int(self.time_horizon / self.interval_length)


@dataclass
class Trajectory:  # navsim.common.dataclasses.Trajectory
    poses: np.ndarray
    trajectory_sampling: TrajectorySampling = TrajectorySampling()


class ConstantVelocityAgent:
    """NAVSIM's constant-velocity baseline, written against NAVSIM's interface only."""

    def __init__(self):
        self._trajectory_sampling = TrajectorySampling()
        self.inputs = []
        self.initialized = 0

    def name(self) -> str:
        return "ConstantVelocityAgent"

    def initialize(self) -> None:
        self.initialized += 1

    def compute_trajectory(self, agent_input) -> Trajectory:
        self.inputs.append(agent_input)
        speed = float((agent_input.ego_statuses[-1].ego_velocity ** 2).sum() ** 0.5)
        n, dt = self._trajectory_sampling.num_poses, self._trajectory_sampling.interval_length
        poses = np.array([[(i + 1) * dt * speed, 0.0, 0.0] for i in range(n)], dtype=np.float32)
        return Trajectory(poses, self._trajectory_sampling)


def test_a_navsim_agent_drives_with_its_own_class():
    scenario = synthetic_scenarios(1, 4, SIZE)[0]
    agent = ConstantVelocityAgent()
    [drive] = run_drives(TrueWorld(SIZE), [DriveSpec(scenario, "navsim_cv", lambda: NavsimPolicy(agent))], 17)
    assert drive.ok and drive.steps == 17 and agent.initialized == 1
    speed = scenario.speed_kmh / 3.6
    np.testing.assert_allclose(drive.speeds, speed, rtol=1e-3)  # constant velocity, as planned
    last = agent.inputs[-1]
    assert len(last.ego_statuses) == 4 and len(last.cameras) == 4 and len(last.lidars) == 4
    np.testing.assert_array_equal(last.cameras[-1].cam_f0.image, drive.frames[-2])  # the newest frame it saw
    assert last.cameras[-1].cam_l0.image is None and last.cameras[-1].cam_f0.intrinsics.shape == (3, 3)
    poses = np.array([s.ego_pose for s in last.ego_statuses])
    np.testing.assert_allclose(poses[-1], 0.0, atol=1e-6)
    np.testing.assert_allclose(poses[:, 0], [-1.5 * speed, -1.0 * speed, -0.5 * speed, 0.0], atol=1e-3)
    assert list(last.ego_statuses[-1].driving_command) in ([0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0])
    assert drive.plans[0].times.tolist() == pytest.approx([0.5 * (i + 1) for i in range(8)])

"""A NAVSIM agent class drives through the adapter: it gets NAVSIM's AgentInput (ego statuses 0.5 s apart, the
front camera's frame where its sensor config asks for it) and its Trajectory (8 poses at 0.5 s) becomes the plan;
terra-drive builds it with its navsim_args (a trajectory sampling, _target_ nodes, checkpoints) as NAVSIM does."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from terra.closedloop.study.drives import terra_drive as run_drive_settings
from terra.closedloop.loop import DriveSpec, run_drives
from terra.closedloop.policies.navsim import NavsimPolicy, TrajectorySampling as TrajectorySamplingOfTerra
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.worlds import TrueWorld
from terra.core.errors import TerraInputError
from tests.closedloop.conftest import drive_settings_of

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


# ---------------------------------------------------------------- built from terra-drive's settings as NAVSIM does


@dataclass
class SensorConfig:  # navsim.common.dataclasses.SensorConfig
    cam_f0: object = False
    cam_l0: object = False
    cam_l1: object = False
    cam_l2: object = False
    cam_r0: object = False
    cam_r1: object = False
    cam_r2: object = False
    cam_b0: object = False
    lidar_pc: object = False


@dataclass(frozen=True)
class AgentConfig:  # a config dataclass, as TransfuserConfig is (built from a _target_ node)
    speed_mps: float = 5.0


class SampledAgent:
    """A NAVSIM agent whose constructor needs a trajectory sampling, a config and a checkpoint, reading cam_f0 at
    the frame now only (history index 3 of 4), as TransFuser does."""

    requires_scene = False
    built: list = []

    def __init__(self, trajectory_sampling, config: AgentConfig, checkpoint_path: str, front=(3,)):
        self._trajectory_sampling, self.config, self.checkpoint_path = trajectory_sampling, config, checkpoint_path
        self.front, self.inputs = list(front), []
        SampledAgent.built.append(self)

    def initialize(self) -> None:
        pass

    def get_sensor_config(self):
        return SensorConfig(cam_f0=self.front)

    def compute_trajectory(self, agent_input):
        self.inputs.append(agent_input)
        sampling = self._trajectory_sampling
        times = sampling.interval_length * np.arange(1, sampling.num_poses + 1)
        poses = np.c_[self.config.speed_mps * times, np.zeros((len(times), 2))].astype(np.float32)
        return Trajectory(poses, sampling)


def test_an_agent_is_built_with_its_navsim_args_and_gets_what_its_sensor_config_asks(tmp_path):
    SampledAgent.built.clear()
    settings = drive_settings_of(
        tmp_path / "out", "policies=[navsim:tests.closedloop.policies.test_navsim:SampledAgent]", "num_scenarios=1",
        "navsim_args={SampledAgent: {checkpoint_path: /ckpt/agent.pth, trajectory_sampling: {time_horizon: 3, "
        "interval_length: 0.25}, config: {_target_: tests.closedloop.policies.test_navsim.AgentConfig, "
        "speed_mps: 6.0}}}")
    [(name, factory)] = settings.policies.items()
    assert settings.policy_args == {name: {"checkpoint_path": "/ckpt/agent.pth", "trajectory_sampling": {
        "time_horizon": 3, "interval_length": 0.25}, "config": {
            "_target_": "tests.closedloop.policies.test_navsim.AgentConfig", "speed_mps": 6.0}}}
    assert len(SampledAgent.built) == 1  # one agent built and checked at settings time
    scenario = synthetic_scenarios(1, 4, SIZE)[0]
    [drive] = run_drives(TrueWorld(SIZE), [DriveSpec(scenario, name, factory)], 6, vehicle="exact")
    assert drive.ok and drive.steps == 6, drive.error
    agent = SampledAgent.built[-1]
    assert agent.checkpoint_path == "/ckpt/agent.pth" and agent.config == AgentConfig(6.0)
    sampling = agent._trajectory_sampling
    assert (sampling.num_poses, sampling.time_horizon, sampling.interval_length, sampling.step_time) == (12, 3.0, 0.25,
                                                                                                        0.25)
    assert drive.plans[0].times.tolist() == pytest.approx([0.25 * (i + 1) for i in range(12)])
    np.testing.assert_allclose(drive.speeds[1:], 6.0, rtol=1e-3)  # the plan's speed, followed exactly
    last = agent.inputs[-1]  # cam_f0 at the frame now only, as asked; no other camera
    assert [c.cam_f0.image is not None for c in last.cameras] == [False, False, False, True]
    np.testing.assert_array_equal(last.cameras[-1].cam_f0.image, drive.frames[-2])
    assert all(getattr(c, cam).image is None for c in last.cameras for cam in ("cam_l0", "cam_r0", "cam_b0"))


def test_an_agent_that_needs_a_trajectory_sampling_gets_navsims_default(tmp_path):
    SampledAgent.built.clear()
    drive_settings_of(tmp_path / "out", "policies=[navsim:tests.closedloop.policies.test_navsim:SampledAgent]",
                      "+navsim_args.SampledAgent.checkpoint_path=x", "+navsim_args.SampledAgent.config=null",
                      "+navsim_args.SampledAgent.front=[]")
    [agent] = SampledAgent.built
    assert agent._trajectory_sampling == TrajectorySamplingOfTerra(num_poses=8, time_horizon=4.0, interval_length=0.5)
    assert NavsimPolicy(agent).front_frames == frozenset()  # no camera asked: none given
    assert NavsimPolicy(SampledAgent(agent._trajectory_sampling, None, "x", [0, 3])).front_frames == {0, 3}
    with pytest.raises(TerraInputError, match=r"asks for cam_f0 at history frames \[4\], beyond the 4 it is given"):
        NavsimPolicy(SampledAgent(agent._trajectory_sampling, None, "x", [4]))


@pytest.mark.parametrize("given, expected", [
    ({"time_horizon": 4, "interval_length": 0.5}, (8, 4.0, 0.5)),
    ({"num_poses": 10, "interval_length": 0.1}, (10, 1.0, 0.1)),
    ({"num_poses": 6, "time_horizon": 3}, (6, 3.0, 0.5)),
    ({"num_poses": 8, "time_horizon": 4, "interval_length": 0.5}, (8, 4.0, 0.5)),
    ({"time_horizon": 1, "interval_length": 0.3}, "time_horizon=1 s is not num_poses x interval_length (3 x 0.3 s)"),
    ({"num_poses": 8, "time_horizon": 4, "interval_length": 0.25}, "time_horizon=4 s is not num_poses x interval"),
    ({"time_horizon": 4}, "give two of num_poses, time_horizon and interval_length (got {'time_horizon': 4})"),
    ({"num_poses": 0, "time_horizon": 4}, "num_poses must be a whole number of at least 1 (got 0)"),
    ({"time_horizon": -4, "interval_length": 0.5}, "time_horizon must be a number above 0 and at most 3600"),
])
def test_trajectory_sampling_is_nuplans(given, expected):
    if isinstance(expected, str):
        with pytest.raises(TerraInputError, match=re.escape(f"trajectory_sampling: {expected}")):
            TrajectorySamplingOfTerra(**given)
        return
    sampling = TrajectorySamplingOfTerra(**given)
    assert (sampling.num_poses, sampling.time_horizon, sampling.interval_length) == pytest.approx(expected)


def test_a_rerun_with_other_navsim_args_drives_again(tmp_path):
    def run(speed: float) -> str:
        settings = drive_settings_of(
            tmp_path / "out", "policies=[navsim:tests.closedloop.policies.test_navsim:SampledAgent]", "num_scenarios=1",
            "num_steps=2", "progress=false", f"navsim_args={{SampledAgent: {{checkpoint_path: x, config: {{_target_: "
            f"tests.closedloop.policies.test_navsim.AgentConfig, speed_mps: {speed}}}}}}}")
        return run_drive_settings(settings, progress=False).lines[0]  # the run; what it measured follows

    assert "1 drives ok, 0 failed, 0 already complete" in run(5.0)
    assert "0 drives ok, 0 failed, 1 already complete" in run(5.0)  # the same arguments: complete
    assert "1 drives ok, 0 failed, 0 already complete" in run(7.0)  # others: the drive is made again


# ---------------------------------------------------------------- the documented command line, as a user types it

MY_AGENT = '''
from types import SimpleNamespace

import numpy as np


class MyAgent:
    """docs/drive.md's example agent: keeps 5 m/s straight on, built with a checkpoint path."""

    requires_scene = False

    def __init__(self, checkpoint_path):
        self.checkpoint_path = checkpoint_path
        self.sampling = SimpleNamespace(num_poses=8, interval_length=0.5)

    def initialize(self):
        assert self.checkpoint_path == "/ckpt/a.pth", self.checkpoint_path

    def compute_trajectory(self, agent_input):
        times = 0.5 * np.arange(1, 9)
        return SimpleNamespace(poses=np.c_[5.0 * times, np.zeros((8, 2))], trajectory_sampling=self.sampling)
'''


def test_the_documented_navsim_args_command_line_runs(tmp_path):
    """docs/drive.md's ``+navsim_args.CLASS.arg=VALUE`` line, run by terra-drive's own entry point (its check of
    added settings included, which compose() never reaches) on the true world."""
    docs = (Path(__file__).resolve().parents[3] / "docs" / "drive.md").read_text()
    [line] = [line.strip() for line in docs.splitlines() if "+navsim_args." in line and "terra-drive" in line]
    program, *args = shlex.split(line)
    assert program == ".venv/bin/terra-drive" and args[1] == "+navsim_args.MyAgent.checkpoint_path=/ckpt/a.pth"
    (tmp_path / "my_agents").mkdir()
    (tmp_path / "my_agents" / "__init__.py").write_text("")
    (tmp_path / "my_agents" / "agent.py").write_text(MY_AGENT)
    result = subprocess.run([sys.executable, "-m", "terra.apps.drive", *args, "world=truth", "num_scenarios=1",
                             "num_steps=2", "videos=false", "output_dir=out"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert "1 drives ok, 0 failed" in result.stdout, result.stdout

"""User code named on terra-drive's command line (a NAVSIM agent, a world) is found in the working folder, as
``python -m``, uvicorn and pytest find a module there: no ``PYTHONPATH=.`` (terra/closedloop/guard.py,
``working_folder_on_path``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from terra.closedloop.guard import working_folder_on_path
from terra.closedloop.user_world import world_class

TERRA_DRIVE = Path(sys.executable).with_name("terra-drive")  # a console script: its sys.path lacks the working folder
ENV = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "HYDRA_FULL_ERROR")}
ENV.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

SHAKY_CAMERA = '''
import numpy as np
from terra.sim.renderer import render


class ShakyCamera:
    """README's "Your own world": the true frames, the camera 0.3 m to the left of the car."""

    def __init__(self, image_size):
        self.size = image_size

    def open(self, scenario, seed, max_frames):
        return scenario

    def context_frames(self, drive):
        return drive.images

    def step(self, drives, actions, poses):
        return [render(s.scene, (x - 0.3 * np.sin(yaw), y + 0.3 * np.cos(yaw), yaw), *self.size)
                for s, (x, y, yaw) in zip(drives, poses)]

    def close(self, drive):
        pass
'''

MY_AGENT = '''
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TrajectorySampling:  # nuplan's, as NAVSIM agents hold it
    time_horizon: float = 4.0
    interval_length: float = 0.5


@dataclass(frozen=True)
class Trajectory:  # navsim.common.dataclasses.Trajectory's fields
    poses: np.ndarray
    trajectory_sampling: TrajectorySampling = TrajectorySampling()


class MyAgent:
    """A NAVSIM agent that drives straight on at 5 m/s (0.5 s apart, 4 s)."""

    requires_scene = False

    def initialize(self):
        pass

    def compute_trajectory(self, agent_input):
        times = 0.5 * np.arange(1, 9)
        return Trajectory(np.c_[5.0 * times, np.zeros((8, 2))].astype(np.float32))
'''


def test_the_working_folder_goes_first_on_sys_path_once(tmp_path, monkeypatch):
    (tmp_path / "terra_test_world_here.py").write_text(SHAKY_CAMERA)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or os.curdir) != str(tmp_path)])
    monkeypatch.delitem(sys.modules, "terra_test_world_here", raising=False)
    assert world_class("terra_test_world_here:ShakyCamera", "world", 10.0).__name__ == "ShakyCamera"
    assert sys.path[0] == str(tmp_path)
    working_folder_on_path()
    assert sys.path.count(str(tmp_path)) == 1
    monkeypatch.setattr(sys, "path", ["", *sys.path[1:]])  # "" (python -c, a REPL) is the working folder already
    working_folder_on_path()
    assert str(tmp_path) not in sys.path
    sys.modules.pop("terra_test_world_here", None)


@pytest.mark.skipif(not TERRA_DRIVE.exists(), reason="terra-drive is not installed next to this Python")
def test_terra_drive_finds_an_agent_and_a_world_of_the_working_folder(tmp_path):
    (tmp_path / "my_worlds.py").write_text(SHAKY_CAMERA)
    (tmp_path / "my_agents").mkdir()
    (tmp_path / "my_agents" / "__init__.py").write_text("")
    (tmp_path / "my_agents" / "agent.py").write_text(MY_AGENT)
    result = subprocess.run([str(TERRA_DRIVE), "world=my_worlds:ShakyCamera",
                             "policies=[navsim:my_agents.agent:MyAgent]", "num_scenarios=1", "num_steps=2",
                             "videos=false", "output_dir=out", "num_threads=1"],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path, env=ENV)
    assert result.returncode == 0, result.stderr
    assert "1 drives ok, 0 failed" in result.stdout
    [record] = [json.loads(line) for line in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    assert record["status"] == "ok"

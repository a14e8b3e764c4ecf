"""User code named on terra-drive's command line (a NAVSIM agent, a world) is found in the working folder, as
``python -m``, uvicorn and pytest find a module there, no ``PYTHONPATH=.``, but the named module alone: ``sys.path``
stays as it was, so a ``safetensors.py`` or ``imageio.py`` lying in that folder never stands in for the real package,
in the run's process or in its writers (terra/closedloop/guard.py, ``user_module``)."""

from __future__ import annotations

import importlib.machinery
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from terra.closedloop.user_world import world_class
from terra.core.errors import TerraInputError

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


SHADOWS = ("safetensors", "imageio")  # packages the toolkit imports, in the run's process and in its writers


def shadow(folder: Path) -> None:
    """Modules of the toolkit's dependencies' names in ``folder`` that leave a mark and fail when imported."""
    for name in SHADOWS:
        (folder / f"{name}.py").write_text(f"open({str(folder / (name + '-ran'))!r}, 'w').close()\n"
                                           f"raise SystemExit('the working folder shadowed {name}')\n")


def fresh_origins() -> list[str | None]:
    """Where a fresh import of each of :data:`SHADOWS` would come from, by this process's ``sys.path``."""
    return [importlib.machinery.PathFinder.find_spec(name, sys.path).origin for name in SHADOWS]


def imported_origins() -> list[str]:
    """What importing each of :data:`SHADOWS` gives (in a spawned process: a writer's)."""
    return [__import__(name).__file__ for name in SHADOWS]


def test_a_user_module_comes_alone_from_the_working_folder(tmp_path, monkeypatch):
    (tmp_path / "terra_test_world_here.py").write_text(SHAKY_CAMERA)
    (tmp_path / "terra_test_worlds_package").mkdir()  # a package without __init__.py, its submodule named
    (tmp_path / "terra_test_worlds_package" / "shaky.py").write_text(SHAKY_CAMERA)
    shadow(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or os.curdir) != str(tmp_path)])
    for name in ("terra_test_world_here", "terra_test_worlds_package", "terra_test_worlds_package.shaky"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    path = list(sys.path)
    assert world_class("terra_test_world_here:ShakyCamera", "world", 10.0).__name__ == "ShakyCamera"
    assert world_class("terra_test_worlds_package.shaky:ShakyCamera", "world", 10.0).__name__ == "ShakyCamera"
    assert sys.path == path
    assert not any(str(tmp_path) in origin for origin in fresh_origins())
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # as terra-drive's writers start
        assert not any(str(tmp_path) in origin for origin in pool.apply(imported_origins))
    assert not any((tmp_path / f"{name}-ran").exists() for name in SHADOWS)
    with pytest.raises(TerraInputError, match=r"working folder's imageio has the name of another module .*rename"):
        world_class("imageio:ShakyCamera", "world", 10.0)  # registered, it would replace imageio for the run


@pytest.mark.skipif(not TERRA_DRIVE.exists(), reason="terra-drive is not installed next to this Python")
def test_terra_drive_finds_an_agent_and_a_world_of_the_working_folder(tmp_path):
    (tmp_path / "my_worlds.py").write_text(SHAKY_CAMERA)
    (tmp_path / "my_agents").mkdir()
    (tmp_path / "my_agents" / "__init__.py").write_text("")
    (tmp_path / "my_agents" / "agent.py").write_text(MY_AGENT)
    shadow(tmp_path)  # the run and its writer process (videos: imageio) import the real packages
    result = subprocess.run([str(TERRA_DRIVE), "world=my_worlds:ShakyCamera",
                             "policies=[navsim:my_agents.agent:MyAgent]", "num_scenarios=1", "num_steps=2",
                             "videos=true", "writer_processes=1", "output_dir=out", "num_threads=1"],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path, env=ENV)
    assert result.returncode == 0, result.stderr
    assert not any((tmp_path / f"{name}-ran").exists() for name in SHADOWS)
    assert "1 drives ok, 0 failed" in result.stdout
    [record] = [json.loads(line) for line in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    assert record["status"] == "ok"

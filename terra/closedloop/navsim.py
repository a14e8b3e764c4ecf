"""NAVSIM's agent contract: an agent written for NAVSIM (``compute_trajectory(agent_input) -> Trajectory``) drives
here with its own class.

:class:`NavsimPolicy` builds NAVSIM's ``AgentInput`` each step as navsim/common/dataclasses.py defines it:
``ego_statuses`` (``EgoStatus``: ``ego_pose`` ``(x, y, heading)`` in the current ego frame, ``ego_velocity`` and
``ego_acceleration`` ``(x, y)`` in each frame's ego frame, ``driving_command`` one-hot left / straight / right /
unknown), ``cameras`` (``Cameras`` with the front camera ``cam_f0`` holding the frame, its intrinsics and mount,
the seven others empty) and ``lidars`` (empty ``Lidar``), for ``num_history_frames`` frames at NAVSIM's 2 Hz
(0.5 s apart; the newest last). NAVSIM's own dataclasses are used when ``navsim`` (autonomousvision/navsim, not on
PyPI) is importable; otherwise dataclasses of the same names and fields from this module, which such an agent
reads the same way. The agent's ``Trajectory`` (``poses [N, 3]`` at ``trajectory_sampling.interval_length``)
becomes the plan.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, List, Optional

import numpy as np

from terra.closedloop.guard import reason
from terra.closedloop.plans import Observation, Plan
from terra.config.checks import check_whole_number
from terra.core.errors import TerraInputError
from terra.sim.camera import CAMERA_HEIGHT_M, OPTICAL_AXES, FrontCamera

NAVSIM_FRAME_STEP = 5  # NAVSIM's frames are 0.5 s apart: every fifth 10 Hz frame
CAMERAS = ("cam_f0", "cam_l0", "cam_l1", "cam_l2", "cam_r0", "cam_r1", "cam_r2", "cam_b0")


@dataclass
class Camera:
    """navsim.common.dataclasses.Camera: an image and its calibration."""

    image: Optional[np.ndarray] = None
    sensor2lidar_rotation: Optional[np.ndarray] = None
    sensor2lidar_translation: Optional[np.ndarray] = None
    intrinsics: Optional[np.ndarray] = None
    distortion: Optional[np.ndarray] = None
    camera_path: Optional[Any] = None


@dataclass
class Cameras:
    """navsim.common.dataclasses.Cameras: the eight cameras."""

    cam_f0: Camera
    cam_l0: Camera
    cam_l1: Camera
    cam_l2: Camera
    cam_r0: Camera
    cam_r1: Camera
    cam_r2: Camera
    cam_b0: Camera


@dataclass
class Lidar:
    """navsim.common.dataclasses.Lidar (no point cloud here)."""

    lidar_pc: Optional[np.ndarray] = None
    lidar_path: Optional[Any] = None


@dataclass
class EgoStatus:
    """navsim.common.dataclasses.EgoStatus."""

    ego_pose: np.ndarray
    ego_velocity: np.ndarray
    ego_acceleration: np.ndarray
    driving_command: np.ndarray
    in_global_frame: bool = False


@dataclass
class AgentInput:
    """navsim.common.dataclasses.AgentInput: current and past ego statuses and sensors, oldest first."""

    ego_statuses: List[EgoStatus]
    cameras: List[Cameras]
    lidars: List[Lidar] = field(default_factory=list)


def dataclasses_module():
    """NAVSIM's own dataclasses module when installed, else this module (the same names and fields)."""
    try:
        from navsim.common import dataclasses as navsim_dataclasses

        return navsim_dataclasses
    except ImportError:
        import sys

        return sys.modules[__name__]


def front_camera(image: np.ndarray, classes) -> Any:
    """``cam_f0`` for a frame of the synthetic world's front camera (terra/sim/camera.py): its pinhole intrinsics,
    its optical axes as the rotation and its mount 1.6 m up as the translation (the ego frame stands for the
    lidar's)."""
    return classes.Camera(image=image, sensor2lidar_rotation=OPTICAL_AXES.astype(np.float32),
                          sensor2lidar_translation=np.array([0.0, 0.0, CAMERA_HEIGHT_M], dtype=np.float32),
                          intrinsics=FrontCamera(*image.shape[:2]).intrinsics().astype(np.float32),
                          distortion=np.zeros(5, dtype=np.float32))


def agent_class(entry: str) -> type:
    """The NAVSIM agent class a ``policies`` entry ``navsim:MODULE:CLASS`` names, imported now and checked: a class
    that can be built with no arguments (agents are built so, one per drive); one line otherwise."""
    module, _, name = entry[len("navsim:"):].rpartition(":")
    where = f"policies: cannot load the NAVSIM agent {entry!r}"
    if not module or not name:
        raise TerraInputError(f"{where}: give navsim:package.module:Class")
    try:
        loaded = importlib.import_module(module)
    except ImportError as err:
        raise TerraInputError(f"{where} ({type(err).__name__}: {err}); give navsim:package.module:Class, importable "
                              "here (PYTHONPATH)") from None
    except (Exception, SystemExit) as err:  # noqa: BLE001  (the user's module failed to run: its line, no trace)
        raise TerraInputError(f"{where}: importing {module} failed: {reason(err)}; fix the module") from None
    found = getattr(loaded, name, None)
    if not inspect.isclass(found):
        what = "nothing" if found is None else f"a {type(found).__name__}"
        raise TerraInputError(f"{where}: {module}.{name} is {what}, not a class; name the agent's class")
    try:
        signature = inspect.signature(found)
    except (TypeError, ValueError):  # a class whose signature Python cannot tell: built as it is
        return found
    needed = [p.name for p in signature.parameters.values()
              if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if needed:
        raise TerraInputError(f"{where}: {name}() needs {', '.join(needed)}, and an agent is built with no arguments; "
                              "give them defaults (or a subclass that does)")
    return found


class NavsimPolicy:
    """A NAVSIM agent (any object with ``initialize()`` and ``compute_trajectory(agent_input)``) as a policy; it
    sees ``num_history_frames`` frames (at least 1) 0.5 s apart."""

    def __init__(self, agent: Any, name: str | None = None, num_history_frames: int = 4) -> None:
        self.agent = agent
        self.name = name or (agent.name() if callable(getattr(agent, "name", None)) else type(agent).__name__)
        self.num_history_frames = check_whole_number(num_history_frames, "num_history_frames", 1,
                                                     "num_history_frames=4")
        self.classes = dataclasses_module()
        self._initialized = False

    def reset(self, scenario) -> None:
        if not self._initialized:
            self.agent.initialize()
            self._initialized = True

    def agent_input(self, observation: Observation) -> Any:
        """NAVSIM's ``AgentInput`` for ``observation``: its frames and ego states 0.5 s apart (the oldest repeated
        when the drive is younger than the history)."""
        classes, n = self.classes, len(observation.history)
        picks = [max(0, n - 1 - NAVSIM_FRAME_STEP * k) for k in range(self.num_history_frames)][::-1]
        frame_of = len(observation.frames) - n  # frames older than the drive's first pose: context frames
        command = observation.ego.command_one_hot()
        statuses, cameras = [], []
        for i in picks:
            state = observation.history[i]
            pose = observation.past_poses[i]
            statuses.append(classes.EgoStatus(
                ego_pose=pose.astype(np.float32),
                ego_velocity=np.array([state.speed_mps, 0.0], dtype=np.float32),
                ego_acceleration=np.array([state.accel_mps2, state.speed_mps * state.yaw_rate], dtype=np.float32),
                driving_command=command.copy()))
            image = observation.frames[max(0, frame_of + i)]
            cams = {name: classes.Camera() for name in CAMERAS}
            cams["cam_f0"] = front_camera(image, classes)
            cameras.append(classes.Cameras(**cams))
        return classes.AgentInput(statuses, cameras, [classes.Lidar() for _ in picks])

    def plan(self, observation: Observation) -> Plan:
        trajectory = self.agent.compute_trajectory(self.agent_input(observation))
        sampling = trajectory.trajectory_sampling
        return Plan.trajectory(np.asarray(trajectory.poses, dtype=np.float64), dt=float(sampling.interval_length))

    def close(self) -> None:
        pass

"""NAVSIM's agent contract: an agent written for NAVSIM drives here with its own class."""

from __future__ import annotations

import importlib
import inspect
import math
import sys
from dataclasses import asdict, dataclass, field, make_dataclass
from types import ModuleType
from typing import Any, Callable, List, Mapping, Optional

import numpy as np

from terra.closedloop.guard import UserCall, UserCodeError, handed, reason, user_class
from terra.closedloop.plans import Observation, Plan
from terra.config.checks import check_number, check_whole_number
from terra.core.errors import TerraInputError
from terra.sim.camera import CAMERA_HEIGHT_M, OPTICAL_AXES, FrontCamera

NAVSIM_FRAME_STEP = 5  # NAVSIM's frames are 0.5 s apart: every fifth 10 Hz frame
NUM_HISTORY_FRAMES = 4  # NAVSIM's SceneFilter.num_history_frames: 1.5 s of history and the frame now
CAMERAS = ("cam_f0", "cam_l0", "cam_l1", "cam_l2", "cam_r0", "cam_r1", "cam_r2", "cam_b0")
SENSORS = (*CAMERAS, "lidar_pc")  # navsim.common.dataclasses.SensorConfig's fields
RENDERED = "cam_f0"  # the one sensor the world renders
NUPLAN_SAMPLING = "nuplan.planning.simulation.trajectory.trajectory_sampling"  # NAVSIM's agents take its class
NAVSIM_SAMPLING = {"time_horizon": 4.0, "interval_length": 0.5}  # NAVSIM's default: 8 poses over 4 s


@dataclass(frozen=True)
class TrajectorySampling:
    """nuplan's ``TrajectorySampling``: ``num_poses`` poses ``interval_length`` s apart over ``time_horizon`` s."""

    num_poses: Optional[int] = None
    time_horizon: Optional[float] = None
    interval_length: Optional[float] = None

    def __post_init__(self) -> None:
        given = {k: v for k, v in asdict(self).items() if v is not None}
        where = "trajectory_sampling: "
        if len(given) < 2:
            raise TerraInputError(f"{where}give two of num_poses, time_horizon and interval_length (got "
                                  f"{given or 'none'}); e.g. {{time_horizon: 4, interval_length: 0.5}}")
        if "num_poses" in given:
            check_whole_number(given["num_poses"], "num_poses", 1, "num_poses=8", where=where)
        for name in ("time_horizon", "interval_length"):
            if name in given:
                check_number(given[name], name, 0.0, 3600.0, f"{name}=0.5", low_open=True, where=where)
        interval = self.interval_length if self.interval_length is not None else self.time_horizon / self.num_poses
        horizon = self.time_horizon if self.time_horizon is not None else self.num_poses * interval
        num_poses = self.num_poses if self.num_poses is not None else round(horizon / interval)
        if num_poses < 1 or not math.isclose(num_poses * interval, horizon, rel_tol=1e-6):
            raise TerraInputError(f"{where}time_horizon={horizon:g} s is not num_poses x interval_length ("
                                  f"{num_poses} x {interval:g} s); give a horizon that is a whole number of intervals")
        object.__setattr__(self, "num_poses", int(num_poses))
        object.__setattr__(self, "time_horizon", float(horizon))
        object.__setattr__(self, "interval_length", float(interval))

    @property
    def step_time(self) -> float:
        return self.interval_length


@dataclass
class Camera:
    """navsim.common.dataclasses.Camera: an image and its calibration."""

    image: Optional[np.ndarray] = None
    sensor2lidar_rotation: Optional[np.ndarray] = None
    sensor2lidar_translation: Optional[np.ndarray] = None
    intrinsics: Optional[np.ndarray] = None
    distortion: Optional[np.ndarray] = None
    camera_path: Optional[Any] = None


# navsim.common.dataclasses.Cameras: a Camera per name of CAMERAS
Cameras = make_dataclass("Cameras", [(name, Camera) for name in CAMERAS], namespace={"__module__": __name__})


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


def installed(module: str) -> ModuleType:
    """``module`` (NAVSIM's or nuplan's) when installed, else this module: the same names and fields."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return sys.modules[__name__]


def front_camera(image: np.ndarray, classes) -> Any:
    """``cam_f0`` for a frame of the true world's front camera."""
    return classes.Camera(image=image, sensor2lidar_rotation=OPTICAL_AXES.astype(np.float32),
                          sensor2lidar_translation=np.array([0.0, 0.0, CAMERA_HEIGHT_M], dtype=np.float32),
                          intrinsics=FrontCamera(*image.shape[:2]).intrinsics().astype(np.float32),
                          distortion=np.zeros(5, dtype=np.float32))


def _signature(cls: type) -> inspect.Signature | None:
    """``cls``'s signature (None for a class whose signature Python cannot tell: built with the arguments given)."""
    try:
        return inspect.signature(cls)
    except (TypeError, ValueError):
        return None


def agent_factory(entry: str, args: Mapping[str, Any] | None = None, timeout_s: float = 30.0) -> Callable[[], Any]:
    """A per-drive builder of the agent ``navsim:MODULE:CLASS`` with keyword ``args``, checked now by building one."""
    module, _, attribute = entry[len("navsim:"):].rpartition(":")
    where = f"policies: cannot load the NAVSIM agent {entry!r}"
    if not module or not attribute:
        raise TerraInputError(f"{where}: give navsim:package.module:Class")
    cls = user_class(module, attribute, where, "give navsim:package.module:Class", timeout_s)
    name = cls.__name__
    args = dict(args or {})
    try:  # reading a class's signature may run its code (a metaclass): behind the boundary too
        signature = UserCall(f"{where}: reading {name}", "its signature", _signature, cls).returned(timeout_s)
    except UserCodeError as err:
        raise TerraInputError(f"{err}; fix the agent class") from None
    except (Exception, SystemExit) as err:  # noqa: BLE001  (the class's own code failed: its line, no trace)
        raise TerraInputError(f"{where}: reading {name} failed: {reason(err)}; fix the agent class") from None
    if signature is not None:
        parameters = {p.name: p for p in signature.parameters.values()
                      if p.kind not in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        unknown = [key for key in args if key not in parameters]
        if unknown and not any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
            takes = f"it takes {', '.join(parameters)}" if parameters else "it takes none"
            raise TerraInputError(f"{where}: {name}() takes no argument {unknown[0]!r} ({takes}); fix "
                                  f"navsim_args.{name}")
        sampling = parameters.get("trajectory_sampling")
        if sampling is not None and sampling.default is sampling.empty and "trajectory_sampling" not in args:
            args["trajectory_sampling"] = dict(NAVSIM_SAMPLING)
        needed = [key for key, p in parameters.items() if p.default is p.empty and key not in args]
        if needed:
            raise TerraInputError(f"{where}: {name}() needs {', '.join(needed)}; give them in navsim_args.{name} "
                                  f"(e.g. +navsim_args.{name}.{needed[0]}=VALUE)")

    def build() -> Any:
        from hydra.utils import instantiate

        kwargs = instantiate(args, _convert_="all") if args else {}
        sampling = kwargs.get("trajectory_sampling")
        if isinstance(sampling, Mapping):
            try:
                kwargs["trajectory_sampling"] = installed(NUPLAN_SAMPLING).TrajectorySampling(**sampling)
            except TerraInputError as err:  # trajectory_sampling: ... -> navsim_args.CLASS.trajectory_sampling: ...
                raise TerraInputError(f"navsim_args.{name}.{err}") from None
        return cls(**kwargs)

    try:
        UserCall(f"{where}: {name}", "its trial build", lambda: NavsimPolicy(build(), name)).returned(timeout_s)
    except UserCodeError as err:
        raise TerraInputError(f"{err}; fix the agent, or raise policy_timeout_s if it builds slowly") from None
    except TerraInputError as err:
        raise TerraInputError(f"{where}: {err}") from None
    except (Exception, SystemExit) as err:  # noqa: BLE001  (the user's constructor failed: its line, no trace)
        raise TerraInputError(f"{where}: building and checking {name} (navsim_args.{name}) failed: {reason(err)}; "
                              f"fix navsim_args.{name} or the agent") from None
    return build


class NavsimPolicy:
    """A NAVSIM agent (any object with ``initialize()`` and ``compute_trajectory(agent_input)``) as a policy."""

    def __init__(self, agent: Any, name: str | None = None, num_history_frames: int = NUM_HISTORY_FRAMES) -> None:
        self.agent = agent
        self.name = name or (agent.name() if callable(getattr(agent, "name", None)) else type(agent).__name__)
        self.num_history_frames = check_whole_number(num_history_frames, "num_history_frames", 1,
                                                     "num_history_frames=4")
        missing = [m for m in ("initialize", "compute_trajectory") if not callable(getattr(agent, m, None))]
        if missing:
            raise TerraInputError(f"{self.name} is no NAVSIM agent: it has no {' and no '.join(missing)}() (NAVSIM's "
                                  "AbstractAgent); give an agent class")
        if getattr(agent, "requires_scene", False):
            raise TerraInputError(f"{self.name} has requires_scene=True: it plans from NAVSIM's logged Scene (its map, "
                                  "annotations and future), which a drive in this world does not have; give an agent "
                                  "that plans from its AgentInput")
        self.front_frames = self._front_frames()
        self.classes = installed("navsim.common.dataclasses")
        self._initialized = False

    def _front_frames(self) -> frozenset[int]:
        """The history frames (0 the oldest) whose ``cam_f0`` the agent gets, from its ``get_sensor_config()``."""
        every = frozenset(range(self.num_history_frames))
        if not callable(getattr(self.agent, "get_sensor_config", None)):
            return every
        config = self.agent.get_sensor_config()
        asked = {}
        for sensor in SENSORS:
            value = getattr(config, sensor, False)
            if isinstance(value, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
                value = frozenset(value)
            elif not isinstance(value, bool):
                raise TerraInputError(f"{self.name}.get_sensor_config().{sensor} is {value!r}, not a bool or a list "
                                      "of history frames (NAVSIM's SensorConfig)")
            if value:
                asked[sensor] = value
        beyond = sorted(sensor for sensor in asked if sensor != RENDERED)
        if beyond:
            raise TerraInputError(f"{self.name} asks for sensors this world does not render: {', '.join(beyond)} (it "
                                  f"renders the front camera, {RENDERED}, alone); give an agent that reads {RENDERED} "
                                  "only")
        frames = asked.get(RENDERED, frozenset())
        if frames is True:
            return every
        if frames - every:
            raise TerraInputError(f"{self.name} asks for {RENDERED} at history frames {sorted(frames - every)}, beyond "
                                  f"the {self.num_history_frames} it is given (0 the oldest)")
        return frames

    def reset(self, scenario) -> None:
        if not self._initialized:
            self.agent.initialize()
            self._initialized = True

    def agent_input(self, observation: Observation) -> Any:
        """NAVSIM's ``AgentInput`` for ``observation``."""
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
            if len(cameras) in self.front_frames:
                cams[RENDERED] = front_camera(image, classes)
            cameras.append(classes.Cameras(**cams))
        return classes.AgentInput(statuses, cameras, [classes.Lidar() for _ in picks])

    def plan(self, observation: Observation) -> Plan:
        trajectory = self.agent.compute_trajectory(handed(self.agent_input(observation)))
        sampling = trajectory.trajectory_sampling
        return Plan.trajectory(np.asarray(trajectory.poses, dtype=np.float64), dt=float(sampling.interval_length))

    def close(self) -> None:
        pass

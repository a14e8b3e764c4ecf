"""AlpaSim's driver contract (``egodriver.EgodriverService``, gRPC): any driver that speaks it drives here."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, Callable

import numpy as np

from terra.closedloop.plans import Observation, Plan, policy_seed
from terra.core.errors import TerraInputError
from terra.decoder.writers import encode_image
from terra.inputs.ego_motion import action_arc, advance_pose, to_ego

US = 1_000_000
STEP_US = 100_000  # 10 Hz
CAMERA_ID = "camera_front"
MAX_SOCKET_PATH_BYTES = 107  # a Unix socket's path (sun_path) holds no more


def driver_target(entry: str) -> str:
    """The gRPC target of a ``policies`` entry."""
    if entry.startswith("unix:"):
        path = entry[len("unix:"):]
        path = path[2:] if path.startswith("//") else path
        if not path or "\0" in path or len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
            raise TerraInputError(f"policies: {entry!r} names no Unix socket path of at most {MAX_SOCKET_PATH_BYTES} "
                                  "bytes; give unix:///absolute/path.sock or unix:relative/path.sock")
        return entry
    address = entry[len("grpc:"):]
    host, _, port = address.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [IPv6]
    if (not bare or any(c.isspace() or c in "/@[]" for c in bare) or (":" in bare and bare == host)
            or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535):
        raise TerraInputError(f"policies: {entry!r} is not grpc:HOST:PORT with a port from 1 to 65535; e.g. "
                              "grpc:127.0.0.1:50051 (grpc:[::1]:50051 for IPv6)")
    return address


def context_motion(scenario) -> np.ndarray:
    """``[n - 1, 6]`` ego history of the context frames: pose (x, y, yaw), speed, yaw rate and acceleration."""
    poses = [(0.0, 0.0, 0.0)]
    for action in scenario.actions:
        poses.append(advance_pose(poses[-1], action))
    world = np.array(poses)
    last = world[-1]
    local = np.concatenate([to_ego(world[:, :2], last), world[:, 2:] - last[2]], axis=-1)
    arcs = [action_arc(np.asarray(action)) for action in scenario.actions]
    speeds = np.array([length / t0 for _, length, t0 in arcs] + [scenario.speed_kmh / 3.6])
    yaw_rates = np.array([curvature * length / t0 for curvature, length, t0 in arcs])
    return np.column_stack([local[:-1], speeds[:-1], yaw_rates, np.diff(speeds) / (STEP_US / US)])


class EgodriverPolicy:
    """A driver behind ``egodriver.EgodriverService`` as a policy of the loop (one instance per drive)."""

    def __init__(self, target: Any, name: str = "egodriver", timeout_s: float = 30.0, seed: int = 0) -> None:
        import grpc
        from carla_driver_interface.protocol import EgodriverServiceStub, channel_options

        self.name = name
        self.where = f"driver at {target}" if isinstance(target, str) else f"driver {name}"  # for error lines
        self._channel = grpc.insecure_channel(target, options=channel_options()) if isinstance(target, str) \
            else target
        self._stub = EgodriverServiceStub(self._channel)
        self.timeout_s, self.seed = timeout_s, seed
        self.session = ""
        self._start_us = 0  # the first decision's time: the last context frame's
        self._history = np.zeros((0, 6))  # the context's ego history (context_motion), sent with the first plan
        self._seen_us = -1  # the newest frame the driver was sent

    def _calls(self) -> Callable[..., Any]:
        """A caller of this policy's gRPC methods that share one deadline, ``timeout_s`` from now."""
        import grpc

        deadline = time.monotonic() + self.timeout_s

        def call(method: Callable[..., Any], *args: Any, **options: Any) -> Any:
            try:
                return method(*args, timeout=max(0.001, deadline - time.monotonic()), **options)
            except grpc.RpcError as err:
                details = " ".join(str(err.details() or "no details").split())
                raise TerraInputError(f"{self.where}: {err.code().name}: {details}") from None

        return call

    def reset(self, scenario) -> None:
        from carla_driver_interface.contract import contract_metadata, negotiate
        from carla_driver_interface.protocol import DriveSessionRequest
        from carla_driver_interface.testing import FakeCamera

        from terra.sim.camera import CAMERA_HEIGHT_M, CAMERA_HFOV_RAD, CAMERA_PITCH_RAD

        call = self._calls()
        height, width = scenario.images.shape[1:3]
        # the true world's front camera as a pinhole the contract declares
        camera = FakeCamera(CAMERA_ID, width, height, float(np.degrees(CAMERA_HFOV_RAD)), x=0.0, y=0.0,
                            z=CAMERA_HEIGHT_M, pitch_down_deg=float(np.degrees(CAMERA_PITCH_RAD)))
        _, revision = call(lambda timeout: negotiate(self._stub, timeout=timeout))
        session = str(uuid.uuid4())
        request = DriveSessionRequest(session_uuid=session, random_seed=policy_seed(self.seed, scenario.id, self.name))
        request.debug_info.scene_id = scenario.id
        request.rollout_spec.vehicle.available_cameras.append(camera.available_camera(revision))
        call(self._stub.start_session, request, metadata=contract_metadata(revision))
        self.session = session  # a session the driver opened, and so closes
        self._start_us = (len(scenario.images) - 1) * STEP_US
        self._history = context_motion(scenario)
        self._seen_us = -1

    def plan(self, observation: Observation) -> Plan:
        from carla_driver_interface.geometry import waypoints_to_proto
        from carla_driver_interface.protocol import DriveRequest, Route, RouteRequest

        call = self._calls()
        now_us = self._start_us + observation.step * STEP_US
        self._submit_frames(call, observation.frames, now_us)
        self._submit_motion(call, observation, now_us)
        route = np.concatenate([observation.route, np.zeros((len(observation.route), 1))], axis=-1)
        call(self._stub.submit_route, RouteRequest(session_uuid=self.session, route=Route(
            timestamp_us=now_us, waypoints=waypoints_to_proto(route))))
        answer = call(self._stub.drive, DriveRequest(session_uuid=self.session, time_now_us=now_us,
                                                     time_query_us=now_us + STEP_US))
        if answer.terminate_session:
            raise TerraInputError(f"driver {self.name} ended the session (terminate_session)")
        later = [entry for entry in answer.trajectory.poses if entry.timestamp_us > now_us]
        if not later:  # the contract's "hold": stand still
            return Plan.trajectory(np.zeros((40, 3)), dt=STEP_US / US)
        try:
            return Plan.from_quaternions([(e.pose.vec.x, e.pose.vec.y, e.pose.vec.z) for e in later],
                                         [(e.pose.quat.x, e.pose.quat.y, e.pose.quat.z, e.pose.quat.w) for e in later],
                                         [(e.timestamp_us - now_us) / US for e in later], observation.pose)
        except TerraInputError as err:
            raise TerraInputError(f"{self.where} answered a bad plan: {err}") from None

    def _submit_frames(self, call: Callable[..., Any], frames, now_us: int) -> None:
        """Send the frames the driver has not seen, oldest first, each stamped with the time it was taken."""
        from carla_driver_interface.protocol import RolloutCameraImage

        for k, frame in enumerate(frames):
            taken_us = now_us - (len(frames) - 1 - k) * STEP_US
            if taken_us > self._seen_us:
                image = RolloutCameraImage(session_uuid=self.session)
                image.camera_image.logical_id = CAMERA_ID
                image.camera_image.frame_start_us = image.camera_image.frame_end_us = taken_us
                image.camera_image.image_bytes = encode_image(frame, "png")
                call(self._stub.submit_image_observation, image)
        self._seen_us = now_us

    def _submit_motion(self, call: Callable[..., Any], observation: Observation, now_us: int) -> None:
        """Send the ego poses the driver has not seen with their dynamic states (rig frame)."""
        from carla_driver_interface.geometry import Pose, Trajectory
        from carla_driver_interface.protocol import DynamicState, RolloutEgoTrajectory, Vec3

        ego = observation.ego
        states = np.vstack([self._history, [*observation.pose, ego.speed_mps, ego.yaw_rate, ego.accel_mps2]])
        self._history = self._history[:0]  # the context's history goes with the first plan only
        times = [now_us - (len(states) - 1 - k) * STEP_US for k in range(len(states))]
        motion = RolloutEgoTrajectory(session_uuid=self.session)
        motion.trajectory.CopyFrom(Trajectory(times, [Pose.from_xyz_yaw(x, y, 0.0, yaw)
                                                      for x, y, yaw in states[:, :3].tolist()]).to_proto())
        for speed, yaw_rate, accel in states[:, 3:].tolist():
            motion.dynamic_states.append(DynamicState(linear_velocity=Vec3(x=speed), angular_velocity=Vec3(z=yaw_rate),
                                                      linear_acceleration=Vec3(x=accel)))
        call(self._stub.submit_egomotion_observation, motion)

    def close(self) -> None:
        from carla_driver_interface.protocol import DriveSessionCloseRequest

        try:
            if self.session:
                self._calls()(self._stub.close_session, DriveSessionCloseRequest(session_uuid=self.session))
        finally:
            self.session = ""
            self._channel.close()


def in_process(driver, name: str, timeout_s: float = 30.0) -> EgodriverPolicy:
    """A ``carla_driver_interface`` ``BaseDriver`` served in this process (alpasim mode) as a policy."""
    from carla_driver_interface.inprocess import in_process_channel

    return EgodriverPolicy(in_process_channel(driver, mode="alpasim"), name, timeout_s)


def reference_driver(name: str, cruise_speed_mps: float = 8.0):
    """The contract's reference policy ``constant_speed`` or ``route_follower`` (carla_driver_interface.policies)."""
    from carla_driver_interface.policies import load_policy

    return load_policy(name, cruise_speed_mps=cruise_speed_mps)

"""AlpaSim's driver contract (``egodriver.EgodriverService``, gRPC): any driver that speaks it drives here.

:class:`EgodriverPolicy` plays AlpaSim's runtime and sensor simulator for one drive, through the client end of
``carla-driver-interface`` (the contract's messages and stubs, vendored from NVlabs/alpasim unchanged): it
negotiates the contract revision, opens a session declaring the front camera (the synthetic world's pinhole:
70 degrees across, 1.6 m up, pitched 4 degrees down), and each step submits the newest frame, the ego pose and
speed in the drive's ``local`` frame and the route in the rig frame, then asks ``drive`` for a plan. The answer,
in the local frame and led by the pose now, comes back to the loop in the rig frame (x forward, y left).

The driver may run anywhere gRPC reaches (``"host:port"``, ``unix:///path``) or in this process
(:func:`in_process`, over ``carla_driver_interface.inprocess``: the same bytes, no socket); the contract's own
reference policies ``constant_speed`` and ``route_follower`` are :func:`reference_driver`.

Every call into the policy (reset: ``get_version`` and ``start_session``; plan: the three submissions and
``drive``; close: ``close_session``) shares one deadline, ``timeout_s`` (terra-drive's ``policy_timeout_s``), so a
driver that never answers costs the drive that long and no more. A failed call is one line, ``driver at
HOST:PORT: <status code>: <details>``; an answer whose poses are not finite or whose rotations are degenerate
(a quaternion of norm 0) fails the drive instead of being driven.
"""

from __future__ import annotations

import io
import math
import os
import time
import uuid
from typing import Any, Callable

import numpy as np

from terra.closedloop.plans import Observation, Plan
from terra.core.errors import TerraInputError

US = 1_000_000
STEP_US = 100_000  # 10 Hz
CAMERA_ID = "camera_front"
MIN_QUATERNION_NORM = 1e-6  # below it a rotation is degenerate (carla_driver_interface reads it as no rotation)
MAX_POSITION_M = 1e7  # a plan's positions beyond this are nonsense (and would overflow the geometry)
MAX_SOCKET_PATH_BYTES = 107  # a Unix socket's path (sun_path) holds no more


def driver_target(entry: str) -> str:
    """The gRPC target of a ``policies`` entry: ``grpc:HOST:PORT`` (``grpc:[::1]:PORT`` for IPv6) as ``HOST:PORT``,
    ``unix:PATH`` / ``unix:///ABSOLUTE/PATH`` as it is; checked before any drive (one line otherwise)."""
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


def _camera(width: int, height: int):
    """The synthetic world's front camera as a pinhole the contract declares (terra/sim/camera.py)."""
    from carla_driver_interface.testing import FakeCamera

    from terra.sim.camera import CAMERA_HEIGHT_M, CAMERA_HFOV_RAD, CAMERA_PITCH_RAD

    return FakeCamera(CAMERA_ID, width, height, float(np.degrees(CAMERA_HFOV_RAD)), x=0.0, y=0.0,
                      z=CAMERA_HEIGHT_M, pitch_down_deg=float(np.degrees(CAMERA_PITCH_RAD)))


class EgodriverPolicy:
    """A driver behind ``egodriver.EgodriverService`` as a policy of the loop (one instance per drive)."""

    def __init__(self, target: Any, name: str = "egodriver", timeout_s: float = 30.0, image_format: str = "PNG",
                 own_channel: bool | None = None) -> None:
        import grpc
        from carla_driver_interface.protocol import EgodriverServiceStub, channel_options

        self.name = name
        self.where = f"driver at {target}" if isinstance(target, str) else f"driver {name}"  # for error lines
        self._channel = grpc.insecure_channel(target, options=channel_options()) if isinstance(target, str) \
            else target
        self._own = isinstance(target, str) if own_channel is None else own_channel
        self._stub = EgodriverServiceStub(self._channel)
        self.timeout_s = timeout_s
        self.image_format = image_format
        self.session = ""

    def _calls(self) -> Callable[..., Any]:
        """A caller of this policy's gRPC methods that share one deadline, ``timeout_s`` from now: ``call(method,
        request, **options)``; a failed call raises one line (:class:`TerraInputError`)."""
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

        call = self._calls()
        height, width = scenario.images.shape[1:3]
        _, revision = call(lambda timeout: negotiate(self._stub, timeout=timeout))
        session = str(uuid.uuid4())
        request = DriveSessionRequest(session_uuid=session, random_seed=0)
        request.debug_info.scene_id = scenario.id
        request.rollout_spec.vehicle.available_cameras.append(_camera(width, height).available_camera(revision))
        call(self._stub.start_session, request, metadata=contract_metadata(revision))
        self.session = session  # a session the driver opened, and so closes

    def plan(self, observation: Observation) -> Plan:
        from carla_driver_interface.geometry import Pose, Trajectory, waypoints_to_proto
        from carla_driver_interface.protocol import (
            DriveRequest, DynamicState, RolloutCameraImage, RolloutEgoTrajectory, Route, RouteRequest, Vec3,
        )

        call = self._calls()
        now_us = observation.step * STEP_US
        x, y, yaw = (float(v) for v in observation.pose)
        pose = Pose.from_xyz_yaw(x, y, 0.0, yaw)
        image = RolloutCameraImage(session_uuid=self.session)
        image.camera_image.logical_id = CAMERA_ID
        image.camera_image.frame_start_us = image.camera_image.frame_end_us = now_us
        image.camera_image.image_bytes = self._encode(observation.frame)
        call(self._stub.submit_image_observation, image)
        ego = observation.ego
        motion = RolloutEgoTrajectory(session_uuid=self.session)
        motion.trajectory.CopyFrom(Trajectory([now_us], [pose]).to_proto())
        motion.dynamic_states.append(DynamicState(linear_velocity=Vec3(x=ego.speed_mps),
                                                  angular_velocity=Vec3(z=ego.yaw_rate),
                                                  linear_acceleration=Vec3(x=ego.accel_mps2)))
        call(self._stub.submit_egomotion_observation, motion)
        route = np.concatenate([observation.route, np.zeros((len(observation.route), 1))], axis=-1)
        call(self._stub.submit_route, RouteRequest(session_uuid=self.session, route=Route(
            timestamp_us=now_us, waypoints=waypoints_to_proto(route))))
        answer = call(self._stub.drive, DriveRequest(session_uuid=self.session, time_now_us=now_us,
                                                     time_query_us=now_us + STEP_US))
        if answer.terminate_session:
            raise TerraInputError(f"driver {self.name} ended the session (terminate_session)")
        self._check_poses(answer.trajectory)
        plan = Trajectory.from_proto(answer.trajectory)
        later = [(t, p) for t, p in zip(plan.timestamps_us, plan.poses) if t > now_us]
        if not later:  # the contract's "hold": stand still
            return Plan.trajectory(np.zeros((40, 3)), dt=STEP_US / US)
        inverse = pose.inverse()
        rig = [inverse @ p for _, p in later]
        poses = np.array([[p.position[0], p.position[1], p.yaw] for p in rig])
        return Plan.trajectory(poses, times=np.array([(t - now_us) / US for t, _ in later]))

    def _check_poses(self, trajectory) -> None:
        """Refuse an answer whose poses are not finite, lie beyond :data:`MAX_POSITION_M` or have a degenerate
        rotation, before any geometry reads them."""
        for k, entry in enumerate(trajectory.poses):
            vec, quat = entry.pose.vec, entry.pose.quat
            position = (vec.x, vec.y, vec.z)
            if not all(math.isfinite(v) and abs(v) <= MAX_POSITION_M for v in position):
                shown = ", ".join(f"{v:g}" for v in position)
                raise TerraInputError(f"{self.where} answered a plan whose pose {k} is at ({shown}), not a finite "
                                      f"position within {MAX_POSITION_M:g} m; send poses in the drive's local frame")
            norm = math.hypot(quat.x, quat.y, quat.z, quat.w)
            if not (math.isfinite(norm) and norm >= MIN_QUATERNION_NORM):
                raise TerraInputError(f"{self.where} answered a plan whose pose {k} has a degenerate rotation (a "
                                      f"quaternion of norm {norm:g}); send unit quaternions")

    def close(self) -> None:
        from carla_driver_interface.protocol import DriveSessionCloseRequest

        try:
            if self.session:
                self._calls()(self._stub.close_session, DriveSessionCloseRequest(session_uuid=self.session))
        finally:
            self.session = ""
            if self._own:
                self._channel.close()

    def _encode(self, rgb: np.ndarray) -> bytes:
        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray(np.asarray(rgb, dtype=np.uint8)).save(buffer, format=self.image_format)
        return buffer.getvalue()


def in_process(driver, name: str, timeout_s: float = 30.0) -> EgodriverPolicy:
    """A ``carla_driver_interface`` ``BaseDriver`` served in this process (alpasim mode) as a policy."""
    from carla_driver_interface.inprocess import in_process_channel

    return EgodriverPolicy(in_process_channel(driver, mode="alpasim"), name, timeout_s, own_channel=True)


def reference_driver(name: str, cruise_speed_mps: float = 8.0):
    """The contract's reference policy ``constant_speed`` or ``route_follower`` (carla_driver_interface.policies)."""
    from carla_driver_interface.policies import load_policy

    return load_policy(name, cruise_speed_mps=cruise_speed_mps)

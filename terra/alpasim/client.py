"""A client of the WorldModelService that calls it as AlpaSim's runtime does."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import grpc
from carla_driver_interface.protocol import common_pb2, sensorsim_pb2

from terra.alpasim import video_model_pb2 as pb
from terra.alpasim import video_model_pb2_grpc as pb_grpc
from terra.alpasim.poses import FRAME_INTERVAL_US
from terra.alpasim.settings import MAX_MESSAGE_BYTES

ANCHOR_US = 1_700_000_000_000_000  # the initial frame's time: a Unix time in microseconds, as recordings have
CAMERA = "camera_front_wide_120fov"  # AlpaSim's default front camera
Path = Callable[[float], tuple[float, float, float]]  # seconds after the initial frame → (x, y, yaw) in local


def straight(speed: float = 8.0, start: tuple[float, float, float] = (120.0, -40.0, 0.3)) -> Path:
    """Driving straight at ``speed`` m/s from ``start`` (x, y, yaw)."""
    x0, y0, yaw0 = start
    return lambda t: (x0 + speed * t * math.cos(yaw0), y0 + speed * t * math.sin(yaw0), yaw0)


def curve(speed: float = 8.0, rate: float = 0.25, start: tuple[float, float, float] = (120.0, -40.0, 0.3)) -> Path:
    """Driving at ``speed`` m/s and yaw rate ``rate`` rad/s (left positive) from ``start`` (x, y, yaw)."""
    if not rate:
        return straight(speed, start)
    x0, y0, yaw0 = start
    radius = speed / rate
    return lambda t: (x0 + radius * (math.sin(yaw0 + rate * t) - math.sin(yaw0)),
                      y0 - radius * (math.cos(yaw0 + rate * t) - math.cos(yaw0)), yaw0 + rate * t)


def camera_spec(resolution: tuple[int, int] = (0, 0), logical_id: str = CAMERA) -> sensorsim_pb2.CameraSpec:
    """An equidistant FTheta camera of 120 degrees; ``resolution`` (H, W), (0, 0): the server's own."""
    height, width = resolution
    focal = math.hypot(width or 1280, height or 640) / 2 / math.radians(60)
    return sensorsim_pb2.CameraSpec(
        logical_id=logical_id, resolution_h=height, resolution_w=width, shutter_type=sensorsim_pb2.GLOBAL,
        ftheta_param=sensorsim_pb2.FthetaCameraParam(
            principal_point_x=(width or 1280) / 2, principal_point_y=(height or 640) / 2,
            reference_poly=sensorsim_pb2.FthetaCameraParam.ANGLE_TO_PIXELDIST, angle_to_pixeldist_poly=[0.0, focal],
            pixeldist_to_angle_poly=[0.0, 1 / focal], max_angle=math.radians(100)))


def pose_at(timestamp_us: int, x: float, y: float, yaw: float, z: float = 0.0) -> common_pb2.PoseAtTime:
    """A level rig pose in the local frame at ``timestamp_us``."""
    rotation = common_pb2.Quat(w=math.cos(yaw / 2), x=0.0, y=0.0, z=math.sin(yaw / 2))
    return common_pb2.PoseAtTime(timestamp_us=timestamp_us,
                                 pose=common_pb2.Pose(vec=common_pb2.Vec3(x=x, y=y, z=z), quat=rotation))


def trajectory(path: Path, frames: Sequence[int], anchor_us: int = ANCHOR_US) -> common_pb2.Trajectory:
    """The rig's poses along ``path`` at frames ``frames`` (1 = the first after the initial frame, 10 fps)."""
    return common_pb2.Trajectory(poses=[pose_at(anchor_us + k * FRAME_INTERVAL_US, *path(k * FRAME_INTERVAL_US / 1e6))
                                        for k in frames])


class BearerToken(grpc.UnaryUnaryClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every call's metadata."""

    def __init__(self, token: str) -> None:
        self.metadata = ("authorization", f"Bearer {token}")

    def intercept_unary_unary(self, continuation, details, request):
        metadata = [*(details.metadata or ()), self.metadata]
        return continuation(details._replace(metadata=metadata), request)


class RuntimeClient:
    """The runtime's calls on a channel to ``address`` (``host:port``) with AlpaSim's 64 MiB message limits."""

    def __init__(self, address: str, timeout_s: float = 600.0, token: str | None = None) -> None:
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                                               ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        if token is not None:
            self.channel = grpc.intercept_channel(self.channel, BearerToken(token))
        self.stub = pb_grpc.WorldModelServiceStub(self.channel)
        self.timeout_s = timeout_s

    def start(self, frame: bytes, seed: int = 0, cameras: int = 1, resolution: tuple[int, int] = (0, 0),
              **fields) -> pb.SessionId:
        """``start_session`` with ``cameras`` copies of one camera and its initial ``frame`` (JPEG bytes)."""
        request = {
            "static_world_map": pb.StaticWorldMap(hdmap_parquets=b"PK\x05\x06" + bytes(18)),  # an empty zip
            "text_prompt": pb.TextPrompt(positive="a sunny day"),
            "camera_specs": [camera_spec(resolution) for _ in range(cameras)],
            "initial_frames": [pb.Image(data=frame, format=pb.JPEG) for _ in range(cameras)],
            "rig_to_camera": [common_pb2.Pose(vec=common_pb2.Vec3(x=1.5, z=1.6), quat=common_pb2.Quat(w=1.0))
                              for _ in range(cameras)],
            "random_seed": seed, **fields}
        return self.stub.start_session(pb.SessionRequest(**request), timeout=self.timeout_s)

    def chunk(self, session: pb.SessionId, poses: common_pb2.Trajectory) -> pb.VideoChunkReturn:
        return self.stub.render_video_chunk(pb.VideoChunkRequest(session_id=session, rig_trajectory=poses),
                                            timeout=self.timeout_s)

    def close(self, session: pb.SessionId) -> None:
        self.stub.close_session(pb.SessionCloseRequest(session_id=session.session_id), timeout=self.timeout_s)

    def version(self) -> common_pb2.VersionId:
        return self.stub.get_version(common_pb2.Empty(), timeout=self.timeout_s)

    def rollout(self, frame: bytes, path: Path, seed: int = 0,
                chunks: Sequence[int] = (5, 8)) -> tuple[str, list[list[pb.Image]]]:
        """A whole rollout: start, the chunks along ``path``, close; the session's id and each chunk's images."""
        session = self.start(frame=frame, seed=seed)
        frames, first = [], 1
        for size in chunks:
            answer = self.chunk(session, trajectory(path, range(first, first + size)))
            frames.append(list(answer.camera_outputs[0].rgb_frames))
            first += size
        self.close(session)
        return session.session_id, frames

    def close_channel(self) -> None:
        self.channel.close()

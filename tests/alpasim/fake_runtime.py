"""A fake AlpaSim runtime: the calls its video-model client makes, in its order, over real gRPC.

As AlpaSim's runtime (research: its services/video_model_service.py and events/video_model/prefetch.py): one
``start_session`` with one FTheta camera, the camera's first recorded frame as a JPEG, its mounting, the scene's HD
map and a text prompt, no seed; then chunks of the rig's poses (local frame, quaternion w first, microseconds), the
first one short (5 frames) and the later ones ``chunk_frames`` long (8), each starting one frame after the last;
``close_session`` with the id as a plain string.
"""

from __future__ import annotations

import io
import math
from typing import Callable, Sequence

import grpc
import numpy as np
from carla_driver_interface.protocol import common_pb2, sensorsim_pb2
from PIL import Image

from terra.alpasim import video_model_pb2 as pb
from terra.alpasim import video_model_pb2_grpc as pb_grpc
from terra.alpasim.settings import MAX_MESSAGE_BYTES

ANCHOR_US = 1_700_000_000_000_000  # the initial frame's time: a Unix time in microseconds, as recordings have
FRAME_US = 100_000  # fps=10
Path = Callable[[float], tuple[float, float, float]]  # seconds after the initial frame → (x, y, yaw) in local


def straight(speed: float = 8.0, start=(120.0, -40.0, 0.3)) -> Path:
    x0, y0, yaw0 = start
    return lambda t: (x0 + speed * t * math.cos(yaw0), y0 + speed * t * math.sin(yaw0), yaw0)


def curve(speed: float = 8.0, rate: float = 0.25, start=(120.0, -40.0, 0.3)) -> Path:
    """Constant speed and yaw rate (rad/s, left positive)."""
    x0, y0, yaw0 = start
    radius = speed / rate
    return lambda t: (x0 + radius * (math.sin(yaw0 + rate * t) - math.sin(yaw0)),
                      y0 - radius * (math.cos(yaw0 + rate * t) - math.cos(yaw0)), yaw0 + rate * t)


def jpeg(seed: int = 0, size: tuple[int, int] = (96, 160)) -> bytes:
    """A camera frame as the runtime sends it (JPEG bytes)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def camera_spec(resolution: tuple[int, int] = (0, 0), logical_id: str = "camera_front_wide_120fov"):
    """AlpaSim's default FTheta camera (an equidistant lens, as its runtime synthesizes when a scene has none)."""
    height, width = resolution
    focal = math.hypot(width or 1280, height or 640) / 2 / math.radians(60)
    return sensorsim_pb2.CameraSpec(
        logical_id=logical_id, resolution_h=height, resolution_w=width, shutter_type=sensorsim_pb2.GLOBAL,
        ftheta_param=sensorsim_pb2.FthetaCameraParam(
            principal_point_x=(width or 1280) / 2, principal_point_y=(height or 640) / 2,
            reference_poly=sensorsim_pb2.FthetaCameraParam.ANGLE_TO_PIXELDIST, angle_to_pixeldist_poly=[0.0, focal],
            pixeldist_to_angle_poly=[0.0, 1 / focal], max_angle=math.radians(100)))


def pose_at(timestamp_us: int, x: float, y: float, yaw: float, z: float = 0.0) -> common_pb2.PoseAtTime:
    return common_pb2.PoseAtTime(timestamp_us=timestamp_us, pose=common_pb2.Pose(
        vec=common_pb2.Vec3(x=x, y=y, z=z), quat=common_pb2.Quat(w=math.cos(yaw / 2), x=0.0, y=0.0, z=math.sin(yaw / 2))))


def poses_of(path: Path, frames: Sequence[int]) -> common_pb2.Trajectory:
    """The rig's poses at frames ``frames`` (1 = the first after the initial frame)."""
    return common_pb2.Trajectory(poses=[pose_at(ANCHOR_US + k * FRAME_US, *path(k * FRAME_US / 1e6)) for k in frames])


class FakeRuntime:
    """AlpaSim's runtime as the server sees it, on a channel to ``address``."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                                               ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        self.stub = pb_grpc.WorldModelServiceStub(self.channel)

    def start(self, seed: int = 0, frame: bytes | None = None, cameras: int = 1, resolution=(0, 0),
              **fields) -> pb.SessionId:
        request = {
            "static_world_map": pb.StaticWorldMap(hdmap_parquets=b"PK\x05\x06" + bytes(18)),  # an empty zip
            "text_prompt": pb.TextPrompt(positive="a sunny day"),
            "camera_specs": [camera_spec(resolution) for _ in range(cameras)],
            "initial_frames": [pb.Image(data=frame or jpeg(), format=pb.JPEG) for _ in range(cameras)],
            "rig_to_camera": [common_pb2.Pose(vec=common_pb2.Vec3(x=1.5, z=1.6), quat=common_pb2.Quat(w=1.0))
                              for _ in range(cameras)],
            "random_seed": seed, **fields}
        return self.stub.start_session(pb.SessionRequest(**request), timeout=120)

    def chunk(self, session: pb.SessionId, trajectory: common_pb2.Trajectory) -> pb.VideoChunkReturn:
        return self.stub.render_video_chunk(pb.VideoChunkRequest(session_id=session, rig_trajectory=trajectory),
                                            timeout=300)

    def close(self, session: pb.SessionId) -> None:
        self.stub.close_session(pb.SessionCloseRequest(session_id=session.session_id), timeout=60)

    def rollout(self, path: Path, seed: int = 0, chunks: Sequence[int] = (5, 8)) -> tuple[str, list[list[pb.Image]]]:
        """A whole rollout: start, the chunks, close; the session's id and each chunk's images."""
        session = self.start(seed)
        frames, first = [], 1
        for size in chunks:
            answer = self.chunk(session, poses_of(path, range(first, first + size)))
            assert [c.camera_logical_id for c in answer.camera_outputs] == ["camera_front_wide_120fov"]
            frames.append(list(answer.camera_outputs[0].rgb_frames))
            first += size
        self.close(session)
        return session.session_id, frames

"""The tests' fake AlpaSim runtime: terra/alpasim/client.py's calls in AlpaSim's order, with a random camera frame."""

from __future__ import annotations

import io
from typing import Sequence

import numpy as np
from PIL import Image

from terra.alpasim import video_model_pb2 as pb
from terra.alpasim.client import CAMERA, Path, RuntimeClient

CHUNKS = (5, 8)  # AlpaSim's 8frame preset: a short first chunk, then chunks of 8


def jpeg(seed: int = 0, size: tuple[int, int] = (96, 160)) -> bytes:
    """A camera frame as the runtime sends it (JPEG bytes)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


class FakeRuntime(RuntimeClient):
    """:class:`RuntimeClient` starting sessions from :func:`jpeg` unless given a frame, checking each chunk's camera."""

    def start(self, seed: int = 0, frame: bytes | None = None, **fields) -> pb.SessionId:
        return super().start(jpeg() if frame is None else frame, seed, **fields)

    def chunk(self, session, poses) -> pb.VideoChunkReturn:
        answer = super().chunk(session, poses)
        assert [c.camera_logical_id for c in answer.camera_outputs] == [CAMERA]
        return answer

    def drive(self, path: Path, seed: int = 0, chunks: Sequence[int] = CHUNKS) -> list[list[pb.Image]]:
        """A whole rollout from :func:`jpeg`: each chunk's images."""
        return self.rollout(jpeg(), path, seed, chunks)[1]




"""Bytes in and out of the server: the binary frame message, uploads, session videos.

A frame message is ``uint32 big-endian header length | header JSON (UTF-8) | image bytes``."""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from terra.decoder import mark_frames, write_gif, write_mp4
from terra.core.errors import TerraInputError
from terra.tokenizer.images import image_from_bytes
from terra.tokenizer.resize import fit_frame
from terra.core.atomic import json_text

MAX_UPLOAD_PIXELS = 4096 * 4096  # one uploaded frame; a decompression bomb fails before it is decoded
VIDEO_FORMATS = {"mp4": "video/mp4", "gif": "image/gif"}
_DATA_URL = re.compile(r"data:image/[\w.+-]+;base64,", re.ASCII)


def frame_message(header: dict[str, Any], image: bytes) -> bytes:
    """The binary WebSocket message of one frame."""
    text = json_text(header, separators=(",", ":")).encode()
    return struct.pack(">I", len(text)) + text + image


def read_frame_message(message: bytes) -> tuple[dict[str, Any], bytes]:
    """Inverse of :func:`frame_message` (for Python clients and tests)."""
    (length,) = struct.unpack(">I", message[:4])
    return json.loads(message[4 : 4 + length]), message[4 + length :]


def decode_upload(value: Any, index: int, image_size: tuple[int, int], resize: str) -> np.ndarray:
    """An uploaded frame (base64 or a data URL) → uint8 ``[H, W, 3]`` at the tokenizer's ``image_size``."""
    where = f"context image {index}"
    if not isinstance(value, str):
        raise TerraInputError(f"{where} must be a base64 string or a data:image URL (got {type(value).__name__})")
    try:
        data = base64.b64decode(_DATA_URL.sub("", value, count=1), validate=True)
    except (binascii.Error, ValueError):
        raise TerraInputError(f"{where} is not valid base64; send the file's bytes base64-encoded") from None
    return fit_frame(image_from_bytes(data, where, MAX_UPLOAD_PIXELS), image_size, where, resize)


def video_bytes(frames: np.ndarray, num_context: int, video_format: str, fps: float = 10.0) -> bytes:
    """A session's frames as an MP4 or GIF file (context frames marked, as terra-generate marks them)."""
    marked = mark_frames(frames, num_context)
    with tempfile.TemporaryDirectory(prefix="terra-serve-") as folder:
        path = Path(folder) / f"session.{video_format}"
        (write_mp4 if video_format == "mp4" else write_gif)(path, marked, fps=fps)
        return path.read_bytes()

"""From codes to videos: batched decoding, GIF/MP4/PNG writers, grids, overlays and the JSON sidecar.

The names load on first use, so the writers (and their fps and output checks) are importable without torch,
which only :mod:`decoder.frames` needs.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "codes_to_frames": "decoder.frames",
    "images_to_uint8": "decoder.frames",
    "draw_trajectory": "decoder.overlay",
    "mark_frames": "decoder.overlay",
    "write_sidecar": "decoder.sidecar",
    "tile_grid": "decoder.writers",
    "write_gif": "decoder.writers",
    "write_grid": "decoder.writers",
    "write_mp4": "decoder.writers",
    "write_png_sequence": "decoder.writers",
    "write_video": "decoder.writers",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'decoder' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)

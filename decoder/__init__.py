"""From codes to videos: batched decoding, GIF/MP4/PNG writers, grids, overlays and the JSON sidecar."""

from __future__ import annotations

from terra.core.lazy import lazy_face

_HOMES = {
    "codes_to_frames": "terra.decoder.frames",
    "images_to_uint8": "terra.decoder.frames",
    "draw_trajectory": "terra.decoder.overlay",
    "mark_frames": "terra.decoder.overlay",
    "write_sidecar": "terra.decoder.sidecar",
    "encode_image": "terra.decoder.writers",
    "tile_grid": "terra.decoder.writers",
    "write_gif": "terra.decoder.writers",
    "write_grid": "terra.decoder.writers",
    "write_mp4": "terra.decoder.writers",
    "write_png_sequence": "terra.decoder.writers",
    "write_video": "terra.decoder.writers",
}

__all__, __getattr__ = lazy_face(__name__, _HOMES)

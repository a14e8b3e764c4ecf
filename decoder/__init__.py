"""From codes to videos: batched decoding, GIF/MP4/PNG writers, grids, overlays and the JSON sidecar."""

from __future__ import annotations

from terra.core.lazy import lazy_face

_HOMES = {
    **dict.fromkeys(("codes_to_frames", "images_to_uint8"), "terra.decoder.frames"),
    **dict.fromkeys(("draw_trajectory", "mark_frames"), "terra.decoder.overlay"),
    "write_sidecar": "terra.decoder.sidecar",
    **dict.fromkeys(("encode_image", "tile_grid", "write_gif", "write_grid", "write_mp4", "write_png_sequence",
                     "write_video"), "terra.decoder.writers"),
}

__all__, __getattr__ = lazy_face(__name__, _HOMES)

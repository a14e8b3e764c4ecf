"""From codes to videos: batched decoding, GIF/MP4/PNG writers, grids, overlays and the JSON sidecar."""

from decoder.frames import codes_to_frames, images_to_uint8
from decoder.overlay import draw_trajectory, mark_frames
from decoder.sidecar import write_sidecar
from decoder.writers import tile_grid, write_gif, write_grid, write_mp4, write_png_sequence, write_video

__all__ = [
    "codes_to_frames",
    "draw_trajectory",
    "images_to_uint8",
    "mark_frames",
    "tile_grid",
    "write_gif",
    "write_grid",
    "write_mp4",
    "write_png_sequence",
    "write_sidecar",
    "write_video",
]

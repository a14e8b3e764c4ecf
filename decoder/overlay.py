"""Annotations drawn onto frames: context/generated borders with labels, and the commanded trajectory.

The trajectory inset is a bird's-eye view in the bottom-right corner: the ego car sits at the bottom
centre facing up, and the 6 action points ``[y (left), x (forward), time]`` of the frame are drawn as a
polyline from it (x up, y to the left, one metre per pixel scale shared by both axes). Frame ``t`` shows
``actions[t]``, i.e. where the car is commanded to go from that frame on.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from terra.core.errors import TerraInputError
from terra.decoder.writers import check_frames

CONTEXT_COLOR = (60, 140, 255)  # blue: frames given as context
GENERATED_COLOR = (255, 140, 30)  # orange: frames the world model generated
PATH_COLOR = (80, 255, 120)


def mark_frames(frames: np.ndarray, num_context: int, border: int = 3, labels: bool = True) -> np.ndarray:
    """Copy of ``frames`` with a coloured border (blue context, orange generated) and a small label."""
    frames = check_frames(frames).copy()
    font = ImageFont.load_default()
    for index in range(len(frames)):
        context = index < num_context
        color = CONTEXT_COLOR if context else GENERATED_COLOR
        image = Image.fromarray(frames[index])
        draw = ImageDraw.Draw(image)
        w, h = image.size
        for i in range(border):
            draw.rectangle([i, i, w - 1 - i, h - 1 - i], outline=color)
        if labels:
            text = f"context {index + 1}" if context else f"generated {index - num_context + 1}"
            left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
            x0, y0 = border + 1, border + 1
            draw.rectangle([x0, y0, x0 + right - left + 4, y0 + bottom - top + 4], fill=(0, 0, 0))
            draw.text((x0 + 2 - left, y0 + 2 - top), text, fill=color, font=font)
        frames[index] = np.asarray(image)
    return frames


def draw_trajectory(frames: np.ndarray, actions: np.ndarray, inset_fraction: float = 0.33) -> np.ndarray:
    """Copy of ``frames`` with a bird's-eye inset of each frame's commanded path (``actions [T, 6, 3]``).

    Frames beyond the last action row get no inset. The scale fits the largest point of the whole clip.
    """
    frames = check_frames(frames).copy()
    actions = np.asarray(actions, dtype=np.float64)
    if actions.ndim != 3 or actions.shape[2] != 3 or not np.all(np.isfinite(actions)):
        raise TerraInputError(f"actions to draw must be finite [T, 6, 3] ([y, x, time]), got {list(actions.shape)}")
    height, width = frames.shape[1:3]
    size = max(24, int(min(height, width) * inset_fraction))
    margin = 3
    reach = max(5.0, float(np.abs(actions[..., :2]).max()) * 1.1)  # metres spanned by the inset's height
    scale = (size - 2 * margin) / reach
    x0, y0 = width - size - margin, height - size - margin
    ego = (x0 + size / 2, y0 + size - margin)
    for index in range(min(len(frames), len(actions))):
        image = Image.fromarray(frames[index]).convert("RGBA")
        layer = Image.new("RGBA", image.size, (0, 0, 0, 0))
        draw = ImageDraw.Draw(layer)
        draw.rectangle([x0, y0, x0 + size, y0 + size], fill=(0, 0, 0, 150), outline=(255, 255, 255, 200))
        points = [ego] + [(ego[0] - y * scale, ego[1] - x * scale) for y, x, _ in actions[index]]
        points = [(min(max(px, x0), x0 + size), min(max(py, y0), y0 + size)) for px, py in points]
        draw.line(points, fill=PATH_COLOR + (255,), width=2)
        for px, py in points[1:]:
            draw.ellipse([px - 2, py - 2, px + 2, py + 2], fill=PATH_COLOR + (255,))
        tri = [(ego[0], ego[1] - 6), (ego[0] - 4, ego[1] + 2), (ego[0] + 4, ego[1] + 2)]
        draw.polygon(tri, fill=(255, 255, 255, 255))
        frames[index] = np.asarray(Image.alpha_composite(image, layer).convert("RGB"))
    return frames

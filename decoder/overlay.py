"""Annotations drawn onto frames: context/generated borders with labels, and the commanded trajectory."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from terra.core.errors import TerraInputError
from terra.decoder.writers import check_frames

CONTEXT_COLOR = (60, 140, 255)  # blue: frames given as context
GENERATED_COLOR = (255, 140, 30)  # orange: frames the world model generated
PATH_COLOR = (80, 255, 120)
ROUTE_COLOR = (255, 60, 230)  # magenta: the route the world model was told
ROUTE_LABEL = "route"  # above the inset, in ROUTE_COLOR, on a frame with a route
INSET_MARGIN = 3  # pixels between the inset and the frame's edge, and inside it
ROUTE_FIT_M = 60.0  # the inset fits a route as far as a demo frame shows road (it reaches 80 m: cut at the edge)
INSET_FRACTION = 0.45  # the inset's side, of the frame's shorter side: 64 px at 144x256, where its route reads


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


@dataclass(frozen=True)
class Inset:
    """Where the trajectory inset lies on a frame and how ego metres map to its pixels."""

    x0: int  # its top-left corner
    y0: int
    size: int  # its side, pixels
    scale: float  # pixels per metre

    @classmethod
    def fit(cls, height: int, width: int, reach_m: float) -> "Inset":
        """The inset of a ``height`` x ``width`` frame whose height spans ``reach_m`` metres ahead (at least 5 m)."""
        size = max(24, int(min(height, width) * INSET_FRACTION))
        return cls(width - size - INSET_MARGIN, height - size - INSET_MARGIN, size,
                   (size - 2 * INSET_MARGIN) / max(5.0, reach_m))

    @property
    def ego(self) -> tuple[float, float]:
        """The car's pixel: bottom centre."""
        return self.x0 + self.size / 2, self.y0 + self.size - INSET_MARGIN

    def pixels(self, lateral_forward: np.ndarray, clamp: bool = True) -> list[tuple[float, float]]:
        """Ego points ``[N, >=2]`` ``[y, x, ...]`` → the frame's pixels, kept inside the inset (``clamp``)."""
        ex, ey = self.ego
        points = [(ex - y * self.scale, ey - x * self.scale) for y, x in lateral_forward[:, :2]]
        if not clamp:
            return points
        return [(min(max(px, self.x0), self.x0 + self.size), min(max(py, self.y0), self.y0 + self.size))
                for px, py in points]


def draw_trajectory(frames: np.ndarray, actions: np.ndarray, routes: np.ndarray | None = None) -> np.ndarray:
    """``frames`` copied, with an inset of each path (``actions [T, 6, 3]``) and route (``routes [T', K, 2|3]``)."""
    frames = check_frames(frames).copy()
    actions = np.asarray(actions, dtype=np.float64)
    if actions.ndim != 3 or actions.shape[2] != 3 or not np.all(np.isfinite(actions)):
        raise TerraInputError(f"actions to draw must be finite [T, 6, 3] ([y, x, time]), got {list(actions.shape)}")
    if routes is not None:  # a frame whose rows are not all finite has no route
        routes = np.asarray(routes, dtype=np.float64)
        if routes.ndim != 3 or routes.shape[2] not in (2, 3) or routes.shape[1] == 0:
            raise TerraInputError(f"routes to draw must be [T, K, 2|3] ([x, y(, s)]), got {list(routes.shape)}")
    inset = Inset.fit(*frames.shape[1:3], _reach(actions, routes))
    x0, y0, size = inset.x0, inset.y0, inset.size
    font = ImageFont.load_default()
    for index in range(len(frames)):
        image = Image.fromarray(frames[index]).convert("RGBA")
        layer = Image.new("RGBA", image.size, (0, 0, 0, 0))
        draw = ImageDraw.Draw(layer)
        draw.rectangle([x0, y0, x0 + size, y0 + size], fill=(0, 0, 0, 150), outline=(255, 255, 255, 200))
        if routes is not None and index < len(routes) and np.isfinite(routes[index]).all():
            _draw_route(layer, inset, routes[index], font)
        if index < len(actions):
            points = [inset.ego] + inset.pixels(actions[index])
            draw.line(points, fill=PATH_COLOR + (255,), width=2)
            for px, py in points[1:]:
                draw.ellipse([px - 2, py - 2, px + 2, py + 2], fill=PATH_COLOR + (255,))
        ego = inset.ego
        tri = [(ego[0], ego[1] - 6), (ego[0] - 4, ego[1] + 2), (ego[0] + 4, ego[1] + 2)]
        draw.polygon(tri, fill=(255, 255, 255, 255))
        frames[index] = np.asarray(Image.alpha_composite(image, layer).convert("RGB"))
    return frames


def _reach(actions: np.ndarray, routes: np.ndarray | None) -> float:
    """Metres the inset's height spans: 1.1 x the farthest point of the paths and routes near the car."""
    reach = np.abs(actions[..., :2]).max(initial=0.0)
    if routes is not None:
        near = routes[..., :2][np.hypot(routes[..., 0], routes[..., 1]) <= ROUTE_FIT_M]  # NaN rows compare False
        reach = max(reach, np.abs(near).max(initial=0.0))
    return 1.1 * float(reach)


def _draw_route(layer: Image.Image, inset: Inset, route: np.ndarray, font: ImageFont.ImageFont) -> None:
    """``route`` (``[K, 2|3]``, ego ``[x, y(, s)]``) drawn onto ``layer``, cut at the inset's edge, with its label."""
    box = Image.new("RGBA", (inset.size + 1, inset.size + 1), (0, 0, 0, 0))  # drawn here, clipped to the inset
    points = [(px - inset.x0, py - inset.y0) for px, py in inset.pixels(route[:, [1, 0]], clamp=False)]
    ImageDraw.Draw(box).line(points, fill=ROUTE_COLOR + (255,), width=3, joint="curve")
    layer.alpha_composite(box, (inset.x0, inset.y0))
    draw = ImageDraw.Draw(layer)
    left, top, right, bottom = draw.textbbox((0, 0), ROUTE_LABEL, font=font)
    lx, ly = inset.x0 + inset.size - (right - left) - 4, inset.y0 - (bottom - top) - 5
    draw.rectangle([lx, ly, inset.x0 + inset.size, inset.y0 - 1], fill=(0, 0, 0, 200))
    draw.text((lx + 2 - left, ly + 2 - top), ROUTE_LABEL, fill=ROUTE_COLOR + (255,), font=font)

"""The HD-map condition frames (``debug_options.return_hdmap_frames``): what each frame's route slots were told,
drawn."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from terra.contract.routes import ROUTE_HORIZON_M
from terra.roads import Road

VIEW_AHEAD_M = ROUTE_HORIZON_M + 10.0
VIEW_BEHIND_M = 6.0
REFRESH_M = 200.0  # the map's points within this of the view's reach are kept, and kept again after the car moves
BACKGROUND = (24, 24, 24)
LANE_COLOR = (100, 100, 100)
BOUNDARY_COLOR = (180, 180, 180)
ROUTE_COLOR = (255, 200, 0)
RIG_COLOR = (0, 190, 255)


class TopView:
    """Top views of ``road`` (None: no map drawn) at ``size`` ``(H, W)`` pixels."""

    def __init__(self, road: Road | None, size: tuple[int, int]) -> None:
        self.height, self.width = size
        self.px_per_m = self.height / (VIEW_AHEAD_M + VIEW_BEHIND_M)
        self.origin = np.array([self.width / 2.0, self.height - VIEW_BEHIND_M * self.px_per_m])
        self.reach = float(np.hypot(self.width / 2.0 / self.px_per_m, VIEW_AHEAD_M))  # the farthest point in view
        lines = [] if road is None else [*(road.lane_points(i) for i in range(len(road))), *road.boundaries]
        self.lanes = 0 if road is None else len(road)
        self.points = np.concatenate(lines) if lines else np.zeros((0, 2))
        self.owner = np.repeat(np.arange(len(lines)), [len(line) for line in lines])
        self._centre: np.ndarray | None = None
        self._kept = np.zeros(0, dtype=np.int64)

    def draw(self, pose: np.ndarray, route: np.ndarray | None) -> np.ndarray:
        """The picture ``[H, W, 3]`` uint8 of world ``pose`` ``(x, y, yaw)`` told ``route`` ``[K, 3]`` (None: no
        route)."""
        image = Image.new("RGB", (self.width, self.height), BACKGROUND)
        draw = ImageDraw.Draw(image)
        for run, owner in self._runs_in_view(pose):
            points = self._pixels(self._to_rig(self.points[run], pose))
            draw.line(points, fill=LANE_COLOR if owner < self.lanes else BOUNDARY_COLOR, width=1)
        if route is None or not np.isfinite(route).all():
            draw.text((4, 2), "no route", fill=ROUTE_COLOR)
        else:
            ahead = self._pixels(np.asarray(route, dtype=np.float64)[:, :2])
            draw.line([tuple(self.origin), *ahead], fill=ROUTE_COLOR, width=2)
            for u, v in ahead:
                draw.ellipse([u - 2, v - 2, u + 2, v + 2], fill=ROUTE_COLOR)
        u, v = self.origin
        size = max(3.0, 2.0 * self.px_per_m)
        draw.polygon([(u, v - 2 * size), (u - size, v + size), (u + size, v + size)], fill=RIG_COLOR)
        return np.asarray(image)

    def _runs_in_view(self, pose: np.ndarray) -> list[tuple[np.ndarray, int]]:
        """The stretches of the map's polylines within reach of ``pose``: (point indices, polyline)."""
        if not len(self.points):
            return []
        xy = np.asarray(pose[:2], dtype=np.float64)
        if self._centre is None or np.hypot(*(xy - self._centre)) > REFRESH_M:
            self._centre = xy
            self._kept = np.flatnonzero((np.abs(self.points - xy) <= self.reach + REFRESH_M).all(axis=1))
        near = self._kept[(np.abs(self.points[self._kept] - xy) <= self.reach).all(axis=1)]
        breaks = np.flatnonzero((np.diff(near) != 1) | (np.diff(self.owner[near]) != 0)) + 1
        return [(run, int(self.owner[run[0]])) for run in np.split(near, breaks) if len(run) > 1]

    @staticmethod
    def _to_rig(points: np.ndarray, pose: np.ndarray) -> np.ndarray:
        """World ``points`` ``[N, 2]`` → ``(forward, left)`` in the frame of ``pose``."""
        c, s = np.cos(pose[2]), np.sin(pose[2])
        d = points - np.asarray(pose[:2], dtype=np.float64)
        return np.stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1]], axis=-1)

    def _pixels(self, forward_left: np.ndarray) -> list[tuple[float, float]]:
        """``(forward, left)`` metres → ``(u, v)`` pixels: forward up, left to the left."""
        u = self.origin[0] - forward_left[:, 1] * self.px_per_m
        v = self.origin[1] - forward_left[:, 0] * self.px_per_m
        return list(zip(u.tolist(), v.tolist()))

"""A policy's plan as a tracked path: where along it the car should be at any time, and the pose there."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from terra.closedloop.plans import Plan
from terra.contract.actions import ACTION_TIMES

SUBSEGMENTS = 8  # path points per segment between two poses
EXTENSION_M = 1000.0  # the straight path beyond the last pose (further than any look-ahead goes in a forecast)
STILL_M = 1e-6  # a segment shorter than this stands still


@dataclass(frozen=True)
class TrackedPath:
    """The plan as a path: the poses at ``times`` (origin first) lie ``poses_along`` metres along it."""

    times: np.ndarray
    points: np.ndarray
    along: np.ndarray
    poses_along: np.ndarray
    speeds: np.ndarray
    yaws: np.ndarray

    @classmethod
    def from_plan(cls, plan: Plan) -> "TrackedPath":
        """The tracked path of ``plan`` (its values finite and in bounds: checked when it was built)."""
        if plan.actions is not None:
            times, poses = ACTION_TIMES.astype(np.float64), plan.actions[:, [1, 0]]
        else:
            times, poses = plan.times, plan.poses
        vertices = np.concatenate([np.zeros((1, 2)), poses[:, :2]])
        tangents = _headings(vertices)
        yaws = np.unwrap(tangents if poses.shape[1] == 2 else np.r_[0.0, poses[:, 2]])
        points = _hermite_path(vertices, tangents)
        along = np.r_[0.0, np.cumsum(np.hypot(*np.diff(points, axis=0).T))]
        first, ahead = along[SUBSEGMENTS], max(float(vertices[1] @ [np.cos(yaws[1]), np.sin(yaws[1])]), 0.0)
        along[: SUBSEGMENTS + 1] *= ahead / first if first > STILL_M else 1.0
        along[SUBSEGMENTS + 1:] += along[SUBSEGMENTS] - first
        beyond = points[-1] + EXTENSION_M * np.array([np.cos(yaws[-1]), np.sin(yaws[-1])])
        times, poses_along = np.r_[0.0, times], along[::SUBSEGMENTS]
        return cls(times, np.concatenate([points, beyond[None]]), np.r_[along, along[-1] + EXTENSION_M], poses_along,
                   _monotone_slopes(times, poses_along), yaws)

    @property
    def length_m(self) -> float:
        """The distance along the path to the plan's last pose."""
        return float(self.poses_along[-1])

    def progress(self, t: float) -> tuple[float, float, float]:
        """Distance along the path (m), speed (m/s) and acceleration (m/s^2) the plan has at time ``t``."""
        n = len(self.times) - 1
        last = float(self.poses_along[n])
        if t >= self.times[-1]:
            return last + float(self.speeds[-1]) * (t - float(self.times[-1])), float(self.speeds[-1]), 0.0
        k = min(max(bisect.bisect_right(self.times, t) - 1, 0), n - 1)
        t0, h = float(self.times[k]), float(self.times[k + 1] - self.times[k])
        s0, s1 = float(self.poses_along[k]), float(self.poses_along[k + 1])
        m0, m1 = float(self.speeds[k]) * h, float(self.speeds[k + 1]) * h
        u = (t - t0) / h
        s = s0 + m0 * u + (3 * (s1 - s0) - 2 * m0 - m1) * u * u + (2 * (s0 - s1) + m0 + m1) * u ** 3
        v = (m0 + 2 * (3 * (s1 - s0) - 2 * m0 - m1) * u + 3 * (2 * (s0 - s1) + m0 + m1) * u * u) / h
        a = (2 * (3 * (s1 - s0) - 2 * m0 - m1) + 6 * (2 * (s0 - s1) + m0 + m1) * u) / (h * h)
        return s, max(v, 0.0), a

    def point_at(self, s: float) -> np.ndarray:
        """The path's point ``[2]`` at distance ``s`` along it."""
        return np.array([np.interp(s, self.along, self.points[:, 0]), np.interp(s, self.along, self.points[:, 1])])

    def pose_at(self, t: float) -> np.ndarray:
        """Where the plan puts the car at time ``t``: ``[x, y, yaw]`` (the heading interpolated in time)."""
        s, _, _ = self.progress(t)
        return np.r_[self.point_at(s), np.interp(t, self.times, self.yaws)]

    def project(self, xy: np.ndarray, first: int, reach: float) -> tuple[float, int]:
        """Distance along the path of the point nearest ``xy`` within ``reach`` m after ``first``, and its segment."""
        last = bisect.bisect_right(self.along, float(self.along[first]) + reach, lo=first + 1)
        spans, lengths2 = self._segments
        start, span = self.points[first:last], spans[first:last]
        u = np.clip(((xy - start) * span).sum(-1) / lengths2[first:last], 0.0, 1.0)
        gap = xy - (start + u[:, None] * span)
        k = int(np.argmin((gap * gap).sum(-1)))
        return float(self.along[first + k] + u[k] * (self.along[first + k + 1] - self.along[first + k])), first + k

    @cached_property
    def _segments(self) -> tuple[np.ndarray, np.ndarray]:
        """Each path segment's span ``[K - 1, 2]`` and squared length (at least ``STILL_M ** 2``)."""
        spans = self.points[1:] - self.points[:-1]
        return spans, np.maximum((spans * spans).sum(-1), STILL_M ** 2)


def _headings(points: np.ndarray) -> np.ndarray:
    """Headings at points ``[N + 1, 2]`` led by the origin (heading 0 there): each pose's neighbour chord."""
    n = len(points) - 1
    if n == 1:
        return np.r_[0.0, _direction(points[1] - points[0], 0.0)]
    chords = np.diff(points, axis=0)
    headings = [0.0]
    for i in range(1, n + 1):
        if i == 1:
            heading = _end_direction(chords[1], chords[2] if n > 2 else None, headings[-1])
        elif i == n:
            heading = _end_direction(chords[n - 1], chords[n - 2] if n > 2 else None, headings[-1])
        else:
            heading = _direction(points[i + 1] - points[i - 1], headings[-1])
        headings.append(heading)
    return np.array(headings)


def _direction(chord: np.ndarray, otherwise: float) -> float:
    """The chord's direction, ``otherwise`` where it stands still."""
    dx, dy = float(chord[0]), float(chord[1])
    return math.atan2(dy, dx) if math.hypot(dx, dy) > STILL_M else otherwise


def _end_direction(chord: np.ndarray, inner: np.ndarray | None, otherwise: float) -> float:
    """The heading at the end of a path whose end chord is ``chord`` and the chord next to it ``inner``."""
    near = _direction(chord, otherwise)
    if inner is None or math.hypot(float(inner[0]), float(inner[1])) <= STILL_M:
        return near
    turn = near - math.atan2(float(inner[1]), float(inner[0]))
    return near + 0.5 * math.atan2(math.sin(turn), math.cos(turn))


def _hermite_path(vertices: np.ndarray, headings: np.ndarray) -> np.ndarray:
    """Points ``[SUBSEGMENTS * N + 1, 2]`` along cubic Hermite curves through ``vertices [N + 1, 2]``."""
    chord = np.hypot(*np.diff(vertices, axis=0).T)[:, None, None]
    tangent = np.stack([np.cos(headings), np.sin(headings)], axis=-1)[:, None, :]
    u = np.linspace(0.0, 1.0, SUBSEGMENTS, endpoint=False)[None, :, None]
    curve = ((2 * u ** 3 - 3 * u ** 2 + 1) * vertices[:-1, None] + (u ** 3 - 2 * u ** 2 + u) * chord * tangent[:-1]
             + (3 * u ** 2 - 2 * u ** 3) * vertices[1:, None] + (u ** 3 - u ** 2) * chord * tangent[1:])
    return np.concatenate([curve.reshape(-1, 2), vertices[-1:]])


def _monotone_slopes(times: np.ndarray, along: np.ndarray) -> np.ndarray:
    """Speeds at the poses for a monotone cubic Hermite timing: three-point slopes, limited (Fritsch-Carlson)."""
    h = np.diff(times)
    d = np.diff(along) / h
    if len(d) == 1:
        return np.r_[d, d]
    m = np.empty(len(times))
    m[1:-1] = (h[1:] * d[:-1] + h[:-1] * d[1:]) / (h[:-1] + h[1:])
    m[0] = d[0] - h[0] * (d[1] - d[0]) / (h[0] + h[1])
    m[-1] = d[-1] + h[-1] * (d[-1] - d[-2]) / (h[-2] + h[-1])
    m = np.maximum(m, 0.0).tolist()
    for k, dk in enumerate(d.tolist()):
        if dk <= 0.0:
            m[k] = m[k + 1] = 0.0
            continue
        size = math.hypot(m[k], m[k + 1]) / dk
        if size > 3.0:
            m[k] *= 3.0 / size
            m[k + 1] *= 3.0 / size
    return np.array(m)

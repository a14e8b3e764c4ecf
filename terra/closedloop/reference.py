"""A policy's plan as a reference the car can follow: its path, where along it the car should be at any time, and
the pose there.

The plan's poses (terra/closedloop/plans.py: ``[N, 2|3]`` at ``times``, or a ``[6, 3]`` action at the action
times) are led by the car's pose now, the origin at time 0:

* **path**: a smooth curve through them, by arc length: between two poses the cubic Hermite curve tangent to the
  path's heading at both (sampled at ``SUBSEGMENTS`` points), the heading at a pose being the direction of the chord
  from the pose before to the pose after (from the origin for the first pose; of the last segment at the end; where
  the path stands still, the heading before), which is exact on straight lines and circles. Beyond the last pose the
  path goes on straight along the last heading. A plan without headings (``[N, 2]``, actions) takes these.
* **timing**: the distance along the path as a function of time, a cubic Hermite curve through each pose's
  ``(time, distance)`` whose slopes (the speeds at the poses) are the three-point estimates, limited so that the
  distance never decreases (Fritsch and Carlson's monotone rule): exact for plans at constant acceleration, whatever
  their sampling, and the car never backs up along the path. Beyond the last pose the plan goes on at its last speed.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from terra.closedloop.plans import Plan
from terra.generation.actions import ACTION_TIMES, finite_array

SUBSEGMENTS = 8  # path points per segment between two poses
EXTENSION_M = 1000.0  # the straight path beyond the last pose (further than any look-ahead goes in a forecast)
STILL_M = 1e-6  # a segment shorter than this stands still


@dataclass(frozen=True)
class Reference:
    """The plan as a path (``points [K, 2]`` at ``along [K]`` metres, the last one on the straight extension) and a
    timing: the poses (the origin first) at ``times`` lie ``poses_along`` metres along it with ``speeds``; ``yaws``
    are their headings (unwrapped)."""

    times: np.ndarray
    points: np.ndarray
    along: np.ndarray
    poses_along: np.ndarray
    speeds: np.ndarray
    yaws: np.ndarray

    @classmethod
    def from_plan(cls, plan: Plan) -> "Reference":
        """The reference of ``plan``; a plan holding NaN or inf is refused with one line."""
        if plan.actions is not None:
            times, poses = ACTION_TIMES.astype(np.float64), plan.actions[:, [1, 0]]
        else:
            times, poses = plan.times, plan.poses
        poses = finite_array(poses, "plan poses")
        vertices = np.concatenate([np.zeros((1, 2)), poses[:, :2]])
        tangents = _headings(vertices)
        yaws = np.unwrap(tangents if poses.shape[1] == 2 else np.r_[0.0, poses[:, 2]])
        points = _hermite_path(vertices, tangents)
        along = np.r_[0.0, np.cumsum(np.hypot(*np.diff(points, axis=0).T))]
        ahead = points[-1] + EXTENSION_M * np.array([np.cos(yaws[-1]), np.sin(yaws[-1])])
        times, poses_along = np.r_[0.0, times], along[::SUBSEGMENTS]
        return cls(times, np.concatenate([points, ahead[None]]), np.r_[along, along[-1] + EXTENSION_M], poses_along,
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

    def project(self, xy: np.ndarray, first: int = 0) -> tuple[float, int]:
        """The distance along the path of the point nearest ``xy`` on segments ``first`` onwards, and its segment
        (the car only moves forward along its plan, so a path that crosses itself is not read backwards)."""
        start, end = self.points[first:-1], self.points[first + 1:]
        span = end - start
        length2 = (span * span).sum(-1)
        u = np.clip(((xy - start) * span).sum(-1) / np.maximum(length2, STILL_M ** 2), 0.0, 1.0)
        gap = xy - (start + u[:, None] * span)
        k = int(np.argmin((gap * gap).sum(-1)))
        return float(self.along[first + k] + u[k] * np.sqrt(length2[k])), first + k


def _headings(points: np.ndarray) -> np.ndarray:
    """Headings along a path of points ``[N + 1, 2]`` led by the origin (heading 0 there): the chord from the point
    before to the point after, the last segment at the end, the heading before where the path stands still."""
    chords = np.concatenate([points[2:] - points[:-2], points[-1:] - points[-2:-1]])
    headings = [0.0]
    for dx, dy in chords:
        headings.append(float(np.arctan2(dy, dx)) if np.hypot(dx, dy) > STILL_M else headings[-1])
    return np.array(headings)


def _hermite_path(vertices: np.ndarray, headings: np.ndarray) -> np.ndarray:
    """Points ``[SUBSEGMENTS * N + 1, 2]`` along the cubic Hermite curves between consecutive ``vertices [N + 1, 2]``,
    tangent to ``headings`` (tangents as long as the chord); every ``SUBSEGMENTS``-th point is a vertex."""
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
    m = np.maximum(m, 0.0)
    for k, dk in enumerate(d):
        if dk <= 0.0:
            m[k] = m[k + 1] = 0.0
            continue
        size = np.hypot(m[k], m[k + 1]) / dk
        if size > 3.0:
            m[k] *= 3.0 / size
            m[k + 1] *= 3.0 / size
    return m

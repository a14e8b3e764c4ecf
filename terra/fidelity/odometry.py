"""Weight-free visual odometry on the road plane: the ego motion between two consecutive frames of the front camera."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType
from typing import Any, Sequence

import numpy as np
from scipy import ndimage

from terra.fidelity.bilinear import Taps, interpolate, taps
from terra.sim.camera import CAMERA_HEIGHT_M, CAMERA_PITCH_RAD
from terra.sim.renderer import camera


@dataclass(frozen=True)
class Level:
    """One grid of the coarse-to-fine ladder: ``cell_x`` x ``cell_y`` m cells from ``near_m`` to ``far_m`` ahead,
    ``half_width_m`` to each side, blurred by ``blur_m``."""

    cell_x: float
    cell_y: float
    far_m: float
    half_width_m: float
    blur_m: float
    template_far_m: float
    iterations: int
    near_m: float = 3.3  # a little short of the nearest ground a 16:9 frame shows (3.36 m)


LEVELS = (Level(0.25, 0.25, 20.0, 8.0, 0.4, 14.0, 6), Level(0.1, 0.1, 17.0, 7.0, 0.15, 12.0, 4))
SEARCH_DX_M = np.arange(-1.0, 4.01, 0.25)  # the coarse search's forward motions (130 km/h is 3.6 m a frame)
SEARCH_DYAW_RAD = np.linspace(-0.08, 0.08, 5)
MIN_MATCH = 0.5  # normalised cross-correlation of the aligned grounds below which no motion is reported
MIN_OVERLAP = 0.2  # share of the later frame's ground cells that must stay in view of the earlier frame
MIN_TEXTURE = 0.5  # mean luminance gradient (levels per metre) below which the ground is uniform
MIN_SKY_LUMINANCE = 64.0  # mean luminance above the horizon: 127-148 in day scenes, 10-18 at night (30 scenes each)
HUBER = 1.345  # Huber's constant, in robust standard deviations of the residual
PHOTOMETRIC_PRIOR = 10.0  # prior standard deviation of each brightness parameter (levels; levels per metre)
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


@dataclass(frozen=True)
class Motion:
    """Planar motion between frames in the earlier ego frame (m, rad), its ``match`` (NCC) and ``cells`` compared."""

    dx: float
    dy: float
    dyaw: float
    match: float
    cells: int

    def as_array(self) -> np.ndarray:
        return np.array([self.dx, self.dy, self.dyaw])


def luminance(frame: np.ndarray) -> np.ndarray:
    """``[H, W]`` float32 luminance (0-255) of an ``[H, W, 3]`` RGB frame."""
    return np.asarray(frame, dtype=np.float32) @ LUMA


def optical_depth(forward: np.ndarray) -> np.ndarray:
    """Depth along the camera's optical axis of ground points ``forward`` metres ahead (as ``Camera.project``)."""
    return forward * np.cos(CAMERA_PITCH_RAD) + CAMERA_HEIGHT_M * np.sin(CAMERA_PITCH_RAD)


def se2(dx: float, dy: float, dyaw: float) -> np.ndarray:
    """The 3x3 homogeneous matrix of a planar motion."""
    c, s = np.cos(dyaw), np.sin(dyaw)
    return np.array([[c, -s, dx], [s, c, dy], [0.0, 0.0, 1.0]])


class BirdsEye:
    """A :class:`Level`'s ground grid for one image size: cell positions, cells seen, aligned ``points``."""

    def __init__(self, height: int, width: int, level: Level) -> None:
        cam = camera(height, width)
        self.level = level
        self.x0, self.y0 = level.near_m, -level.half_width_m
        xs = np.arange(level.near_m, level.far_m + 1e-9, level.cell_x)
        ys = np.arange(-level.half_width_m, level.half_width_m + 1e-9, level.cell_y)
        x, y = np.meshgrid(xs, ys, indexing="ij")
        u, v, depth = cam.project(x, y, np.zeros_like(x))
        col, row = u - 0.5, v - 0.5  # pixel j's centre lies at u = j + 0.5
        self.seen = (depth > 0.5) & (col >= 0) & (col <= width - 1) & (row >= cam.ground_row0 + 1) \
            & (row <= height - 1)
        self.pixels = taps((height, width), row[self.seen], col[self.seen])
        self.sigma = (level.blur_m / level.cell_x, level.blur_m / level.cell_y)
        self.weight = ndimage.gaussian_filter(self.seen.astype(np.float64), self.sigma)
        self.valid = self.weight > 0.98  # cells the blur did not mix with unseen ones
        inner = ndimage.binary_erosion(self.valid, np.ones((3, 3), bool))  # their gradient is valid too
        self.template = inner & (x <= level.template_far_m)
        self.points = np.stack([x[self.template], y[self.template]], -1)

    def image(self, grey: np.ndarray) -> np.ndarray:
        """The ground grid of luminance ``grey [H, W]``, blurred (normalised convolution); NaN where not valid."""
        grid = np.zeros(self.seen.shape)
        grid[self.seen] = interpolate(grey, self.pixels, 0.0).astype(grey.dtype)  # as map_coordinates returns it
        grid = ndimage.gaussian_filter(grid, self.sigma) / np.maximum(self.weight, 1e-9)
        return np.where(self.valid, grid, np.nan)

    def taps(self, x: Any, y: Any, xp: ModuleType = np) -> Taps:
        """The :class:`Taps` of ground points on this grid (numpy, or torch with ``xp=torch``)."""
        return taps(self.seen.shape, (x - self.x0) / self.level.cell_x, (y - self.y0) / self.level.cell_y, xp)


@lru_cache(maxsize=4)
def ladder(height: int, width: int) -> tuple[BirdsEye, ...]:
    """The grids of :data:`LEVELS` for an image size (cached: they depend on nothing else)."""
    return tuple(BirdsEye(height, width, level) for level in LEVELS)


def estimate_motion(before: np.ndarray, after: np.ndarray, min_match: float = MIN_MATCH,
                    min_sky_luminance: float = MIN_SKY_LUMINANCE) -> Motion | None:
    """The camera's planar motion from RGB ``before`` to ``after`` (``[H, W, 3]``), or None where it cannot be told."""
    before, after = np.asarray(before), np.asarray(after)
    if before.shape != after.shape or before.ndim != 3 or before.shape[2] != 3:
        raise ValueError(f"frames must be two [H, W, 3] images of one size (got {before.shape} and {after.shape})")
    return _motion(_Ground(before), _Ground(after), min_match, min_sky_luminance)


def estimate_motions(frames: np.ndarray, min_match: float = MIN_MATCH,
                     device: str | None = None) -> list[Motion | None]:
    """:func:`estimate_motion` from each of ``frames [T + 1, H, W, 3]`` to the next."""
    return estimate_series([frames], min_match, device)[0]


def estimate_series(series: Sequence[np.ndarray], min_match: float = MIN_MATCH,
                    device: str | None = None) -> list[list[Motion | None]]:
    """:func:`estimate_motions` of each of ``series`` (frame t of each at one pose), shared motions estimated once."""
    series = [np.asarray(frames) for frames in series]
    for frames in series:
        if frames.ndim != 4 or frames.shape[3] != 3 or len(frames) != len(series[0]):
            raise ValueError(f"frames must be [T + 1, H, W, 3] images, as many in each series (got {frames.shape})")
    sources = _pair_sources(series)
    steps = [(s, t, firsts) for s, rows in enumerate(sources) for t, (source, firsts) in enumerate(rows)
             if source == NEW]
    if device is None:
        new = _estimated_here(series, steps, min_match)
    else:
        from terra.fidelity.batched import estimate_steps

        new = estimate_steps(series, steps, min_match, device)
    motions: list[list[Motion | None]] = []
    for s, rows in enumerate(sources):
        motions.append([])
        for t, (source, earlier) in enumerate(rows):
            motions[s].append(new[(s, t)] if source == NEW else motions[earlier][t] if source == SHOWN
                              else motions[s][t - 1])
    return motions


NEW, SHOWN, AGAIN = "new", "shown", "again"  # a pair estimated, shown by an earlier series, the pair before again


def _pair_sources(series: Sequence[np.ndarray]) -> list[list[tuple[str, Any]]]:
    """Where each series' motion at each step comes from: ``(NEW, (k, k'))`` estimated, or ``(SHOWN, o)`` series o's."""
    sources = []
    for s, frames in enumerate(series):
        again = [t > 0 and frames[t].tobytes() == frames[t - 1].tobytes() for t in range(len(frames))]
        shown = [{o for o in range(s) if series[o][t].tobytes() == frames[t].tobytes()} for t in range(len(frames))]
        # the first frame of the run of equal frames each frame is in
        first = np.maximum.accumulate(np.where(again, 0, np.arange(len(frames)))).tolist()
        rows: list[tuple[str, Any]] = []
        for t in range(len(frames) - 1):
            earlier = shown[t] & shown[t + 1]
            rows.append((SHOWN, min(earlier)) if earlier else (AGAIN, None) if t and again[t] and again[t + 1]
                        else (NEW, (first[t], first[t + 1])))
        sources.append(rows)
    return sources


def _estimated_here(series: Sequence[np.ndarray], steps: Sequence[tuple[int, int, tuple[int, int]]],
                    min_match: float) -> dict[tuple[int, int], Motion | None]:
    """The motion of series s at step t between frames k and k' for each of ``steps``, in numpy, pair by pair."""
    found: dict[tuple[int, int], Motion | None] = {}
    grounds: dict[tuple[int, int], _Ground] = {}
    for s, t, firsts in steps:
        before, after = (grounds.get((s, k)) or _Ground(series[s][k]) for k in firsts)
        grounds = {(s, firsts[0]): before, (s, firsts[1]): after}
        found[(s, t)] = _motion(before, after, min_match, MIN_SKY_LUMINANCE)
    return found


class _Ground:
    """One frame's luminance, its sky's mean luminance and its ground grids, each made when first asked for."""

    def __init__(self, frame: np.ndarray) -> None:
        self.grey = luminance(frame)
        self.sky = self.grey[:camera(*frame.shape[:2]).ground_row0].mean()
        self.grids = ladder(*frame.shape[:2])
        self.images: dict[int, np.ndarray] = {}

    def image(self, level: int) -> np.ndarray:
        if level not in self.images:
            self.images[level] = self.grids[level].image(self.grey)
        return self.images[level]


def _motion(before: _Ground, after: _Ground, min_match: float, min_sky_luminance: float) -> Motion | None:
    """:func:`estimate_motion` between two frames' grounds."""
    if min(before.sky, after.sky) < min_sky_luminance:
        return None
    motion, fit = None, None
    for level, grid in enumerate(before.grids):
        earlier, later = before.image(level), after.image(level)
        if motion is None:
            motion = _search(grid, earlier, later[grid.template])
            if motion is None:
                return None
        fit = _align(grid, earlier, later, motion)
        if fit is None:
            return None
        motion = fit[0]
    motion, match, cells = fit
    if match < min_match:
        return None
    return Motion(float(motion[0, 2]), float(motion[1, 2]), float(np.arctan2(motion[1, 0], motion[0, 0])),
                  float(match), int(cells))


def _search(grid: BirdsEye, earlier: np.ndarray, template: np.ndarray, stride: int = 3) -> np.ndarray | None:
    """The coarse search's best forward motion and yaw, or None when no candidate keeps enough ground in view."""
    template = template[::stride]
    candidates, where = search_taps(grid, stride)
    values = interpolate(earlier, where, np.nan)
    seen = np.isfinite(values)
    count = seen.sum(1)
    if count.max() < MIN_OVERLAP * len(template):
        return None
    cost = np.where(seen, values - template, 0.0) ** 2
    cost = np.where(count >= MIN_OVERLAP * len(template), cost.sum(1) / np.maximum(count, 1), np.inf)
    return candidates[int(np.argmin(cost))]


@lru_cache(maxsize=8)
def search_taps(grid: BirdsEye, stride: int) -> tuple[np.ndarray, Taps]:
    """The coarse search's candidate motions ``[C, 3, 3]`` and their taps ``[C, P]`` of every ``stride``-th point."""
    points = grid.points[::stride]
    candidates = np.array([se2(dx, 0.0, yaw) for dx in SEARCH_DX_M for yaw in SEARCH_DYAW_RAD])
    rot, shift = candidates[:, :2, :2], candidates[:, :2, 2]
    x = rot[:, 0, 0, None] * points[:, 0] + rot[:, 0, 1, None] * points[:, 1] + shift[:, 0, None]
    y = rot[:, 1, 0, None] * points[:, 0] + rot[:, 1, 1, None] * points[:, 1] + shift[:, 1, None]
    return candidates, grid.taps(x, y)


def _align(grid: BirdsEye, earlier: np.ndarray, later: np.ndarray,
           motion: np.ndarray) -> tuple[np.ndarray, float, int] | None:
    """Inverse-compositional Gauss-Newton from ``motion``: the motion, the match and the cells compared, or None."""
    points = grid.points
    template = later[grid.template]
    grad_x, grad_y = (g[grid.template] for g in np.gradient(np.nan_to_num(later), grid.level.cell_x,
                                                           grid.level.cell_y))
    if np.mean(np.hypot(grad_x, grad_y)) < MIN_TEXTURE:
        return None
    # the design matrix: d template / d(dx, dy, dyaw) at the identity (the point moves by (1, 0), (0, 1), (-y, x)),
    # then minus the brightness model's (offset, gain x recession, offset x recession), filled in per iteration
    design = np.empty((len(points), 6))
    design[:, 0], design[:, 1], design[:, 2] = grad_x, grad_y, -grad_x * points[:, 1] + grad_y * points[:, 0]
    design[:, 3] = -1.0
    depth_after = optical_depth(points[:, 0])
    for _ in range(grid.level.iterations):
        values, moved_x, seen = _warp(grid, earlier, motion)
        if seen.sum() < MIN_OVERLAP * len(points):
            return None
        error = np.where(seen, values - template, 0.0)
        scale = 1.4826 * np.median(np.abs(error[seen])) + 1e-3
        weight = seen * np.minimum(1.0, HUBER * scale / np.maximum(np.abs(error), 1e-12))
        recede = np.where(seen, depth_after - optical_depth(moved_x), 0.0)  # the point's change of depth
        design[:, 4], design[:, 5] = -(np.where(seen, values, 0.0) / 255.0 * recede), -recede
        normal = (design * weight[:, None]).T @ design
        geometric = normal[:3, :3] * np.array([1.0, 1.0, 0.1])[:, None] * np.array([1.0, 1.0, 0.1])  # yaw at 10 m
        eigen = np.linalg.eigvalsh(geometric)
        if eigen[0] <= 1e-6 * max(eigen[-1], 1e-12):
            return None
        normal[3:, 3:] += np.eye(3) * scale**2 / PHOTOMETRIC_PRIOR**2
        solution = np.linalg.solve(normal, design.T @ (weight * error))
        motion = motion @ np.linalg.inv(se2(*solution[:3]))
        if abs(solution[0]) + abs(solution[1]) < 1e-4 and abs(solution[2]) < 1e-5:
            break
    values, _, seen = _warp(grid, earlier, motion)
    return motion, _correlation(values[seen], template[seen]), int(seen.sum())


def _warp(grid: BirdsEye, earlier: np.ndarray, motion: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The earlier frame's grid at the template's points moved by ``motion``; their forward distance; seen."""
    points = grid.points
    x = motion[0, 0] * points[:, 0] + motion[0, 1] * points[:, 1] + motion[0, 2]
    y = motion[1, 0] * points[:, 0] + motion[1, 1] * points[:, 1] + motion[1, 2]
    values = interpolate(earlier, grid.taps(x, y), np.nan)
    return values, x, np.isfinite(values)


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    spread = a.std() * b.std()
    return float(((a - a.mean()) * (b - b.mean())).mean() / spread) if spread > 0 else 0.0


def step_motions(poses: np.ndarray) -> np.ndarray:
    """``[T, 3]`` motions ``(dx, dy, dyaw)`` between world poses ``[T + 1, 3]``, in the earlier pose's ego frame."""
    poses = np.asarray(poses, dtype=np.float64)
    delta = poses[1:, :2] - poses[:-1, :2]
    c, s = np.cos(poses[:-1, 2]), np.sin(poses[:-1, 2])
    dyaw = np.angle(np.exp(1j * (poses[1:, 2] - poses[:-1, 2])))
    return np.stack([c * delta[:, 0] + s * delta[:, 1], -s * delta[:, 0] + c * delta[:, 1], dyaw], -1)

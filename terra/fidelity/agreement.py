"""A world's frames against the true renders at the same poses: what a detector reads, how close the pixels are, and
how late the world is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from terra.fidelity.lanes import find_lane
from terra.stats import Bootstrap, Clusters, Interval, cluster_interval, mean, within_slope
from terra.metrics import PSNR_CAP_DB, psnr, psnr_db, ssim

LOOKAHEAD_M = 10.0  # where the lane's lateral position is read
REPEATED = 0.1  # a frame that changed less than this share of the true frame's change repeats the one before
MOVING_M = 0.3  # a step that moves the car at least this far (3 m/s) is judged: a frame repeated, a motion off
HORIZONS = (1, 5, 10, 20)  # steps after the context at which frames are compared
MAX_LAG = 15  # the temporal lag searched, in steps either way (1.5 s)


def _check_pair(world: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    world, truth = np.asarray(world), np.asarray(truth)
    if world.shape != truth.shape or world.ndim != 4 or world.shape[-1] != 3:
        raise ValueError(f"world and true frames must both be [T, H, W, 3] of one shape (got {world.shape} and "
                         f"{truth.shape})")
    return world, truth


def lane_reading(frame: np.ndarray) -> float:
    """The lane centre's lateral offset (m, left positive) :data:`LOOKAHEAD_M` ahead in ``frame``; NaN: no lane."""
    lane = find_lane(frame)
    return float("nan") if lane is None else lane.lateral(LOOKAHEAD_M)


@dataclass(frozen=True)
class LaneAgreement:
    """One drive's lane readings per frame in the world's frames and in the true frames (NaN: no lane found)."""

    world: np.ndarray
    truth: np.ndarray

    @property
    def error(self) -> np.ndarray:
        """World minus truth per frame (NaN where either found no lane)."""
        return self.world - self.truth


def lane_agreement(world_frames: np.ndarray, true_frames: np.ndarray, device: str | None = None) -> LaneAgreement:
    """Lane readings of each world frame and the true frame at its pose (``device`` None: numpy, frame by frame)."""
    world_frames, true_frames = _check_pair(world_frames, true_frames)
    if device is not None:
        from terra.fidelity.batched import lane_readings

        return LaneAgreement(*(lane_readings(frames, LOOKAHEAD_M, device) for frames in (world_frames, true_frames)))
    return LaneAgreement(*(np.array([lane_reading(f) for f in frames]) for frames in (world_frames, true_frames)))


@dataclass(frozen=True)
class LaneSummary:
    """Across drives: the slope of the world's reading on the truth's within drives (each drive its own intercept)."""

    slope: Interval
    mean_abs_error_m: Interval
    found_world: Interval
    found_truth: Interval
    frames: int

    def as_dict(self) -> dict:
        return {key: value.as_dict() if isinstance(value, Interval) else value for key, value in self.__dict__.items()}


def lane_summary(drives: Sequence[LaneAgreement], clusters: Sequence[Hashable],
                 bootstrap: Bootstrap = Bootstrap()) -> LaneSummary:
    """:class:`LaneSummary` over the frames of ``drives``, resampling ``clusters`` (one label per drive)."""
    if len(drives) != len(clusters) or not drives:
        raise ValueError(f"one cluster label per drive ({len(drives)} drives, {len(clusters)} labels)")
    labels = [label for drive, label in zip(drives, clusters) for _ in range(len(drive.world))]
    drive_of = [i for i, drive in enumerate(drives) for _ in range(len(drive.world))]
    world = np.concatenate([drive.world for drive in drives])
    truth = np.concatenate([drive.truth for drive in drives])
    return LaneSummary(slope=within_slope(labels, drive_of, truth, world, bootstrap),
                       mean_abs_error_m=mean(labels, np.abs(world - truth), bootstrap),
                       found_world=mean(labels, np.isfinite(world).astype(float), bootstrap),
                       found_truth=mean(labels, np.isfinite(truth).astype(float), bootstrap), frames=len(labels))


def frame_fidelity(world_frames: np.ndarray, true_frames: np.ndarray, horizons: Sequence[int] = HORIZONS,
                   device: str | None = None) -> dict[int, dict[str, float]]:
    """PSNR (dB, capped at ``PSNR_CAP_DB``) and SSIM of world against true frame at each horizon the drive reaches."""
    world_frames, true_frames = _check_pair(world_frames, true_frames)
    reached = [h for h in horizons if 1 <= h <= len(world_frames)]
    if not reached:
        return {}
    index = [h - 1 for h in reached]
    if device is None:
        values = zip(psnr(world_frames[index], true_frames[index]), ssim(world_frames[index], true_frames[index]))
    else:
        from terra.fidelity.batched import psnr_ssim

        values = zip(*psnr_ssim(world_frames[index], true_frames[index], device))
    return {h: {"psnr_db": min(p, PSNR_CAP_DB), "ssim": s} for h, (p, s) in zip(reached, values)}


def horizon_summary(drives: Sequence[dict[int, dict[str, float]]], clusters: Sequence[Hashable],
                    bootstrap: Bootstrap = Bootstrap()) -> dict[int, dict[str, Interval]]:
    """Per horizon, mean PSNR and SSIM over the drives reaching it, with intervals over ``clusters``."""
    if len(drives) != len(clusters):
        raise ValueError(f"one cluster label per drive ({len(drives)} drives, {len(clusters)} labels)")
    return {h: {key: mean(clusters, np.array([drive[h][key] if h in drive else np.nan for drive in drives]), bootstrap)
                for key in ("psnr_db", "ssim")} for h in sorted({h for drive in drives for h in drive})}


@dataclass(frozen=True)
class Lag:
    """The lag (steps) where world frames best match true ones, and mean PSNR (dB) per lag: ``curve[lag + max_lag]``."""

    lag: int
    curve: np.ndarray

    @property
    def prominence_db(self) -> float:
        """How far the best lag stands above the median lag (dB); near 0 the lag means nothing."""
        return float(self.curve.max() - np.median(self.curve))

    @property
    def lags(self) -> np.ndarray:
        half = (len(self.curve) - 1) // 2
        return np.arange(-half, half + 1)


def temporal_lag(world_frames: np.ndarray, true_frames: np.ndarray, max_lag: int = MAX_LAG,
                 device: str | None = None) -> Lag:
    """The shift k maximising the mean PSNR of world frame t against true frame t - k; ties to the smallest |k|."""
    world_frames, true_frames = _check_pair(world_frames, true_frames)
    steps = len(world_frames)
    if 3 * (steps - max_lag) < steps:
        raise ValueError(f"a drive of {steps} frames is too short to search lags of up to {max_lag} steps "
                         f"(it needs {int(np.ceil(1.5 * max_lag))})")
    world, truth = world_frames.reshape(steps, -1), true_frames.reshape(steps, -1)
    if device is None:
        squares = _lagged_squares(world, truth, max_lag)
    else:
        from terra.fidelity.batched import lagged_squares

        squares = lagged_squares(world, truth, max_lag, device)
    curve = np.empty(2 * max_lag + 1)
    for k in range(-max_lag, max_lag + 1):
        first, last = max(k, 0), min(steps, steps + k)  # world frames t with a true frame t - k
        mse = squares[first:last, k + max_lag] / world.shape[1]
        curve[k + max_lag] = np.mean([min(psnr_db(float(m)), PSNR_CAP_DB) for m in mse])
    return Lag(int(_best_lags(curve[None], np.arange(-max_lag, max_lag + 1))[0]), curve)


def _lagged_squares(world: np.ndarray, truth: np.ndarray, max_lag: int, block: int = 32) -> np.ndarray:
    """``[T, 2 max_lag + 1]`` sums of squared differences of world frame t and true frame t - k (NaN: none)."""
    steps, pixels = world.shape
    out = np.full((steps, 2 * max_lag + 1), np.nan)
    lags = np.arange(-max_lag, max_lag + 1)
    world_block = np.empty((min(block, steps), pixels))
    truth_block = np.empty((min(block + 2 * max_lag, steps), pixels))
    for start in range(0, steps, block):
        stop = min(start + block, steps)
        low, high = max(start - max_lag, 0), min(stop + max_lag, steps)
        w, b = world_block[:stop - start], truth_block[:high - low]
        np.copyto(w, world[start:stop])
        np.copyto(b, truth[low:high])
        cross = w @ b.T
        t = np.arange(start, stop)[:, None]
        other = t - lags  # the true frame t - k
        have = (other >= 0) & (other < steps)
        rows, cols = np.nonzero(have)
        column = other[rows, cols] - low
        out[start + rows, cols] = (np.einsum("ij,ij->i", w, w)[rows] + np.einsum("ij,ij->i", b, b)[column]
                                   - 2.0 * cross[rows, column])
    return out


def _best_lags(curves: np.ndarray, lags: np.ndarray) -> np.ndarray:
    """Per row of ``curves [R, L]``, the lag of the highest value; ties to the smallest |lag|."""
    score = np.where(curves == curves.max(1, keepdims=True), -np.abs(lags), -np.inf)
    return lags[np.argmax(score, axis=1)].astype(float)


def lag_summary(lags: Sequence[Lag], clusters: Sequence[Hashable], bootstrap: Bootstrap = Bootstrap()) -> Interval:
    """The lag of the drives' mean PSNR curve, with its interval over ``clusters`` (one label per drive)."""
    if len(lags) != len(clusters) or not lags:
        raise ValueError(f"one cluster label per drive ({len(lags)} drives, {len(clusters)} labels)")
    if len({len(lag.curve) for lag in lags}) > 1:
        raise ValueError("the drives' lag curves differ in length: search every drive over the same lags")
    grouped = Clusters.of(clusters)
    sums = grouped.sums(np.stack([lag.curve for lag in lags]))
    counts = grouped.sums(np.ones(len(lags)))
    return cluster_interval(lambda w: _best_lags((w @ sums) / (w @ counts)[:, None], lags[0].lags), grouped,
                            bootstrap)


def frame_changes(frames: np.ndarray, device: str | None = None) -> np.ndarray:
    """``[T]`` mean squared difference (grey levels^2) of each of ``frames [T + 1, H, W, 3]`` from the one before."""
    if device is not None:
        from terra.fidelity.batched import frame_changes as changes

        return changes(frames, device)
    frames = np.asarray(frames, dtype=np.float32)
    return np.array([float(np.mean((b - a) ** 2)) for a, b in zip(frames[:-1], frames[1:])])


def repeated(world_change: np.ndarray, truth_change: np.ndarray, commanded_dx: np.ndarray) -> np.ndarray:
    """``[T]``: 1 where the car moved and the world's frame changed under :data:`REPEATED` x the true frame's change,
    0 where it changed more, NaN where the car did not move."""
    world, truth = np.asarray(world_change, float), np.asarray(truth_change, float)
    judged = (np.asarray(commanded_dx, float) > MOVING_M) & (truth > 0)
    return np.where(judged, (world < REPEATED * truth).astype(float), np.nan)

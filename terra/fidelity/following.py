"""Action following: does the world's video move the way the car was commanded to move?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from terra.fidelity.odometry import MIN_MATCH, Motion, estimate_series
from terra.stats import Bootstrap, Clusters, Interval, cluster_interval, mean, regression_slope

BLOCK_STEPS = 10  # a second at 10 Hz: the steps of a drive resampled together for one drive's intervals
COMPONENTS = {"dx": 0, "dyaw": 2}  # what is regressed: forward motion (m) and yaw (rad) per step


@dataclass(frozen=True)
class Following:
    """One drive's steps: ``commanded`` and ``recovered`` motions ``[T, 3]`` (dx, dy, dyaw; NaN where the odometry
    refused the frames) and the odometry's ``match [T]``."""

    commanded: np.ndarray
    recovered: np.ndarray
    match: np.ndarray
    reference: np.ndarray | None = None

    @property
    def recovered_share(self) -> float:
        """Share of the steps whose motion was recovered."""
        return float(np.isfinite(self.match).mean()) if len(self.match) else float("nan")


@dataclass(frozen=True)
class FollowingFit:
    """Gains and slopes of recovered on commanded ``dx`` and ``dyaw``, and the share recovered, with intervals."""

    gain: dict[str, Interval]
    slope: dict[str, Interval]
    recovered_share: Interval
    steps: int

    def as_dict(self) -> dict:
        return {"gain": {k: v.as_dict() for k, v in self.gain.items()},
                "slope": {k: v.as_dict() for k, v in self.slope.items()},
                "recovered_share": self.recovered_share.as_dict(), "steps": self.steps}


def recover(frames: np.ndarray, commanded: np.ndarray, min_match: float = MIN_MATCH,
            reference: np.ndarray | None = None, device: str | None = None) -> Following:
    """The motion recovered between consecutive ``frames [T + 1, H, W, 3]`` beside the ``commanded [T, 3]`` motions."""
    frames, commanded = np.asarray(frames), np.asarray(commanded, dtype=np.float64)
    if frames.ndim != 4 or commanded.shape != (len(frames) - 1, 3):
        raise ValueError(f"action following needs frames [T + 1, H, W, 3] and commanded motions [T, 3] "
                         f"(got {frames.shape} and {commanded.shape})")
    series = estimate_series([frames] if reference is None else [frames, np.asarray(reference)], min_match, device)
    match = np.array([np.nan if motion is None else motion.match for motion in series[0]])
    return Following(commanded, _motions(series[0]), match, None if reference is None else _motions(series[1]))


def _motions(found: Sequence[Motion | None]) -> np.ndarray:
    """``[T, 3]`` motions (dx, dy, dyaw), NaN where none was found."""
    return np.array([np.full(3, np.nan) if motion is None else motion.as_array() for motion in found]).reshape(-1, 3)


def following_slopes(drives: Sequence[Following], clusters: Sequence[Hashable],
                     bootstrap: Bootstrap = Bootstrap()) -> FollowingFit:
    """Gains and slopes over every step of ``drives``, resampling ``clusters`` (one label per drive)."""
    if len(drives) != len(clusters) or not drives:
        raise ValueError(f"one cluster label per drive ({len(drives)} drives, {len(clusters)} labels)")
    labels = [label for drive, label in zip(drives, clusters) for _ in range(len(drive.commanded))]
    commanded = np.concatenate([drive.commanded for drive in drives])
    recovered = np.concatenate([drive.recovered for drive in drives])
    reference = np.concatenate([drive.commanded if drive.reference is None else drive.reference for drive in drives])
    gain = {name: relative_gain(labels, commanded[:, k], recovered[:, k], reference[:, k], bootstrap)
            for name, k in COMPONENTS.items()}
    slope = {name: regression_slope(labels, commanded[:, k], recovered[:, k], True, bootstrap)
             for name, k in COMPONENTS.items()}
    return FollowingFit(gain, slope, mean(labels, np.isfinite(recovered[:, 0]).astype(float), bootstrap), len(labels))


def relative_gain(scenarios: Sequence[Hashable], commanded: np.ndarray, recovered: np.ndarray,
                  reference: np.ndarray, bootstrap: Bootstrap = Bootstrap()) -> Interval:
    """``sum(commanded * recovered) / sum(commanded * reference)`` over the steps where all three are known."""
    commanded, recovered, reference = (np.asarray(v, dtype=np.float64) for v in (commanded, recovered, reference))
    keep = np.isfinite(commanded) & np.isfinite(recovered) & np.isfinite(reference)
    clusters = Clusters.of(scenarios)
    x = np.where(keep, commanded, 0.0)
    sums = clusters.sums(np.stack([x * np.where(keep, recovered, 0.0), x * np.where(keep, reference, 0.0)], -1))

    def gain(weights: np.ndarray) -> np.ndarray:
        top, bottom = (weights @ sums).T
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(bottom > 0, top / np.where(bottom > 0, bottom, 1.0), np.nan)

    return cluster_interval(gain, clusters, bootstrap)


def action_following(frames: np.ndarray, commanded: np.ndarray,
                     bootstrap: Bootstrap = Bootstrap()) -> tuple[Following, FollowingFit]:
    """One drive's recovered and commanded motions, gains and slopes, with intervals over :data:`BLOCK_STEPS` blocks."""
    drive = recover(frames, commanded)
    blocks = [Following(*(part[i:i + BLOCK_STEPS] for part in (drive.commanded, drive.recovered, drive.match)))
              for i in range(0, len(drive.commanded), BLOCK_STEPS)]
    return drive, following_slopes(blocks, list(range(len(blocks))), bootstrap)

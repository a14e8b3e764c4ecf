"""The fidelity horizon: for how long a world's road stays the true road, as a survival curve over drives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from terra.fidelity.agreement import MOVING_M, LaneAgreement
from terra.fidelity.following import Following
from terra.stats import Bootstrap, Clusters, Interval, few_clusters_factor

DEPARTURE_LANE_M = 0.5  # the lane read 10 m ahead this far from the true frame's: the world's road is elsewhere
DEPARTURE_MOTION = 0.5  # forward motion recovered off the commanded one by this share of it
MOMENT_STEPS = 5  # departed frames in a row (0.5 s) that make a departure
STEP_S = 0.1  # a step at 10 Hz
QUANTILES = {"median": 0.5, "p10": 0.1}  # share of drives departed


def departed_frames(lanes: LaneAgreement, following: Following) -> np.ndarray:
    """``[T]`` bool: frames departed (lane off by :data:`DEPARTURE_LANE_M`, or motion by :data:`DEPARTURE_MOTION`)."""
    seen = np.isfinite(lanes.truth)
    with np.errstate(invalid="ignore"):
        lateral = seen & (~np.isfinite(lanes.world) | (np.abs(lanes.error) > DEPARTURE_LANE_M))
    reference = following.commanded if following.reference is None else following.reference
    known = np.isfinite(following.recovered[:, 0]) & np.isfinite(reference[:, 0])
    moved, expected, recovered, counted = (_trailing(np.where(known, values, 0.0)) for values in (
        following.commanded[:, 0], reference[:, 0], following.recovered[:, 0], known.astype(float)))
    motion = (counted > 0) & (moved > MOVING_M * counted) & (
        np.abs(recovered - expected) > DEPARTURE_MOTION * np.abs(expected))
    return lateral | motion


def _trailing(values: np.ndarray) -> np.ndarray:
    """Per step, the sum of ``values`` over it and the :data:`MOMENT_STEPS` - 1 steps before it."""
    return np.convolve(values, np.ones(MOMENT_STEPS))[:len(values)]


def departure_frame(departed: np.ndarray) -> int | None:
    """The first frame of the first :data:`MOMENT_STEPS` departed frames in a row (None: the drive never departs)."""
    ends = np.flatnonzero(_trailing(np.asarray(departed, dtype=float)) == MOMENT_STEPS) if len(departed) else []
    return int(ends[0]) - MOMENT_STEPS + 1 if len(ends) else None


@dataclass(frozen=True)
class DriveHorizon:
    """One drive: its frames measured and the frame its road departs at (None: it never does, censored)."""

    frames: int
    departure: int | None

    @property
    def seconds(self) -> float:
        """Its horizon: the departing frame's time after the last context frame, or the drive's length."""
        return STEP_S * (self.frames if self.departure is None else self.departure + 1)

    @property
    def departed(self) -> bool:
        return self.departure is not None


def drive_horizon(lanes: LaneAgreement, following: Following) -> DriveHorizon:
    """A drive's horizon from its lane readings and its action following (frame by frame, the same frames)."""
    if len(lanes.world) != len(following.commanded):
        raise ValueError(f"{len(lanes.world)} lane readings and {len(following.commanded)} steps: one each per frame")
    return DriveHorizon(len(lanes.world), departure_frame(departed_frames(lanes, following)))


@dataclass(frozen=True)
class Survival:
    """Drives' horizons as a survival curve (``curve``), its median and 10th percentile (s; ``inf``: not reached) with
    intervals over scenarios."""

    median: Interval
    p10: Interval
    curve: np.ndarray
    drives: int
    scenarios: int
    departed: int
    longest_s: float

    def as_dict(self) -> dict:
        return {"median_s": self.median.as_dict(), "p10_s": self.p10.as_dict(), "drives": self.drives,
                "scenarios": self.scenarios, "departed": self.departed, "longest_s": self.longest_s,
                "surviving": [round(float(v), 4) for v in self.curve]}


def survival(horizons: Sequence[DriveHorizon], scenarios: Sequence[Hashable],
             bootstrap: Bootstrap = Bootstrap()) -> Survival:
    """The Kaplan-Meier curve of ``horizons`` (one scenario label per drive), its median and 10th percentile with
    intervals over scenario resamplings."""
    if len(horizons) != len(scenarios) or not horizons:
        raise ValueError(f"one scenario label per drive ({len(horizons)} drives, {len(scenarios)} labels)")
    clusters = Clusters.of(scenarios)
    steps = max(h.frames for h in horizons)
    events, at_risk = np.zeros((len(horizons), steps)), np.zeros((len(horizons), steps))
    for i, h in enumerate(horizons):
        last = h.frames if h.departure is None else h.departure + 1  # frames at risk: those before and at departure
        at_risk[i, :last] = 1.0
        if h.departure is not None:
            events[i, h.departure] = 1.0
    deaths, risk = clusters.sums(events), clusters.sums(at_risk)  # [C, steps]

    def curves(weights: np.ndarray) -> np.ndarray:
        d, n = weights @ deaths, weights @ risk
        with np.errstate(divide="ignore", invalid="ignore"):
            hazard = np.where(n > 0, d / np.where(n > 0, n, 1.0), 0.0)
        return np.cumprod(1.0 - hazard, axis=1)  # [R, steps]: surviving after each step

    point = curves(np.ones((1, clusters.size)))
    replicates = curves(bootstrap.weights(clusters.size))
    factor = few_clusters_factor(clusters.size, bootstrap.level)
    found = {name: _quantile_interval(_times(point, q)[0], _times(replicates, q), factor, bootstrap.level)
             for name, q in QUANTILES.items()}
    return Survival(found["median"], found["p10"], point[0], len(horizons), clusters.size,
                    sum(h.departed for h in horizons), STEP_S * steps)


def _times(curves: np.ndarray, share: float) -> np.ndarray:
    """Per curve ``[R, steps]``, the time (s) after which at most ``1 - share`` survive (inf: never)."""
    reached = curves <= 1.0 - share + 1e-9
    first = np.argmax(reached, axis=1)
    return np.where(reached.any(axis=1), STEP_S * (first + 1), np.inf)


def _quantile_interval(estimate: float, replicates: np.ndarray, factor: float, level: float) -> Interval:
    """The percentile interval of quantile ``replicates`` (inf kept), each finite side widened by ``factor``."""
    tail = (1.0 - level) / 2
    low, high = np.quantile(replicates, [tail, 1.0 - tail], method="inverted_cdf")
    if not np.isfinite(factor):
        return Interval(float(estimate), float("nan"), float("nan"), level)
    if np.isfinite(estimate):
        low = max(STEP_S, estimate - factor * (estimate - low))
        high = estimate + factor * (high - estimate) if np.isfinite(high) else high
    return Interval(float(estimate), float(low), float(high), level)


def shown_seconds(value: float, longest_s: float) -> str:
    """A horizon in seconds as the report writes it; ``inf`` shown as at least the longest drive."""
    return f">= {longest_s:g} s" if not np.isfinite(value) else f"{value:.1f} s"


def horizon_text(found: Survival) -> str:
    """``median [low, high]`` and the 10th percentile, in seconds, with the drives they rest on."""
    def part(value: Interval) -> str:
        bounds = ", ".join(shown_seconds(v, found.longest_s) for v in (value.low, value.high))
        return f"{shown_seconds(value.estimate, found.longest_s)} [{bounds}]"
    return (f"median {part(found.median)}, 10th percentile {part(found.p10)} ({found.departed} of {found.drives} "
            f"drives departed, {found.scenarios} scenarios)")

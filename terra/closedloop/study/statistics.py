"""The fidelity verdict's statistics: each one's measure on paired drives, band and what it rests on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import numpy as np

from terra.closedloop.policies.builtin import NO_PIXELS, PROBE_POLICIES
from terra.closedloop.outcomes.frames import read_changes, read_following, read_lag, read_lanes
from terra.fidelity.agreement import Lag, lag_summary, lane_summary, repeated
from terra.fidelity.following import following_slopes
from terra.stats import (
    Bootstrap, DriveValues, Interval, mean, paired_difference, policies_median_difference, rank_agreement,
)

MIN_LAG_PROMINENCE_DB = 1.0  # a flatter mean lag curve has no lag
RANK_METRIC = "mean_abs_lane_offset_m"  # truth: the policies ranked by it in both worlds
FRAMES, OUTCOMES = "every drive", "pixel policies"  # what a statistic rests on (Statistic.rests_on)
NO_LANE = "no frame of the world shows a lane where the true frame does"


class Undefined(Exception):
    """A statistic without a value, and why (the report's reason for its ``n/a``)."""


@dataclass(frozen=True)
class Pair:
    """A drive in the judged world and the same drive (scenario, policy, seed) in the true world."""

    world: dict
    truth: dict

    @property
    def scenario(self) -> Hashable:
        return self.world["scenario"]

    @property
    def policy(self) -> str:
        return self.world["policy"]


def outcome_policies(pairs: Sequence[Pair]) -> list[str]:
    """The policies an outcome statistic rests on: those that read pixels, probes left out."""
    names = dict.fromkeys(p.policy for p in pairs)
    return [name for name in names if name not in NO_PIXELS and name not in PROBE_POLICIES]


def undefined(bootstrap: Bootstrap) -> Interval:
    """An interval without a value."""
    return Interval(float("nan"), float("nan"), float("nan"), bootstrap.level, 1.0)


def value_or_reason(compute: Callable[[Sequence[Pair], Bootstrap], Interval], pairs: Sequence[Pair],
                    bootstrap: Bootstrap) -> tuple[Interval, str | None]:
    """``(value, None)`` of ``compute`` on ``pairs``, or the interval without a value and why (:class:`Undefined`)."""
    try:
        return compute(pairs, bootstrap), None
    except Undefined as why:
        return undefined(bootstrap), str(why)


def defined(value: Interval, why: str) -> Interval:
    """``value``, or :class:`Undefined` for ``why`` where it has no estimate."""
    if not np.isfinite(value.estimate):
        raise Undefined(why)
    return value


def _followed(pairs: Sequence[Pair], bootstrap: Bootstrap):
    return following_slopes([read_following(p.world["fidelity"]) for p in pairs], [p.scenario for p in pairs],
                            bootstrap)


def following_gain(component: str) -> Callable[[Sequence[Pair], Bootstrap], Interval]:
    """The gain of the motion recovered from the world's frames, with its interval over scenarios."""
    def statistic(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
        return defined(_followed(pairs, bootstrap).gain[component],
                       "no step's motion was recovered from the world's frames" if component == "dx" else
                       "no step both turned and had its motion recovered from the world's frames")
    return statistic


def _repeated(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
    """Share of moving steps whose world frame changed less than a tenth as much as the reference frame."""
    labels, shares = [], [np.zeros(0)]
    for p in pairs:
        changes = read_changes(p.world["fidelity"])
        if changes is None:
            continue
        commanded = read_following(p.world["fidelity"]).commanded[:, 0]
        shares.append(repeated(*changes, commanded))
        labels += [p.scenario] * len(commanded)
    return defined(mean(labels, np.concatenate(shares), bootstrap),
                   "no step moved the car while the true frame changed (or the records predate the measure)")


def _lane_slope(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
    return defined(lane_summary([read_lanes(p.world["fidelity"]) for p in pairs], [p.scenario for p in pairs],
                                bootstrap).slope, NO_LANE)


def _lane_error(size: Callable[[np.ndarray], np.ndarray]) -> Callable[[Sequence[Pair], Bootstrap], Interval]:
    """Mean ``size(error)`` (m) of the lane read 10 m ahead in the world's frames against the true frames."""
    def statistic(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
        labels, errors = [], []
        for p in pairs:
            lanes = read_lanes(p.world["fidelity"])
            labels += [p.scenario] * len(lanes.world)
            errors.append(size(lanes.error))
        return defined(mean(labels, np.concatenate(errors), bootstrap), NO_LANE)
    return statistic


def _lanes_found(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
    """The share of frames with a lane in the world's frames less the share in the true frames at the same poses."""
    world = [np.isfinite(read_lanes(p.world["fidelity"]).world).mean() for p in pairs]
    truth = [np.isfinite(read_lanes(p.world["fidelity"]).truth).mean() for p in pairs]
    return paired_difference([p.scenario for p in pairs], np.array(world), np.array(truth), bootstrap)


def _lag(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
    """The lag of the drives' mean PSNR curve."""
    kept = [(p.scenario, read_lag(p.world["fidelity"])) for p in pairs]
    kept = [(s, lag) for s, lag in kept if lag is not None]
    if not kept:
        raise Undefined("no drive is long enough to search its lag (23 steps)")
    if Lag(0, np.mean([lag.curve for _, lag in kept], axis=0)).prominence_db < MIN_LAG_PROMINENCE_DB:
        raise Undefined("no moment of the drives matches the world's frames better than another (e.g. a still or "
                        "blank video)")
    return lag_summary([lag for _, lag in kept], [s for s, _ in kept], bootstrap)


def paired_values(pairs: Sequence[Pair], block: str, metric: str) -> list[np.ndarray]:
    """Each pair's ``metrics[block][metric]`` in the world, then in truth (NaN: none)."""
    return [np.array([(getattr(p, side).get("metrics", {}).get(block) or {}).get(metric) for p in pairs],
                     dtype=np.float64) for side in ("world", "truth")]


def _outcome(block: str, metric: str, scale: float = 1.0) -> Callable[[Sequence[Pair], Bootstrap], Interval]:
    """Median over policies of each one's mean world - truth of a metric (times ``scale``), with its interval."""
    def statistic(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
        world, truth = (values * scale for values in paired_values(pairs, block, metric))
        found = policies_median_difference([p.scenario for p in pairs], [p.policy for p in pairs], world, truth,
                                           bootstrap)
        return defined(found, f"no drive records {block}.{metric} in both worlds")
    return statistic


def finite_mean(values: np.ndarray) -> float:
    """The mean of the finite ``values`` (NaN: none)."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else float("nan")


def ranked_values(pairs: Sequence[Pair]) -> list[DriveValues]:
    """The world's and the truth's per-drive :data:`RANK_METRIC` of the outcome policies' drives."""
    return [DriveValues([p.scenario for p in pairs], [p.policy for p in pairs], values)
            for values in paired_values(pairs, "truth", RANK_METRIC)]


def _ranking(coefficient: str) -> Callable[[Sequence[Pair], Bootstrap], Interval]:
    """Ranking statistic of the policies' mean :data:`RANK_METRIC` in the world against truth."""
    def statistic(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
        if len({p.policy for p in pairs}) < 3:
            raise Undefined("fewer than 3 pixel policies to rank (policies that read no pixels and probes are left "
                            "out)")
        return defined(getattr(rank_agreement(*ranked_values(pairs), bootstrap), coefficient),
                       f"the policies' mean {RANK_METRIC} all tie in the world or in truth")
    return statistic


@dataclass(frozen=True)
class Statistic:
    """A statistic of a world's paired drives with its acceptance band for a faithful world."""

    name: str
    band: tuple[float, float]
    compute: Callable[[Sequence[Pair], Bootstrap], Interval]
    meaning: str
    rests_on: str = FRAMES
    limits: tuple[float, float] = (-np.inf, np.inf)
    cut: bool = True


OUTCOME_BAND = (-0.1, 0.1)
STATISTICS = (
    Statistic("following_gain_dx", (0.95, 1.05), following_gain("dx"),
              "forward motion recovered from the world's frames / from the true frames at the same poses, on the "
              "commanded (1: the video moves as the car; 0.9: 10 % too slow)"),
    Statistic("following_gain_dyaw", (0.9, 1.1), following_gain("dyaw"),
              "yaw recovered from the world's frames / from the true frames (-1: mirrored; 0: ignores steering; "
              "0.85: turns 15 % too little)"),
    Statistic("motion_recovered", (0.5, 1.0), lambda pairs, boot: _followed(pairs, boot).recovered_share,
              "share of steps whose motion the road-plane odometry recovers (0: no ground to see)", limits=(0.0, 1.0)),
    Statistic("repeated_frames", (0.0, 0.05), _repeated,
              "share of the steps that move the car (3 m/s or more) whose frame changed less than a tenth as much as "
              "the true frame did (0.2: every fifth frame repeated; 1: frozen)", limits=(0.0, 1.0)),
    Statistic("lane_slope", (0.8, 1.2), _lane_slope,
              "the lane read 10 m ahead in the world's frame regressed on the true frame's, within drives"),
    Statistic("lane_reading_bias_m", (-0.1, 0.1), _lane_error(np.asarray),
              "the lane read 10 m ahead, world's frame - true frame at the same pose, signed (a shifted viewpoint)"),
    Statistic("lane_error_10m_m", (0.0, 0.25), _lane_error(np.abs),
              "the same, absolute: how far the world draws the lane from where it is (a shaking camera)",
              limits=(0.0, np.inf)),
    Statistic("lanes_found_difference", (-0.2, 0.2), _lanes_found,
              "share of frames with a lane found, world - truth at the same poses", limits=(-1.0, 1.0)),
    Statistic("lag_steps", (-1.0, 1.0), _lag, "steps by which the world's frames trail the true ones (10: 1 s late)",
              cut=False),
    Statistic("lateral_bias_m", OUTCOME_BAND, _outcome("truth", "mean_lane_offset_m"),
              "mean signed lane offset (left +) in the world - in truth: the median over the policies of each "
              "one's mean over its paired drives (where the world puts the car)", OUTCOMES),
    Statistic("heading_bias_deg", (-1.0, 1.0), _outcome("truth", "mean_heading_error_rad", float(np.degrees(1.0))),
              "mean heading against the road (left +) in the world - in truth, the policies' median", OUTCOMES),
    Statistic("time_in_lane_difference", OUTCOME_BAND, _outcome("truth", "time_in_lane"),
              "time in lane in the world - in truth, the policies' median", OUTCOMES, (-1.0, 1.0)),
    Statistic("off_road_difference", OUTCOME_BAND, _outcome("truth", "off_road"),
              "share of drives off road in the world - in truth, the policies' median", OUTCOMES, (-1.0, 1.0)),
    Statistic("scene_score_difference", OUTCOME_BAND, _outcome("alpasim", "score"),
              "AlpaSim's scene score in the world - in truth, the policies' median", OUTCOMES, (-1.0, 1.0),
              cut=False),
    Statistic("pearson_r", (0.7, 1.0), _ranking("pearson_r"),
              f"Pearson's r of the policies' mean {RANK_METRIC}, world against truth", OUTCOMES, (-1.0, 1.0)),
    Statistic("mmrv", (0.0, 0.15), _ranking("mmrv"),
              "mean maximum rank violation: per policy the largest true gap between it and a policy the world "
              "orders wrongly against it, averaged, as a share of the true spread (0: no violation)", OUTCOMES,
              (0.0, 1.0)),
)


def statistic(name: str) -> Statistic:
    """The statistic of :data:`STATISTICS` named ``name``."""
    return next(s for s in STATISTICS if s.name == name)

KENDALL_TAU = Statistic("kendall_tau", (-1.0, 1.0), _ranking("kendall_tau"),
                        f"Kendall's tau-b of the policies' mean {RANK_METRIC}, world against truth (measured, not "
                        "judged)", OUTCOMES, (-1.0, 1.0))

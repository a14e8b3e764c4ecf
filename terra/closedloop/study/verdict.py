"""The fidelity verdict: is a world a simulator of the true world? Judged per statistic, with intervals, for the
world model and for worlds known to be wrong (terra/closedloop/study/control_worlds.py), so the verdict is seen to fail.

Every world drives the same drives (scenario x policy x seed) as the true world. From the drives' records
(terra/closedloop/recording/files.py; the per-drive measurements of terra/closedloop/outcomes/frames.py), each
statistic of :data:`STATISTICS` is an estimate with a 95 % cluster-bootstrap interval over scenarios
(terra/stats.py), widened for the number of scenarios it rests on (``few_clusters_factor``), and a decision against
its acceptance band: ``pass`` (inside), ``fail`` (entirely outside), ``inconclusive`` (it straddles an edge, or has
no value: the reason is kept) or ``too few scenarios`` (fewer than :data:`MIN_SCENARIOS`: not decided). A world is
**flagged** when a statistic fails, **passed** when every one passes, **undecided** otherwise. A statistic
**separates** the model from a control when it passes the model and fails the control.

The frame statistics (following, lanes, lag) rest on every drive of the world; the outcome statistics (lateral and
heading bias, paired outcomes, the ranking by :data:`RANK_METRIC`, which spreads the policies) on the pixel
policies' alone (:func:`outcome_policies`: a policy that reads no pixels drives alike in any world; a probe such as
``brake_hard`` is judged apart, terra/closedloop/study/report.py). Measured, judged by nothing: the distance between
the world's and the truth's paths, PSNR and SSIM at 1, 5, 10 and 20 steps (a frozen video can match the true frames
as well as a world model does), and world - truth on paired drives of every metric a drive records. No statistic
sees what is beyond the lane and the ground's motion (other road users, lighting).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Hashable, Sequence

import numpy as np

from terra.closedloop.drivers.builtin import NO_PIXELS, PROBE_POLICIES
from terra.closedloop.outcomes.frames import read_following, read_horizons, read_lag, read_lanes
from terra.fidelity.agreement import Lag, horizon_summary, lag_summary, lane_summary
from terra.fidelity.following import following_slopes
from terra.stats import (
    FAIL, INCONCLUSIVE, PASS, Bootstrap, DriveValues, Interval, decide, few_clusters_factor, mean, paired_difference,
    rank_agreement, widened,
)

TOO_FEW = "too few scenarios"  # a fourth decision: below MIN_SCENARIOS nothing is decided
MIN_SCENARIOS = 4  # fewer scenarios under a statistic leave it undecided, whatever its interval
MIN_LAG_PROMINENCE_DB = 1.0  # a flatter mean lag curve has no lag (terra/fidelity/agreement.py, Lag.prominence_db)
RANK_METRIC = "mean_abs_lane_offset_m"  # terra/closedloop/outcomes/truth.py: the policies ranked by it in both worlds
TIE = 5e-4  # two policies whose true means differ by less tie (the tables' precision)
PAIRED = {  # per-drive outcomes compared world - truth on paired drives: (metrics block, metric) and the band
    "time_in_lane": (("truth", "time_in_lane"), (-0.1, 0.1)),  # terra/closedloop/outcomes/truth.py
    "off_road": (("truth", "off_road"), (-0.1, 0.1)),
    "scene_score": (("alpasim", "score"), (-0.1, 0.1)),  # terra/closedloop/outcomes/alpasim.py
}
METRIC_BLOCKS = ("truth", "alpasim", "progress", "history_comfort", "extended_comfort")  # record.py, metrics_of
NOT_OUTCOMES = ("first_collision_frame",)  # an index, not a quantity: no difference taken
FRAMES, OUTCOMES = "every drive", "pixel policies"  # what a statistic rests on (Statistic.rests_on)


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


def outcome_policies(pairs: Sequence[Pair]) -> list[str]:
    """The policies an outcome statistic rests on: those that read pixels, probes left out."""
    names = dict.fromkeys(p.world["policy"] for p in pairs)
    return [name for name in names if name not in NO_PIXELS and name not in PROBE_POLICIES]


def _followed(pairs: Sequence[Pair], bootstrap: Bootstrap):
    return following_slopes([read_following(p.world["fidelity"]) for p in pairs], [p.scenario for p in pairs],
                            bootstrap)


def following_gain(component: str) -> Callable[[Sequence[Pair], Bootstrap], Interval]:
    """The gain of the motion recovered from the world's frames on the commanded motion (``dx`` or ``dyaw``:
    terra/fidelity/following.py) over some paired drives, with its interval over their scenarios."""
    def statistic(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
        gain = _followed(pairs, bootstrap).gain[component]
        if not np.isfinite(gain.estimate):
            raise Undefined("no step's motion was recovered from the world's frames" if component == "dx" else
                            "no step both turned and had its motion recovered from the world's frames")
        return gain
    return statistic


def _lane_slope(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
    slope = lane_summary([read_lanes(p.world["fidelity"]) for p in pairs], [p.scenario for p in pairs],
                         bootstrap).slope
    if not np.isfinite(slope.estimate):
        raise Undefined("no frame of the world shows a lane where the true frame does")
    return slope


def _lane_error(size: Callable[[np.ndarray], np.ndarray]) -> Callable[[Sequence[Pair], Bootstrap], Interval]:
    """The mean of ``size(error)`` (m) of the lane read 10 m ahead in the world's frames against the true frames at
    the same poses, over every frame of the drives: signed (where the world draws the lane) or absolute (how far)."""
    def statistic(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
        labels, errors = [], []
        for p in pairs:
            lanes = read_lanes(p.world["fidelity"])
            labels += [p.scenario] * len(lanes.world)
            errors.append(size(lanes.error))
        found = mean(labels, np.concatenate(errors), bootstrap)
        if not np.isfinite(found.estimate):
            raise Undefined("no frame of the world shows a lane where the true frame does")
        return found
    return statistic


def _lanes_found(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
    """The share of frames with a lane in the world's frames less the share in the true frames at the same poses."""
    world = [np.isfinite(read_lanes(p.world["fidelity"]).world).mean() for p in pairs]
    truth = [np.isfinite(read_lanes(p.world["fidelity"]).truth).mean() for p in pairs]
    return paired_difference([p.scenario for p in pairs], np.array(world), np.array(truth), bootstrap)


def _lag(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
    """The lag of the drives' mean PSNR curve; undefined when no drive is long enough or the mean curve is flat
    (its best lag stands less than :data:`MIN_LAG_PROMINENCE_DB` above its median: a frozen or gray world, where any
    lag matches as well as any other)."""
    kept = [(p.scenario, read_lag(p.world["fidelity"])) for p in pairs]
    kept = [(s, lag) for s, lag in kept if lag is not None]
    if not kept:
        raise Undefined("no drive is long enough to search its lag (23 steps)")
    if Lag(0, np.mean([lag.curve for _, lag in kept], axis=0)).prominence_db < MIN_LAG_PROMINENCE_DB:
        raise Undefined("no moment of the drives matches the world's frames better than another (e.g. a still or "
                        "blank video)")
    return lag_summary([lag for _, lag in kept], [s for s, _ in kept], bootstrap)


def _undefined(bootstrap: Bootstrap) -> Interval:
    return Interval(float("nan"), float("nan"), float("nan"), bootstrap.level, 1.0)


def metric_value(record: dict, block: str, metric: str) -> float:
    """A drive's metric (NaN when it has none): ``metrics[block][metric]`` of its record."""
    value = (record.get("metrics", {}).get(block) or {}).get(metric)
    return float("nan") if value is None else float(value)


def _paired(block: str, metric: str, scale: float = 1.0) -> Callable[[Sequence[Pair], Bootstrap], Interval]:
    """The mean world - truth of a metric over paired drives (times ``scale``), with its interval."""
    def statistic(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
        world = np.array([metric_value(p.world, block, metric) for p in pairs]) * scale
        truth = np.array([metric_value(p.truth, block, metric) for p in pairs]) * scale
        found = paired_difference([p.scenario for p in pairs], world, truth, bootstrap)
        if not np.isfinite(found.estimate):
            raise Undefined(f"no drive records {block}.{metric} in both worlds")
        return found
    return statistic


def ranked_values(pairs: Sequence[Pair]) -> list[DriveValues]:
    """The world's and the truth's per-drive :data:`RANK_METRIC` of the outcome policies' drives."""
    return [DriveValues([p.scenario for p in pairs], [p.world["policy"] for p in pairs],
                        np.array([metric_value(getattr(p, side), "truth", RANK_METRIC) for p in pairs]))
            for side in ("world", "truth")]


def _ranking(coefficient: str) -> Callable[[Sequence[Pair], Bootstrap], Interval]:
    """A ranking statistic (``kendall_tau``, ``pearson_r`` or ``mmrv`` of terra/stats.py's ``RankAgreement``) of
    the policies' mean :data:`RANK_METRIC` in the world against in truth; undefined with fewer than 3 policies or
    means that all tie."""
    def statistic(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
        if len({p.world["policy"] for p in pairs}) < 3:
            raise Undefined("fewer than 3 pixel policies to rank (policies that read no pixels and probes are left "
                            "out)")
        found = getattr(rank_agreement(*ranked_values(pairs), bootstrap), coefficient)
        if not np.isfinite(found.estimate):
            raise Undefined(f"the policies' mean {RANK_METRIC} all tie in the world or in truth")
        return found
    return statistic


@dataclass(frozen=True)
class Statistic:
    """A statistic of a world's paired drives, its acceptance band for a faithful world, what it shows, the drives
    it rests on (:data:`FRAMES` or :data:`OUTCOMES`) and the range its values can take (the widened interval is
    kept inside it)."""

    name: str
    band: tuple[float, float]
    compute: Callable[[Sequence[Pair], Bootstrap], Interval]
    meaning: str
    rests_on: str = FRAMES
    limits: tuple[float, float] = (-np.inf, np.inf)


STATISTICS = (
    Statistic("following_gain_dx", (0.9, 1.1), following_gain("dx"),
              "forward motion recovered from the frames / commanded (1: the video moves as the car; 1.15: 15 % too "
              "fast)"),
    Statistic("following_gain_dyaw", (0.8, 1.2), following_gain("dyaw"),
              "yaw recovered from the frames / commanded (-1: mirrored; 0: ignores steering)"),
    Statistic("motion_recovered", (0.5, 1.0), lambda pairs, boot: _followed(pairs, boot).recovered_share,
              "share of steps whose motion the road-plane odometry recovers (0: no ground to see)", limits=(0.0, 1.0)),
    Statistic("lane_slope", (0.8, 1.2), _lane_slope,
              "the lane read 10 m ahead in the world's frame regressed on the true frame's, within drives"),
    Statistic("lane_reading_bias_m", (-0.1, 0.1), _lane_error(np.asarray),
              "the lane read 10 m ahead, world's frame - true frame at the same pose, signed (a shifted viewpoint)"),
    Statistic("lane_error_10m_m", (0.0, 0.25), _lane_error(np.abs),
              "the same, absolute: how far the world draws the lane from where it is (a shaking camera)",
              limits=(0.0, np.inf)),
    Statistic("lanes_found_difference", (-0.2, 0.2), _lanes_found,
              "share of frames with a lane found, world - truth at the same poses", limits=(-1.0, 1.0)),
    Statistic("lag_steps", (-1.0, 1.0), _lag, "steps by which the world's frames trail the true ones (10: 1 s late)"),
    Statistic("lateral_bias_m", (-0.1, 0.1), _paired("truth", "mean_lane_offset_m"),
              "mean signed lane offset (left +) in the world - in truth, paired drives: where the world puts the car",
              OUTCOMES),
    Statistic("heading_bias_deg", (-1.0, 1.0), _paired("truth", "mean_heading_error_rad", float(np.degrees(1.0))),
              "mean heading against the road (left +) in the world - in truth, paired drives", OUTCOMES),
    *(Statistic(f"{name}_difference", band, _paired(*source), f"{name} in the world - in truth, paired drives",
                OUTCOMES, (-1.0, 1.0)) for name, (source, band) in PAIRED.items()),
    Statistic("kendall_tau", (0.5, 1.0), _ranking("kendall_tau"),
              f"policies ranked by their mean {RANK_METRIC} in the world against in truth (Kendall's tau-b)",
              OUTCOMES, (-1.0, 1.0)),
    Statistic("pearson_r", (0.7, 1.0), _ranking("pearson_r"),
              f"Pearson's r of the policies' mean {RANK_METRIC}, world against truth", OUTCOMES, (-1.0, 1.0)),
    Statistic("mmrv", (0.0, 0.15), _ranking("mmrv"),
              "mean maximum rank violation: per policy the largest true gap between it and a policy the world "
              "orders wrongly against it, averaged, as a share of the true spread (0: no violation)", OUTCOMES,
              (0.0, 1.0)),
)


def path_distance_m(pair: Pair) -> float:
    """The mean distance (m) between the world's and the truth's paths at the same frames (NaN: no frame)."""
    n = min(len(pair.world["world_poses"]), len(pair.truth["world_poses"]))
    if not n:
        return float("nan")
    a, b = np.array(pair.world["world_poses"][:n])[:, :2], np.array(pair.truth["world_poses"][:n])[:, :2]
    return float(np.hypot(*(a - b).T).mean())


def measurements(pairs: Sequence[Pair], bootstrap: Bootstrap) -> dict[str, Interval]:
    """What a world's drives measure without a verdict (see the module's docstring), each with its interval."""
    scenarios = [p.scenario for p in pairs]
    found = {"path_distance_m": mean(scenarios, np.array([path_distance_m(p) for p in pairs]), bootstrap)}
    horizons = horizon_summary([read_horizons(p.world["fidelity"]) for p in pairs], scenarios, bootstrap)
    for h, values in horizons.items():
        found.update({f"{key}_h{h}": value for key, value in values.items()})
    return found


def metric_names(records: Sequence[dict]) -> list[tuple[str, str]]:
    """Every numeric or true/false metric of :data:`METRIC_BLOCKS` in ``records``' metrics, block by block."""
    found = {(block, key): None for block in METRIC_BLOCKS for record in records
             for key, value in (record.get("metrics", {}).get(block) or {}).items()
             if isinstance(value, (bool, int, float)) and key not in NOT_OUTCOMES}
    return list(found)


def differences(pairs: Sequence[Pair], bootstrap: Bootstrap) -> dict[str, Interval]:
    """Per metric (``block.metric``), the mean world - truth over the paired drives with its interval."""
    names = metric_names([record for p in pairs for record in (p.world, p.truth)])
    found = {}
    for block, metric in names:
        try:
            found[f"{block}.{metric}"] = _paired(block, metric)(pairs, bootstrap)
        except Undefined:
            found[f"{block}.{metric}"] = _undefined(bootstrap)
    return found


@dataclass(frozen=True)
class Ranking:
    """The policies ranked (outcome policies), their mean :data:`RANK_METRIC` in the world and in truth, and the
    pairs of them that tie in truth (means within :data:`TIE`)."""

    policies: tuple[str, ...]
    world: tuple[float, ...]
    truth: tuple[float, ...]

    @property
    def ties(self) -> list[tuple[str, str]]:
        n = len(self.policies)
        return [(self.policies[i], self.policies[j]) for i in range(n) for j in range(i + 1, n)
                if abs(self.truth[i] - self.truth[j]) < TIE]

    def as_dict(self) -> dict:
        return {"metric": RANK_METRIC, "policies": list(self.policies), "world": list(self.world),
                "truth": list(self.truth), "ties_in_truth": [list(t) for t in self.ties]}


def ranking_of(pairs: Sequence[Pair]) -> Ranking:
    """The per-policy means of :data:`RANK_METRIC` over the outcome policies' paired drives (NaN: none)."""
    world, truth = ranked_values(pairs)
    names = tuple(dict.fromkeys(world.policy))
    means = []
    for values in (world, truth):
        kept = [values.value[(np.array(values.policy) == name) & np.isfinite(values.value)] for name in names]
        means.append(tuple(float(v.mean()) if len(v) else float("nan") for v in kept))
    return Ranking(names, *means)


FLAGGED, PASSED, UNDECIDED = "flagged", "passed", "undecided"  # a world's state (WorldVerdict.state)


@dataclass(frozen=True)
class WorldVerdict:
    """One world's statistics (name -> interval, widened for its scenarios), their decisions, why each undecided
    one is (name -> reason), the drives and scenarios they rest on, the policies the outcome statistics rest on, the
    ranking, and the unjudged measurements and paired differences (:func:`measurements`, :func:`differences`)."""

    world: str
    values: dict[str, Interval]
    decisions: dict[str, str]
    drives: int
    measured: dict[str, Interval]
    differences: dict[str, Interval]
    reasons: dict[str, str] = field(default_factory=dict)
    scenarios: dict[str, int] = field(default_factory=dict)  # statistic -> the scenarios it rests on
    policies: tuple[str, ...] = ()  # the outcome statistics' policies
    ranking: Ranking | None = None

    @property
    def flagged_by(self) -> list[str]:
        return [name for name, decision in self.decisions.items() if decision == FAIL]

    @property
    def undecided(self) -> list[str]:
        return [name for name, decision in self.decisions.items() if decision not in (PASS, FAIL)]

    @property
    def state(self) -> str:
        """``flagged`` (a statistic fails), ``passed`` (every statistic passes) or ``undecided``."""
        return FLAGGED if self.flagged_by else UNDECIDED if self.undecided else PASSED

    @property
    def too_small(self) -> bool:
        """Whether the study was too small to judge the world: nothing failed and some statistic had too few
        scenarios or an interval too wide to decide."""
        return self.state == UNDECIDED and any(
            self.decisions[name] == TOO_FEW or (self.decisions[name] == INCONCLUSIVE and name not in self.reasons)
            for name in self.undecided)

    def as_dict(self) -> dict:
        return {"world": self.world, "drives": self.drives, "state": self.state, "flagged": bool(self.flagged_by),
                "flagged_by": self.flagged_by, "undecided": self.undecided, "too_small_to_judge": self.too_small,
                "outcome_policies": list(self.policies),
                "ranking": None if self.ranking is None else self.ranking.as_dict(),
                "statistics": {name: {**value.as_dict(), "decision": self.decisions[name],
                                      "scenarios": self.scenarios.get(name), "reason": self.reasons.get(name)}
                               for name, value in self.values.items()},
                "measurements": {name: value.as_dict() for name, value in self.measured.items()},
                "differences": {name: value.as_dict() for name, value in self.differences.items()}}


def pairs_of(world: dict[str, dict], truth: dict[str, dict]) -> list[Pair]:
    """The drives (id -> record) made well in both worlds, with the world's fidelity measurements."""
    return [Pair(record, truth[drive]) for drive, record in sorted(world.items())
            if record.get("status") == "ok" and record.get("fidelity") and truth.get(drive, {}).get("status") == "ok"]


def _judged(statistic: Statistic, pairs: Sequence[Pair], bootstrap: Bootstrap
            ) -> tuple[Interval, str, str | None, int]:
    """One statistic on its drives: its widened interval, decision, the reason when it has no value or too few
    scenarios, and the number of scenarios."""
    scenarios = len({p.scenario for p in pairs})
    if not pairs:
        reason = "no drive made well in both worlds" if statistic.rests_on == FRAMES else \
            "no pixel policy's drive made well in both worlds (policies that read no pixels and probes are left out)"
        return _undefined(bootstrap), INCONCLUSIVE, reason, 0
    try:
        value = statistic.compute(pairs, bootstrap)
    except Undefined as why:
        return _undefined(bootstrap), INCONCLUSIVE, str(why), scenarios
    low, high = statistic.limits
    value = widened(value, few_clusters_factor(scenarios, bootstrap.level))
    value = replace(value, low=float(np.clip(value.low, low, high)), high=float(np.clip(value.high, low, high)))
    if scenarios < MIN_SCENARIOS:
        return value, TOO_FEW, f"{scenarios} scenario{'s' * (scenarios != 1)}, fewer than {MIN_SCENARIOS}", scenarios
    return value, decide(value, statistic.band), None, scenarios


def judge(name: str, world: dict[str, dict], truth: dict[str, dict],
          bootstrap: Bootstrap = Bootstrap()) -> WorldVerdict:
    """The verdict on the world ``name`` from its drives' records and the true world's (drive id -> record)."""
    pairs = pairs_of(world, truth)
    policies = outcome_policies(pairs)
    outcomes = [p for p in pairs if p.world["policy"] in policies]
    values, decisions, reasons, scenarios = {}, {}, {}, {}
    for s in STATISTICS:
        value, decision, reason, count = _judged(s, outcomes if s.rests_on == OUTCOMES else pairs, bootstrap)
        values[s.name], decisions[s.name], scenarios[s.name] = value, decision, count
        if reason is not None:
            reasons[s.name] = reason
    measured = measurements(pairs, bootstrap) if pairs else {}
    ranking = ranking_of(outcomes) if outcomes else None
    return WorldVerdict(name, values, decisions, len(pairs), measured, differences(pairs, bootstrap), reasons,
                        scenarios, tuple(policies), ranking)


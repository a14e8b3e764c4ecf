"""The fidelity verdict: is a world a simulator of the true world? Judged per statistic, with intervals, for the
world model and for worlds known to be wrong (terra/closedloop/study/control_worlds.py), so the verdict is seen to fail.

Every world drives the same drives (scenario x policy x seed) as the true world. From the drives' records
(terra/closedloop/recording/files.py; the per-drive measurements of terra/closedloop/outcomes/frames.py), each statistic
of :data:`STATISTICS` is an estimate with a 95 % cluster-bootstrap interval over scenarios (terra/stats.py,
the same replicates for all) and a decision against its acceptance band: ``pass`` (the interval inside the band),
``fail`` (entirely outside) or ``inconclusive``. A world is **flagged** when any statistic fails. A statistic
**separates** the model from a control when it passes the model and fails the control. Beside the judged
statistics, each with the same intervals and judged by nothing: the **measurements** (the lane detector's error
10 m ahead, the world's frame against the true frame at the same pose; the distance between the world's and the
truth's paths; PSNR and SSIM at 1, 5, 10 and 20 steps) and the **differences**, world - truth on paired drives, of
every metric a drive records (terra/closedloop/recording/files.py, ``metrics_of``).

What the statistics can detect: a world that does not move with the car (frozen, zero actions: the following gains
and the lane slope), shows no road (gray: the recovered motion and lanes found), turns the wrong way (mirrored: the
yaw gain and the lane slope), lags (late: the lag, and the yaw gain on drives that turn), or leads policies to other
outcomes (the paired differences and the policy ranking). What they cannot: a world can pass every statistic and
still be wrong about what they do not look at (other road users, lighting, anything beyond the lane and the ground's
motion); with few scenarios the intervals are wide and the decisions inconclusive, not passes. PSNR and SSIM are
measured, not judged: a frozen or replayed video can match the true frames as well as a world model does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import numpy as np

from terra.closedloop.outcomes.frames import read_following, read_horizons, read_lag, read_lanes
from terra.closedloop.drivers.builtin import NO_PIXELS  # left out of the ranking
from terra.fidelity.agreement import Lag, horizon_summary, lag_summary, lane_summary
from terra.fidelity.following import following_slopes
from terra.stats import (
    FAIL, INCONCLUSIVE, PASS, Bootstrap, DriveValues, Interval, decide, mean, paired_difference, rank_agreement,
)

MIN_LAG_PROMINENCE_DB = 1.0  # a flatter mean lag curve has no lag (terra/fidelity/agreement.py, Lag.prominence_db)
RANK_METRIC = "time_in_lane"  # terra/closedloop/outcomes/truth.py: what the policies are ranked by in both worlds
PAIRED = {  # per-drive outcomes compared world - truth on paired drives: (metrics block, metric) and the band
    "time_in_lane": (("truth", "time_in_lane"), (-0.1, 0.1)),  # terra/closedloop/outcomes/truth.py
    "off_road": (("truth", "off_road"), (-0.1, 0.1)),
    "scene_score": (("alpasim", "score"), (-0.1, 0.1)),  # terra/closedloop/outcomes/alpasim.py
}
METRIC_BLOCKS = ("truth", "alpasim", "progress", "history_comfort", "extended_comfort")  # record.py, metrics_of
NOT_OUTCOMES = ("first_collision_frame",)  # an index, not a quantity: no difference taken


@dataclass(frozen=True)
class Pair:
    """A drive in the judged world and the same drive (scenario, policy, seed) in the true world."""

    world: dict
    truth: dict

    @property
    def scenario(self) -> Hashable:
        return self.world["scenario"]


def following_gain(component: str) -> Callable[[Sequence[Pair], Bootstrap], Interval]:
    """The gain of the motion recovered from the world's frames on the commanded motion (``dx`` or ``dyaw``:
    terra/fidelity/following.py) over some paired drives, with its interval over their scenarios."""
    def statistic(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
        fit = following_slopes([read_following(p.world["fidelity"]) for p in pairs], [p.scenario for p in pairs],
                               bootstrap)
        return fit.gain[component]
    return statistic


def _recovered(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
    fit = following_slopes([read_following(p.world["fidelity"]) for p in pairs], [p.scenario for p in pairs],
                           bootstrap)
    return fit.recovered_share


def _lanes(pairs: Sequence[Pair], bootstrap: Bootstrap):
    return lane_summary([read_lanes(p.world["fidelity"]) for p in pairs], [p.scenario for p in pairs], bootstrap)


def _lane_slope(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
    return _lanes(pairs, bootstrap).slope


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
    if not kept or Lag(0, np.mean([lag.curve for _, lag in kept], axis=0)).prominence_db < MIN_LAG_PROMINENCE_DB:
        return _undefined(bootstrap)
    return lag_summary([lag for _, lag in kept], [s for s, _ in kept], bootstrap)


def _undefined(bootstrap: Bootstrap) -> Interval:
    return Interval(float("nan"), float("nan"), float("nan"), bootstrap.level, 1.0)


def _paired(block: str, metric: str) -> Callable[[Sequence[Pair], Bootstrap], Interval]:
    def statistic(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
        world = np.array([metric_value(p.world, block, metric) for p in pairs])
        truth = np.array([metric_value(p.truth, block, metric) for p in pairs])
        return paired_difference([p.scenario for p in pairs], world, truth, bootstrap)
    return statistic


def metric_value(record: dict, block: str, metric: str) -> float:
    """A drive's metric (NaN when it has none): ``metrics[block][metric]`` of its record."""
    value = (record.get("metrics", {}).get(block) or {}).get(metric)
    return float("nan") if value is None else float(value)


def _ranking(coefficient: str) -> Callable[[Sequence[Pair], Bootstrap], Interval]:
    """A rank correlation (``kendall_tau`` or ``spearman_rho`` of terra/stats.py's ``RankAgreement``) of the pixel
    policies' mean :data:`RANK_METRIC` in the world and in truth; undefined with fewer than 3 pixel policies."""
    def statistic(pairs: Sequence[Pair], bootstrap: Bootstrap) -> Interval:
        ranked = [p for p in pairs if p.world["policy"] not in NO_PIXELS]
        if len({p.world["policy"] for p in ranked}) < 3:
            return _undefined(bootstrap)
        values = [DriveValues([p.scenario for p in ranked], [p.world["policy"] for p in ranked],
                              np.array([metric_value(getattr(p, side), "truth", RANK_METRIC) for p in ranked]))
                  for side in ("world", "truth")]
        return getattr(rank_agreement(values[0], values[1], bootstrap), coefficient)
    return statistic


@dataclass(frozen=True)
class Statistic:
    """A statistic of a world's paired drives, its acceptance band for a faithful world, and what it shows."""

    name: str
    band: tuple[float, float]
    compute: Callable[[Sequence[Pair], Bootstrap], Interval]
    meaning: str


STATISTICS = (
    Statistic("following_gain_dx", (0.8, 1.2), following_gain("dx"),
              "forward motion recovered from the frames / commanded (1: the video moves as the car)"),
    Statistic("following_gain_dyaw", (0.8, 1.2), following_gain("dyaw"),
              "yaw recovered from the frames / commanded (-1: mirrored; 0: ignores steering)"),
    Statistic("motion_recovered", (0.5, 1.0), _recovered,
              "share of steps whose motion the road-plane odometry recovers (0: no ground to see)"),
    Statistic("lane_slope", (0.5, 1.5), _lane_slope,
              "the lane read 10 m ahead in the world's frame regressed on the true frame's, within drives"),
    Statistic("lanes_found_difference", (-0.2, 0.2), _lanes_found,
              "share of frames with a lane found, world - truth at the same poses"),
    Statistic("lag_steps", (-1.0, 1.0), _lag, "steps by which the world's frames trail the true ones (10: 1 s late)"),
    *(Statistic(f"{name}_difference", band, _paired(*source), f"{name} in the world - in truth, paired drives")
      for name, (source, band) in PAIRED.items()),
    Statistic("kendall_tau", (0.5, 1.0), _ranking("kendall_tau"),
              f"pixel policies ranked by {RANK_METRIC} in the world against in truth (Kendall's tau-b)"),
    Statistic("spearman_rho", (0.7, 1.0), _ranking("spearman_rho"),
              "the same ranking by Spearman's rho (its band: about 1.5 x Kendall's, as rho is for weak agreement)"),
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
    found = {"lane_error_10m_m": _lanes(pairs, bootstrap).mean_abs_error_m,
             "path_distance_m": mean(scenarios, np.array([path_distance_m(p) for p in pairs]), bootstrap)}
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
    return {f"{block}.{metric}": _paired(block, metric)(pairs, bootstrap) for block, metric in names}


@dataclass(frozen=True)
class WorldVerdict:
    """One world's statistics (name -> interval), their decisions, the drives they rest on, and the unjudged
    measurements and paired differences (:func:`measurements`, :func:`differences`)."""

    world: str
    values: dict[str, Interval]
    decisions: dict[str, str]
    drives: int
    measured: dict[str, Interval]
    differences: dict[str, Interval]

    @property
    def flagged_by(self) -> list[str]:
        return [name for name, decision in self.decisions.items() if decision == FAIL]

    def as_dict(self) -> dict:
        return {"world": self.world, "drives": self.drives, "flagged": bool(self.flagged_by),
                "flagged_by": self.flagged_by,
                "statistics": {name: {**value.as_dict(), "decision": self.decisions[name]}
                               for name, value in self.values.items()},
                "measurements": {name: value.as_dict() for name, value in self.measured.items()},
                "differences": {name: value.as_dict() for name, value in self.differences.items()}}


def pairs_of(world: dict[str, dict], truth: dict[str, dict]) -> list[Pair]:
    """The drives (id -> record) made well in both worlds, with the world's fidelity measurements."""
    return [Pair(record, truth[drive]) for drive, record in sorted(world.items())
            if record.get("status") == "ok" and record.get("fidelity") and truth.get(drive, {}).get("status") == "ok"]


def judge(name: str, world: dict[str, dict], truth: dict[str, dict], bootstrap: Bootstrap = Bootstrap()
          ) -> WorldVerdict:
    """The verdict on the world ``name`` from its drives' records and the true world's (drive id -> record)."""
    pairs = pairs_of(world, truth)
    values = {s.name: s.compute(pairs, bootstrap) if pairs else _undefined(bootstrap) for s in STATISTICS}
    decisions = {s.name: decide(values[s.name], s.band) for s in STATISTICS}
    measured = measurements(pairs, bootstrap) if pairs else {}
    return WorldVerdict(name, values, decisions, len(pairs), measured, differences(pairs, bootstrap))


def separation(model: WorldVerdict, control: WorldVerdict) -> list[str]:
    """The statistics that pass the model and fail the control."""
    return [s.name for s in STATISTICS if model.decisions[s.name] == PASS and control.decisions[s.name] == FAIL]


MARKS = {PASS: "pass", FAIL: "**fail**", INCONCLUSIVE: "?"}


def shown(value: Interval | None) -> str:
    """An interval as the tables write it: ``estimate [low, high]``, ``n/a`` without an estimate."""
    return "n/a" if value is None or not np.isfinite(value.estimate) else str(value)


def verdict_table(verdicts: Sequence[WorldVerdict]) -> str:
    """Markdown: a row per statistic (its band), a column per world: the estimate, its interval and the decision;
    each world's flags; then the measurements and the paired differences, a row each."""
    worlds = " | ".join(v.world for v in verdicts)
    lines = [f"| statistic | band | {worlds} |", "|---|---|" + "---|" * len(verdicts)]
    for s in STATISTICS:
        cells = [f"{shown(v.values[s.name])} {MARKS[v.decisions[s.name]]}" for v in verdicts]
        lines.append(f"| {s.name} | [{s.band[0]:g}, {s.band[1]:g}] | " + " | ".join(cells) + " |")
    lines.append("")
    for v in verdicts:
        flags = ", ".join(v.flagged_by) if v.flagged_by else "nothing"
        lines.append(f"- **{v.world}** ({v.drives} drives): {'flagged' if v.flagged_by else 'not flagged'} "
                     f"(failed: {flags})")
    for title, table in (("measured (not judged)", "measured"), ("world - truth, paired drives", "differences")):
        names = list(dict.fromkeys(name for v in verdicts for name in getattr(v, table)))
        lines += ["", f"| {title} | {worlds} |", "|---|" + "---|" * len(verdicts)]
        lines += [f"| {name} | " + " | ".join(shown(getattr(v, table).get(name)) for v in verdicts) + " |"
                  for name in names]
    return "\n".join(lines) + "\n"
